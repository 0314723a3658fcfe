"""The `bec-jax` command line: a thin parser that builds a spec and calls the library.

    bec-jax run --env ENV --algorithm ALG --alpha LIST [--NAME LIST ...]
                [--env-param NAME=LIST ...] --steps T --seeds N --log-every K
                [--sampler markov|iid] [--schedule constant|robbins_monro] --out DIR
    bec-jax run --config FILE.toml [--out DIR]
    bec-jax run --out DIR --resume          (continue an interrupted run)
    bec-jax run ... --chunks K/N            (one of N processes sharing --out)
    bec-jax run ... --confirm-seeds N       (the best setting again on N fresh seeds)
    bec-jax study FILE.toml --out DIR [--resume]
    bec-jax control --task TASK --algorithm ALG --alpha LIST [--beta/--zeta LIST] --episodes E --out DIR
    bec-jax plot DIR... [--out PLOTS]       (runs or studies: curves, sensitivity, table)
    bec-jax compare DIR... --out FIG.png    (their best curves on one figure)
    bec-jax reproduce [--paper bec|tdrc|control] [--quick] [--out DIR] [--overwrite]

ENV is a registered name, an .npz/.toml MDP file or package.module:function; ALG
a registered name or package.module:attribute. Every hyperparameter ALG declares
is a grid axis: `--NAME v1,v2,...` (`--lambda 0,0.5,0.9` for ctd_lambda); every
parameter of ENV too: `--env-param gamma=0.8,0.9` (repeatable).

Bad input is refused before any work starts, with one line
`bec-jax: error: <field>: <what was given and what is allowed>`, exit status 2,
no traceback, and nothing written. Running into a directory, resuming and
stopping on Ctrl-C/SIGTERM are `bec_jax.runner`'s; see its docstring. A long
command (run, control, study, reproduce) that makes no progress for
--stall-timeout seconds (no CPU used, no chunk finished: a deadlock) leaves its
thread stacks in DIR/stall-<pid>.txt and exits with status 75 (`bec_jax.watchdog`).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys

from bec_jax import algorithms, analysis, envs, sampling, schedules
from bec_jax.control import algorithms as control_algorithms
from bec_jax.control import tasks as control_tasks
from bec_jax.cli_args import (
    Parser,
    UsageError,
    control_spec_from_args,
    default_of,
    env_param_arg,
    float_arg,
    given_options,
    hyper_options,
    int_arg,
    listing,
    names_arg,
    numbers,
    size_arg,
    spec_from_args,
    value,
)
from bec_jax.spec import ScheduleSpec, SweepSpec

EXIT_USAGE = 2

def use_all_cpu_cores(n: int | None = None) -> int | None:
    """Exposes `n` CPU devices to JAX (default: BEC_JAX_CPU_DEVICES, else every
    core) so the sweep shards its grid over them (XLA runs one scanned program per
    device on one thread). Must run before JAX initialises its backends. Returns
    the count set, or None when it was left alone: an XLA_FLAGS device count set by
    the user wins, and live backends cannot change."""
    import jax
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return None
    try:
        n = max(1, int(n or os.environ.get("BEC_JAX_CPU_DEVICES") or os.cpu_count() or 1))
        jax.config.update("jax_num_cpu_devices", n)
    except (ValueError, RuntimeError, AttributeError):
        return None  # backends already initialised, a bad count, or an older JAX
    return n


DISTRIBUTED_HELP = ("join a run of several processes (hosts) with jax.distributed: 'auto' on Slurm or Open "
                    "MPI, else the coordinator (process 0's HOST:PORT), the number of processes and this "
                    "process's index; every process runs the same command, process 0 writes the files")


def init_distributed(text: str) -> tuple[int, int]:
    """Joins this process to a `jax.distributed` run (before any JAX computation):
    'auto' detects Slurm or Open MPI; 'HOST:PORT,N,ID' names the coordinator, the
    number of processes and this process's index. CPU processes exchange results
    over gloo. Returns (process index, process count)."""
    import jax
    parts = [x.strip() for x in text.split(",")]
    if text.strip() == "auto":
        kwargs = {}
    elif len(parts) == 3 and ":" in parts[0] and parts[1].isdigit() and parts[2].isdigit():
        kwargs = {"coordinator_address": parts[0], "num_processes": int(parts[1]), "process_id": int(parts[2])}
        if not 0 <= kwargs["process_id"] < kwargs["num_processes"]:
            raise UsageError(f"distributed: the process index must be in [0, N), got {text!r}")
    else:
        raise UsageError(f"distributed: expected 'auto' or HOST:PORT,N,ID (e.g. 10.0.0.1:1234,4,0), got {text!r}")
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(**kwargs)
    except (RuntimeError, ValueError) as e:
        raise UsageError(f"distributed: cannot join the run ({str(e).splitlines()[0]})") from None
    if jax.process_index() != 0:  # one report, from process 0
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    return jax.process_index(), jax.process_count()


def enable_compilation_cache() -> None:
    """Turns on JAX's persistent compilation cache (repeated runs skip compiling),
    unless BEC_JAX_NO_CACHE is set."""
    if os.environ.get("BEC_JAX_NO_CACHE"):
        return
    import jax
    path = os.environ.get("BEC_JAX_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "bec_jax", "xla"))
    try:
        os.makedirs(path, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    except OSError:
        pass  # a read-only home only costs the cache


STALL_HELP = ("seconds without progress (no CPU used, no chunk finished) after which the command is taken to "
              "hang: it writes its thread stacks to OUT/stall-PID.txt and exits with status 75; 0 turns this off "
              "(default: $BEC_JAX_STALL_TIMEOUT, else 120 on a CPU and off on a GPU)")


def _stall_timeout(text: str) -> float:
    from bec_jax.watchdog import parse_timeout
    try:
        return parse_timeout(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _watchdog(args, out: str, hint: str):
    """The stall watchdog of a long command (`bec_jax.watchdog`), started once
    JAX is set up (its default depends on the backend)."""
    from bec_jax import watchdog
    return watchdog.Watchdog(watchdog.timeout_for(args.stall_timeout), out, hint)


def _enable_x64_for(specs) -> None:
    """JAX's 64-bit mode, before anything runs, when any of `specs` asks for float64."""
    if any(s.dtype == "float64" for s in specs):
        import jax
        jax.config.update("jax_enable_x64", True)


def _run_into_dir(spec, args, command: str):
    """`runner.run_to_dir` for `bec-jax run` and `bec-jax control`: 64-bit mode
    and the compilation cache set up, Ctrl-C/SIGTERM stopping after the chunk in
    progress, and `--chunks K/N` parts. Returns the result, or the exit status
    when there is nothing more to print (an interrupted run, a finished part)."""
    from bec_jax import runner
    _enable_x64_for([spec if spec is not None else runner.resume_spec(args.out)])  # None only when resuming
    enable_compilation_cache()
    part = runner.parse_part(args.chunks) if args.chunks is not None else None
    chunks_dir = os.path.join(args.out, runner.CHUNKS_DIR)
    again = f"bec-jax {command} --out {shlex.quote(args.out)} --resume"
    rerun = (f"to continue: {again}" if part is None
             else "to continue: run this part again (its saved chunks are kept)")
    with runner.StopOnSignal() as stop, _watchdog(args, args.out, rerun):
        try:
            budget = getattr(args, "memory_budget", None)
            result = runner.run_to_dir(spec, args.out, overwrite=args.overwrite, resume=args.resume,
                                       chunk_size=args.chunk_size, stop=stop, part=part,
                                       **({"memory_budget": budget} if budget is not None else {}))
        except runner.Interrupted as e:
            if e.saved is None:
                raise
            name = signal.Signals(e.signum).name
            inside = ""
            if e.segment is not None:
                i, j, n = e.segment
                inside = f" and chunk {i + 1} after log block {j} of {n} (its state is saved)"
            print(f"bec-jax: interrupted by {name} after {e.saved} of {e.total} chunks{inside}; the finished "
                  f"work is saved in {chunks_dir}; to continue: {again}", file=sys.stderr)
            return 128 + e.signum
    if part is not None:
        print(f"part {result['part']}: done; {result['chunks_done']} of {result['chunks_total']} chunks are in "
              f"{chunks_dir}. When every part has finished: {again}")
        return 0
    return result


def _spec_or_resume(args, given: bool, build):
    """The spec `build(args)` makes, or None for `--resume` with nothing but --out
    (the interrupted run's spec is used); --out is required either way."""
    if args.resume and not args.config and not given:
        if not args.out:
            raise UsageError("out: required (--out DIR)")
        return None
    spec = build(args)
    if not args.out:
        raise UsageError("out: required (--out DIR, or `out = \"DIR\"` in the config file)")
    return spec


def cmd_run(args) -> int:
    from bec_jax import runner
    spec = _spec_or_resume(args, given_options(args), spec_from_args)
    if args.chunks is not None and args.confirm_seeds:
        raise UsageError("confirm_seeds: a part computes chunks only; confirm when assembling (--resume)")
    result = _run_into_dir(spec, args, "run")
    if isinstance(result, int):
        return result
    spec = result.spec
    b = result.best_index()
    m = result.meta
    speed = (f", {m['updates_per_s'] / 1e6:.1f} M updates/s" if m["updates_per_s"] else "")
    if m["resumed_chunks"] == m["num_chunks"]:
        resumed = f" (assembled from {m['num_chunks']} saved chunks)"
    elif m["resumed_chunks"]:
        resumed = f" ({m['resumed_chunks']} of {m['num_chunks']} chunks from the interrupted run)"
    else:
        resumed = ""
    programs = f", {m['num_programs']} programs" if m["num_programs"] > 1 else ""
    print(f"{spec.env} / {spec.algorithm}: {result.num_points} grid points x {spec.seeds} seeds x "
          f"{spec.steps} steps in {m['run_time_s']:.2f} s (+ {m['compile_time_s']:.2f} s compile{programs})"
          f"{speed}{resumed}")
    fm = result.final_mean()[b]
    print(f"best by AUC: {result.point(b)}  final {spec.metrics[0]} = {fm:.4g}, "
          f"diverged fraction {result.diverged_fraction[b]:.2f}")
    print(f"wrote {args.out}/curves.npz, summary.json, summary.csv, meta.json")
    if args.confirm_seeds:
        print(runner.confirm_line(runner.confirm(result, args.out, args.confirm_seeds), args.out))
    return 0



def cmd_control(args) -> int:
    spec = _spec_or_resume(args, bool(args.task or args.algorithm or args.hyper), control_spec_from_args)
    result = _run_into_dir(spec, args, "control")
    if isinstance(result, int):
        return result
    m = result.meta
    print(f"{result.task} / {result.algorithm}: {result.num_points} grid points x {result.seeds} seeds x "
          f"{result.episodes} episodes ({m['logged_steps']:,} steps) in {m['run_time_s']:.2f} s "
          f"(+ {m['compile_time_s']:.2f} s compile)")
    try:
        # By return, the objective on every task (on the built-in ones each step
        # costs -1, so it also ranks by steps per episode; on CartPole more is better).
        b = result.best_index("return")
        rec = result.summary()[b]
        ci = lambda k: f"[{rec[k + '_ci_low'] or float('nan'):.4g}, {rec[k + '_ci_high'] or float('nan'):.4g}]"
        print(f"best by mean return per episode: {result.point(b)}  {rec['auc_return']:.4g} {ci('auc_return')} "
              f"(95% CI); steps per episode {rec['auc_length']:.4g} {ci('auc_length')}; "
              f"last 10% of episodes: return {rec['final_return']:.4g}, steps {rec['final_length']:.4g}")
    except ValueError as e:
        print(f"no best setting: {e}")
    print(f"wrote {args.out}/curves.npz, summary.json, summary.csv, meta.json")
    return 0


def cmd_study(args) -> int:
    from bec_jax import runner, study
    st = study.load(args.file) if args.file else None
    if st is None and not args.resume:
        raise UsageError("file: required (the study's TOML file), or --resume with --out")
    known = st or study.saved(args.out)  # a resume without the file: the study saved in --out
    if known is not None:
        _enable_x64_for(spec for _, spec in known.sweeps)
    enable_compilation_cache()
    again = (f"to continue: bec-jax study --out {shlex.quote(args.out)} --resume" if not args.chunks
             else "to continue: run this part again (its saved chunks are kept)")
    with runner.StopOnSignal() as stop, _watchdog(args, args.out, again):
        try:
            study.run(st, args.out, resume=args.resume, overwrite=args.overwrite, stop=stop,
                      confirm_seeds=args.confirm_seeds, chunk_size=args.chunk_size, part=args.chunks)
        except runner.Interrupted as e:
            name = signal.Signals(e.signum).name
            print(f"bec-jax: interrupted by {name}; finished sweeps and chunks are saved in {args.out}; to "
                  f"continue: bec-jax study --out {shlex.quote(args.out)} --resume", file=sys.stderr)
            return 128 + e.signum
    if args.chunks:
        print(f"part {args.chunks}: done. When every part has finished: bec-jax study --out "
              f"{shlex.quote(args.out)} --resume")
        return 0
    print(f"wrote {args.out}/study.json and one directory per sweep")
    return 0


def _open_results(dirs) -> tuple[dict, dict]:
    """({name: result}, {name: its directory}) of run directories and the
    finished sweeps of study directories, each result of its own kind
    (`results.load_result`: a prediction or a control sweep)."""
    from bec_jax import study
    from bec_jax.files import CURVES_FILE
    from bec_jax.results import load_result
    paths = {}
    for d in dirs:
        if not os.path.isdir(d):
            raise UsageError(f"dirs: {d!r} is not a directory")
        if study.is_study_dir(d):
            for name, path in study.sweep_dirs(d).items():
                paths[name if len(dirs) == 1 else f"{os.path.basename(os.path.normpath(d))}/{name}"] = path
        elif os.path.isfile(os.path.join(d, CURVES_FILE)):
            paths[os.path.basename(os.path.normpath(d))] = d
        else:
            raise UsageError(f"dirs: {d!r} holds neither a run (curves.npz) nor a study (study.json)")
    if not paths:
        raise UsageError("dirs: no finished sweep to plot")
    return {k: load_result(p) for k, p in paths.items()}, paths


def _confirmations(paths: dict) -> dict:
    """{name: the run's confirm.json report} for the runs that have one."""
    from bec_jax import runner
    out = {}
    for k, p in paths.items():
        f = os.path.join(p, runner.CONFIRM_FILE)
        if os.path.isfile(f):
            try:
                with open(f) as fh:
                    out[k] = json.load(fh)
            except (OSError, ValueError) as e:
                raise UsageError(f"dirs: cannot read {f!r} ({e})") from None
    return out


def _select(text):
    if not text:
        return None
    sel = {}
    for part in text.split(","):
        k, eq, v = part.partition("=")
        if not eq or not k.strip():
            raise UsageError(f"select: expected NAME=VALUE,..., got {text!r}")
        sel[k.strip()] = value(v)
    return sel


def cmd_plot(args) -> int:
    from bec_jax import figures
    results, paths = _open_results(args.dirs)
    out = args.out or os.path.join(args.dirs[0], "plots")
    written = figures.plot_results(results, out, args.metric, _select(args.select), _confirmations(paths))
    print(f"wrote {len(written)} files to {out}: " + ", ".join(os.path.basename(p) for p in written))
    return 0


def cmd_compare(args) -> int:
    from bec_jax import figures, plotting
    results, _ = _open_results(args.dirs)
    if args.labels:
        labels = [x.strip() for x in args.labels.split(",")]
        if len(labels) != len(results):
            raise UsageError(f"labels: {len(labels)} labels for {len(results)} runs")
        results = dict(zip(labels, results.values()))
    fig = figures.compare_figure(results, args.metric, args.title or "", _select(args.select))
    d, name = os.path.split(os.path.abspath(args.out))
    stem, ext = os.path.splitext(name)
    paths = plotting.save_figure(fig, d, stem, formats=(ext.lstrip(".") or "png",))
    print(f"wrote {paths[0]}")
    return 0


METRIC_HELP = ("prediction runs: a logged metric (default: each run's first); control runs: return (default) or "
               "length, the statistic drawn and the one whose area under the curve chooses the best setting")
PAPERS = ("bec", "tdrc", "control")


def cmd_analyze(args) -> int:
    from bec_jax import analyze
    hyper = {k: numbers(k, v) for k, v in args.hyper.items()}
    env_params = {k: v for k, v in (args.env_param or [])}
    axes = tuple(args.map) if args.map else None
    if axes is not None and len(axes) != 2:
        raise UsageError(f"map: expected two names X,Y, got {','.join(axes)!r}")
    print(analyze.command(args.env, args.algorithm, hyper, env_params, args.sampler, args.out, args.run, axes,
                          args.map_points), end="")
    return 0


def cmd_reproduce(args) -> int:
    import importlib

    from bec_jax import runner
    if args.paper not in PAPERS:
        raise UsageError(f"paper: unknown paper {args.paper!r}; known: {', '.join(PAPERS)}")
    exp = importlib.import_module("bec_jax.experiments." + {"bec": "paper", "tdrc": "tdrc",
                                                             "control": "control"}[args.paper])
    out = args.out or os.path.join("results", "paper" if args.paper == "bec" else args.paper)
    enable_compilation_cache()
    again = (f"to start it again: bec-jax reproduce --paper {args.paper}{' --quick' if args.quick else ''} "
             f"--out {shlex.quote(out)}")
    guard = _watchdog(args, out, again)  # a bad BEC_JAX_STALL_TIMEOUT is refused before --out is made
    runner.prepare_out_dir(out, args.overwrite, allow=exp.is_reproduce_dir)
    if args.mean_square and args.paper == "control":
        raise UsageError("mean_square: --mean-square checks the prediction reproductions (--paper bec or tdrc)")
    with guard:
        exp.reproduce(out_dir=out, quick=args.quick, **({"mean_square": True} if args.mean_square else {}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="bec-jax", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    # Spec options default to None ("not given"): the spec's defaults apply.
    r = sub.add_parser("run", help="run one sweep", allow_abbrev=False,
                       epilog="Every hyperparameter the algorithm declares is an option: --NAME v1,v2,... "
                              "(e.g. --alpha 0.01,0.1 --beta 0.1 --lambda 0,0.5,0.9).")
    r.add_argument("--config", help="TOML file with the spec's fields (see README)")
    r.add_argument("--env", help=f"{listing(envs.names(), default_of(SweepSpec, 'env'), None)}, an .npz/.toml MDP "
                                 "file or package.module:function")
    r.add_argument("--algorithm", help=f"{listing(algorithms.names(), default_of(SweepSpec, 'algorithm'), None)} "
                                       "or package.module:attribute")
    r.add_argument("--env-param", action="append", type=env_param_arg, metavar="NAME=v1,v2",
                   help="an environment parameter's values, e.g. gamma=0.8,0.9 (repeatable)")
    r.add_argument("--steps", type=int_arg("steps"), help="default 1000")
    r.add_argument("--seeds", type=int_arg("seeds"), help="default 50")
    r.add_argument("--log-every", type=int_arg("log_every"), help="default 10")
    r.add_argument("--sampler", help=listing(sampling.KINDS, default_of(SweepSpec, "sampler")))
    r.add_argument("--schedule", help=listing(schedules.SCHEDULES, default_of(ScheduleSpec, "kind")))
    r.add_argument("--t0", type=float_arg("schedule.t0"),
                   help="robbins_monro: x_t = x (t0/(t+t0))^p (default 100)")
    r.add_argument("--p-alpha", type=float_arg("schedule.p_alpha"),
                   help="default 1.0 (--p-NAME for any step size NAME)")
    r.add_argument("--p-beta", type=float_arg("schedule.p_beta"), help="default 0.6")
    r.add_argument("--p-zeta", type=float_arg("schedule.p_zeta"), help="default 0.8")
    r.add_argument("--metrics", type=names_arg,
                   help="comma-separated: " + listing(analysis.metric_names(), default_of(SweepSpec, "metrics")[0],
                                                       None) + " or package.module:attribute")
    r.add_argument("--dtype", help="float32 (default) or float64")
    r.add_argument("--seed", type=int_arg("seed"), help="default 0")
    r.add_argument("--divergence-bound", type=float_arg("divergence_bound"), help="default 1e6")
    r.add_argument("--chunk-size", type=int_arg("chunk_size"))
    r.add_argument("--memory-budget", type=size_arg, metavar="SIZE",
                   help="device memory one compiled call may use, e.g. 3GB or 500MiB (default: 2 GiB or what "
                        "is free, the less); a larger sweep runs in seed chunks and time segments")
    r.add_argument("--out")
    r.add_argument("--overwrite", action="store_true", help="allow a non-empty --out (start over)")
    r.add_argument("--resume", action="store_true",
                   help="continue the interrupted run in --out, skipping its finished chunks")
    r.add_argument("--chunks", metavar="K/N",
                   help="compute only the K-th of N disjoint parts of the chunks into --out (for N processes, "
                        "e.g. a job array); then `bec-jax run --out DIR --resume` assembles the result")
    r.add_argument("--confirm-seeds", type=int_arg("confirm_seeds"), metavar="N",
                   help="re-run the best setting on N fresh seeds and report both (confirm.json)")
    r.add_argument("--distributed", metavar="auto|HOST:PORT,N,ID", help=DISTRIBUTED_HELP)
    r.add_argument("--stall-timeout", type=_stall_timeout, metavar="SECONDS", help=STALL_HELP)
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("control", help="run one control sweep (epsilon-greedy agents on a control task)",
                       allow_abbrev=False,
                       epilog="Every hyperparameter the algorithm declares is an option: --NAME v1,v2,... "
                              "(e.g. --eta 0.1,0.5 for an algorithm of your own that declares eta).")
    c.add_argument("--config", help="TOML file with the control spec's fields")
    c.add_argument("--task", help=f"{listing(control_tasks.names(), last=None)} or package.module:function, "
                                  "or gymnax:ENV_ID (any gymnax environment with discrete actions)")
    c.add_argument("--task-param", action="append", type=env_param_arg, metavar="NAME=VALUE",
                   help="a task parameter, e.g. num_tilings=5 (repeatable); a gymnax task's features: "
                        "features=tiles|fourier|rbf|package.module:function, their parameters (num_tilings, "
                        "bins; order; centers, sigma) and the box low, high (a number, or one per dimension "
                        "separated by spaces)")
    c.add_argument("--algorithm", help=f"{listing(control_algorithms.names(), last=None)} or "
                                       "package.module:attribute")
    for n in ("alpha", "beta", "zeta"):
        c.add_argument(f"--{n}", metavar="v1,v2,...", help=f"values of {n} (a grid axis)")
    c.add_argument("--episodes", type=int_arg("episodes"), help="episodes per run (default 100)")
    c.add_argument("--seeds", type=int_arg("seeds"), help="default 10")
    c.add_argument("--epsilon", metavar="v1,v2,...", help="default 0.1 (several values: a grid axis)")
    c.add_argument("--epsilon-decay", metavar="v1,v2,...",
                   help="per-episode factor (default 1: constant; the authors use 0.9992; several: a grid axis)")
    c.add_argument("--epsilon-min", metavar="v1,v2,...",
                   help="default 0 (the authors use 1e-4; several values: a grid axis)")
    c.add_argument("--max-episode-steps", type=int_arg("max_episode_steps"), help="default: the task's cap")
    c.add_argument("--max-steps", type=int_arg("max_steps"), help="a run's step budget")
    c.add_argument("--gamma", metavar="v1,v2,...", help="default: the task's (0.99; several values: a grid axis)")
    c.add_argument("--seed", type=int_arg("seed"), help="default 0")
    c.add_argument("--block", type=int_arg("block"), help="steps between divergence checks (default 100)")
    c.add_argument("--dtype", help="float32 (default) or float64")
    c.add_argument("--divergence-bound", type=float_arg("divergence_bound"), help="default 1e6")
    c.add_argument("--reward-shift", type=float_arg("reward_shift"),
                   help="the learner sees r - SHIFT (the constant-shift control for centering; default 0)")
    c.add_argument("--chunk-size", type=int_arg("chunk_size"))
    c.add_argument("--out")
    c.add_argument("--overwrite", action="store_true", help="allow a non-empty --out (start over)")
    c.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    c.add_argument("--chunks", metavar="K/N", help="compute only the K-th of N parts into --out")
    c.add_argument("--stall-timeout", type=_stall_timeout, metavar="SECONDS", help=STALL_HELP)
    c.set_defaults(func=cmd_control)

    st = sub.add_parser("study", help="run several sweeps from one TOML file", allow_abbrev=False)
    st.add_argument("file", nargs="?", help="the study's TOML file (shared defaults, [[sweep]] tables)")
    st.add_argument("--out", required=True)
    st.add_argument("--overwrite", action="store_true")
    st.add_argument("--resume", action="store_true", help="continue the study in --out")
    st.add_argument("--chunk-size", type=int_arg("chunk_size"))
    st.add_argument("--confirm-seeds", type=int_arg("confirm_seeds"), metavar="N")
    st.add_argument("--chunks", metavar="K/N",
                    help="compute only the K-th of N disjoint parts of every sweep's chunks into --out; then "
                         "`bec-jax study --out DIR --resume` assembles the study")
    st.add_argument("--distributed", metavar="auto|HOST:PORT,N,ID", help=DISTRIBUTED_HELP)
    st.add_argument("--stall-timeout", type=_stall_timeout, metavar="SECONDS", help=STALL_HELP)
    st.set_defaults(func=cmd_study)

    pl = sub.add_parser("plot", help="figures and a table of runs or studies", allow_abbrev=False)
    pl.add_argument("dirs", nargs="+", help="run directories and/or study directories")
    pl.add_argument("--out", help="where to write (default DIR/plots of the first DIR)")
    pl.add_argument("--metric", help=METRIC_HELP)
    pl.add_argument("--select", metavar="NAME=VALUE,...", help="plot this grid point instead of the best")
    pl.set_defaults(func=cmd_plot)

    cp = sub.add_parser("compare", help="the best curves of several runs on one figure", allow_abbrev=False)
    cp.add_argument("dirs", nargs="+", help="run directories and/or study directories")
    cp.add_argument("--out", required=True, help="the figure's file (.png or .pdf)")
    cp.add_argument("--metric", help=METRIC_HELP)
    cp.add_argument("--labels", help="comma-separated legend labels, one per run")
    cp.add_argument("--select", metavar="NAME=VALUE,...")
    cp.add_argument("--title")
    cp.set_defaults(func=cmd_compare)

    q = sub.add_parser("reproduce", help="reproduce a paper's experiments", allow_abbrev=False)
    q.add_argument("--paper", default="bec",
                   help="bec (Bellman Error Centering, the default; into results/paper), tdrc (Ghiassian et al. "
                        "2020's prediction experiment with the off-policy suite; into results/tdrc) or control "
                        "(the authors' control experiments: Q, CQ, GQ, CGQ on four tasks; into results/control)")
    q.add_argument("--quick", action="store_true", help="few seeds, short runs, small grids")
    q.add_argument("--mean-square", action="store_true",
                   help="also every grid point's exact mean-square prediction against its run, with long re-runs "
                        "where the run is too short to tell (minutes more)")
    q.add_argument("--out", default=None, help="output directory (default results/paper or results/<paper>)")
    q.add_argument("--overwrite", action="store_true",
                   help="allow a non-empty --out that an earlier `reproduce` did not write")
    q.add_argument("--stall-timeout", type=_stall_timeout, metavar="SECONDS", help=STALL_HELP)
    q.set_defaults(func=cmd_reproduce)

    an = sub.add_parser("analyze", help="exact mean and mean-square stability of an algorithm on a finite MDP, "
                                        "per grid point (no run)", allow_abbrev=False,
                        epilog="Every hyperparameter the algorithm declares is an option: --NAME v1,v2,... "
                               "(every step size is required).")
    an.add_argument("--env", required=True, help=f"{listing(envs.names(), None, None)}, an .npz/.toml MDP file or "
                                                 "package.module:function")
    an.add_argument("--algorithm", required=True, help=f"{listing(algorithms.names(), None, None)} or "
                                                       "package.module:attribute")
    an.add_argument("--env-param", action="append", type=env_param_arg, metavar="NAME=v1,v2",
                    help="an environment parameter's values, e.g. gamma=0.8,0.9 (repeatable)")
    an.add_argument("--sampler", default="markov", help=listing(sampling.KINDS, "markov"))
    an.add_argument("--out", help="write analysis.md, analysis.json and stability_map.png/.pdf here")
    an.add_argument("--run", metavar="DIR", help="a finished run of the same algorithm: its divergence "
                                                 "fractions go beside the map")
    an.add_argument("--map", type=names_arg, metavar="X,Y",
                    help="the map's two axes (default: the first two options given several values)")
    an.add_argument("--map-points", type=int_arg("map_points"), default=15, help="per axis (default 15)")
    an.set_defaults(func=cmd_analyze)
    return p


def _error(message) -> int:
    text = " ".join(str(message).split("\n"))
    print(f"bec-jax: error: {text}", file=sys.stderr)
    return EXIT_USAGE


def _not_a_callback_failure(record) -> bool:
    return not str(record.msg).endswith(" failed")


def _quiet_callback_failures() -> None:
    """JAX logs a failed host callback's traceback before raising its error; the
    run's one line says what failed (`runner.AlgorithmFailed`), so the log
    records are dropped."""
    import logging
    for name in ("jax._src.callback", "jax._src.debugging"):
        logging.getLogger(name).addFilter(_not_a_callback_failure)  # once: a filter already there is kept


def _forget_failed_callbacks() -> None:
    """A failed host callback's error stays in JAX's runtime tokens, which raise
    it again at exit (tracebacks after the one line); forgotten once reported."""
    try:
        from jax._src import dispatch
        dispatch.runtime_tokens.clear()
    except Exception:  # a private part of JAX: without it only the exit is noisier
        pass


def parse(argv=None):
    """Parsed arguments; `run`'s hyperparameter options (`--NAME LIST`, whatever
    the algorithm declares) land in `args.hyper`."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command in ("run", "control", "analyze"):  # the algorithm's declared hyperparameters: --NAME v1,v2
        args.hyper = hyper_options(extra)
    elif extra:
        tok = extra[0]
        if tok.startswith("-"):
            raise UsageError(f"{tok.lstrip('-').replace('-', '_')}: unknown option {tok!r}; see --help")
        raise UsageError(f"arguments: unexpected argument {tok!r}; see --help")
    return args


def main(argv=None) -> int:
    try:
        args = parse(argv)
    except UsageError as e:
        return _error(e)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    if getattr(args, "chunk_size", None) is not None and args.chunk_size <= 0:
        return _error(f"chunk_size: must be a positive integer, got {args.chunk_size}")
    if getattr(args, "confirm_seeds", None) is not None and args.confirm_seeds < 2:
        return _error(f"confirm_seeds: at least 2 seeds (for an interval), got {args.confirm_seeds}")
    use_all_cpu_cores()
    from bec_jax.runner import AlgorithmFailed, Interrupted
    _quiet_callback_failures()
    try:
        if getattr(args, "distributed", None):
            if getattr(args, "chunks", None):
                raise UsageError("chunks: --chunks splits a sweep between independent processes, --distributed "
                                 "joins processes into one run; give one")
            init_distributed(args.distributed)
        return args.func(args)
    except (ValueError, AlgorithmFailed) as e:  # bad input, memory, the user's algorithm: one line
        _forget_failed_callbacks()
        return _error(e)
    except Interrupted as e:
        print(f"bec-jax: interrupted by {signal.Signals(e.signum).name}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("bec-jax: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
