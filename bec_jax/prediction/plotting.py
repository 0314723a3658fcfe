"""Figures from sweep results: learning curves and sensitivity panels for any
sweep. Reads `SweepResult`s only.

Figures are `matplotlib.figure.Figure` objects made without pyplot, so importing
or using this module never changes the user's matplotlib backend or touches
pyplot's global figure list; `save_figure` writes them (PNG and PDF, atomically).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from bec_jax.files import atomic_write, csv_text
from bec_jax.prediction.results import SweepResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

METRIC_LABELS = {"rmscbe": "RMSCBE", "rmspcbe": "RMSPCBE", "rmspbe": "RMSPBE", "rmsve": "RMSVE", "rmsbe": "RMSBE",
                 "rmspbe_emphatic": "RMSPBE (emphatic weighting)",
                 "rmspcbe_emphatic": "RMSPCBE (emphatic weighting)", "rmsve_emphatic": "RMSVE (emphatic weighting)",
                 "fixpoint_distance": "distance to the centered TD fixpoint set"}
SYMBOLS = {"alpha": "\u03b1", "beta": "\u03b2", "zeta": "\u03b6", "lambda": "\u03bb", "gamma": "\u03b3",
           "eta": "\u03b7"}


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


def symbol(name: str) -> str:
    """The Greek letter of a hyperparameter name where there is one (alpha -> α)."""
    return SYMBOLS.get(name, name)


def step_label(r: SweepResult, i: int, varying_only: bool = True) -> str:
    """'α=0.01, β=0.1' for grid point i: the grid columns that take more than one
    value in `r` (every column with `varying_only=False`, or when none varies)."""
    point = r.point(i)
    cols = [n for n in point if len(np.unique(r.grid[n])) > 1] if varying_only else list(point)
    return ", ".join(f"{symbol(n)}={_fmt(point[n])}" for n in (cols or list(point)))


def algorithm_label(r: SweepResult) -> str:
    """The algorithm's display name (its `Algorithm.label`), or its name."""
    try:
        return r.spec.algorithm_def.label
    except AttributeError:
        return r.algorithm


def new_figure(rows: int = 1, cols: int = 1, *, panel: tuple = (5.6, 4.4)):
    """(figure, axes array of shape (rows, cols)), without pyplot."""
    # Imported here: a process that draws nothing never imports matplotlib.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(panel[0] * cols, panel[1] * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def save_figure(fig: Figure, out_dir: str, name: str, formats=("png", "pdf"), dpi: int = 130) -> list[str]:
    """Writes `name`.png and `name`.pdf into `out_dir` (each atomically); returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for ext in formats:
        path = os.path.join(out_dir, f"{name}.{ext}")
        atomic_write(path, lambda f, ext=ext: fig.savefig(f, format=ext, dpi=dpi), binary=True)
        paths.append(path)
    return paths


def _wants_log(values: np.ndarray) -> bool:
    v = values[np.isfinite(values) & (values > 0)]
    return v.size > 0 and v.max() / v.min() > 30


def _largest_step_point(r: SweepResult) -> int:
    """The grid point with the largest first step size (first such in grid order)."""
    alg = getattr(r.spec, "algorithm_def", None)
    names = [n for n in (alg.step_sizes if alg is not None else ("alpha",)) if n in r.grid]
    col = r.grid[names[0]] if names else np.zeros(r.num_points)
    return int(np.flatnonzero(col == np.nanmax(col))[0])


def learning_curves(ax, results: dict, title: str = "", metric: str | None = None,
                    styles: dict | None = None) -> None:
    """Mean error with a shaded +-1 std band for each result's best grid point
    (lowest AUC). When that best curve grows, the algorithm is diverging, and its
    slowest-growing step size hides it: the largest-step-size curve is drawn too
    (thin, dotted), so the divergence is visible. A curve whose seeds all
    diverged stops at its last step with a surviving seed, marked with a cross.

    results: {key: SweepResult}; styles: optional {key: {"color", "ls", "label"}}.
    """
    all_vals = []
    styles = styles or {}
    for key, r in results.items():
        st = styles.get(key, {})
        name = st.get("label", algorithm_label(r))
        b = r.best_index(metric)
        mean, std = r.curve(b, metric)
        # +inf marks "every seed diverged" (see bec_jax.prediction.results): nothing to draw there.
        mean = np.where(np.isfinite(mean), mean, np.nan)
        std = np.where(np.isfinite(std), std, np.nan)
        steps = r.steps
        frac = r.diverged_fraction[b]
        growth = mean[-1] / mean[0] if np.isfinite(mean[-1]) and mean[0] > 0 else np.inf
        label = f"{name} ({step_label(r, b)})"
        if frac > 0:
            label += f", {frac:.1%} of runs diverged"
        elif growth > 1:
            label += f", grows ×{growth:.3g}"
        line, = ax.plot(steps, mean, color=st.get("color"), ls=st.get("ls", "-"), lw=1.7, label=label)
        c = line.get_color()
        # A log axis cannot show <= 0: clip the band's lower edge at mean / 10.
        lo = np.maximum(mean - std, mean / 10)
        ax.fill_between(steps, lo, mean + std, color=c, alpha=0.18, lw=0)
        all_vals.append(mean[np.isfinite(mean)])
        if growth > 1 or frac > 0:
            j = _largest_step_point(r)
            if j != b:
                mj, _ = r.curve(j, metric)
                alive = np.isfinite(mj)
                if r.diverged_fraction[j] >= 1:
                    lab = (f"{name} ({step_label(r, j)}), all seeds diverged "
                           f"by step {int(np.max(r.diverged_step[j]))}")
                elif np.isnan(mj[-1]):  # a search's point stopped early
                    lab = f"{name} ({step_label(r, j)}), stopped by the search at step {int(steps[alive][-1])}"
                else:
                    lab = f"{name} ({step_label(r, j)}), grows ×{mj[-1] / mj[0]:.3g}"
                ax.plot(steps[alive], mj[alive], color=c, ls=":", lw=1.2, label=lab)
                if not alive.all() and alive.any():
                    last = np.flatnonzero(alive)[-1]
                    ax.plot(steps[last], mj[last], "x", color=c, ms=8, mew=2)
                all_vals.append(mj[alive])
    vals = np.concatenate(all_vals) if all_vals else np.array([])
    if _wants_log(vals):
        ax.set_yscale("log")
    ax.set_xlabel("step")
    any_r = next(iter(results.values()))
    m = metric or any_r.metrics[0]
    ax.set_ylabel(f"{METRIC_LABELS.get(m, m)} (mean ± std, {any_r.seeds} seeds)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def sensitivity_panel(ax, r: SweepResult, over: str, series: str | None, fixed: dict | None,
                      title: str, metric: str | None, ylim: tuple, cmap: str = "viridis") -> None:
    """Error (mean over the run) against grid column `over` on a log x-axis, one
    line per value of column `series`. Settings where every seed diverged are
    drawn as crosses (in the series' colour) on the top edge; partly diverged
    ones get a red ring and keep their survivors' value."""
    import matplotlib
    groups = [None] if series is None else sorted(set(r.grid[series][~np.isnan(r.grid[series])]))
    colormap = matplotlib.colormaps[cmap]
    top = ylim[1]
    for gi, g in enumerate(groups):
        fx = dict(fixed or {})
        if g is not None:
            fx[series] = g
        s = r.sensitivity(over, stat="auc", metric=metric, fixed=fx)
        c = colormap(gi / max(1, len(groups) - 1)) if series else "k"
        y = s["y"].astype(float)
        dead = (s["diverged"] >= 1.0) | ~np.isfinite(y)
        part = (s["diverged"] > 0) & ~dead
        yl = np.where(dead, np.nan, np.minimum(y, top))
        lab = None if g is None else f"{symbol(series)}={_fmt(g)}"
        ax.plot(s["x"], yl, "o-", color=c, ms=3, lw=1.2, label=lab)
        if dead.any():  # in the series' colour, so one can tell which series diverged
            ax.plot(s["x"][dead], np.full(dead.sum(), top), "x", color=c, ms=7, mew=2, clip_on=False)
        if part.any():
            ax.plot(s["x"][part], yl[part], "o", mfc="none", mec="red", ms=8, mew=1.4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(*ylim)
    _drop_unlabelled_minor_ticks(ax)
    ax.set_xlabel(symbol(over))
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    if series:
        ax.legend(fontsize=6, ncol=2, loc="best")


def _drop_unlabelled_minor_ticks(ax) -> None:
    """No minor ticks on a log axis spanning two decades or more, where they
    carry no labels: they more than doubled the time to draw and save a figure
    of many panels (the reproduction's have 12). A narrower axis keeps them, as
    its minor ticks are what is labelled."""
    from matplotlib.ticker import NullLocator
    for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        if axis.get_scale() == "log" and 0 < lo and hi / lo >= 100:
            axis.set_minor_locator(NullLocator())


def error_range(results, metric: str | None = None) -> tuple:
    """A shared log-scale y range for sensitivity panels of several results."""
    vals = np.concatenate([r.mean[r._m(metric)].mean(axis=1) for r in results])
    vals = vals[np.isfinite(vals) & (vals > 0)]
    return (vals.min() / 1.5, min(vals.max() * 1.5, vals.min() * 1e6)) if vals.size else (1e-3, 1e3)


# ------------------------------------------------------------------ any sweep, any study

def _step_column(r: SweepResult) -> str | None:
    """The column a sensitivity plot puts on its log x-axis: the first varying step size."""
    alg = getattr(r.spec, "algorithm_def", None)
    names = list(alg.step_sizes) if alg is not None else ["alpha", "beta", "zeta"]
    varying = [n for n in r.grid if r.grid[n].dtype.kind == "f" and len(np.unique(r.grid[n])) > 1]
    for n in names + varying:
        if n in varying and np.all(r.grid[n] > 0):
            return n
    return None


def curves_figure(results: dict, metric: str | None = None, title: str = "", select: dict | None = None):
    """One learning-curve panel: each result's best grid point (or the point
    `select` names, {column: value}), mean with a ±1 std band."""
    fig, axes = new_figure(1, 1, panel=(7.0, 4.6))
    chosen = {}
    for key, r in results.items():
        if select:
            mask = r.select(**select)
            if not mask.any():
                raise ValueError(f"select: no grid point of {key!r} has {select}")
            chosen[key] = r.subset(mask)
        else:
            chosen[key] = r
    learning_curves(axes[0, 0], chosen, title, metric, {k: {"label": str(k)} for k in chosen})
    fig.tight_layout()
    return fig


def sensitivity_figure(r: SweepResult, metric: str | None = None, title: str = ""):
    """Error (mean over the run) against the first varying step size on a log
    x-axis, one line per value of the next varying column (the best over the
    rest). None when the sweep varies no step size."""
    over = _step_column(r)
    if over is None:
        return None
    others = [n for n in r.grid if n != over and len(np.unique(r.grid[n])) > 1]
    series = next((n for n in others if r.grid[n].dtype.kind == "f"), None)
    fig, axes = new_figure(1, 1, panel=(6.4, 4.4))
    sensitivity_panel(axes[0, 0], r, over, series, None, title, metric, error_range([r], metric))
    m = metric or r.metrics[0]
    axes[0, 0].set_ylabel(f"mean {METRIC_LABELS.get(m, m)} over the run")
    fig.tight_layout()
    return fig


def summary_rows(results: dict, metric: str | None = None, confirmations: dict | None = None) -> list[dict]:
    """One row per result: its best point (lowest AUC), the final error and the
    AUC with their 95% Student-t intervals over seeds, the diverged fraction and
    the point's exact mean-square verdict (`SweepResult.exact_verdicts`).
    `confirmations` ({key: the report of `runner.confirm`}) adds the confirmation
    run's numbers (`confirm_*` columns) where it re-ran this row's setting and
    metric; rows without one leave them empty."""
    rows = []
    for key, r in results.items():
        b = r.best_index(metric)
        rec = r.summary(metric)[b]
        m = metric or r.metrics[0]
        stats = {k: v for k, v in rec.items() if k not in r.grid and k not in ("env", "algorithm")}
        row = {"sweep": key, "env": r.env, "algorithm": r.algorithm,
               "setting": ", ".join(f"{n}={_fmt(v)}" for n, v in r.point(b).items()),
               "metric": m, "seeds": r.seeds, **stats}
        row["exact_verdict"] = r.exact_verdicts([b])[0]  # the best point's, whatever the grid's size
        if confirmations:
            rep = confirmations.get(key)
            c = rep["confirmation"] if rep and rep.get("metric") == m and rep.get("point") == r.point(b) else None
            row.update({"confirm_seeds": c and c["seeds"], "confirm_final": c and c["final"],
                        "confirm_final_ci_low": c and c["final_ci95"][0],
                        "confirm_final_ci_high": c and c["final_ci95"][1],
                        "confirm_auc": c and c["auc"], "confirm_auc_ci_low": c and c["auc_ci95"][0],
                        "confirm_auc_ci_high": c and c["auc_ci95"][1]})
        rows.append(row)
    return rows


def rows_markdown(rows: list[dict]) -> str:
    """A markdown table of `summary_rows` (numbers to 4 significant digits)."""
    if not rows:
        return ""
    cols = list(dict.fromkeys(k for r in rows for k in r))

    def cell(v):
        if v is None:
            return "-"
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return head + "".join("| " + " | ".join(cell(r.get(c)) for c in cols) + " |\n" for r in rows)


def check_metric(results: dict, metric: str | None) -> str | None:
    """`metric` if every result logged it (None: each one's first); `ValueError`
    naming `metric` otherwise."""
    for r in results.values():
        if metric is not None and metric not in r.metrics:
            raise ValueError(f"metric: {metric!r} was not logged by every run; available: {', '.join(r.metrics)}")
    return metric


def result_figures(results: dict, out_dir: str, metric: str | None = None, select: dict | None = None,
                   prefix: str = "") -> list[str]:
    """For each result: `curves_<name>.png` (its best point, or `select`),
    `sensitivity_<name>.png` and for a search `rungs_<name>.png` (`rungs`);
    for several: `<prefix>curves.png` (every best curve on one panel).
    Returns the paths."""
    paths = []
    for key, r in results.items():
        paths += save_figure(curves_figure({key: r}, metric, f"{key}: {r.env} / {r.algorithm}", select),
                             out_dir, f"curves_{key}", formats=("png",))
        fig = sensitivity_figure(r, metric, f"{key}: {r.env} / {r.algorithm}")
        if fig is not None:
            paths += save_figure(fig, out_dir, f"sensitivity_{key}", formats=("png",))
        if r.stopped_rung is not None:  # a search: its rungs
            fig, axes = new_figure(1, 1, panel=(7.0, 4.6))
            rungs(axes[0, 0], r, f"{key}: {r.env} / {r.algorithm}: successive halving, "
                                 f"{int(r.stopped_rung.max()) + 1} rungs")
            fig.tight_layout()
            paths += save_figure(fig, out_dir, f"rungs_{key}", formats=("png",))
    if len(results) > 1:
        paths += save_figure(curves_figure(results, metric, "best setting of each sweep", select), out_dir,
                             f"{prefix}curves", formats=("png",))
    return paths


def rungs(ax, r: SweepResult, title: str = "") -> None:
    """On `ax`: a search's rungs (`engine.search`): each grid point's score
    (the area under its first metric's mean curve so far) at every rung it
    was ranked at, against the rung's last step; one grey line a point that
    stopped, one coloured line a point that ran every step (its area over the
    whole run at the last rung), the chosen point marked. Points whose seeds
    diverged (+inf) are not drawn."""
    ends = np.asarray(r.meta.get("search", {}).get("rung_steps")
                      or np.linspace(0, r.steps[-1], r.rung_scores.shape[1] + 1)[1:])
    last = int(np.max(r.stopped_rung))
    finals = r.auc()
    drawn = []
    for i in np.argsort(r.stopped_rung, kind="stable"):
        y = np.asarray(r.rung_scores[i], np.float64).copy()
        survived = r.stopped_rung[i] == last
        if survived:
            y[last] = finals[i]
        y[~np.isfinite(y)] = np.nan
        drawn.append(y)
        ax.plot(ends, y, marker="o", ms=2.5, lw=0.9 if survived else 0.5, color=None if survived else "0.7",
                alpha=1.0 if survived else 0.6, label=step_label(r, i) if survived else None,
                zorder=2 if survived else 1)
    b = r.best_index()
    ax.plot([ends[last]], [finals[b]], marker="*", ms=12, color="k", ls="none", label=f"chosen: {step_label(r, b)}")
    ax.set_xscale("log")
    if _wants_log(np.concatenate(drawn)):
        ax.set_yscale("log")
    m = r.metrics[0]
    ax.set_xlabel("step at the rung's end")
    ax.set_ylabel(f"mean {METRIC_LABELS.get(m, m)} so far (the rung's score, lower is better)", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)


def search_line(r: SweepResult) -> str:
    """A search's line (`engine.search.line`; "" for a full sweep)."""
    from bec_jax.engine import search
    return search.line(r.meta.get("search")) if r.stopped_rung is not None else ""


def write_tables(out_dir: str, tables: list[list[dict]]) -> list[str]:
    """`table.md` (each list of rows as its own markdown table: the kinds of
    runs have different columns) and `table.csv` (every row, with the union of
    the columns) in `out_dir`. Returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    md = "\n".join(rows_markdown(rows) for rows in tables if rows)
    paths = []
    for name, text in (("table.md", md), ("table.csv", csv_text([r for rows in tables for r in rows]))):
        atomic_write(os.path.join(out_dir, name), lambda f, t=text: f.write(t))
        paths.append(os.path.join(out_dir, name))
    return paths


def plot_results(results: dict, out_dir: str, metric: str | None = None, select: dict | None = None,
                 confirmations: dict | None = None) -> list[str]:
    """For each result: `curves_<name>.png` (its best point, or `select`) and
    `sensitivity_<name>.png`; for all: `curves.png` (every best curve on one
    panel), `table.md` and `table.csv` (`summary_rows`, with `confirmations`).
    Returns the paths."""
    paths = result_figures(results, out_dir, metric, select)
    return paths + write_tables(out_dir, [summary_rows(results, metric, confirmations)])


# ---------------------------------------------------------------- per-seed views (`run.kinds.Scores`)

def chosen_points(results: dict, metric: str | None = None, select: dict | None = None) -> dict:
    """{key: grid point}: each result's best (`best_index(metric, where)`: the
    lowest AUC of a prediction metric, the best return or steps per episode of a
    control run, the highest reward rate over a continuing window), among the
    points `select` ({column: value}) names; `ValueError` naming `select` when it
    names none of a result's points. Every kind's figures choose by it."""
    out = {}
    for key, r in results.items():
        where = None
        if select:
            where = r.select(**select)
            if not where.any():
                raise ValueError(f"select: no grid point of {key!r} has {select}")
        out[key] = r.best_index(metric, where)
    return out


def seed_scores(r: SweepResult, i: int, metric: str | None = None) -> np.ndarray:
    """(N,) each seed's area under its own `metric` curve at grid point i (the
    mean over logged points; lower is better), +inf for a diverged seed;
    `ValueError` naming `dirs` for a result saved before per-seed areas were kept."""
    if r.auc_seed is None:
        raise ValueError(f"dirs: the run of {r.algorithm} on {r.env} keeps no per-seed areas (saved by an older "
                         "bec_jax); run it again for per-seed statistics")
    return np.asarray(r.auc_seed[r._m(metric), i], np.float64)


def seed_curves(r: SweepResult, i: int, metric: str | None = None):
    """None: a prediction sweep keeps its curves' mean, std and sem over seeds, not each seed's."""
    return None


def mean_curves(r: SweepResult, i: int) -> dict:
    """{tag: (x, y)} of grid point i: the mean over surviving seeds of each
    logged metric (+inf where none survives) and the surviving seeds' count, by step."""
    out = {m: (np.asarray(r.steps), np.asarray(r.mean[k, i], np.float64)) for k, m in enumerate(r.metrics)}
    out["alive"] = (np.asarray(r.steps), np.asarray(r.alive[i], np.float64))
    return out


def higher_is_better(metric: str | None) -> bool:
    """False: every prediction metric is an error."""
    return False


def task_of(r: SweepResult) -> str:
    """The environment a result ran on, as its spec names it."""
    return str(r.env)
