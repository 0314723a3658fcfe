"""The standard workload on this working tree against an earlier commit, in one run.

    python -m benchmarks.compare_ref --ref HEAD~1     # e.g. the commit before a change
    python -m benchmarks.compare_ref --ref a00a937 --rounds 5
    python -m benchmarks.compare_ref --smoke           # tiny sizes: checks the script works
    python -m benchmarks.compare_ref --ref HEAD~1 --past-bucket   # 577 points: one past a bucket edge

The earlier commit's tree is exported with `git archive` into a temporary
directory. Each round runs one fresh process per tree, alternating which goes
first, so both see the same machine load. A process imports `bec_jax` from its
tree (PYTHONPATH first), uses one JAX CPU device per core (as the command line
does), has the persistent compilation cache off, and calls `sweep.run` on the
standard workload `--repeats` times: the first call's wall time is what a user
waits for in a fresh process (set-up, compile and run; each version's own
`compile_time_s` is reported too, but what it covers differs between versions),
and the steady-state rate is the median `updates_per_s` of the calls after it.
The first round's statistics of both trees are compared bit for bit, and what
differs is listed (which arrays, how many entries, at which log steps, by how
much). It prints a table and writes benchmarks/results/compare_ref.json with
the machine. With `--past-bucket` the workload has one grid point more (577,
the standard grid's points and one more, given as `points`): one past a bucket
edge (`bec_jax.engine.buckets.bucket`), the worst case of a tree that pads a
grid to its bucket (577 run as 640) against one that does not.

Only `SweepSpec(env=..., algorithm=..., alpha=..., beta=..., zeta=..., ...)`,
`sweep.run` and `meta["compile_time_s"]`/`meta["updates_per_s"]` are used, so
any commit since the sweep engine exists can be compared.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_WORKER = r"""
import hashlib, json, os, sys, time
cfg = json.loads(sys.argv[1])
import jax
jax.config.update("jax_num_cpu_devices", cfg["cpu_devices"])
jax.config.update("jax_enable_compilation_cache", False)
import numpy as np
import bec_jax
if os.path.isdir(os.path.join(os.path.dirname(bec_jax.__file__), "prediction")):  # the layout since 0.4
    from bec_jax.prediction import sweep
    from bec_jax.prediction.spec import SweepSpec
else:
    from bec_jax import sweep
    from bec_jax.spec import SweepSpec
spec = SweepSpec(**cfg["spec"])
compile_s, ups, digest, wall = [], [], None, []
for i in range(cfg["repeats"]):
    t = time.perf_counter()
    r = sweep.run(spec, progress=False)
    wall.append(time.perf_counter() - t)
    compile_s.append(r.meta["compile_time_s"])
    ups.append(r.meta["updates_per_s"])
    if digest is None:
        h = hashlib.sha256()
        for a in (r.mean, r.std, r.final, r.diverged_step):
            h.update(np.ascontiguousarray(a).tobytes())
        digest = h.hexdigest()[:16]
        if cfg.get("save"):
            np.savez(cfg["save"], mean=r.mean, std=r.std, sem=r.sem, final=r.final,
                     diverged_step=r.diverged_step)
print(json.dumps({"bec_jax": os.path.dirname(bec_jax.__file__), "compile_time_s": compile_s, "wall_s": wall,
                  "updates_per_s": ups, "digest": digest, "num_devices": len(jax.devices())}))
"""


def _spec(smoke: bool, past_bucket: bool = False) -> dict:
    from benchmarks._common import BOYAN_ALPHA, BOYAN_BETA, BOYAN_ZETA
    if smoke:
        d = dict(env="boyan_chain", algorithm="ctdc", alpha=[1e-2, 0.3], beta=[0.1, 0.5], zeta=[1e-3, 0.1],
                 seeds=4, steps=100, log_every=10, metrics=["rmscbe"], dtype="float32")
    else:
        d = dict(env="boyan_chain", algorithm="ctdc", alpha=list(BOYAN_ALPHA), beta=list(BOYAN_BETA),
                 zeta=list(BOYAN_ZETA), seeds=50, steps=1000, log_every=10, metrics=["rmscbe"], dtype="float32")
    if past_bucket:  # the grid's points (alpha slowest) and one more: a new alpha at the first beta and zeta
        names = ("alpha", "beta", "zeta")
        points = [dict(zip(names, p)) for p in itertools.product(*(d.pop(n) for n in names))]
        d["points"] = points + [{"alpha": points[0]["alpha"] / 2, "beta": points[0]["beta"],
                                 "zeta": points[0]["zeta"]}]
    return d


def export_ref(ref: str, dest: str) -> str:
    """The tree of commit `ref` in `dest` (via git archive); returns its full hash."""
    full = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "archive", full], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return full


def run_tree(tree: str, cfg: dict, timeout: float = 900.0) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = tree + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(cfg)], cwd=tempfile.gettempdir(),
                          env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker for {tree} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1])
    if os.path.realpath(out["bec_jax"]) != os.path.realpath(os.path.join(tree, "bec_jax")):
        raise RuntimeError(f"worker imported bec_jax from {out['bec_jax']}, not {tree}")
    return out


def _differences(ref_path: str, work_path: str) -> dict:
    """Which statistics differ between the two trees' runs: per array, how many
    entries, at which log steps (for the (M, G, L) curves) and by how much."""
    import numpy as np
    out = {}
    with np.load(ref_path) as a, np.load(work_path) as b:
        for k in a.files:
            x, y = a[k], b[k]
            if x.shape != y.shape:
                out[k] = {"count": -1, "log_steps": [], "max_rel": float("inf")}
                continue
            diff = ~((x == y) | (np.isnan(x) & np.isnan(y)))
            if not diff.any():
                continue
            steps = sorted({int(i) for i in np.argwhere(diff)[:, -1]}) if x.ndim == 3 and k != "final" else []
            with np.errstate(invalid="ignore", divide="ignore"):
                rel = np.abs(x[diff] - y[diff]) / np.maximum(np.abs(x[diff]), np.abs(y[diff]))
            out[k] = {"count": int(diff.sum()), "log_steps": steps[:20], "max_rel": float(np.nanmax(rel))}
    return out


def main(argv=None) -> int:
    from bec_jax import provenance
    from benchmarks import _common

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--ref", default="HEAD", help="the commit to compare against (default HEAD)")
    ap.add_argument("--rounds", type=int, default=None, help="fresh processes per tree (default 5; 1 with --smoke)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="sweep.run calls per process, the first one the compile (default 4; 2 with --smoke)")
    ap.add_argument("--cpu-devices", type=int, default=None, help="JAX CPU devices (default: every core)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes; checks the script works")
    ap.add_argument("--past-bucket", action="store_true",
                    help="one grid point more than the standard workload (577): one past a bucket edge")
    ap.add_argument("--out-dir", default=_common.RESULTS_DIR)
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.smoke else 5)
    repeats = args.repeats or (2 if args.smoke else 4)
    cfg = {"spec": _spec(args.smoke, args.past_bucket), "repeats": repeats,
           "cpu_devices": args.cpu_devices or int(os.environ.get("BEC_JAX_CPU_DEVICES") or os.cpu_count() or 1)}
    trees = {"work": REPO_ROOT}
    with tempfile.TemporaryDirectory(prefix="bec-jax-ref-") as tmp:
        full = export_ref(args.ref, tmp)
        trees["ref"] = tmp
        runs = {"work": [], "ref": []}
        for i in range(rounds):
            order = ("ref", "work") if i % 2 == 0 else ("work", "ref")
            for name in order:
                save = os.path.join(tmp, f"arrays_{name}.npz") if i == 0 else None
                runs[name].append(run_tree(trees[name], dict(cfg, save=save)))
                r = runs[name][-1]
                print(f"round {i + 1}/{rounds} {name:4s}: first sweep.run {r['wall_s'][0]:.2f} s "
                      f"(compile {r['compile_time_s'][0]:.2f} s), "
                      f"steady {_common.fmt_rate(statistics.median(r['updates_per_s'][1:] or r['updates_per_s']))}"
                      "updates/s", flush=True)
        differences = _differences(os.path.join(tmp, "arrays_ref.npz"), os.path.join(tmp, "arrays_work.npz"))

    def summarise(rs):
        steady = [statistics.median(r["updates_per_s"][1:] or r["updates_per_s"]) for r in rs]
        return {"updates_per_s_median": statistics.median(steady), "updates_per_s_rounds": steady,
                "first_run_wall_s_median": statistics.median(r["wall_s"][0] for r in rs),
                "first_run_wall_s_rounds": [r["wall_s"][0] for r in rs],
                "first_compile_s_median": statistics.median(r["compile_time_s"][0] for r in rs),
                "first_compile_s_rounds": [r["compile_time_s"][0] for r in rs], "digest": rs[0]["digest"]}

    work, ref = summarise(runs["work"]), summarise(runs["ref"])
    ratio = work["updates_per_s_median"] / ref["updates_per_s_median"]
    identical = work["digest"] == ref["digest"]
    info = {**provenance.software(), **provenance.machine()}
    flags = ", ".join(f for f in info["cpu_flags"] if f in ("avx2", "avx512f")) or "no AVX2"
    print(f"\n{info['cpu']} ({info['cpu_count']} cores, {flags}); JAX {info['jax_version']}, "
          f"{cfg['cpu_devices']} CPU devices")
    _common.print_table(
        ["tree", "steady updates/s (median)", "first sweep.run, wall (median)", "its compile_time_s",
         "result digest"],
        [[f"ref {full[:10]}", _common.fmt_rate(ref["updates_per_s_median"]), f"{ref['first_run_wall_s_median']:.2f} s",
          f"{ref['first_compile_s_median']:.2f} s", ref["digest"]],
         ["working tree", _common.fmt_rate(work["updates_per_s_median"]), f"{work['first_run_wall_s_median']:.2f} s",
          f"{work['first_compile_s_median']:.2f} s", work["digest"]]])
    print(f"throughput ratio work/ref: {ratio:.3f}; results bit-identical: {identical}")
    for name, d in differences.items():
        print(f"  {name}: {d['count']} entries differ" + (f", at log steps {d['log_steps']}" if d["log_steps"] else "")
              + f", largest relative difference {d['max_rel']:.3g}")
    out = {"command": "python -m benchmarks.compare_ref " + " ".join(argv if argv is not None else sys.argv[1:]),
           "ref": full, "smoke": args.smoke, "rounds": rounds, "repeats": repeats, "config": cfg,
           "machine": info, "ref_result": ref, "work_result": work, "throughput_ratio": ratio,
           "bit_identical": identical, "differences": differences, "timestamp": _common.timestamp()}
    name = "compare_ref_past_bucket" if args.past_bucket else "compare_ref"
    path = _common.write_json(_common.result_path(args.out_dir, name, args.smoke), out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
