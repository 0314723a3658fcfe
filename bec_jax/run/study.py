"""Studies: several sweeps in one TOML file, run into one directory, resumably.

    seeds = 50                  # shared defaults: any sweep field
    steps = 1000
    log_every = 10
    metrics = ["rmscbe", "rmspcbe"]

    [[sweep]]
    name = "boyan_ctd"          # the subdirectory (default: env-algorithm)
    env = "boyan_chain"
    algorithm = "ctd"
    alpha = [0.01, 0.1]
    beta = [0.1]

    [[sweep]]
    env = "baird"
    algorithm = "tdrc"
    alpha = [0.001, 0.01]

`bec-jax study FILE --out DIR` validates every sweep before any work (an error
names the sweep and the field), then runs them in order into DIR/<name>/, writing
DIR/study.json (the study and each sweep's status). Interrupted, it resumes with
`--resume`: a finished sweep is not run again, an interrupted one continues from
its chunks. `study.load_frame(DIR)` reads all of it into one DataFrame.

A control sweep is a `[[sweep]]` table with `kind = "control"` and a
`ControlSpec`'s fields (task, algorithm, its hyperparameters, episodes, ...):

    [[sweep]]
    name = "cliff-cq"
    kind = "control"
    task = "cliff_walking"
    algorithm = "cq"
    alpha = [0.1, 0.5]
    beta = [0.01, 0.1]
    episodes = 300

One study may hold sweeps of both kinds. A shared default applies to the
sweeps whose kind takes it (`steps` to the prediction sweeps, `episodes` to the
control ones, `seeds` to all); one that no sweep takes is an error naming it.

Sweeps that differ only in their algorithm and step sizes (and fit one call
each) share one compiled program (their front's `run_many`) when the study
runs in one process with the default layout: they are computed together when
the first of them comes up, and each is written when its turn comes, bit for
bit what it would be alone.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import jax

from bec_jax.files import CURVES_FILE, META_FILE, STUDY_FILE, import_pandas, write_json
from bec_jax.prediction.fields import read_toml
from bec_jax.run import confirm, kinds, rundir, runner

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Study:
    """Named sweeps, validated. `sweeps` is a tuple of (name, spec): a
    `SweepSpec` or a `ControlSpec`."""

    sweeps: tuple

    def to_dict(self) -> dict:
        return {"sweeps": [{"name": n, "spec": s.to_dict()} for n, s in self.sweeps]}

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.sweeps]


def from_dict(table: dict, where: str = "study") -> Study:
    """A `Study` from a TOML table: shared defaults at the top level, one
    `[[sweep]]` table per sweep (`kind = "control"` for a control sweep; see the
    module docstring). `ValueError` naming the sweep and the field."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table, got {type(table).__name__}")
    table = dict(table)
    sweeps = table.pop("sweep", None)
    table.pop("out", None)
    if not isinstance(sweeps, list) or not sweeps or not all(isinstance(s, dict) for s in sweeps):
        raise ValueError(f"{where}: give at least one [[sweep]] table")
    out, seen = [], set()
    used = set()  # the shared defaults some sweep takes
    for i, raw in enumerate(sweeps):
        raw = dict(raw)
        name = raw.pop("name", None)
        label = f"sweep[{i}]" + (f" ({name})" if isinstance(name, str) else "")
        try:
            spec, dropped = _spec(table, raw)
        except ValueError as e:
            raise ValueError(f"{label}: {e}") from None
        used.update(k for k in table if k not in dropped)
        if name is None:
            d = spec.to_dict()
            name = f"{d.get('env', d.get('task', 'env'))}-{d['algorithm']}".replace(":", "_").replace("/", "_")
            base, k = name, 2
            while name in seen:
                name, k = f"{base}-{k}", k + 1
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{label}.name: letters, digits, '_', '-' and '.' (a directory name), got {name!r}")
        if name.lower() == STUDY_FILE:  # its directory would be the study's own record (case-blind file systems too)
            raise ValueError(f"{label}.name: {name!r} is the file the study keeps its status in; choose another name")
        if name in seen:
            raise ValueError(f"{label}.name: {name!r} is used by another sweep; names must be unique")
        seen.add(name)
        out.append((name, spec))
    for k in table:
        if k not in used:  # a typo: every kind refused it as an unknown field
            raise ValueError(f"{k}: a shared default that no sweep of the study takes (an unknown field of "
                             "each sweep); check its spelling")
    return Study(tuple(out))


_UNKNOWN = re.compile(r"^(\S+): unknown field")


def _spec(shared: dict, own: dict):
    """(spec, the shared keys it left out) of one sweep: its own table over the
    shared defaults, less the shared keys its kind does not take (its spec
    refuses them as unknown fields). `rundir.spec_from_dict` builds the spec
    its `kind` names."""
    merged = {**shared, **own}
    kinds.of_dict(merged)  # an unknown kind: `ValueError` naming `kind`
    dropped = set()
    while True:
        try:
            return rundir.spec_from_dict(merged), dropped
        except ValueError as e:
            m = _UNKNOWN.match(str(e))
            key = m and next((k for k in merged if str(k) == m.group(1) or repr(k) == m.group(1)), None)
            if key is None or key in own or key not in shared or key == "kind":
                raise
            dropped.add(key)
            merged.pop(key)


def load(path: str, defaults: dict | None = None) -> Study:
    """The study of a TOML file; `ValueError` naming the file for unreadable
    input. `defaults` replace the file's shared defaults of those names (the
    command line's `--search`: a sweep's own table still wins)."""
    table = read_toml(path, "study")
    if defaults and isinstance(table, dict):
        table = {**table, **defaults}
    return from_dict(table)


def searches(study: Study) -> list[str]:
    """The names of the study's sweeps that run a search (`engine.search`)."""
    return [n for n, s in study.sweeps if getattr(s, "search", None) is not None]


def check_searchable(study: Study, part=None) -> None:
    """A study whose sweeps search runs each search whole, in one process
    (as `runner.run_to_dir` asks of a lone sweep): `RunError` naming
    `chunks` or `distributed`, before anything is written."""
    found = searches(study)
    if not found:
        return
    if part is not None:
        raise rundir.RunError(f"chunks: sweep {found[0]!r} searches, and a search runs every grid point in one "
                              "compiled call; run the study whole, without --chunks")
    if jax.process_count() > 1:
        raise rundir.RunError(f"distributed: sweep {found[0]!r} searches, and a search runs every grid point in "
                              "one call on one device; run the study in one process, without --distributed")


def saved(out: str) -> Study | None:
    """The study recorded in `out/study.json`, or None."""
    try:
        with open(os.path.join(out, STUDY_FILE)) as f:
            d = json.load(f)
        return Study(tuple((s["name"], rundir.spec_from_dict(s["spec"])) for s in d["sweeps"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_study_dir(path: str) -> bool:
    """Whether `path` holds a study (its `study.json`)."""
    return os.path.isfile(os.path.join(path, STUDY_FILE))


def sweep_dirs(out: str) -> dict[str, str]:
    """{name: directory} of the finished sweeps of the study in `out`, in the
    study's order (from study.json alone: nothing is imported or validated);
    `ValueError` naming the file when it cannot be read."""
    path = os.path.join(out, STUDY_FILE)
    try:
        with open(path) as f:
            names = [s["name"] for s in json.load(f)["sweeps"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"dirs: cannot read {path!r} ({e})") from None
    return {n: os.path.join(out, n) for n in names if os.path.isfile(os.path.join(out, n, CURVES_FILE))}


def load_frame(path: str):
    """A long-format pandas DataFrame of a run directory, or of every sweep of a
    study directory (with a `sweep` column): see `SweepResult.to_frame` and
    `ControlResult.to_frame` (a study of both kinds has the columns of both,
    empty where a row's kind has none)."""
    pd = import_pandas()
    if is_study_dir(path):
        frames = []
        for name, d in sweep_dirs(path).items():
            frame = kinds.load_result(d).to_frame()
            frame.insert(0, "sweep", name)
            frames.append(frame)
        if not frames:
            raise ValueError(f"path: the study in {path!r} has no finished sweep yet")
        return pd.concat(frames, ignore_index=True)
    return kinds.load_result(path).to_frame()


def _finished(path: str, spec) -> bool:
    try:
        with open(os.path.join(path, META_FILE)) as f:
            meta = json.load(f)
        return meta.get("spec") == spec.to_dict() and os.path.isfile(os.path.join(path, CURVES_FILE))
    except (OSError, ValueError):
        return False


def run(study: Study | None, out: str, *, resume: bool = False, overwrite: bool = False, stop=None,
        confirm_seeds: int | None = None, part=None, log=print, **run_kwargs) -> dict:
    """Runs every sweep of `study` into `out/<name>/` (see the module docstring);
    `study=None` with `resume=True` takes the study saved in `out`. Returns
    {name: result}. An interruption (`runner.Interrupted`) leaves `study.json`
    and the finished sweeps in place for `resume=True`.

    `confirm_seeds` re-runs each sweep's best setting (so the best of each
    algorithm) on that many fresh seeds (`run.confirm`), of any kind of
    sweep; seeds past the last stream are refused before any work
    (`check_confirmable`).

    `part=(K, N)` (or "K/N") computes only the K-th of N disjoint parts of every
    sweep's chunks into `out`, which N independent processes share (see
    `runner.run_to_dir`), and returns {}; a final `resume=True` run assembles."""
    if resume and overwrite:
        raise rundir.RunError("resume: --resume continues the study in --out, --overwrite starts over; give one")
    old = saved(out)
    check_searchable(study or old or Study(()), part)
    if part is not None:
        return _run_part(study, out, runner.parse_part(part), old, resume, overwrite, confirm_seeds, stop, log,
                         run_kwargs)
    study = _resolve(study, out, old, resume, confirm_seeds)
    writer = runner.is_writer()  # under jax.distributed, process 0 writes
    if writer:
        rundir.prepare_out_dir(out, overwrite, allow=lambda d: resume)
    status = {n: "pending" for n in study.names}

    def record():
        if writer:
            write_json(os.path.join(out, STUDY_FILE), {**study.to_dict(), "status": status})

    record()
    # Decided from the files before anything runs, so that every process of a
    # jax.distributed run decides alike while process 0 writes.
    finished = {n: resume and _finished(os.path.join(out, n), s) for n, s in study.sweeps}
    partial = {n: resume and rundir.ChunkStore(os.path.join(out, n)).exists() for n, _ in study.sweeps}
    confirmed = {n: os.path.isfile(os.path.join(out, n, confirm.CONFIRM_FILE)) for n in study.names}
    together = _together(study, finished, partial, run_kwargs)
    computed: dict = {}
    results = {}
    for name, spec in study.sweeps:
        path = os.path.join(out, name)
        if finished[name]:
            status[name] = "done"
            results[name] = kinds.load_result(path)
            log(f"{name}: finished earlier, not run again")
            if confirm_seeds and not confirmed[name]:
                confirm.report(results[name], path, confirm_seeds, lambda line: log(f"  {line}"))
            continue
        # A signal during the previous sweep stops the study, once every sweep
        # computed already (together with it) is written.
        if stop is not None and stop.signum is not None and name not in computed:
            raise runner.Interrupted(stop.signum)
        status[name] = "running"
        record()
        r = _compute(study, name, path, together, computed, writer, partial[name], stop, run_kwargs)
        log(_ran_line(name, spec, r.meta, together))
        if confirm_seeds:
            confirm.report(r, path, confirm_seeds, lambda line: log(f"  {line}"))
        status[name] = "done"
        record()
        results[name] = r
    return results


def _compute(study: Study, name: str, path: str, together: dict, computed: dict, writer: bool, partial: bool,
             stop, run_kwargs: dict):
    """Sweep `name`'s result, computed now: with the sweeps it shares a program
    with (`together`; the first of them computes them all into `computed`), or
    into its directory by `runner.run_to_dir` (resuming a `partial` one)."""
    spec = dict(study.sweeps)[name]
    if name not in together:
        return runner.run_to_dir(spec, path, overwrite=not partial, resume=partial, stop=stop, **run_kwargs)
    if name not in computed:
        names = together[name]
        computed.update(zip(names, kinds.of_spec(spec).front.run_many([dict(study.sweeps)[n] for n in names])))
    r = computed.pop(name)
    if writer:
        rundir.prepare_out_dir(path, True)
        r.save(path)
    return r


def _resolve(study: Study | None, out: str, old: Study | None, resume: bool, confirm_seeds) -> Study:
    """The study `run` runs: the one given, or (resuming, none given) the one
    saved in `out`; a resumed one must be the saved one."""
    if study is None:
        if not resume or old is None:
            raise rundir.RunError(f"resume: {out!r} holds no study (no study.json); give the study file")
        study = old
    if confirm_seeds:
        check_confirmable(study, confirm_seeds)
    if resume:
        if old is not None and old.to_dict() != study.to_dict():
            raise rundir.RunError(f"study: differs from the study in {out!r}; resume with the same file or "
                                  "start over with --overwrite")
        if old is None and os.path.isdir(out) and os.listdir(out):
            raise rundir.RunError(f"resume: {out!r} holds no study (no study.json) and is not empty")
    return study


def _ran_line(name: str, spec, m: dict, together: dict) -> str:
    """The log line of a sweep `run` finished: what it was and what it cost."""
    if name in together and name != together[name][0]:
        how = f"in {together[name][0]}'s program"
    else:
        how = f"in {m['run_time_s']:.2f} s (+ {m['compile_time_s']:.2f} s compile)"
    line = f"{name}: {_describe(spec)} {how}" + (f", {m['resumed_chunks']} chunks resumed"
                                                 if m.get("resumed_chunks") else "")
    if m.get("search"):  # its rungs and what it spent (`engine.search.line`)
        from bec_jax.engine import search
        line += f"; {search.line(m['search'])}"
    return line


def _describe(spec) -> str:
    """'boyan_chain / td, 6 points x 50 seeds x 2000 steps' (a control sweep:
    its task and episodes), read from the spec's dict."""
    d = spec.to_dict()
    length = f"{d['steps']} steps" if "steps" in d else f"{d['episodes']} episodes"
    return (f"{d.get('env', d.get('task'))} / {d['algorithm']}, {spec.num_points} points x {d['seeds']} seeds x "
            f"{length}")


def check_confirmable(study: Study, seeds) -> None:
    """Refuses `confirm_seeds` before any work where a sweep cannot take that
    many fresh seeds (`confirm.check`), in one line naming the sweep."""
    for name, spec in study.sweeps:
        try:
            confirm.check(spec, seeds)
        except ValueError as e:
            raise rundir.RunError(f"confirm_seeds: sweep {name!r}: {str(e).removeprefix('confirm_seeds: ')}") from None


def _together(study: Study, finished: dict, partial: dict, run_kwargs: dict) -> dict[str, list[str]]:
    """{name: the names of the sweeps it shares a program with} for the sweeps
    left to run that their front's `run_many` would run together (a front
    that has `shared_programs`): only in one process, with the default layout
    (no chunk size, devices or memory budget given) and never for a sweep an
    interrupted run left chunks of."""
    if jax.process_count() > 1 or {k for k, v in run_kwargs.items() if v is not None} - {"progress"}:
        return {}
    todo = [(n, s) for n, s in study.sweeps if not finished[n] and not partial[n]]
    by_front: dict = {}  # each front packs its own sweeps
    for n, s in todo:
        by_front.setdefault(kinds.of_spec(s).front, []).append((n, s))
    out = {}
    for front, sweeps in by_front.items():
        if not hasattr(front, "shared_programs"):
            continue
        for pack in front.shared_programs([s for _, s in sweeps]):
            if len(pack) > 1:
                names = [sweeps[i][0] for i in pack]
                out.update({n: names for n in names})
    return out


def _run_part(study, out, part, old, resume, overwrite, confirm_seeds, stop, log, run_kwargs) -> dict:
    k, n = part
    if resume or overwrite or confirm_seeds:
        raise rundir.RunError("chunks: a part only computes its share of the chunks; run it without --resume, "
                              "--overwrite and --confirm-seeds, and assemble with --resume when every part is done")
    if study is None:
        raise rundir.RunError("file: required (the study's TOML file) for a part")
    if old is not None and old.to_dict() != study.to_dict():
        raise rundir.RunError(f"study: differs from the study in {out!r}; every part must run the same file")
    # Another part may be creating the study right now: only entries no part
    # writes make the directory someone else's.
    ours = {STUDY_FILE, rundir.SUBMIT_DIR, *study.names}
    foreign = [e for e in (os.listdir(out) if os.path.isdir(out) else [])
               if e not in ours and not e.startswith(".")]  # temporary files start with "."
    if old is None and foreign:
        raise rundir.RunError(f"out: {out!r} is not empty and holds no study")
    rundir.prepare_out_dir(out, True)
    if old is None:  # the parts write the same content; each rename is atomic
        write_json(os.path.join(out, STUDY_FILE), {**study.to_dict(), "status": {x: "pending" for x in study.names}})
    for name, spec in study.sweeps:
        path = os.path.join(out, name)
        if _finished(path, spec):
            log(f"{name}: finished earlier")
            continue
        r = runner.run_to_dir(spec, path, part=part, stop=stop, **run_kwargs)
        log(f"{name}: part {k}/{n}: {r['chunks_done']} of {r['chunks_total']} chunks done")
    return {}
