"""How well successive halving chooses (issue 53 item 5): on a grid, over many
repetitions with independent seeds, halving's chosen point against the full
grid's best at the same seeds, judged on fresh seeds; the run-steps and the
wall time it spends against the full grid's.

    python -m benchmarks.search_quality [--grid access_control|deep_catch|boyan_ctdc|cliff_cgq] [--reps 50] [--seeds 10]
        [--steps 50000] [--real 3] [--rungs R] [--min-steps S] [--also-min-steps S,..] [--also-rungs R,..] [--smoke]

The Access-Control grid (continuing control) replays halving from one full
grid over every repetition's seeds; the Boyan CTDC grid (prediction, the
paper's 576 points) and CliffWalking's CGQ grid (episodic control, the control
reproduction's 18 points) are cheap enough to run the compiled search itself
in every repetition (`prediction_quality`, `control_quality`).

  1. The full grid on reps x seeds seeds in one sweep (`continuing.sweep.run`);
     repetition r uses seeds r * seeds .. (r + 1) * seeds - 1 (their streams
     are independent: `engine.streams`).
  2. For each repetition, the full grid's best at its seeds (the highest
     reward rate over the whole run, the search's own score) and halving's
     choice, replayed from the full grid's logs at those seeds: a survivor's
     curves are the full grid's (tests/test_search.py), so the search's
     choice is a function of those logs (each rung's score is the mean over
     seeds of the reward rate so far). `--real` repetitions run the compiled
     search itself, which must choose what the replay chose; they and a full
     grid at the same seeds give the wall time.
  3. Fresh seeds: every other repetition's seeds, independent of the ones
     that chose. Halving's choice is right when it is the full grid's best,
     or when its reward rate on the fresh seeds lies inside the best's 95%
     t-interval there. Regret: (best - chosen) / (best - worst) of the fresh
     means over the grid.

Output: a table and benchmarks/results/search_quality.json. Goal (Access-
Control): the same answer in at least 95% of repetitions at no more than 0.2x
the run-steps and 0.5x the wall time.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks import _common

GRIDS = {
    # Naik et al.'s Access-Control grid (continuing_speed.py), value-based reward centering.
    "access_control": dict(task="access_control", algorithm="q_vrc",
                           hyperparameters={"alpha": [2.0 ** -k for k in range(7, -1, -1)],
                                            "eta": [0.0, 2.0 ** -8, 2.0 ** -6, 2.0 ** -4, 2.0 ** -2, 1.0]},
                           gamma=[0.0, 0.5, 0.8, 0.9, 0.99, 0.999, 1.0], reward_offset=[-8.0, -4.0, 0.0, 4.0, 8.0]),
    # A small deep grid: Naik et al.'s CDQN (their unbiased step size) on Catch's board, a small network and
    # sampled batches so that 50 repetitions fit a 2-core CPU (their full-batch grid is GPU work: deep_speed.py).
    "deep_catch": dict(task="catch", task_params={"features": "board"}, algorithm="cdqn_unbiased",
                       hyperparameters={"alpha": [2.0 ** -10, 2.0 ** -8, 2.0 ** -6, 2.0 ** -4], "eta": [0.0, 1.0]},
                       gamma=[0.99], reward_offset=[0.0, 4.0],
                       learner_params={"hidden": [32], "buffer": 1000, "batch": 32}),
}
# The paper's CTDC grid on Boyan's chain (Appendix A, experiments.grids): 9 x 8 x 8 points, 1000 steps.
BOYAN_CTDC = dict(env="boyan_chain", algorithm="ctdc", steps=1000, log_every=10,
                  hyperparameters={"alpha": [1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2, 0.3],
                                   "zeta": [5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2, 0.5],
                                   "beta": [5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2, 0.5]})
SMOKE = dict(task="access_control", algorithm="q_vrc", hyperparameters={"alpha": [2.0 ** -5, 0.5], "eta": [2.0 ** -6, 1.0]},
             gamma=[0.9, 1.0], reward_offset=[0.0, 8.0])


def replay(reward: np.ndarray, stopped_scores, sched, K: int) -> int:
    """Halving's choice from the full grid's logs `reward` (G, N, L) (mean
    reward per step per block) as the compiled search makes it: each rung's
    score the float32 mean over seeds of the reward rate over its first blocks,
    the best ceil(k / rate) on, ties to the lower index; the last rung's best
    on the whole run."""
    del stopped_scores, K
    running = np.arange(reward.shape[0])
    for r in range(sched.rungs):
        e = sched.ends[r]
        s = reward[running, :, :e].astype(np.float32).mean(-1).mean(-1)
        if r == sched.rungs - 1:
            return int(running[np.argmax(s)])
        order = sorted(range(len(running)), key=lambda j: (-s[j] if np.isfinite(s[j]) else np.inf, running[j]))
        running = np.sort(running[order[:sched.points[r + 1]]])
    raise AssertionError("unreachable")


def _summary(cores: int, rows: list, real: list, **fields) -> dict:
    """The JSON of a grid's run: the machine, `fields`, and the rates of the
    repetitions' `rows` (same answer, inside the interval, mean regret)."""
    return {"machine": _common.describe_machine(_common.machine_info(), _common.jax_info()), "cores": cores,
            "timestamp": _common.timestamp(), **fields,
            "same_as_full_best": float(np.mean([x["same"] for x in rows])),
            "inside_best_interval_on_fresh_seeds": float(np.mean([x["inside"] for x in rows])),
            "mean_normalized_regret": float(np.mean([x["regret"] for x in rows])), "real_runs": real,
            "reps_detail": rows}


def _report(out: dict, length: str, fresh: str, name: str, smoke: bool) -> str:
    """Prints `out`'s table (`length`: a run's length in words) and writes its JSON; returns the path."""
    print(f"machine: {out['machine']}")
    print(f"grid {out['grid']}: {out['points']} points, {out['reps']} repetitions x {out['seeds_per_rep']} seeds x "
          f"{length}; rungs end at {out['schedule']['ends_steps']} steps with {out['schedule']['points']} points")
    print(f"same as the full grid's best: {out['same_as_full_best']:.0%}; the best or inside its 95% interval on "
          f"{fresh}: {out['inside_best_interval_on_fresh_seeds']:.0%}; mean normalized regret "
          f"{out['mean_normalized_regret']:.4f}")
    print(f"run-steps: {out['run_steps_ratio']:.3f}x the full grid's; wall time (run, median of "
          f"{out.get('wall_reps', len(out['real_runs']))}): {out['wall_time_ratio']:.3f}x")
    path = _common.write_json(_common.result_path(_common.RESULTS_DIR, name, smoke), out)
    print(f"wrote {path}")
    return path


def main(argv=None) -> int:  # noqa: C901  (a benchmark's one script)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", default="access_control", choices=sorted(GRIDS) + ["boyan_ctdc", "cliff_cgq"])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--real", type=int, default=3)
    p.add_argument("--rate", type=float, default=3)
    p.add_argument("--rungs", type=int, default=None)
    p.add_argument("--min-steps", type=int, default=None)
    p.add_argument("--also-min-steps", default="", metavar="S,S,...",
                   help="continuing grids: the same repetitions replayed with these --min-steps too (no more runs)")
    p.add_argument("--also-rungs", default="", metavar="R,R,...",
                   help="continuing grids: the same repetitions replayed with these --rungs too (no more runs)")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    cores = _common.use_all_cpu_cores()
    _common.configure_cache(None)
    if args.grid == "boyan_ctdc":
        return prediction_quality(args, cores)
    if args.grid == "cliff_cgq":
        return control_quality(args, cores)
    from bec_jax.control.continuing import sweep
    from bec_jax.control.continuing.spec import ContinuingSpec
    from bec_jax.stats import t_interval

    grid = SMOKE if args.smoke else GRIDS[args.grid]
    if args.smoke:
        args.reps, args.seeds, args.steps, args.real = 4, 3, 2000, 1
    N, R = args.seeds, args.reps
    search = {"rate": args.rate, "rungs": args.rungs, "min_steps": args.min_steps}
    t0 = time.perf_counter()
    big = sweep.run(ContinuingSpec(**grid, seeds=N * R, steps=args.steps), progress=False)
    t_big = time.perf_counter() - t0
    one = ContinuingSpec(**grid, seeds=N, steps=args.steps, search=search)
    sched, K, G = one.search_schedule(), one.block_steps, one.num_points
    rate_all = big.reward_rate("all")  # (G, R N)
    def judge(sched_) -> list[dict]:  # each repetition's choice under `sched_`, judged on fresh seeds
        out_ = []
        for r in range(R):
            mine = slice(r * N, (r + 1) * N)
            best = int(np.argmax(rate_all[:, mine].mean(-1)))
            chosen = replay(big.reward[:, mine], None, sched_, K)
            fresh = np.delete(rate_all, np.arange(r * N, (r + 1) * N), axis=1)  # every other repetition's seeds
            f_mean = fresh.mean(-1)
            m_best, lo_best, _ = t_interval(fresh[best])
            regret = (f_mean[best] - f_mean[chosen]) / max(f_mean.max() - f_mean.min(), 1e-12)
            out_.append({"rep": r, "best": best, "chosen": chosen, "same": chosen == best,
                         "inside": bool(chosen == best or f_mean[chosen] >= lo_best), "regret": float(regret),
                         "fresh_best": float(m_best), "fresh_chosen": float(f_mean[chosen])})
        return out_

    rows = judge(sched)
    variants = []
    also = ([("min_steps", int(x)) for x in args.also_min_steps.split(",") if x]
            + [("rungs", int(x)) for x in args.also_rungs.split(",") if x])
    for field, m in also:
        sm = ContinuingSpec(**grid, seeds=N, steps=args.steps, search={**search, field: m}).search_schedule()
        rm = judge(sm)
        variants.append({field: m, "ends_steps": [e * K for e in sm.ends], "points": list(sm.points),
                         "same_as_full_best": float(np.mean([x["same"] for x in rm])),
                         "inside_best_interval_on_fresh_seeds": float(np.mean([x["inside"] for x in rm])),
                         "mean_normalized_regret": float(np.mean([x["regret"] for x in rm])),
                         "run_steps_ratio": sm.run_blocks(N) / (G * N * one.num_blocks),
                         "chosen": sorted({x["chosen"] for x in rm})})
    real = []
    for r in range(min(args.real, R)):
        spec = ContinuingSpec(**grid, seeds=N, steps=args.steps, seed_offset=r * N, search=search)
        found = sweep.run(spec, progress=False)
        full = sweep.run(spec.replace(search=None), progress=False)
        real.append({"rep": r, "chosen": found.best_index(), "replayed": rows[r]["chosen"],
                     "full_best": full.best_index(), "search_run_s": found.meta["run_time_s"],
                     "full_run_s": full.meta["run_time_s"], "search_compile_s": found.meta["compile_time_s"],
                     "full_compile_s": full.meta["compile_time_s"]})
    steps_ratio = sched.run_blocks(N) / (G * N * one.num_blocks)
    wall = np.median([x["search_run_s"] / x["full_run_s"] for x in real]) if real else float("nan")
    out = _summary(cores, rows, real, grid=args.grid if not args.smoke else "smoke", points=G, seeds_per_rep=N,
                   reps=R, steps=args.steps, search=one.search,
                   schedule={"ends_steps": [e * K for e in sched.ends], "points": list(sched.points)},
                   run_steps_ratio=steps_ratio, wall_time_ratio=float(wall), full_grid_all_reps_s=t_big,
                   min_steps_variants=variants)
    name = ("search_quality" + ("" if args.grid == "access_control" else f"_{args.grid}")
            + ("" if args.min_steps is None else f"_min{args.min_steps}")
            + ("" if args.rungs is None else f"_rungs{args.rungs}"))
    _report(out, f"{args.steps:,} steps", "fresh seeds", name, args.smoke)
    for v in variants:
        field = "min_steps" if "min_steps" in v else "rungs"
        print(f"  --{field.replace('_', '-')} {v[field]}: rungs end at {v['ends_steps']} with {v['points']} points; same "
              f"{v['same_as_full_best']:.0%}, inside {v['inside_best_interval_on_fresh_seeds']:.0%}, regret "
              f"{v['mean_normalized_regret']:.4f}, run-steps {v['run_steps_ratio']:.3f}x")
    for x in real:
        print(f"  real search rep {x['rep']}: chose {x['chosen']} (replay {x['replayed']}, full best {x['full_best']}); "
              f"run {x['search_run_s']:.2f} s against {x['full_run_s']:.2f} s, compile {x['search_compile_s']:.1f} s "
              f"against {x['full_compile_s']:.1f} s")
    return 0 if all(x["chosen"] == x["replayed"] for x in real) else 1


def prediction_quality(args, cores: int) -> int:
    """Halving on the paper's Boyan CTDC grid, the compiled search run in
    every repetition (seeds r * seeds ..) against one full grid over all the
    repetitions' seeds; fresh seeds: `--seeds * 10` streams after every
    repetition's. Score: the area under the RMSPBE curve (lower is better; a
    point with a diverged seed is never the best)."""
    from bec_jax.prediction import sweep
    from bec_jax.prediction.spec import SweepSpec
    from bec_jax.stats import t_interval

    grid = dict(BOYAN_CTDC, steps=args.steps if args.steps != 50_000 else BOYAN_CTDC["steps"])
    if args.smoke:
        grid["hyperparameters"] = {"alpha": [1e-3, 0.1, 0.3], "zeta": [1e-2, 0.1], "beta": [1e-2, 0.1]}
        args.reps, args.seeds, args.real = 4, 3, 1
    N, R, F = args.seeds, args.reps, 10 * args.seeds
    search = {"rate": args.rate, "rungs": args.rungs, "min_steps": args.min_steps}

    def mean_auc(res, seeds):  # each point's mean area over the seeds `seeds`; +inf where one diverged
        a = res.auc_seed[0][:, seeds]
        return np.where(np.isfinite(a).all(-1), a.mean(-1), np.inf)

    t0 = time.perf_counter()
    big = sweep.run(SweepSpec(**grid, seeds=N * R), progress=False)
    t_big = time.perf_counter() - t0
    fresh = sweep.run(SweepSpec(**grid, seeds=F, seed_offset=N * R), progress=False)
    f_mean = mean_auc(fresh, slice(None))
    finite = np.isfinite(f_mean)
    G = big.num_points
    rows, real = [], []
    for r in range(R):
        best = int(np.argmin(mean_auc(big, slice(r * N, (r + 1) * N))))
        spec = SweepSpec(**grid, seeds=N, seed_offset=r * N, search=search)
        found = sweep.run(spec, progress=False)
        chosen = found.best_index()
        _, _, hi_best = t_interval(fresh.auc_seed[0][best])  # lower is better: inside means below the best's upper end
        span = max(f_mean[finite].max() - f_mean[finite].min(), 1e-12)
        rows.append({"rep": r, "best": best, "chosen": chosen, "same": chosen == best,
                     "inside": bool(chosen == best or f_mean[chosen] <= hi_best),
                     "regret": float((f_mean[chosen] - f_mean[best]) / span) if finite[[best, chosen]].all() else 1.0,
                     "fresh_best": float(f_mean[best]), "fresh_chosen": float(f_mean[chosen])})
        if r < args.real:
            full = sweep.run(spec.replace(search=None), progress=False)
            real.append({"rep": r, "chosen": chosen, "full_best": full.best_index(),
                         "search_run_s": found.meta["run_time_s"], "full_run_s": full.meta["run_time_s"],
                         "search_compile_s": found.meta["compile_time_s"], "full_compile_s": full.meta["compile_time_s"]})
        sched, m = spec.search_schedule(), found.meta["search"]
        steps_ratio = m["search_run_steps"] / m["full_run_steps"]
    wall = np.median([x["search_run_s"] / x["full_run_s"] for x in real]) if real else float("nan")
    out = _summary(cores, rows, real, grid="boyan_ctdc" if not args.smoke else "smoke_boyan", points=G,
                   seeds_per_rep=N, reps=R, fresh_seeds=F, steps=grid["steps"], search=spec.search,
                   schedule={"ends_steps": [e * grid["log_every"] for e in sched.ends], "points": list(sched.points)},
                   run_steps_ratio=steps_ratio, wall_time_ratio=float(wall), full_grid_all_reps_s=t_big)
    name = ("search_quality_boyan" + ("" if args.min_steps is None else f"_min{args.min_steps}")
            + ("" if args.rungs is None else f"_rungs{args.rungs}"))
    _report(out, f"{grid['steps']:,} steps", f"{F} fresh seeds", name, args.smoke)
    return 0


def control_quality(args, cores: int) -> int:
    """Halving on the control reproduction's CliffWalking CGQ grid (alpha x
    beta x zeta around the authors' setting, 3000 episodes, its step budget;
    experiments.control), ranked by the mean return per episode: repetition r
    is the full grid and the compiled search at base seed r (independent
    streams); fresh seeds: `--seeds * 10` runs at base seed 10,000."""
    from bec_jax.control import sweep
    from bec_jax.stats import t_interval
    from experiments import control as cexp

    spec0 = cexp.spec_for("cliff_walking", "cgq")
    if args.smoke:
        spec0 = cexp.spec_for("cliff_walking", "cgq", quick=True)
        args.reps, args.seeds, args.real = 4, 3, 1
    N, R, F = args.seeds, args.reps, 10 * args.seeds
    search = {"rate": args.rate, "rungs": args.rungs, "min_steps": args.min_steps, "metric": "return"}

    def score(res):  # (G, N) each run's mean return per episode; NaN for a run that did not finish
        per = res.returns.astype(np.float64).mean(-1)
        done = (res.lengths > 0).all(-1) & (res.diverged_step < 0)
        return np.where(done, per, np.nan)

    fresh = sweep.run(spec0.replace(seeds=F, seed=10_000), progress=False)
    f_runs = score(fresh)
    f_mean = np.where(np.isfinite(f_runs).all(-1), f_runs.mean(-1), np.nan)
    finite = np.isfinite(f_mean)
    span = max(np.nanmax(f_mean) - np.nanmin(f_mean), 1e-12)
    rows, real, t_full, t_search, ratios = [], [], [], [], []
    for r in range(R):
        spec = spec0.replace(seeds=N, seed=r)
        full = sweep.run(spec, progress=False)
        found = sweep.run(spec.replace(search=search), progress=False)
        best, chosen = full.best_index("return"), found.best_index("return")
        t_full.append(full.meta["run_time_s"])
        t_search.append(found.meta["run_time_s"])
        _, lo_best, _ = t_interval(f_runs[best]) if finite[best] else (None, -np.inf, None)
        rows.append({"rep": r, "best": best, "chosen": chosen, "same": chosen == best,
                     "inside": bool(chosen == best or (finite[chosen] and f_mean[chosen] >= lo_best)),
                     "regret": float((f_mean[best] - f_mean[chosen]) / span) if finite[[best, chosen]].all() else 1.0,
                     "fresh_best": float(f_mean[best]), "fresh_chosen": float(f_mean[chosen])})
        if r < args.real:
            real.append({"rep": r, "chosen": chosen, "full_best": best, "search_run_s": t_search[-1],
                         "full_run_s": t_full[-1], "search_compile_s": found.meta["compile_time_s"],
                         "full_compile_s": full.meta["compile_time_s"]})
        m = found.meta["search"]
        # The search's blocks advanced (each run while its point ran) against the
        # full grid's steps in finished episodes: what each spent, the search's work counted whole.
        ratios.append(m["search_run_steps"] / int(full.lengths.astype(np.int64).sum()))
    steps_ratio = float(np.mean(ratios))
    wall = float(np.median(np.asarray(t_search) / np.asarray(t_full)))
    out = _summary(cores, rows, real, grid="cliff_cgq" if not args.smoke else "smoke_cliff", points=full.num_points,
                   seeds_per_rep=N, reps=R, fresh_seeds=F, episodes=spec.episodes, search=found.spec.search,
                   schedule={"ends_steps": m["rung_steps"], "points": m["rung_points"]}, run_steps_ratio=steps_ratio,
                   run_steps_ratio_note="the search's blocks advanced against the full grid's steps in episodes, "
                                        "mean over reps", wall_time_ratio=wall, wall_reps=R)
    name = ("search_quality_cliff" + ("" if args.min_steps is None else f"_min{args.min_steps}")
            + ("" if args.rungs is None else f"_rungs{args.rungs}"))
    _report(out, f"{spec.episodes:,} episodes", f"{F} fresh seeds", name, args.smoke)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
