"""The status-quo baseline: CTDC on the Boyan chain, one grid point and one seed at
a time, in a Python loop with NumPy, the way the public reference code of the
gradient-TD literature runs its sweeps (sample a transition, update, repeat).

It is written to be fast, not to be a strawman:
  * sampling by inverse CDF on precomputed per-state tables with one uniform per
    draw (`bisect.bisect_right` on the row's cumulative probabilities, which is
    `np.searchsorted(..., side="right")` without the array-call overhead; the same
    tables and rule as `bec_jax.prediction.sampling`);
  * all uniforms of a run drawn in bulk up front (`rng.random(steps + 1)`);
  * feature vectors precomputed per state, parameter vectors and temporaries
    preallocated and updated in place, scalars kept as Python floats;
  * float64 NumPy (NumPy's default, what reference code uses; float32 is no faster
    for 4-vectors, the cost is per call, not per element);
  * RMSCBE every `log_every` steps from the same closed form as bec_jax,
    ||R theta + h|| with (R, h) = `bec_jax.theory.metrics.metric(env, "rmscbe")`.
Of the NumPy variants tried (expressions with temporaries; in-place ufuncs with
preallocated outputs; NumPy scalars vs Python floats) this is the fastest, by
about 15% over the plain-expression version.

`check_against_bec_jax()` runs the loop and `bec_jax.algorithms.ctdc.update` (with
`bec_jax.prediction.sampling`) on the same uniforms and asserts the same trajectory.

    python -m benchmarks.baseline_numpy [--smoke]     # updates/s of the loop alone
"""
from __future__ import annotations

import argparse
import bisect
import os
import sys
import time

if __package__ in (None, ""):  # run as a file: python benchmarks/baseline_numpy.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from benchmarks import _common

NEVER = 2.0  # above any uniform in [0, 1): the last outcome of a row (as bec_jax.prediction.sampling)


class Tables:
    """Per-state inverse-CDF tables of a finite MDP, as Python lists (fast to index
    from a Python loop) and per-state feature vectors as NumPy arrays."""

    def __init__(self, env, dtype=np.float64):
        from bec_jax import mdp as mdp_lib

        S = env.num_states
        joint = env.mu[:, :, None] * env.P  # mu(a|s) P(s'|s,a)
        rho = mdp_lib.rho(env)
        self.cdf, self.next_state, self.reward, self.rho = [], [], [], []
        for s in range(S):
            flat = joint[s].reshape(-1)
            idx = np.flatnonzero(flat > 0)
            a, s2 = np.divmod(idx, S)
            self.cdf.append(_cdf(flat[idx]).tolist())
            self.next_state.append(s2.tolist())
            self.reward.append(env.R[s, a, s2].astype(float).tolist())
            self.rho.append(rho[s, a].astype(float).tolist())
        self.start_cdf = _cdf(np.asarray(env.start, float)).tolist()
        self.phi = [np.array(env.phi[s], dtype=dtype) for s in range(S)]
        self.gamma = float(env.gamma)
        self.theta0 = np.asarray(env.theta0, dtype)
        self.dtype = dtype


def _cdf(p: np.ndarray) -> np.ndarray:
    """Cumulative probabilities, with the last positive entry and after set to NEVER
    (so float rounding can never select a zero-probability outcome)."""
    c = np.cumsum(p) / p.sum()
    last = int(np.flatnonzero(p > 0)[-1])
    c[last:] = NEVER
    return c


def make_problem(env_name: str = "boyan_chain", dtype=np.float64):
    """(tables, R, h) for an environment: sampler tables and the RMSCBE metric."""
    from bec_jax import envs
    from bec_jax.theory import metrics

    env = envs.make(env_name)
    met = metrics.metric(env, "rmscbe")
    return Tables(env, dtype), np.asarray(met.R, dtype), np.asarray(met.h, dtype)


def run_ctdc(tables: Tables, R: np.ndarray, h: np.ndarray, alpha: float, beta: float, zeta: float,
             steps: int, log_every: int, seed: int = 0, uniforms=None, divergence_bound: float = 1e6):
    """One CTDC run (one grid point, one seed): `steps` updates on one Markov
    trajectory, RMSCBE logged at step 0 and every `log_every` steps.

    The update (bec_jax.algorithms.ctdc, rho on all three updates):
        err   = r + gamma theta.phi' - theta.phi - omega
        theta += alpha rho (err phi - gamma (phi.u) phi')
        u     += zeta rho (err - phi.u) phi
        omega += beta rho err
    `uniforms` (steps + 1 numbers in [0, 1)) replaces the run's random draws (the
    first picks the start state). A run whose theta leaves `divergence_bound` (or
    stops being finite) at a log point stops there, like the engine's freeze.

    Returns (log of RMSCBE values (steps // log_every + 1,), theta, u, omega,
    updates done).
    """
    if uniforms is None:
        uniforms = np.random.default_rng(seed).random(steps + 1)
    u_list = np.asarray(uniforms, np.float64).tolist()
    cdf, nxt, rew, rho_t, phis = tables.cdf, tables.next_state, tables.reward, tables.rho, tables.phi
    gamma = tables.gamma
    dot, mul, br = np.dot, np.multiply, bisect.bisect_right
    k = len(tables.theta0)
    theta = tables.theta0.copy()
    w = np.zeros(k, tables.dtype)
    omega = 0.0
    tmp = np.empty(k, tables.dtype)
    tmp2 = np.empty(k, tables.dtype)
    e = np.empty(R.shape[0], tables.dtype)
    log = np.full(steps // log_every + 1, np.nan)
    dot(R, theta, out=e)
    e += h
    log[0] = np.sqrt(dot(e, e))
    li = 1
    s = br(tables.start_cdf, u_list[0])
    done = steps
    for t in range(1, steps + 1):
        row = s
        j = br(cdf[row], u_list[t])
        s = nxt[row][j]
        phi = phis[row]
        phi2 = phis[s]
        p = rho_t[row][j]
        err = rew[row][j] + gamma * float(dot(phi2, theta)) - float(dot(phi, theta)) - omega
        pu = float(dot(phi, w))
        mul(phi, err, out=tmp)
        mul(phi2, gamma * pu, out=tmp2)
        tmp -= tmp2
        tmp *= alpha * p
        theta += tmp
        mul(phi, zeta * p * (err - pu), out=tmp)
        w += tmp
        omega += beta * p * err
        if t % log_every == 0:
            dot(R, theta, out=e)
            e += h
            log[li] = np.sqrt(dot(e, e))
            li += 1
            if not (np.abs(theta).max() <= divergence_bound):  # NaN fails too
                done = t
                log[li:] = log[li - 1]
                break
    return log, theta, w, omega, done


def run_grid(points, seeds, steps: int, log_every: int, env_name: str = "boyan_chain",
             dtype=np.float64, problem=None) -> dict:
    """Runs every (grid point, seed) pair one after the other, as a researcher's
    sweep does. `points` are (alpha, beta, zeta) triples. Times the loop only (the
    tables are built before the clock starts, as the engine's are).

    Returns updates, seconds, updates_per_s and final[point][seed] RMSCBE.
    """
    tables, R, h = problem or make_problem(env_name, dtype)
    final = np.full((len(points), len(seeds)), np.nan)
    updates = 0
    t0 = time.perf_counter()
    for i, (a, b, z) in enumerate(points):
        for j, seed in enumerate(seeds):
            log, *_, done = run_ctdc(tables, R, h, a, b, z, steps, log_every, seed=seed)
            final[i, j] = log[-1]
            updates += done
    dt = time.perf_counter() - t0
    return {"updates": updates, "seconds": dt, "updates_per_s": updates / dt, "final": final}


def subset_points(spec, n_points: int) -> tuple[list, list]:
    """`n_points` grid points of `spec` spread evenly over its grid order."""
    pts = [(p["alpha"], p["beta"], p["zeta"]) for p in spec.grid_points()]
    idx = np.unique(np.linspace(0, len(pts) - 1, n_points).round().astype(int))
    return [pts[i] for i in idx], idx.tolist()


def check_against_bec_jax(steps: int = 200, log_every: int = 10, points=((0.3, 0.5, 1e-3), (0.05, 0.1, 0.5)),
                          seed: int = 123, rtol: float = 2e-4, atol: float = 2e-5) -> dict:
    """Asserts that the loop implements bec_jax's CTDC: on the same uniforms, it
    visits the same states and reaches the same theta, u, omega and RMSCBE log as
    `bec_jax.prediction.sampling` + `bec_jax.algorithms.ctdc.update` (float32 in JAX, float64
    here, hence the tolerances). Returns the largest differences seen."""
    import jax
    import jax.numpy as jnp

    from bec_jax import envs
    from bec_jax.algorithms import ctdc
    from bec_jax.prediction import sampling
    from bec_jax.theory import metrics

    env = envs.make("boyan_chain")
    tables, R, h = make_problem("boyan_chain")
    jtab = sampling.build_tables(env, jnp.float32)
    # float32-representable uniforms, so both sides see exactly the same numbers.
    u = np.random.default_rng(seed).random(steps + 1).astype(np.float32).astype(np.float64)
    met = metrics.metric(env, "rmscbe").astype(jnp.float32)

    @jax.jit
    def jax_run(u, a, b, z):
        s0 = sampling.init_state_from_uniform(jtab, u[0])

        def step(carry, ut):
            state, s = carry
            tr, s = sampling.markov_step_from_uniforms(jtab, ut[None], s)
            state = ctdc.update(state, tr, a, b, z)
            return (state, s), (metrics.evaluate(met, state.theta), s)

        state0 = ctdc.init(jnp.asarray(env.theta0, jnp.float32))
        (state, _), (vals, visited) = jax.lax.scan(step, (state0, s0), u[1:])
        return state, jnp.concatenate([metrics.evaluate(met, state0.theta)[None], vals]), visited

    worst = {"theta": 0.0, "u": 0.0, "omega": 0.0, "rmscbe": 0.0}
    for a, b, z in points:
        log, theta, w, omega, done = run_ctdc(tables, R, h, a, b, z, steps, log_every, uniforms=u)
        assert done == steps, "the check's step sizes must not diverge"
        state, vals, _ = jax_run(jnp.asarray(u, jnp.float32), a, b, z)
        ref_log = np.asarray(vals)[::log_every]
        for name, mine, ref in (("theta", theta, state.theta), ("u", w, state.u),
                                ("omega", omega, state.omega), ("rmscbe", log, ref_log)):
            ref = np.asarray(ref, np.float64)
            np.testing.assert_allclose(mine, ref, rtol=rtol, atol=atol,
                                       err_msg=f"baseline CTDC differs from bec_jax in {name} at {(a, b, z)}")
            worst[name] = max(worst[name], float(np.max(np.abs(np.asarray(mine) - ref))))
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes; checks the script works")
    ap.add_argument("--points", type=int, default=6, help="grid points of the standard grid (default 6)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per point (default 5)")
    ap.add_argument("--out-dir", default=_common.RESULTS_DIR, help="where the JSON goes")
    args = ap.parse_args(argv)

    _common.use_all_cpu_cores()  # only for the bec_jax check below; the loop is NumPy
    spec = _common.standard_spec(smoke=args.smoke)
    n_points, n_seeds = (2, 2) if args.smoke else (args.points, args.seeds)
    check = check_against_bec_jax(steps=50 if args.smoke else 200)
    print("baseline CTDC matches bec_jax on the same transitions (max |diff|: "
          + ", ".join(f"{k} {v:.1e}" for k, v in check.items()) + ")")
    pts, idx = subset_points(spec, n_points)
    r = run_grid(pts, range(n_seeds), spec.steps, spec.log_every)
    print(f"NumPy loop (float64): {len(pts)} points x {n_seeds} seeds x {spec.steps} steps = "
          f"{r['updates']} updates in {r['seconds']:.2f} s: {_common.fmt_rate(r['updates_per_s'])} updates/s")
    out = {
        "benchmark": "baseline_numpy", "smoke": args.smoke, "timestamp": _common.timestamp(),
        "machine": _common.machine_info(), "dtype": "float64",
        "workload": {"points": pts, "grid_indices": idx, "seeds": n_seeds, "steps": spec.steps,
                     "log_every": spec.log_every},
        "updates": r["updates"], "seconds": r["seconds"], "updates_per_s": r["updates_per_s"],
        "final_rmscbe_mean": _common.finite_mean(r["final"], axis=1), "check_max_abs_diff": check,
    }
    path = _common.write_json(_common.result_path(args.out_dir, "baseline_numpy", args.smoke), out)
    print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
