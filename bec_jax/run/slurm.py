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

import collections
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import unicodedata
from typing import NamedTuple

from bec_jax.files import CURVES_FILE, result_problem, write_json
from bec_jax.run import rundir

SUBMIT_DIR = rundir.SUBMIT_DIR
RECORD_FILE = "submission.json"
PARTS_SCRIPT, ASSEMBLE_SCRIPT = "parts.sh", "assemble.sh"
ASSEMBLE_LOG = "assemble.log"
STUDY_FILE = "study.json"
# Options the scripts set themselves: a --slurm-option may not change them
# (workdir: chdir's name in older Slurm).
OWN_OPTIONS = ("array", "output", "error", "chdir", "workdir", "dependency", "parsable", "wrap", "input")
# Options that change what sbatch itself does (block, submit nothing, print
# something else than the job id): the submission reads the job id it prints.
SBATCH_ONLY = ("wait", "test-only", "help", "usage", "version")
_KEY = re.compile(r"^[a-z][a-z0-9-]*$")
# A value written into an #SBATCH line as it is; any other is quoted (sbatch
# groups a "..." argument and takes \\ and \" in it as \ and ").
_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./~^-]+$")
_ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STAGE_OUT"}
SBATCH_TIMEOUT_S = 60.0
# The most parts of a submission: a job array of more tasks is beyond what
# Slurm's MaxArraySize allows on most clusters, and a part owns a chunk or more.
MAX_PARTS = 100_000


class SubmitError(ValueError):
    """A submission that cannot be made: one line naming the field."""


def check_parts(parts, field: str = "parts") -> int:
    """`parts` if it is an integer in [1, MAX_PARTS]; `SubmitError` naming
    `field` otherwise."""
    if not isinstance(parts, int) or isinstance(parts, bool) or not 1 <= parts <= MAX_PARTS:
        raise SubmitError(f"{field}: expected an integer from 1 to {MAX_PARTS} (the parts of a Slurm job array), "
                          f"got {parts!r}")
    return parts


def has_control(text: str) -> bool:
    """Whether `text` holds a newline or another control character (or a
    Unicode line or paragraph separator): a job script cannot carry one in an
    `#SBATCH` line or a command."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)


def _reserved(key: str) -> str | None:
    """The option of the submission's own (or sbatch's own) that `key` names
    for sbatch, or None: sbatch takes any unambiguous prefix of a long option
    (`outp` is --output, `dep` --dependency), and refuses an ambiguous one."""
    for name in OWN_OPTIONS + SBATCH_ONLY:
        if name.startswith(key):
            return name
    return None


def check_option(key: str, value: str | None, text=None) -> tuple[str, str | None]:
    """(key, value) of an `#SBATCH --KEY[=VALUE]` line, checked: `SubmitError`
    naming `slurm_option` for a malformed key, a value with a control
    character, or a key that sbatch would read as one of the options the
    submission sets itself (its prefixes included) or as one that changes
    what sbatch itself does."""
    text = f"{key}={value}" if text is None and value is not None else key if text is None else text
    if not isinstance(key, str) or not _KEY.match(key) or (value is not None and (
            not isinstance(value, str) or not value or has_control(value))):
        raise SubmitError(f"slurm_option: expected KEY=VALUE with an sbatch option's long name, e.g. time=01:00:00 "
                          f"or partition=gpu (or a bare flag such as exclusive), and a value without a newline or "
                          f"other control character, got {text!r}")
    name = _reserved(key)
    if name is not None:
        means = f"{key} abbreviates {name} for sbatch (it takes any unambiguous prefix), and {name}" \
            if name != key else key
        if name in SBATCH_ONLY:
            raise SubmitError(f"slurm_option: {means} changes what sbatch itself does (one of "
                              f"{', '.join(SBATCH_ONLY)}); the submission needs it to print the job id and return")
        raise SubmitError(f"slurm_option: {means} is set by the submission itself (one of {', '.join(OWN_OPTIONS)})")
    return key, value


def parse_option(text: str) -> tuple[str, str | None]:
    """`--slurm-option`'s "KEY=VALUE" (or a bare "KEY" flag such as "exclusive")
    -> (key, value); `SubmitError` naming `slurm_option` for a malformed one or one
    the scripts set themselves (`check_option`)."""
    key, eq, value = str(text).partition("=")
    key = key.strip().lstrip("-")
    return check_option(key, value if eq else None, str(text))


def _quoted(value: str) -> str:
    """`value` as one argument of an `#SBATCH` line: as it is where it is
    plain, else in double quotes with its backslashes and quotes escaped (a
    space, a quote or a `#` would otherwise end it, or start a comment)."""
    if _PLAIN.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _directive(key: str, value: str | None = None) -> str:
    return f"#SBATCH --{key}" + ("" if value is None else f"={_quoted(value)}")


def _directives(options) -> list[str]:
    return [_directive(*check_option(k, v)) for k, v in options]


def _check_text(field: str, what: str, text: str, fix: str) -> None:
    """`SubmitError` naming `field` where `text` (written into the scripts) holds a control character."""
    if has_control(text):
        raise SubmitError(f"{field}: {what} {text!r} holds a newline or another control character, which a job "
                          f"script cannot carry; {fix}")


def scripts(out: str, command: list[str], assemble: list[str], parts: int, options=(), *,
            python: str | None = None, cwd: str | None = None) -> tuple[str, str]:
    """The text of `parts.sh` (an array of `parts` tasks, each running
    `bec-jax COMMAND --chunks K/N`) and of `assemble.sh` (`bec-jax ASSEMBLE`), each
    with `options` ((key, value) pairs) as `#SBATCH` lines, logging into
    `out/slurm/`, and running in `cwd` (default: here) with `python` (default:
    this interpreter, so the jobs use this environment's bec_jax)."""
    python = python or sys.executable
    _check_text("out", "the directory", str(out), "choose another --out")
    if "\\" in str(out):  # Slurm reads a backslash in --output as "no %a": every part would share one log
        raise SubmitError(f"out: the directory {out!r} holds a backslash, which turns off Slurm's %a in the parts' log names; "
                          "choose another --out")
    cwd = os.path.abspath(cwd or os.getcwd())
    _check_text("submit", "the current directory", cwd, "submit from another directory")
    _check_text("submit", "the Python interpreter", python, "run bec-jax with an interpreter of another path")
    for tok in [*command, *assemble]:
        _check_text("arguments", "the argument", str(tok), "leave it out of the command")
    logs = os.path.join(os.path.abspath(out), SUBMIT_DIR).replace("%", "%%")  # %% is Slurm's own "%"
    name = "bec-jax-" + os.path.basename(os.path.normpath(os.path.abspath(out)))
    head = ["#!/bin/bash", _directive("chdir", cwd)]
    user_name = any(k == "job-name" for k, _ in options)
    run = lambda argv: "exec " + shlex.join([python, "-m", "bec_jax", *argv])  # noqa: E731
    part = head + ([] if user_name else [_directive("job-name", name)]) + [
        f"#SBATCH --array=1-{check_parts(parts)}", _directive("output", f"{logs}/part-%a.log"),
        *_directives(options), run(command) + f" --chunks ${{SLURM_ARRAY_TASK_ID}}/{parts}"]
    last = head + ([] if user_name else [_directive("job-name", f"{name}-assemble")]) + [
        _directive("output", f"{logs}/{ASSEMBLE_LOG}"), *_directives(options), run(assemble)]
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
    part_text, last_text = scripts(out, command, assemble, parts, options)  # every value checked, nothing made
    check_can_submit()
    _retire(out)
    d = os.path.abspath(os.path.join(out, SUBMIT_DIR))
    os.makedirs(d, exist_ok=True)
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
    chunks), and its assembling job cancelled (after a failed part it waits forever).
    A record that cannot be read is replaced (`bec-jax status` says to submit again)."""
    rec = read_record(out, strict=False)
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
    """`Sweep` of a sweep's directory: its manifest and the chunk files a
    `--resume` would use (`rundir.ChunkStore.usable_chunks`: each read and
    checked, none loaded for a run or set aside). A results file that cannot
    be read is `rundir.damaged`'s one line, naming it and the way back."""
    if os.path.isfile(os.path.join(path, CURVES_FILE)):
        found = result_problem(path)
        if found is not None:
            raise rundir.damaged(path, *found, field="dir")
        return Sweep(path, True, None, frozenset())
    store = rundir.ChunkStore(path)
    total = None
    try:
        with open(store.manifest_path) as f:
            total = json.load(f)["num_chunks"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        total = None  # as a resume would, which refuses such a manifest
    saved = store.usable_chunks(total) if total else frozenset()
    return Sweep(path, False, total, saved)


def sweeps_of(out: str) -> tuple:
    """The `Sweep`s of a run directory (one) or a study directory (one per
    sweep, from study.json); `SubmitError` naming `dir` when `out` holds neither."""
    study = os.path.join(out, STUDY_FILE)
    if os.path.isfile(study):
        try:
            with open(study) as f:
                names = [s["name"] for s in json.load(f)["sweeps"]]
            bad = [n for n in names if not isinstance(n, str) or n in ("", ".", "..") or "/" in n or os.sep in n]
            if bad:
                raise ValueError(f"a sweep's name is not a directory's name: {bad[0]!r}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SubmitError(f"dir: cannot read {study!r} ({e})") from None
        return tuple(read_sweep(os.path.join(out, n)) for n in names)
    one = read_sweep(out)
    if not one.finished and one.num_chunks is None and not os.path.isdir(os.path.join(out, SUBMIT_DIR)):
        raise SubmitError(f"dir: {out!r} holds no run, study or submission (no curves.npz, chunks/manifest.json, "
                          "study.json or slurm/)")
    return (one,)


def _tallies(sweeps, n: int) -> list | None:
    """[(chunks, {r: saved chunks i with i % n == r})] of every unfinished
    sweep, or None while one of them has no manifest yet: each part's count
    in O(1), however many parts and chunks there are."""
    out = []
    for s in sweeps:
        if s.finished:
            continue
        if s.num_chunks is None:
            return None
        out.append((s.num_chunks, collections.Counter(i % n for i in s.saved)))
    return out


def _owned(tallies: list | None, k: int, n: int) -> tuple[int | None, int | None]:
    """(saved, owned) chunks of part K of N over every sweep (`_tallies`); (None,
    None) while some unfinished sweep has no manifest yet."""
    if tallies is None:
        return None, None
    # Part K owns the chunks i < C with i % N == K - 1: ceil((C - K + 1) / N) of them.
    owned = sum(max(0, (c - k + n) // n) for c, _ in tallies)
    return sum(t[k - 1] for _, t in tallies), owned


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
    """The last non-empty line of a log (None: no log), from its last 8 kB,
    with any control character left in it escaped (a terminal's escape
    sequence in a log is printed as text, not obeyed)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    last = lines[-1] if lines else ""
    return "".join(c.encode("unicode_escape").decode() if has_control(c) else c for c in last)


def _part(out, tallies, k: int, n: int, rec: dict | None, queue: dict | None, logs: set) -> Part:
    saved, owned = _owned(tallies, k, n)
    if queue is not None and rec is not None:
        state = queue.get(f"{rec['array_job']}_{k}")
        if state is not None and state[0] in _ACTIVE:
            return Part(k, state[0].lower(), saved, owned)
    if owned is not None and saved == owned:
        return Part(k, "done", saved, owned)
    last = _last_line(os.path.join(out, SUBMIT_DIR, f"part-{k}.log")) if f"part-{k}.log" in logs else None
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


def _record_problem(rec) -> str | None:
    """Why a submission record read back cannot be used, or None."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    try:
        check_parts(rec.get("parts"))
    except SubmitError as e:
        return str(e)
    for key in ("array_job", "assemble_job"):
        if not isinstance(rec.get(key), str) or not rec[key].isdigit():
            return f"{key}: expected a Slurm job id, got {rec.get(key)!r}"
    again = rec.get("again")
    if again is not None and (not isinstance(again, list) or not all(isinstance(a, str) for a in again)):
        return f"again: expected the submission's arguments, got {again!r}"
    return None


def read_record(out: str, strict: bool = True) -> dict | None:
    """The submission record of `out` (`submit`), or None where there is none.
    One that cannot be read or holds bad values (parts that are not an integer
    from 1 to MAX_PARTS, say) is `SubmitError` naming the file and what to do
    (`strict`), or None."""
    path = os.path.join(out, SUBMIT_DIR, RECORD_FILE)
    try:
        with open(path) as f:
            rec = json.load(f)
        why = _record_problem(rec)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # unreadable, truncated: not JSON
        why = f"{type(e).__name__}: {e}"
    if why is None:
        return rec
    if not strict:
        return None
    raise SubmitError(f"dir: {path!r} is damaged ({why}); submit the same command again (each part keeps the "
                      "chunks it saved), or move the file away and give --parts N to see the chunks alone")


def status(out: str, parts: int | None = None) -> Status:
    """The `Status` of the run or study in `out`: each part's state from its
    chunk files, `squeue` and its log (`parts`: the number of parts, default the
    submission's; None and no submission: no parts, the chunks alone)."""
    if not os.path.isdir(out):
        raise SubmitError(f"dir: {out!r} is not a directory")
    if parts is not None:
        check_parts(parts)
    sweeps = sweeps_of(out)
    rec = read_record(out)
    n = parts or (rec or {}).get("parts")
    queue = query_squeue([rec["array_job"], rec["assemble_job"]]) if rec else None
    try:
        logs = set(os.listdir(os.path.join(out, SUBMIT_DIR)))
    except OSError:
        logs = set()
    tallies = _tallies(sweeps, n) if n else None
    got = tuple(_part(out, tallies, k, n, rec, queue, logs) for k in range(1, n + 1)) if n else ()
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
