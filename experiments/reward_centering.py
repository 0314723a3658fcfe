"""Naik, Wan, Tomar and Sutton, *Reward Centering* (RLC 2024, arXiv
2405.09999), reproduced on the continuing front: `bec-jax reproduce --paper
reward-centering`.

Tabular Q-learning (`q`), with simple reward centering (`q_src`) and with
value-based reward centering (`q_vrc`, beta = eta alpha as the paper ties
them), epsilon-greedy with epsilon 0.1, every run a continuing run of T steps
(`bec_jax.control.continuing`), on the paper's two tabular tasks:

  Access-Control  csuite's queuing task (Sutton & Barto Example 10.2), the
                  grid of Naik et al.'s config (config_files/accesscontrol/
                  CDiscQ.json): alpha 2^-7 .. 1 x eta {2^-8, 2^-6, 2^-4, 2^-2,
                  1} x gamma {0, 0.5, 0.8, 0.9, 0.99, 0.999, 1} x reward offset
                  {-8, -4, 0, 4, 8}, 50 runs x 50,000 steps;
  TwoChoice       the 9-state task, its config (twochoice/diffdiscQ.json):
                  alpha {0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 1, 1.1} x eta {2^-5 ..
                  2} x gamma {0.8, 0.84, 0.85, 0.9, 0.99, 0.999, 1}, 30 runs x
                  10,000 steps; offsets {-4, 0, 4} (theirs 0 for the centered
                  learner and -4 .. 4 for Q);

and, in the full form only (the quick form leaves them out), csuite's Catch and
Pendulum with tile-coded linear action values (`TILED`: Catch 16 tilings of
3^3, Pendulum 8 tilings of 7^3, Naik et al.'s features; their (alpha, eta) as
(alpha / n, n eta) per weight), at grids that fit a few minutes on two CPU
cores: alpha 4 x eta 3 x gamma {0.9, 0.99, 1} x offsets {-4, 0, 4} (Catch, 20
runs x 20,000 steps) or {-12, 0, 12} (Pendulum, 10 runs x 40,000 steps). No
exact gain there: claims (i) and (ii) only, with the tolerance taken from the
best reward rate reached.

eta = 0 (in their grids) is Q-learning bit for bit, so Q runs once per alpha
(not once per eta); Q runs at gamma = 1 too, and is shown there (no discount:
its values grow without bound). Every learner runs one program per task
(`continuing.sweep.run`), two at a time.

The paper's claims, each with a figure (95% t-intervals over runs, the exact
optimal gain as the reference line) and a verdict in report.md:

  (i)   with centering the reward rate holds as gamma -> 1, uncentered
        Q-learning's falls (best reward rate over the last 50% against gamma);
  (ii)  a reward offset hurts uncentered Q-learning, not centered (best reward
        rate against the offset);
  (iii) the centering estimate rbar (less the offset) converges to the optimal
        gain (its curve against the exact gain; final |rbar - gain|);
  (iv)  the BEC paper's reading: value-based reward centering is Bellman error
        centering, i.e. q_vrc at (alpha, eta) is CQ at (alpha, beta = eta alpha)
        run for run: both run on a few settings, compared bit for bit.

"Best" is the setting (alpha, and eta for the centered learners) with the
highest mean reward rate over the last 50% of the runs, chosen per learner,
gamma and offset on the same runs that report it (a selection bias of the
order of the interval, the same for every learner up to the grid's size).
"""
from __future__ import annotations

import os

import numpy as np

from bec_jax.control.continuing import exact, sweep
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.experiments.reproduction import Reproduction, is_output, sweep_threads
from bec_jax.files import csv_text, finite_or_none
from bec_jax.prediction import plotting
from bec_jax.stats import t_interval, welch_interval

KIND = "bec-jax reproduce --paper reward-centering"
EPSILON = 0.1
WINDOW = "last50"  # the reward rate every claim reads: over the last 50% of a run
LEARNERS = ("q", "q_src", "q_vrc")
CENTERED = ("q_src", "q_vrc")
LABELS = {"q": "Q (uncentered)", "q_src": "Q + simple centering", "q_vrc": "Q + value-based centering",
          "cq": "CQ", "dqn": "DQN (uncentered)", "cdqn_unbiased": "CDQN (value-based centering)",
          "cdqn_simple_unbiased": "CDQN (simple centering)"}
COLORS = {"q": "C0", "q_src": "C2", "q_vrc": "C3", "dqn": "C0", "cdqn_simple_unbiased": "C2", "cdqn_unbiased": "C3"}
TOL = 0.05  # a reward rate "holds" within 5% of the optimal gain

TASKS = {
    "access_control": {
        "title": "Access-Control", "alpha": tuple(2.0 ** -k for k in range(7, -1, -1)),
        "eta": (2.0 ** -8, 2.0 ** -6, 2.0 ** -4, 2.0 ** -2, 1.0),
        "gamma": (0.0, 0.5, 0.8, 0.9, 0.99, 0.999, 1.0), "offset": (-8.0, -4.0, 0.0, 4.0, 8.0),
        "seeds": 50, "steps": 50_000},
    "two_choice": {
        "title": "TwoChoice", "alpha": (0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.1),
        "eta": (2.0 ** -5, 2.0 ** -4, 2.0 ** -3, 2.0 ** -2, 0.5, 1.0, 2.0),
        "gamma": (0.8, 0.84, 0.85, 0.9, 0.99, 0.999, 1.0), "offset": (-4.0, 0.0, 4.0),
        "seeds": 30, "steps": 10_000, "log_every": 8},
}


def _tiled(title: str, tilings: int, paper_alpha: tuple, paper_eta: tuple, **rest) -> dict:
    """A tile-coded task's grid from Naik et al.'s step sizes: their alpha is
    divided by the number of tilings n and beta tied to the undivided one, so
    their (alpha, eta) is this front's per-weight (alpha / n, n eta)."""
    return {"title": title, "tilings": tilings, "paper_alpha": paper_alpha, "paper_eta": paper_eta,
            "alpha": tuple(a / tilings for a in paper_alpha), "eta": tuple(e * tilings for e in paper_eta),
            **rest}


# Catch and Pendulum (csuite's, tile-coded as Naik et al. code them), full form
# only, at grids that fit a few minutes on two CPU cores (their runs: Catch 50 x
# 20,000 with offsets -4 .. 4, Pendulum 10 x 100,000 with offsets -12 .. 12).
# Neither has an exact model here, so no optimal gain: claims (i) and (ii) only.
TILED = {
    "catch": _tiled("Catch", 16, (2.0 ** -4, 2.0 ** -3, 2.0 ** -2, 2.0 ** -1), (2.0 ** -5, 2.0 ** -3, 0.5),
                    gamma=(0.9, 0.99, 1.0), offset=(-4.0, 0.0, 4.0), seeds=20, steps=20_000),
    "pendulum": _tiled("Pendulum", 8, (2.0 ** -4, 2.0 ** -3, 2.0 ** -2, 2.0 ** -1), (2.0 ** -5, 2.0 ** -3, 0.5),
                       gamma=(0.9, 0.99, 1.0), offset=(-12.0, 0.0, 12.0), seeds=10, steps=40_000),
}
ALL = {**TASKS, **TILED}
QUICK = {
    "access_control": {"alpha": (2.0 ** -5, 2.0 ** -3, 2.0 ** -1), "eta": (2.0 ** -6, 2.0 ** -2),
                       "gamma": (0.9, 0.99, 1.0), "offset": (0.0, 8.0), "seeds": 8, "steps": 5_000},
    "two_choice": {"alpha": (0.1, 0.5), "eta": (2.0 ** -3, 0.5), "gamma": (0.8, 0.99, 1.0),
                   "offset": (0.0, 4.0), "seeds": 8, "steps": 2_000},
}
# The identity check (iv): q_vrc and CQ on the same runs. Step sizes whose
# products eta * alpha are exact (a power of two times alpha), so CQ's beta is
# the float32 number q_vrc forms (`continuing.learners`).
IDENTITY = {
    "access_control": {"alpha": (2.0 ** -4, 0.5), "eta": (2.0 ** -4, 1.0), "gamma": (0.99, 1.0),
                       "offset": (0.0, 8.0), "seeds": 10, "steps": 20_000},
    "two_choice": {"alpha": (0.1, 0.5), "eta": (2.0 ** -3, 1.0), "gamma": (0.9, 1.0),
                   "offset": (0.0, 4.0), "seeds": 10, "steps": 10_000},
}
IDENTITY_QUICK = {"seeds": 3, "steps": 2_000}


OTHER_TITLES = {"puckworld": "PuckWorld"}  # the deep form's tasks not in `ALL`


def title(task: str) -> str:
    """A task's name in figures and reports."""
    return ALL[task]["title"] if task in ALL else OTHER_TITLES.get(task, task.replace("_", " ").title())


def roles(by: dict) -> tuple[str, tuple]:
    """(the uncentered learner, the centered ones) of a task's sweeps
    {learner: result}: the first is the baseline (`run_all` puts Q first; the
    deep form DQN)."""
    names = list(by)
    return names[0], tuple(names[1:])


def settings(task: str, quick: bool) -> dict:
    """The grid and run lengths of `task` (the quick corner with `quick`).
    TwoChoice logs every 8 steps: its loops have period 5, so a log block of a
    multiple of 5 steps would sample the centering estimate, which simple
    centering moves with every reward, at one phase of the loop only."""
    return {**ALL[task], **QUICK[task]} if quick else dict(ALL[task])


def grid_spec(task: str, alg: str, quick: bool = False) -> ContinuingSpec:
    """The paper's sweep of `alg` on `task`: alpha (x eta for a centered
    learner) x gamma x reward offset, epsilon 0.1, seeds x steps."""
    s = settings(task, quick)
    hp = {"alpha": list(s["alpha"])}
    if alg != "q":
        hp["eta"] = list(s["eta"])
    return ContinuingSpec(task=task, algorithm=alg, hyperparameters=hp, epsilon=EPSILON,
                          gamma=list(s["gamma"]), reward_offset=list(s["offset"]), seeds=s["seeds"],
                          steps=s["steps"], log_every=s.get("log_every"))


def identity_specs(task: str, quick: bool = False) -> tuple[ContinuingSpec, ContinuingSpec]:
    """(q_vrc, cq) on the same seeds and loop settings: q_vrc at alpha x eta,
    CQ at alpha x every product beta = eta * alpha."""
    s = {**IDENTITY[task], **(IDENTITY_QUICK if quick else {})}
    betas = sorted({e * a for a in s["alpha"] for e in s["eta"]})
    common = dict(task=task, epsilon=EPSILON, gamma=list(s["gamma"]), reward_offset=list(s["offset"]),
                  seeds=s["seeds"], steps=s["steps"])
    vrc = ContinuingSpec(algorithm="q_vrc", hyperparameters={"alpha": list(s["alpha"]), "eta": list(s["eta"])},
                         **common)
    cq = ContinuingSpec(algorithm="cq", hyperparameters={"alpha": list(s["alpha"]), "beta": betas}, **common)
    return vrc, cq


def default_tasks(quick: bool) -> tuple:
    """The tasks a run covers: the tabular two, and Catch and Pendulum in the full form."""
    return tuple(TASKS) if quick else tuple(ALL)


def run_all(quick: bool, log=print, pool=None, tasks=None) -> tuple[dict, dict]:
    """(grids, identity): {task: {learner: ContinuingResult}} for the paper's
    grids and {task: (q_vrc result, cq result)} for the identity check (the
    tabular tasks of `tasks` only; default `default_tasks`); the sweeps two at
    a time with a pool, the largest first."""
    tasks = default_tasks(quick) if tasks is None else tuple(tasks)
    tabular = [t for t in tasks if t in TASKS]
    jobs = [(t, a, grid_spec(t, a, quick)) for t in tasks for a in LEARNERS]
    for t in tabular:
        vrc, cq = identity_specs(t, quick)
        jobs += [(t, "identity-q_vrc", vrc), (t, "identity-cq", cq)]
    jobs.sort(key=lambda j: -j[2].num_points * j[2].seeds * j[2].steps)

    def one(job):
        t, name, spec = job
        r = sweep.run(spec, progress=False)
        m = r.meta
        log(f"  {t:14s} {name:15s} {r.num_points:5d} points x {r.seeds} runs x {spec.steps:,} steps: "
            f"compile {m['compile_time_s']:.1f} s, run {m['run_time_s']:.1f} s "
            f"({(m.get('steps_per_s') or 0) / 1e6:.1f} M run-steps/s)")
        return t, name, r

    grids, ident = {t: {} for t in tasks}, {t: {} for t in tabular}
    for t, name, r in (pool.map if pool is not None else map)(one, jobs):
        if name.startswith("identity-"):
            ident[t][name.split("-", 1)[1]] = r
        else:
            grids[t][name] = r
    return ({t: {a: grids[t][a] for a in LEARNERS} for t in tasks},
            {t: (ident[t]["q_vrc"], ident[t]["cq"]) for t in tabular})


# ------------------------------------------------------------------ references and selection

def references(task: str) -> dict:
    """The exact references of `task`: the optimal gain g*, and the gain of
    epsilon-greedy around the optimal policy (what an epsilon = 0.1 learner can
    reach at best, near enough). None for both on a tile-coded task (no
    model here, so no exact gain)."""
    if task not in TASKS:
        return {"gain": None, "eps_greedy_gain": None}
    P, R = grid_spec(task, "q", quick=True).make_task().model()
    opt = exact.optimal(P, R)
    S, A = R.shape
    pi = np.full((S, A), EPSILON / A)
    pi[np.arange(S), opt.policy] += 1.0 - EPSILON
    return {"gain": float(opt.gain), "eps_greedy_gain": exact.policy_gain(P, R, pi)}


def best_points(r) -> dict:
    """{(gamma, offset): grid point}: the best setting of `r` (alpha, eta) at
    each gamma and offset, by the mean reward rate over `WINDOW`."""
    out = {}
    for g in sorted(set(r.grid["gamma"])):
        for o in sorted(set(r.grid["reward_offset"])):
            out[(float(g), float(o))] = r.best_index(WINDOW, r.select(gamma=g, reward_offset=o))
    return out


def rates(r, i: int) -> np.ndarray:
    """(N,) each run's reward rate over `WINDOW` at grid point i."""
    return r.reward_rate(WINDOW)[i]


def estimates(r, i: int) -> np.ndarray:
    """(N,) each run's centering estimate less the reward offset (the estimate
    of the task's own gain), averaged over the log blocks of the run's last
    10% (a constant step size keeps it moving); NaN where a run blew up."""
    k = r.window_blocks("last10")
    return r.rate_estimate[i, :, -k:].astype(np.float64).mean(-1) - r.grid["reward_offset"][i]


def binned(r, values: np.ndarray) -> tuple:
    """(steps, mean, low, high) of `values` (N, L), one per-run value per log
    block, averaged over runs in bins of k blocks (k the least divisor of L
    with at most 100 bins), with 95% t bands over runs."""
    L = values.shape[-1]
    k = max(1, -(-L // 100))
    while L % k:
        k += 1
    v = values.astype(np.float64).reshape(values.shape[0], L // k, k).mean(-1)
    ci = np.array([t_interval(col) for col in v.T])
    return np.arange(1, L // k + 1) * k * r.block_steps, ci[:, 0], ci[:, 1], ci[:, 2]


def table_rows(grids: dict, best: dict, refs: dict) -> list[dict]:
    """One row per task x learner x gamma x offset: the best setting, its reward
    rate over the last 50% and over the whole run with 95% t-intervals, the
    final estimate rbar - offset with its interval, the largest |Q| of any run,
    and the optimal gain."""
    rows = []
    for t, by in grids.items():
        for a, r in by.items():
            for (g, o), i in best[t][a].items():
                p = r.point(i)
                row = {"task": t, "learner": a, "gamma": g, "offset": o, "alpha": p["alpha"],
                       "eta": p.get("eta"), "seeds": r.seeds, "steps": r.blocks * r.block_steps}
                for w in ("last50", "all"):
                    row[f"reward_rate_{w}"], row[f"reward_rate_{w}_ci_low"], row[f"reward_rate_{w}_ci_high"] = (
                        finite_or_none(x) for x in t_interval(r.reward_rate(w)[i]))
                est = estimates(r, i)
                m, lo, hi = t_interval(est[np.isfinite(est)]) if np.isfinite(est).any() else (np.nan,) * 3
                row.update(rbar_minus_offset=finite_or_none(m), rbar_ci_low=finite_or_none(lo),
                           rbar_ci_high=finite_or_none(hi))
                big = r.max_abs_w[i].astype(np.float64)
                row["max_abs_q"] = float(np.nanmax(big)) if np.isfinite(big).all() else None
                row["optimal_gain"] = finite_or_none(refs[t]["gain"])
                rows.append(row)
    return rows


# ------------------------------------------------------------------ claims

# A task on which no learner earns any reward at offset 0 (csuite's sparse-reward
# Pendulum under epsilon-greedy exploration from zero values) cannot show claims
# (i) or (ii): their tolerances are fractions of that reward rate.
NOT_INFORMATIVE = "not informative: no learner's best setting earns any reward at offset 0"


def scale(t: str, grids: dict, best: dict, refs: dict) -> float:
    """What `TOL` is a fraction of on task t: |g*| where the task has an exact
    gain; else (Catch, Pendulum) the magnitude of the highest mean reward rate
    any learner's best setting reaches at offset 0, over every gamma (a
    task whose rewards are costs, as the deep form's Pendulum and PuckWorld,
    reaches a negative one)."""
    if refs[t]["gain"] is not None:
        return abs(refs[t]["gain"])
    return abs(max(float(rates(grids[t][a], i).mean()) for a in grids[t]
                   for (g, o), i in best[t][a].items() if o == 0.0))


def claim_gamma(grids: dict, best: dict, refs: dict) -> dict:
    """(i) per task at offset 0: each learner's best reward rate at the largest
    gamma below 1 against its best over every gamma, and centered minus Q there
    (Welch). Holds where every centered learner stays within `TOL` x g* of its
    best and beats Q; 'centered holds' where Q does not fall either."""
    out = {}
    for t, by in grids.items():
        base, centered = roles(by)
        gammas = sorted({g for g, _ in best[t][base]})
        high = max(g for g in gammas if g < 1.0)
        tol = TOL * scale(t, grids, best, refs)
        rec = {"gamma": high, "tol": tol, "learners": {}}
        for a, r in by.items():
            at = {g: rates(r, best[t][a][(g, 0.0)]) for g in gammas}
            peak = max(float(v.mean()) for v in at.values())
            rec["learners"][a] = {"rate": t_interval(at[high]), "best_over_gamma": peak,
                                  "drop": peak - float(at[high].mean()),
                                  "vs_q": welch_interval(at[high], rates(by[base], best[t][base][(high, 0.0)]))}
        holds = all(rec["learners"][a]["drop"] <= tol for a in centered)
        beats = all(rec["learners"][a]["vs_q"][1] > 0 for a in centered)
        falls = rec["learners"][base]["drop"] > tol
        rec["verdict"] = (NOT_INFORMATIVE if tol <= 0 else "holds" if holds and beats and falls else
                          f"partly: the centered learners {'hold' if holds else 'fall'} and "
                          f"{'beat' if beats else 'do not all beat'} {base} at gamma {high:g}; {base} "
                          f"{'falls' if falls else 'does not fall'} from its best gamma")
        out[t] = rec
    return out


def gamma_for_offsets(gammas) -> float:
    """The gamma claim (ii) is judged at: 0.99 where the grid has it, else the largest below 1."""
    gammas = sorted(gammas)
    return 0.99 if 0.99 in gammas else max(g for g in gammas if g < 1.0)


def claim_offset(grids: dict, best: dict, refs: dict) -> dict:
    """(ii) per task at `gamma_for_offsets`: each learner's best reward rate at
    every offset, and the worst offset's minus offset 0's (Welch). Holds where
    Q's worst offset is below offset 0 by more than `TOL` x g* (interval
    excluding 0) and no centered learner's is."""
    out = {}
    for t, by in grids.items():
        base, centered = roles(by)
        g = gamma_for_offsets({k[0] for k in best[t][base]})
        offsets = sorted({o for _, o in best[t][base]})
        tol = TOL * scale(t, grids, best, refs)
        rec = {"gamma": g, "tol": tol, "learners": {}}
        for a, r in by.items():
            at = {o: rates(r, best[t][a][(g, o)]) for o in offsets}
            worst = min(offsets, key=lambda o: at[o].mean())
            rec["learners"][a] = {"by_offset": {o: t_interval(v) for o, v in at.items()}, "worst": worst,
                                  "worst_vs_0": welch_interval(at[worst], at[0.0])}
        hurt = lambda a: rec["learners"][a]["worst_vs_0"][2] < -tol  # noqa: E731
        q_hurt, c_hurt = hurt(base), [hurt(a) for a in centered]
        rec["verdict"] = (NOT_INFORMATIVE if tol <= 0 else "holds" if q_hurt and not any(c_hurt) else
                          f"partly: {base} {'is' if q_hurt else 'is not'} hurt; "
                          f"{sum(c_hurt)} of the {len(centered)} centered learners are")
        out[t] = rec
    return out


def claim_estimate(grids: dict, best: dict, refs: dict) -> dict:
    """(iii) per task, centered learner and gamma in {the largest below 1, 1},
    at offset 0 and the largest offset: rbar - offset at the best
    setting (`estimates`), |rbar - offset - g*| with a t-interval over runs.
    Judged on value-based centering, the paper's off-policy estimate: holds
    where each of its mean |error| is within `TOL` x g*. Simple centering's
    rbar averages the rewards of the behaviour (epsilon-greedy), not of the
    optimal policy: reported, not judged."""
    out = {}
    for t, by in grids.items():
        gammas = sorted({g for g, _ in best[t]["q"]})
        high = max(g for g in gammas if g < 1.0)
        g_star = refs[t]["gain"]
        rows = []
        for a in CENTERED:
            for g in (high, 1.0):
                for o in (0.0, max(o for _, o in best[t][a])):
                    i = best[t][a][(g, o)]
                    est = estimates(by[a], i)
                    ok = est[np.isfinite(est)]
                    rows.append({"learner": a, "gamma": g, "offset": o, "point": i, "runs": int(ok.size),
                                 "estimate": t_interval(ok), "abs_error": t_interval(np.abs(ok - g_star))})
        vrc = [r for r in rows if r["learner"] == "q_vrc"]
        holds = all(r["abs_error"][0] <= TOL * abs(g_star) for r in vrc)
        exact_at_1 = all(r["abs_error"][0] <= TOL * abs(g_star) for r in vrc if r["gamma"] == 1.0)
        out[t] = {"rows": rows, "verdict": "holds (value-based centering)" if holds else
                  "holds at gamma 1 only (value-based centering)" if exact_at_1 else "not reproduced"}
    return out


def identity_check(vrc, cq) -> dict:
    """(iv) q_vrc at (alpha, eta) against CQ at (alpha, beta = eta alpha), each
    grid point of q_vrc with its CQ point: the largest |difference| of every
    logged array (rewards, rbar against omega, largest |Q|, final Q table),
    and whether every run is the same bit for bit (NaN equal to NaN)."""
    diffs = {name: 0.0 for name in ("reward", "rate_estimate", "max_abs_w", "q_table")}
    same = True
    for i in range(vrc.num_points):
        p = vrc.point(i)
        j = np.flatnonzero(cq.select(alpha=p["alpha"], beta=p["eta"] * p["alpha"], gamma=p["gamma"],
                                     reward_offset=p["reward_offset"]))
        if j.size != 1:
            raise RuntimeError(f"identity: no single CQ point for {p}")
        for name in diffs:
            a, b = np.asarray(getattr(vrc, name)[i]), np.asarray(getattr(cq, name)[j[0]])
            same &= bool(np.array_equal(a, b, equal_nan=True))
            d = np.abs(a.astype(np.float64) - b.astype(np.float64))
            d = d[np.isfinite(d)]
            diffs[name] = max(diffs[name], float(d.max()) if d.size else 0.0)
    return {"points": vrc.num_points, "runs": vrc.num_points * vrc.seeds, "steps": int(vrc.spec_dict["steps"]),
            "identical": same, "max_abs_diff": diffs}


def invariant(r) -> dict:
    """Value-based centering's conserved quantity on a tabular task: every
    step moves one action value by alpha d and rbar by eta alpha d, so
    rbar - eta sum_{s,a} Q(s, a) keeps its initial value 0. Over the final
    states of every run that stayed finite: the largest residual |rbar - eta
    sum Q| relative to the run's scale max(1, |rbar|, eta sum |Q|) (float32
    rounding accumulated over the run), and the largest absolute one among
    runs whose |rbar| stays below 100."""
    eta = r.grid["eta"][:, None]
    rbar = r.rate_estimate[..., -1].astype(np.float64)
    q = r.q_table.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        qsum, qabs = q.sum((-2, -1)), np.abs(q).sum((-2, -1))
        ok = np.isfinite(rbar) & np.isfinite(qabs)
        resid = np.abs(rbar - eta * qsum)
        scale = np.maximum(1.0, np.maximum(np.abs(rbar), eta * qabs))
    small = ok & (np.abs(rbar) < 100)
    return {"runs": int(ok.sum()), "relative": float((resid / scale)[ok].max()),
            "max_abs_small": float(resid[small].max()) if small.any() else None}


def discounted_q(P, R, gamma: float) -> np.ndarray:
    """(S, A) the optimal discounted action values Q*_gamma of the model (P, R)
    by policy iteration (Puterman 1994, Sec. 6.4), gamma < 1."""
    S = R.shape[0]
    policy = R.argmax(1)
    for _ in range(1000):
        P_pi, r_pi = P[np.arange(S), policy], R[np.arange(S), policy]
        v = np.linalg.solve(np.eye(S) - gamma * P_pi, r_pi)
        q = R + gamma * P @ v
        better = q.argmax(1)
        keep = q[np.arange(S), policy] >= q.max(1) - 1e-12 * max(1.0, np.abs(q).max())
        if keep.all():
            return q
        policy = np.where(keep, policy, better)
    raise RuntimeError("policy iteration did not converge")


def vrc_limit(task: str, gamma: float, eta: float, offset: float) -> float:
    """Where q_vrc's rbar - offset settles on a tabular task if Q reaches its
    fixed point: Q = Q*_gamma(r + offset) - rbar / (1 - gamma) (Q-learning's
    fixed point for the reward r + offset - rbar), and rbar = eta sum Q (the
    conserved quantity of `invariant`), so rbar = eta (1 - gamma) sum
    Q*_gamma(r + offset) / (1 - gamma + eta n), n the number of state-action
    pairs; at gamma = 1, the optimal gain (differential Q-learning, Wan, Naik
    and Sutton 2021)."""
    P, R = grid_spec(task, "q", quick=True).make_task().model()
    if gamma >= 1.0:
        return float(exact.optimal(P, R).gain)
    q = discounted_q(np.asarray(P, np.float64), np.asarray(R, np.float64) + offset, gamma)
    return float(eta * (1.0 - gamma) * q.sum() / (1.0 - gamma + eta * q.size)) - offset


# ------------------------------------------------------------------ figures

def _gain_lines(ax, ref: dict) -> None:
    if ref["gain"] is None:
        return
    ax.axhline(ref["gain"], color="k", ls="--", lw=1.0, label=f"optimal gain {ref['gain']:.4g}")
    ax.axhline(ref["eps_greedy_gain"], color="0.45", ls=":", lw=1.0,
               label=f"0.1-greedy on the optimal policy {ref['eps_greedy_gain']:.4g}")


def _errorbar(ax, x, vals: list, alg: str, shift: float) -> None:
    """Means with 95% t-intervals of `vals` (one sample a position) at x + shift."""
    ci = np.array([t_interval(v) for v in vals])
    ax.errorbar(np.asarray(x, float) + shift, ci[:, 0], yerr=[ci[:, 0] - ci[:, 1], ci[:, 2] - ci[:, 0]],
                marker="o", ms=3.5, capsize=2.5, lw=1.3, color=COLORS[alg], label=LABELS[alg])


def gamma_figure(grids: dict, best: dict, refs: dict):
    """(i) the best reward rate over the last 50% against gamma, one line per
    learner; a column per task, a row per offset (0 and the largest)."""
    tasks = list(grids)
    fig, axes = plotting.new_figure(2, len(tasks), panel=(6.0, 4.0))
    for c, t in enumerate(tasks):
        base, _ = roles(grids[t])
        gammas = sorted({g for g, _ in best[t][base]})
        for row, o in enumerate((0.0, max(o for _, o in best[t][base]))):
            ax = axes[row, c]
            for k, a in enumerate(grids[t]):
                _errorbar(ax, range(len(gammas)), [rates(grids[t][a], best[t][a][(g, o)]) for g in gammas],
                          a, 0.08 * (k - 1))
            _gain_lines(ax, refs[t])
            ax.set_xticks(range(len(gammas)), [f"{g:g}" for g in gammas])
            ax.set_xlabel("discount γ")
            ax.set_ylabel("reward rate, last 50% (95% CI)", fontsize=8)
            ax.set_title(f"{title(t)}, reward offset {o:+g}", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.text(0.5, 0.005, "Each point: the best step sizes (α, and η for the centered learners) at that γ and "
             "offset, by the mean reward rate over the last 50% of the runs.", ha="center", va="bottom",
             fontsize=8, color="0.3")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def offset_figure(grids: dict, best: dict, refs: dict):
    """(ii) the best reward rate over the last 50% against the reward offset,
    one line per learner; a row per task, a column per gamma (0.9, 0.99, the
    largest below 1, as the grid has them)."""
    tasks = list(grids)
    cols = sorted({g for t in tasks for g, _ in best[t][roles(grids[t])[0]] if 0.9 <= g < 1.0})[-3:]
    fig, axes = plotting.new_figure(len(tasks), len(cols), panel=(5.0, 3.8))
    for r_, t in enumerate(tasks):
        base, _ = roles(grids[t])
        offsets = sorted({o for _, o in best[t][base]})
        for c, g in enumerate(cols):
            ax = axes[r_, c]
            if (g, offsets[0]) not in best[t][base]:
                ax.set_visible(False)
                continue
            for k, a in enumerate(grids[t]):
                _errorbar(ax, offsets, [rates(grids[t][a], best[t][a][(g, o)]) for o in offsets], a,
                          0.12 * (k - 1) * (offsets[-1] - offsets[0]) / 8)
            _gain_lines(ax, refs[t])
            ax.set_xticks(offsets)
            ax.set_xlabel("reward offset c (the learner sees r + c)")
            ax.set_ylabel("reward rate, last 50% (95% CI)", fontsize=8)
            ax.set_title(f"{title(t)}, γ = {g:g}", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def estimate_figure(grids: dict, est: dict, refs: dict):
    """(iii) the centering estimate rbar - offset over the run (mean over runs,
    95% t band, in bins of log blocks) at the best settings of
    `claim_estimate`, against the optimal gain; a row per centered learner, a
    column per task."""
    tasks = list(grids)
    fig, axes = plotting.new_figure(len(CENTERED), len(tasks), panel=(6.2, 4.0))
    for c, t in enumerate(tasks):
        for r_, a in enumerate(CENTERED):
            ax = axes[r_, c]
            for k, row in enumerate(x for x in est[t]["rows"] if x["learner"] == a):
                r, i, o = grids[t][a], row["point"], row["offset"]
                x, mean, lo, hi = binned(r, r.rate_estimate[i])
                p = r.point(i)
                ax.plot(x, mean - o, color=f"C{k}", lw=1.2,
                        label=f"γ={row['gamma']:g}, offset {o:+g} (α={p['alpha']:g}, η={p['eta']:g})")
                ax.fill_between(x, lo - o, hi - o, color=f"C{k}", alpha=0.2, lw=0)
            _gain_lines(ax, refs[t])
            g = refs[t]["gain"]
            ax.set_ylim(g - max(1.0, abs(g)), g + max(0.5, 0.5 * abs(g)))
            ax.set_xlabel("step")
            ax.set_ylabel("r̄ − offset (95% CI)", fontsize=8)
            ax.set_title(f"{title(t)}: {LABELS[a]}", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def curves_figure(grids: dict, best: dict, refs: dict):
    """The learning curves behind (i) and (ii): each learner's best setting at
    the largest gamma below 1, offset 0 and the largest offset (mean reward
    per log block, 95% t band); a panel each."""
    tasks = list(grids)
    fig, axes = plotting.new_figure(len(tasks), 2, panel=(6.0, 4.0))
    for r_, t in enumerate(tasks):
        base, _ = roles(grids[t])
        high = max(g for g, _ in best[t][base] if g < 1.0)
        for c, o in enumerate((0.0, max(o for _, o in best[t][base]))):
            ax = axes[r_, c]
            for a in grids[t]:
                r, i = grids[t][a], best[t][a][(high, o)]
                x, mean, lo, hi = binned(r, r.reward[i])
                p = r.point(i)
                ax.plot(x, mean, color=COLORS[a], lw=1.2, label=f"{LABELS[a]} (α={p['alpha']:g}"
                        + (f", η={p['eta']:g})" if "eta" in p else ")"))
                ax.fill_between(x, lo, hi, color=COLORS[a], alpha=0.2, lw=0)
            _gain_lines(ax, refs[t])
            ax.set_xlabel("step")
            ax.set_ylabel("reward rate (95% CI)", fontsize=8)
            ax.set_title(f"{title(t)}, γ = {high:g}, offset {o:+g}", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ report

def _ci(m) -> str:
    """'0.412 [0.405, 0.419]' from (mean, low, high)."""
    mean, lo, hi = (float(x) for x in m)
    return "-" if not np.isfinite(mean) else f"{mean:.4g} [{lo:.4g}, {hi:.4g}]"


def _setup(grids: dict, refs: dict, quick: bool) -> list[str]:
    s = ["# Reward centering (Naik, Wan, Tomar and Sutton, RLC 2024), reproduced\n"]
    if quick:
        s.append("**Quick run** (a corner of each grid, few runs, short runs): a smoke test, not evidence.\n")
    s.append("Tabular Q-learning, uncentered (`q`), with simple reward centering (`q_src`) and with value-based "
             "reward centering (`q_vrc`), beta = eta alpha, epsilon-greedy with epsilon 0.1, continuing runs "
             "(`bec_jax.control.continuing`); the learner sees r + c for the reward offset c, and every reward "
             "rate below is the task's own (c removed). Best settings: per learner, gamma and offset, the alpha "
             "(and eta) with the highest mean reward rate over the last 50% of the runs, on the runs that report "
             "it. Intervals: 95% Student-t over runs (differences: Welch).\n")
    s.append("| task | alpha | eta (centered) | gamma | offsets | runs x steps | optimal gain | 0.1-greedy on the "
             "optimal policy |\n|---|---|---|---|---|---|---|---|")
    for t, by in grids.items():
        sp = by["q_vrc"].spec
        hp = sp.hyperparameters
        s.append(f"| {title(t)} | {', '.join(f'{a:g}' for a in hp['alpha'])} | "
                 f"{', '.join(f'{e:g}' for e in hp['eta'])} | {', '.join(f'{g:g}' for g in hp['gamma'])} | "
                 f"{', '.join(f'{o:g}' for o in hp['reward_offset'])} | {sp.seeds} x {sp.steps:,} | "
                 f"{_num(refs[t]['gain'])} | {_num(refs[t]['eps_greedy_gain'])} |")
    s.append("\nQ (eta = 0 in the paper's grids, where the centered learners are Q bit for bit) runs once per "
             "alpha, and at gamma = 1 too: undiscounted, its values grow without bound (the table's max |Q|). "
             "Deviations from Naik et al.'s configs: their Access-Control centered learner uses the unbiased "
             "step size for rbar (`robust_to_initialization`; here rbar starts at 0 and moves with beta = eta "
             "alpha, the BEC paper's forms); their uncentered baseline sweeps the initial values (-4 .. 4), here "
             "they start at 0; TwoChoice's centered runs had offset 0 only, here -4, 0, 4 for every learner.\n")
    tiled = [t for t in grids if t in TILED]
    if tiled:
        s.append(_tiled_note(tiled))
    return s


def _num(x) -> str:
    return "- (no model)" if x is None else f"{x:.6g}"


def _tiled_note(tiled: list) -> str:
    """The set-up of the tile-coded tasks: features, the step-size mapping, the grids against Naik et al.'s."""
    lines = []
    for t in tiled:
        c = TILED[t]
        lines.append(f"{c['title']}: {c['tilings']} tilings; Naik et al.'s alpha "
                     f"{', '.join(f'{a:g}' for a in c['paper_alpha'])} and eta "
                     f"{', '.join(f'{e:g}' for e in c['paper_eta'])}")
    return ("Catch and Pendulum are csuite's (Pendulum with its sparse reward: 1 within 30 degrees of upright, "
            "else 0), with linear action values on tile-coded features (Catch: 16 tilings of 3^3 over the "
            "paddle column and the lowest ball's column and row; Pendulum: 8 tilings of 7^3 over cos, sin and "
            "the velocity), epsilon 0.1. Naik et al. divide alpha by the number of tilings n and tie beta to the "
            "undivided alpha; alpha here is per weight, so their (alpha, eta) is (alpha / n, n eta) in the table "
            f"above ({'; '.join(lines)}). Their runs: Catch 50 x 20,000 with offsets -4, -2, 0, 2, 4; Pendulum "
            "10 x 100,000 with offsets -12, -6, 0, 6, 12; here smaller grids that fit a few minutes on two CPU "
            "cores. These tasks have no model here, so no exact gain: claims (i) and (ii) take their tolerance "
            f"as {TOL:.0%} of the highest reward rate any learner's best setting reaches at offset 0, and (iii) "
            "and (iv) (exact gains, tabular identity) are judged on the tabular tasks only.\n")


def gamma_section(claim: dict, refs: dict) -> list[str]:
    s = ["## (i) With centering the reward rate holds as gamma -> 1\n",
         "![reward rate against gamma](rc_gamma.png)\n",
         f"At offset 0, each learner's best reward rate at the largest gamma below 1 against its best over "
         f"every gamma (the drop), and centered minus Q there. Holds where both centered learners stay within "
         f"{TOL:.0%} of the optimal gain (Catch, Pendulum: of the best reward rate reached) of their best, beat Q (Welch interval above 0), and Q drops by more.\n",
         "| task | gamma | learner | reward rate (95% CI) | best over gamma | drop | minus Q (Welch) |",
         "|---|---|---|---|---|---|---|"]
    for t, rec in claim.items():
        for a, x in rec["learners"].items():
            vs = "-" if a == "q" else f"{x['vs_q'][0]:+.3g} [{x['vs_q'][1]:+.3g}, {x['vs_q'][2]:+.3g}]"
            s.append(f"| {title(t)} | {rec['gamma']:g} | {a} | {_ci(x['rate'])} | "
                     f"{x['best_over_gamma']:.4g} | {x['drop']:.3g} | {vs} |")
    s.append("")
    for t, rec in claim.items():
        s.append(f"**Verdict (i), {title(t)}: {rec['verdict']}.**")
    s.append("")
    return s


def offset_section(claim: dict) -> list[str]:
    s = ["## (ii) A reward offset hurts uncentered Q-learning, not centered\n",
         "![reward rate against the offset](rc_offset.png)\n",
         f"Best reward rate at each offset; the last column is the worst offset's minus offset 0's (Welch). "
         f"Holds where Q's is below 0 by more than {TOL:.0%} of the optimal gain (Catch, Pendulum: of the best reward rate reached) and no centered learner's is.\n"]
    for t, rec in claim.items():
        offsets = list(next(iter(rec["learners"].values()))["by_offset"])
        s.append(f"{title(t)}, gamma {rec['gamma']:g}:\n")
        s.append("| learner | " + " | ".join(f"offset {o:+g}" for o in offsets) + " | worst - offset 0 |")
        s.append("|---|" + "---|" * (len(offsets) + 1))
        for a, x in rec["learners"].items():
            w = x["worst_vs_0"]
            s.append(f"| {a} | " + " | ".join(_ci(x["by_offset"][o]) for o in offsets)
                     + f" | {w[0]:+.3g} [{w[1]:+.3g}, {w[2]:+.3g}] (offset {x['worst']:+g}) |")
        s.append("")
    for t, rec in claim.items():
        s.append(f"**Verdict (ii), {title(t)} (gamma {rec['gamma']:g}): {rec['verdict']}.**")
    s.append("")
    return s


def _estimate_section(claim: dict, grids: dict, refs: dict) -> list[str]:
    s = ["## (iii) The centering estimate converges to the optimal gain\n",
         "![the centering estimate against the optimal gain](rc_estimate.png)\n",
         "rbar - offset at the best setting, averaged over the last 10% of each run (a constant step size keeps "
         "it moving), and its distance to the optimal gain g* (95% t over the runs that stayed finite). 'Fixed "
         "point': where q_vrc's rbar settles if Q reaches Q-learning's fixed point (`vrc_limit`: rbar = eta "
         "(1 - gamma) sum Q*_gamma(r + c) / (1 - gamma + eta n) for n state-action pairs, from the conserved "
         "rbar - eta sum Q of (iv); g* at gamma 1). Judged on value-based centering, the paper's off-policy "
         f"estimate: holds where each of its mean errors is within {TOL:.0%} of g*. Simple centering's rbar "
         "averages the rewards the behaviour (0.1-greedy) earns, so it tracks the learner's own reward rate, "
         "below g*: reported, not judged.\n",
         "| task | learner | gamma | offset | alpha, eta | runs | rbar - offset | abs(rbar - offset - g*) | "
         "fixed point |", "|---|---|---|---|---|---|---|---|---|"]
    for t, rec in claim.items():
        for row in rec["rows"]:
            p = grids[t][row["learner"]].point(row["point"])
            fixed = (f"{vrc_limit(t, row['gamma'], p['eta'], row['offset']):.4g}"
                     if row["learner"] == "q_vrc" else "-")
            s.append(f"| {title(t)} | {row['learner']} | {row['gamma']:g} | {row['offset']:+g} | "
                     f"{p['alpha']:g}, {p['eta']:g} | {row['runs']} | {_ci(row['estimate'])} | "
                     f"{_ci(row['abs_error'])} | {fixed} |")
    s.append("")
    for t, rec in claim.items():
        s.append(f"**Verdict (iii), {title(t)} (g* = {refs[t]['gain']:.4g}): {rec['verdict']}.**")
    s.append("")
    return s


def _identity_section(ident: dict, inv: dict) -> list[str]:
    s = ["## (iv) Value-based reward centering is Bellman error centering (the BEC paper's reading)\n",
         "q_vrc at (alpha, eta) against CQ (centered TD on action values, the BEC paper's eqs. (28)-(29)) at "
         "(alpha, beta = eta alpha), same seeds and settings, every grid point of q_vrc matched with its CQ "
         "point; the largest |difference| of every logged array.\n",
         "| task | points | runs x steps | rewards | rbar vs omega | max abs Q | final Q table | identical |",
         "|---|---|---|---|---|---|---|---|"]
    for t, x in ident.items():
        d = x["max_abs_diff"]
        s.append(f"| {title(t)} | {x['points']} | {x['runs']} x {x['steps']:,} | {d['reward']:g} | "
                 f"{d['rate_estimate']:g} | {d['max_abs_w']:g} | {d['q_table']:g} | "
                 f"{'bit for bit' if x['identical'] else 'NO'} |")
    s.append("")
    for t, x in ident.items():
        s.append(f"**Verdict (iv), {title(t)}: "
                 f"{'holds, bit for bit' if x['identical'] else 'DIFFERENT'} "
                 f"(max difference {max(x['max_abs_diff'].values()):g}).**")
    s.append("\nA consequence, checked on the grids: each tabular step moves one action value by alpha d and "
             "rbar by eta alpha d (d the centered error), so rbar - eta sum Q(s, a) is conserved (0 from the "
             "start). rbar is tied to the sum of the action values, not to the rewards alone: it estimates the "
             "mean TD error (E[delta], the BEC paper's eq. (24)), which is the gain at gamma 1 and, below 1, "
             "the fixed point of (iii). Largest residual over the final states of every finite run, relative to "
             "the run's scale max(1, |rbar|, eta sum |Q|) (float32 rounding), and in absolute terms among runs "
             "with |rbar| < 100:\n")
    for t, x in inv.items():
        small = "-" if x["max_abs_small"] is None else f"{x['max_abs_small']:.3g}"
        s.append(f"- {title(t)}: relative {x['relative']:.2g}, absolute {small}, over {x['runs']:,} runs")
    s.append("")
    return s


def report_markdown(grids, refs, claims, ident, inv, timing, quick) -> str:
    """The report: set-up, each claim with its table and verdict, the identity, the time."""
    s = _setup(grids, refs, quick)
    s += gamma_section(claims["gamma"], refs)
    s += offset_section(claims["offset"])
    s += _estimate_section(claims["estimate"], grids, refs)
    s += _identity_section(ident, inv)
    s.append("Learning curves at the largest gamma below 1: ![curves](rc_curves.png)\n")
    s.append(f"## Time\n\n{timing['device']}: {timing['programs']} programs, trace {timing['trace_s']:.1f} s, "
             f"compile {timing['compile_s']:.1f} s (persistent cache: {timing['cache']}), "
             f"run {timing['run_s']:.1f} s summed over the sweeps (two at a time), "
             f"{timing['run_steps']:,} run-steps in all; total {timing['total_s']:.1f} s.\n")
    return "\n".join(s)


def table_markdown(rows: list[dict]) -> str:
    """The best-setting table as Markdown."""
    out = ["| task | learner | gamma | offset | alpha | eta | reward rate, last 50% (95% CI) | whole run | "
           "rbar - offset | max abs Q |", "|---|---|---|---|---|---|---|---|---|---|"]
    g = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
    for r in rows:
        out.append(f"| {r['task']} | {r['learner']} | {r['gamma']:g} | {r['offset']:+g} | {r['alpha']:g} | "
                   f"{g(r['eta'])} | {g(r['reward_rate_last50'])} [{g(r['reward_rate_last50_ci_low'])}, "
                   f"{g(r['reward_rate_last50_ci_high'])}] | {g(r['reward_rate_all'])} | "
                   f"{g(r['rbar_minus_offset'])} | {g(r['max_abs_q'])} |")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ entry point

def is_reproduce_dir(path: str) -> bool:
    """True if `path` holds this reproduction's earlier output."""
    return is_output(path, KIND)


def _grid_csv(grids: dict) -> str:
    """Every grid point's summary (`ContinuingResult.summary`), all sweeps in one table."""
    recs = []
    for by in grids.values():
        for r in by.values():
            recs += r.summary()
    return csv_text(recs)


def reproduce(out_dir: str = os.path.join("results", "reward_centering"), quick: bool = False, log=print,
              tasks=None) -> dict:
    """Runs the reward-centering reproduction and writes figures, tables and
    the report to `out_dir` (see the module docstring). `tasks` (hidden from
    the command line; default `default_tasks`) runs a subset, e.g. ("catch",
    "pendulum") alone to time them."""
    run = Reproduction(KIND, out_dir, quick, log)
    with sweep_threads() as pool:
        grids, ident_runs = run_all(quick, log, pool, tasks)
    refs = {t: references(t) for t in grids}
    best = {t: {a: best_points(r) for a, r in by.items()} for t, by in grids.items()}
    tab = {t: by for t, by in grids.items() if t in TASKS}
    claims = {"gamma": claim_gamma(grids, best, refs), "offset": claim_offset(grids, best, refs),
              "estimate": claim_estimate(tab, best, refs)}
    ident = {t: identity_check(*pair) for t, pair in ident_runs.items()}
    inv = {t: invariant(by["q_vrc"]) for t, by in tab.items()}
    figs = {"rc_gamma": gamma_figure(grids, best, refs), "rc_offset": offset_figure(grids, best, refs),
            "rc_curves": curves_figure(grids, best, refs)}
    if tab:
        figs["rc_estimate"] = estimate_figure(tab, claims["estimate"], refs)
    run.save_figures(figs)
    allr = [r for by in grids.values() for r in by.values()] + [r for p in ident_runs.values() for r in p]
    timing = {**run.timing(r.meta for r in allr), "run_steps": sum(r.meta["run_steps"] for r in allr)}
    rows = table_rows(grids, best, refs)
    run.write_table(rows, table_markdown(rows))
    run.write_text("grid.csv", _grid_csv(grids))
    report = report_markdown(grids, refs, claims, ident, inv, timing, quick)
    verdicts = {k: {t: c["verdict"] for t, c in claims[k].items()} for k in claims}
    verdicts["identity"] = {t: x["identical"] for t, x in ident.items()}
    sweeps = [{"task": r.task, "learner": r.algorithm, "points": r.num_points, "seeds": r.seeds,
               **{k: r.meta.get(k) for k in ("compile_time_s", "run_time_s", "run_steps", "steps_per_s")}}
              for r in allr]
    records = {"verdicts": verdicts, "references": refs, "claims": claims, "identity": ident, "sweeps": sweeps,
               "invariant": inv, "table": rows,
               "specs": {t: {a: r.spec_dict for a, r in by.items()} for t, by in grids.items()}}
    return run.finish(report, timing, records, table_markdown([r for r in rows if r["offset"] == 0.0]))
