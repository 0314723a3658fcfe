"""A run's output directory: the policy for using one (`check_out_dir`,
`prepare_out_dir`), the lock of the run that writes it (`lock_dir`,
`unlock_dir`; readers `check_not_writing`) and the one line that names a
damaged result file and how to get it back (`damaged`). Below the chunk store
(`run.rundir`) and the table of kinds (`run.kinds`), which both use it.
"""
from __future__ import annotations

import json
import os
from typing import Callable

from bec_jax.files import TMP_PREFIX

try:
    import fcntl
except ImportError:  # not POSIX: runs into one directory are not guarded
    fcntl = None

CHUNKS_DIR = "chunks"
MANIFEST_FILE = "manifest.json"
LOCK_FILE = ".bec-jax.lock"  # DIR/.bec-jax.lock: held (flock) by the run writing DIR
SUBMIT_DIR = "slurm"  # DIR/slurm/: a submission's job scripts, record and logs (`run.slurm`), beside its parts


class RunError(ValueError):
    """Bad input for a run (a directory that cannot be used, a resume that does
    not match): one line naming the field."""


def check_out_dir(out, overwrite: bool, allow: Callable[[str], bool] | None = None) -> None:
    """Refuses, without creating anything, an `out` that is not a path, exists as
    a file, or is a non-empty directory (unless `overwrite`, or `allow(out)` says
    the directory's contents may be reused)."""
    if not isinstance(out, str) or not out:
        raise RunError(f"out: expected a directory path, got {out!r}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise RunError(f"out: {out!r} exists and is not a directory")
    try:
        nonempty = os.path.isdir(out) and any(e != LOCK_FILE for e in os.listdir(out))  # a stale lock: no run's
    except OSError as e:
        raise RunError(f"out: cannot read {out!r} ({e.strerror})") from None
    if nonempty and not overwrite and not (allow is not None and allow(out)):
        raise RunError(f"out: {out!r} already exists and is not empty; choose another "
                       "directory or pass --overwrite")


_PROBE = ".bec-jax-write-test-"  # a part's brief write probe (see prepare_out_dir)


def entries(out: str) -> list[str]:
    """What `out` holds, less other parts' write probes of this very moment, the
    lock file of a run (`lock_dir`: a stale one is reused, a held one refuses) and a submission's files."""
    return [e for e in os.listdir(out) if not e.startswith(_PROBE) and e not in (LOCK_FILE, SUBMIT_DIR)]


_HELD: dict[str, int] = {}  # abspath of an output directory -> the descriptor whose flock this process holds


def lock_dir(out: str) -> None:
    """Takes this process's exclusive lock on the output directory `out` for a
    run (`flock` on `out/.bec-jax.lock`, which the kernel releases when the
    process dies): a second run into `out` gets `RunError`. Leftover temporary
    files of an earlier run's writes at `out`'s top level are removed."""
    key = os.path.abspath(out)
    if fcntl is None or key in _HELD:
        return
    path = os.path.join(key, LOCK_FILE)
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR | getattr(os, "O_NOFOLLOW", 0), 0o666)
        except OSError as e:
            raise RunError(f"out: cannot open the lock file {path!r} ({e.strerror}); remove what is there") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunError(f"out: another bec-jax run is writing to {out!r} (it holds {path!r}); wait for it to "
                           "finish or choose another directory") from None
        except OSError:  # a file system without flock: unguarded, as before
            os.close(fd)
            return
        try:
            st, mine = os.stat(path), os.fstat(fd)
            if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the run that held it removed the file meanwhile: lock the new one
    _HELD[key] = fd
    remove_temporary(key)


def check_not_writing(out: str, field: str = "dirs") -> None:
    """`RunError` naming `field` while another process holds `lock_dir`'s lock
    on `out` (a run writing it: its files are about to change), for readers.
    The lock file is opened read-only and never made: a reader writes nothing."""
    key = os.path.abspath(out)
    if fcntl is None or key in _HELD:
        return
    path = os.path.join(key, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return  # no lock file: no run
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunError(f"{field}: a bec-jax run is writing to {out!r} (it holds {path!r}); wait for it to finish, "
                       "then read it") from None
    except OSError:
        pass  # a file system without flock: unguarded, as runs are
    finally:
        os.close(fd)


def unlock_dir(out: str) -> None:
    """Releases `lock_dir`'s lock (if this process holds it), once leftover
    temporary files at `out`'s top level are removed; removes the lock file."""
    fd = _HELD.pop(os.path.abspath(out), None)
    if fd is None:
        return
    try:
        remove_temporary(out)
        os.unlink(os.path.join(out, LOCK_FILE))
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_temporary(d: str) -> None:
    """Removes the temporary files (`files.TMP_PREFIX`) of writes cut short in
    `d`: called only while no other process writes there."""
    try:
        names = os.listdir(d)
    except OSError:
        return
    for name in names:
        path = os.path.join(d, name)
        if name.startswith(TMP_PREFIX) and os.path.isfile(path) and not os.path.islink(path):
            try:
                os.unlink(path)
            except OSError:
                pass


def prepare_out_dir(out: str, overwrite: bool, allow: Callable[[str], bool] | None = None) -> None:
    """Refuses an existing non-empty directory (unless `overwrite`, or `allow(out)`)
    and one that cannot be written, before any work starts; creates it."""
    check_out_dir(out, overwrite, allow)
    try:
        os.makedirs(out, exist_ok=True)
        # Per process: --chunks parts may probe the same directory at once.
        probe = os.path.join(out, f"{_PROBE}{os.getpid()}")
        with open(probe, "w") as f:
            f.write("")
        os.unlink(probe)
    except OSError as e:
        raise RunError(f"out: cannot write to {out!r} ({e.strerror})") from None


def _resume_command(out_dir: str) -> str:
    """`bec-jax run|control|continuing --out DIR --resume` for the chunk store in `out_dir`."""
    import shlex
    try:
        with open(os.path.join(out_dir, CHUNKS_DIR, MANIFEST_FILE)) as f:
            kind = json.load(f)["spec"].get("kind")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        kind = None
    command = kind if kind in ("control", "continuing") else "run"
    return f"bec-jax {command} --out {shlex.quote(out_dir)} --resume"


def damaged(out_dir: str, path: str, why: str, field: str = "dirs") -> RunError:
    """The one-line error for a run in `out_dir` whose saved result file
    `path` cannot be read (`files.result_problem`), naming `field`, the file
    and how to get the results back: `--resume` where the run's chunks are
    still there, else running the sweep again (a study's sweep: the study
    with --resume, once the damaged file is moved away)."""
    import shlex
    if os.path.isfile(os.path.join(out_dir, CHUNKS_DIR, MANIFEST_FILE)):  # the chunk store's manifest
        todo = f"the run's chunks are still in {os.path.join(out_dir, CHUNKS_DIR)!r}: {_resume_command(out_dir)} " \
               "writes the results again"
    elif os.path.isfile(os.path.join(os.path.dirname(os.path.abspath(out_dir)), "study.json")):
        study = os.path.dirname(os.path.normpath(out_dir)) or "."
        todo = (f"its chunks are gone: move {path!r} away, then bec-jax study --out {shlex.quote(study)} --resume "
                "computes that sweep again")
    else:
        spec = "" if os.path.basename(path) == "meta.json" else " (its spec is in meta.json)"
        todo = (f"its chunks are gone (removed once the results were written): run the sweep again{spec}, into "
                "another directory or with --overwrite")
    return RunError(f"{field}: {path!r} is damaged ({why}); {todo}")


__all__ = ["CHUNKS_DIR", "LOCK_FILE", "MANIFEST_FILE", "SUBMIT_DIR", "RunError", "check_not_writing",
           "check_out_dir", "damaged", "entries", "lock_dir", "prepare_out_dir", "remove_temporary", "unlock_dir"]
