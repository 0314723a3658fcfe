"""The run directory: the output-directory policy (`check_out_dir`,
`prepare_out_dir`), the spec a saved dict describes (`spec_from_dict`) and the
chunk store (`ChunkStore`: finished chunks, a segmented chunk's logs and
checkpoints, the manifest a resume checks). `bec_jax.run.runner` runs a spec into
such a directory.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Callable

import numpy as np

from bec_jax.files import TMP_PREFIX, NpyFile, atomic_write, write_json
from bec_jax.run import kinds, watchdog

CHUNKS_DIR = "chunks"
MANIFEST_FILE = "manifest.json"
CHECKPOINT_FILE = "checkpoint.npz"
STREAMED_KEY = "_streamed"


class RunError(ValueError):
    """Bad input for a run (a directory that cannot be used, a resume that does
    not match): one line naming the field."""


# ------------------------------------------------------------------ output directory

def check_out_dir(out, overwrite: bool, allow: Callable[[str], bool] | None = None) -> None:
    """Refuses, without creating anything, an `out` that is not a path, exists as
    a file, or is a non-empty directory (unless `overwrite`, or `allow(out)` says
    the directory's contents may be reused)."""
    if not isinstance(out, str) or not out:
        raise RunError(f"out: expected a directory path, got {out!r}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise RunError(f"out: {out!r} exists and is not a directory")
    try:
        nonempty = os.path.isdir(out) and bool(os.listdir(out))
    except OSError as e:
        raise RunError(f"out: cannot read {out!r} ({e.strerror})") from None
    if nonempty and not overwrite and not (allow is not None and allow(out)):
        raise RunError(f"out: {out!r} already exists and is not empty; choose another "
                       "directory or pass --overwrite")


_PROBE = ".bec-jax-write-test-"  # a part's brief write probe (see prepare_out_dir)


def entries(out: str) -> list[str]:
    """What `out` holds, less other parts' write probes of this very moment."""
    return [e for e in os.listdir(out) if not e.startswith(_PROBE)]


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
    is there complete or not at all."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.dir = os.path.join(out_dir, CHUNKS_DIR)
        self.manifest_path = os.path.join(self.dir, MANIFEST_FILE)

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

    def start(self, spec, chunk_size: int, num_devices: int, backend: str,
              layout: dict | None = None) -> None:
        """Begins a fresh run: removes any earlier chunks and writes the manifest
        (with `layout`: seeds per call and log blocks per segment, which a
        resume keeps)."""
        self.remove()
        os.makedirs(self.dir)
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
        lock = os.path.join(self.dir, ".manifest.lock")
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
        checkpoint will continue them, else created."""
        d = self.part_dir(index)
        os.makedirs(d, exist_ok=True)
        keep = os.path.isfile(os.path.join(d, CHECKPOINT_FILE))
        out = {}
        for name, (shape, dtype) in shapes.items():
            path = os.path.join(d, f"{name}.npy")
            out[name] = NpyFile.open(path) if keep and os.path.isfile(path) else NpyFile.create(path, shape, dtype)
        return out

    def restore(self, index: int) -> dict | None:
        """The checkpoint of chunk `index`: {"next_block", "carries"} (each
        carry a list of arrays, the leaves of the carried state), or None."""
        path = os.path.join(self.part_dir(index), CHECKPOINT_FILE)
        if not os.path.isfile(path):
            return None
        try:
            with np.load(path) as z:
                n = int(z["num_carries"])
                leaves = int(z["num_leaves"])
                return {"next_block": int(z["next_block"]),
                        "carries": [[z[f"c{s}_{k}"] for k in range(leaves)] for s in range(n)]}
        except (OSError, ValueError, KeyError):
            return None  # unreadable: the chunk starts over

    def checkpoint(self, index: int, next_block: int, carries: list, logs: dict) -> None:
        """Keeps chunk `index`'s carried states after `next_block` log blocks,
        once its log files (`logs`, from `arrays`) up to there are on disk."""
        import jax
        for arr in logs.values():
            if isinstance(arr, (np.memmap, NpyFile)):
                arr.flush()
        flat = [jax.tree_util.tree_leaves(c) for c in carries]
        arrays = {f"c{s}_{k}": np.asarray(x) for s, leaves in enumerate(flat) for k, x in enumerate(leaves)}
        arrays.update(next_block=np.int64(next_block), num_carries=np.int64(len(flat)),
                      num_leaves=np.int64(len(flat[0]) if flat else 0))
        atomic_write(os.path.join(self.part_dir(index), CHECKPOINT_FILE), lambda f: np.savez(f, **arrays),
                     binary=True)

    def save(self, index: int, arrays: dict) -> None:
        """Keeps a finished chunk: its outputs in `chunk_00003.npz`; logs that
        already live in its directory (a segmented chunk's) stay there."""
        d = self.part_dir(index)
        streamed = {k for k, v in arrays.items() if isinstance(v, (np.memmap, NpyFile))
                    and os.path.dirname(os.path.abspath(v.filename)) == os.path.abspath(d)}
        for k in streamed:
            arrays[k].flush()
        rest = {k: v for k, v in arrays.items() if k not in streamed}
        if streamed:
            rest[STREAMED_KEY] = np.array(sorted(streamed))
        atomic_write(self.chunk_path(index), lambda f: np.savez(f, **rest), binary=True)
        ck = os.path.join(d, CHECKPOINT_FILE)
        if os.path.exists(ck):
            os.unlink(ck)

    def load_done(self, clean: bool = True) -> dict[int, dict]:
        """{index: arrays} of the finished chunks. Leftover temporary files of a
        write that was cut short are removed (not with `clean=False`: in a store
        shared by running processes they may be another's write in progress); an
        unreadable chunk file is skipped (that chunk runs again)."""
        done = {}
        for name in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, name)
            if name.startswith(TMP_PREFIX):
                if clean:
                    os.unlink(path)
                continue
            if not (name.startswith("chunk_") and name.endswith(".npz")):
                continue
            try:
                index = int(name[len("chunk_"):-len(".npz")])
                with np.load(path) as z:
                    arrays = {k: z[k] for k in z.files if k != STREAMED_KEY}
                    for k in (z[STREAMED_KEY].tolist() if STREAMED_KEY in z.files else ()):
                        arrays[k] = NpyFile.open(os.path.join(self.part_dir(index), f"{k}.npy"))
                done[index] = arrays
            except (OSError, ValueError, KeyError):
                continue
        return done

    def has_work(self) -> bool:
        """Whether a resume would use anything here: a finished chunk or a
        checkpoint of a chunk's finished segments."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return False
        return any(n.startswith("chunk_") and (n.endswith(".npz") or os.path.isfile(
            os.path.join(self.dir, n, CHECKPOINT_FILE))) for n in names)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
