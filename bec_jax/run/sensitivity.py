"""Hyperparameter sensitivity across the tasks of a study: how much an
algorithm's performance depends on tuning its hyperparameters per task, and
the one setting that does best over all of them.

Every number comes from each seed's score at every grid point (the kinds
table's `Scores.seed_scores`: a prediction run's area under its error curve,
a control run's mean return per episode, a continuing run's reward rate),
oriented so that higher is better (an error or a length negated, as `compare
--profile` does). A run that diverged or did not finish scores as the worst
finite run on its task (over every algorithm): it ranks last, and the
normalizations stay finite. The definitions, as their authors' code computes them:

- Adkins, Bowling and White, *A Method for Evaluating Hyperparameter
  Sensitivity in Reinforcement Learning*, NeurIPS 2024 (arXiv 2412.07165);
  code `jadkins99/hyperparameter_sensitivity` at e571b0b, `analysis/utils.py`
  (`compute_scores`) and `analysis/plots.py` (`generate_dimensionality_plot`).
  Percentile-normalized performance Gamma(w, e, h) = (score - p5_e) / (p95_e -
  p5_e), p5_e and p95_e the 5th and 95th percentiles of every run on task e
  (`percentile_normalized`); sensitivity Phi(w) = mean_e max_h Gamma - max_h
  mean_e Gamma, per-task-tuned minus cross-task-tuned (`sensitivity`);
  effective hyperparameter dimensionality d(w), the fewest hyperparameters
  that, tuned per task with the others at the cross-task best, reach 95% of
  per-task-tuned performance (`tuned_by_count`, `dimensionality`).
- Patterson, Neumann, Kumaraswamy, White and White, *The Cross-environment
  Hyperparameter Setting Benchmark for Reinforcement Learning*, RLC 2024
  (arXiv 2407.18840); code `andnp/single-hyperparameter-benchmark` at 09b313a,
  `shb/shb.py` (`SHB.cdfScale`, `SHB.pickParameters`). N_e(G) = CDF(G, e): the
  mean over algorithms of the fraction of that algorithm's runs on e scoring
  strictly less than G (`cdf_normalized`); theta_CHS, the setting with the
  highest mean over tasks of N_e, and that mean, the CHS score (`chs`).

Intervals are 95% percentile bootstrap intervals over runs: each resample
draws each (algorithm, task) sweep's seeds with replacement, the same draw at
every grid point (the points share their seeds' random streams), and computes
everything again, normalizations included.

    report = sensitivity.analyze(sensitivity.load("runs/study"), reps=2000, seed=0)
    report.algorithms["ctd"].phi                        # (Phi, low, high)
    sensitivity.write(report, "runs/study/sensitivity")  # sensitivity.md, .csv, .png
"""
from __future__ import annotations

import itertools
import math
import os
from typing import NamedTuple

import numpy as np

from bec_jax.run import kinds, study

LEVEL = 0.95            # the bootstrap intervals' coverage
REPS = 2000             # bootstrap resamples (`compare --reps`)
PERCENTILES = (5, 95)   # Adkins et al.'s normalization: these percentiles of a task's runs map to 0 and 1
FRACTION = 0.95         # Adkins et al.'s effective dimensionality: this fraction of per-task-tuned performance
_TOL = 1e-12            # sums of the same numbers in another order may differ in the last bit


class Data(NamedTuple):
    """Per-seed scores of a study, oriented (higher is better): `tasks` (every
    algorithm ran on each); `settings` {algorithm: [{hyperparameter: value}]},
    its grid points in one order, the same on every task; `columns` {algorithm:
    the columns that take more than one value (the swept ones)}; `cells`
    {algorithm: [(G, N_t) per task]} each point's seeds' scores, negated where
    lower is better, a failed run set to its task's worst finite score; `failed`
    {algorithm: failed runs}; `negated`; the runs' `kind` and `metric` (labels)."""

    tasks: list
    settings: dict
    columns: dict
    cells: dict
    failed: dict
    negated: bool = False
    kind: str = ""
    metric: str = "score"


# ------------------------------------------------------------------ the two normalizations

def percentile_normalized(cells: dict) -> dict:
    """{algorithm: (T, G)} Adkins et al.'s percentile-normalized performance
    Gamma(w, e, h) averaged over seeds: (score - p5_e) / (p95_e - p5_e), with
    p5_e, p95_e the `PERCENTILES` of every run on task e (every algorithm,
    setting and seed; NumPy's linear interpolation). Not clipped: the best
    settings score above 1 (the authors' released table does too). A task on
    which every run scored the same has span 1 (every Gamma 0)."""
    tasks = len(next(iter(cells.values())))
    out = {a: np.empty((tasks, c[0].shape[0])) for a, c in cells.items()}
    for t in range(tasks):
        pooled = np.concatenate([c[t].ravel() for c in cells.values()])
        lo, hi = np.percentile(pooled, PERCENTILES)
        span = hi - lo if hi > lo else 1.0
        for a, c in cells.items():
            out[a][t] = ((c[t] - lo) / span).mean(axis=1)
    return out


def cdf_normalized(cells: dict) -> dict:
    """{algorithm: (T, G)} Patterson et al.'s CDF-normalized score N_e(G) =
    CDF(G, e) averaged over seeds: for each run, the mean over algorithms of
    the fraction of that algorithm's runs on task e (every setting and seed)
    with a strictly lower score (`SHB.cdfScale`), in [0, 1)."""
    tasks = len(next(iter(cells.values())))
    out = {a: np.empty((tasks, c[0].shape[0])) for a, c in cells.items()}
    for t in range(tasks):
        pools = [np.sort(c[t].ravel()) for c in cells.values()]
        for a, c in cells.items():
            # searchsorted(side="left"): how many of the pool lie strictly below each score.
            cdf = np.mean([np.searchsorted(p, c[t], side="left") / p.size for p in pools], axis=0)
            out[a][t] = cdf.mean(axis=1)
    return out


# ------------------------------------------------------------------ the quantities

def sensitivity(gamma: np.ndarray) -> tuple[float, float, float, int]:
    """(Phi, per-task-tuned, cross-task-tuned, the cross-task setting) of one
    algorithm's (T, G) `percentile_normalized` scores: Adkins et al.'s
    sensitivity Phi = mean_e max_h Gamma - max_h mean_e Gamma (`compute_scores`'s
    sensitivity_difference), >= 0; the setting is the first best in grid order."""
    per_task = float(gamma.max(axis=1).mean())
    across = gamma.mean(axis=0)
    best = int(np.argmax(across))
    return per_task - float(across[best]), per_task, float(across[best]), best


def codes(settings: list, columns: tuple) -> np.ndarray:
    """(G, D) int: each grid point's value of each swept column, as its
    index among that column's distinct values."""
    out = np.zeros((len(settings), len(columns)), np.int64)
    for j, c in enumerate(columns):
        values = list(dict.fromkeys(s[c] for s in settings))
        out[:, j] = [values.index(s[c]) for s in settings]
    return out


def tuned_by_count(gamma: np.ndarray, code: np.ndarray, best: int) -> tuple[np.ndarray, list]:
    """((D + 1,), [k column indices]): Adkins et al.'s performance when k of the
    D swept hyperparameters are tuned per task, k = 0..D, the best over every
    set of k of mean_e max Gamma(w, e, h) over the settings h that keep the
    other D - k at the cross-task setting `best` (`generate_dimensionality_plot`'s
    best_tune_n_performance), and that set (the first in `itertools.combinations`'
    order on ties). k = 0 is cross-task-tuned, k = D per-task-tuned; never decreasing."""
    d = code.shape[1]
    curve, which = np.empty(d + 1), []
    for k in range(d + 1):
        score = {t: gamma[:, np.all(code[:, f] == code[best, f], axis=1)].max(axis=1).mean()
                 for t in itertools.combinations(range(d), k) for f in [[j for j in range(d) if j not in t]]}
        which.append(max(score, key=score.get))
        curve[k] = score[which[-1]]
    return curve, which


def dimensionality(curve: np.ndarray, fraction: float = FRACTION) -> int:
    """Adkins et al.'s effective hyperparameter dimensionality: the fewest
    hyperparameters k whose per-task tuning reaches `fraction` of the
    per-task-tuned performance, `curve[k] >= curve[-1] - (1 - fraction) |curve[-1]|`
    (`tuned_by_count`; for a positive curve[-1], fraction * curve[-1], the
    authors' 0.95 x; the authors' figure also draws the linear interpolation
    between whole k, not reported here)."""
    target = curve[-1] - (1 - fraction) * abs(curve[-1]) - _TOL
    return int(np.argmax(curve >= target))


def chs(normalized: np.ndarray) -> tuple[int, float]:
    """(theta_CHS, its score) of one algorithm's (T, G) `cdf_normalized`
    scores: the setting with the highest mean over tasks (the first such in
    grid order: `SHB.pickParameters`' argmax) and that mean."""
    across = normalized.mean(axis=0)
    best = int(np.argmax(across))
    return best, float(across[best])


def profile(normalized: np.ndarray, code: np.ndarray, j: int) -> np.ndarray:
    """The sensitivity curve of swept column j: for each of its values (in
    `codes`' order), the highest mean over tasks of the `cdf_normalized`
    score among the settings with that value (the other hyperparameters at
    their best for it)."""
    across = normalized.mean(axis=0)
    return np.array([across[code[:, j] == v].max() for v in range(code[:, j].max() + 1)])


# ------------------------------------------------------------------ estimates and intervals

class Estimate(NamedTuple):
    """One algorithm's numbers, each (point, low, high) with its 95% bootstrap
    interval (NaN bounds where a task has one seed): phi (`sensitivity`) and its
    terms per_task_tuned, cross_task_tuned, with cross_task_setting the Gamma-best
    setting; dimensionality (`dimensionality`, whole bounds) of the `swept`
    columns, with the point `tuned_by_count` and the d columns that reach it, `tuned`; chs, the CHS score of chs_setting
    (`chs`); curves {column: (values, point, low, high)} (`profile`); seeds
    {task: seeds}; settings (grid points); failed (failed runs)."""

    phi: tuple
    per_task_tuned: tuple
    cross_task_tuned: tuple
    cross_task_setting: dict
    dimensionality: tuple
    swept: tuple
    tuned_by_count: np.ndarray
    tuned: tuple
    chs: tuple
    chs_setting: dict
    curves: dict
    seeds: dict
    settings: int
    failed: int


class Report(NamedTuple):
    """`analyze`'s result: {algorithm: `Estimate`} and how it was computed."""

    algorithms: dict
    tasks: list
    kind: str
    metric: str
    negated: bool
    reps: int
    seed: int


def _numbers(cells: dict, code: dict) -> dict:
    """{algorithm: flat vector}: Phi, per-task-tuned, cross-task-tuned, d,
    CHS score, then each swept column's curve, of one (re)sample."""
    gamma, norm = percentile_normalized(cells), cdf_normalized(cells)
    out = {}
    for a in cells:
        phi, tuned, across, best = sensitivity(gamma[a])
        d = dimensionality(tuned_by_count(gamma[a], code[a], best)[0])
        curves = [profile(norm[a], code[a], j) for j in range(code[a].shape[1])]
        out[a] = np.concatenate([[phi, tuned, across, d, chs(norm[a])[1]], *curves])
    return out


def resample(cells: dict, rng: np.random.Generator) -> dict:
    """`cells` with each (algorithm, task) sweep's seeds drawn with
    replacement, the same draw at each of its grid points."""
    return {a: [v[:, rng.integers(0, v.shape[1], v.shape[1])] for v in c] for a, c in cells.items()}


def analyze(data: Data, reps: int = REPS, seed: int = 0) -> Report:
    """Every algorithm's `Estimate`, with `reps` bootstrap resamples drawn from
    `numpy.random.default_rng(seed)` (the same call gives the same numbers)."""
    code = {a: codes(data.settings[a], data.columns[a]) for a in data.cells}
    point = _numbers(data.cells, code)
    rng = np.random.default_rng(seed)
    draws = [_numbers(resample(data.cells, rng), code) for _ in range(reps)]
    gamma, norm = percentile_normalized(data.cells), cdf_normalized(data.cells)
    out = {}
    for a, cells in data.cells.items():
        p = point[a]
        lo, hi = np.percentile(np.stack([d[a] for d in draws]), [50 * (1 - LEVEL), 50 * (1 + LEVEL)], axis=0)
        if any(v.shape[1] < 2 for v in cells):  # every resample is the sample itself: no interval
            lo, hi = np.full_like(p, np.nan), np.full_like(p, np.nan)
        at = [(float(p[k]), float(lo[k]), float(hi[k])) for k in range(5)]
        if not math.isnan(at[3][1]):  # d is a whole number of hyperparameters: whole bounds that cover the interval
            at[3] = (at[3][0], float(math.floor(at[3][1])), float(math.ceil(at[3][2])))
        curves, k = {}, 5
        for c in data.columns[a]:
            values = list(dict.fromkeys(s[c] for s in data.settings[a]))
            curves[c] = (values, p[k:k + len(values)], lo[k:k + len(values)], hi[k:k + len(values)])
            k += len(values)
        swept, best = data.columns[a], sensitivity(gamma[a])[3]
        curve, which = tuned_by_count(gamma[a], code[a], best)
        out[a] = Estimate(
            phi=at[0], per_task_tuned=at[1], cross_task_tuned=at[2],
            cross_task_setting={c: data.settings[a][best][c] for c in swept}, dimensionality=at[3], swept=swept,
            tuned_by_count=curve, tuned=tuple(swept[j] for j in which[dimensionality(curve)]), chs=at[4],
            chs_setting={c: data.settings[a][chs(norm[a])[0]][c] for c in swept}, curves=curves,
            seeds={t: v.shape[1] for t, v in zip(data.tasks, cells)}, settings=len(data.settings[a]),
            failed=data.failed.get(a, 0))
    return Report(out, list(data.tasks), data.kind, data.metric, data.negated, reps, seed)


# ------------------------------------------------------------------ building the data

def from_arrays(scores: dict, settings: dict, higher_is_better: bool = True, kind: str = "", metric: str = "score",
                names: dict | None = None) -> Data:
    """`Data` from {algorithm: {task: (G, N) per-seed scores}} and {algorithm:
    [{hyperparameter: value}, ...]} (the G grid points, the same on every
    task); NaN or inf marks a failed run. `ValueError` naming `dirs` for fewer
    than 2 tasks, an algorithm missing a task, a task with no finite run.
    `names` ({(algorithm, task): sweep}) only words the messages."""
    algs = list(scores)
    tasks = list(dict.fromkeys(t for a in algs for t in scores[a]))
    if len(tasks) < 2:
        raise ValueError(f"dirs: --sensitivity compares settings across tasks, and every sweep ran on "
                         f"{tasks[0] if tasks else 'no task'}; add sweeps of the same algorithms on another task")
    for a in algs:
        missing = [t for t in tasks if t not in scores[a]]
        if missing:
            other = next(b for b in algs if missing[0] in scores[b])
            raise ValueError(f"dirs: {a} has no sweep on {', '.join(missing)}, which {other} ran; --sensitivity "
                             "needs every algorithm on every task of the study")
    sign = 1.0 if higher_is_better else -1.0
    raw = {a: [sign * np.asarray(scores[a][t], np.float64) for t in tasks] for a in algs}
    cells, failed = _fill_failed(raw, tasks, names or {})
    columns = {a: tuple(c for c in (settings[a][0] if settings[a] else {})
                        if len({_key(s[c]) for s in settings[a]}) > 1) for a in algs}
    return Data(tasks, {a: list(settings[a]) for a in algs}, columns, cells, failed, not higher_is_better, kind,
                metric)


def _fill_failed(raw: dict, tasks: list, names: dict) -> tuple[dict, dict]:
    """(cells, {algorithm: failed runs}): each non-finite score set to the
    lowest finite score on its task over every algorithm (the worst run)."""
    failed = {a: int(sum((~np.isfinite(v)).sum() for v in c)) for a, c in raw.items()}
    out = {a: list(c) for a, c in raw.items()}
    for t, task in enumerate(tasks):
        finite = np.concatenate([c[t][np.isfinite(c[t])] for c in raw.values()])
        if finite.size == 0:
            sweeps = ", ".join(names.get((a, task), a) for a in raw)
            raise ValueError(f"dirs: every run on {task} ({sweeps}) diverged or did not finish; there is no score "
                             "to normalize by (run settings that learn)")
        for a, c in raw.items():
            out[a][t] = np.where(np.isfinite(c[t]), c[t], finite.min())
    return out, failed


def _key(v):
    return v.item() if isinstance(v, np.generic) else v


def task_columns(r) -> tuple:
    """The grid columns of a result that define its task, not a setting: a
    prediction sweep's environment parameters, a control or continuing
    sweep's task axes (from the spec, or where it cannot be built here, the
    saved dict's env_params, task_axes and task_params)."""
    spec = getattr(r, "spec", None)
    names = getattr(spec, "env_param_names", getattr(spec, "task_axes", None))
    if names is None:
        d = getattr(r, "spec_dict", None) or {}
        names = [n for k in ("env_params", "task_axes", "task_params") for n in (d.get(k) or {})]
    return tuple(n for n in names if n in r.grid)


def _text(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def setting_text(setting: dict) -> str:
    """'alpha=0.1, beta=0.01' (or 'one setting' for none)."""
    return ", ".join(f"{k}={_text(v)}" for k, v in setting.items()) or "one setting"


def _split(r, scores, metric) -> dict:
    """{task label: ([hyperparameter setting per point], (G_t, N) scores)} of one result."""
    tc = task_columns(r)
    out: dict = {}
    for i in range(r.num_points):
        point = {k: _key(v) for k, v in r.point(i).items()}
        at = {k: point.pop(k) for k in tc}
        label = str(scores.task_of(r)) + (f" ({setting_text(at)})" if at else "")
        got = out.setdefault(label, ([], []))
        got[0].append(point)
        got[1].append(np.asarray(scores.seed_scores(r, i, metric), np.float64))
    return {t: (s, np.stack(v)) for t, (s, v) in out.items()}


def _point(s: dict) -> tuple:
    return tuple(sorted(s.items()))


def _same_grid(alg: str, grids: dict) -> list:
    """The grid points of `alg`, in its first task's order, where every task
    has the same; `ValueError` naming `dirs` that says what differs otherwise."""
    (t0, ref), *rest = grids.items()
    for t, g in rest:
        if len(g) == len(ref) and {_point(s) for s in g} == {_point(s) for s in ref}:
            continue
        why = f"{len(ref)} points on {t0} but {len(g)} on {t}" if len(g) != len(ref) else f"other points on {t}"
        if set(ref[0]) != set(g[0]):
            why = f"its columns are {', '.join(ref[0])} on {t0} but {', '.join(g[0])} on {t}"
        for c in (c for c in ref[0] if set(ref[0]) == set(g[0])):
            a, b = ([_key(x) for x in sorted({s[c] for s in pts}, key=str)] for pts in (ref, g))
            if a != b:
                why = f"{c} is {a} on {t0} but {b} on {t}"
                break
        raise ValueError(f"dirs: {alg}'s hyperparameter grid differs across tasks: {why}; --sensitivity compares "
                         "the same settings on every task")
    return ref


def from_results(results: dict, metric=None) -> Data:
    """`Data` of saved results ({sweep name: result}, one kind): each sweep's
    `kinds.Scores.seed_scores` by `metric` (None: its kind's default), one task
    per value of its `task_columns`, oriented by its kind's `higher_is_better`.
    `ValueError` naming `dirs` for several kinds, a search, two sweeps of one
    algorithm on one task, grids that differ across tasks, `from_arrays`' cases."""
    if not results:
        raise ValueError("dirs: no finished sweep in the study")
    seen = {r.KIND for r in results.values()}
    if len(seen) > 1:
        raise ValueError(f"dirs: --sensitivity compares sweeps of one kind; the study has {', '.join(sorted(seen))}")
    first = next(iter(results.values()))
    kind = kinds.of_result(first)
    if metric is None and getattr(first, "metrics", None):  # each prediction run's default is its own first metric
        metric = first.metrics[0]
    metric = kind.figures.check_metric(results, metric)
    scores, settings, grids, names = {}, {}, {}, {}
    for name, r in results.items():
        if getattr(r, "stopped_rung", None) is not None:
            raise ValueError(f"dirs: {name!r} is a search whose points stopped early; --sensitivity needs every "
                             "grid point's full runs (a full sweep)")
        alg = str(r.algorithm)
        for task, (pts, v) in _split(r, kind.scores, metric).items():
            if (alg, task) in names:
                raise ValueError(f"dirs: {names[alg, task]!r} and {name!r} both ran {alg} on {task}; "
                                 "--sensitivity needs one sweep per algorithm and task")
            names[alg, task] = name
            grids.setdefault(alg, {})[task] = pts
            scores.setdefault(alg, {})[task] = v
    for alg, g in grids.items():
        order = _same_grid(alg, g)
        settings[alg] = order
        index = {_point(s): i for i, s in enumerate(order)}
        for task, pts in g.items():  # each task's rows in the first task's order
            rows = np.empty(len(order), np.int64)
            rows[[index[_point(s)] for s in pts]] = np.arange(len(pts))
            scores[alg][task] = scores[alg][task][rows]
    return from_arrays(scores, settings, bool(kind.scores.higher_is_better(metric)), kind.name, str(metric), names)


def load(study_dir: str, metric=None) -> Data:
    """`from_results` of the finished sweeps of the study in `study_dir`;
    `ValueError` naming `dirs` when it is not a study directory."""
    if not study.is_study_dir(study_dir):
        raise ValueError(f"dirs: {study_dir!r} is not a study directory (no study.json); --sensitivity reads the "
                         "sweeps of one `bec-jax study`")
    return from_results({n: kinds.load_result(p) for n, p in study.sweep_dirs(study_dir).items()}, metric)


# ------------------------------------------------------------------ tables, figure, command

def _ci(x: tuple, fmt: str = ".4f") -> str:
    p, lo, hi = x
    return f"{p:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]" if not math.isnan(lo) else f"{p:{fmt}} (1 seed: no CI)"


def _seeds(seeds: dict) -> str:
    n = sorted(set(seeds.values()))
    return str(n[0]) if len(n) == 1 else f"{n[0]}-{n[-1]}"


def header(report: Report) -> str:
    """The line that says what the numbers are computed from."""
    algs, neg = list(report.algorithms), ", negated (lower is better)" if report.negated else ""
    return (f"{' and '.join(algs) if len(algs) < 3 else f'{len(algs)} algorithms'} on {len(report.tasks)} tasks "
            f"({', '.join(report.tasks)}); scores: {report.kind} runs' per-seed {report.metric}{neg}; 95% bootstrap "
            f"intervals over seeds ({report.reps} resamples, seed {report.seed})")


NOTES = ("Phi: per-task-tuned minus cross-task-tuned percentile-normalized performance (Adkins, Bowling and White "
         "2024; per-task tuned: the first term); d: the fewest swept hyperparameters to tune per task for 95% of the per-task-tuned performance, of "
         "D; CHS: the mean over tasks of the CDF-normalized score of the best single setting (Patterson et al. "
         "2024), measured on the runs that chose it: run that setting on fresh seeds for an unbiased score")


def rows(report: Report) -> list[dict]:
    """One row per algorithm, every number of its `Estimate` (NaN bounds as None)."""
    from bec_jax.files import finite_or_none as ok
    out = []
    for a, e in report.algorithms.items():
        row = {"algorithm": a, "tasks": len(report.tasks), "seeds": _seeds(e.seeds), "settings": e.settings,
               "swept": ", ".join(e.swept) or "-", "D": len(e.swept), "failed runs": e.failed}
        for name, x in (("phi", e.phi), ("per-task tuned", e.per_task_tuned), ("cross-task tuned", e.cross_task_tuned),
                        ("d", e.dimensionality), ("CHS score", e.chs)):
            row.update({name: x[0], f"{name} CI low": ok(x[1]), f"{name} CI high": ok(x[2])})
        row.update({"d": int(e.dimensionality[0]), "d tuned": ", ".join(e.tuned) or "-",
                    "tuned by count": "; ".join(f"{x:.6g}" for x in e.tuned_by_count),
                    "cross-task setting": setting_text(e.cross_task_setting),
                    "CHS setting": setting_text(e.chs_setting), "metric": report.metric, "negated": report.negated})
        out.append(row)
    return out


def lines(report: Report) -> list[str]:
    """The printed table: per algorithm Phi, per-task-tuned performance, d of
    D and the CHS score, each with its interval, and the CHS setting; `NOTES`."""
    table = [("algorithm", "Phi [95% CI]", "per-task tuned [95% CI]", "d of D [95% CI]", "CHS score [95% CI]",
              "CHS setting")]
    for a, e in report.algorithms.items():
        d, lo, hi = e.dimensionality
        dim = f"{int(d)} of {len(e.swept)}" + (f" ({', '.join(e.tuned)})" if e.tuned else "") + (
            f" [{int(lo)}, {int(hi)}]" if not math.isnan(lo) else "")
        table.append((a, _ci(e.phi), _ci(e.per_task_tuned), dim, _ci(e.chs), setting_text(e.chs_setting)))
    width = [max(len(r[j]) for r in table) for j in range(len(table[0]))]
    return [header(report)] + ["  ".join(c.ljust(w) for c, w in zip(r, width)).rstrip() for r in table] + [NOTES]


def figure(report: Report, title: str = ""):
    """The performance-sensitivity plane (Phi against per-task-tuned
    performance, Adkins et al.'s figure) and one panel per swept
    hyperparameter: each algorithm's sensitivity curve (`profile`) with its
    bootstrap band, a star at its CHS setting."""
    from bec_jax.prediction.plotting import new_figure
    columns = list(dict.fromkeys(c for e in report.algorithms.values() for c in e.swept))
    n = 1 + len(columns)
    ncols = min(n, 3)
    fig, axs = new_figure(math.ceil(n / ncols), ncols, panel=(4.8, 3.9))
    color = {a: f"C{i % 10}" for i, a in enumerate(report.algorithms)}
    ax = axs.flat[0]
    err = lambda x: np.nan_to_num([[x[0] - x[1]], [x[2] - x[0]]])  # noqa: E731  (no bar without an interval)
    for a, e in report.algorithms.items():
        ax.errorbar([e.phi[0]], [e.per_task_tuned[0]], xerr=err(e.phi), yerr=err(e.per_task_tuned), fmt="o",
                    capsize=4, color=color[a], label=a)
    ax.set_xlabel("sensitivity \u03a6 (per-task tuned \u2212 cross-task tuned)")
    ax.set_ylabel("per-task-tuned performance (percentile-normalized)")
    ax.set_title("performance-sensitivity plane", fontsize=10)
    ax.legend(fontsize=8)
    for j, c in enumerate(columns):
        _curve_panel(axs.flat[1 + j], report, c, color)
    for ax in list(axs.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(title or f"Hyperparameter sensitivity across {len(report.tasks)} tasks ({report.metric}); "
                 "curves: CDF-normalized score, mean over tasks, the other hyperparameters at their best",
                 fontsize=10, wrap=True)
    fig.tight_layout()
    return fig


def _curve_panel(ax, report: Report, column: str, color: dict) -> None:
    numeric = True
    for a, e in report.algorithms.items():
        if column not in e.curves:
            continue
        values, p, lo, hi = e.curves[column]
        numeric = numeric and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        x = np.asarray(values, np.float64) if numeric else np.arange(len(values))
        ax.plot(x, p, marker="o", ms=4, lw=1.5, color=color[a], label=a)
        ax.fill_between(x, lo, hi, color=color[a], alpha=0.2, lw=0)
        k = values.index(e.chs_setting[column])
        ax.plot([x[k]], [p[k]], marker="*", ms=13, color=color[a], mec="k", mew=0.6, ls="none")
        if not numeric:
            ax.set_xticks(x, [_text(v) for v in values])
    xs = [v for e in report.algorithms.values() if column in e.curves for v in e.curves[column][0]]
    if numeric and min(xs) > 0 and max(xs) / min(xs) > 30:
        ax.set_xscale("log")
    ax.set_xlabel(column)
    ax.set_ylabel("CDF-normalized score, mean over tasks")
    ax.set_title(f"{column} (\u2605 the CHS setting)", fontsize=10)
    ax.legend(fontsize=8)


def write(report: Report, out: str, title: str = "") -> list[str]:
    """sensitivity.md, sensitivity.csv and sensitivity.png in `out` (each
    written atomically); the paths."""
    from bec_jax.files import atomic_write, csv_text
    from bec_jax.prediction.plotting import rows_markdown, save_figure
    os.makedirs(out, exist_ok=True)
    table = rows(report)
    md = os.path.join(out, "sensitivity.md")
    text = f"# Hyperparameter sensitivity\n\n{header(report)}\n\n{rows_markdown(table)}\n{NOTES}\n"
    atomic_write(md, lambda f: f.write(text))
    csv = os.path.join(out, "sensitivity.csv")
    atomic_write(csv, lambda f: f.write(csv_text(table)))
    return [md, csv] + save_figure(figure(report, title), out, "sensitivity", formats=("png",))


def _check_out(study_dir: str, out) -> str:
    """--out, or the default STUDY/sensitivity; `ValueError` naming `out` for a
    sweep's directory, a file or a figure's name."""
    from bec_jax.files import META_FILE
    what = "--sensitivity writes a directory (sensitivity.md, .csv, .png)"
    if out is None and os.path.isfile(os.path.join(study_dir, "sensitivity", META_FILE)):
        raise ValueError(f"out: the study has a sweep named 'sensitivity', the default --out; {what}: give --out DIR")
    out = os.path.join(study_dir, "sensitivity") if out is None else out
    if os.path.isfile(out) or (os.path.splitext(out)[1].lower() in (".png", ".pdf", ".svg") and not os.path.isdir(out)):
        raise ValueError(f"out: {what}, and {out!r} is {'a file' if os.path.isfile(out) else 'a figure name'}")
    return out


def command(dirs: list, out=None, metric=None, reps: int = REPS, seed: int = 0, title: str = "",
            refused: tuple = ()) -> int:
    """`bec-jax compare STUDY --sensitivity [--out DIR] [--reps N] [--seed S]`:
    prints `lines`, writes `write`'s files into DIR (default STUDY/sensitivity).
    Each refusal (the options in `refused`, `dirs`, `out`, `reps`, `load`'s) is
    one `ValueError` naming its field, before anything is written."""
    from bec_jax.files import writing
    from bec_jax.run.robust import check_reps
    for field in refused:
        raise ValueError(f"{field}: cannot go with --sensitivity (it reports every algorithm's Phi, effective "
                         "dimensionality and CHS setting over all of its settings); leave it out")
    if len(dirs) != 1:
        raise ValueError(f"dirs: --sensitivity reads one study directory, got {len(dirs)}")
    out = _check_out(dirs[0], out)
    check_reps(reps)
    report = analyze(load(dirs[0], metric), reps, seed)
    for line in lines(report):
        print(line)
    with writing("the sensitivity table and figure", out):
        paths = write(report, out, title)
    print(f"wrote {', '.join(paths)}")
    return 0
