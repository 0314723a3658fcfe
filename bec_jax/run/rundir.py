"""The run directory: the output-directory policy (`check_out_dir`,
`prepare_out_dir`), the spec a saved dict describes (`spec_from_dict`) and the
chunk store (`ChunkStore`: finished chunks, a segmented chunk's logs and
checkpoints, the manifest a resume checks). `bec_jax.run.runner` runs a spec into
such a directory.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time

import numpy as np

from bec_jax.files import TMP_PREFIX, NpyFile, atomic_write, json_ready, write_json
from bec_jax.run import kinds, watchdog
from bec_jax.run.outdir import (  # the output-directory policy, the run lock and damage messages: its names here too
    CHUNKS_DIR,
    LOCK_FILE,  # noqa: F401
    MANIFEST_FILE,
    SUBMIT_DIR,  # noqa: F401
    RunError,
    check_not_writing,  # noqa: F401
    check_out_dir,  # noqa: F401
    damaged,  # noqa: F401
    entries,  # noqa: F401
    lock_dir,  # noqa: F401
    prepare_out_dir,  # noqa: F401
    remove_temporary,
    unlock_dir,  # noqa: F401
)

MANIFEST_LOCK = ".manifest.lock"
CHECKPOINT_FILE = "checkpoint.npz"
STREAMED_KEY = "_streamed"
SET_ASIDE_DIR = "set_aside"  # DIR/chunks/set_aside/: files a resume could not trust, kept for the user
# What every chunk file and checkpoint carries to prove what it is (see ChunkStore).
INDEX_KEY, FINGERPRINT_KEY, CHECKSUM_KEY = "_index", "_fingerprint", "_checksum"
STREAMED_SHA_KEY, LOGS_KEY, LOGS_SHA_KEY = "_streamed_sha256", "_logs", "_logs_sha256"
_PRIVATE = {STREAMED_KEY, INDEX_KEY, FINGERPRINT_KEY, CHECKSUM_KEY, STREAMED_SHA_KEY, LOGS_KEY, LOGS_SHA_KEY}
_CHUNK_FILE = re.compile(r"^chunk_\d{5,}\.npz$")
_CHUNK_DIR = re.compile(r"^chunk_\d{5,}$")
_SET_ASIDE_NAME = re.compile(r"^chunk_\d{5,}[-.][A-Za-z0-9_.-]*\.\d+$")
_BLOCK = 1 << 20  # files are hashed a block at a time, never read whole


# ------------------------------------------------------------------ specs and their fronts
#
# A spec's kind names its front (`kinds.of_spec(spec).front`, an
# `engine.protocol.Engine`): the runner plans, runs and resumes through it and
# never asks what kind of spec it holds.

def spec_from_dict(d: dict):
    """The spec a saved dict describes, of the class its "kind" names
    (`kinds.of_dict`; none: a prediction `SweepSpec`)."""
    return kinds.of_dict(d).spec.from_dict(d)


# ------------------------------------------------------------------ the chunk store

class ChunkStore:
    """The finished chunks of a sweep, kept on disk while it runs so an
    interrupted run can resume: `DIR/chunks/manifest.json` (the spec, the chunk
    size, the device count, the number of chunks and the models' fingerprints)
    and one `DIR/chunks/chunk_00003.npz` per finished chunk (the program's
    outputs for that chunk's grid points), each written atomically. A chunk file
    is there complete or not at all.

    Each chunk file and checkpoint proves what it is: it carries its chunk's
    index, the run's fingerprint (`fingerprint`) and a checksum of its arrays,
    and lists the sha256 of the .npy logs it uses (a finished chunk's whole
    files; a checkpoint's region written so far). A resume sets aside (into
    `DIR/chunks/set_aside/`, one line on stderr) any that fails to prove it,
    and that chunk runs again."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.dir = os.path.join(out_dir, CHUNKS_DIR)
        self.manifest_path = os.path.join(self.dir, MANIFEST_FILE)
        self._fp = None  # the manifest's fingerprint, read once
        self._checked = {}  # index -> a checkpoint `arrays` verified, for the `restore` that follows

    def exists(self) -> bool:
        return os.path.isfile(self.manifest_path)

    def chunk_path(self, index: int) -> str:
        return os.path.join(self.dir, f"chunk_{index:05d}.npz")

    def read_manifest(self) -> dict:
        try:
            with open(self.manifest_path) as f:
                m = json.load(f)
            m["spec"] = spec_from_dict(m["spec"])
            for k in ("chunk_size", "num_chunks", "num_devices"):
                if not isinstance(m.get(k), int) or isinstance(m.get(k), bool):
                    raise ValueError(f"bad {k}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RunError(f"resume: cannot read {self.manifest_path!r} ({e}); "
                           "start over with --overwrite") from None
        return m

    def _write_manifest(self, spec, chunk_size: int, num_devices: int, backend: str,
                        layout: dict | None = None) -> None:
        front = kinds.of_spec(spec).front
        write_json(self.manifest_path, {
            "spec": spec.to_dict(), "chunk_size": chunk_size, "num_chunks": front.num_chunks(spec, chunk_size),
            "num_devices": num_devices, "backend": backend, "env_fingerprints": front.fingerprints(spec),
            **(layout or {})})
        self._fp = None  # read back from the file, as a resume will

    def fingerprint(self) -> str:
        """The sha256 of what a chunk's outputs depend on, as the manifest
        records it: the spec (its canonical JSON), the chunk size and the
        models' fingerprints. Every chunk file and checkpoint carries it."""
        if self._fp is None:
            try:
                with open(self.manifest_path) as f:
                    m = json.load(f)
                key = {k: m.get(k) for k in ("spec", "chunk_size", "env_fingerprints")}
            except (OSError, ValueError, AttributeError) as e:
                raise RunError(f"resume: cannot read {self.manifest_path!r} ({e}); start over with --overwrite") \
                    from None
            text = json.dumps(json_ready(key), sort_keys=True, separators=(",", ":"), allow_nan=False)
            self._fp = hashlib.sha256(text.encode()).hexdigest()
        return self._fp

    def start(self, spec, chunk_size: int, num_devices: int, backend: str,
              layout: dict | None = None) -> None:
        """Begins a fresh run: removes any earlier chunks and writes the manifest
        (with `layout`: seeds per call and log blocks per segment, which a
        resume keeps). Anything in the chunk store that bec-jax did not write
        stops it (`RunError` naming the path) before anything is deleted."""
        self._clear()
        os.makedirs(self.dir, exist_ok=True)
        self._write_manifest(spec, chunk_size, num_devices, backend, layout)

    def check(self, spec, chunk_size: int | None = None) -> dict:
        """The manifest of the run to resume; `RunError` naming the first field in
        which `spec` (or an explicit `chunk_size`) differs from it, or saying that
        the environment's model changed (an edited MDP file, say)."""
        m = self.read_manifest()
        old, new = m["spec"].to_dict(), spec.to_dict()
        for k in old:
            if old[k] != new[k]:
                raise RunError(f"{k}: differs from the interrupted run in {self.out_dir!r} "
                               f"({old[k]!r} there, {new[k]!r} here); resume with the same spec "
                               "or start over with --overwrite")
        fp = m.get("env_fingerprints")
        if fp is not None and fp != kinds.of_spec(spec).front.fingerprints(spec):
            raise RunError(f"env: the model of {spec.env!r} has changed since the interrupted run in "
                           f"{self.out_dir!r}; start over with --overwrite")
        if chunk_size is not None and chunk_size != m["chunk_size"]:
            raise RunError(f"chunk_size: the interrupted run used {m['chunk_size']}, got {chunk_size}; "
                           "resume with the same chunk size (or leave --chunk-size out)")
        return m

    def ensure(self, spec, chunk_size: int, num_devices: int, backend: str,
               timeout: float = 60.0) -> dict:
        """The manifest of a chunk store shared by several processes (`--chunks
        K/N`): the first process to arrive writes it (an exclusive lock file
        decides which), the others wait for it and check that their spec matches."""
        os.makedirs(self.dir, exist_ok=True)
        lock = os.path.join(self.dir, MANIFEST_LOCK)
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            t0 = time.monotonic()
            while not self.exists():
                if time.monotonic() - t0 > timeout:
                    raise RunError(f"chunks: {self.manifest_path!r} did not appear within {timeout:.0f} s "
                                   f"(a stale {lock!r}? remove it)") from None
                watchdog.beat()  # an idle wait with its own time limit, not a hang
                time.sleep(0.05)
        else:
            os.close(fd)
            if not self.exists():
                self._write_manifest(spec, chunk_size, num_devices, backend)
            os.unlink(lock)
        return self.check(spec)

    # -- a segmented chunk's logs and checkpoints (the `sweep.MemoryOutputs` methods, on disk)

    def part_dir(self, index: int) -> str:
        """Where chunk `index` of a segmented run keeps its logs (.npy files
        written segment by segment) and its checkpoint."""
        return os.path.join(self.dir, f"chunk_{index:05d}")

    def arrays(self, index: int, shapes: dict) -> dict:
        """Chunk `index`'s log files (`NpyFile`s: each segment's slab is written
        in place, the file never mapped whole), kept as they are when a
        checkpoint that proves itself (see `restore`) will continue them, else
        created."""
        d = self.part_dir(index)
        os.makedirs(d, exist_ok=True)
        keep = self._verified_checkpoint(index) is not None
        out = {}
        for name, (shape, dtype) in shapes.items():
            path = os.path.join(d, f"{name}.npy")
            out[name] = NpyFile.open(path) if keep and os.path.isfile(path) else NpyFile.create(path, shape, dtype)
        return out

    def restore(self, index: int) -> dict | None:
        """The checkpoint of chunk `index`: {"next_block", "carries"} (each
        carry a list of arrays, the leaves of the carried state), or None. One
        that is unreadable, of another chunk or run, or whose logs' region
        written so far changed is set aside (the chunk starts over)."""
        z = self._verified_checkpoint(index)
        self._checked.pop(index, None)
        if z is None:
            return None
        n, leaves = int(z["num_carries"]), int(z["num_leaves"])
        return {"next_block": int(z["next_block"]),
                "carries": [[z[f"c{s}_{k}"] for k in range(leaves)] for s in range(n)]}

    def _verified_checkpoint(self, index: int) -> dict | None:
        """Chunk `index`'s checkpoint arrays once they prove themselves, else
        None (a bad checkpoint, or the log that does not match it, set aside)."""
        if index in self._checked:
            return self._checked[index]
        path = os.path.join(self.part_dir(index), CHECKPOINT_FILE)
        if not os.path.isfile(path):
            return None
        z, why, bad = None, None, [path]
        try:
            with np.load(path) as f:
                z = {k: f[k] for k in f.files}
            why = self._problem(index, z)
            cols = int(z["next_block"]) + 1  # log points 0..next_block are written; later ones may change
            logs = list(zip(z[LOGS_KEY].tolist(), z[LOGS_SHA_KEY].tolist()))
        except Exception as e:  # a truncated or overwritten file: BadZipFile, EOFError, zlib.error, ...
            why = why or f"cannot be read ({type(e).__name__}: {e})"
        if why is None:
            for name, sha in logs:
                log = os.path.join(self.part_dir(index), f"{name}.npy")
                try:
                    same = _region_sha(log, cols) == sha
                except Exception:  # missing, truncated, a bad header
                    same = False
                if not same:
                    why, bad = f"lists {log!r}, whose first {cols} log points do not match it", [log, path]
                    break
        if why is not None:
            self._set_aside(bad, f"{path!r} {why}", f"chunk {index} starts over")
            z = None
        self._checked[index] = z
        return z

    def checkpoint(self, index: int, next_block: int, carries: list, logs: dict) -> None:
        """Keeps chunk `index`'s carried states after `next_block` log blocks,
        once its log files (`logs`, from `arrays`) up to there are on disk, with
        the sha256 of each log's region written so far."""
        import jax
        for arr in logs.values():
            if isinstance(arr, (np.memmap, NpyFile)):
                arr.flush()
        flat = [jax.tree_util.tree_leaves(c) for c in carries]
        arrays = {f"c{s}_{k}": np.asarray(x) for s, leaves in enumerate(flat) for k, x in enumerate(leaves)}
        arrays.update(next_block=np.int64(next_block), num_carries=np.int64(len(flat)),
                      num_leaves=np.int64(len(flat[0]) if flat else 0))
        names = sorted(logs)
        arrays[LOGS_KEY] = np.array(names, dtype=str)
        arrays[LOGS_SHA_KEY] = np.array([_region_sha(logs[k].filename, next_block + 1) for k in names], dtype=str)
        self._identify(index, arrays)
        self._checked.pop(index, None)
        atomic_write(os.path.join(self.part_dir(index), CHECKPOINT_FILE), lambda f: np.savez(f, **arrays),
                     binary=True)

    def save(self, index: int, arrays: dict) -> None:
        """Keeps a finished chunk: its outputs in `chunk_00003.npz`; logs that
        already live in its directory (a segmented chunk's) stay there, listed
        in it with their sha256."""
        d = self.part_dir(index)
        streamed = {k for k, v in arrays.items() if isinstance(v, (np.memmap, NpyFile))
                    and os.path.dirname(os.path.abspath(v.filename)) == os.path.abspath(d)}
        for k in streamed:
            arrays[k].flush()
        rest = {k: v for k, v in arrays.items() if k not in streamed}
        if streamed:
            rest[STREAMED_KEY] = np.array(sorted(streamed))
            rest[STREAMED_SHA_KEY] = np.array([_file_sha(arrays[k].filename) for k in sorted(streamed)])
        self._identify(index, rest)
        atomic_write(self.chunk_path(index), lambda f: np.savez(f, **rest), binary=True)
        ck = os.path.join(d, CHECKPOINT_FILE)
        if os.path.exists(ck):
            os.unlink(ck)

    def _identify(self, index: int, arrays: dict) -> None:
        """Adds what a resume checks to a chunk file's or checkpoint's arrays."""
        arrays[INDEX_KEY] = np.int64(index)
        arrays[FINGERPRINT_KEY] = np.array(self.fingerprint())
        arrays[CHECKSUM_KEY] = np.array(_checksum(arrays))

    def _problem(self, index: int, z: dict) -> str | None:
        """Why arrays read from chunk `index`'s file cannot be used, or None."""
        if CHECKSUM_KEY not in z or INDEX_KEY not in z or FINGERPRINT_KEY not in z:
            return "carries no index, fingerprint or checksum (not written by this version of bec-jax)"
        if str(z[CHECKSUM_KEY]) != _checksum(z):
            return "does not match its checksum (overwritten?)"
        if int(z[INDEX_KEY]) != index:
            return f"holds chunk {int(z[INDEX_KEY])}, not chunk {index}"
        if str(z[FINGERPRINT_KEY]) != self.fingerprint():
            return "belongs to another run (its spec, chunk size or model differ from the manifest's)"
        return None

    def _set_aside(self, paths: list, why: str, then: str) -> None:
        """Moves `paths` (those still there) into DIR/chunks/set_aside/, never
        deleting one, and says so in one line on stderr."""
        d = os.path.join(self.dir, SET_ASIDE_DIR)
        os.makedirs(d, exist_ok=True)
        moved = []
        for p in paths:
            if not os.path.lexists(p):
                continue
            flat = os.path.relpath(p, self.dir).replace(os.sep, "-")
            k = 1
            while os.path.lexists(os.path.join(d, f"{flat}.{k}")):
                k += 1
            os.replace(p, os.path.join(d, f"{flat}.{k}"))
            moved.append(os.path.join(d, f"{flat}.{k}"))
        from bec_jax.engine import execute
        lead = "\n" if execute.progress_line_open() else ""  # a line of its own, after an unfinished progress line
        print(f"{lead}bec-jax: resume: {why}; set aside as {', '.join(moved) or 'nothing (gone)'}; {then}",
              file=sys.stderr, flush=True)

    def load_done(self, clean: bool = True) -> dict[int, dict]:
        """{index: arrays} of the finished chunks. Leftover temporary files of a
        write that was cut short are removed (not with `clean=False`: in a store
        shared by running processes they may be another's write in progress). A
        chunk file that does not prove itself (unreadable, truncated, of another
        chunk or run, a streamed log that changed) is set aside: that chunk
        runs again."""
        done = {}
        for name in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, name)
            if name.startswith(TMP_PREFIX) or _CHUNK_DIR.match(name):
                if clean:
                    remove_temporary(path) if _CHUNK_DIR.match(name) else os.unlink(path)
                continue
            if not _CHUNK_FILE.match(name):
                continue
            index = int(name[len("chunk_"):-len(".npz")])
            arrays, why, bad = self._read_chunk(index, path)
            if why is not None:
                self._set_aside(bad + [path], f"{path!r} {why}", f"chunk {index} runs again")
                continue
            done[index] = arrays
        return done

    def _read_chunk(self, index: int, path: str) -> tuple:
        """(arrays, None, []) of a finished chunk's file, or (None, why it
        cannot be used, the logs to set aside with it)."""
        try:
            with np.load(path) as f:
                z = {k: f[k] for k in f.files}
            why = self._problem(index, z)
        except Exception as e:  # a truncated or overwritten file: BadZipFile, EOFError, zlib.error, ...
            return None, f"cannot be read ({type(e).__name__}: {e})", []
        if why is not None:
            return None, why, []
        arrays = {k: v for k, v in z.items() if k not in _PRIVATE}
        names = z[STREAMED_KEY].tolist() if STREAMED_KEY in z else []
        shas = z[STREAMED_SHA_KEY].tolist() if STREAMED_SHA_KEY in z else [None] * len(names)
        for k, sha in zip(names, shas):
            log = os.path.join(self.part_dir(index), f"{k}.npy")
            try:
                if _file_sha(log) != sha:
                    raise ValueError("changed")
                arrays[k] = NpyFile.open(log)
            except Exception:
                return None, f"lists {log!r}, which is missing or does not match its sha256 (overwritten or " \
                             "truncated?)", [log]
        return arrays, None, []

    def usable_chunks(self, num_chunks: int) -> frozenset:
        """The indices (below `num_chunks`) of the finished chunk files a
        resume would use: those that prove themselves as `load_done` checks
        them (`_read_chunk`), read but neither loaded for a run nor set aside
        (`bec-jax status` counts these). Junk, another chunk's or run's file
        and a file whose data or logs changed are not counted."""
        try:
            names = os.listdir(self.dir)
            self.fingerprint()
        except (OSError, RunError):
            return frozenset()
        out = set()
        for name in names:
            if not _CHUNK_FILE.match(name):
                continue
            index = int(name[len("chunk_"):-len(".npz")])
            if index < num_chunks and self._read_chunk(index, os.path.join(self.dir, name))[1] is None:
                out.add(index)
        return frozenset(out)

    def count_done(self) -> int:
        """How many finished chunk files the store holds (not read)."""
        return sum(1 for n in os.listdir(self.dir) if _CHUNK_FILE.match(n)) if os.path.isdir(self.dir) else 0

    def has_work(self) -> bool:
        """Whether a resume would use anything here: a finished chunk or a
        checkpoint of a chunk's finished segments."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return False
        return any(n.startswith("chunk_") and (n.endswith(".npz") or os.path.isfile(
            os.path.join(self.dir, n, CHECKPOINT_FILE))) for n in names)

    def _inventory(self) -> tuple[list, list, list]:
        """(the files the chunk store wrote, its directories deepest first,
        anything else under it). Symbolic links are never ours."""
        files, dirs, other = [], [], []
        if not os.path.lexists(self.dir):
            return files, dirs, other
        if os.path.islink(self.dir) or not os.path.isdir(self.dir):
            return files, dirs, [self.dir]
        for e in os.scandir(self.dir):
            if e.is_dir(follow_symlinks=False) and (_CHUNK_DIR.match(e.name) or e.name == SET_ASIDE_DIR):
                ours = _SET_ASIDE_NAME.match if e.name == SET_ASIDE_DIR else \
                    (lambda n: n.endswith(".npy") or n == CHECKPOINT_FILE or n.startswith(TMP_PREFIX))
                for f in os.scandir(e.path):
                    (files if f.is_file(follow_symlinks=False) and ours(f.name) else other).append(f.path)
                dirs.append(e.path)
            elif e.is_file(follow_symlinks=False) and (e.name in (MANIFEST_FILE, MANIFEST_LOCK) or
                                                       _CHUNK_FILE.match(e.name) or e.name.startswith(TMP_PREFIX)):
                files.append(e.path)
            else:
                other.append(e.path)
        return files, dirs + [self.dir], other

    def _clear(self) -> None:
        """Deletes the chunk store for a fresh start (--overwrite): only the
        files and directories it wrote, files set aside included; `RunError`
        naming the first other entry, before anything is deleted."""
        files, dirs, other = self._inventory()
        if other:
            raise RunError(f"out: {other[0]!r} was not written by bec-jax, and --overwrite deletes only a run's own "
                           f"files in {self.dir!r}; move it elsewhere and run again")
        _delete(files, dirs)

    def remove(self) -> None:
        """Removes what the chunk store wrote, once the results are written (or
        a run kept nothing): its files, then its directories where empty.
        Anything else is left, and so are the files a resume set aside."""
        files, dirs, _ = self._inventory()
        aside = os.path.join(self.dir, SET_ASIDE_DIR)
        _delete([p for p in files if os.path.dirname(p) != aside], dirs)


def _delete(files: list, dirs: list) -> None:
    """Unlinks `files`, then removes `dirs` (deepest first) where empty; one
    already gone (another run's cleanup) is no error."""
    for p in files:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    for d in dirs:
        try:
            os.rmdir(d)
        except OSError:
            pass


def _checksum(arrays: dict) -> str:
    """sha256 of arrays' names, dtypes, shapes and bytes (all but the checksum's own)."""
    h = hashlib.sha256()
    for k in sorted(arrays):
        if k == CHECKSUM_KEY:
            continue
        a = np.ascontiguousarray(np.asarray(arrays[k]))
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a)
    return h.hexdigest()


def _file_sha(path: str) -> str:
    """sha256 of a file, read a block at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def _region_sha(path: str, cols: int) -> str:
    """sha256 of the first `cols` log points (the last axis) of every row of a
    .npy log, with its dtype and shape: the part a checkpoint vouches for,
    which later segments do not touch. A short file raises ValueError."""
    log = NpyFile.open(path)
    L, size = log.shape[-1], log.itemsize
    n = min(cols, L)
    h = hashlib.sha256(f"{log.dtype.str}|{log.shape}|{n}|".encode())
    with open(path, "rb") as f:
        for r in range(int(np.prod(log.shape[:-1], dtype=np.int64))):
            f.seek(log.offset + r * L * size)
            left = n * size
            while left:
                block = f.read(min(left, _BLOCK))
                if not block:
                    raise ValueError(f"{path}: truncated")
                h.update(block)
                left -= len(block)
    return h.hexdigest()
