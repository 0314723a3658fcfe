"""Small end-to-end runs: Markov-sampled trajectories under jitted lax.scan, checked
against the closed-form metrics and fixpoints of `bec_jax.theory.expected_updates`.

One compiled program per (algorithm, environment): step sizes and keys are traced
arguments, so tests that share them share the compile.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax import algorithms, envs
from bec_jax.prediction import sampling
from bec_jax.theory import expected_updates as analysis
from bec_jax.theory import fixpoints, metrics

NUM_BLOCKS, BLOCK = 20, 2000  # 40k steps, theta logged every 2000
SEEDS = 3


@functools.lru_cache(maxsize=None)
def _compiled(alg_name):
    alg = algorithms.get(alg_name)

    def run(tables, theta0, h, keys):
        def one_seed(key):
            k0, k1 = jax.random.split(key)
            u = jax.random.uniform(k1, (NUM_BLOCKS, BLOCK, 1), dtype=tables.cdf.dtype)

            def step(carry, u_t):
                st, s = carry
                tr, s = sampling.markov_step_from_uniforms(tables, u_t, s)
                return (alg.apply(st, tr, h), s), None

            def block(carry, u_block):
                carry, _ = jax.lax.scan(step, carry, u_block)
                return carry, carry[0].theta

            init = (alg.init(theta0), sampling.init_state(tables, k0))
            return jax.lax.scan(block, init, u)[1]

        # lax.map (a loop over seeds) compiles faster here than vmap.
        return jax.lax.map(one_seed, keys)

    return jax.jit(run)


@pytest.fixture(scope="module")
def run():
    """run(env, alg, (alpha, beta, zeta)) -> theta logged every BLOCK steps, (SEEDS, NUM_BLOCKS, k)."""
    tables_cache = {}

    def go(env_name, alg_name, h, seed=0):
        if env_name not in tables_cache:
            env = envs.make(env_name)
            tables_cache[env_name] = (env, sampling.build_tables(env))
        env, tables = tables_cache[env_name]
        h = {n: jnp.float32(v) for n, v in zip(("alpha", "beta", "zeta"), h)}
        keys = jax.random.split(jax.random.key(seed), SEEDS)
        out = _compiled(alg_name)(tables, jnp.asarray(env.theta0, jnp.float32), h, keys)
        return np.asarray(out, np.float64)

    return go


def metric_values(env_name, name, thetas):
    env = envs.make(env_name)
    M = metrics.metric(env, name)
    return np.linalg.norm(thetas @ M.R.T + M.h, axis=-1)


def test_ctd_on_boyan_reaches_the_centered_td_fixpoint(run):
    env = envs.make("boyan_chain")
    assert metrics.rmspcbe(env, env.theta0) == pytest.approx(0.848, abs=1e-3)  # initial value
    th = run("boyan_chain", "ctd", (0.01, 0.05, 0.0))
    vals = metric_values("boyan_chain", "rmspcbe", th)
    avg = th[:, NUM_BLOCKS // 2:].mean(1)  # average of the logged iterates, second half
    avg_vals = metric_values("boyan_chain", "rmspcbe", avg)
    assert np.all(avg_vals < 0.02), avg_vals          # observed ~0.004
    assert np.all(vals[:, -1] < 0.05), vals[:, -1]     # last iterate, observed ~0.005-0.01
    # It lands on the fixpoint line: theta - its projection on the line is small.
    fs = fixpoints.centered_td_fixpoint_set(env)
    n = fs.null_space[:, 0]
    off_line = (avg - fs.theta) - np.outer((avg - fs.theta) @ n, n)
    assert np.abs(off_line).max() < 0.1
    # ... but not the TD fixpoint: centering leaves the constant offset (~ -26) unlearned.
    assert np.linalg.norm(avg - fixpoints.td_fixpoint(env), axis=1).min() > 10


def test_td_on_boyan_approaches_the_td_fixpoint(run):
    env = envs.make("boyan_chain")
    fp = fixpoints.td_fixpoint(env)  # about (-27.5, -26.7, -25.6, -24.4)
    assert np.linalg.norm(env.theta0 - fp) > 50
    th = run("boyan_chain", "td", (0.01, 0.0, 0.0))
    avg = th[:, NUM_BLOCKS // 2:].mean(1)
    assert np.abs(avg - fp).max() < 0.3, avg - fp      # observed ~0.05
    assert np.all(metric_values("boyan_chain", "rmspbe", avg) < 0.02)
    # The distance to the fixpoint shrinks along the run.
    dist = np.linalg.norm(th - fp, axis=-1)
    assert np.all(dist[:, 0] > 5 * dist[:, -1])


def test_tdc_on_baird_converges(run):
    env = envs.make("baird")
    init = metrics.rmspbe(env, env.theta0)
    assert init == pytest.approx(8.22, abs=0.01)
    th = run("baird", "tdc", (0.005, 0.0, 0.05))
    pbe = metric_values("baird", "rmspbe", th)
    assert np.all(pbe[:, -1] < 0.05), pbe[:, -1]       # observed ~0.0074
    assert np.all(pbe[:, 0] > pbe[:, -1])
    assert np.all(np.abs(th) < 20)
    # TDC's last mode is very slow on Baird (slow-ODE eigenvalue -2e-5): the values
    # settle near a common offset (~1.9) instead of 0 within this horizon.
    pcbe = metric_values("baird", "rmspcbe", th)
    assert np.all(pcbe[:, -1] < 0.02)                  # observed ~0.0068


def test_ctdc_on_baird_converges(run):
    env = envs.make("baird")
    assert metrics.rmspcbe(env, env.theta0) == pytest.approx(3.15, abs=0.01)
    th = run("baird", "ctdc", (0.005, 0.05, 0.05))
    pcbe = metric_values("baird", "rmspcbe", th)
    assert np.all(pcbe[:, -1] < 1e-3), pcbe[:, -1]     # observed < 1e-5
    assert np.all(pcbe[:, NUM_BLOCKS // 4] > pcbe[:, -1])
    assert np.all(np.abs(th) < 20)


def growth_rate(th):
    """Per-step slope of log max|theta| over the second half of the run, per seed."""
    size = np.log(np.abs(th).max(-1))
    half = NUM_BLOCKS // 2
    return (size[:, -1] - size[:, half]) / ((NUM_BLOCKS - 1 - half) * BLOCK)


def slow_eigenvalue(env_name, alg_name):
    M = analysis.slow_ode_matrix(envs.make(env_name), alg_name)
    return float(np.linalg.eigvals(M).real.max())


def test_td_on_baird_diverges(run):
    alpha = 0.002
    th = run("baird", "td", (alpha, 0.0, 0.0))
    size = np.abs(th).max(-1)                          # starts at 10
    assert np.all(np.isfinite(size))
    assert np.all(size[:, -1] > 1e8), size[:, -1]      # observed ~5e9
    assert np.all(np.diff(size, axis=1) > 0)           # growing at every log point
    # At the rate of the unstable slow-ODE mode, +0.239 alpha per step.
    np.testing.assert_allclose(growth_rate(th), slow_eigenvalue("baird", "td") * alpha, rtol=0.25)


def test_on_two_state_td_and_ctdc_diverge_ctd_converges(run):
    """The 2-state counterexample (theta0 = 1, fixpoint 0). Slow-ODE eigenvalues: TD
    +0.2, CTD -0.25, CTDC +0.02 (see test_analysis): TD and CTDC diverge at the
    predicted rates, CTD converges."""
    ctd = run("two_state", "ctd", (0.01, 0.1, 0.0))
    assert np.all(np.abs(ctd[:, -1, 0]) < 1e-6)        # observed ~1e-36
    assert np.all(np.abs(ctd[:, 0, 0]) < 0.1)

    alpha = 0.001
    td = run("two_state", "td", (alpha, 0.0, 0.0))
    assert np.all(np.abs(td[:, -1, 0]) > 500)          # observed ~2000
    np.testing.assert_allclose(growth_rate(td), 0.2 * alpha, rtol=0.25)

    alpha = 0.01
    ctdc = run("two_state", "ctdc", (alpha, 0.5, 0.1))
    assert np.all(np.abs(ctdc[:, -1, 0]) > 500)        # observed ~2000-3500
    assert slow_eigenvalue("two_state", "ctdc") == pytest.approx(0.02)
    np.testing.assert_allclose(growth_rate(ctdc), 0.02 * alpha, rtol=0.25)
