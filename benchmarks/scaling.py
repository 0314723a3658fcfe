"""Scaling of bec_jax's sweep engine: throughput, memory and compile time against the
batch size (grid points x seeds) and against the number of steps.

    python -m benchmarks.scaling             # the full measurement (a few minutes)
    python -m benchmarks.scaling --smoke     # tiny sizes, seconds: checks the script works
    python -m benchmarks.scaling --runs 1e7  # the batch axis up to 10^7 runs: fills a GPU

Workloads (Boyan chain CTDC, float32, RMSCBE every 10 steps):
  * batch: grid points x seeds = 1 x 1, 1 x 10, then 2, 20, 200, 2000 and 20000
    points x 50 seeds (batch 1 to 10^6), 1000 steps each (the 10^6 point is 10^9
    updates a call, about 3 s);
  * steps: the standard grid (576 points x 50 seeds) for 10, 100, 1000 and 10000 steps.
`--runs N` sets the batch axis's end (up to 10^9): the batch sizes above up to N,
then one a decade, and N itself (grid points x 50 seeds, 1000 steps); the engine's
memory plan splits a grid too large for one call into calls.
Grids other than the standard one have alpha log-spaced over [1e-4, 0.3], beta =
0.1, zeta = 0.01. Each configuration runs in a fresh subprocess (so memory peaks do
not accumulate) that calls `bec_jax.prediction.sweep.run` `--repeats` times (default 3). Each
call compiles afresh (no persistent cache); throughput is the steady state: the
engine's run time (compile excluded), median over the repeats after the first.
Memory is the subprocess's peak resident set size (VmHWM), with its resident size
before the first sweep (Python + JAX initialised) for reference. The compile time
is the first compile in the process (and the median of all).

Writes benchmarks/results/scaling.json and scaling.png, and copies the plot to
docs/scaling.png (full runs only).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

if __package__ in (None, ""):  # run as a file: python benchmarks/scaling.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common
from benchmarks._common import fmt_bytes, fmt_rate
from benchmarks.throughput import parse_runs

COMMAND = "python -m benchmarks.scaling"

# (grid points, seeds, steps). A config with fewer steps than the others would be
# marked "capped" in the table, the JSON and the plot.
BATCH_CONFIGS = [(1, 1, 1000), (1, 10, 1000), (2, 50, 1000), (20, 50, 1000), (200, 50, 1000),
                 (2000, 50, 1000), (20000, 50, 1000)]
STEPS_CONFIGS = [10, 100, 1000, 10000]  # on the standard grid, 576 x 50
FULL_STEPS = 1000

SMOKE_BATCH_CONFIGS = [(1, 1, 20), (4, 5, 10)]
SMOKE_STEPS_CONFIGS = [10, 30]


def batch_configs(runs: int | None = None, smoke: bool = False) -> list:
    """The batch axis's (grid points, seeds, steps): the default configurations,
    or with `runs` those below it, one a decade above them and `runs` itself,
    each with the last default's seeds and steps (points rounded up)."""
    base = SMOKE_BATCH_CONFIGS if smoke else BATCH_CONFIGS
    if runs is None:
        return list(base)
    seeds, steps = base[-1][1], base[-1][2]
    cfgs = [c for c in base if c[0] * c[1] < runs]
    size = 10 * max([c[0] * c[1] for c in cfgs] or [1])
    sizes = []
    while size < runs:
        sizes.append(size)
        size *= 10
    for n in sizes + [runs]:
        cfgs.append((-(-n // seeds), min(seeds, n), steps))
    return cfgs


def _measure(spec, label: str, repeats: int, n_dev: int, capped: bool = False) -> dict:
    w = _common.run_worker({"spec": spec.to_dict(), "repeats": repeats, "cpu_devices": n_dev, "label": label})
    steady = w["run_time_s"][1:] or w["run_time_s"]
    run_s = _common.median(steady)
    return {
        "label": label, "points": w["points"], "seeds": w["seeds"], "steps": w["steps"],
        "batch": w["batch"], "updates": w["updates"], "steps_capped": capped,
        "updates_per_s": w["updates"] / run_s, "run_time_s": run_s,
        "compile_first_s": w["compile_time_s"][0], "compile_median_s": _common.median(w["compile_time_s"]),
        "peak_rss_bytes": w["peak_rss_bytes"], "rss_before_sweep_bytes": w["rss_before_sweep_bytes"],
        "num_devices": w["num_devices"], "chunk_size": w["chunk_size"], "num_chunks": w["num_chunks"],
        "worker": w,
    }


def _row(c: dict) -> list:
    inc = c["peak_rss_bytes"] - (c["rss_before_sweep_bytes"] or 0)
    return [f"{c['points']:,}", c["seeds"], f"{c['batch']:,}", f"{c['steps']:,}" + (" (capped)" if c["steps_capped"] else ""),
            fmt_rate(c["updates_per_s"]), f"{c['run_time_s']:.3f}", f"{c['compile_first_s']:.2f}",
            f"{c['compile_median_s']:.2f}", fmt_bytes(c["peak_rss_bytes"]), fmt_bytes(inc)]


HEADERS = ["points", "seeds", "batch", "steps", "updates/s", "run s", "compile s (first)",
           "compile s (median)", "peak RSS", "RSS over floor"]


def plot(batch: list, steps: list, baseline_ups: float, title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    fig, ax = plt.subplots(2, 3, figsize=(16, 9.5))
    MiB = float(1 << 20)

    def rates(a, xs, cs, xlabel, what):
        ok = [c for c in cs if not c["steps_capped"]]
        cap = [c for c in cs if c["steps_capped"]]
        a.plot([xs(c) for c in ok], [c["updates_per_s"] for c in ok], "o-", color="C0", label="bec_jax (steady state)")
        if cap:
            a.plot([xs(c) for c in cap], [c["updates_per_s"] for c in cap], "s", color="C3", ms=8,
                   label=f"bec_jax, steps capped at {cap[0]['steps']}")
        a.axhline(baseline_ups, color="C2", ls="--", label=f"NumPy loop, one run at a time ({fmt_rate(baseline_ups)} updates/s)")
        a.axhline(_common.TARGET_UPDATES_PER_S, color="0.4", ls=":", label="target 300 M updates/s")
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel(xlabel)
        a.set_ylabel("updates per second (log)")
        a.set_title(f"throughput vs {what}")

    def memory(a, xs, cs, xlabel, what):
        a.plot([xs(c) for c in cs], [c["peak_rss_bytes"] / MiB for c in cs], "o-", color="C1",
               label="peak RSS of the process")
        a.plot([xs(c) for c in cs], [(c["rss_before_sweep_bytes"] or 0) / MiB for c in cs], "x--", color="0.5",
               label="RSS before the sweep (Python + JAX)")
        cap = [c for c in cs if c["steps_capped"]]
        if cap:
            a.plot([xs(c) for c in cap], [c["peak_rss_bytes"] / MiB for c in cap], "s", color="C3", ms=8,
                   label=f"steps capped at {cap[0]['steps']}")
        a.axhline(1024.0, color="0.4", ls=":", label="target 1 GiB")
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_ylim(top=max(1600.0, 1.3 * max(c["peak_rss_bytes"] / MiB for c in cs)))
        for axis in (a.yaxis,):
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(ScalarFormatter())
        a.set_xlabel(xlabel)
        a.set_ylabel("memory (MiB, log)")
        a.set_title(f"peak memory vs {what}")

    def compile_(a, xs, cs, xlabel, what):
        a.plot([xs(c) for c in cs], [c["compile_first_s"] for c in cs], "o-", color="C4",
               label="first compile in a fresh process")
        cap = [c for c in cs if c["steps_capped"]]
        if cap:
            a.plot([xs(c) for c in cap], [c["compile_first_s"] for c in cap], "s", color="C3", ms=8,
                   label=f"steps capped at {cap[0]['steps']}")
        a.plot([xs(c) for c in cs], [c["compile_median_s"] for c in cs], "x--", color="C5",
               label="median of the repeats")
        a.axhline(_common.TARGET_COMPILE_S, color="0.4", ls=":", label="target 2 s")
        a.set_xscale("log")
        a.set_ylim(0, max(3.0, 1.25 * max(max(c["compile_first_s"], c["compile_median_s"]) for c in cs)))
        a.set_xlabel(xlabel)
        a.set_ylabel("compile time (s)")
        a.set_title(f"compile time vs {what}")

    bx = "batch size = grid points x seeds (log)"
    rates(ax[0, 0], lambda c: c["batch"], batch, bx, "batch size")
    std = [c for c in steps if c["steps"] == FULL_STEPS]
    if std:  # where the standard workload sits on the batch axis
        ax[0, 0].plot([std[0]["batch"]], [std[0]["updates_per_s"]], "*", color="C1", ms=13,
                      label=f"standard workload ({std[0]['points']} x {std[0]['seeds']} x {FULL_STEPS})")
    memory(ax[0, 1], lambda c: c["batch"], batch, bx, "batch size")
    seeds = max(c["seeds"] for c in batch)
    same_seeds = [c for c in batch if c["seeds"] == seeds]
    compile_(ax[0, 2], lambda c: c["points"], same_seeds, "grid points (log)", f"grid size ({seeds} seeds)")
    sx = "steps per run (log)"
    g = steps[0]["points"], steps[0]["seeds"]
    rates(ax[1, 0], lambda c: c["steps"], steps, sx, f"steps ({g[0]} points x {g[1]} seeds)")
    memory(ax[1, 1], lambda c: c["steps"], steps, sx, f"steps ({g[0]} x {g[1]})")
    compile_(ax[1, 2], lambda c: c["steps"], steps, sx, f"steps ({g[0]} x {g[1]})")
    for a in ax.flat:
        a.grid(True, which="major", alpha=0.3)
        a.legend(fontsize=8, loc="best")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds); checks the script works")
    ap.add_argument("--repeats", type=int, default=None, help="sweep.run calls per configuration (default 3; 1 with --smoke)")
    ap.add_argument("--cpu-devices", type=int, default=None,
                    help="JAX CPU devices (default: BEC_JAX_CPU_DEVICES or every core)")
    ap.add_argument("--out-dir", default=_common.RESULTS_DIR, help="where scaling.json and scaling.png go")
    ap.add_argument("--no-docs", action="store_true", help="do not copy the plot to docs/scaling.png")
    ap.add_argument("--runs", default=None, metavar="N",
                    help="the batch axis's largest size in runs (grid points x seeds), up to 1e9 (default: 10^6; "
                         "1e7 fills a GPU); the plot is not copied to docs/")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    try:
        runs = None if args.runs is None else parse_runs(args.runs)
    except ValueError as e:
        print(f"{COMMAND}: error: {e}", file=sys.stderr)
        return 2

    n_dev = _common.use_all_cpu_cores(args.cpu_devices)  # before any JAX computation
    from benchmarks import baseline_numpy as baseline

    repeats = args.repeats or (1 if args.smoke else 3)
    machine, jinfo = _common.machine_info(), _common.jax_info()
    print(f"machine: {_common.describe_machine(machine, jinfo)}")
    if args.smoke:
        print("[SMOKE: tiny sizes, numbers mean nothing]")

    # The NumPy loop's rate, for reference on the plot (benchmarks.throughput measures
    # it properly against the standard workload).
    std = _common.standard_spec()
    pts, _ = baseline.subset_points(std, 2 if args.smoke else 4)
    b = baseline.run_grid(pts, range(2 if args.smoke else 3), 100 if args.smoke else std.steps, std.log_every)
    print(f"NumPy loop: {fmt_rate(b['updates_per_s'])} updates/s")

    batch_cfgs = batch_configs(runs, args.smoke)
    steps_cfgs = SMOKE_STEPS_CONFIGS if args.smoke else STEPS_CONFIGS
    cap_steps = max(s for _, _, s in batch_cfgs)

    print(f"\nbatch size (each configuration in a fresh process, {repeats} sweep.run calls):")
    batch = []
    for G, N, T in batch_cfgs:
        capped = T < cap_steps
        t = time.perf_counter()
        c = _measure(_common.ctdc_grid_spec(G, N, T), f"batch {G}x{N}x{T}", repeats, n_dev, capped)
        batch.append(c)
        print(f"  {G:>6,} points x {N:>2} seeds = {G * N:>9,} x {T:>5} steps{' (capped)' if capped else '':9}: "
              f"{fmt_rate(c['updates_per_s']):>7} updates/s, peak {fmt_bytes(c['peak_rss_bytes']):>9}, "
              f"compile {c['compile_first_s']:.2f} s; plan {c['chunk_size']} points a call x {c['num_chunks']} "
              f"[{time.perf_counter() - t:.0f} s]", flush=True)

    print("\nsteps (standard grid):")
    steps = []
    for T in steps_cfgs:
        spec = (_common.ctdc_grid_spec(4, 5, T) if args.smoke
                else _common.standard_spec(steps=T, log_every=min(10, T)))
        t = time.perf_counter()
        c = _measure(spec, f"steps {T}", repeats, n_dev)
        steps.append(c)
        print(f"  {spec.num_points} points x {spec.seeds} seeds x {T:>6,} steps: "
              f"{fmt_rate(c['updates_per_s']):>7} updates/s, peak {fmt_bytes(c['peak_rss_bytes']):>9}, "
              f"compile {c['compile_first_s']:.2f} s  [{time.perf_counter() - t:.0f} s]", flush=True)

    # Marginal memory per grid point: the peak of the largest grid over that of the
    # smallest with as many seeds (at small sizes the compiler's peak dominates).
    big = max(batch, key=lambda c: c["points"])
    small = min((c for c in batch if c["seeds"] == big["seeds"]), key=lambda c: c["points"])
    per_point = ((big["peak_rss_bytes"] - small["peak_rss_bytes"]) / (big["points"] - small["points"])
                 if big["points"] > small["points"] else None)

    print()
    print("batch size:")
    _common.print_table(HEADERS, [_row(c) for c in batch])
    print("\nsteps:")
    _common.print_table(HEADERS, [_row(c) for c in steps])
    notes = [f"The largest batch runs {min(s for _, _, s in batch_cfgs):,} steps instead of {cap_steps:,} "
             "(capped to keep the script within a few minutes); marked 'capped'."
             if any(c['steps_capped'] for c in batch) else "",
             "Grids with fewer points than devices are padded to one point per device by the engine; "
             "updates/s counts the requested points only.",
             "peak RSS is the whole process (Python, JAX runtime, compiler); 'RSS over floor' subtracts "
             "the resident size after JAX initialised, before the first sweep."]
    notes = [n for n in notes if n]
    for n in notes:
        print(f"note: {n}")
    if per_point is not None:
        print(f"marginal memory per grid point ({big['seeds']} seeds): {fmt_bytes(per_point)} "
              f"(peak RSS of the {big['points']:,}-point grid minus that of the {small['points']:,}-point grid, "
              f"divided by the difference in points)")

    os.makedirs(args.out_dir, exist_ok=True)
    png = os.path.join(args.out_dir, "scaling_smoke.png" if args.smoke else "scaling.png")
    title = (f"bec_jax sweep engine scaling, Boyan chain CTDC, float32 - {machine['cpu_model']}, "
             f"{machine['cpu_cores']} cores, {jinfo['num_devices']} JAX {jinfo['backend']} devices, "
             f"JAX {jinfo['jax_version']}" + ("  [SMOKE]" if args.smoke else ""))
    plot(batch, steps, b["updates_per_s"], title, png)
    print(f"wrote {os.path.relpath(png)}")
    docs_copy = None
    if not args.smoke and not args.no_docs and runs is None:
        os.makedirs(_common.DOCS_DIR, exist_ok=True)
        docs_copy = os.path.join(_common.DOCS_DIR, "scaling.png")
        shutil.copyfile(png, docs_copy)
        print(f"copied to {os.path.relpath(docs_copy)}")

    out = {
        "benchmark": "scaling", "smoke": args.smoke, "timestamp": _common.timestamp(),
        "command": COMMAND + (" --smoke" if args.smoke else "") + (f" --runs {runs}" if runs else ""),
        "machine": machine, "jax": jinfo, "load_average_at_end": _common.load_average(),
        "runs": runs, "repeats": repeats, "baseline_numpy_updates_per_s": b["updates_per_s"],
        "batch": batch, "steps": steps, "memory_per_grid_point_bytes": per_point,
        "memory_per_grid_point_from": [small["label"], big["label"]] if per_point is not None else None,
        "notes": notes, "plot": png, "plot_docs_copy": docs_copy,
        "wall_time_s": time.perf_counter() - t_start,
    }
    path = _common.write_json(_common.result_path(args.out_dir, "scaling", args.smoke), out)
    print(f"wrote {os.path.relpath(path)} ({out['wall_time_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
