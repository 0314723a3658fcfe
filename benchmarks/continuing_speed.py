"""Continuing control speed: the reward-centering paper's Access-Control grid
(issue 46 item 7) as one bec_jax sweep, against the per-step Python loop such
papers run.

    python -m benchmarks.continuing_speed [--seeds 50] [--steps 10000] [--loop-steps 50000] [--smoke]

The grid is Naik et al.'s (arXiv 2405.09999; `bec-jax reproduce --paper
reward-centering`): Q-learning with value-based reward centering (q_vrc),
alpha in 2^-7 .. 1 (8) x eta in {0, 2^-8, 2^-6, 2^-4, 2^-2, 1} x gamma in
{0, 0.5, 0.8, 0.9, 0.99, 0.999, 1} x reward offset in {-8, -4, 0, 4, 8}: 1680
points, epsilon 0.1. The full sweep is 50 runs x 50,000 steps a point, 4.2 x
10^9 run-steps.

  1. bec_jax: every point of the grid with `--seeds` runs of `--steps` steps
     (default a fifth of the paper's runs, about a minute here), one
     `continuing.sweep.run` in a fresh process with no compilation cache, on
     every CPU core (`use_all_cpu_cores`): import, compile and run timed
     apart. The full grid's time is projected as compile + run x (4.2 x 10^9
     / the run-steps measured): the program is the same but for its number of
     log blocks, and a run-step costs the same at any T.
  2. The Python loop: one run of epsilon-greedy tabular Q-learning with
     value-based reward centering on Access-Control, a step at a time in
     Python and NumPy as Naik et al.'s code and csuite's environment do it
     (`python_loop`), at one setting of the grid (alpha 2^-4, eta 2^-4,
     gamma 0.99, offset 0), `--loop-steps` steps; projected to the grid's
     4.2 x 10^9 run-steps at its rate.

Both in the same invocation, on the same machine. The loop's reward rate and
bec_jax's at the same setting are printed side by side, a rough check that
both run the same learner on the same task (only rough: the random streams
differ, and the loop's one run is longer than bec_jax's runs by default, so
it has learnt for longer). Output: a table and
benchmarks/results/continuing_speed.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks import _common

ALPHAS = [2.0 ** -k for k in range(7, -1, -1)]
ETAS = [0.0, 2.0 ** -8, 2.0 ** -6, 2.0 ** -4, 2.0 ** -2, 1.0]
GAMMAS = [0.0, 0.5, 0.8, 0.9, 0.99, 0.999, 1.0]
OFFSETS = [-8.0, -4.0, 0.0, 4.0, 8.0]
PAPER_SEEDS, PAPER_STEPS = 50, 50_000
FULL_RUN_STEPS = len(ALPHAS) * len(ETAS) * len(GAMMAS) * len(OFFSETS) * PAPER_SEEDS * PAPER_STEPS  # 4.2e9
TARGET_S, TARGET_RATE = 180.0, 25e6  # issue 46 item 7: under 3 minutes cold on 2 cores, >= 25 M run-steps/s
# The loop's setting: one point of the grid, in its middle.
LOOP_SETTING = {"alpha": 2.0 ** -4, "eta": 2.0 ** -4, "gamma": 0.99, "reward_offset": 0.0, "epsilon": 0.1}
# Access-Control (csuite's defaults, `continuing.tabular.access_control`).
SERVERS, PRIORITIES, FREE_P = 10, (1.0, 2.0, 4.0, 8.0), 0.06


def grid(smoke: bool) -> dict:
    """The grid's axes; the smoke grid takes two values of each."""
    if smoke:  # the loop's setting and one more value of each axis
        return {"alpha": [LOOP_SETTING["alpha"], 1.0], "eta": [LOOP_SETTING["eta"], 1.0],
                "gamma": [LOOP_SETTING["gamma"], 1.0], "reward_offset": [LOOP_SETTING["reward_offset"], 8.0]}
    return {"alpha": ALPHAS, "eta": ETAS, "gamma": GAMMAS, "reward_offset": OFFSETS}


# ---------------------------------------------------------------- bec_jax, in a fresh process

def worker(cfg: dict) -> dict:
    """The sweep of `cfg` in this (fresh) process: imports, compile and run timed apart."""
    t0 = time.perf_counter()
    os.environ["BEC_JAX_NO_CACHE"] = "1"
    cores = _common.use_all_cpu_cores()
    _common.configure_cache(None)
    import jax

    from bec_jax.control.continuing import sweep
    from bec_jax.control.continuing.spec import ContinuingSpec
    axes = cfg["grid"]
    spec = ContinuingSpec(task="access_control", algorithm="q_vrc",
                          hyperparameters={"alpha": axes["alpha"], "eta": axes["eta"]},
                          epsilon=LOOP_SETTING["epsilon"], gamma=axes["gamma"], reward_offset=axes["reward_offset"],
                          seeds=cfg["seeds"], steps=cfg["steps"])
    t1 = time.perf_counter()
    r = sweep.run(spec, progress=False, chunk_size=cfg.get("chunk_size"))
    t2 = time.perf_counter()
    g = spec.grid_arrays()
    at = np.ones(spec.num_points, bool)
    for k in ("alpha", "eta", "gamma", "reward_offset"):
        at &= np.isclose(np.asarray(g[k], float), LOOP_SETTING[k])
    rate = float(np.mean(r.reward[np.flatnonzero(at)[0]])) if at.any() else None
    return {"import_s": t1 - t0, "sweep_s": t2 - t1, "wall_s": t2 - t0,
            "compile_s": r.meta["compile_time_s"], "run_s": r.meta["run_time_s"],
            "points": spec.num_points, "seeds": spec.seeds, "steps": spec.steps,
            "run_steps": spec.num_points * spec.seeds * spec.steps,
            "chunk_size": r.meta.get("chunk_size"), "num_chunks": r.meta.get("num_chunks"),
            "cpu_devices": cores, "n_devices": len(jax.devices()), "jax_version": jax.__version__,
            "loop_setting_reward_rate": rate}


def bec_jax_time(cfg: dict) -> dict:
    """`worker(cfg)` in a fresh Python process; its result and the process's own wall time."""
    env = dict(os.environ)
    env["PYTHONPATH"] = _common.REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.continuing_speed", "--worker", json.dumps(cfg)],
                          cwd=_common.REPO_ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"bec_jax worker failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_s"] = time.perf_counter() - t
    return res


# ---------------------------------------------------------------- the per-step Python loop

def python_loop(steps: int, seed: int = 0, alpha: float = LOOP_SETTING["alpha"], eta: float = LOOP_SETTING["eta"],
                gamma: float = LOOP_SETTING["gamma"], offset: float = LOOP_SETTING["reward_offset"],
                epsilon: float = LOOP_SETTING["epsilon"]) -> dict:
    """One run of tabular Q-learning with value-based reward centering on
    Access-Control, one step at a time as such papers' code runs it (Naik et
    al.'s agents; csuite's `access_control.py` environment): NumPy's generator
    for every draw, ties broken at random, Q a (S, A) array. Returns the wall
    time and the mean reward per step (the offset not included)."""
    rng = np.random.default_rng(seed)
    k = len(PRIORITIES)
    q = np.zeros(((SERVERS + 1) * k, 2))
    rbar, total = 0.0, 0.0
    busy, prio = 0, int(rng.integers(k))
    beta = eta * alpha
    t0 = time.perf_counter()
    for _ in range(steps):
        s = busy * k + prio
        if rng.random() < epsilon:
            a = int(rng.integers(2))
        else:
            row = q[s]
            a = int(rng.choice(np.flatnonzero(row == row.max())))
        # The environment's step: accept with a free server pays the priority;
        # then the next priority; then each busy server frees with probability p.
        reward = 0.0
        if a == 1 and busy < SERVERS:
            reward = PRIORITIES[prio]
            busy += 1
        prio = int(rng.integers(k))
        busy -= int(rng.binomial(busy, FREE_P))
        s2 = busy * k + prio
        # The learner: delta_bar = r + offset - rbar + gamma max Q(s') - Q(s, a).
        delta = reward + offset - rbar + gamma * q[s2].max() - q[s, a]
        q[s, a] += alpha * delta
        rbar += beta * delta
        total += reward
    return {"wall_s": time.perf_counter() - t0, "steps": steps, "reward_rate": total / steps}


# ---------------------------------------------------------------- main

def _report(b: dict, loop: dict) -> list[str]:
    """The table's lines."""
    full_jax = b["compile_s"] + b["run_s"] * FULL_RUN_STEPS / b["run_steps"]
    full_loop = loop["wall_s"] * FULL_RUN_STEPS / loop["steps"]
    rate = b["run_steps"] / b["run_s"]
    return [
        f"Access-Control, q_vrc, {b['points']} points x {b['seeds']} seeds x {b['steps']:,} steps "
        f"({b['run_steps']:.3g} run-steps; {b['num_chunks']} chunk(s) of {b['chunk_size']} points; "
        f"{b['n_devices']} CPU devices)",
        "",
        "| what | time | run-steps/s | full grid (4.2e9 run-steps), projected |",
        "|---|---|---|---|",
        f"| bec_jax, fresh process, no cache: import / compile / run | {b['import_s']:.2f} s / {b['compile_s']:.2f} s / "
        f"{b['run_s']:.2f} s | {rate / 1e6:.1f} M | {full_jax:.0f} s (target < {TARGET_S:.0f} s: "
        f"{_common.verdict(full_jax < TARGET_S)}; rate >= 25 M: {_common.verdict(rate >= TARGET_RATE)}) |",
        f"| Python loop, one run of {loop['steps']:,} steps | {loop['wall_s']:.2f} s | {loop['steps'] / loop['wall_s'] / 1e3:.0f} k "
        f"| {full_loop / 86400:.1f} days ({full_loop / full_jax:,.0f}x bec_jax) |",
        "",
        f"reward rate at alpha 2^-4, eta 2^-4, gamma 0.99, offset 0: bec_jax {b['loop_setting_reward_rate']} "
        f"(mean over seeds and the run), the loop {loop['reward_rate']:.4f} (one run)",
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=PAPER_SEEDS)
    ap.add_argument("--steps", type=int, default=10_000, help="steps a run (the paper's: 50,000)")
    ap.add_argument("--loop-steps", type=int, default=PAPER_STEPS, help="steps of the Python loop's one run")
    ap.add_argument("--chunk-size", type=int, help="grid points a compiled call (default: the memory plan's)")
    ap.add_argument("--smoke", action="store_true", help="a 16-point grid, tiny sizes: checks the script works")
    ap.add_argument("--out-dir", default=_common.RESULTS_DIR)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(json.loads(a.worker))))
        return 0
    seeds, steps, loop_steps = (2, 100, 1000) if a.smoke else (a.seeds, a.steps, a.loop_steps)
    machine = _common.machine_info()
    b = bec_jax_time({"grid": grid(a.smoke), "seeds": seeds, "steps": steps, "chunk_size": a.chunk_size})
    loop = python_loop(loop_steps)
    lines = _report(b, loop)
    print("\n".join(lines))
    full_jax = b["compile_s"] + b["run_s"] * FULL_RUN_STEPS / b["run_steps"]
    full_loop = loop["wall_s"] * FULL_RUN_STEPS / loop["steps"]
    _common.write_json(_common.result_path(a.out_dir, "continuing_speed", a.smoke), {
        "benchmark": "continuing_speed", "timestamp": _common.timestamp(), "smoke": a.smoke, "machine": machine,
        "grid": grid(a.smoke), "loop_setting": LOOP_SETTING, "bec_jax": b, "python_loop": loop,
        "run_steps_per_s": b["run_steps"] / b["run_s"], "loop_steps_per_s": loop["steps"] / loop["wall_s"],
        "full_grid_run_steps": FULL_RUN_STEPS, "full_grid_s": full_jax, "full_grid_loop_s": full_loop,
        "ratio": full_loop / full_jax, "target_met": bool(full_jax < TARGET_S and b["run_steps"] / b["run_s"] >= TARGET_RATE),
        "table": lines})
    return 0


if __name__ == "__main__":
    sys.exit(main())
