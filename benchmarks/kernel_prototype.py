"""A hand-written C loop of the standard workload, against the engine (issue 15's prototype).

    python -m benchmarks.kernel_prototype [--smoke] [--repeats 7]

Issue 15 asks what would reach the full program at 90% of its bare loop and 3000x
the NumPy loop where XLA:CPU does not, and to measure any prototype. This is one:
`kernel_prototype.c`, compiled here with the system's C compiler (`cc`, or `$CC`;
`-O3 -march=native`), run through ctypes. It does the whole standard workload
(Boyan chain CTDC, 576 points x 50 seeds x 1000 steps, float32): sampling the
Markov chain, the update (`bec_jax.algorithms.ctdc`, eqs. (32)-(34)), the
divergence check with the engine's revert-and-freeze, RMSCBE every 10 steps, and
the statistics over seeds. Its bare loop is the same program without the check,
the metric and the statistics. Seeds are split over threads (ctypes releases the
GIL), one per core.

Printed and written to benchmarks/results/kernel_prototype.json, all in one run:
  * the check: on the same uniforms, the C loop follows the NumPy loop
    (`baseline_numpy.run_ctdc`, float64) to float32 rounding;
  * the prototype's bare loop and full program on one thread and on every core
    (medians of alternating rounds), the full program's share of its bare loop;
  * the engine's rate on the same workload (`sweep.run`, the run-fast form, every
    core as devices) and the NumPy loop's, so the ratios compare like with like.

Not part of bec_jax: a kernel like this is a second implementation of every
algorithm and sampler, checked against the first only by tests like the one here,
not bit-identical to it (the compiler contracts into fused multiply-adds and
sums in its own order), and CPU-only.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_prototype.c")
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp-simd", "-shared", "-fPIC")
INNER = 8  # sweeps per timed round
_f32p = ctypes.POINTER(ctypes.c_float)
_i32p = ctypes.POINTER(ctypes.c_int32)


class _Model(ctypes.Structure):
    _fields_ = [("S", ctypes.c_int), ("M", ctypes.c_int), ("cdf", _f32p), ("next", _i32p), ("reward", _f32p),
                ("rho", _f32p), ("discount", _f32p), ("start_cdf", _f32p), ("phi", _f32p),
                ("R", _f32p), ("h", _f32p)]


def compiler() -> str | None:
    """The C compiler to use ($CC, else `cc`), or None when there is none."""
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc)


def can_build() -> bool:
    """Whether this machine's C compiler takes the prototype's flags (a trivial
    file compiled with them), so that a failure to build the prototype itself
    is the prototype's fault."""
    cc = compiler()
    if cc is None:
        return False
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "t.c")
        with open(src, "w") as f:
            f.write("int f(int x) { return x + 1; }\n")
        return subprocess.run([cc, *FLAGS, src, "-o", os.path.join(d, "t.so")], capture_output=True).returncode == 0


_LIBS: dict = {}


def build(k: int, rows: int) -> ctypes.CDLL:
    """The prototype compiled for k features and a metric factor of `rows` rows
    (cached by source, compiler, flags and sizes)."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("CC: no C compiler found (set CC or install cc); the prototype needs one")
    src = open(SOURCE, "rb").read()
    tag = hashlib.sha256(src + repr((cc, FLAGS, k, rows)).encode()).hexdigest()[:16]
    if tag in _LIBS:
        return _LIBS[tag]
    path = os.path.join(tempfile.gettempdir(), f"bec_jax_kernel_prototype_{tag}.so")
    if not os.path.exists(path):
        tmp = path + f".{os.getpid()}"
        subprocess.run([cc, *FLAGS, f"-DK={k}", f"-DROWS={rows}", SOURCE, "-o", tmp, "-lm"], check=True)
        os.replace(tmp, path)
    lib = ctypes.CDLL(path)
    lib.ctdc_sweep.restype = None
    lib.ctdc_sweep.argtypes = [ctypes.POINTER(_Model), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.c_int, _f32p, _f32p, _f32p, _f32p, ctypes.c_float, _f32p,
                               ctypes.c_uint64, ctypes.c_int, _f32p, _i32p, _f32p, _f32p, _f32p, _f32p]
    lib.seed_stats.restype = None
    lib.seed_stats.argtypes = [_f32p, _i32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               _f32p, _f32p, _f32p, _i32p, ctypes.POINTER(ctypes.c_double)]
    _LIBS[tag] = lib
    return lib


def _p(a: np.ndarray, kind=_f32p):
    return a.ctypes.data_as(kind)


class Problem:
    """A model's sampler tables and RMSCBE factor as the C loop reads them (the
    engine's own: `bec_jax.prediction.sampling.build_tables`, `bec_jax.theory.metrics.metric`)."""

    def __init__(self, env_name: str = "boyan_chain"):
        from bec_jax import envs
        from bec_jax.prediction import sampling
        from bec_jax.theory import metrics

        env = envs.make(env_name)
        t = sampling.build_tables(env, np.float32, as_numpy=True)
        met = metrics.metric(env, "rmscbe")
        f32 = lambda x: np.ascontiguousarray(x, np.float32)  # noqa: E731
        self.arrays = dict(cdf=f32(t.cdf), next=np.ascontiguousarray(t.next_state, np.int32),
                           reward=f32(t.reward), rho=f32(t.rho), discount=f32(t.discount),
                           start_cdf=f32(t.start_cdf[0]), phi=f32(t.phi), R=f32(met.R), h=f32(met.h))
        self.k, self.rows = self.arrays["phi"].shape[1], self.arrays["R"].shape[0]
        self.theta0 = f32(env.theta0)
        a = self.arrays
        self.model = _Model(a["cdf"].shape[0], a["cdf"].shape[1], _p(a["cdf"]), _p(a["next"], _i32p),
                            _p(a["reward"]), _p(a["rho"]), _p(a["discount"]), _p(a["start_cdf"]), _p(a["phi"]),
                            _p(a["R"]), _p(a["h"]))


def run(problem: Problem, alpha, beta, zeta, seeds: int, steps: int, log_every: int = 10,
        bound: float = 1e6, uniforms=None, threads: int = 1, frame: bool = True, seed0: int = 0) -> dict:
    """One sweep of the C loop over grid points (alpha[g], beta[g], zeta[g]) and
    `seeds` seeds; the seeds split over `threads` threads. `uniforms` (seeds,
    steps + 1), else the loop's own counter stream. Returns the per-run log
    `vals` (L + 1, seeds, G), `dstep` (seeds, G), the final `theta`, `u` (seeds,
    k, G) and `omega` (seeds, G), the statistics over seeds (`mean`, `std`,
    `sem`, `count`, each (L + 1, G); with `frame`) and `seconds` (the sweep,
    statistics included)."""
    lib = build(problem.k, problem.rows)
    alpha, beta, zeta = (np.ascontiguousarray(np.broadcast_to(x, np.shape(alpha)), np.float32)
                         for x in (alpha, beta, zeta))
    G, N, L, k = alpha.shape[0], seeds, steps // log_every, problem.k
    if steps % log_every:
        raise ValueError(f"steps: {steps} is not a multiple of log_every ({log_every})")
    if uniforms is not None:
        uniforms = np.ascontiguousarray(uniforms, np.float32)
        if uniforms.shape != (N, steps + 1):
            raise ValueError(f"uniforms: expected shape {(N, steps + 1)}, got {uniforms.shape}")
    vals = np.zeros((L + 1, N, G), np.float32)
    dstep = np.zeros((N, G), np.int32)
    theta, u = np.zeros((N, k, G), np.float32), np.zeros((N, k, G), np.float32)
    omega = np.zeros((N, G), np.float32)
    works = [np.zeros((4 * k + 3) * G, np.float32) for _ in range(threads)]
    bounds = np.linspace(0, N, threads + 1).round().astype(int)
    up = _p(uniforms) if uniforms is not None else None

    stats = {name: np.zeros((L + 1, G), np.float32) for name in ("mean", "std", "sem")}
    count = np.zeros((L + 1, G), np.int32)
    lbounds = np.linspace(0, L + 1, threads + 1).round().astype(int)

    def part(i):
        lib.ctdc_sweep(ctypes.byref(problem.model), G, N, int(bounds[i]), int(bounds[i + 1]), steps, log_every,
                       _p(alpha), _p(beta), _p(zeta), _p(problem.theta0), bound, up, seed0, int(frame),
                       _p(vals), _p(dstep, _i32p), _p(theta), _p(u), _p(omega), _p(works[i]))

    def stats_part(i):  # every seed's log is in: each thread takes a share of the log points
        lib.seed_stats(_p(vals), _p(dstep, _i32p), int(lbounds[i]), int(lbounds[i + 1]), N, G, log_every,
                       _p(stats["mean"]), _p(stats["std"]), _p(stats["sem"]), _p(count, _i32p),
                       _p(np.zeros(3 * G), ctypes.POINTER(ctypes.c_double)))

    def on_threads(fn):
        if threads == 1:
            return fn(0)
        ts = [threading.Thread(target=fn, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    t0 = time.perf_counter()
    on_threads(part)
    if frame:
        on_threads(stats_part)
    out = dict(vals=vals, dstep=dstep, theta=theta, u=u, omega=omega)
    if frame:
        out.update(stats, count=count)
    out["seconds"] = time.perf_counter() - t0
    return out


def check_against_numpy(steps: int = 200, log_every: int = 10, seed: int = 7,
                        points=((0.3, 0.5, 1e-3), (0.05, 0.1, 0.5), (0.01, 0.005, 0.1))) -> dict:
    """Asserts that the C loop follows `baseline_numpy.run_ctdc` (which is checked
    against bec_jax's CTDC) on the same float32 uniforms: the same states, so
    theta, u, omega and the RMSCBE log agree to float32 rounding. Two seeds, the
    points as a grid of len(points). Returns the largest differences."""
    from benchmarks import baseline_numpy

    problem = Problem()
    tables, R, h = baseline_numpy.make_problem("boyan_chain")
    u = np.random.default_rng(seed).random((2, steps + 1)).astype(np.float32)
    a, b, z = (np.array(x) for x in zip(*points))
    got = run(problem, a, b, z, 2, steps, log_every, uniforms=u)
    worst = {"theta": 0.0, "u": 0.0, "omega": 0.0, "rmscbe": 0.0}
    for n in range(2):
        for g, (ag, bg, zg) in enumerate(points):
            log, theta, w, omega, done = baseline_numpy.run_ctdc(tables, R, h, ag, bg, zg, steps, log_every,
                                                                 uniforms=u[n].astype(np.float64))
            assert done == steps and got["dstep"][n, g] == -1, "the check's step sizes must not diverge"
            for name, mine, ref in (("theta", got["theta"][n, :, g], theta), ("u", got["u"][n, :, g], w),
                                    ("omega", got["omega"][n, g], omega), ("rmscbe", got["vals"][:, n, g], log)):
                np.testing.assert_allclose(mine, ref, rtol=2e-4, atol=2e-5,
                                           err_msg=f"C loop differs from the NumPy loop in {name} at {points[g]}")
                worst[name] = max(worst[name], float(np.max(np.abs(np.asarray(mine, np.float64) - ref))))
    return worst


def _engine(spec, repeats: int):
    """The engine on `spec` (run-fast form, every core as a device): its updates/s
    (median of `repeats` runs after one warm-up), its device line, its last
    result, and a result of the same sweep on fresh seeds (the next `seeds`
    streams: the yardstick of `agreement`)."""
    import jax

    from bec_jax.engine import tuning
    from bec_jax.prediction import sweep

    opts = tuning.CPU_COMPILER_OPTIONS if jax.devices()[0].platform == "cpu" else {}
    fresh = sweep.run(spec.replace(seed_offset=spec.seeds), progress=False, compiler_options=opts)
    runs = [sweep.run(spec, progress=False, compiler_options=opts) for _ in range(repeats)]
    d = jax.devices()
    return statistics.median(r.meta["updates_per_s"] for r in runs), f"{d[0].platform} x{len(d)}", runs[-1], fresh


def _z(mean_a, sem_a, mean_b, sem_b) -> np.ndarray:
    return (mean_a - mean_b) / np.sqrt(sem_a ** 2 + sem_b ** 2)


def agreement(c: dict, r, r2) -> dict:
    """How the C loop's statistics (its own random numbers) agree with the
    engine's (`r`, a SweepResult of the same workload), against how the engine
    agrees with itself on fresh seeds (`r2`, the same spec with another
    `seed_offset`): at the last log point, each grid point's difference of means
    in units of the two sems combined. The grid points of a seed share its
    trajectory, so their differences move together: the engine-engine figures
    are the yardstick, not a normal table."""
    zc = _z(c["mean"][-1], c["sem"][-1], r.mean[0, :, -1], r.sem[0, :, -1])
    ze = _z(r2.mean[0, :, -1], r2.sem[0, :, -1], r.mean[0, :, -1], r.sem[0, :, -1])
    return {"c_vs_engine_within_3": float(np.mean(np.abs(zc) < 3)), "c_vs_engine_max_abs_z": float(np.max(np.abs(zc))),
            "engine_vs_engine_within_3": float(np.mean(np.abs(ze) < 3)),
            "engine_vs_engine_max_abs_z": float(np.max(np.abs(ze))),
            "diverged_c": float(np.mean(c["dstep"] >= 0)), "diverged_engine": float(np.mean(r.diverged_step >= 0))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes; checks the script works")
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds of each case (medians)")
    ap.add_argument("--out-dir", default=_common.RESULTS_DIR)
    args = ap.parse_args(argv)
    if not can_build():
        print(f"no C compiler (cc or $CC) that takes {' '.join(FLAGS)}: the prototype cannot be built here")
        return 1
    cores = _common.use_all_cpu_cores()  # before JAX starts: the engine's devices
    spec = _common.standard_spec(smoke=args.smoke)
    repeats = 1 if args.smoke else args.repeats
    check = check_against_numpy(steps=50 if args.smoke else 200)
    print("the C loop follows the NumPy loop on the same uniforms (max |diff|: "
          + ", ".join(f"{k} {v:.1e}" for k, v in check.items()) + ")")

    pts = spec.grid_points()
    a, b, z = (np.array([p[n] for p in pts]) for n in ("alpha", "beta", "zeta"))
    problem = Problem()
    updates = len(pts) * spec.seeds * spec.steps
    cases = [(threads, frame) for threads in sorted({1, cores}) for frame in (False, True)]
    times: dict = {c: [] for c in cases}
    for c in cases:  # warm-up (page faults, the library's load)
        run(problem, a, b, z, spec.seeds, spec.steps, spec.log_every, threads=c[0], frame=c[1])
    # Rounds alternate, so every case sees the same machine; each round times
    # `INNER` sweeps back to back (one takes 10-40 ms: a single one on two threads
    # varied by 1.5x with the second core's wake-up).
    for _ in range(repeats):
        for c in cases:
            times[c].append(sum(run(problem, a, b, z, spec.seeds, spec.steps, spec.log_every,
                                    threads=c[0], frame=c[1])["seconds"] for _ in range(INNER)))
    rate = {c: INNER * updates / statistics.median(t) for c, t in times.items()}
    full = run(problem, a, b, z, spec.seeds, spec.steps, spec.log_every, threads=cores)
    diverged = float(np.mean(full["dstep"] >= 0))

    from benchmarks import baseline_numpy

    np_pts, _ = baseline_numpy.subset_points(spec, 2 if args.smoke else 6)
    base = baseline_numpy.run_grid(np_pts, range(2 if args.smoke else 5), spec.steps, spec.log_every)
    engine, device, result, fresh = _engine(spec, repeats)
    agree = agreement(full, result, fresh)

    m = _common.machine_info()
    print(f"machine: {m['cpu_model']}, {cores} cores; C compiler {compiler()} {' '.join(FLAGS)}")
    print(f"workload: {len(pts)} points x {spec.seeds} seeds x {spec.steps} steps, RMSCBE every "
          f"{spec.log_every} (diverged runs: {diverged:.1%})")
    print(f"final RMSCBE means, differences in sems: the C loop against the engine "
          f"{agree['c_vs_engine_within_3']:.1%} of the points within 3 (largest {agree['c_vs_engine_max_abs_z']:.1f}); "
          f"the engine against itself on fresh seeds {agree['engine_vs_engine_within_3']:.1%} "
          f"(largest {agree['engine_vs_engine_max_abs_z']:.1f}); diverged runs {agree['diverged_c']:.1%} "
          f"against {agree['diverged_engine']:.1%}")
    rows = []
    for threads in sorted({1, cores}):
        bare, whole = rate[(threads, False)], rate[(threads, True)]
        rows.append([f"C loop, {threads} thread{'s' if threads > 1 else ''}", _common.fmt_rate(bare),
                     _common.fmt_rate(whole), f"{whole / bare:.0%}", f"{whole / base['updates_per_s']:,.0f}x"])
    rows.append([f"bec_jax engine (run-fast form, {device})", "", _common.fmt_rate(engine), "",
                 f"{engine / base['updates_per_s']:,.0f}x"])
    rows.append(["NumPy loop (float64, one core)", "", _common.fmt_rate(base["updates_per_s"]), "", "1x"])
    _common.print_table(["", "bare loop", "full program", "full / bare", "vs NumPy"], rows)
    out = {
        "benchmark": "kernel_prototype", "smoke": args.smoke, "timestamp": _common.timestamp(),
        "machine": m, "jax": _common.jax_info(), "compiler": [compiler(), *FLAGS],
        "workload": {"points": len(pts), "seeds": spec.seeds, "steps": spec.steps, "log_every": spec.log_every},
        "check_max_abs_diff": check, "diverged_fraction": diverged, "agreement_with_engine": agree, "repeats": repeats,
        "c_loop": {f"{t}_threads": {"bare_updates_per_s": rate[(t, False)], "full_updates_per_s": rate[(t, True)],
                                    "full_over_bare": rate[(t, True)] / rate[(t, False)]}
                   for t in sorted({1, cores})},
        "engine_updates_per_s": engine, "engine_device": device,
        "numpy_updates_per_s": base["updates_per_s"],
        "ratio_c_full_vs_numpy": rate[(cores, True)] / base["updates_per_s"],
        "ratio_engine_vs_numpy": engine / base["updates_per_s"],
    }
    path = _common.write_json(_common.result_path(args.out_dir, "kernel_prototype", args.smoke), out)
    print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
