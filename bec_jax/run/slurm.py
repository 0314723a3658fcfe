"""Slurm: a run submitted as a job array of `--chunks K/N` parts and an
assembling job, and the state of a run's parts.

`submit` writes two job scripts into `DIR/slurm/` and submits them with
`sbatch` (the Slurm client, no Python dependency): `parts.sh`, an array of N
tasks each running the command given with `--chunks ${SLURM_ARRAY_TASK_ID}/N`,
and `assemble.sh`, the command's `--resume` run, held with
`--dependency=afterok` until every part has succeeded. The scripts are plain
`#SBATCH` files, readable and submittable again by hand; `submission.json`
records the job ids. `status` reads what a run's parts have saved (its chunk
stores) and asks `squeue` which parts are pending or running:

    rec = slurm.submit("runs/big", ["run", "--config", "sweep.toml", "--out", "runs/big"],
                       ["run", "--out", "runs/big", "--resume"], parts=4, options=[("time", "01:00:00")])
    print(slurm.status_text(slurm.status("runs/big")))
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from typing import NamedTuple

from bec_jax.files import CURVES_FILE, write_json
from bec_jax.run import rundir

SUBMIT_DIR = rundir.SUBMIT_DIR
RECORD_FILE = "submission.json"
PARTS_SCRIPT, ASSEMBLE_SCRIPT = "parts.sh", "assemble.sh"
ASSEMBLE_LOG = "assemble.log"
STUDY_FILE = "study.json"
# Options the scripts set themselves: a --slurm-option may not change them.
OWN_OPTIONS = ("array", "output", "error", "chdir", "dependency", "parsable", "wrap", "input")
_KEY = re.compile(r"^[a-z][a-z0-9-]*$")
_CHUNK_FILE = re.compile(r"^chunk_(\d{5,})\.npz$")
_ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STAGE_OUT"}
SBATCH_TIMEOUT_S = 60.0


class SubmitError(ValueError):
    """A submission that cannot be made: one line naming the field."""


def parse_option(text: str) -> tuple[str, str | None]:
    """`--slurm-option`'s "KEY=VALUE" (or a bare "KEY" flag such as "exclusive")
    -> (key, value); `SubmitError` naming `slurm_option` for a malformed one or one
    the scripts set themselves."""
    key, eq, value = str(text).partition("=")
    key = key.strip().lstrip("-")
    if not _KEY.match(key) or "\n" in value or (eq and not value):
        raise SubmitError(f"slurm_option: expected KEY=VALUE with an sbatch option's long name, e.g. time=01:00:00 "
                          f"or partition=gpu (or a bare flag such as exclusive), got {text!r}")
    if key in OWN_OPTIONS:
        raise SubmitError(f"slurm_option: {key} is set by the submission itself (one of {', '.join(OWN_OPTIONS)})")
    return key, value if eq else None


def _directives(options) -> list[str]:
    return [f"#SBATCH --{k}" + ("" if v is None else f"={v}") for k, v in options]


def scripts(out: str, command: list[str], assemble: list[str], parts: int, options=(), *,
            python: str | None = None, cwd: str | None = None) -> tuple[str, str]:
    """The text of `parts.sh` (an array of `parts` tasks, each running
    `bec-jax COMMAND --chunks K/N`) and of `assemble.sh` (`bec-jax ASSEMBLE`), each
    with `options` ((key, value) pairs) as `#SBATCH` lines, logging into
    `out/slurm/`, and running in `cwd` (default: here) with `python` (default:
    this interpreter, so the jobs use this environment's bec_jax)."""
    python = python or sys.executable
    cwd = os.path.abspath(cwd or os.getcwd())
    logs = os.path.join(os.path.abspath(out), SUBMIT_DIR)
    name = "bec-jax-" + os.path.basename(os.path.normpath(os.path.abspath(out)))
    head = ["#!/bin/bash", f"#SBATCH --chdir={cwd}"]
    user_name = any(k == "job-name" for k, _ in options)
    run = lambda argv: "exec " + shlex.join([python, "-m", "bec_jax", *argv])  # noqa: E731
    part = head + ([] if user_name else [f"#SBATCH --job-name={name}"]) + [
        f"#SBATCH --array=1-{parts}", f"#SBATCH --output={logs}/part-%a.log", *_directives(options),
        run(command) + f" --chunks ${{SLURM_ARRAY_TASK_ID}}/{parts}"]
    last = head + ([] if user_name else [f"#SBATCH --job-name={name}-assemble"]) + [
        f"#SBATCH --output={logs}/{ASSEMBLE_LOG}", *_directives(options), run(assemble)]
    return "\n".join(part) + "\n", "\n".join(last) + "\n"


def _sbatch(args: list[str]) -> str:
    """The job id `sbatch --parsable ARGS` prints; `SubmitError` with sbatch's own message."""
    try:
        p = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SubmitError(f"submit: sbatch did not answer within {SBATCH_TIMEOUT_S:.0f} s") from None
    if p.returncode != 0:
        msg = (p.stderr or p.stdout).strip().splitlines()
        raise SubmitError(f"submit: sbatch refused the job: {msg[-1] if msg else f'exit status {p.returncode}'}")
    return p.stdout.strip().split(";")[0]


def check_can_submit() -> None:
    """`SubmitError` naming `submit` where no Slurm client is on PATH."""
    for tool in ("sbatch", "squeue"):
        if shutil.which(tool) is None:
            raise SubmitError(f"submit: {tool} not found; --submit slurm needs a Slurm cluster's client commands "
                              "(sbatch, squeue) on PATH (on a login node, say)")


def submit(out: str, command: list[str], assemble: list[str], parts: int, options=(), kind: str = "run",
           again: list[str] | None = None) -> dict:
    """Writes `out/slurm/parts.sh` and `assemble.sh` (`scripts`), submits the
    array and then the assembling job after it (`--dependency=afterok`), and
    records both in `out/slurm/submission.json` (with `again`, the `bec-jax`
    arguments that submit it all again); returns that record. Where the second
    submission fails, the array is cancelled (no part runs unassembled)."""
    if not isinstance(parts, int) or isinstance(parts, bool) or parts < 1:
        raise SubmitError(f"parts: expected a positive integer, got {parts!r}")
    check_can_submit()
    _retire(out)
    d = os.path.abspath(os.path.join(out, SUBMIT_DIR))
    os.makedirs(d, exist_ok=True)
    part_text, last_text = scripts(out, command, assemble, parts, options)
    paths = {name: os.path.join(d, name) for name in (PARTS_SCRIPT, ASSEMBLE_SCRIPT)}
    for name, text in ((PARTS_SCRIPT, part_text), (ASSEMBLE_SCRIPT, last_text)):
        with open(paths[name], "w") as f:
            f.write(text)
        os.chmod(paths[name], 0o755)
    array = _sbatch([paths[PARTS_SCRIPT]])
    try:
        last = _sbatch([f"--dependency=afterok:{array}", paths[ASSEMBLE_SCRIPT]])
    except SubmitError:
        subprocess.run(["scancel", array], capture_output=True, timeout=SBATCH_TIMEOUT_S)
        raise
    rec = {"kind": kind, "parts": parts, "array_job": array, "assemble_job": last, "command": command,
           "assemble": assemble, "options": [list(o) for o in options], "again": again,
           "submitted": time.time()}
    write_json(os.path.join(d, RECORD_FILE), rec)
    return rec


def _retire(out: str) -> None:
    """Before a submission into `out` again: `SubmitError` while the earlier
    one's parts are pending or running (two parts would compute the same
    chunks), and its assembling job cancelled (after a failed part it waits forever)."""
    rec = read_record(out)
    queue = query_squeue([rec["array_job"], rec["assemble_job"]]) if rec else None
    if not queue:
        return
    active = [k for k, (state, _) in queue.items() if k != rec["assemble_job"] and state in _ACTIVE]
    if active:
        raise SubmitError(f"submit: the earlier submission into {out!r} still has {len(active)} parts pending or "
                          f"running (job array {rec['array_job']}); wait for them (bec-jax status) or scancel "
                          f"{rec['array_job']}")
    if rec["assemble_job"] in queue:
        subprocess.run(["scancel", rec["assemble_job"]], capture_output=True, timeout=SBATCH_TIMEOUT_S)


# ------------------------------------------------------------------ status

class Sweep(NamedTuple):
    """What one sweep directory holds: `finished` (its curves.npz), the number
    of chunks its manifest plans (None: no part has started it) and the indices
    of the chunk files saved."""

    path: str
    finished: bool
    num_chunks: int | None
    saved: frozenset


class Part(NamedTuple):
    """One part: its number K, its state (done, pending, running, failed,
    missing, or a Slurm state), its chunks saved of those it owns (None: not
    known yet), and a note (a failed part's last log line)."""

    k: int
    state: str
    saved: int | None
    owned: int | None
    note: str = ""


class Status(NamedTuple):
    """The state of a run directory's parts: its sweeps, the parts (empty
    when the number of parts is not known), the assembling job's state, the
    submission record (None: none) and what `squeue` said (None: no squeue)."""

    out: str
    sweeps: tuple
    parts: tuple
    assembling: str
    record: dict | None
    squeue: dict | None


def read_sweep(path: str) -> Sweep:
    """`Sweep` of a sweep's directory: its manifest and chunk files as they are
    on disk (names only: nothing is loaded or verified)."""
    finished = os.path.isfile(os.path.join(path, CURVES_FILE))
    store = os.path.join(path, rundir.CHUNKS_DIR)
    total = None
    try:
        with open(os.path.join(store, rundir.MANIFEST_FILE)) as f:
            total = int(json.load(f)["num_chunks"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        names = os.listdir(store)
    except OSError:
        names = []
    saved = frozenset(int(m.group(1)) for m in map(_CHUNK_FILE.match, names) if m)
    return Sweep(path, finished, total, saved)


def sweeps_of(out: str) -> tuple:
    """The `Sweep`s of a run directory (one) or a study directory (one per
    sweep, from study.json); `SubmitError` naming `dir` when `out` holds neither."""
    study = os.path.join(out, STUDY_FILE)
    if os.path.isfile(study):
        try:
            with open(study) as f:
                names = [s["name"] for s in json.load(f)["sweeps"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SubmitError(f"dir: cannot read {study!r} ({e})") from None
        return tuple(read_sweep(os.path.join(out, n)) for n in names)
    one = read_sweep(out)
    if not one.finished and one.num_chunks is None and not os.path.isdir(os.path.join(out, SUBMIT_DIR)):
        raise SubmitError(f"dir: {out!r} holds no run, study or submission (no curves.npz, chunks/manifest.json, "
                          "study.json or slurm/)")
    return (one,)


def _owned(sweeps, k: int, n: int) -> tuple[int | None, int | None]:
    """(saved, owned) chunks of part K of N over every sweep; (None, None) while
    some unfinished sweep has no manifest yet."""
    saved = owned = 0
    for s in sweeps:
        if s.finished:
            continue
        if s.num_chunks is None:
            return None, None
        mine = {i for i in range(s.num_chunks) if i % n == k - 1}
        owned += len(mine)
        saved += len(mine & s.saved)
    return saved, owned


def query_squeue(jobs: list[str]) -> dict | None:
    """{job or "ARRAY_K": (state, reason)} of the given jobs that Slurm still
    lists (array tasks one by one); None where squeue is missing or fails."""
    if shutil.which("squeue") is None or not jobs:
        return None
    try:
        p = subprocess.run(["squeue", "-h", "-r", "-j", ",".join(jobs), "-o", "%F|%K|%T|%r"], capture_output=True,
                           text=True, timeout=SBATCH_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:  # a job id Slurm has forgotten makes squeue fail: ask one by one
        if len(jobs) > 1:
            out = {}
            for j in jobs:
                one = query_squeue([j])
                if one is None:
                    return None
                out.update(one)
            return out
        return {} if "Invalid job id" in p.stderr else None
    out = {}
    for line in p.stdout.splitlines():
        job, task, state, reason = (line.split("|") + ["", "", "", ""])[:4]
        key = f"{job}_{task}" if task not in ("", "N/A") else job
        out[key] = (state, reason)
    return out


def _last_line(path: str) -> str | None:
    """The last non-empty line of a log (None: no log)."""
    try:
        with open(path, errors="replace") as f:
            lines = [x.strip() for x in f.read()[-8192:].splitlines() if x.strip()]
    except OSError:
        return None
    return lines[-1] if lines else ""


def _part(out, sweeps, k: int, n: int, rec: dict | None, queue: dict | None) -> Part:
    saved, owned = _owned(sweeps, k, n)
    if queue is not None and rec is not None:
        state = queue.get(f"{rec['array_job']}_{k}")
        if state is not None and state[0] in _ACTIVE:
            return Part(k, state[0].lower(), saved, owned)
    if owned is not None and saved == owned:
        return Part(k, "done", saved, owned)
    last = _last_line(os.path.join(out, SUBMIT_DIR, f"part-{k}.log"))
    if last is not None:
        return Part(k, "failed", saved, owned, last)
    return Part(k, "missing", saved, owned)


def _assembling(out, sweeps, rec: dict | None, queue: dict | None) -> str:
    if all(s.finished for s in sweeps):
        return "done"
    if rec is None:
        return "not submitted"
    state = (queue or {}).get(rec["assemble_job"])
    if state is not None and state[0] in _ACTIVE:
        never = "never" in state[1].lower()
        return state[0].lower() + (": a part failed, so it never runs (resubmit, see below)" if never else
                                   " (until every part has succeeded)" if state[0] == "PENDING" else "")
    last = _last_line(os.path.join(out, SUBMIT_DIR, ASSEMBLE_LOG))
    if last is not None:
        return f"failed: {last}"
    return "not run (cancelled, or Slurm has forgotten it: a part failed?)" if queue is not None else "unknown"


def read_record(out: str) -> dict | None:
    """The submission record of `out` (`submit`), or None."""
    try:
        with open(os.path.join(out, SUBMIT_DIR, RECORD_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def status(out: str, parts: int | None = None) -> Status:
    """The `Status` of the run or study in `out`: each part's state from its
    chunk files, `squeue` and its log (`parts`: the number of parts, default the
    submission's; None and no submission: no parts, the chunks alone)."""
    if not os.path.isdir(out):
        raise SubmitError(f"dir: {out!r} is not a directory")
    if parts is not None and (not isinstance(parts, int) or parts < 1):
        raise SubmitError(f"parts: expected a positive integer, got {parts!r}")
    sweeps = sweeps_of(out)
    rec = read_record(out)
    n = parts or (rec or {}).get("parts")
    queue = query_squeue([rec["array_job"], rec["assemble_job"]]) if rec else None
    got = tuple(_part(out, sweeps, k, n, rec, queue) for k in range(1, n + 1)) if n else ()
    return Status(out, sweeps, got, _assembling(out, sweeps, rec, queue), rec, queue)


def resubmit_hint(st: Status) -> str | None:
    """How to run the failed and missing parts again (submit the same command
    again: the parts keep the chunks they saved), or None when none is to run
    again or the assembling job is still to come."""
    again = [p.k for p in st.parts if p.state in ("failed", "missing")]
    if not again or st.record is None or st.assembling.startswith("pending ("):
        return None
    if st.record.get("again"):
        return (f"to finish: bec-jax {shlex.join(st.record['again'])}   (the same submission again: each part keeps "
                "the chunks it saved)")
    d = os.path.join(st.out, SUBMIT_DIR)
    return (f"to finish: sbatch --array={','.join(map(str, again))} {shlex.quote(d + '/' + PARTS_SCRIPT)}, then "
            f"sbatch --dependency=afterok:<that job's id> {shlex.quote(d + '/' + ASSEMBLE_SCRIPT)}")


def status_text(st: Status) -> str:
    """`bec-jax status`'s report of a `Status`, a line per part."""
    total = sum(s.num_chunks or 0 for s in st.sweeps if not s.finished)
    saved = sum(len(s.saved) for s in st.sweeps if not s.finished)
    what = f"a study of {len(st.sweeps)} sweeps" if len(st.sweeps) > 1 else "a sweep"
    done = sum(s.finished for s in st.sweeps)
    head = f"{st.out}: {what}"
    if st.record is not None:
        head += (f" submitted in {st.record['parts']} parts (job array {st.record['array_job']}, assembling job "
                 f"{st.record['assemble_job']})")
    if done == len(st.sweeps):
        lines = [head, "finished: every sweep's results are assembled"]
    else:
        waiting = sum(not s.finished and s.num_chunks is None for s in st.sweeps)
        lines = [head, f"chunks saved: {saved} of {total}" + (f"; sweeps finished: {done} of {len(st.sweeps)}"
                                                              if done else "")
                 + (f"; {waiting} of {len(st.sweeps)} sweeps not started by any part" if waiting else "")]
    for p in st.parts:
        count = "" if not p.owned else f" ({p.saved} of {p.owned} chunks)"
        lines.append(f"part {p.k}: {p.state}{count}" + (f": {p.note}" if p.note else ""))
    lines.append(f"assembling: {st.assembling}")
    if st.squeue is None and st.record is not None:
        lines.append("(squeue gave no answer: the states come from the files alone)")
    hint = resubmit_hint(st)
    if hint:
        lines.append(hint)
    return "\n".join(lines)


def status_dict(st: Status) -> dict:
    """A `Status` as JSON-ready data (`bec-jax status --json`)."""
    return {"out": st.out, "assembling": st.assembling, "record": st.record,
            "sweeps": [{"path": s.path, "finished": s.finished, "num_chunks": s.num_chunks,
                        "saved": sorted(s.saved)} for s in st.sweeps],
            "parts": [p._asdict() for p in st.parts]}
