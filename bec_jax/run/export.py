"""Saved runs to TensorBoard and to Weights & Biases (offline): one exported run
per grid point (and per seed on request), for every kind of run. The command
line is `bec-jax export DIR... --to tensorboard|wandb --out OUT` (`bec_jax.cli.export`).

    recs = export.records({"two_state-ctd": kinds.load_result("runs/x")}, per_seed=True)
    export.write_tensorboard(recs, "tb")        # tensorboard --logdir tb
    export.write_wandb(recs, "wb", "bec_jax")   # wandb sync wb/wandb/offline-run-*

A `Record` is what one exported run holds, whatever the kind: its sweep (the
group), its name (the grid values, `alpha=0.1,beta=0.01`; a seed's run is
`<point>/seed_<k>`), its hyperparameters and its scalars:

- `curves/<tag>`: every mean curve the kind logs (`kinds.Scores.mean_curves`),
  x as the curve's own x (the step; the episode number for control's
  per-episode curves);
- `final/<name>`: every number of the point's `summary()` row that is not a
  grid value (areas, final values, interval bounds, fractions), at step 0;
- per seed: `seed/curve`, the seed's own curve where the kind keeps one
  (`Scores.seed_curves`), and `seed/score`, its score (`Scores.seed_scores`).

Non-finite values (a diverged prediction run's +inf mean, a control run's NaN
for a seed that did not finish) are left out of the scalars: a curve has no
point at those x, a final metric or score that is not finite is not written.
None and text (a verdict, the task's name) are not scalars either.
TensorBoard stores each scalar as a float32; W&B as the JSON of the float64.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field

import numpy as np

from bec_jax.run import kinds

TARGETS = ("tensorboard", "wandb")
EXTRAS = {"tensorboard": ("TensorBoard", "tensorboard"), "wandb": ("Weights & Biases", "wandb")}
MANIFEST = "bec_jax-export.json"  # what an export wrote: all that --overwrite may delete
SUFFIX = ".bec_jax"  # the end of the event files written here
_TB_MODULES = ("tensorboard.summary.writer.event_file_writer", "tensorboard.compat.proto.event_pb2",
               "tensorboard.compat.proto.summary_pb2", "tensorboard.plugins.hparams.summary_v2")


@dataclass
class Record:
    """One exported run.

    Attributes:
      sweep: the sweep's name: the run directory's name or the study's sweep
        (the TensorBoard folder, the W&B group).
      name: the grid values that tell the point apart (`alpha=0.1,beta=0.01`),
        `<point>/seed_<k>` for a seed's run.
      hparams: {name: number or text}: every grid column of the point, and
        `sweep`, `kind`, `algorithm`, `task` (and `seed` for a seed's run).
      curves: {tag: (x int64 (L,), y float64 (L,))}, finite values only.
      finals: {tag: float}, finite values only.
      seed: the seed's index, None for a grid point's run.
    """

    sweep: str
    name: str
    hparams: dict
    curves: dict = field(default_factory=dict)
    finals: dict = field(default_factory=dict)
    seed: int | None = None


def require(to: str):
    """The module `to` writes with (`wandb`; TensorBoard's event file writer),
    imported with the others it needs; `ValueError` in one line naming `to` for
    another target, or naming the `pip install` that brings a missing extra."""
    if to not in TARGETS:
        raise ValueError(f"to: unknown target {to!r}; known: {', '.join(TARGETS)}")
    label, extra = EXTRAS[to]
    try:
        mods = [importlib.import_module(name) for name in (_TB_MODULES if to == "tensorboard" else ("wandb",))]
    except ImportError:
        raise ValueError(f"export: --to {to} needs {label}: pip install 'bec_jax[{extra}]'") from None
    return mods[0]


def _text(v) -> str:
    """A grid value as a run's name shows it: 0.1, 1e-05, 3 (`repr` where
    the short form would not give the value back)."""
    if isinstance(v, float):
        short = f"{v:g}"
        return short if float(short) == v else repr(v)
    return str(v)


def _plain(v):
    """A grid value as TensorBoard and W&B take it: a Python bool, int, float or str."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    return str(v)


def point_names(r) -> list[str]:
    """Each grid point's name: `col=value` of the columns whose values differ
    between the points (all of them for a single point), joined by commas;
    `/` in a value becomes `_` (a name is a folder); a name met twice gets `#i`."""
    points = [r.point(i) for i in range(r.num_points)]
    cols = [c for c in points[0] if len({_text(p[c]) for p in points}) > 1] or list(points[0])
    names = [",".join(f"{c}={_text(p[c])}".replace("/", "_") for c in cols) or "point" for p in points]
    return [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]


def _finite(x, y) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) as int64 and float64, less the points where y is not finite."""
    x, y = np.asarray(x, np.int64), np.asarray(y, np.float64)
    keep = np.isfinite(y)
    return x[keep], y[keep]


def _finals(row: dict, grid: dict) -> dict:
    """{`final/<name>`: value} of the finite numbers of a summary row that are not grid values."""
    out = {}
    for k, v in row.items():
        if k in grid or isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            continue
        if math.isfinite(float(v)):
            out[f"final/{k}"] = float(v)
    return out


def sweep_records(sweep: str, r, per_seed: bool = False) -> list[Record]:
    """The records of one result (any kind): one per grid point, then, with
    `per_seed`, one per seed of each point."""
    kind = kinds.of_result(r)
    sc = kind.scores
    metric = kind.figures.check_metric({sweep: r}, None)  # the kind's default: what it ranks by
    rows = r.summary()
    out, seeds = [], []
    for i, name in enumerate(point_names(r)):
        grid = r.point(i)
        hp = {**{c: _plain(v) for c, v in grid.items()}, "sweep": sweep, "kind": r.KIND,
              "algorithm": str(r.algorithm), "task": str(sc.task_of(r))}
        curves = {f"curves/{t}": _finite(x, y) for t, (x, y) in sc.mean_curves(r, i).items()}
        out.append(Record(sweep, name, hp, curves, _finals(rows[i], grid)))
        if per_seed:
            scores = np.asarray(sc.seed_scores(r, i, metric), np.float64)
            per = sc.seed_curves(r, i, metric)
            for k in range(r.seeds):
                curves = {} if per is None else {"seed/curve": _finite(per[0], per[1][k])}
                finals = {"seed/score": float(scores[k])} if math.isfinite(scores[k]) else {}
                seeds.append(Record(sweep, f"{name}/seed_{k}", {**hp, "seed": k}, curves, finals, k))
    return out + seeds


def records(results: dict, per_seed: bool = False) -> list[Record]:
    """The records of {sweep name: result} (`sweep_records` of each), in order."""
    return [rec for sweep, r in results.items() for rec in sweep_records(sweep, r, per_seed)]


def _by_step(rec: Record) -> dict[int, dict[str, float]]:
    """{x: {tag: value}} of a record's curves, x ascending."""
    steps: dict[int, dict[str, float]] = {}
    for tag, (x, y) in rec.curves.items():
        for s, v in zip(x.tolist(), y.tolist()):
            steps.setdefault(s, {})[tag] = v
    return dict(sorted(steps.items()))


# ------------------------------------------------------------------ the output folder

def _inside(out: str, rel) -> str | None:
    """`out`/`rel` if `rel` is a relative path that stays inside `out`, else None."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel):
        return None
    root = os.path.realpath(out)
    path = os.path.realpath(os.path.join(out, rel))
    return path if path.startswith(root + os.sep) else None


def forget_previous(out: str) -> int:
    """Deletes what an earlier export into `out` wrote (the paths its manifest
    lists, each one inside `out`) and nothing else; returns how many it deleted."""
    try:
        with open(os.path.join(out, MANIFEST)) as f:
            listed = json.load(f).get("written", [])
    except (OSError, ValueError, AttributeError):
        return 0
    n = 0
    for rel in listed if isinstance(listed, list) else []:
        path = _inside(out, rel)
        if path is None or not os.path.lexists(path):
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        n += 1
    return n


def _write_manifest(out: str, to: str, written: list[str]) -> None:
    """Lists in `out` what this export wrote (relative paths), for a later --overwrite."""
    rel = [os.path.relpath(p, out) for p in written]
    with open(os.path.join(out, MANIFEST), "w") as f:
        json.dump({"to": to, "written": rel}, f, indent=1)


# ------------------------------------------------------------------ TensorBoard

def _scalars_event(pb, step: int, values: dict, wall: float):
    """One event holding the scalars {tag: value} at `step` (float32 `simple_value`s)."""
    summary = pb.summary_pb2.Summary(value=[pb.summary_pb2.Summary.Value(tag=t, simple_value=v)
                                            for t, v in values.items()])
    return pb.event_pb2.Event(wall_time=wall, step=step, summary=summary)


def _hparams_config(hp, recs: list[Record]):
    """The HParams dashboard's experiment: every hyperparameter (with its values
    as a domain where they are of one type) and every final scalar as a metric."""
    values: dict[str, list] = {}
    for rec in recs:
        for k, v in rec.hparams.items():
            values.setdefault(k, []).append(v)
    params = []
    for k, vs in values.items():
        kinds_of = {type(v) for v in vs}
        params.append(hp.HParam(k, hp.Discrete(sorted(set(vs))) if len(kinds_of) == 1 else None))
    tags = sorted({t for rec in recs for t in rec.finals})
    return hp.hparams_config_pb(params, [hp.Metric(t) for t in tags])


def _new_event_file(writer_cls, logdir: str, events: list) -> str:
    """Writes `events` into a new event file in `logdir`; returns its path."""
    os.makedirs(logdir, exist_ok=True)
    before = set(os.listdir(logdir))
    w = writer_cls(logdir, filename_suffix=SUFFIX)
    for e in events:
        w.add_event(e)
    w.close()
    (name,) = [f for f in os.listdir(logdir) if f not in before and f.endswith(SUFFIX)]
    return os.path.join(logdir, name)


def write_tensorboard(recs: list[Record], out: str) -> list[str]:
    """Writes each record as a TensorBoard run, `out/<sweep>/<name>` (a seed's
    run in its point's folder), with TensorBoard's own modules and no
    TensorFlow: its hyperparameters for the HParams dashboard (and the
    experiment, every hyperparameter and final metric, in `out` itself), its
    curves by x and its final scalars at step 0. Returns the event files written."""
    require("tensorboard")
    from types import SimpleNamespace

    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import summary_v2 as hp
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    pb = SimpleNamespace(event_pb2=event_pb2, summary_pb2=summary_pb2)
    wall = time.time()
    written = [_new_event_file(EventFileWriter, out, [event_pb2.Event(wall_time=wall, summary=_hparams_config(hp, recs))])]
    for rec in recs:
        trial = f"{rec.sweep}/{rec.name}"
        events = [event_pb2.Event(wall_time=wall, summary=hp.hparams_pb(rec.hparams, trial, wall))]
        events += [_scalars_event(pb, s, vals, wall) for s, vals in _by_step(rec).items()]
        if rec.finals:
            events.append(_scalars_event(pb, 0, rec.finals, wall))
        written.append(_new_event_file(EventFileWriter, os.path.join(out, rec.sweep, rec.name), events))
    return written


# ------------------------------------------------------------------ Weights & Biases

_WANDB_QUIET = {"mode": "offline", "console": "off", "silent": True, "quiet": True, "x_disable_stats": True,
                "x_disable_meta": True, "x_disable_machine_info": True, "disable_git": True, "disable_code": True,
                "save_code": False, "x_save_requirements": False, "disable_job_creation": True}


@contextlib.contextmanager
def _offline_env():
    """W&B's environment for an export: offline, silent, no API key (nothing
    may reach the network), no run id or resume; the caller's variables are restored after."""
    # A run id or resume from the environment would make every export run the same W&B run.
    dropped = ("WANDB_API_KEY", "WANDB_RUN_ID", "WANDB_RESUME")
    saved = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_SILENT", "WANDB_CONSOLE") + dropped}
    os.environ.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"})
    for k in dropped:
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_project(project: str) -> str:
    """`project` if W&B takes it as a project's name; `ValueError` naming `project` otherwise."""
    bad = set("/\\#?%:")
    if not isinstance(project, str) or not project.strip() or len(project) > 128 or bad & set(project):
        raise ValueError(f"project: a W&B project name of 1-128 characters without any of / \\ # ? % :, "
                         f"got {project!r}")
    return project


def write_wandb(recs: list[Record], out: str, project: str = "bec_jax") -> list[str]:
    """Logs each record as an offline W&B run under `out/wandb` (named by the
    record, grouped by its sweep, its hyperparameters as the config; job type
    `point` or `seed`): its curves with `step` the curve's x, its final
    scalars in the run's summary. Nothing reaches the network; `wandb sync
    out/wandb/offline-run-*` uploads them later. Returns the runs' directories."""
    wandb = require("wandb")
    check_project(project)
    fields = getattr(wandb.Settings, "model_fields", {})
    settings = wandb.Settings(**{k: v for k, v in _WANDB_QUIET.items() if k in fields})
    os.makedirs(out, exist_ok=True)
    written = []
    with _offline_env():
        for rec in recs:
            try:
                run = wandb.init(dir=out, project=project, group=rec.sweep, name=rec.name, config=rec.hparams,
                                 job_type="point" if rec.seed is None else "seed", settings=settings)
            except Exception as e:  # W&B's own errors (a bad setting, a failed start): one line
                raise ValueError(f"export: W&B could not start an offline run ({str(e).splitlines()[0]})") from None
            for step, vals in _by_step(rec).items():
                run.log(vals, step=step)
            for tag, v in rec.finals.items():
                run.summary[tag] = v
            run_dir = os.path.dirname(run.settings.files_dir)
            run.finish()
            written.append(run_dir)
    return written


def export(results: dict, to: str, out: str, per_seed: bool = False, project: str = "bec_jax") -> list[Record]:
    """Writes {sweep name: result} to `to` ("tensorboard" or "wandb") in `out`
    (made if missing), after deleting what an earlier export there listed in
    its manifest; lists what it wrote in `out`'s manifest. Returns the records."""
    require(to)
    if to == "wandb":
        check_project(project)
    recs = records(results, per_seed)
    os.makedirs(out, exist_ok=True)
    forget_previous(out)
    written = write_tensorboard(recs, out) if to == "tensorboard" else write_wandb(recs, out, project)
    _write_manifest(out, to, written)
    return recs
