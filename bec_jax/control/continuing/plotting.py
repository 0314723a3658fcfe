"""Figures and tables of continuing sweeps: learning curves of the reward rate
(per log block, 95% t bands over seeds) with a tabular task's optimal gain as
the reference line, the sensitivity of the reward rate to a step size (one
line per value of another column: eta or gamma), and the table of each
sweep's best setting. Reads `ContinuingResult`s only; figures are made
without pyplot (`bec_jax.prediction.plotting.new_figure`).

Every "best setting" is `ContinuingResult.best_index(window)`: the highest
mean reward rate over the window (default the whole run).
"""
from __future__ import annotations

import numpy as np

from bec_jax.control.continuing.results import WINDOWS
from bec_jax.prediction.plotting import chosen_points, new_figure, save_figure, symbol

DEFAULT_WINDOW = "all"  # what `compare` and `plot` choose by unless told
WINDOW_LABELS = {"all": "whole run", "last50": "last 50%", "last10": "last 10%"}


def check_metric(results: dict, metric) -> str:
    """The window a figure chooses the best setting by: `metric` (None:
    "all"); `ValueError` naming `metric` for another (`run.kinds.Figures`)."""
    metric = DEFAULT_WINDOW if metric is None else metric
    if metric not in WINDOWS:
        raise ValueError(f"metric: continuing runs report the reward rate over {', '.join(WINDOWS)}, got {metric!r}")
    return metric


def setting(r, i: int) -> str:
    """'alpha=0.1, eta=1': the grid columns of point i."""
    return ", ".join(f"{n}={v:g}" for n, v in r.point(i).items())


def curves(ax, results: dict, points: dict, title: str = "") -> None:
    """On `ax`: the reward-rate curve of each result's grid point `points[key]`
    (mean per log block over seeds, with its 95% t band), and the optimal
    gain of a tabular task as a dashed horizontal line."""
    gains = set()
    for key, r in results.items():
        x, mean, lo, hi = r.curve(points[key])
        line, = ax.plot(x, mean, lw=1.4, label=f"{key}: {setting(r, points[key])}")
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
        if r.optimal_gain is not None:
            gains.add(round(r.optimal_gain, 12))
    for g in sorted(gains):
        ax.axhline(g, color="k", ls="--", lw=1.0, label=f"optimal gain {g:.4g}")
    ax.set_xlabel("step")
    ax.set_ylabel("reward rate per log block (95% CI)", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def sensitivity(ax, r, over: str = "alpha", series: str | None = None, window: str = DEFAULT_WINDOW,
                title: str = "") -> None:
    """On `ax`: the mean reward rate over `window` (95% t intervals as error
    bars) against the column `over` (log axis), one line per value of the
    column `series` (eta or gamma, say); every other column held at the best
    point's value."""
    best = r.point(r.best_index(window))
    mean, lo, hi = r.rate_interval(window)
    keep = {n: v for n, v in best.items() if n not in (over, series)}
    base = r.select(**keep) if keep else np.ones(r.num_points, bool)
    values = [None] if series is None else sorted(set(np.asarray(r.grid[series])[base]))
    for v in values:
        mask = base if v is None else base & np.isclose(r.grid[series], v)
        order = np.argsort(r.grid[over][mask])
        x = np.asarray(r.grid[over])[mask][order]
        m, lo_, hi_ = mean[mask][order], lo[mask][order], hi[mask][order]
        ax.errorbar(x, m, yerr=[m - lo_, hi_ - m], marker="o", ms=3, capsize=2,
                    label=None if v is None else f"{symbol(series)}={v:g}")
    if r.optimal_gain is not None:
        ax.axhline(r.optimal_gain, color="k", ls="--", lw=1.0, label=f"optimal gain {r.optimal_gain:.4g}")
    if np.all(np.asarray(r.grid[over]) > 0):
        ax.set_xscale("log", base=2)
    ax.set_xlabel(symbol(over))
    ax.set_ylabel(f"reward rate, {WINDOW_LABELS[window]} (95% CI)", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def rungs(ax, r, title: str = "") -> None:
    """On `ax`: a search's rungs (`engine.search`): each grid point's score
    (its reward rate so far) at every rung it ran against the rung's step, one
    grey line a point that stopped, one coloured line a point that ran every
    step, the chosen point's final reward rate marked."""
    ends = np.asarray(r.meta.get("search", {}).get("rung_steps") or
                      np.arange(1, r.rung_scores.shape[1] + 1) * r.blocks * r.block_steps / r.rung_scores.shape[1])
    last = int(np.max(r.stopped_rung))
    finals = r.reward_rate("all").mean(-1)
    for i in np.argsort(r.stopped_rung, kind="stable"):
        y = np.asarray(r.rung_scores[i], np.float64).copy()
        survived = r.stopped_rung[i] == last
        if survived:
            y[last] = finals[i]
        ax.plot(ends, y, marker="o", ms=2.5, lw=0.9 if survived else 0.5, color=None if survived else "0.7",
                alpha=1.0 if survived else 0.6, label=setting(r, i) if survived else None, zorder=2 if survived else 1)
    b = r.best_index("all")
    ax.plot([ends[last]], [finals[b]], marker="*", ms=12, color="k", ls="none", label=f"chosen: {setting(r, b)}")
    ax.set_xscale("log")
    ax.set_xlabel("step at the rung's end")
    ax.set_ylabel("reward rate so far (the rung's score)", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)


def summary_line(r) -> str:
    """`bec-jax continuing`'s line on a result: the best setting by the reward
    rate over the whole run, its reward rate over the last 10% with the 95%
    interval over seeds, and a tabular task's optimal gain."""
    b = r.best_index("all")
    mean, low, high = (float(x[b]) for x in r.rate_interval("last10"))
    gain = r.optimal_gain
    return (f"best by reward rate over the whole run: {setting(r, b)}  reward rate over the last 10%: "
            f"{mean:.4g} [{low:.4g}, {high:.4g}] (95% CI)" + (f"; optimal gain {gain:.4g}" if gain is not None else ""))


def search_line(r) -> str:
    """A search's line (`engine.search.line`; "" for a full sweep): its rungs,
    the points each ran and the run-steps it spent against the full grid's."""
    from bec_jax.engine import search
    return search.line(r.meta.get("search")) if r.stopped_rung is not None else ""


def series_column(r) -> str | None:
    """The column a sensitivity figure draws one line per value of: eta where
    it varies, else gamma, else the first other varying column, else None."""
    varying = [n for n, v in r.grid.items() if len(set(np.asarray(v))) > 1]
    for n in ("eta", "gamma", *varying):
        if n in varying and n != "alpha":
            return n
    return None


def compare_figure(results: dict, metric: str | None = None, title: str = "", select: dict | None = None):
    """One panel: each result's best curve (by the reward rate over `metric`,
    a window, default the whole run), with the optimal gain of a tabular task."""
    window = check_metric(results, metric)
    points = chosen_points(results, window, select)
    fig, axes = new_figure(1, 1, panel=(7.0, 4.6))
    curves(axes[0, 0], results, points, title or ", ".join(sorted({r.task for r in results.values()})))
    fig.tight_layout()
    return fig


def plot_results(results: dict, out_dir: str, metric: str | None = None, select: dict | None = None,
                 prefix: str = "") -> list[str]:
    """Figures of continuing sweeps ({label: ContinuingResult}) into `out_dir`:
    the best curves (`<prefix>curves.png/pdf`), for each result whose grid
    varies alpha its sensitivity to alpha (`<prefix>sensitivity_<label>`), and
    for a search its rungs (`<prefix>rungs_<label>`, `rungs`). Returns the paths."""
    window = check_metric(results, metric)
    paths = save_figure(compare_figure(results, window, select=select), out_dir, f"{prefix}curves")
    for key, r in results.items():
        if "alpha" in r.grid and len(set(np.asarray(r.grid["alpha"]))) > 1:
            fig, axes = new_figure(1, 1)
            sensitivity(axes[0, 0], r, "alpha", series_column(r), window, title=f"{key} on {r.task}")
            fig.tight_layout()
            paths += save_figure(fig, out_dir, f"{prefix}sensitivity_{key}")
        if r.stopped_rung is not None:  # a search: its rungs
            fig, axes = new_figure(1, 1, panel=(7.0, 4.6))
            rungs(axes[0, 0], r, title=f"{key} on {r.task}: successive halving, {int(r.stopped_rung.max()) + 1} rungs")
            fig.tight_layout()
            paths += save_figure(fig, out_dir, f"{prefix}rungs_{key}")
    return paths


def summary_rows(results: dict, metric: str | None = None, confirmations: dict | None = None) -> list[dict]:
    """One row per result ({key: ContinuingResult}): its best setting by the
    reward rate over `metric` (a window) and there its summary record
    (`ContinuingResult.summary`). (`confirmations` is accepted for the
    prediction table's signature; continuing runs have none.)"""
    window = check_metric(results, metric)
    rows = []
    for key, r in results.items():
        b = r.best_index(window)
        rec = r.summary()[b]
        stats = {k: v for k, v in rec.items() if k not in r.grid and k not in ("task", "algorithm")}
        rows.append({"sweep": key, "task": r.task, "algorithm": r.algorithm, "setting": setting(r, b),
                     "best_by": window, "seeds": r.seeds, "steps": r.blocks * r.block_steps, **stats})
    return rows


# ---------------------------------------------------------------- per-seed views (`run.kinds.Scores`)

def seed_scores(r, i: int, window: str | None = None) -> np.ndarray:
    """(N,) each run's reward rate over `window` (None: the whole run) at grid point i."""
    return np.asarray(r.reward_rate(check_metric({}, window))[i], np.float64)


def seed_curves(r, i: int, window: str | None = None):
    """(steps at each log block's end, (N, L) each run's mean reward per block) at grid point i."""
    return np.arange(1, r.blocks + 1) * r.block_steps, np.asarray(r.reward[i], np.float64)


def mean_curves(r, i: int) -> dict:
    """{tag: (x, y)} of grid point i, by step: the reward rate per block, the
    learner's reward-rate estimate and the largest |w|, each a mean over seeds."""
    x = np.arange(1, r.blocks + 1) * r.block_steps
    return {"reward_rate": (x, r.reward[i].astype(np.float64).mean(0)),
            "rate_estimate": (x, r.rate_estimate[i].astype(np.float64).mean(0)),
            "max_abs_w": (x, r.max_abs_w[i].astype(np.float64).mean(0))}


def higher_is_better(window: str | None) -> bool:
    """True: a reward rate."""
    return True


def task_of(r) -> str:
    """The task a result ran on, as its spec names it."""
    return str(r.task)
