"""Compiled programs kept on disk, found before tracing.

JAX's persistent compilation cache is keyed by a program's HLO, so a second
process must trace and lower the program again before it can find it: for a
small sweep that is most of what is left of a compile once XLA's work is
cached. This cache keys a prediction program by what it is made from instead
(`file_key`: the spec but its base seed and grid values, the models by
content, the chunk size, the devices, the program's form, this bec_jax's
source, JAX's version and the machine), and keeps the executable JAX
serializes (`jax.experimental.serialize_executable`) of a program XLA has
just compiled: an executable that JAX's own cache served serializes without
its kernels, so it is not kept (`compile_or_load` checks `clock.was_cache_hit`). A
sweep that differs from an earlier one only in its step sizes or its seed
loads its program in about 0.1 s, with nothing traced (`compile_or_load`).

A key must change whenever the program would. So only programs made from
bec_jax's own code are kept: an algorithm, a metric, a control task or
feature map (the front's `program_sources`) or a spec field from elsewhere (a
user's module can change without a trace of it in the key) gives no key,
and such a program goes through JAX's cache as before. The files live
beside JAX's persistent cache (`jax_compilation_cache_dir`), and only while
that cache is on; any failure to read or write one is a miss. Loading
unpickles the file: like JAX's own cache, the directory must be writable by
its user only.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import pickle
import tempfile
import time

import jax
import jaxlib

from bec_jax.engine import clock, tuning
from bec_jax.mdp import fingerprint

SUBDIR = "bec_jax_programs"
FORMAT = 2  # in every key: files of an earlier format are never read
_SOURCE: list = []  # the hash of bec_jax's source, computed once


def _source_hash() -> str:
    """sha256 over every Python file of the installed bec_jax package."""
    if not _SOURCE:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        h = hashlib.sha256()
        for dirpath, dirnames, files in os.walk(root):
            dirnames.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    h.update(os.path.relpath(path, root).encode())
                    with open(path, "rb") as f:
                        h.update(f.read())
        _SOURCE.append(h.hexdigest())
    return _SOURCE[0]


def _machine() -> str:
    """The CPU's model and instruction-set flags (an executable compiled for one
    machine may not run on another) and XLA's flags."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("flags", "model name"))]
        cpu = "".join(sorted(set(lines)))
    except OSError:
        import platform
        cpu = platform.processor() + platform.machine()
    return cpu + "|" + os.environ.get("XLA_FLAGS", "")


def _ours(fn) -> str | None:
    """'module.qualname:hash of its file' of a function of bec_jax itself (its
    experiments included, which live outside the package's directory); None
    otherwise."""
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None)
    if name is None or not (module == "bec_jax" or module.startswith("bec_jax.")):
        return None
    try:
        path = inspect.getsourcefile(fn)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except (OSError, TypeError):
        return None
    return f"{module}.{name}:{digest}"


def cache_dir() -> str | None:
    """Where programs are kept: beside JAX's persistent cache; None while it is off."""
    base = jax.config.jax_compilation_cache_dir
    return os.path.join(base, SUBDIR) if base else None


def file_key(spec, group, size: int, devices, form, front, extra: tuple = ()) -> str | None:
    """The key of a program on disk (what `tuning.memo_key` keys in a process,
    with nothing that holds only in this process), or None where the program
    must not be kept: the persistent cache is off, several processes, or
    anything made outside bec_jax (see the module docstring). `front`: the
    spec's `engine.protocol.Engine` (its `KIND` and `program_sources`)."""
    if cache_dir() is None or jax.process_count() > 1:
        return None
    alg = spec.algorithm_def
    fns = [_ours(alg.init), _ours(alg.update)]
    # A front's own code in the program (a metric's builder, a control task's
    # factory, its feature map), or a version string of a library that defines
    # it (gymnax).
    fns += [s if isinstance(s, str) else _ours(s) for s in front.program_sources(spec)]
    if any(f is None for f in fns):
        return None
    d = tuning.spec_shape(spec)
    try:
        parts = json.dumps([FORMAT, d, [fingerprint(m) for m in group.models], fns,
                            getattr(alg, "shares_scalars", False), repr(group.static), len(group.models), size,
                            [(dev.platform, dev.device_kind, dev.id) for dev in devices], form._asdict(), front.KIND,
                            list(extra), _source_hash(), jax.__version__, jaxlib.__version__,
                            bool(jax.config.jax_enable_x64), _machine()], sort_keys=True)
    except (TypeError, ValueError):  # something that is not plain data: no stable key
        return None
    return hashlib.sha256(parts.encode()).hexdigest()


def load(key: str | None, devices=None):
    """The compiled program kept under `key`, loaded onto `devices` (default:
    all; the key names the devices it was compiled for) with its seconds added
    to the process's compile clock as a cache hit, or None."""
    if key is None:
        return None
    path = os.path.join(cache_dir(), key + ".pkl")
    t = time.perf_counter()
    try:
        with open(path, "rb") as f:
            payload, in_tree, out_tree = pickle.load(f)
        from jax.experimental.serialize_executable import deserialize_and_load
        exe = deserialize_and_load(payload, in_tree, out_tree,
                                   execution_devices=list(devices) if devices is not None else None)
    except Exception:  # noqa: BLE001 - missing, stale or unreadable: compile instead
        return None
    clock.add_loaded(time.perf_counter() - t)
    return exe


def save(key: str | None, exe) -> bool:
    """Keeps `exe` under `key` (written whole or not at all); False where it
    cannot be (no key, a program JAX cannot serialize, a read-only disk)."""
    if key is None:
        return False
    try:
        from jax.experimental.serialize_executable import serialize
        blob = pickle.dumps(serialize(exe))
        d = cache_dir()
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, os.path.join(d, key + ".pkl"))
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return True
    except Exception:  # noqa: BLE001 - the program still runs; only the next process compiles again
        return False


def compile_or_load(key: str | None, devices, fn, args: tuple, options: dict | None):
    """The program kept under `key` (`load`), else `fn` compiled for `args`
    (`clock.compile_program`) and kept, unless JAX's own cache served it: such
    an executable serializes without its kernels and would fail when run from
    the file."""
    exe = load(key, devices)
    if exe is None:
        exe = clock.compile_program(fn, args, options)
        if not clock.was_cache_hit():
            save(key, exe)
    return exe
