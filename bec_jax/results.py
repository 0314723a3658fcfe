"""Sweep results: the arrays a sweep reports, best-point choice, sensitivity,
the summary records, and save/load (`curves.npz` + JSON sidecars).

Shapes: G grid points, N seeds, L logged points (step 0 included), M metrics.
Statistics across seeds are taken over the seeds that have not diverged.

Divergence convention: the error of a diverged run is unbounded, so it is +inf,
never NaN. Where every seed of a grid point has diverged, the point's mean, std
and sem are +inf from that logged step on, and a diverged seed's `final` value is
+inf. JSON has no infinity: `summary.json` writes null there (`final_mean` and
`final_std` null when every seed diverged, `auc` null when any did). A NaN in a
saved statistic therefore never means "diverged"; `sweep.run` warns if one appears.
"""
from __future__ import annotations

import errno
import functools
import json
import math
import os
import tempfile
from dataclasses import dataclass, field

import numpy as np

CURVES_FILE = "curves.npz"
SUMMARY_FILE = "summary.json"
SUMMARY_CSV = "summary.csv"
META_FILE = "meta.json"
STUDY_FILE = "study.json"
GRID_PREFIX = "grid_"
LOGS_DIR = "curves"        # a large result's logs, one .npy each, read memory-mapped
LOGS_MARKER = "logs_on_disk"
LOG_LAYOUT = {"steps": "(L,)", "mean": "(G, M, L)", "std": "(G, M, L)", "sem": "(G, M, L)", "alive": "(G, L)"}


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
        return _map_logs(self.filename)


def _map_logs(path: str) -> np.memmap:
    """`np.load(path, mmap_mode="r")`; a mapping the address-space limit
    refuses is one line (`ValueError` naming the logs) instead of OSError."""
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, MemoryError) as e:
        if isinstance(e, OSError) and e.errno != errno.ENOMEM:
            raise
        from bec_jax import memory
        raise ValueError(f"logs: cannot map {path!r} ({memory.human(os.path.getsize(path))}) into memory: "
                         f"{memory.address_space_note()}; raise the limit (ulimit -v), or read the result "
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


def _in_file(arr, path: str) -> bool:
    return isinstance(arr, np.memmap) and getattr(arr, "filename", None) is not None and \
        os.path.abspath(arr.filename) == os.path.abspath(path)


def _finite(x):
    return None if x is None or not np.isfinite(x) else float(x)


def _t_quantile(df, level: float = 0.95):
    """The two-sided Student-t quantile for `df` degrees of freedom (NaN where df < 1).

    `scipy.special.stdtrit`, the function `scipy.stats.t.ppf` evaluates, without
    importing `scipy.stats` (a third of a second) or its argument checks; one
    value per degree of freedom is remembered (a sweep's summary asks for the
    same few values thousands of times)."""
    df = np.asarray(df, float)
    if df.ndim == 0:
        return np.float64(_t_quantile_of(float(df), float(level)) if df >= 1 else np.nan)
    from scipy import special
    with np.errstate(invalid="ignore"):
        return np.where(df >= 1, special.stdtrit(np.maximum(df, 1), 0.5 + level / 2), np.nan)


@functools.lru_cache(maxsize=1024)
def _t_quantile_of(df: float, level: float) -> float:
    from scipy import special
    return float(special.stdtrit(df, 0.5 + level / 2))


def t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t confidence interval of the mean of
    `values` (a 1-D sample); NaN bounds for fewer than two values."""
    v = np.asarray(values, float)
    n = v.size
    if n == 0:
        return np.nan, np.nan, np.nan
    mean = float(v.mean())
    if n < 2:
        return mean, np.nan, np.nan
    half = float(_t_quantile(n - 1, level) * v.std(ddof=1) / np.sqrt(n))
    return mean, mean - half, mean + half


def _pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError("pandas is an optional extra of bec_jax: pip install 'bec_jax[pandas]' "
                          "(or pip install pandas)") from None
    return pandas


def load_frame(path: str):
    """A long-format pandas DataFrame of a run directory, or of every sweep of a
    study directory (with a `sweep` column): see `SweepResult.to_frame`."""
    pd = _pandas()
    if os.path.isfile(os.path.join(path, STUDY_FILE)):
        from bec_jax import study
        frames = []
        for name, d in study.sweep_dirs(path).items():
            frame = SweepResult.load(d).to_frame()
            frame.insert(0, "sweep", name)
            frames.append(frame)
        if not frames:
            raise ValueError(f"path: the study in {path!r} has no finished sweep yet")
        return pd.concat(frames, ignore_index=True)
    return SweepResult.load(path).to_frame()


@dataclass
class SweepResult:
    """Everything one sweep reports.

    Attributes:
      spec: the `SweepSpec` that produced it (None for a loaded result whose
        environment or algorithm cannot be imported here; `spec_dict` always holds it).
      steps: (L,) the step of each logged point (0, log_every, ..., steps).
      grid: {column: (G,) array}: the environment parameters the spec gives and
        every hyperparameter of the algorithm (`result.alpha` reads a column too).
      mean, std, sem: (M, G, L) mean, standard deviation (ddof=0) and standard
        error (ddof=1) across surviving seeds; +inf where no seed survives
        (alive == 0), never NaN.
      alive: (G, L) number of seeds not yet diverged at each logged point.
      final: (M, G, N) per-seed final metric values, +inf for diverged seeds.
      diverged_step: (G, N) when a seed's parameters stopped being finite or
        passed the divergence bound: the last step of the log block in which it
        happened (so a multiple of `log_every`; the state is frozen at the
        block's start from then on); -1 if never.
      meta: timings, versions, machine and device, as recorded by the run.
      spec_dict: the spec as a JSON-ready dict.
      auc_seed: (M, G, N) each seed's area under its own curve (the mean over
        the logged points), +inf for diverged seeds; None for results saved
        before it was recorded.
    """

    spec: object
    steps: np.ndarray
    grid: dict
    mean: np.ndarray
    std: np.ndarray
    sem: np.ndarray
    alive: np.ndarray
    final: np.ndarray
    diverged_step: np.ndarray
    meta: dict = field(default_factory=dict)
    spec_dict: dict | None = None
    auc_seed: np.ndarray | None = None

    def __post_init__(self):
        if self.spec_dict is None and self.spec is not None:
            self.spec_dict = self.spec.to_dict()

    def __getattr__(self, name):
        # result.alpha, result.gamma: a grid column.
        grid = self.__dict__.get("grid")
        if grid is not None and name in grid:
            return grid[name]
        raise AttributeError(name)

    # -- views -------------------------------------------------------------------
    @property
    def metrics(self) -> tuple:
        return tuple(self.spec_dict["metrics"])

    @property
    def env(self) -> str:
        return self.spec_dict["env"]

    @property
    def algorithm(self) -> str:
        return self.spec_dict["algorithm"]

    @property
    def seeds(self) -> int:
        return int(self.spec_dict["seeds"])

    @property
    def num_points(self) -> int:
        return int(self.mean.shape[1])

    def _m(self, metric: str | None) -> int:
        if metric is None:
            return 0
        if metric not in self.metrics:
            raise ValueError(f"metric: {metric!r} was not computed; available: {', '.join(self.metrics)}")
        return self.metrics.index(metric)

    def curve(self, point: int, metric: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) learning curve of one grid point."""
        m = self._m(metric)
        return self.mean[m, point], self.std[m, point]

    def point(self, i: int) -> dict:
        """The grid values of point i, {column: value}."""
        out = {}
        for n, v in self.grid.items():
            x = v[i]
            out[n] = x.item() if isinstance(x, np.generic) else x
        return out

    @property
    def diverged_fraction(self) -> np.ndarray:
        """(G,) fraction of seeds that diverged by the last step."""
        return (self.diverged_step >= 0).mean(axis=1)

    def auc(self, metric: str | None = None) -> np.ndarray:
        """(G,) area under the mean error curve, as the mean over logged points
        (step 0 included); +inf where any seed diverged."""
        a = self.mean[self._m(metric)].mean(axis=1)
        return np.where(self.diverged_fraction > 0, np.inf, a)

    def best_index(self, metric: str | None = None, where: np.ndarray | None = None) -> int:
        """The grid point with the lowest AUC among those with no diverged seed
        (the gradient-TD literature's convention); ties go to the lowest index.
        If every point has a diverged seed: the lowest diverged fraction, then the
        lowest AUC over surviving seeds. `where` (G,) bool restricts the choice
        (e.g. to one gamma of a gamma sweep)."""
        cand = np.ones(self.num_points, bool) if where is None else np.asarray(where, bool)
        if not cand.any():
            raise ValueError("where: selects no grid point")
        auc = np.where(cand, self.auc(metric), np.inf)
        if np.isfinite(auc).any():
            return int(np.argmin(auc))  # argmin returns the first minimum
        raw = np.where(cand, np.nan_to_num(self.mean[self._m(metric)].mean(axis=1), nan=np.inf), np.inf)
        frac = np.where(cand, self.diverged_fraction, np.inf)
        order = np.lexsort((np.arange(self.num_points), raw, frac))
        return int(order[0])

    def final_mean(self, metric: str | None = None) -> np.ndarray:
        """(G,) mean metric at the last logged step over surviving seeds (+inf if none)."""
        return self.mean[self._m(metric), :, -1]

    def select(self, **values) -> np.ndarray:
        """(G,) True where every given grid column equals the given value."""
        mask = np.ones(self.num_points, bool)
        for n, v in values.items():
            if n not in self.grid:
                raise ValueError(f"{n}: not a grid column; columns: {', '.join(self.grid)}")
            col = self.grid[n]
            mask &= np.isclose(col, v) if col.dtype.kind == "f" else (col == v)
        return mask

    def subset(self, mask) -> "SweepResult":
        """The result restricted to the grid points where `mask` (G,) is True (e.g.
        `r.subset(r.select(features="tabular"))`); `meta["subset_of"]` keeps the
        original grid size. The spec is the whole sweep's."""
        mask = np.asarray(mask, bool)
        if mask.shape != (self.num_points,) or not mask.any():
            raise ValueError(f"mask: expected a (G,) = ({self.num_points},) boolean array selecting some points")
        return SweepResult(
            spec=self.spec, steps=self.steps, grid={n: v[mask] for n, v in self.grid.items()},
            mean=self.mean[:, mask], std=self.std[:, mask], sem=self.sem[:, mask], alive=self.alive[mask],
            final=self.final[:, mask], diverged_step=self.diverged_step[mask],
            meta=dict(self.meta, subset_of=self.num_points), spec_dict=self.spec_dict,
            auc_seed=None if self.auc_seed is None else self.auc_seed[:, mask])

    def sensitivity(self, over: str = "alpha", *, stat: str = "final", metric: str | None = None,
                    fixed: dict | None = None) -> dict:
        """Error against one grid column, for sensitivity plots.

        Args:
          over: the column on the x-axis (a hyperparameter or environment parameter).
          stat: "final" (mean error at the last step) or "auc" (mean over the run).
          fixed: optional {column: value} restricting the other columns. Without
            it, for each x value the best over the other columns is taken.

        Returns a dict with "x" (sorted values), "y" (error; +inf where every seed
        diverged), "diverged" (fraction of seeds diverged at the chosen point)
        and "index" (the grid point used for each x).
        """
        if over not in self.grid or self.grid[over].dtype.kind != "f":
            raise ValueError(f"over: {over!r} is not a numeric grid column of this sweep; "
                             f"columns: {', '.join(self.grid)}")
        if stat not in ("final", "auc"):
            raise ValueError(f"stat: must be 'final' or 'auc', got {stat!r}")
        m = self._m(metric)
        vals = self.mean[m, :, -1] if stat == "final" else self.mean[m].mean(axis=1)
        mask = self.select(**(fixed or {}))
        xs = self.grid[over]
        out = {"x": [], "y": [], "diverged": [], "index": []}
        for x in np.unique(xs[mask]):
            idx = np.flatnonzero(mask & (xs == x))
            # Prefer points without divergence, then lower error.
            key = np.lexsort((np.nan_to_num(vals[idx], nan=np.inf), self.diverged_fraction[idx]))
            i = int(idx[key[0]])
            out["x"].append(float(x))
            out["y"].append(float(vals[i]))
            out["diverged"].append(float(self.diverged_fraction[i]))
            out["index"].append(i)
        return {k: np.asarray(v) for k, v in out.items()}

    def ci(self, stat: str = "final", metric: str | None = None, level: float = 0.95) -> tuple:
        """(low, high), each (G,): the Student-t confidence interval of the mean
        over the surviving seeds of each seed's final error (`stat="final"`) or
        area under its curve (`stat="auc"`, needs `auc_seed`). NaN where fewer
        than two seeds survive."""
        if stat not in ("final", "auc"):
            raise ValueError(f"stat: must be 'final' or 'auc', got {stat!r}")
        if stat == "auc" and self.auc_seed is None:
            raise ValueError("stat: this result has no per-seed areas (saved before they were recorded)")
        values = (self.final if stat == "final" else self.auc_seed)[self._m(metric)]
        out = np.array([t_interval(v[np.isfinite(v)], level) for v in values])
        return out[:, 1], out[:, 2]

    def summary(self, metric: str | None = None) -> list[dict]:
        """One record per grid point: env, algorithm, the grid columns,
        final_mean, final_std (None, null in JSON, when every seed diverged: the
        error is unbounded), the 95% Student-t interval of the final error over
        the surviving seeds (final_ci_low, final_ci_high), auc (None when any
        seed diverged) with its interval over the seeds' own areas (auc_ci_low,
        auc_ci_high), and diverged_fraction."""
        m = self._m(metric)
        auc = self.auc(metric)
        f_lo, f_hi = self.ci("final", metric)
        a_lo, a_hi = self.ci("auc", metric) if self.auc_seed is not None else (None, None)
        recs = []
        for i in range(self.num_points):
            fm, fs = self.mean[m, i, -1], self.std[m, i, -1]
            rec = {
                "env": self.env,
                "algorithm": self.algorithm,
                **self.point(i),
                "final_mean": _finite(fm),
                "final_std": _finite(fs),
                "final_ci_low": _finite(f_lo[i]), "final_ci_high": _finite(f_hi[i]),
                "auc": _finite(auc[i]),
            }
            if a_lo is not None:
                any_dead = self.diverged_fraction[i] > 0
                rec["auc_ci_low"] = None if any_dead else _finite(a_lo[i])
                rec["auc_ci_high"] = None if any_dead else _finite(a_hi[i])
            rec["diverged_fraction"] = float(self.diverged_fraction[i])
            recs.append(rec)
        return recs

    def to_frame(self):
        """A long-format pandas DataFrame: one row per grid point x metric x logged
        step, with the grid columns, env, algorithm, metric, step, mean, std, sem,
        alive and the 95% Student-t interval of the mean (ci_low, ci_high; over the
        surviving seeds). Needs the optional pandas: pip install 'bec_jax[pandas]'."""
        pd = _pandas()
        G, L = self.num_points, len(self.steps)
        cols = {n: np.repeat(v, L) for n, v in self.grid.items()}
        frames = []
        for m, name in enumerate(self.metrics):
            n = self.alive.astype(float)
            half = _t_quantile(n - 1) * self.sem[m]
            frames.append(pd.DataFrame({
                "env": self.env, "algorithm": self.algorithm, **cols, "metric": name,
                "step": np.tile(self.steps, G), "mean": self.mean[m].ravel(), "std": self.std[m].ravel(),
                "sem": self.sem[m].ravel(), "alive": self.alive.ravel(),
                "ci_low": (self.mean[m] - half).ravel(), "ci_high": (self.mean[m] + half).ravel()}))
        return pd.concat(frames, ignore_index=True)

    # -- persistence -------------------------------------------------------------
    def arrays(self, logs: bool = True) -> dict[str, np.ndarray]:
        """The arrays written to `curves.npz`: `steps` (L,), `mean`/`std`/`sem`
        (G, L) for the first metric, the same per metric as `mean_<metric>` etc.,
        the grid as `grid_<column>` (G,), `alive`, `final_<metric>` and
        `diverged_step`; with `logs=False` not the logged arrays (steps, mean,
        std, sem, alive)."""
        out = {"steps": self.steps, "mean": self.mean[0], "std": self.std[0], "sem": self.sem[0],
               "alive": self.alive} if logs else {}
        out["diverged_step"] = self.diverged_step
        for n, v in self.grid.items():
            out[GRID_PREFIX + n] = v
        for i, name in enumerate(self.metrics):
            if logs:
                out[f"mean_{name}"] = self.mean[i]
                out[f"std_{name}"] = self.std[i]
                out[f"sem_{name}"] = self.sem[i]
            out[f"final_{name}"] = self.final[i]
            if self.auc_seed is not None:
                out[f"auc_seed_{name}"] = self.auc_seed[i]
        return out

    @property
    def log_nbytes(self) -> int:
        """Bytes of the logged arrays (mean, std, sem, alive, steps)."""
        return int(sum(a.size * a.itemsize for a in (self.mean, self.std, self.sem, self.alive, self.steps)))

    def _save_logs(self, out_dir: str) -> None:
        """The logs as `curves/<name>.npy` (see `LOG_LAYOUT`), copied in slabs of
        log points unless they already are those files (a streamed run's)."""
        views = {"steps": self.steps, "mean": np.moveaxis(self.mean, 0, 1), "std": np.moveaxis(self.std, 0, 1),
                 "sem": np.moveaxis(self.sem, 0, 1), "alive": self.alive}
        for name, arr in views.items():
            path = log_path(out_dir, name)
            if _in_file(arr, path):
                arr.flush()
                continue
            dst = open_log(out_dir, name, arr.shape, arr.dtype)
            copy_rows(dst, slice(None), arr)
            dst.flush()
            del dst

    def save(self, out_dir: str) -> None:
        """Writes `curves.npz`, `summary.json` and `meta.json` (spec, versions,
        machine, device, timings) into `out_dir`, each atomically (temporary file
        + rename). The JSON files are strict JSON: a non-finite number is written
        as null. Logs larger than `memory.LAZY_LOG_BYTES` (or already streamed
        into `out_dir`) go to `curves/*.npy` instead, which `load` memory-maps."""
        from bec_jax.memory import LAZY_LOG_BYTES
        os.makedirs(out_dir, exist_ok=True)
        lazy = self.log_nbytes > LAZY_LOG_BYTES or _in_file(self.mean, log_path(out_dir, "mean"))
        arrays = self.arrays(logs=not lazy)
        if lazy:
            self._save_logs(out_dir)
            arrays[LOGS_MARKER] = np.array(True)
        atomic_write(os.path.join(out_dir, CURVES_FILE), lambda f: np.savez(f, **arrays), binary=True)
        recs = self.summary()
        write_json(os.path.join(out_dir, SUMMARY_FILE), recs)
        atomic_write(os.path.join(out_dir, SUMMARY_CSV), lambda f: f.write(csv_text(recs)))
        write_json(os.path.join(out_dir, META_FILE),
                   dict(self.meta, spec=self.spec_dict, grid_columns=list(self.grid)))

    @classmethod
    def load(cls, out_dir: str) -> "SweepResult":
        """Reads a result written by `save`. The spec is rebuilt when its
        environment and algorithm can be resolved here; otherwise `spec` is None
        and `spec_dict` still holds it. Logs on disk (`curves/`) are memory-mapped,
        which takes address space for all of them: where `ulimit -v` refuses
        that, `ValueError` naming the logs and the limit."""
        from bec_jax.spec import SweepSpec
        with open(os.path.join(out_dir, META_FILE)) as f:
            meta = json.load(f)
        spec_dict = meta.pop("spec")
        columns = meta.pop("grid_columns", None)
        try:
            spec = SweepSpec.from_dict(spec_dict)
        except ValueError:
            spec = None
        metrics = spec_dict["metrics"]
        with np.load(os.path.join(out_dir, CURVES_FILE)) as z:
            stack = lambda pre: np.stack([z[f"{pre}_{m}"] for m in metrics])
            if columns is None:
                columns = [k[len(GRID_PREFIX):] for k in z.files if k.startswith(GRID_PREFIX)]
            grid = {n: z[GRID_PREFIX + n] for n in columns}
            auc_seed = stack("auc_seed") if all(f"auc_seed_{m}" in z.files for m in metrics) else None
            if LOGS_MARKER in z.files:  # memory-mapped: a long run's logs are never read whole
                mm = {n: _map_logs(log_path(out_dir, n)) for n in LOG_LAYOUT}
                logs = dict(steps=mm["steps"], mean=np.moveaxis(mm["mean"], 0, 1), std=np.moveaxis(mm["std"], 0, 1),
                            sem=np.moveaxis(mm["sem"], 0, 1), alive=mm["alive"])
            else:
                logs = dict(steps=z["steps"], mean=stack("mean"), std=stack("std"), sem=stack("sem"),
                            alive=z["alive"])
            return cls(spec=spec, grid=grid, **logs, final=stack("final"),
                       diverged_step=z["diverged_step"], meta=meta, spec_dict=spec_dict, auc_seed=auc_seed)


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
    import csv
    import io
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def read_meta(out_dir: str) -> dict | None:
    """`out_dir`/meta.json as a dict, or None when it is missing or not a JSON object."""
    try:
        with open(os.path.join(out_dir, META_FILE)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def write_json(path: str, obj) -> None:
    """Writes `obj` as strict JSON (non-finite floats as null), atomically."""
    atomic_write(path, lambda f: json.dump(json_ready(obj), f, indent=1, allow_nan=False))
