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

import json
import os
from dataclasses import dataclass, field

import numpy as np

from bec_jax import files
from bec_jax.files import (
    CURVES_FILE,
    GRID_PREFIX,
    LOG_LAYOUT,
    LOGS_MARKER,
    META_FILE,
    SUMMARY_CSV,
    SUMMARY_FILE,
    atomic_write,
    copy_rows,
    csv_text,
    finite_or_none,
    import_pandas,
    log_path,
    map_logs,
    maps_file,
    open_log,
    write_json,
)
from bec_jax.prediction.spec import SweepSpec
from bec_jax.stats import t_half_width_from_se, t_interval, t_quantile
from bec_jax.theory import verdicts

# A summary carries each point's exact verdict up to this many grid points (a
# few milliseconds to a tenth of a second a point, once per model); larger grids
# give it for the best point (`plotting.summary_rows`, `bec-jax run`).
EXACT_SUMMARY_POINTS = 64
SEARCH_ARRAYS = ("stopped_rung", "rung_scores")  # a search's (`engine.search`), in curves.npz


def _label_requests(spec: SweepSpec, points: list, indices) -> list:
    """(model, algorithm, hyperparameters, sampler) of `verdicts.exact_label`
    for grid points `indices` of `spec` (`points`: their grid values)."""
    mdps = spec.point_mdps()
    names = spec.algorithm_def.names
    return [(mdps[i], spec.algorithm, {n: v for n, v in p.items() if n in names}, spec.sampler)
            for i, p in zip(indices, points)]


def exact_verdict_requests(spec: SweepSpec) -> list:
    """The `verdicts.exact_label` calls (model, algorithm, hyperparameters,
    sampler) that the summary of `spec`'s result will make
    (`SweepResult.summary`: a grid of at most `EXACT_SUMMARY_POINTS` points at
    constant step sizes), in grid order; [] when it will make none."""
    if spec.schedule.kind != "constant" or spec.num_points > EXACT_SUMMARY_POINTS:
        return []
    grid = spec.grid_arrays()
    points = [{n: (v[i].item() if isinstance(v[i], np.generic) else v[i]) for n, v in grid.items()}
              for i in range(spec.num_points)]
    return _label_requests(spec, points, range(spec.num_points))


def prefetch_summary(spec: SweepSpec, start=None):
    """Starts, in a background thread (`verdicts.Prefetch`), the work the
    summary of `spec`'s result will need that depends on the spec alone: the
    exact verdicts it will carry (`exact_verdict_requests`) and the Student-t
    quantile of its intervals (the first imports SciPy's special functions),
    once `start` (an event; None: at once) is set, e.g. when the sweep's
    program is traced (`engine.clock.traced_event`), to run while XLA
    compiles it and it runs. Returns the thread's handle,
    whose `close()` the caller calls once the summary is written."""
    calls = [(t_quantile, (max(spec.seeds - 1, 1), 0.95))]
    calls += [(verdicts.exact_label, req) for req in exact_verdict_requests(spec)]
    return verdicts.Prefetch(calls, start=start)


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
      stopped_rung: (G,) a search's last rung each point ran (`engine.search`;
        rungs - 1 for the points that ran every step), None for a full sweep.
        A point stopped early has NaN mean, std and sem and alive -1 at every
        logged step after its last rung, and NaN final values and areas
        (+inf for a seed that diverged before it stopped).
      rung_scores: (G, rungs) a search's score of each point at each rung it
        was ranked at: the area under its first metric's mean curve up to the
        rung's end (lower is better; +inf where a seed diverged, NaN where it
        was not ranked), or None.
    """

    KIND = "prediction"  # the kind of sweep (a control sweep's result is a `ControlResult`)

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
    stopped_rung: np.ndarray | None = None
    rung_scores: np.ndarray | None = None

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
        (e.g. to one gamma of a gamma sweep). A point whose AUC is NaN (a
        search's point stopped early, NaN after its last rung) is never chosen
        while another is left."""
        cand = np.ones(self.num_points, bool) if where is None else np.asarray(where, bool)
        if not cand.any():
            raise ValueError("where: selects no grid point")
        a = self.auc(metric)
        if (cand & ~np.isnan(a)).any():  # np.argmin would return the first NaN
            cand = cand & ~np.isnan(a)
        auc = np.where(cand, a, np.inf)
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
            auc_seed=None if self.auc_seed is None else self.auc_seed[:, mask],
            stopped_rung=None if self.stopped_rung is None else self.stopped_rung[mask],
            rung_scores=None if self.rung_scores is None else self.rung_scores[mask])

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

    def exact_verdicts(self, indices=None) -> list:
        """The exact mean-square verdict of each grid point (`indices`: which;
        default all): "stable in mean square", "mean stable, variance grows" or
        "diverges in mean" (`verdicts.mean_square_for` under the run's sampler,
        cached per model, algorithm and step sizes), None where there is no such
        analysis (step sizes on a schedule, a trace method, no spec here)."""
        idx = range(self.num_points) if indices is None else indices
        spec = self.spec
        if spec is None or spec.schedule.kind != "constant":
            return [None for _ in idx]
        return [verdicts.exact_label(*req) for req in _label_requests(spec, [self.point(i) for i in idx], idx)]

    def summary(self, metric: str | None = None) -> list[dict]:
        """One record per grid point: env, algorithm, the grid columns,
        final_mean, final_std (None, null in JSON, when every seed diverged: the
        error is unbounded), the 95% Student-t interval of the final error over
        the surviving seeds (final_ci_low, final_ci_high), auc (None when any
        seed diverged) with its interval over the seeds' own areas (auc_ci_low,
        auc_ci_high), diverged_fraction, and for a grid of at most
        `EXACT_SUMMARY_POINTS` points its `exact_verdict` (`exact_verdicts`)."""
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
                "final_mean": finite_or_none(fm),
                "final_std": finite_or_none(fs),
                "final_ci_low": finite_or_none(f_lo[i]), "final_ci_high": finite_or_none(f_hi[i]),
                "auc": finite_or_none(auc[i]),
            }
            if a_lo is not None:
                any_dead = self.diverged_fraction[i] > 0
                rec["auc_ci_low"] = None if any_dead else finite_or_none(a_lo[i])
                rec["auc_ci_high"] = None if any_dead else finite_or_none(a_hi[i])
            rec["diverged_fraction"] = float(self.diverged_fraction[i])
            recs.append(rec)
        if self.num_points <= EXACT_SUMMARY_POINTS:
            for rec, v in zip(recs, self.exact_verdicts()):
                rec["exact_verdict"] = v
        return recs

    def to_frame(self):
        """A long-format pandas DataFrame: one row per grid point x metric x logged
        step, with the grid columns, env, algorithm, metric, step, mean, std, sem,
        alive and the 95% Student-t interval of the mean (ci_low, ci_high; over the
        surviving seeds). Needs the optional pandas: pip install 'bec_jax[pandas]'."""
        pd = import_pandas()
        G, L = self.num_points, len(self.steps)
        cols = {n: np.repeat(v, L) for n, v in self.grid.items()}
        frames = []
        for m, name in enumerate(self.metrics):
            n = self.alive.astype(float)
            half = t_half_width_from_se(self.sem[m], n)
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
        `diverged_step`, and a search's `stopped_rung` and `rung_scores`; with
        `logs=False` not the logged arrays (steps, mean, std, sem, alive)."""
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
        for name in SEARCH_ARRAYS:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
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
            if maps_file(arr, path):
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
        as null. Logs larger than `files.LAZY_LOG_BYTES` (or already streamed
        into `out_dir`) go to `curves/*.npy` instead, which `load` memory-maps."""
        os.makedirs(out_dir, exist_ok=True)
        lazy = self.log_nbytes > files.LAZY_LOG_BYTES or maps_file(self.mean, log_path(out_dir, "mean"))
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
                mm = {n: map_logs(log_path(out_dir, n)) for n in LOG_LAYOUT}
                logs = dict(steps=mm["steps"], mean=np.moveaxis(mm["mean"], 0, 1), std=np.moveaxis(mm["std"], 0, 1),
                            sem=np.moveaxis(mm["sem"], 0, 1), alive=mm["alive"])
            else:
                logs = dict(steps=z["steps"], mean=stack("mean"), std=stack("std"), sem=stack("sem"),
                            alive=z["alive"])
            found = {n: z[n] for n in SEARCH_ARRAYS if n in z.files}
            return cls(spec=spec, grid=grid, **logs, final=stack("final"),
                       diverged_step=z["diverged_step"], meta=meta, spec_dict=spec_dict, auc_seed=auc_seed, **found)


def __getattr__(name: str):
    """`results.load_result` of 0.3, which reads a run of any kind: now
    `bec_jax.run.kinds.load_result` (the table of kinds sits above the fronts),
    warning once; the old names' table is `bec_jax.moved.MOVED_NAMES`, so this
    module imports nothing above it."""
    from bec_jax import moved
    return moved.attribute(__name__, name)
