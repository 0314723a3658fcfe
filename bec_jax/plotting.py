"""Figures from sweep results: learning curves (the paper's Figure 1 layout) and
step-size sensitivity panels (the appendix's layout). Reads `SweepResult`s only."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from bec_jax.results import SweepResult  # noqa: E402

COLORS = {"td": "#1f77b4", "tdc": "#ff7f0e", "ctd": "#2ca02c", "ctdc": "#d62728",
          "src": "#9467bd", "vrc": "#8c564b", "ctdc_literal": "#e377c2"}
LABELS = {"td": "TD", "tdc": "TDC", "ctd": "CTD", "ctdc": "CTDC", "src": "SRC", "vrc": "VRC",
          "ctdc_literal": "CTDC (no rho on omega)"}
ENV_TITLES = {"boyan_chain": "Boyan chain", "two_state": "2-state counterexample",
              "baird": "7-state counterexample (Baird)"}
STYLES = {"td": "-", "tdc": "--", "ctd": "-", "ctdc": (0, (5, 1.5, 1, 1.5))}
METRIC_LABELS = {"rmscbe": "RMSCBE", "rmspcbe": "RMSPCBE", "rmspbe": "RMSPBE", "rmsve": "RMSVE"}


def _fmt(v: float) -> str:
    return f"{v:g}"


def step_label(r: SweepResult, i: int) -> str:
    """'alpha=0.01, beta=0.1' for grid point i."""
    sym = {"alpha": "\u03b1", "beta": "\u03b2", "zeta": "\u03b6"}
    return ", ".join(f"{sym[n]}={_fmt(v)}" for n, v in r.point(i).items() if v is not None)


def _wants_log(values: np.ndarray) -> bool:
    v = values[np.isfinite(values) & (values > 0)]
    return v.size > 0 and v.max() / v.min() > 30


def _largest_alpha_point(r: SweepResult) -> int:
    """The grid point with the largest alpha (first such in grid order)."""
    return int(np.flatnonzero(r.alpha == np.nanmax(r.alpha))[0])


def learning_curves(ax, results: dict[str, SweepResult], title: str = "", metric: str | None = None) -> None:
    """Mean error with a shaded +-1 std band for each algorithm's best grid point
    (lowest AUC). When that best curve grows, the algorithm is diverging, and its
    slowest-growing step size hides it: the largest-alpha curve is drawn too (thin,
    dotted), so the divergence is visible. A curve whose seeds all diverged stops at
    its last step with a surviving seed, marked with a cross."""
    all_vals = []
    for name, r in results.items():
        b = r.best_index(metric)
        mean, std = r.curve(b, metric)
        # +inf marks "every seed diverged" (see bec_jax.results): nothing to draw there.
        mean = np.where(np.isfinite(mean), mean, np.nan)
        std = np.where(np.isfinite(std), std, np.nan)
        steps = r.steps
        c = COLORS.get(name)
        frac = r.diverged_fraction[b]
        growth = mean[-1] / mean[0] if np.isfinite(mean[-1]) and mean[0] > 0 else np.inf
        label = f"{LABELS.get(name, name)} ({step_label(r, b)})"
        if frac > 0:
            label += f", {frac:.0%} diverged"
        elif growth > 1:
            label += f", grows ×{growth:.3g}"
        ax.plot(steps, mean, color=c, ls=STYLES.get(name, "-"), lw=1.7, label=label)
        # A log axis cannot show <= 0: clip the band's lower edge at mean / 10.
        lo = np.maximum(mean - std, mean / 10)
        ax.fill_between(steps, lo, mean + std, color=c, alpha=0.18, lw=0)
        all_vals.append(mean[np.isfinite(mean)])
        if growth > 1 or frac > 0:
            j = _largest_alpha_point(r)
            if j != b:
                mj, _ = r.curve(j, metric)
                alive = np.isfinite(mj)
                if r.diverged_fraction[j] >= 1:
                    lab = (f"{LABELS.get(name, name)} ({step_label(r, j)}), all seeds diverged "
                           f"by step {int(np.max(r.diverged_step[j]))}")
                else:
                    lab = f"{LABELS.get(name, name)} ({step_label(r, j)}), grows ×{mj[-1] / mj[0]:.3g}"
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
    ax.set_ylabel(f"{METRIC_LABELS.get(m, m)} (mean ± std, {any_r.spec.seeds} seeds)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def figure1(results: dict[str, dict[str, SweepResult]], metric: str | None = None):
    """The paper's Figure 1: one learning-curve panel per environment."""
    envs = list(results)
    fig, axes = plt.subplots(1, len(envs), figsize=(5.6 * len(envs), 4.4), squeeze=False)
    for ax, env in zip(axes[0], envs):
        learning_curves(ax, results[env], ENV_TITLES.get(env, env), metric)
    fig.text(0.5, 0.005, "Each algorithm at its step sizes with the lowest area under the curve; bands: "
             "±1 std across seeds (lower edge clipped at mean/10). Dotted: the largest α of a "
             "diverging algorithm.", ha="center", va="bottom", fontsize=8, color="0.3")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def _sens_panel(ax, r: SweepResult, over: str, series: str | None, fixed: dict | None,
                title: str, metric: str | None, ylim: tuple) -> None:
    """Error (mean over the run) against `over`, one line per value of `series`.
    Settings where every seed diverged are drawn as crosses (in the series'
    colour) on the top edge; partly diverged ones get a red ring and keep their
    survivors' value."""
    sym = {"alpha": "\u03b1", "beta": "\u03b2", "zeta": "\u03b6"}
    groups = [None] if series is None else sorted(set(getattr(r, series)[~np.isnan(getattr(r, series))]))
    cmap = plt.get_cmap("viridis")
    top = ylim[1]
    for gi, g in enumerate(groups):
        fx = dict(fixed or {})
        if g is not None:
            fx[series] = g
        s = r.sensitivity(over, stat="auc", metric=metric, fixed=fx)
        c = cmap(gi / max(1, len(groups) - 1)) if series else "k"
        y = s["y"].astype(float)
        dead = (s["diverged"] >= 1.0) | ~np.isfinite(y)
        part = (s["diverged"] > 0) & ~dead
        yl = np.where(dead, np.nan, np.minimum(y, top))
        lab = None if g is None else f"{sym[series]}={_fmt(g)}"
        ax.plot(s["x"], yl, "o-", color=c, ms=3, lw=1.2, label=lab)
        if dead.any():  # in the series' colour, so one can tell which series diverged
            ax.plot(s["x"][dead], np.full(dead.sum(), top), "x", color=c, ms=7, mew=2, clip_on=False)
        if part.any():
            ax.plot(s["x"][part], yl[part], "o", mfc="none", mec="red", ms=8, mew=1.4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(*ylim)
    ax.set_xlabel(sym[over])
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    if series:
        ax.legend(fontsize=6, ncol=2, loc="best")


def sensitivity_figure(env: str, results: dict[str, SweepResult], metric: str | None = None):
    """The appendix's sensitivity figure for one environment: TD, TDC (one line per
    zeta), CTD (one line per beta) against alpha, then one CTDC panel per alpha
    (error against beta, one line per zeta). Crosses on the top edge mark settings
    where every seed diverged; red rings, settings where some did."""
    ctdc = results.get("ctdc")
    alphas = sorted(set(ctdc.alpha)) if ctdc is not None else []
    n = 3 + len(alphas)
    cols = 3
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.3 * cols, 3.3 * rows), squeeze=False)
    vals = np.concatenate([r.mean[r._m(metric)].mean(axis=1) for r in results.values()])
    vals = vals[np.isfinite(vals) & (vals > 0)]
    ylim = (vals.min() / 1.5, min(vals.max() * 1.5, vals.min() * 1e6)) if vals.size else (1e-3, 1e3)
    panels = []
    if "td" in results:
        panels.append((results["td"], "alpha", None, None, "TD"))
    if "tdc" in results:
        panels.append((results["tdc"], "alpha", "zeta", None, "TDC"))
    if "ctd" in results:
        panels.append((results["ctd"], "alpha", "beta", None, "CTD"))
    for a in alphas:
        panels.append((ctdc, "beta", "zeta", {"alpha": a}, f"CTDC (\u03b1={_fmt(a)})"))
    flat = axes.ravel()
    for ax, (r, over, series, fixed, title) in zip(flat, panels):
        _sens_panel(ax, r, over, series, fixed, title, metric, ylim)
    for ax in flat[len(panels):]:
        ax.axis("off")
    m = metric or next(iter(results.values())).metrics[0]
    fig.suptitle(f"Step-size sensitivity, {ENV_TITLES.get(env, env)}: {METRIC_LABELS.get(m, m)} "
                 "averaged over the run\n× on the top edge: every seed diverged (in the line's colour);  "
                 "red ring: some seeds diverged (survivors' mean shown)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.955))
    for ax in flat[: len(panels)]:
        ax.set_ylabel(f"mean {METRIC_LABELS.get(m, m)}", fontsize=8)
    return fig
