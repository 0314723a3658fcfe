"""`bec-jax analyze`: the exact theory of an algorithm on a finite MDP, point by
point of a step-size grid, without a run.

For each grid point (the cartesian product of the hyperparameter and
environment-parameter values given) it reports, all in float64 from the model:

* the fixpoint of the mean dynamics (`fixpoints.fixpoint_set` of the expected
  update G x + g = 0: unique, or an affine set and its dimension);
* the mean's spectral radius and rate under the chosen sampler (the first-moment
  operator of `mean_square`; under i.i.d. sampling that is I + G of
  `analysis.expected_update`), and the mean-square radius and RMS rate (the
  second-moment operator);
* the steps each needs to shrink by `tol`;
* the stationary RMS distance to the fixpoint and the stationary RMSCBE at these
  constant step sizes, where the second moment is bounded;
* the eigenvalues of the slow two-timescale matrix (`analysis.slow_ode_matrix`)
  where the algorithm has more than one field;
* the verdict: "diverges in mean", "mean stable, variance grows" or "stable in
  mean square".

Rates are per-step logarithms of growth factors: < 0 decays, > 0 grows.

`stability_map` draws the plane of two hyperparameters with both boundaries
(mean and mean square), and beside it the divergence fractions of a run
directory when one is given.
"""
from __future__ import annotations

import itertools
import json
import math
import os

import numpy as np

from bec_jax import algorithms, envs
from bec_jax.files import atomic_write
from bec_jax.theory import expected_updates as analysis
from bec_jax.theory import fixpoints, mean_square, metrics, verdicts

COLUMNS = ("mean radius", "mean rate", "mean-square radius", "RMS rate", "steps (mean)", "steps (RMS)",
           "stationary RMS to fixpoint", "stationary RMSCBE", "slow eigenvalues", "verdict")


def grid(names: list[str], values: dict) -> list[dict]:
    """The cartesian product of `values` ({name: list}) in the order of `names`
    (those given), the first varying slowest."""
    keys = [n for n in names if n in values]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(values[k] for k in keys))]


def _check_hyperparameters(alg, hyper: dict) -> None:
    for name in hyper:
        alg.hyperparameter(name)  # ValueError naming an undeclared one
    missing = [n for n in alg.step_sizes if n not in hyper]
    if missing:
        raise ValueError(f"{missing[0]}: the analysis needs the step size {missing[0]} of {alg.name} "
                         f"(--{missing[0]} v1,v2,...)")


def _fmt(x, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def analyze_point(env, alg, hp: dict, sampler: str = "markov", tol: float = 1e-3) -> dict:
    """Everything `bec-jax analyze` prints for one grid point, as a JSON-ready dict."""
    alg = algorithms.get(alg)
    G, g = analysis.expected_update(env, alg, hp)
    layout = analysis.state_layout(env, alg)
    fs = fixpoints.fixpoint_set(G, -g)
    w = layout[alg.weights]
    row = {"fixpoint": [float(v) for v in fs.theta[w]], "fixpoint_set_dimension": int(fs.null_space.shape[1]),
           "fixpoint_residual": fs.residual}
    ex = verdicts.exact(G, tol=tol)
    row.update(iid_mean_rate=ex.rate, iid_mean_stable=ex.stable)
    try:
        ms = mean_square.mean_square(env, alg, hp, sampler, tol)
    except ValueError as e:
        if not alg.traces:
            raise
        row.update(mean_square=None, verdict=("stable in mean (mean square not analysed)" if ex.stable
                                              else "diverges in mean"), note=str(e))
        ms = None
    if ms is not None:
        steps_mean = math.log(tol) / ms.mean_rate if ms.mean_stable and ms.mean_rate < 0 else math.inf
        R = metrics.metric(env, "rmscbe")
        row.update(mean_radius=ms.mean_radius, mean_rate=ms.mean_rate, mean_stable=ms.mean_stable,
                   mean_square_radius=ms.radius, rms_rate=ms.rate, bounded=ms.bounded, neutral=ms.neutral,
                   steps_mean=steps_mean, steps_rms=ms.steps_to_tol, method=ms.method,
                   stationary_rms_to_fixpoint=None if ms.stationary is None else ms.stationary.rms_to_fixpoint,
                   stationary_rmscbe=mean_square.stationary_metric(ms, np.asarray(R.R), np.asarray(R.h), w),
                   verdict=ms.label)
    if len(layout) > 1:
        try:
            ev = np.linalg.eigvals(analysis.slow_ode_matrix(env, alg, hp))
            row["slow_eigenvalues"] = {"real": [float(v) for v in ev.real], "imag": [float(v) for v in ev.imag]}
        except ValueError as e:
            row["slow_eigenvalues"] = None
            row["slow_note"] = str(e)
    return row


def analyze_grid(env_source: str, algorithm, hyper: dict, env_params: dict | None = None,
                 sampler: str = "markov", tol: float = 1e-3) -> list[dict]:
    """`analyze_point` at every point of the grid: `hyper` and `env_params` are
    {name: list of values}; every step size of the algorithm must be given."""
    alg = algorithms.get(algorithm)
    _check_hyperparameters(alg, hyper)
    rows = []
    for ep in grid(list(env_params or {}), env_params or {}):
        env = envs.make(env_source, **ep)
        for hp in grid(list(alg.names), hyper):
            rows.append({"env": env_source, "env_params": ep, "algorithm": alg.name, "sampler": sampler,
                         "hyperparameters": hp, **analyze_point(env, alg, hp, sampler, tol)})
    return rows


def _slow_text(row) -> str:
    s = row.get("slow_eigenvalues")
    if s is None:
        return "-"
    ev = np.asarray(s["real"]) + 1j * np.asarray(s["imag"])
    zero = np.abs(ev) <= 1e-9 * max(np.abs(ev).max(initial=0.0), 1e-300)  # neutral: the fixpoint set's directions
    live = ev[~zero]
    tail = f" ({int(zero.sum())} zero)" if zero.any() else ""
    if len(live) == 0:
        return "all zero"
    if len(live) > 3:
        return f"max Re {live.real.max():+.3g}" + tail
    return ", ".join(f"{v.real:+.3g}" + (f"{v.imag:+.2g}i" if abs(v.imag) > 1e-12 else "") for v in live) + tail


def table_markdown(rows: list[dict]) -> str:
    """One markdown table: a row per grid point."""
    if not rows:
        return ""
    keys = list(rows[0]["env_params"]) + list(rows[0]["hyperparameters"])
    head = keys + ["fixpoint (theta)"] + list(COLUMNS)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vals = {**r["env_params"], **r["hyperparameters"]}
        fix = "[" + ", ".join(f"{v:.3g}" for v in r["fixpoint"][:4]) + (", ...]" if len(r["fixpoint"]) > 4 else "]")
        if r["fixpoint_set_dimension"]:
            fix += f" + {r['fixpoint_set_dimension']}-dim set"
        cells = [_fmt(vals[k]) for k in keys] + [fix]
        if r.get("mean_square_radius") is None:
            cells += ["-"] * (len(COLUMNS) - 2) + [_slow_text(r), r["verdict"]]
        else:
            cells += [_fmt(r["mean_radius"], 6), f"{r['mean_rate']:+.2e}", _fmt(r["mean_square_radius"], 6),
                      f"{r['rms_rate']:+.2e}", _fmt(float(math.ceil(r["steps_mean"])) if math.isfinite(
                          r["steps_mean"]) else math.inf, 6),
                      _fmt(float(math.ceil(r["steps_rms"])) if math.isfinite(r["steps_rms"]) else math.inf, 6),
                      _fmt(r["stationary_rms_to_fixpoint"]), _fmt(r["stationary_rmscbe"]), _slow_text(r),
                      r["verdict"]]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the stability map

def _axis(values) -> tuple[np.ndarray, bool]:
    v = np.asarray(sorted(set(float(x) for x in values)))
    log = bool(v.min() > 0 and v.max() / v.min() >= 10)
    return v, log


def _dense(v: np.ndarray, log: bool, points: int) -> np.ndarray:
    if len(v) == 1:
        return v
    return np.geomspace(v.min(), v.max(), points) if log else np.linspace(v.min(), v.max(), points)


def map_values(env_source: str, algorithm, hyper: dict, env_params: dict | None, axes: tuple[str, str],
               sampler: str = "markov", points: int = 15) -> dict:
    """Mean and mean-square radii on a `points` x `points` grid spanning the given
    values of the two `axes` (hyperparameters or environment parameters; log
    spaced when the values span a decade); every other value fixed at its first."""
    alg = algorithms.get(algorithm)
    env_params = dict(env_params or {})
    known = set(alg.names) | set(env_params)
    for a in axes:
        if a not in known:
            raise ValueError(f"map: {a!r} is neither a hyperparameter of {alg.name} nor a given env parameter "
                             f"(known: {', '.join(sorted(known))})")
    if axes[0] == axes[1]:
        raise ValueError(f"map: two different axes are needed, got {axes[0]!r} twice")
    given = {**hyper, **env_params}
    (xv, xlog), (yv, ylog) = _axis(given[axes[0]]), _axis(given[axes[1]])
    xs, ys = _dense(xv, xlog, points), _dense(yv, ylog, points)
    mean = np.full((len(ys), len(xs)), np.nan)
    square = np.full_like(mean, np.nan)
    fixed = {k: v[0] for k, v in given.items() if k not in axes}
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            vals = {**fixed, axes[0]: float(x), axes[1]: float(y)}
            ep = {k: vals[k] for k in env_params}
            hp = {k: vals[k] for k in alg.names if k in vals}
            ms = mean_square.mean_square(envs.make(env_source, **ep), alg, hp, sampler, stationary=False)
            mean[i, j], square[i, j] = ms.mean_radius, ms.radius
    return {"axes": list(axes), "x": xs.tolist(), "y": ys.tolist(), "log": [xlog, ylog], "fixed": fixed,
            "mean_radius": mean.tolist(), "mean_square_radius": square.tolist(), "sampler": sampler,
            "env": env_source, "algorithm": alg.name}


def run_divergence(run_dir: str, m: dict) -> dict:
    """`result_divergence` of the finished run in `run_dir` (`bec-jax run --out`)."""
    from bec_jax.run import kinds
    r = kinds.load_result(run_dir)
    if getattr(r, "KIND", None) != "prediction":
        raise ValueError(f"run: {run_dir!r} holds a control run; analyze overlays a prediction sweep")
    return result_divergence(r, m, f"run: {run_dir!r}")


def result_divergence(r, m: dict, field: str = "run") -> dict:
    """{x, y, diverged, seeds, steps} of the grid points of a sweep result whose
    other values equal the map's fixed ones (to 1e-9 relative)."""
    if r.algorithm != m["algorithm"]:
        raise ValueError(f"{field} ran {r.algorithm}, not {m['algorithm']}")
    a, b = m["axes"]
    out = {"x": [], "y": [], "diverged": [], "seeds": r.seeds, "steps": int(r.steps[-1])}
    for i in range(r.num_points):
        p = r.point(i)
        if a not in p or b not in p:
            raise ValueError(f"{field} has no column {a if a not in p else b!r}")
        if any(k in p and not math.isclose(float(p[k]), float(v), rel_tol=1e-9)
               for k, v in m["fixed"].items() if isinstance(v, (int, float))):
            continue
        out["x"].append(float(p[a]))
        out["y"].append(float(p[b]))
        out["diverged"].append(float(r.diverged_fraction[i]))
    return out


def stability_map(m: dict, path_dir: str, name: str = "stability_map", run: dict | None = None,
                  title: str | None = None) -> list[str]:
    """The map of `map_values` as a figure: the RMS rate log(radius) / 2 in colour,
    the mean boundary (mean radius = 1, solid) and the mean-square boundary
    (radius = 1, dashed); with `run` (`run_divergence`) a second panel of the
    simulated divergence fractions with the same boundaries. Returns the paths."""
    from matplotlib.colors import SymLogNorm
    from matplotlib.lines import Line2D

    from bec_jax.prediction import plotting

    xs, ys = np.asarray(m["x"]), np.asarray(m["y"])
    mean, square = np.asarray(m["mean_radius"]), np.asarray(m["mean_square_radius"])
    fig, axs = plotting.new_figure(1, 2 if run else 1, panel=(5.4, 4.4))
    rate = 0.5 * np.log(np.maximum(square, 1e-300))
    lim = max(float(np.nanmax(np.abs(rate))), 1e-12)
    panels = [axs[0, 0]] + ([axs[0, 1]] if run else [])
    for k, ax in enumerate(panels):
        if k == 0:
            # Rates span decades (1e-5 near the boundary, 1e-1 far past it): a
            # linear scale would show only the far corner.
            norm = SymLogNorm(linthresh=min(1e-4, lim / 10), vmin=-lim, vmax=lim)
            pc = ax.pcolormesh(xs, ys, rate, cmap="RdBu_r", norm=norm, shading="nearest")
            fig.colorbar(pc, ax=ax, label="RMS rate per step (log radius / 2)")
            ax.set_title(title or f"{m['algorithm'].upper()} on {m['env']} ({m['sampler']} sampling)", fontsize=10)
        else:
            sc = ax.scatter(run["x"], run["y"], c=run["diverged"], cmap="Reds", vmin=0, vmax=1, s=80,
                            edgecolors="k", zorder=3, clip_on=False)
            fig.colorbar(sc, ax=ax, label="fraction of seeds diverged")
            ax.set_title(f"simulated: {run['seeds']} seeds, {run['steps']} steps", fontsize=10)
        if len(xs) > 1 and len(ys) > 1:
            for field, style in ((mean, "-"), (square, "--")):
                if np.nanmin(field) < 1 < np.nanmax(field):
                    ax.contour(xs, ys, field, levels=[1.0], colors="k", linestyles=style, linewidths=1.6)
        ax.set_xlabel(m["axes"][0])
        ax.set_ylabel(m["axes"][1])
        if m["log"][0]:
            ax.set_xscale("log")
        if m["log"][1]:
            ax.set_yscale("log")
        if k == 1:  # the theory panel's extent, so both show the same plane
            ax.set_xlim(panels[0].get_xlim())
            ax.set_ylim(panels[0].get_ylim())
    fig.legend(handles=[Line2D([], [], color="k", ls="-", label="mean boundary (mean radius 1)"),
                        Line2D([], [], color="k", ls="--", label="mean-square boundary (radius 1)")],
               loc="lower center", ncol=2, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return plotting.save_figure(fig, path_dir, name)


# ---------------------------------------------------------------- the command

def write(out_dir: str, rows: list[dict], m: dict | None, run: dict | None) -> list[str]:
    """analysis.md, analysis.json and (with a map) stability_map.png/.pdf in `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "analysis.md"), os.path.join(out_dir, "analysis.json")]
    atomic_write(paths[0], lambda f: f.write(table_markdown(rows)))
    record = {"rows": rows, "map": m, "run": run}
    atomic_write(paths[1], lambda f: f.write(json.dumps(record, indent=1, default=_json_default) + "\n"))
    if m is not None:
        paths += stability_map(m, out_dir, run=run)
    return paths


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    raise TypeError(type(x).__name__)


def command(env: str, algorithm: str, hyper: dict, env_params: dict | None = None, sampler: str = "markov",
            out: str | None = None, run_dir: str | None = None, axes: tuple | None = None, points: int = 15,
            tol: float = 1e-3) -> str:
    """What `bec-jax analyze` does: the table (returned, for printing) and, with
    `out`, the files of `write`. The map's axes default to the first two
    hyperparameters (then environment parameters) given more than one value."""
    if sampler not in mean_square.SAMPLERS:
        raise ValueError(f"sampler: expected one of {', '.join(mean_square.SAMPLERS)}, got {sampler!r}")
    if not isinstance(points, int) or points < 2:
        raise ValueError(f"map_points: expected an integer >= 2, got {points!r}")
    if run_dir is not None and out is None:
        raise ValueError("run: the simulated overlay goes on the map; give --out DIR too")
    alg = algorithms.get(algorithm)
    rows = analyze_grid(env, alg, hyper, env_params, sampler, tol)
    text = table_markdown(rows)
    if out is None:
        return text
    if axes is None:
        varying = [n for n in list(alg.names) + list(env_params or {})
                   if len(set({**hyper, **(env_params or {})}.get(n, []))) > 1]
        axes = tuple(varying[:2]) if len(varying) >= 2 else None
        if run_dir is not None and axes is None:
            raise ValueError("map: the run overlay needs two axes with several values each (--map X,Y)")
    m = map_values(env, alg, hyper, env_params, tuple(axes), sampler, points) if axes else None
    run = run_divergence(run_dir, m) if run_dir is not None else None
    paths = write(out, rows, m, run)
    return text + "\nwrote " + ", ".join(paths) + ("" if m else " (no map: fewer than two axes vary)") + "\n"
