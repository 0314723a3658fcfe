"""Control at the engine's speed: the reproduction's workloads, the paper
authors' whole control system and `bec-jax reproduce --paper control`, each
from a cold process, for two installs side by side (the code before a change
and after it), alternating in one run.

    python -m benchmarks.control_engine --python OLD_VENV/bin/python --python NEW_VENV/bin/python \
        [--what workloads,authors,reproduce] [--tasks cliff_walking,maze] [--json PATH]

* workloads: each task's selection grids (every algorithm and step size of
  `experiments.control`, 10 seeds, the task's episodes and step budget), in
  one cold process per task, run as that install's reproduction runs them
  (`run_many`, one program per task, where it has it; else one program per
  algorithm, two at a time). Steps per second: logged environment steps over
  the wall time of the sweeps, compiles included.
* authors: the authors' system (GameAI-NJUPT/BEC) at their settings: Q, CQ, GQ
  and CGQ at alpha 0.1, beta 1e-4 and the task's zeta, epsilon 0.01 decayed by
  0.9992 to 1e-4; CliffWalking 10 seeds x 3000 episodes, Maze 50 x 2000,
  MountainCar 5 x 1500, Acrobot 5 x 1500; no step budget. All four tasks in
  one cold process, from the first import to the last episode statistic.

Each process has one JAX CPU device per core, as the command line sets up.
* reproduce: `bec-jax reproduce --paper control` into a fresh directory, wall.

Every process has the persistent compilation cache off (BEC_JAX_NO_CACHE=1).
Quote the machine with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common  # noqa: E402

AUTHORS = {"cliff_walking": (10, 3000), "maze": (50, 2000), "mountain_car": (5, 1500), "acrobot": (5, 1500)}

_WORKER = r"""
import json, os, sys, time
t0 = time.perf_counter()
os.environ["BEC_JAX_NO_CACHE"] = "1"
import jax
jax.config.update("jax_num_cpu_devices", os.cpu_count())  # as the command line does
from concurrent.futures import ThreadPoolExecutor
from bec_jax.control import sweep
from bec_jax.control.spec import ControlSpec
from bec_jax.experiments import control as C
cfg = json.loads(sys.argv[1])

def specs_of(task):
    if cfg["what"] == "workloads":
        return [C.spec_for(task, a, quick=cfg["smoke"]) for a in C.algorithms_for(task)]
    seeds, episodes = cfg["authors"][task] if not cfg["smoke"] else (2, 10)
    z = C.TASKS[task]["zeta"]
    hp = {"q": {"alpha": [0.1]}, "cq": {"alpha": [0.1], "beta": [1e-4]}, "gq": {"alpha": [0.1], "zeta": [z]},
          "cgq": {"alpha": [0.1], "beta": [1e-4], "zeta": [z]}}
    return [ControlSpec(task=task, algorithm=a, hyperparameters=h, seeds=seeds, episodes=episodes,
                        **C.BEHAVIOUR) for a, h in hp.items()]

t1 = time.perf_counter()
out = {}
for task in cfg["tasks"]:
    specs = specs_of(task)
    t = time.perf_counter()
    if hasattr(sweep, "run_many"):
        rs, how = sweep.run_many(specs), "one program per task"
    else:
        with ThreadPoolExecutor(2) as pool:
            rs = list(pool.map(lambda s: sweep.run(s, progress=False), specs))
        how = "one program per algorithm, two at a time"
    out[task] = {"how": how, "wall_s": time.perf_counter() - t, "steps": sum(int(r.lengths.sum()) for r in rs),
                 "compile_s": sum(r.meta["compile_time_s"] for r in rs), "run_s": sum(r.meta["run_time_s"] for r in rs),
                 "runs": sum(r.num_points * r.seeds for r in rs),
                 "last100": {s.algorithm: float(r.lengths[..., -100:].mean()) for s, r in zip(specs, rs)}}
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "wall_s": t2 - t0, "tasks": out, "devices": len(jax.devices()),
                  "cpu_s": time.process_time()}))
"""


def worker(python: str, cfg: dict) -> dict:
    """One cold process of `python` running `cfg`."""
    env = {**os.environ, "BEC_JAX_NO_CACHE": "1"}
    t = time.perf_counter()
    r = subprocess.run([python, "-c", _WORKER, json.dumps(cfg)], capture_output=True, text=True, env=env,
                       cwd=tempfile.gettempdir())
    if r.returncode:
        raise RuntimeError(r.stderr[-3000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t
    return out


def reproduce(python: str, keep: str | None = None) -> dict:
    """`bec-jax reproduce --paper control` of `python`'s install, cold, into a
    fresh directory (kept under `keep`, where given)."""
    env = {**os.environ, "BEC_JAX_NO_CACHE": "1"}
    if keep:
        os.makedirs(keep, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=keep) as tmp:
        out = os.path.join(tmp, "out") if not keep else tempfile.mkdtemp(dir=keep)
        t = time.perf_counter()
        r = subprocess.run([os.path.join(os.path.dirname(python), "bec-jax"), "reproduce", "--paper", "control", "--out", out],
                           capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
        wall = time.perf_counter() - t
        if r.returncode:
            raise RuntimeError(r.stderr[-3000:])
        meta = json.load(open(os.path.join(out, "meta.json")))
    return {"wall_s": wall, "timing": meta.get("timing"), "out": out if keep else None}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", help="an install's python (repeat: old, new; default this one)")
    ap.add_argument("--what", default="workloads,authors,reproduce")
    ap.add_argument("--tasks", default=",".join(AUTHORS))
    ap.add_argument("--json", help="default: OUT_DIR/control_engine[_smoke].json")
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--keep", help="keep each reproduction's output in a new folder under KEEP")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes, CliffWalking's authors' set-up only: checks the script works")
    a = ap.parse_args(argv)
    a.python = a.python or [sys.executable]
    if a.smoke:
        a.what, a.tasks = "authors", "cliff_walking"
    rows = []
    for what in a.what.split(","):
        # workloads: one cold process per task; authors: the whole system in one cold process
        groups = [[t] for t in a.tasks.split(",")] if what == "workloads" else [a.tasks.split(",")]
        for tasks in (groups if what != "reproduce" else [["all"]]):
            for py in a.python:
                if what == "reproduce":
                    res = reproduce(py, a.keep)
                else:
                    res = worker(py, {"what": what, "tasks": tasks, "authors": AUTHORS, "smoke": a.smoke})
                    for t in res["tasks"].values():
                        t["Msteps_per_s"] = t["steps"] / t["wall_s"] / 1e6
                row = {"what": what, "tasks": tasks, "python": py, **res}
                rows.append(row)
                print(json.dumps(row), flush=True)
    path = a.json or os.path.join(a.out_dir, f"control_engine{'_smoke' if a.smoke else ''}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": _common.machine_info(), "smoke": a.smoke, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
