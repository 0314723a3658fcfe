"""Control sweep results: every run's episodes, curves by episode and by step
with confidence intervals, the best setting by area under the curve, the summary
records, and save/load in the prediction results' files (`curves.npz`,
`summary.json`, `summary.csv`, `meta.json`).

Shapes: G grid points, N seeds, E logged episodes per run. A run whose weights
left the divergence bound is excluded from every statistic (its diverged_step is
>= 0); a run that ran out of steps before E episodes has zero lengths after its
last finished episode and is counted as incomplete.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import numpy as np

from bec_jax.control.grid import GridResult
from bec_jax.control.spec import KIND as CONTROL_KIND
from bec_jax.control.spec import ControlSpec
from bec_jax.files import (
    CURVES_FILE,
    GRID_PREFIX,
    finite_or_none,
    import_pandas,
    read_meta,
)
from bec_jax.stats import t_half_width_of, t_interval

STATS = ("length", "return")
# What is better for each statistic: fewer steps per episode, more return.
BETTER = {"length": "lower", "return": "higher"}
OPTIONAL = ("omega", "stopped_rung", "rung_scores")  # arrays of `curves.npz` a result may lack


def values_text(values: dict) -> str:
    """'slip=0.2, size=4': task-axis values as the reports name them."""
    return ", ".join(f"{n}={v:g}" for n, v in values.items())


@dataclass
class ControlResult(GridResult):
    """Everything one control sweep reports.

    Attributes:
      spec: the `ControlSpec` (None for a loaded result whose task or algorithm
        cannot be built here; `spec_dict` holds it always).
      grid: {column: (G,)} the hyperparameters of every point.
      returns, lengths: (G, N, E) return and length (steps) of each run's
        episodes, in order; 0 after a run's last finished episode.
      diverged_step: (G, N) the block end at which a run's weights left the
        bound (its state is frozen from the block's start), -1 if never.
      omega: (G, N) omega at the end of a run's last logged episode (the
        centered algorithms' estimate of the mean TD error, or reward
        centering's average reward; at its last step where it did not finish
        its episodes), or None.
      meta: timings, versions, machine and device.
      stopped_rung: (G,) a search's last rung each point ran (`engine.search`;
        rungs - 1 for the points that ran to their ends), None for a full
        sweep; a point stopped early keeps the episodes its runs finished by
        its last rung's end (returns NaN and lengths 0 after them) and is
        never `valid`.
      rung_scores: (G, rungs) a search's score of each point at each rung (its
        mean return, or steps negated, per episode so far: the spec's search
        metric; NaN where it was not scored), or None.
    """

    KIND = CONTROL_KIND  # the kind of sweep, as its spec's "kind" names it
    RUNS = "returns"  # (G, N, E): `GridResult`'s sizes

    spec: object
    grid: dict
    returns: np.ndarray
    lengths: np.ndarray
    diverged_step: np.ndarray
    omega: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    spec_dict: dict | None = None
    stopped_rung: np.ndarray | None = None
    rung_scores: np.ndarray | None = None

    # -- views (and `GridResult`'s: task, algorithm, num_points, seeds, point, select) ----------
    @property
    def episodes(self) -> int:
        return self.returns.shape[2]

    @property
    def episodes_done(self) -> np.ndarray:
        """(G, N) logged episodes of each run."""
        return (self.lengths > 0).sum(-1)

    @property
    def valid(self) -> np.ndarray:
        """(G, N) runs that did not diverge and logged every episode (of a
        search, at a point that ran every rung: a point stopped early is
        never chosen, its curves not drawn)."""
        ok = (self.diverged_step < 0) & (self.episodes_done == self.episodes)
        if self.stopped_rung is not None:
            ok &= (np.asarray(self.stopped_rung) == np.max(self.stopped_rung))[:, None]
        return ok

    @property
    def diverged_fraction(self) -> np.ndarray:
        """(G,) fraction of seeds whose weights left the bound."""
        return (self.diverged_step >= 0).mean(-1)

    def values(self, stat: str = "length") -> np.ndarray:
        """(G, N, E) the per-episode statistic: 'length' (steps per episode) or 'return'."""
        if stat not in STATS:
            raise ValueError(f"stat: must be one of {', '.join(STATS)}, got {stat!r}")
        return (self.lengths if stat == "length" else self.returns).astype(np.float64)

    def curve(self, i: int, stat: str = "length", level: float = 0.95):
        """(episode numbers 1..E, mean, low, high) of grid point i across its
        valid runs: the Student-t interval of the mean at each episode."""
        v = self.values(stat)[i][self.valid[i]]  # (n, E)
        n = v.shape[0]
        mean = v.mean(0) if n else np.full(self.episodes, np.nan)
        half = t_half_width_of(v, 0, level)
        return np.arange(1, self.episodes + 1), mean, mean - half, mean + half

    def curve_by_step(self, i: int, stat: str = "length", points: int = 200, level: float = 0.95):
        """(steps, mean, low, high) of grid point i: at each of `points` steps up
        to the shortest valid run, each run's statistic of the episode in
        progress there (an episode counts from its first step to its last)."""
        ok = self.valid[i]
        L = self.lengths[i][ok].astype(np.int64)
        v = self.values(stat)[i][ok]
        if not len(L):
            x = np.zeros(1)
            return x, np.full(1, np.nan), np.full(1, np.nan), np.full(1, np.nan)
        ends = np.cumsum(L, axis=1)  # (n, E) last step of each episode
        x = np.linspace(1, ends[:, -1].min(), points).astype(np.int64)
        idx = np.stack([np.searchsorted(e, x) for e in ends])  # episode in progress at step x
        y = np.take_along_axis(v, np.minimum(idx, self.episodes - 1), axis=1)
        mean = y.mean(0)
        half = t_half_width_of(y, 0, level)
        return x, mean, mean - half, mean + half

    def auc_seed(self, stat: str = "length") -> np.ndarray:
        """(G, N) each run's area under its curve by episode (the mean over its E
        episodes); NaN for runs that diverged or did not finish E episodes."""
        return np.where(self.valid, self.values(stat).mean(-1), np.nan)

    def final_seed(self, stat: str = "length", fraction: float = 0.1) -> np.ndarray:
        """(G, N) each run's mean over its last `fraction` of episodes (NaN for
        runs that are not valid)."""
        k = max(1, int(round(self.episodes * fraction)))
        return np.where(self.valid, self.values(stat)[..., -k:].mean(-1), np.nan)

    def auc(self, stat: str = "length") -> np.ndarray:
        """(G,) mean over seeds of the seeds' areas; NaN where any seed diverged or
        ran out of steps before its last episode (averaging the others would
        flatter the point: a point that fails a run is never 'best')."""
        a = self.auc_seed(stat)
        out = np.array([np.nanmean(r) if np.isfinite(r).any() else np.nan for r in a])
        return np.where(self.valid.all(-1), out, np.nan)

    def best_index(self, stat: str = "length", where: np.ndarray | None = None) -> int:
        """The grid point with the best area under the curve (fewest steps per
        episode, or most return), among points all of whose runs finished every
        episode without diverging (a point whose area is NaN, such as a
        search's point stopped early, is never chosen); `where` (G,) bool
        restricts the choice (e.g. to the points `select` finds)."""
        a = self.auc(stat)
        if where is not None:
            where = np.asarray(where, bool)
            if not where.any():
                raise ValueError("where: selects no grid point")
            a = np.where(where, a, np.nan)
        if not np.isfinite(a).any():
            raise ValueError(f"best: every grid point of {self.algorithm} on {self.task}"
                             f"{' that was selected' if where is not None else ''} has a run that diverged "
                             "or did not finish its episodes within max_steps")
        return int(np.nanargmin(a) if BETTER[stat] == "lower" else np.nanargmax(a))

    def take(self, mask: np.ndarray) -> ControlResult:
        """The result restricted to the grid points where `mask` (G,) is True
        (the same spec and meta)."""
        mask = np.asarray(mask, bool)
        return replace(self, grid={n: np.asarray(v)[mask] for n, v in self.grid.items()},
                                   returns=self.returns[mask], lengths=self.lengths[mask],
                                   diverged_step=self.diverged_step[mask],
                                   omega=None if self.omega is None else self.omega[mask],
                                   stopped_rung=None if self.stopped_rung is None else self.stopped_rung[mask],
                                   rung_scores=None if self.rung_scores is None else self.rung_scores[mask])

    def by_task_value(self) -> list[tuple[dict, ControlResult]]:
        """[(task values, the result at them)]: one entry per combination of
        the task axes' values (`ControlSpec.task_axes`), in grid order, or
        [({}, self)] without task axes. A task axis is not a setting to pick:
        the best setting is chosen at each of its values."""
        names = [n for n in (self.spec_dict or {}).get("task_axes") or {} if n in self.grid]
        if not names:
            return [({}, self)]
        combos = dict.fromkeys(tuple(float(self.grid[n][i]) for n in names) for i in range(self.num_points))
        return [(dict(zip(names, c)), self.take(self.select(**dict(zip(names, c))))) for c in combos]

    def ci(self, values: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """(low, high), each (G,): Student-t intervals of the mean of per-seed
        `values` (G, N) over their finite entries."""
        out = np.array([t_interval(v[np.isfinite(v)], level) for v in values])
        return out[:, 1], out[:, 2]

    def summary(self) -> list[dict]:
        """One record per grid point: task, algorithm, the grid columns, the area
        under the steps-per-episode curve and under the return curve (means over
        episodes) and the final values (last 10% of episodes), each with its 95%
        Student-t interval over seeds, the final omega, and the fractions of
        diverged and incomplete runs."""
        recs = []
        blocks = {}
        for stat in STATS:
            for kind, vals in (("auc", self.auc_seed(stat)), ("final", self.final_seed(stat))):
                lo, hi = self.ci(vals)
                mean = np.array([np.nanmean(r) if np.isfinite(r).any() else np.nan for r in vals])
                blocks[f"{kind}_{stat}"] = (mean, lo, hi)
        incomplete = ((self.diverged_step < 0) & (self.episodes_done < self.episodes)).mean(-1)
        for i in range(self.num_points):
            rec = {"task": self.task, "algorithm": self.algorithm, **self.point(i)}
            for name, (m, lo, hi) in blocks.items():
                rec[name] = finite_or_none(m[i])
                rec[f"{name}_ci_low"] = finite_or_none(lo[i])
                rec[f"{name}_ci_high"] = finite_or_none(hi[i])
            if self.omega is not None:
                om = self.omega[i][self.diverged_step[i] < 0]
                rec["omega_mean"] = finite_or_none(om.mean()) if om.size else None
            rec["diverged_fraction"] = float(self.diverged_fraction[i])
            rec["incomplete_fraction"] = float(incomplete[i])
            recs.append(rec)
        return recs

    def to_frame(self, level: float = 0.95):
        """A long-format pandas DataFrame: one row per grid point x statistic
        ('length', 'return') x episode, with the grid columns, task, algorithm,
        stat, episode, mean, the Student-t interval of the mean (ci_low,
        ci_high) and n, the valid runs it is over (see `curve`). Needs the
        optional pandas: pip install 'bec_jax[pandas]'."""
        pd = import_pandas()
        E = self.episodes
        frames = []
        for stat in STATS:
            for i in range(self.num_points):
                x, mean, lo, hi = self.curve(i, stat, level)
                cols = {n: np.repeat(v[i], E) for n, v in self.grid.items()}
                frames.append(pd.DataFrame({
                    "task": self.task, "algorithm": self.algorithm, **cols, "stat": stat, "episode": x,
                    "mean": mean, "ci_low": lo, "ci_high": hi, "n": int(self.valid[i].sum())}))
        return pd.concat(frames, ignore_index=True)

    # -- persistence -------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of `curves.npz`: returns, lengths, diverged_step, omega (if
        any), a search's stopped_rung and rung_scores, and the grid as
        `grid_<column>`."""
        out = {"returns": self.returns, "lengths": self.lengths, "diverged_step": self.diverged_step}
        for name in OPTIONAL:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        for n, v in self.grid.items():
            out[GRID_PREFIX + n] = v
        return out

    @classmethod
    def load(cls, out_dir: str) -> ControlResult:
        """Reads a result written by `save`."""
        spec, spec_dict, meta, columns = cls.read_meta(out_dir, ControlSpec)
        with np.load(os.path.join(out_dir, CURVES_FILE)) as z:
            return cls(spec=spec, grid=cls.read_grid(z, columns), returns=z["returns"],
                       lengths=z["lengths"], diverged_step=z["diverged_step"], meta=meta, spec_dict=spec_dict,
                       **{n: z[n] if n in z.files else None for n in OPTIONAL})


def is_control_dir(out_dir: str) -> bool:
    """Whether `out_dir` holds a saved control result."""
    spec = (read_meta(out_dir) or {}).get("spec")
    return isinstance(spec, dict) and spec.get("kind") == "control"
