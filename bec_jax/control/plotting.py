"""Figures and tables of control sweeps: learning curves (steps per episode or
return, by episode or by step, with 95% confidence bands over seeds), step-size
sensitivity, the comparison of several runs' best curves and the table of their
best settings with Student-t intervals over seeds. Reads `ControlResult`s only;
figures are made without pyplot (see `bec_jax.prediction.plotting`).

Every "best setting" here is `ControlResult.best_index(stat)`: the best area
under the curve of the statistic drawn, among points whose every run finished
its episodes without diverging.
"""
from __future__ import annotations

import numpy as np

from bec_jax.control.results import BETTER, values_text
from bec_jax.prediction.plotting import (
    algorithm_label,
    chosen_points,
    new_figure,
    save_figure,
    step_label,
    symbol,
)

STAT_LABELS = {"length": "steps per episode", "return": "return per episode"}
DEFAULT_STAT = "return"  # what `compare` and `plot` draw and choose by unless told


def check_stat(stat) -> str:
    """`stat` (None: `DEFAULT_STAT`) if a control run logs it; `ValueError`
    naming `metric` (the command line's option) otherwise."""
    stat = DEFAULT_STAT if stat is None else stat
    if stat not in STAT_LABELS:
        raise ValueError(f"metric: control runs log {' and '.join(STAT_LABELS)} per episode, got {stat!r}")
    return stat


def check_metric(results: dict, metric) -> str:
    """`check_stat(metric)`, in the form every kind's figures take (`run.kinds.Figures`)."""
    return check_stat(metric)


def smoothing_window(episodes: int) -> int:
    """The moving average drawn over episodes: 20, or a tenth of a short run
    (a 20-episode average of a 20-episode run would hide its learning)."""
    return max(1, min(20, episodes // 10))


def by_task_value(results: dict) -> dict:
    """`results` ({key: ControlResult}) with each result that has task axes
    split into one entry per value of them (`ControlResult.by_task_value`),
    keyed "key (name=value)": its best setting is chosen at each value, as the
    task differs from one to the next."""
    out = {}
    for key, r in results.items():
        for values, part in r.by_task_value():
            out[f"{key} ({values_text(values)})" if values else key] = part
    return out


def _at_task_values(r) -> str:
    """' (slip=0.2)' for a result at one value of each of its task axes (`by_task_value`), else ''."""
    (values, _), *rest = r.by_task_value()
    return f" ({values_text(values)})" if values and not rest else ""


def _window(results: dict) -> int:
    return smoothing_window(min(r.episodes for r in results.values()))


def setting(r, i: int) -> str:
    """'alpha=0.1, beta=0.01': every grid column of point i."""
    return ", ".join(f"{n}={v:g}" if isinstance(v, (int, float)) else f"{n}={v}" for n, v in r.point(i).items())


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over `window` points (shorter at the start)."""
    if window <= 1:
        return y
    c = np.cumsum(np.insert(np.asarray(y, float), 0, 0.0))
    n = np.arange(1, len(y) + 1)
    lo = np.maximum(n - window, 0)
    return (c[n] - c[lo]) / (n - lo)


def curves(ax, results: dict, stat: str = "length", by: str = "episode", window: int = 20,
           styles: dict | None = None, title: str = "", points: dict | None = None) -> None:
    """For each result ({key: ControlResult}) the curve of its best grid point
    (or `points[key]`): the mean over valid seeds and its 95% t-interval band,
    both smoothed by a trailing moving average of `window` episodes (by episode)."""
    styles = styles or {}
    for key, r in results.items():
        st = styles.get(key, {})
        i = (points or {}).get(key)
        i = r.best_index(stat) if i is None else i
        if by == "episode":
            x, m, lo, hi = r.curve(i, stat)
            m, lo, hi = (smooth(v, window) for v in (m, lo, hi))
        else:
            x, m, lo, hi = r.curve_by_step(i, stat)
        label = f"{st.get('label', algorithm_label(r))} ({step_label(r, i, varying_only=False)})"
        n_ok = int(r.valid[i].sum())
        if n_ok < r.seeds:  # the curve is of the runs that finished every episode
            label += f", {n_ok} of {r.seeds} runs finished"
        line, = ax.plot(x, m, color=st.get("color"), ls=st.get("ls", "-"), lw=1.5, label=label)
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.18, lw=0)
    if stat == "length":
        ax.set_yscale("log")
    any_r = next(iter(results.values()))
    ax.set_xlabel("episode" if by == "episode" else "step")
    smooth_text = f", moving average of {window}" if by == "episode" and window > 1 else ""
    ax.set_ylabel(f"{STAT_LABELS[stat]} (mean, 95% CI, {any_r.seeds} seeds{smooth_text})", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def sensitivity(ax, results: dict, over: str = "alpha", stat: str = "length", styles: dict | None = None,
                title: str = "") -> None:
    """Area under the curve (mean over episodes) against `over`, best over the
    other hyperparameters at each value, with its 95% interval over seeds; a
    value where every setting had a diverged or unfinished run is left out."""
    styles = styles or {}
    for key, r in results.items():
        st = styles.get(key, {})
        if over not in r.grid:  # another algorithm's columns: nothing to draw against `over`
            continue
        auc = r.auc(stat)
        seeds = r.auc_seed(stat)
        xs, ys, los, his = [], [], [], []
        for v in np.unique(r.grid[over]):
            idx = np.flatnonzero(r.grid[over] == v)
            ok = idx[np.isfinite(auc[idx])]
            if not len(ok):
                continue
            b = ok[np.argmin(auc[ok])] if stat == "length" else ok[np.argmax(auc[ok])]
            lo, hi = r.ci(seeds[b:b + 1])
            xs.append(v), ys.append(auc[b]), los.append(lo[0]), his.append(hi[0])
        if not xs:
            continue
        xs, ys = np.asarray(xs), np.asarray(ys)
        err = np.abs(np.stack([ys - np.asarray(los), np.asarray(his) - ys]))
        ax.errorbar(xs, ys, yerr=np.nan_to_num(err), marker="o", ms=3, lw=1.3, capsize=2, color=st.get("color"),
                    ls=st.get("ls", "-"), label=st.get("label", algorithm_label(r) + _at_task_values(r)))
    ax.set_xscale("log")
    if stat == "length":
        ax.set_yscale("log")
    ax.set_xlabel(symbol(over))
    ax.set_ylabel(f"mean {STAT_LABELS[stat]} over all episodes (95% CI)", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def compare_figure(results: dict, metric: str | None = None, title: str = "", select: dict | None = None):
    """One panel: the curve by episode of each result's best grid point (or the
    best of the points `select` names), mean over seeds with its 95% t-interval
    band, labelled by its key and setting. `metric` is the statistic, 'return'
    (default) or 'length'. A result with task axes has a curve at each of
    their values (`by_task_value`)."""
    stat = check_stat(metric)
    results = by_task_value(results)
    points = chosen_points(results, stat, select)
    fig, axes = new_figure(1, 1, panel=(7.0, 4.6))
    curves(axes[0, 0], results, stat, "episode", _window(results), styles={k: {"label": str(k)} for k in results},
           title=title or ", ".join(sorted({r.task for r in results.values()})), points=points)
    fig.tight_layout()
    return fig


def plot_results(results: dict, out_dir: str, stat: str | None = None, select: dict | None = None,
                 prefix: str = "") -> list[str]:
    """Figures of several control sweeps ({label: ControlResult}) into
    `out_dir`: each one's best curve (by `stat`, default return; or the best
    of the points `select` names) by episode and by step on one figure
    (`<prefix>curves.png/pdf`) and the sensitivity to the first grid column
    (`<prefix>sensitivity.png/pdf`); a result with task axes at each of their
    values (`by_task_value`); a search's rungs (`<prefix>rungs_<label>`,
    `rungs`). Returns the paths."""
    stat = check_stat(stat)
    results = by_task_value(results)
    points = chosen_points(results, stat, select)
    fig, axes = new_figure(1, 2, panel=(6.0, 4.4))
    tasks = sorted({r.task for r in results.values()})
    title = ", ".join(tasks)
    curves(axes[0, 0], results, stat, "episode", _window(results), title=title, points=points)
    curves(axes[0, 1], results, stat, "step", title=title, points=points)
    fig.tight_layout()
    paths = save_figure(fig, out_dir, f"{prefix}curves")
    over = next(iter(next(iter(results.values())).grid))
    fig, axes = new_figure(1, 1)
    sensitivity(axes[0, 0], results, over, stat, title=title)
    fig.tight_layout()
    paths += save_figure(fig, out_dir, f"{prefix}sensitivity")
    for key, r in results.items():
        if r.stopped_rung is not None:  # a search: its rungs
            fig, axes = new_figure(1, 1, panel=(7.0, 4.6))
            rungs(axes[0, 0], r, title=f"{key} on {r.task}: successive halving, {int(r.stopped_rung.max()) + 1} rungs")
            fig.tight_layout()
            paths += save_figure(fig, out_dir, f"{prefix}rungs_{key}")
    return paths


def search_metric(r) -> str:
    """What a search's rungs ranked `r`'s points by ("return" or "length";
    "return", the control command's choice, for a full sweep)."""
    return ((r.spec_dict or {}).get("search") or {}).get("metric", "return")


def rungs(ax, r, title: str = "") -> None:
    """On `ax`: a search's rungs (`engine.search`, `control.program.searched`):
    each grid point's score at every rung it ran (its mean return, or steps,
    per episode over the episodes finished so far) against the rung's end
    step, one grey line a point that stopped, one coloured line a point that
    ran to its end (drawn at the last rung's step, the budget), the chosen
    point's whole-run value marked."""
    stat = search_metric(r)
    R = r.rung_scores.shape[1]
    ends = np.asarray(r.meta.get("search", {}).get("rung_steps") or np.arange(1, R + 1), np.float64)
    last = int(np.max(r.stopped_rung))
    sign = 1.0 if BETTER[stat] == "higher" else -1.0  # the scores of steps are negated (higher is better)
    finals = r.auc(stat)
    for i in np.argsort(r.stopped_rung, kind="stable"):
        y = sign * np.asarray(r.rung_scores[i], np.float64)
        survived = r.stopped_rung[i] == last
        if survived:
            y[last] = finals[i]
        ax.plot(ends, y, marker="o", ms=2.5, lw=0.9 if survived else 0.5, color=None if survived else "0.7",
                alpha=1.0 if survived else 0.6, label=setting(r, i) if survived else None, zorder=2 if survived else 1)
    if np.isfinite(finals).any():
        b = r.best_index(stat)
        ax.plot([ends[last]], [finals[b]], marker="*", ms=12, color="k", ls="none", label=f"chosen: {setting(r, b)}")
    ax.set_xscale("log")
    ax.set_xlabel("step at the rung's end (the last: the runs' ends)")
    ax.set_ylabel(f"mean {STAT_LABELS[stat]} so far (the rung's score)", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)


def search_line(r) -> str:
    """A search's line (`engine.search`; "" for a full sweep): its metric,
    rungs and the points each ran, and the run-steps it computed against the
    full grid's (at least: `control.sweep.search_meta`)."""
    s = r.meta.get("search")
    if r.stopped_rung is None or not s:
        return ""
    spent, full = s["search_run_steps"], s["full_run_steps_at_least"]
    steps = s["rung_steps"]
    return (f"successive halving at rate {s['rate']:g} by {STAT_LABELS[s['metric']]}: {len(steps)} rungs ending at "
            f"steps {', '.join(f'{x:,}' for x in steps[:-1])} and the runs' ends (at most {steps[-1]:,}) with "
            f"{' -> '.join(map(str, s['rung_points']))} points; {spent:,} run-steps, "
            + (f"at most {spent / full:.3f}x the full grid's" if full else "against the full grid's")
            + f" (at least {full:,}: every run as long as its slowest)")


def plot_result(r, out_dir: str, stat: str | None = None) -> list[str]:
    """`plot_results` for one sweep."""
    return plot_results({r.algorithm: r}, out_dir, stat)


def summary_rows(results: dict, metric: str | None = None, confirmations: dict | None = None) -> list[dict]:
    """One row per result ({key: ControlResult}), or per value of its task
    axes (`by_task_value`): its best setting by `metric`
    ('return', the default, or 'length'; `best_by`), and there the area under
    each statistic's curve (the mean over episodes) and its final value (the
    last 10% of episodes), each with its 95% Student-t interval over seeds
    (`ControlResult.summary`), the final omega and the fractions of diverged
    and incomplete runs. A result with no valid point gets its reason in
    `note`. (`confirmations` is accepted for the prediction table's
    signature; control runs have none.)"""
    stat = check_stat(metric)
    rows = []
    for key, r in by_task_value(results).items():
        row = {"sweep": key, "task": r.task, "algorithm": r.algorithm}
        try:
            b = r.best_index(stat)
        except ValueError as e:
            rows.append({**row, "setting": None, "best_by": stat, "seeds": r.seeds, "episodes": r.episodes,
                         "note": str(e)})
            continue
        rec = r.summary()[b]
        stats = {k: v for k, v in rec.items() if k not in r.grid and k not in ("task", "algorithm")}
        rows.append({**row, "setting": setting(r, b), "best_by": stat, "seeds": r.seeds, "episodes": r.episodes,
                     **stats})
    return rows


# ---------------------------------------------------------------- per-seed views (`run.kinds.Scores`)

def seed_scores(r, i: int, stat: str = "return") -> np.ndarray:
    """(N,) each run's area under its curve by episode at grid point i (its
    mean per-episode `stat`), NaN for a run that diverged or did not finish
    its episodes."""
    return np.asarray(r.auc_seed(check_stat(stat))[i], np.float64)


def seed_curves(r, i: int, stat: str = "return"):
    """(episodes 1..E, (N, E) each run's `stat` per episode) at grid point i,
    NaN for the runs that are not valid (diverged, or short of episodes)."""
    v = np.where(r.valid[i][:, None], r.values(check_stat(stat))[i], np.nan)
    return np.arange(1, r.episodes + 1), v


def mean_curves(r, i: int) -> dict:
    """{tag: (x, y)} of grid point i: the mean return and steps per episode
    over its valid runs, by episode."""
    return {stat: r.curve(i, stat)[:2] for stat in ("return", "length")}


def higher_is_better(stat: str | None) -> bool:
    """True for return, False for steps per episode (`results.BETTER`)."""
    return BETTER[check_stat(stat)] == "higher"


def task_of(r) -> str:
    """The task a result ran on, as its spec names it."""
    return str(r.task)
