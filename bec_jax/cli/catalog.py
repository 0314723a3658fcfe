"""What `bec-jax list` prints and `bec-jax --version` says, read from the registries.

Every entry comes from the code: environments and control tasks with their
factories' keyword parameters (`inspect.signature`), algorithms with their
declared `Hyperparameter`s and the equations they cite (`Algorithm.equations`),
metrics with their registered documentation. A name registered before listing
(`envs.register`, `algorithms.register`, `metrics.register_metric`,
`control.tasks.register`, `control.algorithms.register`,
`control.continuing.tasks.register`, `control.continuing.learners.register`)
is listed with the rest.

The registries are imported inside the functions: `version_text` imports no JAX.
"""
from __future__ import annotations

import inspect
import json
import math

import bec_jax

# What `bec-jax list WHAT` takes, in the order `all` prints them.
SECTIONS = ("environments", "algorithms", "metrics", "tasks", "control-algorithms", "continuing-tasks",
            "continuing-algorithms")

_TITLES = {
    "environments": "environments (bec-jax run --env NAME [--env-param NAME=v1,v2])",
    "algorithms": "algorithms (bec-jax run --algorithm NAME --HYPERPARAMETER v1,v2)",
    "metrics": "metrics (bec-jax run --metrics NAME,...)",
    "tasks": "control tasks (bec-jax control --task NAME [--task-param NAME=VALUE])",
    "control-algorithms": "control algorithms (bec-jax control --algorithm NAME --HYPERPARAMETER v1,v2)",
    "continuing-tasks": "continuing tasks (bec-jax continuing --task NAME [--task-param NAME=VALUE])",
    "continuing-algorithms": "continuing learners (bec-jax continuing --algorithm NAME --HYPERPARAMETER v1,v2)",
}


def version_text() -> str:
    """'bec-jax X.Y.Z (jax A.B.C)': this package's version and the installed
    JAX's, read from its metadata (JAX is not imported)."""
    from importlib import metadata
    try:
        jax_version = f"jax {metadata.version('jax')}"
    except metadata.PackageNotFoundError:
        jax_version = "jax not installed"
    return f"bec-jax {bec_jax.__version__} ({jax_version})"


def _value(v):
    """A default as JSON holds it (tuples as lists; anything else as its repr)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, (tuple, list)):
        return [_value(x) for x in v]
    return repr(v)


def _first_line(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def _parameters(fn, skip: tuple = ()) -> list[dict]:
    """[{name, default, required}] of `fn`'s keyword parameters."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [{"name": p.name, "required": p.default is p.empty,
             "default": None if p.default is p.empty else _value(p.default)}
            for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in skip]


def _algorithm(alg) -> dict:
    return {"name": alg.name, "label": alg.label, "equations": alg.equations,
            "doc": _first_line(inspect.getdoc(alg.update)),
            "hyperparameters": [{"name": h.name, "doc": h.doc, "default": _value(h.default),
                                 "range": None if h.static else h.range_text, "step_size": h.step_size,
                                 "static": h.static} for h in alg.hyperparameters]}


def environments() -> list[dict]:
    """The registered environments: name, parameters (with defaults) and doc line."""
    from bec_jax import envs
    return [{"name": n, "parameters": _parameters(envs.REGISTRY[n]), "doc": _first_line(envs.REGISTRY[n].__doc__)}
            for n in envs.names()]


def algorithms() -> list[dict]:
    """The registered prediction algorithms: hyperparameters and equations."""
    from bec_jax import algorithms as algs
    return [_algorithm(algs.get(n)) for n in algs.names()]


def metrics() -> list[dict]:
    """The registered metrics and what each measures."""
    from bec_jax.theory import metrics as m
    return [{"name": n, "doc": m.METRIC_REGISTRY[n].doc} for n in m.metric_names()]


def tasks() -> list[dict]:
    """The registered control tasks, then `gymnax:ENV_ID` with the feature maps it takes."""
    from bec_jax.control import features
    from bec_jax.control import tasks as t
    out = [{"name": n, "parameters": _parameters(t.TASKS[n]), "doc": _first_line(t.TASKS[n].__doc__)}
           for n in t.names()]
    maps = {k: _parameters(b, skip=("low", "high", "num_actions")) for k, b in features.KINDS.items()}
    out.append({"name": t.GYMNAX + "ENV_ID", "parameters": _parameters(t.gymnax_task, skip=("env_id",)),
                "doc": _first_line(t.gymnax_task.__doc__), "features": maps})
    return out


def control_algorithms() -> list[dict]:
    """The registered control algorithms: hyperparameters and equations."""
    from bec_jax.control import algorithms as algs
    return [_algorithm(algs.get(n)) for n in algs.names()]


def continuing_tasks() -> list[dict]:
    """The registered continuing tasks: name, parameters (with defaults) and doc line."""
    from bec_jax.control.continuing import tasks as t
    return [{"name": n, "parameters": _parameters(t.TASKS[n]), "doc": _first_line(t.TASKS[n].__doc__)}
            for n in t.names()]


def continuing_algorithms() -> list[dict]:
    """The registered continuing learners: hyperparameters and equations."""
    from bec_jax.control.continuing import learners
    return [_algorithm(learners.get(n)) for n in learners.names()]


_BUILD = {"environments": environments, "algorithms": algorithms, "metrics": metrics, "tasks": tasks,
          "control-algorithms": control_algorithms, "continuing-tasks": continuing_tasks,
          "continuing-algorithms": continuing_algorithms}


def catalog(what: str = "all") -> dict:
    """{section: entries} of `what` (a name of `SECTIONS`, or "all"); `ValueError`
    naming `what` and the allowed values otherwise."""
    if what == "all":
        return {s: _BUILD[s]() for s in SECTIONS}
    if what not in _BUILD:
        raise ValueError(f"what: unknown list {what!r}; choose one of all, {', '.join(SECTIONS)}")
    return {what: _BUILD[what]()}


def _params_text(params: list[dict]) -> str:
    return ", ".join(p["name"] + ("" if p["required"] else f"={p['default']}") for p in params) or "no parameters"


def _entry_lines(section: str, e: dict) -> list[str]:
    if section == "metrics":
        return [f"  {e['name']}", f"      {e['doc']}"]
    if section in ("environments", "tasks", "continuing-tasks"):
        lines = [f"  {e['name']}({_params_text(e['parameters'])})"]
        if e["doc"]:
            lines.append(f"      {e['doc']}")
        for kind, params in e.get("features", {}).items():
            lines.append(f"      features={kind}: {_params_text(params)}")
        return lines
    lines = [f"  {e['name']} ({e['label']}): {e['equations'] or 'no equation given'}"]
    for h in e["hyperparameters"]:
        default = "required" if h["default"] is None else f"default {h['default']}"
        kind = "step size" if h["step_size"] else ("static" if h["static"] else "parameter")
        where = f" in {h['range']}" if h["range"] else ""
        lines.append(f"      --{h['name']}: {h['doc']} ({kind}{where}, {default})")
    return lines


def render(cat: dict) -> str:
    """The text `bec-jax list` prints for a `catalog`."""
    blocks = []
    for section, entries in cat.items():
        lines = [_TITLES[section]]
        for e in entries:
            lines += _entry_lines(section, e)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def command(what: str = "all", as_json: bool = False) -> str:
    """`bec-jax list [WHAT] [--json]`'s output."""
    cat = catalog(what)
    return json.dumps(cat, indent=1) + "\n" if as_json else render(cat)
