"""The roofline of one control step, per task: bytes and flops against this
machine's ceilings, and the dispatch count that bounds it instead.

    python -m benchmarks.control_roofline [--runs N] [--tasks cliff_walking,maze,...] [--smoke]

For each task, one algorithm (CGQ: the costliest of Q, CQ, GQ, CGQ) at the
authors' behaviour, the runs of the task's selection grid (`TASKS`; `--runs`
for another count) as one flat batch, exactly the step a control program
scans (`control.program.member`: act, step the task, update, log, and the
resets where an episode ended), compiled with the XLA options the control
front gives the reproduction's sweeps (`tuning.choose_form`: the fusion
emitters), on one CPU device:

  1. flops and bytes of one step of the batch, from XLA's cost analysis of the
     compiled step, divided by the runs: the work of one run-step. XLA counts
     every operand of a scatter or gather whole, so its bytes are an upper
     bound: a step reads and writes only its active features' weights. The
     lower bound, the bytes a run-step must touch: CGQ reads the weights of
     its A actions' m active features in s (to act) and in s' (its greedy
     target), and reads and writes w and u at the m features of (s, a):
     4 (2 A m + 4 m) bytes (float32; sparse features, m indices an action);
  2. the thunks of one step: the compiled step's top-level operations (fusions,
     copies, gathers, scatters, conditionals), each dispatched on its own by
     XLA:CPU's runtime;
  3. the measured time of a step: a scan of `--steps` steps of the batch, in
     ns per run-step and in microseconds per batch step;
  4. the ceilings, measured here (`benchmarks.roofline`): one core's memory
     bandwidth for a 1 MiB state and its fused multiply-add rate.

The roofline time of a run-step is max(touched bytes / bandwidth, flops /
peak), its floor; the table gives it beside the measured time, and the measured time of a batch
step divided by its thunks, the cost of a dispatch if dispatch were all.
Output: a Markdown table and benchmarks/results/control_roofline.json.
"""
from __future__ import annotations

import argparse
import re

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import _common, roofline

# Runs a batch per task: the reproduction's selection grids (every algorithm and
# step size x 10 seeds; `benchmarks.control_engine`'s workloads).
TASKS = {"cliff_walking": 480, "maze": 480, "mountain_car": 150, "acrobot": 50}
# Top-level operations of a compiled step that XLA:CPU dispatches as thunks.
_THUNK_OPS = ("fusion", "copy", "gather", "scatter", "conditional", "while", "custom-call", "dynamic-update-slice",
              "dynamic-slice", "sort", "reduce", "select", "add", "multiply", "compare", "convert", "broadcast",
              "concatenate", "slice", "iota", "bitcast-convert", "and", "or", "xor", "shift-right-logical",
              "shift-left", "subtract", "maximum", "minimum", "divide", "exponential", "log", "negate")


def _spec(task: str, runs: int):
    from bec_jax.control.spec import ControlSpec
    from bec_jax.experiments import control as C
    z = C.TASKS[task]["zeta"]
    return ControlSpec(task=task, algorithm="cgq", hyperparameters={"alpha": [0.1], "beta": [1e-4], "zeta": [z]},
                       seeds=runs, episodes=10, **C.BEHAVIOUR)


def _entry_thunks(hlo_text: str) -> int:
    """Instructions of the entry computation that are dispatched (not parameters,
    tuples, constants or get-tuple-elements)."""
    entry = hlo_text[hlo_text.index("ENTRY"):]
    entry = entry[:entry.index("\n}")]
    ops = re.findall(r"=\s*[^ ]+\s+([a-z\-]+)\(", entry)
    return sum(1 for op in ops if op in _THUNK_OPS)


def measure(task: str, runs: int, steps: int, repeats: int) -> dict:
    """One task's step: its cost analysis, thunks and measured time."""
    from bec_jax import threefry
    from bec_jax.control import program
    from bec_jax.control import sweep as control_sweep
    from bec_jax.engine import tuning
    spec = _spec(task, runs)
    sh = program.shared([spec])
    m = program.member(spec, sh.task)
    grid = program.grid_inputs(spec, np.arange(1))
    cols = {n: jnp.asarray(v) for n, v in grid.items() if n != program.SEED_INDEX}
    keys = threefry.fused(jax.random.split(jax.random.key(0), runs))
    carry = program.init_member(sh, m, keys, jnp.asarray(grid[program.SEED_INDEX]), cols)[:3]

    def one(c, t):
        keys_t = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, t)
        return m.step_all(c, keys_t, cols)

    # The XLA options the control front compiles the reproduction's sweeps with
    # (`tuning.choose_form`: over LIGHT_COMPILE_UPDATES, the fusion emitters).
    opts = tuning.choose_form(spec, jax.devices()[:1], updates=tuning.LIGHT_COMPILE_UPDATES,
                              front=control_sweep).compiler_options
    step1 = jax.jit(one).lower(carry, jnp.int32(0)).compile(opts)
    cost = step1.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    thunks = _entry_thunks(step1.as_text())
    A, k = carry[1].active.shape[1:]
    touched = 4 * (2 * A * k + 4 * k)  # for dense (A, k) features too: k values an action

    def scanned(c):
        return jax.lax.scan(lambda c, t: (one(c, t), None), c, jnp.arange(steps, dtype=jnp.int32))[0]

    many = jax.jit(scanned).lower(carry).compile(opts)
    t = roofline._timed(many, carry, repeats) / steps
    return {"task": task, "runs": runs, "weights": int(sh.d), "flops_per_run_step": cost.get("flops", 0.0) / runs,
            "bytes_per_run_step": cost.get("bytes accessed", 0.0) / runs, "touched_bytes": touched,
            "actions": int(A), "active": int(k), "thunks_per_step": thunks,
            "batch_step_us": t * 1e6, "run_step_ns": t / runs * 1e9}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--runs", type=int, help="runs in the batch (default: the task's selection grid's, TASKS)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="CliffWalking only, tiny sizes: checks the script works")
    ap.add_argument("--out-dir", default=_common.RESULTS_DIR)
    a = ap.parse_args(argv)
    jax.config.update("jax_num_cpu_devices", 1)
    tasks = ["cliff_walking"] if a.smoke else a.tasks.split(",")
    steps, repeats = (20, 2) if a.smoke else (a.steps, a.repeats)
    bw = roofline.bandwidth_ceiling(iters=20 if a.smoke else 2000, repeats=repeats)
    peak = roofline.compute_ceiling(iters=5 if a.smoke else 500, repeats=repeats)
    rows = []
    for task in tasks:
        r = measure(task, 8 if a.smoke else a.runs or TASKS[task], steps, repeats)
        r["bound_ns"] = max(r["touched_bytes"] / bw, r["flops_per_run_step"] / peak) * 1e9
        r["ns_per_thunk"] = r["batch_step_us"] * 1e3 / max(1, r["thunks_per_step"])
        rows.append(r)
        print(f"{task}: {r['run_step_ns']:.1f} ns per run-step measured, roofline {r['bound_ns']:.2f} ns", flush=True)
    info = _common.machine_info()
    lines = [f"{info['cpu_model']}, {info['cpu_cores']} cores, one JAX CPU device; CGQ; "
             f"bandwidth {bw / 1e9:.1f} GB/s (1 MiB state), peak {peak / 1e9:.1f} Gflop/s (one core)", "",
             "| task | runs | weights | flops / run-step | bytes / run-step (XLA, upper) | bytes touched | roofline ns / run-step | measured ns / run-step "
             "| measured / roofline | thunks / step | µs / batch step | µs / thunk |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['runs']} | {r['weights']} | {r['flops_per_run_step']:.0f} | {r['bytes_per_run_step']:.0f} | {r['touched_bytes']} "
                     f"| {r['bound_ns']:.2f} | {r['run_step_ns']:.1f} | {r['run_step_ns'] / r['bound_ns']:.0f}x "
                     f"| {r['thunks_per_step']} | {r['batch_step_us']:.1f} | {r['ns_per_thunk'] / 1e3:.2f} |")
    print("\n".join(lines))
    _common.write_json(_common.result_path(a.out_dir, "control_roofline", a.smoke),
                       {"machine": info, "bandwidth_Bps": bw, "peak_flops": peak, "rows": rows, "table": lines})


if __name__ == "__main__":
    main()
