"""Network learners' speed (issue 52 item 6): Naik et al.'s CDQN on Catch's
board as bec_jax runs it, the update step against this machine's float32
matmul roofline, and projections of their full grid.

    python -m benchmarks.deep_speed [--runs 4] [--steps 6400] [--repeats 5]
        [--reference-cmd CMD --reference-summary PATH] [--smoke]

  1. The roofline: this machine's float32 matmul rate (`jnp.matmul` at
     HIGHEST, jitted, best of `--repeats`) on a square 2048 product and on the
     update's own shapes; the peak is the highest.
  2. The update step alone (`continuing.deep.update`, jitted), on a full ring
     of Catch's board with their settings (layers [50, 128, 3], a buffer of
     10,000, Adam, `batch = full` as their code runs, and `batch = 64`): its
     products' FLOPs (`deep.update_flops`: the network's pass and its
     backward pass over the rows, the target's over the ring at a sync and
     over the new observations between them) per second over a sync period
     (3 updates between syncs, 1 at a sync), and that as a fraction of the
     peak. Goal: at least half on the CPU (full batch).
  3. The engine: `--runs` runs of `--steps` steps of cdqn_unbiased (their
     CDQN) on Catch's board at their settings, one `continuing.sweep.run` in
     this process (compile and run timed apart): run-steps per second.
  4. Their loop, optionally, in the same invocation: `--reference-cmd` runs
     their PyTorch code (installed in a development venv, never a dependency
     of bec_jax) and `--reference-summary` is the JSON it writes with its
     steps per second (`configs.*.steps_per_s.mean`, as the driver used for
     the agreement table writes it).
  5. Projections of their full Catch grid (7 step sizes x 8 etas x 7 gammas x
     5 offsets x 15 runs x 80,000 steps; eta = 0 as DQN): its FLOPs over the
     rate of 3 (this machine), over an assumed GPU rate (not measured), and
     per part of a 64-part Slurm array.

Output: a table and benchmarks/results/deep_speed.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

from benchmarks import _common

GOAL_FRACTION = 0.5
GPU_NAME, GPU_FLOPS = "an H200, assumed 33.5 TFLOP/s sustained (half its 67 TFLOP/s FP32 peak)", 33.5e12


def best_time(fn, args, repeats: int) -> float:
    """The fastest of `repeats` timed calls of the jitted `fn` (after a warm-up)."""
    import jax
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return min(times)


def roofline(repeats: int) -> dict:
    """{shape: GFLOP/s} of float32 matmuls at HIGHEST, and the peak."""
    import jax
    import jax.numpy as jnp

    out = {}
    for m, k, n in ((2048, 2048, 2048), (10001, 50, 128), (128, 10001, 50)):
        a = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
        b = jax.random.normal(jax.random.key(1), (k, n), jnp.float32)
        f = jax.jit(lambda a, b: jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST))
        out[f"{m}x{k}x{n}"] = 2 * m * k * n / best_time(f, (a, b), repeats) / 1e9
    return {"gflops": out, "peak_gflops": max(out.values())}


def update_rate(batch, repeats: int) -> dict:
    """The update step alone on a full ring, between syncs and at a sync
    (`deep.refresh`): seconds, FLOPs, and over a sync period their mean rate."""
    import jax
    import jax.numpy as jnp

    from bec_jax.control.continuing import deep, tasks

    task = tasks.make("catch", features="board")
    st = deep.resolve_settings(task, {"batch": batch}, task.observation_size)
    key = jax.random.key(0)
    s = deep.init(key, st, jnp.zeros(task.observation_size), 2.0 ** -7)
    M = st.buffer + 1
    ring = s.replay._replace(obs=(jax.random.uniform(key, (M, 50)) < 0.1).astype(jnp.float32),
                             actions=jax.random.randint(key, (M,), 0, 3), rewards=jax.random.normal(key, (M,)),
                             count=jnp.int32(3 * st.buffer))
    s = s._replace(replay=ring, values=deep.target_values(st, s.target, ring.obs))
    f = jax.jit(lambda s, k, sync: deep.update(deep.CDQN_UNBIASED, st, s, k, 2.0 ** -7, 1.0, 0.99, sync))
    t = {sync: best_time(f, (s, key, jnp.asarray(sync)), repeats) for sync in (False, True)}
    k = st.sync_period // st.update_period
    mean_t = ((k - 1) * t[False] + t[True]) / k
    return {"batch": batch, "rows": st.rows, "seconds": mean_t, "seconds_between_syncs": t[False],
            "seconds_at_sync": t[True], "flops": deep.update_flops(st), "gflops": deep.update_flops(st) / mean_t / 1e9}


def engine_rate(runs: int, steps: int, batch) -> dict:
    """One sweep of cdqn_unbiased on Catch's board: compile and run seconds, run-steps/s."""
    from bec_jax.control.continuing import sweep
    from bec_jax.control.continuing.spec import ContinuingSpec

    spec = ContinuingSpec(task="catch", task_params={"features": "board"}, algorithm="cdqn_unbiased",
                          hyperparameters={"alpha": [2.0 ** -7], "eta": [1.0]}, gamma=0.99, seeds=runs,
                          steps=steps, learner_params={"batch": batch})
    r = sweep.run(spec, progress=False)
    m = r.meta
    return {"batch": batch, "runs": runs, "steps": steps, "compile_s": m["compile_time_s"],
            "run_s": m["run_time_s"], "run_steps_per_s": runs * steps / m["run_time_s"],
            "reward_rate": float(r.reward_rate("all").mean())}


def reference(cmd: str | None, path: str | None) -> dict | None:
    """Their loop's steps/s: run `cmd` (if given), then read `path`."""
    if path is None:
        return None
    if cmd:
        subprocess.run(cmd, shell=True, check=True)
    with open(path) as f:
        summary = json.load(f)
    rates = [c["steps_per_s"]["mean"] for c in summary["configs"].values() if c.get("steps_per_s")]
    return {"command": cmd, "summary": path, "steps_per_s": statistics.median(rates) if rates else None,
            "torch": summary.get("torch_version"), "threads": summary.get("torch_num_threads")}


def catch_grid_flops() -> float:
    """Their full Catch grid's FLOPs (DQN and CDQN), `experiments.reward_centering_deep.grid_flops`."""
    from bec_jax.experiments import reward_centering_deep as rcd

    return sum(rcd.grid_flops(rcd.grid_spec("catch", a)) for a in rcd.LEARNERS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--steps", type=int, default=6400)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--reference-cmd")
    p.add_argument("--reference-summary")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    if args.smoke:
        args.runs, args.steps, args.repeats = 2, 640, 2
    cores = _common.use_all_cpu_cores()
    _common.configure_cache(None)
    roof = roofline(args.repeats)
    updates = [update_rate(b, args.repeats) for b in ("full", 64)]
    engines = [engine_rate(args.runs, args.steps, b) for b in ("full", 64)]
    ref = reference(args.reference_cmd, args.reference_summary)
    flops = catch_grid_flops()
    rate = updates[0]["gflops"] * 1e9
    machine = _common.describe_machine(_common.machine_info(), _common.jax_info())
    out = {"machine": machine, "timestamp": _common.timestamp(), "cores": cores, "roofline": roof,
           "updates": [dict(u, fraction_of_peak=u["gflops"] / roof["peak_gflops"]) for u in updates],
           "engine": engines, "reference": ref,
           "catch_grid": {"flops": flops, "cpu_hours": flops / rate / 3600, "gpu": GPU_NAME,
                          "gpu_hours": flops / GPU_FLOPS / 3600, "slurm_64_part_hours": flops / rate / 3600 / 64}}
    print(f"machine: {machine}")
    print("float32 matmul: " + ", ".join(f"{k} {v:.1f}" for k, v in roof["gflops"].items())
          + f" GFLOP/s; peak {roof['peak_gflops']:.1f}")
    for u in out["updates"]:
        print(f"update, batch {u['batch']} ({u['rows']} rows): {u['seconds'] * 1e3:.2f} ms, {u['gflops']:.1f} "
              f"GFLOP/s = {u['fraction_of_peak']:.0%} of the peak")
    for e in engines:
        print(f"engine, batch {e['batch']}: {e['runs']} runs x {e['steps']} steps: compile {e['compile_s']:.1f} s, "
              f"run {e['run_s']:.1f} s, {e['run_steps_per_s']:,.0f} run-steps/s")
    if ref and ref["steps_per_s"]:
        print(f"their loop (PyTorch {ref['torch']}, {ref['threads']} thread): {ref['steps_per_s']:,.0f} steps/s; "
              f"the engine (full batch) {engines[0]['run_steps_per_s'] / ref['steps_per_s']:.1f}x")
    g = out["catch_grid"]
    print(f"their full Catch grid: {g['flops']:.3g} FLOP; {g['cpu_hours']:,.0f} h here, {g['gpu_hours']:.2f} h on "
          f"{GPU_NAME}, {g['slurm_64_part_hours']:,.1f} h per part of a 64-part array")
    path = _common.write_json(_common.result_path(_common.RESULTS_DIR, "deep_speed", args.smoke), out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
