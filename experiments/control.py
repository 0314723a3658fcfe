"""The authors' control experiments (GameAI-NJUPT/BEC), swept as one program per
task (every algorithm and setting; `control.sweep.run_many`): `bec-jax
reproduce --paper control`.

Q-learning (Q), centered Q-learning (CQ), Greedy-GQ (GQ) and centered Greedy-GQ
(CGQ), and beyond the authors reward-centered Q-learning (simple and value-based,
Naik et al. 2024), on CliffWalking, the authors' 13x13 Maze, MountainCar and
Acrobot (tile coded), with the authors' set-up: epsilon-greedy with epsilon 0.01
decayed by 0.9992 per episode to 1e-4, gamma 0.99, episodes capped at the
task's limit (the capped transition learned as non-terminal), weights, u and
omega starting at 0. Each algorithm runs a step-size grid around the authors'
setting (alpha 0.1, beta 1e-4, zeta per task) with 10 seeds; the best setting
(fewest steps per episode on average over all episodes, the authors' metric) is
then run again on 10 fresh seeds, and the comparisons with confidence intervals
use those fresh runs only, so the selection does not bias them.

Writes curves (steps per episode by episode, as the authors plot, and by step),
the step-size sensitivity, `table.md`/`table.csv`, `report.md` and `meta.json`.
GQ and CGQ are the published forms (no correction at termination); the authors'
forms are `gq_authors`/`cgq_authors` (see `bec_jax.control.algorithms`).
"""
from __future__ import annotations

import os

import numpy as np

from bec_jax.control import plotting as cplot
from bec_jax.control import sweep
from bec_jax.control.results import ControlResult
from bec_jax.control.spec import ControlSpec
from bec_jax.experiments.reproduction import (
    Reproduction,
    cost_seconds,
    is_output,
    sweep_threads,
)
from bec_jax.prediction import plotting
from bec_jax.stats import t_interval, welch_interval

KIND = "bec-jax reproduce --paper control"

# The authors' main.py settings: episodes, zeta (alpha 0.1 and beta 1e-4 everywhere);
# budget: the selection runs' step budget per run. A setting with a run that has
# not finished its episodes within it is out of the selection (reported as
# incomplete): with a fast beta, centered agents can wander until the episode cap,
# and one such run would hold its whole program for episodes x cap steps.
TASKS = {
    "cliff_walking": {"episodes": 3000, "zeta": 0.005, "budget": 300_000, "grid": "full", "title": "CliffWalking"},
    "maze": {"episodes": 2000, "zeta": 0.001, "budget": 400_000, "grid": "full", "title": "Maze (13x13)"},
    "mountain_car": {"episodes": 1500, "zeta": 0.001, "budget": 600_000, "grid": "alpha",
                     "title": "MountainCar (tile coded)"},
    "acrobot": {"episodes": 1500, "zeta": 0.1, "budget": None, "grid": "authors", "title": "Acrobot (tile coded)"},
}
ALGORITHMS = ("q", "cq", "gq", "cgq", "rcq_simple", "rcq_value")
AUTHORS = {"alpha": 0.1, "beta": 1e-4}
ALPHAS = (0.05, 0.1, 0.2)
BETAS = (1e-4, 1e-3)
ZETA_FACTORS = (0.2, 1.0, 5.0)
BEHAVIOUR = {"epsilon": 0.01, "epsilon_decay": 0.9992, "epsilon_min": 1e-4}
SEEDS = 10
CONFIRM_SEED = 1  # the base seed of the fresh runs (the selection uses seed 0)
QUICK = {"seeds": 3, "episodes": 60, "tasks": ("cliff_walking",)}

COLORS = {"q": "C0", "cq": "C1", "gq": "C2", "cgq": "C3", "rcq_simple": "C4", "rcq_value": "C5"}
STYLES = {"cq": "--", "cgq": "--", "rcq_value": ":"}


def algorithms_for(task: str) -> tuple:
    """The algorithms run on `task`: value-based reward centering only on the
    tabular tasks, where it shows that it is CQ (identical runs); on the
    tile-coded ones it would repeat CQ's runs."""
    return ALGORITHMS if TASKS[task]["grid"] == "full" else ALGORITHMS[:-1]


def grid(task: str, alg: str) -> dict:
    """The step-size grid of `alg` on `task`. The tabular tasks: alpha x beta x
    zeta around the authors' setting; MountainCar: alpha only (beta, zeta the
    authors'); Acrobot (234,375 features, the slowest): the authors' setting
    only. Beta and zeta only where the algorithm takes them."""
    z = TASKS[task]["zeta"]
    kind = TASKS[task]["grid"]
    g = {"alpha": ALPHAS if kind != "authors" else (AUTHORS["alpha"],)}
    if alg in ("cq", "cgq", "rcq_simple", "rcq_value"):
        g["beta"] = BETAS if kind == "full" else (AUTHORS["beta"],)
    if alg in ("gq", "cgq"):
        g["zeta"] = tuple(float(f"{z * f:.6g}") for f in ZETA_FACTORS) if kind == "full" else (z,)
    return g


def spec_for(task: str, alg: str, quick: bool = False, **changes) -> ControlSpec:
    """The selection sweep of `alg` on `task` (the quick one for tests)."""
    episodes = QUICK["episodes"] if quick else TASKS[task]["episodes"]
    # The quick runs' first episodes are most of them: half the episode cap each.
    # A one-setting grid selects nothing, so it needs no budget (None: episodes x cap).
    budget = TASKS[task]["budget"] if not quick else episodes * 500
    kw = {"max_steps": budget, **changes}
    return ControlSpec(task=task, algorithm=alg, hyperparameters=grid(task, alg), episodes=episodes,
                       seeds=QUICK["seeds"] if quick else SEEDS, **BEHAVIOUR, **kw)


def _point_spec(r: ControlResult, i: int, seed: int) -> ControlSpec:
    """Grid point i of r alone, on the seeds of base `seed`, with no step budget
    (a stuck run is reported, not cut)."""
    return r.spec.replace(hyperparameters={k: [v] for k, v in r.point(i).items()}, seed=seed, max_steps=None)


def run_all(quick: bool = False, log=print, pool=None, out_dir: str | None = None) -> tuple[dict, dict]:
    """(selection, confirmation): {task: {alg: ControlResult}} for the grids and
    for each algorithm's best setting on fresh seeds. Every algorithm of a task
    runs in one program (`sweep.run_many`): the grids in one, the fresh-seed
    runs of the best settings in another; two tasks at a time with a pool (XLA
    compiles outside the GIL). With `out_dir`, each sweep's result is saved as
    it finishes (sweeps/<task>-<alg>[-confirm]/), so nothing computed is lost
    if a later step fails."""

    def keep(r, name):
        if out_dir is not None and r is not None:
            r.save(os.path.join(out_dir, "sweeps", name))
        return r
    tasks = QUICK["tasks"] if quick else tuple(TASKS)

    def select(t):
        algs = algorithms_for(t)
        rs = sweep.run_many([spec_for(t, a, quick) for a in algs])
        for a, r in zip(algs, rs):
            keep(r, f"{t}-{a}")
        _log_program(log, t, "grids", rs)
        return t, dict(zip(algs, rs))

    def confirm(item):
        t, by = item
        out, todo = {}, {}
        for a, r in by.items():
            if r.num_points == 1:  # nothing was selected: no selection bias to remove
                out[a] = r
                continue
            try:
                todo[a] = _point_spec(r, r.best_index("length"), CONFIRM_SEED)
            except ValueError:  # every setting failed a run: the table says so
                out[a] = None
        if todo:
            rs = sweep.run_many(list(todo.values()))
            for a, r in zip(todo, rs):
                out[a] = keep(r, f"{t}-{a}-confirm")
            _log_program(log, t, "best settings, fresh seeds", rs)
        return t, {a: out[a] for a in by}

    mapper = pool.map if pool is not None else map
    sel = dict(mapper(select, tasks))
    conf = dict(mapper(confirm, sel.items()))
    return sel, conf


def _log_program(log, task: str, what: str, rs: list) -> None:
    """One line for the program(s) that ran `rs` (sweeps of one task)."""
    m = rs[0].meta
    points = sum(r.num_points for r in rs)
    compile_s, run_s = cost_seconds(r.meta for r in rs)
    log(f"  {task:13s} {what}: {len(rs)} algorithms, {points} points x {rs[0].seeds} seeds x "
        f"{rs[0].episodes} episodes: compile {compile_s:.1f} s, run {run_s:.1f} s, "
        f"{sum(r.meta['logged_steps'] for r in rs):,} steps" + ("" if m.get("shared_program") else " (separate programs)"))


def shift_controls(conf: dict, log=print, pool=None, out_dir: str | None = None) -> dict:
    """{task: ControlResult}: the constant-shift control of CQ. Q-learning at
    CQ's best alpha on r - c, c = CQ's mean final omega there, on CQ's fresh
    seeds: if centering's gain is a reward shift, this does as well."""
    jobs = [t for t in conf if conf[t].get("cq") is not None and conf[t].get("q") is not None]

    def one(t):
        cq = conf[t]["cq"]
        c = float(np.mean(cq.omega[0][cq.diverged_step[0] < 0]))
        spec = cq.spec.replace(algorithm="q", hyperparameters={"alpha": [float(cq.grid["alpha"][0])]},
                               reward_shift=c)
        r = sweep.run(spec, progress=False)
        if out_dir is not None:
            r.save(os.path.join(out_dir, "sweeps", f"{t}-q-shift"))
        log(f"  {t:13s} q, r - {c:.4g} (CQ's final omega): {r.meta['logged_steps']:,} steps")
        return t, r

    return dict((pool.map if pool is not None else map)(one, jobs))


# ------------------------------------------------------------------ tables and comparisons

def table_rows(sel: dict, conf: dict) -> list[dict]:
    """One row per (task, algorithm): the best setting and, on the fresh seeds,
    its mean steps per episode over all episodes and over the last 10%, the
    final return and omega, each with a 95% t-interval; and how many settings of
    the grid had a diverged run or one that did not finish within the budget."""
    rows = []
    for t, by in sel.items():
        for a, r in by.items():
            c = conf[t][a]
            failed = ~r.valid.all(-1)
            row = {"task": t, "algorithm": a, "grid_points": r.num_points,
                   "diverged_in_grid": int((r.diverged_fraction > 0).sum()), "failed_in_grid": int(failed.sum()),
                   "fresh_seeds": c is not r}
            if c is None:
                rows.append(row)
                continue
            row.update(r.point(r.best_index("length")) if r.num_points > 1 else r.point(0))
            for name, vals in (("steps_per_episode", c.auc_seed("length")[0]),
                               ("final_steps_per_episode", c.final_seed("length")[0]),
                               ("final_return", c.final_seed("return")[0])):
                m, lo, hi = t_interval(vals[np.isfinite(vals)])
                row[name], row[f"{name}_ci_low"], row[f"{name}_ci_high"] = m, lo, hi
            if c.omega is not None:
                row["omega"] = float(np.mean(c.omega[0][c.diverged_step[0] < 0]))
            row["valid_runs"] = int(c.valid[0].sum())
            rows.append(row)
    return rows


def _g(v) -> str:
    return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{v:.4g}"


def table_markdown(rows: list[dict]) -> str:
    """The table as Markdown."""
    head = ("| task | algorithm | alpha | beta | zeta | steps/episode, all episodes (95% CI) | "
            "last 10% (95% CI) | final return | omega | valid runs | settings failed (diverged) |")
    out = [head, "|" + "---|" * 11]
    for r in rows:
        if "steps_per_episode" not in r:
            out.append(f"| {r['task']} | {r['algorithm']} | every setting failed a run |" + " |" * 7
                       + f" {r['failed_in_grid']} ({r['diverged_in_grid']}) of {r['grid_points']} |")
            continue
        out.append(f"| {r['task']} | {r['algorithm']} | {_g(r.get('alpha'))} | {_g(r.get('beta'))} | "
                   f"{_g(r.get('zeta'))} | {_g(r['steps_per_episode'])} [{_g(r['steps_per_episode_ci_low'])}, "
                   f"{_g(r['steps_per_episode_ci_high'])}] | {_g(r['final_steps_per_episode'])} "
                   f"[{_g(r['final_steps_per_episode_ci_low'])}, {_g(r['final_steps_per_episode_ci_high'])}] | "
                   f"{_g(r['final_return'])} | {_g(r.get('omega'))} | {r['valid_runs']} | "
                   f"{r['failed_in_grid']} ({r['diverged_in_grid']}) of {r['grid_points']} |")
    return "\n".join(out) + "\n"


def comparisons(conf: dict, sel: dict) -> list[dict]:
    """What centering changes: CQ - Q, CGQ - GQ and reward centering - Q in mean
    steps per episode (all episodes), at each one's best setting (on fresh seeds
    where there was a choice), and at the authors' setting in the selection runs,
    with Welch intervals. NaN where a side has no valid runs."""
    pairs = (("cq", "q"), ("cgq", "gq"), ("rcq_simple", "q"), ("rcq_value", "q"))
    out = []
    for t in conf:
        for a, b in pairs:
            if a not in conf[t]:
                continue
            ca, cb = conf[t][a], conf[t][b]
            best = (welch_interval(ca.auc_seed("length")[0], cb.auc_seed("length")[0])
                    if ca is not None and cb is not None else (np.nan,) * 3)
            ra, rb = sel[t][a], sel[t][b]
            auth = welch_interval(ra.auc_seed("length")[_authors_point(ra, t)],
                                  rb.auc_seed("length")[_authors_point(rb, t)])
            out.append({"task": t, "centered": a, "baseline": b, "best_diff": best[0], "best_low": best[1],
                        "best_high": best[2], "authors_diff": auth[0], "authors_low": auth[1],
                        "authors_high": auth[2]})
    return out


def _authors_point(r: ControlResult, task: str) -> int:
    """The grid point at the authors' setting (alpha 0.1, beta 1e-4, the task's zeta)."""
    want = {"alpha": AUTHORS["alpha"], "beta": AUTHORS["beta"], "zeta": TASKS[task]["zeta"]}
    ok = np.ones(r.num_points, bool)
    for n, v in r.grid.items():
        ok &= np.isclose(v, want[n])
    return int(np.flatnonzero(ok)[0])


def identical(sel: dict) -> dict:
    """{task: bool}: value-based reward centering gave the same episodes as CQ
    at every grid point (the paper's remark that VRC is CTD), where it ran."""
    return {t: bool(np.array_equal(by["rcq_value"].lengths, by["cq"].lengths)
                    and np.array_equal(by["rcq_value"].returns, by["cq"].returns))
            for t, by in sel.items() if "rcq_value" in by}


def shift_table(conf: dict, shifted: dict) -> list[dict]:
    """Per task: CQ, the shifted-Q control and Q (mean steps per episode over
    all episodes, fresh seeds), and CQ minus the control with a Welch interval."""
    rows = []
    for t, sh in shifted.items():
        cq, q = conf[t]["cq"], conf[t]["q"]
        row = {"task": t, "shift": sh.spec_dict["reward_shift"], "alpha": float(sh.grid["alpha"][0])}
        for name, r in (("cq", cq), ("q_shift", sh), ("q", q)):
            row[name], row[f"{name}_low"], row[f"{name}_high"] = t_interval(
                r.auc_seed("length")[0][np.isfinite(r.auc_seed("length")[0])])
        row["diff"], row["diff_low"], row["diff_high"] = welch_interval(cq.auc_seed("length")[0],
                                                                        sh.auc_seed("length")[0])
        rows.append(row)
    return rows


# ------------------------------------------------------------------ figures

def _styles(keys):
    from bec_jax.control import algorithms
    return {k: {"color": COLORS[k], "ls": STYLES.get(k, "-"), "label": algorithms.get(k).label} for k in keys}


def curves_figure(conf: dict, sel: dict, by: str = "episode"):
    """Steps per episode of each algorithm's best setting on the fresh seeds, one panel per task."""
    tasks = list(conf)
    rows, cols = (2, 2) if len(tasks) == 4 else (1, len(tasks))
    fig, axes = plotting.new_figure(rows, cols, panel=(6.2, 4.4))
    for ax, t in zip(axes.ravel(), tasks):
        # Value-based reward centering is identical to CQ: drawn once.
        rs = {a: r for a, r in conf[t].items() if a != "rcq_value" and r is not None}
        pts = {a: (0 if r.num_points == 1 else sel[t][a].best_index("length")) for a, r in rs.items()}
        pts = {a: (0 if conf[t][a] is not sel[t][a] else p) for a, p in pts.items()}
        cplot.curves(ax, rs, "length", by, styles=_styles(rs), title=TASKS[t]["title"], points=pts)
    fig.text(0.5, 0.005, "Each algorithm at its best setting (fewest steps per episode over the selection seeds), "
             "run again on fresh seeds (Acrobot: the authors' setting);\nvalue-based reward centering is identical "
             "to CQ and not drawn. Dashed: centered.", ha="center", va="bottom", fontsize=8, color="0.3")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def sensitivity_figure(sel: dict):
    """Mean steps per episode against alpha (best over beta, zeta), per task."""
    tasks = list(sel)
    rows, cols = (2, 2) if len(tasks) == 4 else (1, len(tasks))
    fig, axes = plotting.new_figure(rows, cols, panel=(5.6, 4.2))
    for ax, t in zip(axes.ravel(), tasks):
        rs = {a: r for a, r in sel[t].items() if a != "rcq_value"}
        cplot.sensitivity(ax, rs, "alpha", "length", styles=_styles(rs), title=TASKS[t]["title"])
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ report

def report_markdown(sel, conf, rows, comps, same, shift_rows, timing, quick) -> str:
    """The report: set-up, table, what centering changes, and the timing."""
    s = ["# Control: centered Q-learning and Greedy-GQ (the authors' control experiments)\n"]
    if quick:
        s.append("**Quick run** (few seeds and episodes): a smoke test, not evidence.\n")
    s.append(f"Set-up (as GameAI-NJUPT/BEC): epsilon-greedy, epsilon 0.01 x 0.9992 per episode down to 1e-4, "
             f"gamma 0.99, weights/u/omega start at 0. Grids: alpha {ALPHAS}, beta {BETAS}, zeta = the authors' "
             f"value x {ZETA_FACTORS}. Selection: {next(iter(next(iter(sel.values())).values())).seeds} seeds "
             f"(base seed 0); the best setting of each algorithm (fewest steps per episode over all episodes) is "
             f"run again on fresh seeds (base seed {CONFIRM_SEED}), and the numbers below are those fresh runs.\n")
    s.append("## Best settings on fresh seeds\n")
    s.append(table_markdown(rows))
    s.append("\n## What centering changes\n")
    s.append("Difference in mean steps per episode over all episodes (negative: the first learns faster), "
             "Welch 95% interval over seeds. 'Best' compares each algorithm at its own best setting (fresh "
             "seeds); 'authors' compares them at the authors' setting (alpha 0.1, beta 1e-4, their zeta).\n")
    s.append("| task | comparison | best settings | authors' setting |\n|---|---|---|---|")
    for c in comps:
        verdict = lambda d, lo, hi: (f"{d:+.3g} [{lo:+.3g}, {hi:+.3g}]"
                                     + (" (no difference shown)" if lo <= 0 <= hi else ""))
        s.append(f"| {c['task']} | {c['centered']} - {c['baseline']} | "
                 f"{verdict(c['best_diff'], c['best_low'], c['best_high'])} | "
                 f"{verdict(c['authors_diff'], c['authors_low'], c['authors_high'])} |")
    s.append("")
    s.append("Value-based reward centering (Naik et al. 2024) gave exactly the episodes of CQ on every task and "
             "grid point: " + ", ".join(f"{t}: {'identical' if v else 'DIFFERENT'}" for t, v in same.items())
             + ". Its update rbar += beta delta_c is omega's update in CQ (the paper's remark that VRC is CTD).\n")
    s.append("## Centering or a reward shift?\n")
    s.append("CQ's error delta - omega is Q-learning's TD error for the reward r - omega, so CQ is Q-learning on a "
             "reward shifted by a learned, slowly moving omega. The control: Q-learning at CQ's best alpha on "
             "r - c with the constant c = CQ's mean final omega, on the same fresh seeds. Mean steps per episode "
             "over all episodes (95% intervals); the last column is CQ minus the control (Welch).\n")
    s.append("| task | c | CQ | Q on r - c | Q (its best setting) | CQ - control | reading |\n|---|---|---|---|---|---|---|")
    for r in shift_rows:
        ci = lambda k: f"{r[k]:.4g} [{r[k + '_low']:.4g}, {r[k + '_high']:.4g}]"
        lo, hi = r["diff_low"], r["diff_high"]
        reading = ("no difference from the constant shift shown" if lo <= 0 <= hi or not np.isfinite(lo) else
                   "centering beats the constant shift" if hi < 0 else "the constant shift beats centering")
        s.append(f"| {r['task']} | {r['shift']:.4g} | {ci('cq')} | {ci('q_shift')} | {ci('q')} | "
                 f"{r['diff']:+.3g} [{lo:+.3g}, {hi:+.3g}] | {reading} |")
    s.append("")
    s.append(f"## Time\n\n{timing['device']}: {timing['programs']} programs, trace {timing['trace_s']:.1f} s, "
             f"compile {timing['compile_s']:.1f} s (persistent cache: {timing['cache']}), "
             f"run {timing['run_s']:.1f} s, {timing['steps']:,} environment steps in all; "
             f"total {timing['total_s']:.1f} s.\n")
    return "\n".join(s)


def is_reproduce_dir(path: str) -> bool:
    """True if `path` holds this reproduction's earlier output."""
    return is_output(path, KIND)


def reproduce(out_dir: str = os.path.join("results", "control"), quick: bool = False, log=print) -> dict:
    """Runs the control experiments and writes figures, table and report to `out_dir`."""
    run = Reproduction(KIND, out_dir, quick, log)
    with sweep_threads() as pool:
        sel, conf = run_all(quick, log, pool, out_dir)
        shifted = shift_controls(conf, log, pool, out_dir)
    rows = table_rows(sel, conf)
    comps = comparisons(conf, sel)
    same = identical(sel)
    run.save_figures({"control_curves": curves_figure(conf, sel),
                      "control_curves_by_step": curves_figure(conf, sel, "step"),
                      "control_sensitivity": sensitivity_figure(sel)})
    # Each program once: an algorithm whose grid had one point is its own confirmation.
    allr = list({id(r): r for d in (sel, conf) for by in d.values() for r in by.values() if r is not None}.values())
    allr += list(shifted.values())
    timing = {**run.timing(r.meta for r in allr), "steps": sum(r.meta["logged_steps"] for r in allr)}
    run.write_table(rows, table_markdown(rows))
    shift_rows = shift_table(conf, shifted)
    report = report_markdown(sel, conf, rows, comps, same, shift_rows, timing, quick)
    records = {"table": rows, "comparisons": comps, "vrc_equals_cq": same, "shift_control": shift_rows,
               "specs": {t: {a: r.spec_dict for a, r in by.items()} for t, by in sel.items()}}
    return run.finish(report, timing, records, table_markdown(rows))
