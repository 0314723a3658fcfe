"""Continuing control sweep results: every run's reward per log block, its
reward rate over the whole run, the last 50% and the last 10% with 95%
Student-t intervals over seeds, learning curves, the best setting, the
learner's reward-rate estimate and value blow-up, and for tabular tasks the
exact optimal gain, the gap to it and the fraction of states where the final
greedy policy is optimal; save/load in the other fronts' files (`curves.npz`,
`summary.json`, `summary.csv`, `meta.json`).

Shapes: G grid points, N seeds, L log blocks of K steps (T = L K). The reward
logged is the task's own: the reward offset a learner sees is not in it.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from bec_jax.control.continuing import exact
from bec_jax.control.continuing.spec import KIND as CONTINUING_KIND
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.control.grid import GridResult
from bec_jax.files import (
    CURVES_FILE,
    GRID_PREFIX,
    finite_or_none,
)
from bec_jax.stats import t_half_width_of, t_interval

# A window of a run: the fraction of its last log blocks it covers.
WINDOWS = {"all": 1.0, "last50": 0.5, "last10": 0.1}
ARRAYS = ("reward", "rate_estimate", "max_abs_w")  # (G, N, L) each
OPTIONAL = ("q_table", "stopped_rung", "rung_scores")  # a tabular task's final Q; a search's rungs


@dataclass
class ContinuingResult(GridResult):
    """Everything one continuing sweep reports.

    Attributes:
      spec: the `ContinuingSpec` (None for a loaded result whose task or
        learner cannot be built here; `spec_dict` holds it always).
      grid: {column: (G,)} the settings of every point.
      reward: (G, N, L) each run's mean task reward per log block.
      rate_estimate: (G, N, L) the learner's reward-rate estimate (rbar, or
        omega) at each block's end; NaN for a learner without one.
      max_abs_w: (G, N, L) the largest |w| at each block's end (the value
        blow-up of discounted learners as gamma -> 1; inf or NaN once it
        overflowed).
      q_table: (G, N, S, A) the final action values, tabular tasks only.
      meta: timings, versions, machine and device.
      stopped_rung: (G,) a search's last rung each point ran (`engine.search`;
        rungs - 1 for the points that ran every step), None for a full sweep;
        a point stopped early has NaN in every log after its last rung.
      rung_scores: (G, rungs) a search's score of each point at each rung
        (its reward rate so far; NaN where it was not scored), or None.
      source: the run directory the result was saved to or loaded from (None
        before either), which messages about it name; not a field.
    """

    KIND = CONTINUING_KIND  # the kind of sweep, as its spec's "kind" names it
    RUNS = "reward"  # (G, N, L): `GridResult`'s sizes
    source: ClassVar[str | None] = None  # set on an instance by `save` and `load`

    spec: object
    grid: dict
    reward: np.ndarray
    rate_estimate: np.ndarray
    max_abs_w: np.ndarray
    q_table: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    spec_dict: dict | None = None
    stopped_rung: np.ndarray | None = None
    rung_scores: np.ndarray | None = None

    # -- views (and `GridResult`'s: task, algorithm, num_points, seeds, point, select) ----------
    @property
    def blocks(self) -> int:
        return self.reward.shape[2]

    @property
    def block_steps(self) -> int:
        """Steps per log block (K)."""
        return int(self.spec_dict["steps"]) // self.blocks

    def window_blocks(self, window: str) -> int:
        """The log blocks a window covers (`WINDOWS`)."""
        if window not in WINDOWS:
            raise ValueError(f"window: must be one of {', '.join(WINDOWS)}, got {window!r}")
        return max(1, int(round(self.blocks * WINDOWS[window])))

    def reward_rate(self, window: str = "all") -> np.ndarray:
        """(G, N) each run's reward rate (mean task reward per step) over the
        window: the whole run ("all"), its last 50% or its last 10%."""
        k = self.window_blocks(window)
        return self.reward[..., -k:].astype(np.float64).mean(-1)

    def rate_interval(self, window: str = "all", level: float = 0.95) -> tuple:
        """(mean, low, high), each (G,): the mean reward rate over seeds and its
        Student-t interval (`bec_jax.stats.t_interval`)."""
        out = np.array([t_interval(v, level) for v in self.reward_rate(window)]).reshape(-1, 3)
        return out[:, 0], out[:, 1], out[:, 2]

    def curve(self, i: int, level: float = 0.95) -> tuple:
        """(steps at each block's end, mean, low, high) of grid point i: the
        reward rate of each block averaged over seeds, with its t interval."""
        v = self.reward[i].astype(np.float64)
        mean = v.mean(0)
        half = t_half_width_of(v, 0, level)
        return np.arange(1, self.blocks + 1) * self.block_steps, mean, mean - half, mean + half

    def estimate_curve(self, i: int, level: float = 0.95) -> tuple:
        """(steps, mean, low, high) of the learner's reward-rate estimate at grid point i."""
        v = self.rate_estimate[i].astype(np.float64)
        mean = v.mean(0)
        half = t_half_width_of(v, 0, level)
        return np.arange(1, self.blocks + 1) * self.block_steps, mean, mean - half, mean + half

    def best_index(self, window: str = "all", where: np.ndarray | None = None) -> int:
        """The grid point with the highest mean reward rate over `window`
        (default the whole run, the area under the learning curve); `where`
        (G,) bool restricts the choice."""
        mean = self.reward_rate(window).mean(-1)
        if where is not None:
            where = np.asarray(where, bool)
            if not where.any():
                raise ValueError("where: selects no grid point")
            mean = np.where(where, mean, np.nan)
        if np.all(np.isnan(mean)):
            raise ValueError(self._no_best())
        return int(np.nanargmax(mean))

    def _no_best(self) -> str:
        """Why no grid point has a reward rate: the task's NaN rewards, named
        with the run (numpy's 'All-NaN slice encountered' names neither)."""
        runs = np.isnan(self.reward).any(-1)
        in_run = f" in {self.source}" if self.source else ""
        if runs.any():
            return (f"reward: the task {self.task} gave NaN rewards{in_run} ({int(runs.sum())} of {runs.size} runs, "
                    "at every grid point); no setting can be ranked; its step must give finite rewards")
        return f"where: no selected grid point{in_run} has a reward rate"

    # -- exact reference (tabular tasks) ------------------------------------------
    @functools.cached_property
    def optimal(self):
        """The task's exact `exact.Optimal` (gain, policy, h, q), or None for a
        task without a model, a sweep with task axes (each point's is
        `optimal_at`) or a loaded result whose task cannot be built."""
        if self.spec is None or self.spec.task_axes:
            return None
        return self.optimal_at(0)

    def optimal_at(self, i: int):
        """The exact `exact.Optimal` of grid point i's task (its task axes'
        values), or None as `optimal`; computed once per task."""
        if self.spec is None:
            return None
        point = self.spec.grid_points()[i]
        combo = tuple((n, point[n]) for n in self.spec.task_axes)
        if combo not in self._optima:
            task = self.spec.make_task(dict(combo))
            has_model = task.num_states > 0 and task.model is not None
            self._optima[combo] = exact.optimal(*task.model()) if has_model else None
        return self._optima[combo]

    @functools.cached_property
    def _optima(self) -> dict:
        return {}

    @property
    def optimal_gain(self) -> float | None:
        """The optimal average reward of a tabular task (None otherwise, and
        with task axes: see `optimal_at`)."""
        return None if self.optimal is None else float(self.optimal.gain)

    def greedy_optimal_fraction(self) -> np.ndarray | None:
        """(G, N) the fraction of states where each run's final greedy policy
        is optimal for its point's task (`exact.greedy_optimal_fraction`);
        None without a model."""
        if self.q_table is None or self.optimal_at(0) is None:
            return None
        return np.stack([np.asarray(exact.greedy_optimal_fraction(self.q_table[i], self.optimal_at(i)), np.float64)
                         for i in range(self.num_points)])

    # -- summary -----------------------------------------------------------------
    def summary(self) -> list[dict]:
        """One record per grid point: task, algorithm, the grid columns, the
        reward rate over the whole run, its last 50% and last 10% with 95%
        Student-t intervals over seeds, the learner's final reward-rate
        estimate, the largest |w| of any run, and for tabular tasks the
        optimal gain, the gap to it over the last 10% and the mean fraction
        of states whose final greedy action is optimal."""
        rates = {w: self.rate_interval(w) for w in WINDOWS}
        est = self.rate_estimate[..., -1].astype(np.float64)
        frac = self.greedy_optimal_fraction()
        recs = []
        for i in range(self.num_points):
            rec = {"task": self.task, "algorithm": self.algorithm, **self.point(i)}
            for w, (m, lo, hi) in rates.items():
                rec[f"reward_rate_{w}"] = finite_or_none(m[i])
                rec[f"reward_rate_{w}_ci_low"] = finite_or_none(lo[i])
                rec[f"reward_rate_{w}_ci_high"] = finite_or_none(hi[i])
            rec["rate_estimate_final"] = finite_or_none(est[i].mean()) if np.isfinite(est[i]).all() else None
            big = self.max_abs_w[i].astype(np.float64)
            rec["max_abs_w"] = float(np.nanmax(big)) if np.isfinite(big).all() else None
            rec["blown_up_fraction"] = float((~np.isfinite(big)).any(-1).mean())
            opt = self.optimal_at(i)
            gain = None if opt is None else float(opt.gain)
            if gain is not None:
                rec["optimal_gain"] = gain
                rec["gap_last10"] = finite_or_none(gain - rates["last10"][0][i])
            if frac is not None:
                rec["greedy_optimal_fraction"] = finite_or_none(frac[i].mean())
            recs.append(rec)
        return recs

    # -- persistence -------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of `curves.npz`: reward, rate_estimate, max_abs_w,
        q_table (tabular) and the grid as `grid_<column>`."""
        out = {name: getattr(self, name) for name in ARRAYS}
        for name in OPTIONAL:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        for n, v in self.grid.items():
            out[GRID_PREFIX + n] = v
        return out

    @classmethod
    def load(cls, out_dir: str) -> ContinuingResult:
        """Reads a result written by `save`."""
        spec, spec_dict, meta, columns = cls.read_meta(out_dir, ContinuingSpec)
        with np.load(os.path.join(out_dir, CURVES_FILE)) as z:
            r = cls(spec=spec, grid=cls.read_grid(z, columns), **{name: z[name] for name in ARRAYS},
                    meta=meta, spec_dict=spec_dict, **{n: z[n] if n in z.files else None for n in OPTIONAL})
        r.source = out_dir
        return r

    def save(self, out_dir: str) -> None:
        """`GridResult.save`, the result then naming `out_dir` as its run (`source`)."""
        self.source = out_dir
        super().save(out_dir)
