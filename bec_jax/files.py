"""Files and formats: the names of a result directory's files, the layout of
logs on disk (`.npy` files written and read a slab at a time), atomic writes,
strict JSON, CSV and `meta.json`.

Every file a run leaves is written here: through `atomic_write` (a temporary
file in the same directory, `TMP_PREFIX`, then a rename), so a reader or an
interrupted run sees the old file or the new one, never half of one; or, for
logs too large to hold, through `NpyFile` in place.
"""
from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import math
import os
import tempfile

import numpy as np

CURVES_FILE = "curves.npz"
SUMMARY_FILE = "summary.json"
SUMMARY_CSV = "summary.csv"
META_FILE = "meta.json"
STUDY_FILE = "study.json"
GRID_PREFIX = "grid_"
LOGS_DIR = "curves"        # a large result's logs, one .npy each, read memory-mapped
LOGS_MARKER = "logs_on_disk"
LAZY_LOG_BYTES = 256 << 20  # logs above this are written to LOGS_DIR and load memory-mapped
LOG_LAYOUT = {"steps": "(L,)", "mean": "(G, M, L)", "std": "(G, M, L)", "sem": "(G, M, L)", "alive": "(G, L)"}


def human(n: float) -> str:
    """Bytes as a short decimal size: '7.8 GB', '512 MB'."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def log_path(out_dir: str, name: str) -> str:
    """The file of log array `name` of a result saved with its logs on disk."""
    return os.path.join(out_dir, LOGS_DIR, f"{name}.npy")


class NpyFile:
    """A C-ordered .npy file read and written a slab at a time with plain file
    I/O, never mapped whole: a mapping takes address space for the whole file,
    which a `ulimit -v` (usual on HPC nodes) refuses for a multi-GB log.

    Indexing takes `[lead..., a:b]`: any NumPy index into the leading axes
    (integers, slices, index arrays, `...`) and a unit-step slice of the last
    axis, each row of which is one contiguous run of the file. `mapped()` gives
    the finished file as a read-only `np.memmap`."""

    def __init__(self, path: str, shape: tuple, dtype, offset: int):
        self.filename = os.path.abspath(path)
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.offset = offset

    @classmethod
    def create(cls, path: str, shape: tuple, dtype) -> "NpyFile":
        """A new file of zeros (sparse until written), with the header
        `np.lib.format.open_memmap` writes."""
        dtype = np.dtype(dtype)
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                  "shape": tuple(int(n) for n in shape)}
        with open(path, "wb") as f:
            try:
                np.lib.format.write_array_header_1_0(f, header)
            except ValueError:  # a header over 64 kB: version 2.0, as open_memmap would choose
                f.seek(0)
                f.truncate()
                np.lib.format.write_array_header_2_0(f, header)
            offset = f.tell()
            f.truncate(offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        return cls(path, shape, dtype, offset)

    @classmethod
    def open(cls, path: str) -> "NpyFile":
        """An existing .npy file (C order), to read or write in place."""
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            if fortran or dtype.hasobject:
                raise ValueError(f"{path}: not a C-ordered numeric .npy file")
            return cls(path, shape, dtype, f.tell())

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    itemsize = property(lambda self: self.dtype.itemsize)
    nbytes = property(lambda self: self.size * self.itemsize)

    def _runs(self, key) -> tuple:
        """(row numbers with the leading axes' result shape, first column,
        columns) of `key`."""
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - len(key) + 1) + key[i + 1:]
        key = key + (slice(None),) * (self.ndim - len(key))
        if len(key) != self.ndim:
            raise IndexError(f"{self.filename}: {len(key)} indices for {self.ndim} axes")
        start, stop, step = key[-1].indices(self.shape[-1]) if isinstance(key[-1], slice) else (0, 0, 0)
        if step != 1:
            raise IndexError(f"{self.filename}: the last axis takes a unit-step slice, got {key[-1]!r}")
        rows = np.arange(int(np.prod(self.shape[:-1], dtype=np.int64))).reshape(self.shape[:-1])[key[:-1]]
        return np.asarray(rows), start, max(0, stop - start)

    def _spans(self, rows: np.ndarray, start: int, n: int):
        """(byte offset, first row, rows) of each contiguous stretch: whole rows
        that follow one another are one write."""
        flat = rows.ravel()
        L = self.shape[-1]
        whole = n == L
        i = 0
        while i < flat.size:
            j = i + 1
            while whole and j < flat.size and flat[j] == flat[j - 1] + 1:
                j += 1
            yield self.offset + (int(flat[i]) * L + start) * self.itemsize, i, j - i
            i = j

    def __getitem__(self, key) -> np.ndarray:
        rows, start, n = self._runs(key)
        out = np.empty((rows.size, n), self.dtype)
        if n:
            with open(self.filename, "rb") as f:
                for pos, i, k in self._spans(rows, start, n):
                    f.seek(pos)
                    out[i:i + k] = np.fromfile(f, self.dtype, k * n).reshape(k, n)
        return out.reshape(rows.shape + (n,))

    def __setitem__(self, key, value) -> None:
        rows, start, n = self._runs(key)
        if not n or not rows.size:
            return
        value = np.broadcast_to(np.asarray(value, self.dtype), rows.shape + (n,)).reshape(rows.size, n)
        with open(self.filename, "r+b") as f:
            for pos, i, k in self._spans(rows, start, n):
                f.seek(pos)
                f.write(np.ascontiguousarray(value[i:i + k]).data)

    def __array__(self, dtype=None, copy=None):
        return self[...] if dtype is None else self[...].astype(dtype)

    def flush(self) -> None:
        """What was written is on disk (as `np.memmap.flush` does)."""
        with open(self.filename, "r+b") as f:
            os.fsync(f.fileno())

    def mapped(self) -> np.memmap:
        """The file as a read-only `np.memmap` (address space for all of it)."""
        return map_logs(self.filename)


def map_logs(path: str) -> np.memmap:
    """`np.load(path, mmap_mode="r")`; a mapping the address-space limit
    refuses is one line (`ValueError` naming the logs) instead of OSError."""
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, MemoryError) as e:
        if isinstance(e, OSError) and e.errno != errno.ENOMEM:
            raise
        raise ValueError(f"logs: cannot map {path!r} ({human(os.path.getsize(path))}) into memory: "
                         "the address space left is too small; raise its limit (ulimit -v), or read the result "
                         "where more address space is allowed") from None


def open_log(out_dir: str, name: str, shape: tuple, dtype) -> NpyFile:
    """A new .npy file for log array `name` (see `LOG_LAYOUT`), written in slabs."""
    os.makedirs(os.path.join(out_dir, LOGS_DIR), exist_ok=True)
    return NpyFile.create(log_path(out_dir, name), shape, dtype)


SLAB_BYTES = 64 << 20  # copies of large (memory-mapped) logs go in slabs of log points


def copy_rows(dst, rows, src) -> None:
    """dst[rows] = src, in slabs along the last axis when src is large (a
    chunk log on disk is then never read whole). A 1-D src fills dst whole."""
    src_bytes = src.size * src.itemsize
    if src_bytes <= SLAB_BYTES:
        dst[rows] = src
        return
    T = src.shape[-1]
    step = max(1, T * SLAB_BYTES // src_bytes)
    for t in range(0, T, step):
        if src.ndim == 1:
            dst[t:t + step] = src[t:t + step]
        else:
            dst[rows, ..., t:t + step] = src[..., t:t + step]


def maps_file(arr, path: str) -> bool:
    """Whether `arr` is a memory map of the file `path` (a streamed log that is
    already where it would be saved)."""
    return isinstance(arr, np.memmap) and getattr(arr, "filename", None) is not None and \
        os.path.abspath(arr.filename) == os.path.abspath(path)


def finite_or_none(x):
    """`x` as a float, or None (null in JSON) when it is None or not finite."""
    return None if x is None or not np.isfinite(x) else float(x)


TMP_PREFIX = ".tmp-"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str, write, binary: bool = False) -> None:
    """Calls `write(f)` on a temporary file in the same directory, flushes it to
    disk, then renames it over `path`: a reader (or a run interrupted at any
    moment) sees the old file or the new one, never half of one. The file gets the
    usual permissions (0666 less the umask), not mkstemp's 0600."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=TMP_PREFIX, suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def json_ready(obj):
    """`obj` with every non-finite float (and numpy scalar) replaced by a JSON
    value: +-inf and NaN become None (JSON has no infinity)."""
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_ready(obj.tolist())
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def csv_text(rows: list[dict]) -> str:
    """`rows` (dicts) as CSV text with a header row: every key of any row, in
    order of first appearance; a missing value is empty."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def import_pandas():
    """The optional pandas module, or ImportError saying how to install it."""
    try:
        import pandas
    except ImportError:
        raise ImportError("pandas is an optional extra of bec_jax: pip install 'bec_jax[pandas]' "
                          "(or pip install pandas)") from None
    return pandas


def read_meta(out_dir: str) -> dict | None:
    """`out_dir`/meta.json as a dict, or None when it is missing or not a JSON object."""
    try:
        with open(os.path.join(out_dir, META_FILE)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _npy_problem(path: str, f, size: int | None) -> str | None:
    """Why the .npy data in the open file `f` (of `size` bytes, None: not
    checked) cannot be read as an array, or None."""
    try:
        version = np.lib.format.read_magic(f)
        shape, _, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0) else
                           np.lib.format.read_array_header_2_0)(f)
    except Exception as e:  # a bad magic string or header: ValueError, EOFError, SyntaxError, ...
        return f"{os.path.basename(path)} has no readable .npy header ({type(e).__name__})"
    need = f.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size is not None and size != need and not dtype.hasobject:
        return f"{os.path.basename(path)} holds {size} bytes, its header says {need}"
    return None


def result_problem(out_dir: str) -> tuple[str, str] | None:
    """(the file, why it cannot be read) of the first damaged file of the
    result saved in `out_dir` (curves.npz: its zip directory, every member's
    CRC and .npy header; meta.json; a large result's logs in curves/), or
    None when every one reads. The files are read through, never loaded whole."""
    import zipfile
    path = os.path.join(out_dir, CURVES_FILE)
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                return path, f"its member {bad} does not match its CRC"
            for info in z.infolist():
                with z.open(info) as f:
                    why = _npy_problem(info.filename, f, info.file_size)
                if why is not None:
                    return path, why
            on_disk = LOGS_MARKER + ".npy" in z.namelist()
    except (OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, RuntimeError) as e:
        return path, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if not isinstance((read_meta(out_dir) or {}).get("spec"), dict):
        return os.path.join(out_dir, META_FILE), "not a JSON object with the run's spec"
    for name in LOG_LAYOUT if on_disk else ():
        log = log_path(out_dir, name)
        try:
            with open(log, "rb") as f:
                why = _npy_problem(log, f, os.fstat(f.fileno()).st_size)
        except OSError as e:
            why = e.strerror or str(e)
        if why is not None:
            return log, why
    return None


@contextlib.contextmanager
def writing(what: str, where: str):
    """Turns an OSError while writing `what` into `where` into one line (a
    ValueError) naming `disk` for a full disk or quota, else `out`, the file
    and the fix. Files written through `atomic_write` are whole or not there:
    what was there before is kept."""
    try:
        yield
    except OSError as e:
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        why = f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")
        fix = "free some space" if full else "make it writable or choose another place"
        raise ValueError(f"{'disk' if full else 'out'}: cannot write {what} into {where!r}: {why}; the files already "
                         f"there are as they were; {fix} and run the command again") from None


def write_json(path: str, obj) -> None:
    """Writes `obj` as strict JSON (non-finite floats as null), atomically."""
    atomic_write(path, lambda f: json.dump(json_ready(obj), f, indent=1, allow_nan=False))
