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
import errno
import hashlib
import importlib
import itertools
import json
import math
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from bec_jax.files import TMP_PREFIX, write_json
from bec_jax.run import kinds, outdir

TARGETS = ("tensorboard", "wandb")
EXTRAS = {"tensorboard": ("TensorBoard", "tensorboard"), "wandb": ("Weights & Biases", "wandb")}
MANIFEST = "bec_jax-export.json"  # what an export wrote: all that --overwrite may delete
SUFFIX = ".bec_jax"  # the end of the event files written here
STAGE_PREFIX = TMP_PREFIX + "export-"  # OUT/.tmp-export-*: an export being written, moved into place once whole
# The names an export gives (all that --overwrite deletes, where the manifest lists them with their sha256):
_TB_NAME = re.compile(r"^events\.out\.tfevents\.[^/]+" + re.escape(SUFFIX) + "$")
_WB_DIR = re.compile(r"^wandb/offline-run-\d{8}_\d{6}-[a-z0-9]+$")
_WB_RECORD = re.compile(r"^run-[a-z0-9]+\.wandb$")
_WB_LINKS = ("latest-run", "debug.log", "debug-internal.log")  # W&B's links in OUT/wandb to its latest run
_STAGE = re.compile(r"^" + re.escape(STAGE_PREFIX) + r"[A-Za-z0-9_]+$")
_TB_MODULES = ("tensorboard.summary.writer.event_file_writer", "tensorboard.summary.writer.record_writer",
               "tensorboard.compat.proto.event_pb2", "tensorboard.compat.proto.summary_pb2",
               "tensorboard.plugins.hparams.summary_v2")


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
    another target, or naming the `pip install` that brings a missing extra or
    mends one that fails as it imports."""
    if to not in TARGETS:
        raise ValueError(f"to: unknown target {to!r}; known: {', '.join(TARGETS)}")
    label, extra = EXTRAS[to]
    try:
        mods = [importlib.import_module(name) for name in (_TB_MODULES if to == "tensorboard" else ("wandb",))]
    except ModuleNotFoundError:
        raise ValueError(f"export: --to {to} needs {label}: pip install 'bec_jax[{extra}]'") from None
    except Exception as e:  # installed, but fails as it imports (a broken or clashing version): any exception
        first = (str(e).splitlines() or [""])[0]
        raise ValueError(f"export: --to {to}: {label} does not import here ({type(e).__name__}: {first}); "
                         f"pip install --force-reinstall 'bec_jax[{extra}]' brings a version that works") from None
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

def _sha256(path: str, n: int | None = None) -> str:
    """sha256 of the file at `path` (of its first `n` bytes)."""
    h = hashlib.sha256()
    left = n if n is not None else float("inf")
    with open(path, "rb") as f:
        while left > 0:
            block = f.read(int(min(left, 1 << 20)))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def _proof(path: str, n: int | None = None) -> tuple[str, int] | None:
    """(sha256, bytes) a manifest records for an exported entry: an event
    file's, whole; a W&B run folder's run record (its one `run-<id>.wandb`,
    a log W&B only appends to, and may still, just after a run has finished:
    its first `n` bytes where `n` is given; its logs and `wandb sync`'s marker
    are not part of it). None where there is no such record, or a shorter one."""
    if not os.path.isdir(path):
        return _sha256(path), os.path.getsize(path)
    runs = [name for name in os.listdir(path) if _WB_RECORD.match(name)]
    record = os.path.join(path, runs[0]) if len(runs) == 1 else None
    if record is None or os.path.islink(record) or not os.path.isfile(record):
        return None
    size = os.path.getsize(record)
    if n is None:
        n = size
    return (_sha256(record, n), n) if size >= n else None


def _listed_path(out: str, rel, proof) -> str | None:
    """The path of entry `rel` of an earlier export's manifest in `out`, to
    delete, or None where it is gone; `ValueError` naming `out`, before anything
    is deleted, unless it is one an export writes: a name an export gives (an
    event file `events.out.tfevents.*.bec_jax`, a W&B folder
    `wandb/offline-run-*`), inside `out` through no link, of that kind, with
    the sha256 the manifest records for it (`proof`: its sha256 and bytes)."""
    def refuse(why: str) -> ValueError:
        return ValueError(f"out: {os.path.join(out, MANIFEST)!r} lists {rel!r}, {why}; --overwrite deletes only what "
                          f"an export wrote: move it (or the manifest) away and export again")

    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or os.path.normpath(rel) != rel or \
            rel.split(os.sep)[0] == "..":
        raise refuse("which is not a path inside it")
    folder = _WB_DIR.match(rel) is not None
    if not folder and not _TB_NAME.match(os.path.basename(rel)):
        raise refuse("which is not a name an export gives")
    path = os.path.join(out, rel)
    parent = os.path.dirname(rel)
    if os.path.realpath(os.path.join(out, parent)) != os.path.normpath(os.path.join(os.path.realpath(out), parent)):
        raise refuse("which is reached through a link")
    if not os.path.lexists(path):
        return None
    kind = os.lstat(path).st_mode
    if not (stat.S_ISDIR(kind) if folder else stat.S_ISREG(kind)):
        raise refuse(f"which is not {'a folder' if folder else 'a file'} (as the export wrote it)")
    sha, n = proof
    if not isinstance(sha, str) or not isinstance(n, int) or isinstance(n, bool) or n < 0 or \
            _proof(path, n if folder else None) != (sha, n):
        raise refuse("whose sha256 is not the one the export recorded (changed since, or not written by it)")
    return path


def previous(out: str) -> dict[str, tuple]:
    """{path: (sha256, bytes)} of what an earlier export into `out` wrote and
    that is still there (`_listed_path` checks each: a manifest that lists
    anything else is `ValueError` naming `out`, before anything is deleted);
    {} without a manifest."""
    path = os.path.join(out, MANIFEST)
    if not os.path.lexists(path):
        return {}
    try:
        with open(path) as f:
            m = json.load(f)
        listed, sums, sizes = m["written"], m.get("sha256"), m.get("bytes")
        if not isinstance(listed, list) or not isinstance(sums, dict) or not isinstance(sizes, dict):
            raise ValueError("no list of written files with their sha256 and bytes")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"out: cannot read {path!r} ({e}); move it and what it lists away, or export into "
                         "another --out") from None
    got = {}
    for rel in listed:
        proof = (sums.get(rel), sizes.get(rel)) if isinstance(rel, str) else (None, None)
        p = _listed_path(out, rel, proof)
        if p is not None:
            got[p] = proof
    return got


def forget_previous(out: str) -> int:
    """Deletes what an earlier export into `out` wrote (`previous`: only what
    its manifest lists and proves to be an export's) and the folders that
    leaves empty; returns how many entries it deleted."""
    paths = list(previous(out))
    _delete(out, paths)
    return len(paths)


def _delete(out: str, paths: list[str]) -> None:
    """Deletes exported entries (`previous`), then their folders left empty, up to `out`."""
    root = os.path.abspath(out)
    for p in paths:
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)  # a W&B run folder: links inside are removed, never followed
        else:
            os.unlink(p)
        d = os.path.dirname(os.path.abspath(p))
        while d != root and d.startswith(root + os.sep):
            try:
                os.rmdir(d)
            except OSError:
                break
            d = os.path.dirname(d)


def _manifest(out: str, to: str, entries: dict) -> None:
    """Lists in `out` what exports wrote there ({relative path: (sha256,
    bytes)}, `_proof`), for a later --overwrite."""
    write_json(os.path.join(out, MANIFEST), {"to": to, "written": list(entries),
                                             "sha256": {k: v[0] for k, v in entries.items()},
                                             "bytes": {k: v[1] for k, v in entries.items()}})


def _remove_stages(out: str) -> None:
    """Removes the folders of exports into `out` cut short (a kill -9), under its lock."""
    for name in os.listdir(out):
        path = os.path.join(out, name)
        if _STAGE.match(name) and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


def _place(out: str, stage: str, rels: list[str]) -> None:
    """Moves the entries `rels` written into `stage` to the same places in
    `out`, and W&B's own links to its latest run (where `out` has none, or one
    to replace)."""
    for rel in rels:
        os.makedirs(os.path.dirname(os.path.join(out, rel)), exist_ok=True)
        os.replace(os.path.join(stage, rel), os.path.join(out, rel))
    for name in _WB_LINKS:
        src, dst = os.path.join(stage, "wandb", name), os.path.join(out, "wandb", name)
        if os.path.islink(src) and (os.path.islink(dst) or not os.path.lexists(dst)):
            os.replace(src, dst)


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


_EVENT_FILES = itertools.count()  # tells apart the event files this process writes in one second


def _new_event_file(pb, logdir: str, events: list) -> str:
    """Writes `events` into a new event file in `logdir` (named as
    TensorBoard's EventFileWriter names it, its file-version event first, in
    TensorBoard's record format) and onto the disk; returns its path. Written
    here in this thread, not by EventFileWriter's own thread: a write that
    fails (a full disk) raises here, and is one line, not a thread's traceback."""
    os.makedirs(logdir, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_EVENT_FILES)}"
    path = os.path.join(logdir, name + SUFFIX)
    first = pb.event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2",
                               source_metadata=pb.event_pb2.SourceMetadata(writer="bec_jax.run.export"))
    with open(path, "xb") as f:  # x: never over a file that is there
        w = pb.RecordWriter(f)
        for e in [first, *events]:
            w.write(e.SerializeToString())
        f.flush()
        os.fsync(f.fileno())
    return path


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
    from tensorboard.summary.writer.record_writer import RecordWriter
    pb = SimpleNamespace(event_pb2=event_pb2, summary_pb2=summary_pb2, RecordWriter=RecordWriter)
    wall = time.time()
    written = [_new_event_file(pb, out, [event_pb2.Event(wall_time=wall, summary=_hparams_config(hp, recs))])]
    for rec in recs:
        trial = f"{rec.sweep}/{rec.name}"
        events = [event_pb2.Event(wall_time=wall, summary=hp.hparams_pb(rec.hparams, trial, wall))]
        events += [_scalars_event(pb, s, vals, wall) for s, vals in _by_step(rec).items()]
        if rec.finals:
            events.append(_scalars_event(pb, 0, rec.finals, wall))
        written.append(_new_event_file(pb, os.path.join(out, rec.sweep, rec.name), events))
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


def _write(recs: list[Record], to: str, out: str, project: str, done: list) -> None:
    """`export`'s writing, under `out`'s lock: the export into a folder of its
    own in `out`, then, once all of it is written, the earlier export deleted
    and this one moved into place (`done` gets True from then on)."""
    _remove_stages(out)
    old = previous(out)  # checked before anything is written or deleted
    stage = tempfile.mkdtemp(dir=out, prefix=STAGE_PREFIX)
    try:
        written = write_tensorboard(recs, stage) if to == "tensorboard" else write_wandb(recs, stage, project)
        new = {os.path.relpath(p, stage): _proof(p) or (None, None) for p in written}
        for rel in new:
            dst = os.path.join(out, rel)
            if os.path.lexists(dst) and dst not in old:
                raise ValueError(f"out: {dst!r} is in the way of the export; move it away and export again")
        kept = {os.path.relpath(p, out): proof for p, proof in old.items()}
        _manifest(out, to, {**kept, **new})  # lists everything that may be there, whatever happens next
        done.append(True)
        _delete(out, list(old))
        _place(out, stage, list(new))
        _manifest(out, to, new)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def export(results: dict, to: str, out: str, per_seed: bool = False, project: str = "bec_jax") -> list[Record]:
    """Writes {sweep name: result} to `to` ("tensorboard" or "wandb") in `out`
    (made if missing) and returns the records. One export (or run) at a time
    writes `out` (`outdir.lock_dir`). The export is written into a folder of
    its own inside `out` first: only once all of it is written is what an
    earlier export there listed in its manifest deleted (`previous`) and the
    new one moved into place and listed, with each entry's sha256. An export
    that cannot be written (a full disk) is one line, and leaves `out` as it
    was (not there, when it made it)."""
    require(to)
    if to == "wandb":
        check_project(project)
    recs = records(results, per_seed)
    made = not os.path.lexists(out)
    os.makedirs(out, exist_ok=True)
    placed: list = []
    try:
        outdir.lock_dir(out)
        _write(recs, to, out, project, placed)
    except OSError as e:
        field = "disk" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "out"
        if placed:  # deleting or moving in `out`
            what = f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")
            state = f"what it has written is listed in {os.path.join(out, MANIFEST)!r}; export again with --overwrite"
        else:  # the file named is in the folder of this export, which is gone
            what, state = e.strerror or str(e), f"nothing of it is kept, and {out!r} is as it was; " + \
                ("free some space and export again" if field == "disk" else "make it writable and export again")
        raise ValueError(f"{field}: cannot write the export into {out!r}: {what}; {state}") from None
    finally:
        outdir.unlock_dir(out)
        if made and not placed:
            with contextlib.suppress(OSError):
                os.rmdir(out)  # only where empty
    return recs
