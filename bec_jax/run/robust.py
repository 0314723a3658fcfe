"""Robust statistics of saved runs, computed by rliable (Agarwal et al., *Deep
Reinforcement Learning at the Edge of the Statistical Precipice*, NeurIPS
2021): the interquartile mean (or mean, or median) of per-seed scores with
stratified bootstrap confidence intervals, performance profiles and the
probability of improvement across tasks.

A run's scores are its seeds' scores at its chosen setting (the best, or the
best of the points `select` names): `kinds.Scores.seed_scores`, the area
under each seed's own curve (prediction: of an error metric, lower is
better; control: the mean return per episode; continuing: the reward rate).
Where a kind keeps each seed's curve (control, continuing), the statistic is
also drawn along the curve with its bootstrap band.

Across tasks (`by_algorithm`), each run is one (algorithm, task) cell of a
(runs x tasks) matrix per algorithm, oriented so that higher is better (an
error is negated) and min-max normalized per task over every algorithm's runs
(0: the worst run on that task, 1: the best): tasks of different scales then
share one axis, as rliable's profiles and aggregates need.

rliable draws its bootstrap resamples from NumPy's global random state (its
`random_state` argument does not reach them: two calls with `RandomState(1)`
differ); each call here seeds the global state (`seed`) and restores it after,
so the same call gives the same numbers and leaves the caller's random state as
it was.

    table = robust.by_algorithm(results)                 # {"cq": (10, 4), "q": (10, 4)}
    robust.interval_estimates(table.scores, "iqm")      # {"cq": (iqm, low, high), ...}
    robust.improvement(table.scores)                    # {("cq", "q"): (P(cq > q), low, high), ...}
"""
from __future__ import annotations

import contextlib
import importlib
import itertools
import math
import warnings
from typing import NamedTuple

import numpy as np

from bec_jax.files import finite_or_none
from bec_jax.run import kinds

STATS = ("iqm", "mean", "median")
REPS = 2000          # bootstrap resamples (rliable's default of 50000 takes minutes on a curve)
MAX_REPS = 100_000   # twice rliable's default; each resample costs time on every curve point
LEVEL = 0.95
CURVE_POINTS = 25    # points of a curve the bootstrap band is computed at (evenly spread)
PROFILE_TAUS = 51    # thresholds of a performance profile on [0, 1]
_NAMES = {"iqm": "IQM", "mean": "mean", "median": "median"}


def require():
    """(rliable.library, rliable.metrics); `ValueError` naming `stat` with the
    `pip install` that brings rliable, or why it does not import here."""
    try:
        return importlib.import_module("rliable.library"), importlib.import_module("rliable.metrics")
    except ModuleNotFoundError:
        raise ValueError("stat: robust statistics need rliable: pip install 'bec_jax[stats]'") from None
    except (ImportError, TypeError, AttributeError) as e:  # arch, rliable's bootstrap, under pandas 3
        raise ValueError(f"stat: rliable does not import here ({type(e).__name__}: {str(e).splitlines()[0]}); "
                         "pip install 'bec_jax[stats]' brings versions that work together") from None


def check_stat(stat) -> str:
    """`stat` if it is one of `STATS`; `ValueError` naming `stat` otherwise."""
    if stat not in STATS:
        raise ValueError(f"stat: must be one of {', '.join(STATS)}, got {stat!r}")
    return stat


def stat_name(stat: str) -> str:
    """'IQM', 'mean' or 'median'."""
    return _NAMES[check_stat(stat)]


def aggregate(stat: str, over: str = "tasks"):
    """The aggregate of a (runs x tasks) score matrix for `stat`, as a function
    returning a 1-element array (the form `get_interval_estimates` takes):
    rliable's `aggregate_iqm`, `aggregate_mean` or `aggregate_median`. Over the
    seeds of one run (`over="seeds"`), the median is the median of the seeds'
    scores: rliable's is the median over tasks of each task's mean, which on
    one task is the mean."""
    _, metrics = require()
    if over not in ("tasks", "seeds"):
        raise ValueError(f"over: must be tasks or seeds, got {over!r}")
    if check_stat(stat) == "median" and over == "seeds":
        return lambda scores: np.array([np.median(scores)])
    f = {"iqm": metrics.aggregate_iqm, "mean": metrics.aggregate_mean, "median": metrics.aggregate_median}[stat]
    return lambda scores: np.array([f(scores)])


@contextlib.contextmanager
def seeded(seed: int):
    """NumPy's global random state seeded with `seed`, restored on leaving:
    rliable's bootstraps draw from it (`np.random.choice`)."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # arch's notes on its own future defaults
            yield
    finally:
        np.random.set_state(state)


def check_reps(reps) -> int:
    """`reps` if it is an integer from 10 to MAX_REPS; `ValueError` naming `reps` otherwise."""
    if not isinstance(reps, int) or isinstance(reps, bool) or not 10 <= reps <= MAX_REPS:
        raise ValueError(f"reps: expected an integer from 10 to {MAX_REPS} (bootstrap resamples), got {reps!r}")
    return reps


def interval_estimates(score_dict: dict, stat: str = "iqm", reps: int = REPS, seed: int = 0,
                       over: str = "tasks") -> dict:
    """{label: (point, low, high)}: rliable's `get_interval_estimates` of the
    `stat` (`aggregate(stat, over)`) of each (runs x tasks) matrix, its 95%
    stratified bootstrap interval. One run (one seed) gives no interval: its
    resamples are all the same run, so low and high are NaN, not the point."""
    library, _ = require()
    f = aggregate(stat, over)
    with seeded(seed):
        point, ci = library.get_interval_estimates(score_dict, f, reps=check_reps(reps),
                                                   confidence_interval_size=LEVEL)
    one = {k for k, v in score_dict.items() if np.shape(v)[0] < 2}
    return {k: (float(point[k][0]), *((math.nan, math.nan) if k in one else (float(ci[k][0, 0]), float(ci[k][1, 0]))))
            for k in score_dict}


# ------------------------------------------------------------------ one run at a time

def _chosen(results: dict, metric, select) -> tuple:
    """({key: grid point}, metric) of results of one kind (`ValueError` naming `dirs` otherwise)."""
    kinds_seen = {r.KIND for r in results.values()}
    if len(kinds_seen) > 1:
        raise ValueError(f"dirs: robust statistics compare runs of one kind, got {', '.join(sorted(kinds_seen))}")
    kind = kinds.of_result(next(iter(results.values())))
    metric = kind.figures.check_metric(results, metric)
    return kind.scores.chosen(results, metric, select), metric


def chosen_metric(results: dict, metric=None):
    """The metric the runs (one kind) are scored by: `metric`, or their kind's default."""
    return _chosen(results, metric, None)[1]


def run_scores(results: dict, metric=None, select: dict | None = None) -> dict:
    """{key: (N,) float64}: each run's seeds' scores at its chosen setting;
    `ValueError` naming `dirs` where a seed's score is not finite (a diverged
    or unfinished run: its score would be +inf or missing)."""
    points, metric = _chosen(results, metric, select)
    out = {}
    for key, r in results.items():
        s = np.asarray(kinds.of_result(r).scores.seed_scores(r, points[key], metric), np.float64)
        bad = int((~np.isfinite(s)).sum())
        if bad:
            raise ValueError(f"dirs: {bad} of {len(s)} seeds of {key!r} diverged or did not finish at its chosen "
                             f"setting {r.point(points[key])}; robust statistics need every seed's score "
                             "(--select another setting)")
        out[key] = s
    return out


def higher_is_better(results: dict, metric=None) -> bool:
    """Whether a larger score is better for these runs (one kind)."""
    _, metric = _chosen(results, metric, None)
    return bool(kinds.of_result(next(iter(results.values()))).scores.higher_is_better(metric))


def _along(stat: str):
    """The `stat` over seeds at every point of a (runs x 1 x points) cube, all
    points at once, as `aggregate(stat, "seeds")` gives it at each point: the
    IQM is scipy's 25% `trim_mean` (rliable's `aggregate_iqm`), here the mean
    of the sorted values between the same cuts, in one call per resample
    instead of one scipy call per point (a bootstrap repeats it thousands of times)."""
    check_stat(stat)

    def iqm(s):
        v = np.sort(s.reshape(-1, s.shape[-1]), axis=0)
        cut = int(0.25 * v.shape[0])  # scipy's trim_mean: int(proportiontocut * nobs) from each end
        return v[cut:v.shape[0] - cut].mean(axis=0)

    if stat == "iqm":
        return iqm
    if stat == "median":
        return lambda s: np.median(s.reshape(-1, s.shape[-1]), axis=0)
    return lambda s: s.reshape(-1, s.shape[-1]).mean(axis=0)


def curve_estimates(results: dict, stat: str = "iqm", metric=None, select: dict | None = None, reps: int = REPS,
                    seed: int = 0, points: int = CURVE_POINTS) -> dict | None:
    """{key: (x, point, low, high)}: the `stat` over seeds of each run's
    per-seed curve at its chosen setting, at `points` evenly spread x, with
    rliable's 95% bootstrap band; None when a run keeps no per-seed curves
    (prediction). `ValueError` naming `dirs` for a curve with a failed seed."""
    library, _ = require()
    chosen, metric = _chosen(results, metric, select)
    f = _along(stat)
    out = {}
    for key, r in results.items():
        got = kinds.of_result(r).scores.seed_curves(r, chosen[key], metric)
        if got is None:
            return None
        x, v = np.asarray(got[0]), np.asarray(got[1], np.float64)
        if not np.isfinite(v).all():
            raise ValueError(f"dirs: a seed of {key!r} diverged or did not finish at its chosen setting; robust "
                             "curves need every seed's curve (--select another setting)")
        at = np.unique(np.linspace(0, len(x) - 1, min(points, len(x))).round().astype(int))
        cube = v[:, None, at]  # (runs, 1 task, points)
        with seeded(seed):
            p, ci = library.get_interval_estimates(
                {key: cube}, f, reps=check_reps(reps), confidence_interval_size=LEVEL)
        band = (ci[key][0], ci[key][1]) if len(v) > 1 else (np.full(len(at), np.nan),) * 2  # one seed: no band
        out[key] = (x[at], p[key], *band)
    return out


# ------------------------------------------------------------------ across tasks

class Table(NamedTuple):
    """Per-seed scores arranged for rliable: `scores` {algorithm: (runs x
    tasks)}, oriented (higher is better) and min-max normalized per task;
    `raw` the same before normalization, in the runs' own units; `tasks` the
    columns; `negated`: the scores were errors (lower is better) and are
    negated in `scores`."""

    scores: dict
    raw: dict
    tasks: list
    negated: bool


def _cells(results: dict, metric, select) -> tuple[dict, bool]:
    """{(algorithm, task): (N,) scores} and whether higher is better."""
    scores = run_scores(results, metric, select)
    cells, where = {}, {}
    for key, r in results.items():
        cell = (str(r.algorithm), kinds.of_result(r).scores.task_of(r))
        if cell in cells:
            raise ValueError(f"dirs: {where[cell]!r} and {key!r} both ran {cell[0]} on {cell[1]}; a profile needs "
                             "one run per algorithm and task")
        cells[cell], where[cell] = scores[key], key
    return cells, higher_is_better(results, metric)


def normalize(raw: dict, negate: bool) -> dict:
    """{label: (runs x tasks)} oriented (negated when `negate`) and min-max
    scaled per task over every label's runs: 0 the worst run, 1 the best (a
    task on which every run scored the same: 1 for all)."""
    oriented = {k: -v if negate else v for k, v in raw.items()}
    pooled = np.concatenate(list(oriented.values()), axis=0)
    lo, hi = pooled.min(axis=0), pooled.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    return {k: np.where(hi > lo, (v - lo) / span, 1.0) for k, v in oriented.items()}


def by_algorithm(results: dict, metric=None, select: dict | None = None) -> Table:
    """The `Table` of runs of several algorithms on several tasks: one run per
    (algorithm, task), every algorithm on every task, the same number of seeds
    on each task of an algorithm; `ValueError` naming `dirs` otherwise."""
    cells, higher = _cells(results, metric, select)
    algs = list(dict.fromkeys(a for a, _ in cells))
    tasks = list(dict.fromkeys(t for _, t in cells))
    if len(algs) < 2:
        raise ValueError(f"dirs: a profile compares algorithms, and these runs are all of {algs[0]}")
    raw = {}
    for a in algs:
        missing = [t for t in tasks if (a, t) not in cells]
        if missing:
            raise ValueError(f"dirs: {a} has no run on {', '.join(missing)}, which "
                             f"{next(b for b in algs if (b, missing[0]) in cells)} ran; give every algorithm "
                             "every task")
        counts = {len(cells[a, t]) for t in tasks}
        if len(counts) > 1:
            raise ValueError(f"dirs: {a}'s runs have {' and '.join(map(str, sorted(counts)))} seeds on different "
                             "tasks; the stratified bootstrap needs the same number on each")
        raw[a] = np.stack([cells[a, t] for t in tasks], axis=1)
    return Table(normalize(raw, not higher), raw, tasks, not higher)


def profiles(score_dict: dict, reps: int = REPS, seed: int = 0, taus=None) -> tuple:
    """(taus, {label: (fraction, low, high)}): rliable's performance profile
    (the fraction of runs, over all tasks, whose normalized score exceeds tau:
    `library.score_distributions`) with its 95% stratified bootstrap band."""
    library, _ = require()
    taus = np.linspace(0.0, 1.0, PROFILE_TAUS) if taus is None else np.asarray(taus, np.float64)
    with seeded(seed):
        point, ci = library.get_interval_estimates(
            score_dict, lambda s: library.score_distributions(s, taus), reps=check_reps(reps),
            confidence_interval_size=LEVEL)
    return taus, {k: (point[k], ci[k][0], ci[k][1]) for k in score_dict}


def improvement(score_dict: dict, reps: int = REPS, seed: int = 0, pairs=None) -> dict:
    """{(x, y): (P(X > Y), low, high)} for every ordered pair of labels (the
    first listed against each later one, unless `pairs` names them): rliable's
    probability of improvement, averaged over tasks, with its 95% stratified
    independent bootstrap interval."""
    library, metrics = require()
    pairs = list(itertools.combinations(score_dict, 2)) if pairs is None else list(pairs)
    with seeded(seed):
        point, ci = library.get_interval_estimates(
            {f"{x},{y}": (score_dict[x], score_dict[y]) for x, y in pairs},
            lambda a, b: np.array([metrics.probability_of_improvement(a, b)]), reps=check_reps(reps),
            confidence_interval_size=LEVEL)
    return {(x, y): (float(point[f"{x},{y}"][0]), float(ci[f"{x},{y}"][0, 0]), float(ci[f"{x},{y}"][1, 0]))
            for x, y in pairs}


# ------------------------------------------------------------------ figures and tables

def interval_figure(est: dict, stat: str, xlabel: str, title: str = ""):
    """One row per label: the point estimate and its interval (rliable's
    interval-estimate plot), as a matplotlib figure without pyplot."""
    from bec_jax.prediction.plotting import new_figure
    fig, axs = new_figure(1, 1, panel=(6.4, max(2.4, 1.4 + 0.45 * len(est))))
    ax = axs[0, 0]
    labels = list(est)
    for i, k in enumerate(labels):
        p, lo, hi = est[k]
        ax.plot([lo, hi], [i, i], lw=6, alpha=0.5, solid_capstyle="butt")
        ax.plot([p], [i], "k|", ms=14, mew=2)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel(f"{stat_name(stat)} over seeds, 95% stratified bootstrap CI")
    ax.set_title(title or f"{stat_name(stat)} of {xlabel}", fontsize=9, wrap=True)
    fig.tight_layout()
    return fig


def curves_figure(curves: dict, stat: str, ylabel: str, title: str = ""):
    """Each run's `stat` over seeds along its curve with the bootstrap band
    (`curve_estimates`), one panel."""
    from bec_jax.prediction.plotting import new_figure
    fig, axs = new_figure(1, 1)
    ax = axs[0, 0]
    for key, (x, p, lo, hi) in curves.items():
        line, = ax.plot(x, p, lw=1.6, label=key)
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
    ax.set_ylabel(f"{stat_name(stat)} over seeds of {ylabel}")
    ax.set_xlabel("episode (control runs) or step (continuing runs)")
    ax.legend(fontsize=8)
    ax.set_title(title or f"{stat_name(stat)} with 95% stratified bootstrap bands", fontsize=10)
    fig.tight_layout()
    return fig


def profile_figure(taus, prof: dict, poi: dict, agg: dict, stat: str, title: str = ""):
    """Three panels: the performance profiles with their bands, the `stat` of
    each algorithm's normalized scores (`agg`, from `interval_estimates`), and
    the probability of improvement of each pair with its interval."""
    from bec_jax.prediction.plotting import new_figure
    fig, axs = new_figure(1, 3, panel=(4.6, 3.8))
    ax = axs[0, 0]
    for k, (p, lo, hi) in prof.items():
        line, = ax.plot(taus, p, lw=1.6, label=k)
        ax.fill_between(taus, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xlabel("normalized score τ")
    ax.set_ylabel("fraction of runs with score > τ")
    ax.legend(fontsize=8)
    ax.set_title("performance profiles", fontsize=10)
    for i, (k, (p, lo, hi)) in enumerate(agg.items()):
        axs[0, 1].plot([lo, hi], [i, i], lw=6, alpha=0.5, solid_capstyle="butt")
        axs[0, 1].plot([p], [i], "k|", ms=14, mew=2)
    axs[0, 1].set_yticks(range(len(agg)), list(agg))
    axs[0, 1].set_ylim(len(agg) - 0.5, -0.5)
    axs[0, 1].set_xlabel(f"{stat_name(stat)} of normalized scores")
    axs[0, 1].set_title("aggregate", fontsize=10)
    ax = axs[0, 2]
    names = [f"P({x} > {y})" for x, y in poi]
    for i, (p, lo, hi) in enumerate(poi.values()):
        ax.plot([lo, hi], [i, i], lw=6, alpha=0.5, color="tab:purple", solid_capstyle="butt")
        ax.plot([p], [i], "k|", ms=14, mew=2)
    ax.axvline(0.5, color="0.5", ls="--", lw=1)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlim(0, 1)
    ax.set_xlabel("probability of improvement")
    ax.set_title("probability of improvement", fontsize=10)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def rows(est: dict, stat: str, seeds: dict, score: str) -> list[dict]:
    """Table rows of `interval_estimates` of single runs: run, score, seeds,
    the statistic, its interval."""
    name = stat_name(stat)
    return [{"run": k, "score": score, "seeds": int(seeds[k]), name: p, f"{name} CI low": finite_or_none(lo),
             f"{name} CI high": finite_or_none(hi)} for k, (p, lo, hi) in est.items()]
