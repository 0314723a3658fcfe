"""`bec-jax reproduce` with an empty compilation cache, as a new user runs it.

Each round is a fresh process running the command line (`python -m bec_jax.cli
reproduce`) with `BEC_JAX_CACHE_DIR` set to a new, empty directory (cold), then
one more with that directory kept (warm; not with `--smoke`). Reported per run: the process's wall
time (Python's start and JAX's import included), the reproduction's own clock
(`timing.total_s` in its meta.json), and the compile and run seconds it summed
over its sweeps (compiles two at a time). Target
(issue 15): under 20 s wall, cold, on 2 cores.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

try:
    from benchmarks import _common
except ImportError:  # run as `python benchmarks/reproduce_time.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common

TARGET_S = 20.0


def run_once(cache_dir: str, out_dir: str, smoke: bool, timeout: float = 900.0) -> dict:
    """One `bec-jax reproduce` in a fresh process (with `smoke`, the control
    reproduction's quick form): its wall time and its own timings."""
    import json

    env = dict(os.environ, BEC_JAX_CACHE_DIR=cache_dir)
    env["PYTHONPATH"] = _common.REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # The smoke run checks the script with the smallest reproduction there is:
    # the control one's quick form (seconds), not the paper's (half a minute).
    cmd = [sys.executable, "-m", "bec_jax.cli", "reproduce", "--out", out_dir] + (
        ["--paper", "control", "--quick"] if smoke else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=_common.REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    with open(os.path.join(out_dir, "meta.json")) as f:
        timing = json.load(f)["timing"]
    # The sweeps' own compile seconds (trace included), as every version reports them.
    return {"wall_s": wall, "total_s": timing["total_s"],
            "compile_s": timing.get("sweeps_compile_s", timing["compile_s"]), "run_s": timing["run_s"],
            "device": timing["device"], "clock": {k: timing.get(k) for k in ("import_s", "trace_s", "cache")}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true",
                    help="one cold `reproduce --paper control --quick` (checks the script works; no warm run)")
    ap.add_argument("--rounds", type=int, default=3, help="cold runs, each with a new empty cache")
    ap.add_argument("--out-dir", default=_common.RESULTS_DIR)
    args = ap.parse_args(argv)
    rounds = 1 if args.smoke else max(1, args.rounds)
    work = tempfile.mkdtemp(prefix="bec_jax_reproduce_time_")
    try:
        cold = []
        for i in range(rounds):
            cache = os.path.join(work, f"cache{i}")
            cold.append(run_once(cache, os.path.join(work, f"out{i}"), args.smoke))
            print(f"cold {i + 1}/{rounds}: {cold[-1]['wall_s']:.1f} s wall ({cold[-1]['total_s']:.1f} s by its "
                  f"clock)", flush=True)
        warm = None if args.smoke else run_once(cache, os.path.join(work, "out_warm"), False)
        if warm:
            print(f"warm: {warm['wall_s']:.1f} s wall ({warm['total_s']:.1f} s by its clock)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = statistics.median(r["wall_s"] for r in cold)
    info = _common.machine_info()
    print(f"{info['cpu_model']}, {info['cpu_cores']} cores; the reproduction ran on {cold[0]['device']}")
    what = "bec-jax reproduce --paper control --quick (smoke: the target does not apply)" if args.smoke else "bec-jax reproduce"
    verdict = "" if args.smoke else f" (target < {TARGET_S:.0f} s: {'met' if med < TARGET_S else 'NOT MET'})"
    print(f"{what}, empty compilation cache: median {med:.1f} s wall over {rounds}{verdict}")
    _common.write_json(_common.result_path(args.out_dir, "reproduce_time", args.smoke),
                       {"machine": info, "smoke": args.smoke, "quick": args.smoke, "cold": cold,
                        "warm": warm, "cold_wall_median_s": med, "target_s": TARGET_S})


if __name__ == "__main__":
    main()
