"""Compiled programs kept on disk, found before tracing.

JAX's persistent compilation cache is keyed by a program's HLO, so a second
process must trace and lower the program again before it can find it: for a
small sweep that is most of what is left of a compile once XLA's work is
cached. This cache keys a prediction program by what it is made from instead
(`file_key`: the spec but its base seed and grid values, the models by
content, the chunk size, the devices, the program's form, this bec_jax's
source, JAX's version, the default matmul precision, the accelerator
plugin's version and the machine), and keeps the executable JAX
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
that cache is on; any failure to read or write one is a miss.

Trust. A kept program is a pickle (`serialize_executable`'s payload is one),
and unpickling runs code, so a file is read only when all of these hold, and
nothing is loaded or saved otherwise:

- JAX's cache directory, its `bec_jax_programs` directory and the file belong
  to this process's user (`os.getuid`) and are not writable by group or
  others; the file is a regular file, not a symlink. Otherwise one line on
  stderr (once per path) names the path and the `chmod` that fixes it.
- The file carries an HMAC-SHA256 of its key and payload under a per-user
  secret (`secret_path`: 32 random bytes, mode 0600, in `$BEC_JAX_SECRET_DIR`,
  else `$XDG_CACHE_HOME/bec_jax`, else `~/.cache/bec_jax`, a directory made
  0700), checked before anything is unpickled. A secret file of another user
  or readable by others turns this cache off, with one line. A file whose
  HMAC does not match, or that is short or garbled (another key's, a flipped
  byte, a planted pickle), is a miss and is removed.

Files are written 0600 into a directory made 0700: `MAGIC`, the format
(`FORMAT`, also in every key), the HMAC, then the payload.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import importlib.metadata
import inspect
import json
import os
import pickle
import shlex
import stat
import struct
import sys
import tempfile
import time

import jax
import jaxlib

from bec_jax.engine import clock, tuning
from bec_jax.mdp import fingerprint

SUBDIR = "bec_jax_programs"
FORMAT = 3  # in every key and every file's header: files of an earlier format are never read
MAGIC = b"BECJAXP\0"
_HEADER = MAGIC + struct.pack(">H", FORMAT)
_DIGEST = 32  # bytes of an HMAC-SHA256
SECRET_ENV = "BEC_JAX_SECRET_DIR"
_SOURCE: list = []  # the hash of bec_jax's source, computed once
_SECRET: dict = {}  # secret path -> its bytes, or None once refused (one line per process)
_TOLD: set = set()  # paths already refused on stderr
# Accelerator plugins whose version changes what a program compiles to.
_PLUGINS = ("jax-cuda12-plugin", "jax-cuda13-plugin", "jax-cuda12-pjrt", "jax-cuda13-pjrt", "jax-rocm60-plugin",
            "jax-rocm7-plugin", "libtpu", "libtpu-nightly", "jax-metal")


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
    experiments included, which live outside the package's directory), or of a
    `functools.partial` of one with plain-data arguments (its arguments
    appended); None otherwise."""
    if isinstance(fn, functools.partial):
        inner = _ours(fn.func)
        try:
            bound = json.dumps([list(fn.args), fn.keywords], sort_keys=True)
        except (TypeError, ValueError):  # an argument that is not plain data: no stable key
            return None
        return None if inner is None else f"{inner}|{bound}"
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


def _accelerator(devices) -> list:
    """The runtime of an accelerator among `devices` (its client's platform
    version and the plugin's package version): a program compiled by one
    plugin may not load, or run the same, under another. [] on CPU."""
    accel = [dev for dev in devices if dev.platform != "cpu"]
    if not accel:
        return []
    try:
        out = [str(accel[0].client.platform_version)]
    except Exception:  # noqa: BLE001 - a plugin without it: its package's version still counts
        out = [""]
    for dist in _PLUGINS:
        try:
            out.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _uid() -> int | None:
    """This process's user; None where the OS has no POSIX owners (Windows)."""
    return os.getuid() if hasattr(os, "getuid") else None


def tell(path: str, line: str) -> None:
    """`line` on stderr, prefixed 'bec-jax: ', once per process for `path`."""
    if path not in _TOLD:
        _TOLD.add(path)
        print(f"bec-jax: {line}", file=sys.stderr, flush=True)


def why_untrusted(path: str, st: os.stat_result, private: bool = False) -> str | None:
    """Why a file or directory with status `st` must not be trusted, naming
    the command that fixes it, or None: it belongs to this user and is not
    writable by group or others (`private`: not open to them at all)."""
    uid = _uid()
    if uid is None:
        return None
    q = shlex.quote(path)
    if st.st_uid != uid:
        return f"{path} belongs to uid {st.st_uid}, not to you (uid {uid}) (use a path of your own, or chown {uid} {q})"
    if private and st.st_mode & 0o077:
        return f"{path} is open to group or others (chmod 600 {q})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (chmod go-w {q})"
    return None


def _dir_stat(path: str, create: bool) -> os.stat_result | None:
    """`path`'s status (made 0700 when missing and `create`); None if missing or unreadable."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        if not create:
            return None
    except OSError:
        return None
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        return os.stat(path)
    except OSError:
        return None


def _trusted_dir(create: bool) -> str | None:
    """The programs directory while it and JAX's cache directory can be
    trusted (see the module docstring), else None: the persistent cache is
    off, a directory is missing (`create`: made 0700 instead), or it is
    refused, with one line on stderr."""
    d = cache_dir()
    if d is None:
        return None
    for path in (os.path.dirname(d), d):
        st = _dir_stat(path, create)
        if st is None:
            return None
        why = why_untrusted(path, st) or (None if stat.S_ISDIR(st.st_mode) else f"{path} is not a directory")
        if why:
            tell(path, f"not loading or saving compiled programs: {why}")
            return None
    return d


def secret_path() -> str:
    """This user's HMAC secret for kept programs: `secret` in $BEC_JAX_SECRET_DIR
    (for tests), else in $XDG_CACHE_HOME/bec_jax, else in ~/.cache/bec_jax."""
    d = os.environ.get(SECRET_ENV)
    if not d:
        home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(home, "bec_jax")
    return os.path.join(d, "secret")


def _read_or_make_secret(path: str) -> bytes | str:
    """The secret's 32 bytes, made first if missing (O_EXCL: of two processes
    making it, one wins and the other reads it); else why it is refused."""
    d = os.path.dirname(path)
    os.makedirs(d, mode=0o700, exist_ok=True)
    why = why_untrusted(d, os.stat(d))
    if why:
        return why
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(_DIGEST))
    for _ in range(50):  # a process that has just made it may not have written it yet
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
            st = os.fstat(f.fileno())
            why = why_untrusted(path, st, private=True) or (None if stat.S_ISREG(st.st_mode) else f"{path} is not a file")
            if why:
                return why
            data = f.read(_DIGEST + 1)
        if len(data) == _DIGEST:
            return data
        time.sleep(0.02)
    return f"{path} is not {_DIGEST} bytes (rm {shlex.quote(path)}: a new one is made)"


def _secret() -> bytes | None:
    """This user's secret (`secret_path`), read once per process; None, with
    one line on stderr, where it is refused or cannot be made."""
    path = secret_path()
    if path not in _SECRET:
        try:
            got = _read_or_make_secret(path)
        except OSError as e:
            got = f"cannot use {path} ({e.strerror or e}; set {SECRET_ENV} to a directory of your own)"
        _SECRET[path] = got if isinstance(got, bytes) else None
        if not isinstance(got, bytes):
            tell(path, f"not loading or saving compiled programs: {got}")
    return _SECRET[path]


def _mac(secret: bytes, key: str, payload: bytes) -> bytes:
    """The HMAC-SHA256 a kept file carries: of its key (so a file copied to
    another key's name does not verify) and its payload."""
    return hmac.new(secret, key.encode() + payload, hashlib.sha256).digest()


def _remove(path: str) -> None:
    """Removes a kept file that did not verify or load (a file of ours, in a
    directory of ours: it is rewritten on the next save)."""
    try:
        os.remove(path)
    except OSError:
        pass


def _read_verified(path: str, key: str, secret: bytes) -> bytes | None:
    """The payload of the file at `path` once its owner, mode and HMAC are
    checked, else None (a miss; a file of ours that does not verify is
    removed). Nothing here unpickles."""
    try:
        st = os.lstat(path)  # a symlink is refused, not followed
    except OSError:
        return None
    why = (None if stat.S_ISREG(st.st_mode) else f"{path} is not a regular file (rm {shlex.quote(path)})")
    why = why or why_untrusted(path, st)
    if why:
        tell(path, f"not loading compiled programs: {why}")
        return None
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
            if not os.path.samestat(os.fstat(f.fileno()), st):  # replaced since the check
                return None
            data = f.read()
    except OSError:
        return None
    n = len(_HEADER)
    mac, payload = data[n:n + _DIGEST], data[n + _DIGEST:]
    if data[:n] != _HEADER or len(mac) != _DIGEST or not hmac.compare_digest(mac, _mac(secret, key, payload)):
        _remove(path)
        return None
    return payload


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
                            bool(jax.config.jax_enable_x64), _machine(),
                            str(jax.config.jax_default_matmul_precision), _accelerator(devices)], sort_keys=True)
    except (TypeError, ValueError):  # something that is not plain data: no stable key
        return None
    return hashlib.sha256(parts.encode()).hexdigest()


def load(key: str | None, devices=None):
    """The compiled program kept under `key`, loaded onto `devices` (default:
    all; the key names the devices it was compiled for) with its seconds added
    to the process's compile clock as a cache hit, or None (see the module
    docstring for what is trusted)."""
    if key is None:
        return None
    d = _trusted_dir(create=False)
    secret = _secret() if d is not None else None
    if secret is None:
        return None
    path = os.path.join(d, key + ".pkl")
    t = time.perf_counter()
    payload = _read_verified(path, key, secret)
    if payload is None:
        return None
    try:
        blob, in_tree, out_tree = pickle.loads(payload)
        from jax.experimental.serialize_executable import deserialize_and_load
        exe = deserialize_and_load(blob, in_tree, out_tree,
                                   execution_devices=list(devices) if devices is not None else None)
    except Exception:  # noqa: BLE001 - ours but unusable here: compile instead, and keep the new one
        _remove(path)
        return None
    clock.add_loaded(time.perf_counter() - t)
    return exe


def save(key: str | None, exe) -> bool:
    """Keeps `exe` under `key` (written whole or not at all, 0600, with its
    HMAC); False where it cannot be (no key, an untrusted directory or secret,
    a program JAX cannot serialize, a read-only disk)."""
    if key is None:
        return False
    try:
        d = _trusted_dir(create=True)
        secret = _secret() if d is not None else None
        if secret is None:
            return False
        from jax.experimental.serialize_executable import serialize
        payload = pickle.dumps(serialize(exe))
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")  # 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_HEADER + _mac(secret, key, payload) + payload)
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
