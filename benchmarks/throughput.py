"""Throughput on the standard workload: the NumPy loop against bec_jax, in one run.

    python -m benchmarks.throughput            # the full measurement (about a minute)
    python -m benchmarks.throughput --smoke    # tiny sizes, seconds: checks the script works
    python -m benchmarks.throughput --runs 1e7 # the standard grid with 17,362 seeds: fills a GPU

The standard workload is the paper's Boyan chain CTDC grid: alpha (9 values) x
beta (8) x zeta (8) = 576 points, 50 seeds, 1000 steps, RMSCBE every 10 steps,
float32 (= experiments.paper.spec_for("boyan_chain", "ctdc"), RMSCBE only).
`--runs N` keeps its grid and steps and takes enough seeds for N runs (grid points
x seeds, rounded up to whole seeds; up to 10^9): the size that fills a GPU. The
engine's memory plan splits a sweep too large for one call into calls of fewer
grid points, then of fewer seeds and log blocks; the plan is printed.

What it measures, in this order:
  1. that the NumPy baseline implements bec_jax's CTDC update (an assert on the same
     transitions, see benchmarks/baseline_numpy.py);
  2. a warm-up `bec_jax.prediction.sweep.run` (not counted);
  3. `--repeats` rounds (default 5), each one NumPy-loop pass over a subset of the
     grid (6 points x 5 seeds x 1000 steps, float64, one run at a time) and then one
     `sweep.run` of the whole workload twice: with the default compile (for a
     sweep of this size the light one, `tuning.choose_form`) and with
     XLA:CPU's fusion emitters (`tuning.CPU_COMPILER_OPTIONS`, which sweeps of
     10^9 updates and more get); the updates/s target is judged on the faster.
     Interleaving keeps all under the same machine load. bec_jax's steady state is the engine's own `run_time_s` (after
     compilation, results fetched with device_get); each `sweep.run` compiles
     afresh, and that compile is reported separately. Medians over the rounds;
  4. in fresh subprocesses (3 by default): the peak resident memory (VmHWM) of a
     process that runs the whole sweep once (the largest of the 3), with its compile
     time (the one a user sees first; the median of the 3), and
     the persistent compilation cache: compile time with an empty cache directory,
     then again in a new process with the cache warm.
JAX gets one CPU device per core (jax_num_cpu_devices = os.cpu_count(), or
BEC_JAX_CPU_DEVICES), set before any JAX computation; the sweep shards its grid
over them. The printed table and benchmarks/results/throughput.json carry the
machine, the device count and the JAX version.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a file: python benchmarks/throughput.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common
from benchmarks._common import fmt_bytes, fmt_rate, verdict

COMMAND = "python -m benchmarks.throughput"
MAX_RUNS = 10**9


def parse_runs(text: str) -> int:
    """A `--runs` value: a whole number of runs (grid points x seeds) from 1 to
    MAX_RUNS, written 10000000, 10_000_000 or 1e7. ValueError naming the option
    otherwise."""
    try:
        x = float(str(text).replace("_", ""))
    except ValueError:
        x = float("nan")
    if not 1 <= x <= MAX_RUNS or x != int(x):
        raise ValueError(f"--runs must be a whole number of runs (grid points x seeds) from 1 to {MAX_RUNS:.0e}, "
                         f"such as 1e7; got {text!r}")
    return int(x)


def sized_spec(runs: int | None = None, smoke: bool = False):
    """The standard workload (a corner of it with `smoke`); with `runs`, its grid
    and steps with the fewest seeds that make at least `runs` runs."""
    spec = _common.standard_spec(smoke=smoke)
    return spec if runs is None else spec.replace(seeds=-(-runs // spec.num_points))


def plan_line(meta: dict) -> str:
    """How the engine's memory plan laid a sweep out (its result's meta)."""
    return (f"plan: {meta.get('chunk_size')} grid points a call x {meta.get('num_chunks')} call(s), "
            f"{meta.get('seeds_per_call')} seeds a call, {meta.get('blocks_per_segment')} log blocks a segment, "
            f"on {meta.get('num_devices')} device(s)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds); checks the script works")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5; 2 with --smoke)")
    ap.add_argument("--fresh-processes", type=int, default=None,
                    help="fresh processes for the first-compile time and peak memory (default 3; 1 with --smoke)")
    ap.add_argument("--baseline-points", type=int, default=6, help="grid points the NumPy loop runs (default 6)")
    ap.add_argument("--baseline-seeds", type=int, default=5, help="seeds per point for the NumPy loop (default 5)")
    ap.add_argument("--cpu-devices", type=int, default=None,
                    help="JAX CPU devices (default: BEC_JAX_CPU_DEVICES or every core)")
    ap.add_argument("--out-dir", default=_common.RESULTS_DIR, help="where throughput.json goes")
    ap.add_argument("--runs", default=None, metavar="N",
                    help="runs (grid points x seeds) of the measured sweep, up to 1e9: the standard grid with enough "
                         "seeds (default: 50 seeds, 28,800 runs; 1e7 fills a GPU)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    try:
        n_runs = None if args.runs is None else parse_runs(args.runs)
    except ValueError as e:
        print(f"{COMMAND}: error: {e}", file=sys.stderr)
        return 2

    # Before any JAX computation: one device per core, and no persistent cache (so
    # every compile in this process is a real one).
    n_req = _common.use_all_cpu_cores(args.cpu_devices)
    _common.configure_cache(None)

    import numpy as np

    from bec_jax.engine import tuning
    from bec_jax.prediction import sweep
    from benchmarks import baseline_numpy as baseline

    repeats = args.repeats or (2 if args.smoke else 5)
    fresh_n = args.fresh_processes or (1 if args.smoke else 3)
    spec = sized_spec(n_runs, args.smoke)
    machine, jinfo = _common.machine_info(), _common.jax_info()
    print(f"machine: {_common.describe_machine(machine, jinfo)}")
    print(f"workload: {spec.env} {spec.algorithm}, {spec.num_points} grid points x {spec.seeds} seeds x "
          f"{spec.steps} steps (RMSCBE every {spec.log_every}), {spec.dtype}"
          + (f" = {spec.num_points * spec.seeds:,} runs (--runs {n_runs:,})" if n_runs else "")
          + ("  [SMOKE: tiny sizes, numbers mean nothing]" if args.smoke else ""))

    # 1. The baseline implements the same update (raises AssertionError otherwise).
    check = baseline.check_against_bec_jax(steps=50 if args.smoke else 200)
    print("check: the NumPy loop reproduces bec_jax's CTDC on the same transitions "
          f"(max |diff| theta {check['theta']:.1e}, RMSCBE {check['rmscbe']:.1e})")

    n_pts, n_seeds = (2, 2) if args.smoke else (args.baseline_points, args.baseline_seeds)
    pts, idx = baseline.subset_points(spec, n_pts)
    seeds = list(range(n_seeds))
    problem = baseline.make_problem(spec.env)

    # 2. Warm-up.
    warm = sweep.run(spec, progress=False)
    print(plan_line(warm.meta))
    # 3. Interleaved rounds.
    # bec_jax twice a round: with its default compile (for a sweep this size, the
    # light one: tuning.choose_form) and with XLA:CPU's fusion emitters
    # (tuning.CPU_COMPILER_OPTIONS, what sweeps of 10^9 updates and more get).
    full_opts = tuning.CPU_COMPILER_OPTIONS if jinfo["backend"] == "cpu" else None
    sweep.run(spec, progress=False, compiler_options=full_opts)
    b_runs, j_runs, f_runs = [], [], []
    for i in range(repeats):
        b = baseline.run_grid(pts, seeds, spec.steps, spec.log_every, problem=problem)
        b_runs.append({"updates": b["updates"], "seconds": b["seconds"], "updates_per_s": b["updates_per_s"]})
        for runs, opts in ((j_runs, None), (f_runs, full_opts)):
            tuning.clear_compiled()  # each round compiles afresh, as the compile figure says
            r = sweep.run(spec, progress=False, compiler_options=opts)
            m = r.meta
            runs.append({"compile_time_s": m["compile_time_s"], "run_time_s": m["run_time_s"],
                         "updates": m["updates"], "updates_per_s": m["updates_per_s"]})
        print(f"  round {i + 1}/{repeats}: NumPy {fmt_rate(b['updates_per_s'])} updates/s, "
              f"bec_jax {fmt_rate(j_runs[-1]['updates_per_s'])} updates/s (run {j_runs[-1]['run_time_s']:.3f} s, "
              f"compile {j_runs[-1]['compile_time_s']:.2f} s); with the fusion emitters "
              f"{fmt_rate(f_runs[-1]['updates_per_s'])} updates/s (compile {f_runs[-1]['compile_time_s']:.2f} s)")
    b_final = _common.finite_mean(b["final"], axis=1)
    j_final = _common.finite_mean(np.asarray(r.final)[0][idx], axis=1)

    b_ups = _common.median([x["updates_per_s"] for x in b_runs])
    j_run_s = _common.median([x["run_time_s"] for x in j_runs])
    j_ups = j_runs[0]["updates"] / j_run_s
    f_run_s = _common.median([x["run_time_s"] for x in f_runs])
    f_ups = f_runs[0]["updates"] / f_run_s
    f_compile = _common.median([x["compile_time_s"] for x in f_runs])
    best_ups = max(j_ups, f_ups)
    best = "default compile" if j_ups >= f_ups else "fusion emitters (CPU_COMPILER_OPTIONS)"
    ratio = best_ups / b_ups
    ratios = [max(j["updates_per_s"], f["updates_per_s"]) / b["updates_per_s"]
              for j, f, b in zip(j_runs, f_runs, b_runs)]
    compile_inproc = _common.median([x["compile_time_s"] for x in j_runs])

    # 4. Fresh processes: memory and first compile; then the persistent cache.
    print("fresh processes: memory and compile time ...")
    base_cfg = {"spec": spec.to_dict(), "repeats": 1, "cpu_devices": n_req}
    fresh_runs = [_common.run_worker(dict(base_cfg, label=f"fresh {i + 1}, no cache"))
                  for i in range(fresh_n)]
    with tempfile.TemporaryDirectory(prefix="bec_jax_bench_cache_") as cache:
        cold = _common.run_worker(dict(base_cfg, label="cache cold", cache_dir=cache))
        hot = _common.run_worker(dict(base_cfg, label="cache warm", cache_dir=cache))
        cache_files = sum(len(f) for _, _, f in os.walk(cache))
    compile_fresh = _common.median([f["compile_time_s"][0] for f in fresh_runs])
    peak = max(f["peak_rss_bytes"] for f in fresh_runs)
    floor = _common.median([f["rss_before_sweep_bytes"] for f in fresh_runs])

    targets = {
        "updates_per_s": {"target": _common.TARGET_UPDATES_PER_S, "value": best_ups,
                          "met": best_ups >= _common.TARGET_UPDATES_PER_S, "measured_as": best},
        "speedup_vs_numpy": {"target": _common.TARGET_SPEEDUP, "value": ratio,
                             "met": ratio >= _common.TARGET_SPEEDUP},
        "compile_time_s": {"target": _common.TARGET_COMPILE_S, "value": compile_fresh,
                           "met": compile_fresh < _common.TARGET_COMPILE_S,
                           "measured_as": "first compile in a fresh process, no persistent cache "
                                         "(median over the fresh processes)"},
        "memory_bytes": {"target": _common.TARGET_MEMORY_BYTES, "value": peak,
                         "met": peak < _common.TARGET_MEMORY_BYTES,
                         "measured_as": "peak RSS (VmHWM) of a fresh process running the whole sweep, "
                                        "Python + JAX runtime included (max over the fresh processes)"},
    }

    # ------------------------------------------------------------------ report
    dev = f"{jinfo['num_devices']} {jinfo['backend']} device(s)"
    print()
    _common.print_table(
        ["", "updates/s", "time", "what"],
        [["NumPy loop (baseline)", fmt_rate(b_ups), f"{_common.median([x['seconds'] for x in b_runs]):.3f} s",
          f"{len(pts)} points x {n_seeds} seeds x {spec.steps} steps, float64, one run at a time"],
         ["bec_jax sweep.run", fmt_rate(j_ups), f"{j_run_s:.3f} s",
          f"{spec.num_points} x {spec.seeds} x {spec.steps}, {spec.dtype}, {dev}, steady state, "
          f"default compile ({compile_inproc:.2f} s)"],
         ["  with the fusion emitters", fmt_rate(f_ups), f"{f_run_s:.3f} s",
          f"the same, compiler_options=tuning.CPU_COMPILER_OPTIONS ({f_compile:.2f} s compile)"],
         ["ratio", f"{ratio:,.0f}x", "", f"per round: {', '.join(f'{x:,.0f}' for x in ratios)}"],
         ["compile, fresh process", "", f"{compile_fresh:.2f} s",
          f"what a user sees first (no persistent cache); median of {fresh_n} process(es): "
          + ", ".join(f"{f['compile_time_s'][0]:.2f}" for f in fresh_runs)],
         ["compile, in process", "", f"{compile_inproc:.2f} s", f"median of the {repeats} rounds"],
         ["compile, cache cold -> warm", "",
          f"{cold['compile_time_s'][0]:.2f} -> {hot['compile_time_s'][0]:.2f} s",
          "persistent compilation cache, two fresh processes"],
         ["peak memory (RSS)", "", fmt_bytes(peak),
          f"fresh process, whole sweep (max of {fresh_n}); {fmt_bytes(floor)} before the sweep (Python + JAX)"]])
    print()
    print(f"targets (standard workload{f' grid, {n_runs:,} runs' if n_runs else ''}, steady state"
          f"{'; SMOKE sizes, not meaningful' if args.smoke else ''}):")
    _common.print_table(
        ["target", "required", "measured", "", "measured as"],
        [["updates/s", f">= {fmt_rate(_common.TARGET_UPDATES_PER_S)}", fmt_rate(best_ups),
          verdict(targets["updates_per_s"]["met"]), f"median steady-state run time, {best}"],
         ["speed-up vs NumPy", f">= {_common.TARGET_SPEEDUP:,.0f}x", f"{ratio:,.0f}x",
          verdict(targets["speedup_vs_numpy"]["met"]), "median updates/s / median updates/s, same run"],
         ["compile time", f"< {_common.TARGET_COMPILE_S:g} s", f"{compile_fresh:.2f} s",
          verdict(targets["compile_time_s"]["met"]), "first compile in a fresh process, no cache (median)"],
         ["memory", "< 1 GiB", fmt_bytes(peak), verdict(targets["memory_bytes"]["met"]),
          "peak RSS of a fresh process running the sweep (max)"]])
    print(f"machine: {_common.describe_machine(machine, jinfo)}; load average now "
          f"{', '.join(f'{x:.2f}' for x in (_common.load_average() or []))}")

    out = {
        "benchmark": "throughput", "smoke": args.smoke, "timestamp": _common.timestamp(),
        "command": COMMAND + (" --smoke" if args.smoke else "") + (f" --runs {n_runs}" if n_runs else ""),
        "machine": machine, "jax": jinfo, "load_average_at_end": _common.load_average(),
        "workload": {"spec": spec.to_dict(), "runs_requested": n_runs, "runs": spec.num_points * spec.seeds,
                     "points": spec.num_points, "seeds": spec.seeds,
                     "steps": spec.steps, "log_every": spec.log_every, "dtype": spec.dtype,
                     "updates": spec.num_points * spec.seeds * spec.steps},
        "baseline": {"implementation": "benchmarks/baseline_numpy.py: Python loop, NumPy float64, "
                                       "one grid point and one seed at a time",
                     "dtype": "float64", "points": pts, "grid_indices": idx, "seeds": n_seeds,
                     "steps": spec.steps, "updates_per_s": b_ups, "rounds": b_runs,
                     "check_max_abs_diff": check},
        "bec_jax": {"updates_per_s": j_ups, "run_time_s": j_run_s, "rounds": j_runs,
                    "fusion_emitters": {"updates_per_s": f_ups, "run_time_s": f_run_s, "rounds": f_runs,
                                        "compile_in_process_median_s": f_compile},
                    "warmup": {"compile_time_s": warm.meta["compile_time_s"],
                               "run_time_s": warm.meta["run_time_s"]},
                    "num_devices": warm.meta.get("num_devices"), "chunk_size": warm.meta.get("chunk_size"),
                    "num_chunks": warm.meta.get("num_chunks"), "seeds_per_call": warm.meta.get("seeds_per_call"),
                    "blocks_per_segment": warm.meta.get("blocks_per_segment")},
        "ratio": ratio, "ratio_per_round": ratios,
        "compile": {"fresh_process_s": compile_fresh,
                    "fresh_process_each_s": [f["compile_time_s"][0] for f in fresh_runs],
                    "in_process_median_s": compile_inproc,
                    "cache_cold_s": cold["compile_time_s"][0], "cache_warm_s": hot["compile_time_s"][0],
                    "cache_files": cache_files},
        "memory": {"peak_rss_bytes": peak, "rss_before_sweep_bytes": floor,
                   "sweep_increment_bytes": peak - floor if floor else None,
                   "fresh_processes": fresh_runs, "cache_cold_process": cold, "cache_warm_process": hot},
        "plausibility": {"note": "final RMSCBE at the baseline's grid points, mean over non-diverged seeds; "
                                 "different random streams, so close but not equal",
                         "baseline": b_final, "bec_jax": j_final},
        "targets": targets,
        "wall_time_s": time.perf_counter() - t_start,
    }
    path = _common.write_json(_common.result_path(args.out_dir, "throughput", args.smoke), out)
    print(f"wrote {os.path.relpath(path)} ({out['wall_time_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
