"""Control speed: the authors' CliffWalking experiment (Q, CQ, GQ, CGQ at alpha
0.1, beta 1e-4, zeta 0.005; 10 seeds x 3000 episodes; their epsilon schedule)
as bec_jax sweeps, against the NumPy loop of the same algorithms
(`benchmarks/control_numpy.py`, one run at a time, as the authors' main.py).

    python -m benchmarks.control_speed [--grid] [--json PATH]

bec_jax runs in a fresh process with no compilation cache and the four sweeps
two at a time (XLA compiles outside the GIL); its time counts imports, compiles
and runs. `--grid` also times the reproduction's CliffWalking grids (36
settings x 10 seeds) both ways. Quote the machine with every figure.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from benchmarks import _common, control_numpy

AUTHORS = {"q": {"alpha": 0.1}, "cq": {"alpha": 0.1, "beta": 1e-4}, "gq": {"alpha": 0.1, "zeta": 0.005},
           "cgq": {"alpha": 0.1, "beta": 1e-4, "zeta": 0.005}}

_WORKER = r"""
import json, os, sys, time
t0 = time.perf_counter()
os.environ["BEC_JAX_NO_CACHE"] = "1"
import jax
jax.config.update("jax_num_cpu_devices", os.cpu_count())
from concurrent.futures import ThreadPoolExecutor
from bec_jax.control import sweep
from bec_jax.control.spec import ControlSpec
cfg = json.loads(sys.argv[1])
specs = [ControlSpec(task="cliff_walking", algorithm=a, hyperparameters=hp, seeds=cfg["seeds"],
                     episodes=cfg["episodes"], epsilon=0.01, epsilon_decay=0.9992, epsilon_min=1e-4,
                     max_steps=cfg.get("max_steps"))
         for a, hp in cfg["sweeps"]]
t1 = time.perf_counter()
with ThreadPoolExecutor(2) as pool:
    rs = list(pool.map(lambda s: sweep.run(s, progress=False), specs))
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "sweeps_s": t2 - t1, "wall_s": t2 - t0,
                  "compile_s": sum(r.meta["compile_time_s"] for r in rs),
                  "run_s": sum(r.meta["run_time_s"] for r in rs),
                  "steps": sum(int(r.lengths.sum()) for r in rs),
                  "last100": [float(r.lengths[..., -100:].mean()) for r in rs],
                  "runs": sum(r.num_points * r.seeds for r in rs),
                  "device": jax.devices()[0].device_kind, "platform": jax.devices()[0].platform,
                  "n_devices": len(jax.devices())}))
"""


def bec_jax_time(sweeps, seeds: int, episodes: int, max_steps=None) -> dict:
    """The sweeps in a fresh process (no compilation cache): wall time from
    the first import to the last result."""
    cfg = {"sweeps": sweeps, "seeds": seeds, "episodes": episodes, "max_steps": max_steps}
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(cfg)], capture_output=True, text=True,
                         cwd=_common.REPO_ROOT, timeout=1800)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["process_s"] = time.perf_counter() - t
    return res


def numpy_time(sweeps, seeds: int, episodes: int, max_steps=None) -> dict:
    """The same runs one at a time with the NumPy loop."""
    t0 = time.perf_counter()
    steps, last = 0, []
    for alg, hp in sweeps:
        kw = {k: v[0] if isinstance(v, list) else v for k, v in hp.items()}
        lengths = []
        for seed in range(seeds):
            r = control_numpy.run(alg.upper(), episodes, seed, **kw)
            steps += r["steps"]
            lengths.append(r["lengths"])
        last.append(float(np.mean([x[-100:] for x in lengths])))
    return {"wall_s": time.perf_counter() - t0, "steps": steps, "last100": last}


def grid_sweeps():
    """The reproduction's CliffWalking grids, one setting per entry (36 for Q, CQ, GQ, CGQ)."""
    from bec_jax.experiments import control
    out = []
    for alg in ("q", "cq", "gq", "cgq"):
        g = control.grid("cliff_walking", alg)
        import itertools
        for vals in itertools.product(*g.values()):
            out.append((alg, dict(zip(g, vals))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--episodes", type=int, default=3000)
    ap.add_argument("--grid", action="store_true", help="also the reproduction's CliffWalking grids")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    machine = _common.machine_info()
    print(control_numpy.describe(machine).split(";")[0])
    work = [(a, {k: [v] for k, v in hp.items()}) for a, hp in AUTHORS.items()]
    out = {"benchmark": "control_speed", "timestamp": _common.timestamp(), "machine": machine,
           "seeds": args.seeds, "episodes": args.episodes}
    b = bec_jax_time(work, args.seeds, args.episodes)
    n = numpy_time(work, args.seeds, args.episodes)
    out["authors"] = {"bec_jax": b, "numpy": n}
    print(f"\nCliffWalking, Q/CQ/GQ/CGQ at the authors' setting, {args.seeds} seeds x {args.episodes} episodes "
          f"({b['steps']:,} steps):")
    print(f"  bec_jax (fresh process, no cache, {b['n_devices']} {b['platform']} devices, {b['device']}): "
          f"{b['wall_s']:.2f} s = import {b['import_s']:.2f} + compile {b['compile_s']:.2f} + run {b['run_s']:.2f} "
          f"(sweeps overlap: {b['sweeps_s']:.2f} s); target < 30 s: {'met' if b['wall_s'] < 30 else 'MISSED'}")
    print(f"  NumPy loop, one run at a time: {n['wall_s']:.2f} s; ratio NumPy / bec_jax {n['wall_s'] / b['wall_s']:.2f}")
    print("  steps per episode over the last 100 episodes (bec_jax / NumPy): " + ", ".join(
        f"{a} {x:.2f}/{y:.2f}" for a, x, y in zip(AUTHORS, b["last100"], n["last100"])))
    if args.grid:
        g = grid_sweeps()
        gb = bec_jax_time([(a, {k: sorted({hp[k] for aa, hp in g if aa == a}) for k in hp})
                           for a, hp in {a: hp for a, hp in g}.items()], args.seeds, args.episodes)
        gn = numpy_time([(a, hp) for a, hp in g], args.seeds, args.episodes)
        out["grid"] = {"bec_jax": gb, "numpy": gn, "settings": len(g)}
        print(f"\nThe reproduction's CliffWalking grids ({len(g)} settings x {args.seeds} seeds, "
              f"{gb['steps']:,} steps):")
        print(f"  bec_jax: {gb['wall_s']:.2f} s (compile {gb['compile_s']:.2f}, run {gb['run_s']:.2f}); "
              f"NumPy loop: {gn['wall_s']:.2f} s; ratio {gn['wall_s'] / gb['wall_s']:.2f}")
    if args.json:
        print(f"wrote {_common.write_json(args.json, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
