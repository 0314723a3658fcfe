"""Command-line values and specs: the argparse value types, the one-line
usage error (`UsageError`, naming the field), and the specs `bec-jax run`,
`bec-jax control` and `bec-jax continuing` build from their arguments or a TOML file. `bec_jax.cli.commands` is
the parser and the commands.
"""
from __future__ import annotations

import argparse
import inspect
import re

from bec_jax import algorithms
from bec_jax.cli.prune import pruned_spec
from bec_jax.control import algorithms as control_algorithms
from bec_jax.control.continuing import learners as continuing_learners
from bec_jax.control.continuing.spec import LOOP_AXES as CONTINUING_LOOP_AXES
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.control.spec import LOOP_AXES, ControlSpec
from bec_jax.prediction.spec import ScheduleSpec, SweepSpec

# Command-line option (dest) -> the spec field it sets, as error messages name it.
FIELD_OF_DEST = {"t0": "schedule.t0", "p_alpha": "schedule.p_alpha", "p_beta": "schedule.p_beta",
                 "p_zeta": "schedule.p_zeta", "env_param": "env_params"}
SPEC_DESTS = ("env", "algorithm", "env_param", "steps", "seeds", "log_every", "sampler", "schedule", "t0",
              "p_alpha", "p_beta", "p_zeta", "metrics", "dtype", "seed", "divergence_bound", "search")
SCHEDULE_DESTS = ("t0", "p_alpha", "p_beta", "p_zeta")


def listing(names, default=None, last: str | None = "or") -> str:
    """Names for a help text, read from a registry: 'a (default), b or c' (with
    `last=None`, 'a (default), b, c' for a list that goes on)."""
    shown = [f"{n} (default)" if n == default else n for n in names]
    if last is None or len(shown) == 1:
        return ", ".join(shown)
    return f"{', '.join(shown[:-1])} {last} {shown[-1]}"


def default_of(cls, field: str):
    """The default of `cls`'s parameter `field` (help texts name the spec's own)."""
    return inspect.signature(cls).parameters[field].default


class UsageError(ValueError):
    """Bad input from the command line or a config file."""


def field_message(message: str) -> str:
    """argparse's error message as one line starting with the field it concerns."""
    m = re.match(r"argument (\S+?): (.*)$", message, re.S)
    if m:
        name, rest = m.groups()
        dest = name.split("/")[0].lstrip("-").replace("-", "_")
        field = FIELD_OF_DEST.get(dest, dest)
        return rest if rest.startswith(f"{field}") else f"{field}: {rest}"
    m = re.match(r"the following arguments are required: (.*)$", message, re.S)
    if m:
        name = m.group(1).split(",")[0].strip()
        return f"{name.lstrip('-').replace('-', '_')}: required; see --help"
    return f"arguments: {message}"


class Parser(argparse.ArgumentParser):
    """argparse, but an error is a `UsageError` (one line naming the field) instead
    of usage text and `sys.exit`."""

    def error(self, message):
        raise UsageError(field_message(message))


def int_arg(field: str):
    """An integer; exact-integer float notation (1e6) is accepted."""
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            pass
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        if v == v and abs(v) != float("inf") and v == int(v):
            return int(v)
        raise argparse.ArgumentTypeError(f"{field}: expected an integer, got {text!r}")
    return parse


def float_arg(field: str):
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{field}: expected a number, got {text!r}") from None
    return parse


def size_arg(text: str) -> int:
    """A size in bytes: 3GB, 500MiB, 2e9."""
    from bec_jax.engine.memory import parse_size
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def value(text: str):
    """A command-line value: an int, a float, true/false, or else the string itself."""
    t = text.strip()
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    return t


def values(field: str, text: str) -> list:
    vals = [value(x) for x in text.split(",") if x.strip()]
    if not vals:
        raise UsageError(f"{field}: the list is empty")
    return vals


def numbers(field: str, text: str) -> list:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{field}: expected a comma-separated list of numbers, got {text!r}") from None
    if not vals:
        raise UsageError(f"{field}: the list is empty")
    return vals


def names_arg(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def env_param_arg(text: str, field: str = "env_params"):
    name, eq, vals = text.partition("=")
    name = name.strip()
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"{field}: expected NAME=v1,v2,..., got {text!r}")
    return name, values(f"{field}.{name}", vals)


def learner_param_arg(text: str):
    """`--learner-param NAME=VALUE` (a network learner's setting): (name, values)."""
    return env_param_arg(text, "learner_params")


def given_options(args) -> list[str]:
    """The spec options given on the command line (their defaults are None)."""
    given = [d for d in SPEC_DESTS if getattr(args, d, None) is not None]
    return given + (["hyperparameters"] if getattr(args, "hyper", None) else [])


def hyper_options(extra: list[str]) -> dict:
    """`--NAME v1,v2` pairs left over by argparse: {name: values}. Anything else is
    an unknown option."""
    out = {}
    i = 0
    while i < len(extra):
        tok = extra[i]
        if not tok.startswith("--") or len(tok) <= 2:
            raise UsageError(f"arguments: unexpected argument {tok!r}; see --help")
        name, eq, val = tok[2:].partition("=")
        name = name.replace("-", "_")
        if not eq:
            if i + 1 >= len(extra) or extra[i + 1].startswith("--"):
                raise UsageError(f"{name}: expected a comma-separated list of values after --{tok[2:]}")
            val = extra[i + 1]
            i += 1
        if name in out:
            raise UsageError(f"{name}: given twice")
        out[name] = val
        i += 1
    return out


def join_negative_lists(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """`argv` with `OPTION -8,0,8` written `OPTION=-8,0,8` for each of `options`:
    argparse takes a value starting with a minus sign for an option unless it is
    one number."""
    out = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in options and i + 1 < len(argv) and re.match(r"-[\d.]", argv[i + 1]):
            out.append(f"{tok}={argv[i + 1]}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def config_table(args) -> dict:
    """The spec table of `args.config` (a TOML file); its `out = "DIR"` sets
    `args.out` unless --out was given."""
    from bec_jax.prediction.fields import read_toml
    table = read_toml(args.config, "config")
    out = table.pop("out", None)
    if out is not None and (not isinstance(out, str) or not out):
        raise UsageError(f"out: expected a directory path (a string), got {out!r}")
    if out is not None and not args.out:
        args.out = out
    return table


def _hyperparameters(args, alg) -> tuple[dict, dict]:
    """(hyperparameter values, schedule exponents) from the algorithm's own
    options (`--alpha`, `--p-alpha`, ...); an option it does not take is refused."""
    hyper, exponents = {}, {}
    for name, text in args.hyper.items():
        if name.startswith("p_") and name[2:] in alg.step_sizes:
            exponents[name[2:]] = float_arg(f"schedule.{name}")(text)
            continue
        if name not in alg.names:
            raise UsageError(f"{name}: unknown option --{name.replace('_', '-')}; {alg.name} takes "
                             f"{', '.join('--' + n for n in alg.names) or 'no hyperparameters'}; see --help")
        h = alg.hyperparameter(name)
        hyper[name] = numbers(name, text) if not h.static else values(name, text)
    for d in ("p_alpha", "p_beta", "p_zeta"):
        if getattr(args, d) is not None:
            exponents[d[2:]] = getattr(args, d)
    return hyper, exponents


def _schedule(args, exponents: dict) -> ScheduleSpec:
    """The step-size schedule of `--schedule`, `--t0` and the exponents; those two
    refused with any schedule but Robbins-Monro's."""
    kind = args.schedule if args.schedule is not None else "constant"
    sched_kw = {"t0": args.t0} if args.t0 is not None else {}
    if (sched_kw or exponents) and kind != "robbins_monro":
        d = "t0" if sched_kw else f"p_{next(iter(exponents))}"
        raise UsageError(f"schedule.{d}: used only by --schedule robbins_monro, not {kind!r}; "
                         "remove it or add --schedule robbins_monro")
    return ScheduleSpec(kind=kind, exponents=exponents, **sched_kw)


def spec_from_args(args):
    """Builds a validated `SweepSpec` from parsed `run` arguments (or the TOML file).

    Options left out take the spec's defaults. With --config, the spec comes from
    the file alone: a spec option also given on the command line is refused (not
    silently ignored). A file's `out = "DIR"` is used unless --out is given.
    With --prune theory, the grid less the points the exact analysis says
    diverge (`cli.prune.pruned_spec`).
    """
    given = given_options(args)
    search = search_of(args)
    if args.config:
        if given:
            d = given[0]
            raise UsageError(f"{FIELD_OF_DEST.get(d, d)}: given both on the command line and by --config "
                             f"{args.config!r}; put it in the config file")
        return pruned_spec(args, SweepSpec.from_dict(config_table(args)))
    missing = [n for n in ("env", "algorithm") if getattr(args, n) is None]
    if missing:
        raise UsageError(f"{missing[0]}: required (or give --config FILE.toml)")
    hyper, exponents = _hyperparameters(args, algorithms.get(args.algorithm))
    sched = _schedule(args, exponents)
    env_params = {}
    for name, vals in args.env_param or ():
        if name in env_params:
            raise UsageError(f"env_params.{name}: given twice")
        env_params[name] = vals
    kw = {d: getattr(args, d) for d in ("steps", "seeds", "log_every", "sampler", "dtype", "seed",
                                        "divergence_bound") if getattr(args, d) is not None}
    if args.metrics is not None:
        kw["metrics"] = tuple(args.metrics)
    return pruned_spec(args, SweepSpec(env=args.env, algorithm=args.algorithm, hyperparameters=hyper,
                                       env_params=env_params or None, schedule=sched, search=search, **kw))


CONTROL_FIELDS = ("task", "algorithm", "episodes", "seeds", "epsilon", "epsilon_decay", "epsilon_min",
                  "max_episode_steps", "max_steps", "gamma", "seed", "block", "dtype", "divergence_bound",
                  "reward_shift")


def control_spec_from_args(args):
    """A validated `ControlSpec` from parsed `control` arguments (or its TOML file)."""
    extra = getattr(args, "hyper", None) or {}
    given = [d for d in CONTROL_FIELDS + ("alpha", "beta", "zeta") if getattr(args, d, None) is not None]
    given += ["task_params"] if args.task_param else []
    given += list(extra)
    search = search_of(args)
    if args.config:
        if given or search is not None:
            raise UsageError(f"{given[0] if given else 'search'}: given both on the command line and by --config "
                             f"{args.config!r}; put it in the config file")
        return ControlSpec.from_dict(config_table(args))
    missing = [n for n in ("task", "algorithm") if getattr(args, n) is None]
    if missing:
        raise UsageError(f"{missing[0]}: required (or give --config FILE.toml)")
    alg = control_algorithms.get(args.algorithm)
    hyper = {n: numbers(n, getattr(args, n)) for n in ("alpha", "beta", "zeta") if getattr(args, n) is not None}
    for name, text in extra.items():  # any other hyperparameter the algorithm declares
        if name not in alg.names:
            raise UsageError(f"{name}: unknown option --{name.replace('_', '-')}; {alg.name} takes "
                             f"{', '.join('--' + n for n in alg.names) or 'no hyperparameters'}; see --help")
        hyper[name] = values(name, text) if alg.hyperparameter(name).static else numbers(name, text)
    params, axes = {}, {}
    for name, vals in args.task_param or ():
        if name in params or name in axes:
            raise UsageError(f"task_params.{name}: given twice")
        if len(vals) > 1:  # several values: a grid axis, a task (and program) each
            axes[name] = vals
        else:
            params[name] = vals[0]
    kw = {d: getattr(args, d) for d in CONTROL_FIELDS[2:] if getattr(args, d) is not None}
    for name in LOOP_AXES:  # one value: the loop's; several: a grid axis
        if name in kw:
            vals = numbers(name, kw[name])
            kw[name] = vals[0] if len(vals) == 1 else list(vals)
    return ControlSpec(task=args.task, algorithm=args.algorithm, hyperparameters=hyper, task_params=params,
                       task_axes=axes, search=search, **kw)


# `bec-jax continuing`'s options (dest) -> the `ContinuingSpec` field each sets.
CONTINUING_FIELDS = {"task": "task", "algorithm": "algorithm", "epsilon": "epsilon", "gamma": "gamma",
                     "offset": "reward_offset", "q0": "q0", "seeds": "seeds", "steps": "steps",
                     "log_every": "log_every", "seed": "seed", "dtype": "dtype"}


def _continuing_task_params(pairs, field: str = "task_params") -> dict:
    """{name: value} of `--task-param NAME=VALUE` pairs: one value each, several
    numbers a list, which the spec reads as a grid axis for a scalar parameter
    (free_probability=0.04,0.06) and as the value of a sequence-valued one
    (priorities=1,2,4,8; `continuing.spec.is_task_axis`); a name given twice
    is refused. `--learner-param` pairs likewise (`field` learner_params: a
    list is a setting's value, hidden=64,64)."""
    params = {}
    for name, vals in pairs or ():
        if name in params:
            raise UsageError(f"{field}.{name}: given twice")
        params[name] = vals[0] if len(vals) == 1 else list(vals)
    return params


def continuing_spec_from_args(args):
    """A validated `ContinuingSpec` from parsed `continuing` arguments (or its
    TOML file, alone): every learner hyperparameter is an `--NAME v1,v2` option
    (`args.hyper`), the loop's epsilon, gamma, offset and q0 a value or a grid
    axis; `UsageError`/`ValueError` naming the field otherwise."""
    extra = getattr(args, "hyper", None) or {}
    given = [d for d in CONTINUING_FIELDS if getattr(args, d, None) is not None]
    given += (["task_params"] if args.task_param else []) + (["learner_params"] if args.learner_param else [])
    given += list(extra)
    if args.config:
        if given:
            raise UsageError(f"{CONTINUING_FIELDS.get(given[0], given[0])}: given both on the command line and by "
                             f"--config {args.config!r}; put it in the config file")
        return ContinuingSpec.from_dict(config_table(args))
    missing = [n for n in ("task", "algorithm") if getattr(args, n) is None]
    if missing:
        raise UsageError(f"{missing[0]}: required (or give --config FILE.toml)")
    alg = continuing_learners.get(args.algorithm)
    hyper = {}
    for name, text in extra.items():
        if name not in alg.names:
            raise UsageError(f"{name}: unknown option --{name.replace('_', '-')}; {alg.name} takes "
                             f"{', '.join('--' + n for n in alg.names) or 'no hyperparameters'}; see --help")
        hyper[name] = values(name, text) if alg.hyperparameter(name).static else numbers(name, text)
    kw = {}
    for dest, field in CONTINUING_FIELDS.items():
        v = getattr(args, dest, None)
        if v is None or dest in ("task", "algorithm"):
            continue
        if field in CONTINUING_LOOP_AXES:  # one value: the loop's; several: a grid axis
            vals = numbers(field, v)
            v = vals[0] if len(vals) == 1 else list(vals)
        kw[field] = v
    return ContinuingSpec(task=args.task, algorithm=args.algorithm, hyperparameters=hyper,
                          task_params=_continuing_task_params(args.task_param),
                          learner_params=_continuing_task_params(args.learner_param, "learner_params"),
                          search=search_of(args), **kw)


SEARCH_OPTIONS = {"halving_rate": "rate", "rungs": "rungs", "min_steps": "min_steps"}


def study_defaults(args) -> dict | None:
    """The shared defaults `bec-jax study` gives the file's sweeps: {"search":
    ...} with --search (`search_of`), else None; `UsageError` for --search
    without the file (a resumed study keeps the searches it started with)."""
    search = search_of(args)
    if search is not None and not args.file:
        raise UsageError("search: goes with the study's file (a resumed study keeps the searches it started with)")
    return {"search": search} if search is not None else None


def search_of(args) -> dict | None:
    """The spec's `search` from `--search halving [--halving-rate ETA]
    [--rungs R] [--min-steps S]` (None without --search); `UsageError` for a
    search option without --search."""
    given = {field: getattr(args, dest) for dest, field in SEARCH_OPTIONS.items() if getattr(args, dest, None) is not None}
    if getattr(args, "search", None) is None:
        if given:
            dest = next(d for d, f in SEARCH_OPTIONS.items() if f in given)
            raise UsageError(f"{dest}: goes with --search halving")
        return None
    return {"method": args.search, **given}
