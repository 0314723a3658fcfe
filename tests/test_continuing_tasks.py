"""Continuing control's tabular tasks against their exact models, the exact
average-reward solver against brute force and policy iteration, and the
continuing task registry's errors."""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax.control.continuing import exact, tabular, tasks
from bec_jax.control.continuing.env import ContinuingEnv
from bec_jax.engine import tuning

N_DRAWS = 20_000
SEEDS, BURN_IN, STEPS = 100, 500, 2_000  # 2e5 measured steps per task
# csuite's own AccessControl (google-deepmind/csuite commit b74faed, run once
# here with numpy: seeds 0..9, 10 runs of 1e5 steps after 500 burn-in) under
# `_fixed_policy`: the mean reward rate and its standard error over the runs.
CSUITE_ACCESS_CONTROL_RATE = (2.218645, 0.0033544)
# The engine's light compile options (the loop emitters at -O1) for the programs here: under half XLA's
# default compile time, and these checks are not about the compile options.
LIGHT = tuning.CPU_LIGHT_OPTIONS if jax.default_backend() == "cpu" else None


TASKS = ("two_choice", "river_swim", "access_control")


@pytest.fixture(scope="module", params=TASKS)
def env(request) -> ContinuingEnv:
    return tasks.make(request.param)


def _pairs(env):
    """A few (s, a) pairs to sample from: every pair of the small tasks, a
    spread of busy counts (empty, middle, full) for Access-Control."""
    if env.num_states <= 9:
        return [(s, a) for s in range(env.num_states) for a in range(env.num_actions)]
    k = len(env.params["priorities"])
    return [(busy * k + i, a) for busy in (0, 5, env.params["num_servers"]) for i in (0, k - 1) for a in (0, 1)]


def _draw(env, key):
    """N_DRAWS steps from each of `_pairs(env)`: the next states' indices and
    the rewards, flat, pair by pair (traced)."""
    pairs = _pairs(env)
    # one flat vmap over every (pair, draw): a nested vmap compiles ~4x slower
    s = np.repeat(np.asarray([p[0] for p in pairs], np.int32), N_DRAWS)
    a = np.repeat(np.asarray([p[1] for p in pairs], np.int32), N_DRAWS)
    nxt, rew = jax.vmap(env.step)(jax.random.split(key, s.size), s, a)
    return jax.vmap(env.state_index)(nxt), rew


@functools.cache
def _model_draws() -> dict:
    """Every task's draws (`_draw`), in one compiled program."""
    envs = [tasks.make(name) for name in TASKS]
    out = jax.jit(lambda key: [_draw(e, key) for e in envs], compiler_options=LIGHT)(jax.random.key(1))
    return {e.name: (np.asarray(i), np.asarray(r, np.float64)) for e, (i, r) in zip(envs, out)}


def test_step_samples_the_model(env):
    """(a) next-state frequencies within 5 standard errors of P[s, a] (none
    where P is 0), the mean reward within 5 of R[s, a], from N_DRAWS draws per
    pair."""
    P, R = env.model()
    pairs = _pairs(env)
    idx, rew = _model_draws()[env.name]
    idx, rew = idx.reshape(len(pairs), N_DRAWS), rew.reshape(len(pairs), N_DRAWS)
    for j, (si, ai) in enumerate(pairs):
        freq = np.bincount(idx[j], minlength=env.num_states) / N_DRAWS
        p = P[si, ai]
        # the normal approximation's SE, floored at a count of one for the
        # rare next states (p ~ 1e-7 among Access-Control's binomial tails)
        se = np.sqrt(np.maximum(p * (1 - p), 1.0 / N_DRAWS) / N_DRAWS)
        assert np.all(np.abs(freq - p) <= 5 * se), (env.name, si, ai, freq, p)
        assert np.all(freq[p == 0] == 0), (env.name, si, ai)  # impossible next states never drawn
        r_se = rew[j].std() / np.sqrt(N_DRAWS)
        assert abs(rew[j].mean() - R[si, ai]) <= 5 * r_se + 1e-6, (env.name, si, ai)


def _fixed_policy(env) -> np.ndarray:
    """A stochastic policy that visits every loop: uniform for the small tasks,
    accept with probability rising with the priority for Access-Control."""
    if env.name != "access_control":
        return np.full((env.num_states, env.num_actions), 1.0 / env.num_actions)
    k = len(env.params["priorities"])
    accept = np.tile((np.arange(k) + 1) / (k + 1), env.params["num_servers"] + 1)
    return np.stack([1 - accept, accept], 1)


def _simulate(env, key):
    """(SEEDS,) reward rates of `_fixed_policy` on `env`, each over STEPS steps after BURN_IN (traced)."""
    cum = jnp.asarray(np.cumsum(_fixed_policy(env), 1)[:, :-1], jnp.float32)

    def run(key):
        k_reset, k_act, key = jax.random.split(key, 3)

        def one(state, tu):
            t, u = tu
            action = jnp.sum(cum[env.state_index(state)] <= u)
            state, reward = env.step(jax.random.fold_in(key, t), state, action)
            return state, jnp.where(t >= BURN_IN, reward, 0.0)

        # the action uniforms in one bulk draw; the task's keys by fold_in
        ts = jnp.arange(BURN_IN + STEPS)
        _, rewards = jax.lax.scan(one, env.reset(k_reset), (ts, jax.random.uniform(k_act, ts.shape)))
        return rewards.sum() / STEPS

    return jax.vmap(run)(jax.random.split(key, SEEDS))


@functools.cache
def _simulated_rates() -> dict:
    """Every task's rates (`_simulate`), in one compiled program (about two
    thirds of the compile time of three)."""
    envs = [tasks.make(name) for name in TASKS]
    out = jax.jit(lambda key: [_simulate(e, key) for e in envs], compiler_options=LIGHT)(jax.random.key(2))
    return {e.name: np.asarray(r, np.float64) for e, r in zip(envs, out)}


def test_simulated_reward_rate_is_the_policy_gain(env):
    """(b) the reward rate of a fixed policy, simulated in JAX (SEEDS runs of
    STEPS steps after BURN_IN), within 4 standard errors (over seeds) of the
    exact `policy_gain`; for Access-Control also of csuite's own rate."""
    P, R = env.model()
    pi = _fixed_policy(env)
    rates = _simulated_rates()[env.name]
    gain = exact.policy_gain(P, R, pi)
    se = rates.std(ddof=1) / np.sqrt(SEEDS)
    assert abs(rates.mean() - gain) <= 4 * se + 1e-6, (env.name, rates.mean(), gain, se)
    if env.name == "access_control":  # and csuite's own implementation agrees with both
        cs_rate, cs_se = CSUITE_ACCESS_CONTROL_RATE
        assert abs(cs_rate - gain) <= 4 * cs_se
        assert abs(rates.mean() - cs_rate) <= 4 * np.hypot(se, cs_se)


def test_two_choice_gains_by_hand():
    """(c) TwoChoice: reward rate 0.4 by action 1 at state 0 (the +2 loop of
    5 steps), 0.2 by action 0 (the +1 loop of 5); the optimum is the first."""
    P, R = tasks.make("two_choice").model()
    loop2, loop1 = np.ones(9, int), np.zeros(9, int)
    assert exact.policy_gain(P, R, loop2) == pytest.approx(0.4, abs=1e-12)
    assert exact.policy_gain(P, R, loop1) == pytest.approx(0.2, abs=1e-12)
    opt = exact.optimal(P, R)
    assert opt.gain == pytest.approx(0.4, abs=1e-9)
    assert opt.policy[0] == 1
    assert opt.h[opt.ref] == 0.0
    np.testing.assert_allclose(opt.q.max(1), opt.h, atol=1e-9)
    # the other states have no choice: both actions optimal there (ties allowed)
    assert exact.greedy_optimal_fraction(np.tile([0.0, 1.0], (9, 1)), opt) == 1.0
    assert exact.greedy_optimal_fraction(np.tile([1.0, 0.0], (9, 1)), opt) == pytest.approx(8 / 9)
    np.testing.assert_allclose(exact.greedy_optimal_fraction(np.zeros((3, 9, 2)), opt), 8 / 9)  # first of ties


def test_river_swim_optimum_is_the_best_deterministic_policy():
    """(c) RiverSwim: RVI's gain and policy equal the best of all 2^6
    deterministic policies by `policy_gain` (always swim right, gain 0.0669)."""
    P, R = tasks.make("river_swim").model()
    gains = {p: exact.policy_gain(P, R, np.asarray(p)) for p in itertools.product((0, 1), repeat=6)}
    best = max(gains, key=gains.get)
    opt = exact.optimal(P, R)
    assert opt.gain == pytest.approx(gains[best], abs=1e-9)
    assert tuple(opt.policy) == best == (1,) * 6
    assert opt.gain == pytest.approx(0.066880733945, abs=1e-9)


def _policy_iteration(P, R):
    """Unichain policy iteration (Puterman Sec. 8.6), written here apart from
    `exact`: evaluate g, h from (I - P_pi) h + g 1 = r_pi with h[0] = 0, then
    improve greedily, keeping the old action on ties."""
    S, _ = R.shape
    pol = np.zeros(S, int)
    while True:
        P_pi, r_pi = P[np.arange(S), pol], R[np.arange(S), pol]
        A = np.zeros((S + 1, S + 1))
        A[:S, :S] = np.eye(S) - P_pi
        A[:S, S] = 1.0
        A[S, 0] = 1.0
        sol = np.linalg.solve(A, np.concatenate([r_pi, [0.0]]))
        h, g = sol[:S], sol[S]
        q = R + P @ h
        new = np.where(q[np.arange(S), pol] >= q.max(1) - 1e-10, pol, q.argmax(1))
        if np.array_equal(new, pol):
            return g, pol, h
        pol = new


def test_access_control_optimum_matches_policy_iteration():
    """(c) Access-Control: RVI's optimal gain equals policy iteration's; its
    policy has S&B Fig. 10.5's structure: accepting is monotone in priority
    (accept a priority, accept every higher one) and in free servers, and the
    highest priority is accepted whenever a server is free."""
    env = tasks.make("access_control")
    P, R = env.model()
    g_pi, pol_pi, h_pi = _policy_iteration(P, R)
    opt = exact.optimal(P, R)
    assert opt.gain == pytest.approx(g_pi, abs=1e-8)
    assert exact.policy_gain(P, R, opt.policy) == pytest.approx(g_pi, abs=1e-8)
    np.testing.assert_allclose(opt.h, h_pi, atol=1e-6)
    n, k = env.params["num_servers"], len(env.params["priorities"])
    accept = opt.policy.reshape(n + 1, k)[:n]  # busy = n: both actions reject
    assert np.all(np.diff(accept, axis=1) >= 0)  # monotone in priority
    assert np.all(np.diff(accept, axis=0) <= 0)  # monotone in busy servers
    assert np.all(accept[:, -1] == 1)
    assert exact.greedy_optimal_fraction(opt.q, opt) == 1.0
    assert opt.gain == pytest.approx(2.74764195, abs=1e-7)


def test_multichain_policy_needs_a_start():
    """Two absorbing states with rewards 0 and 1: the gain depends on the start."""
    P = np.zeros((2, 1, 2))
    P[0, 0, 0] = P[1, 0, 1] = 1.0
    R = np.array([[0.0], [1.0]])
    with pytest.raises(ValueError, match="multichain"):
        exact.policy_gain(P, R, np.zeros(2, int))
    assert exact.policy_gain(P, R, np.zeros(2, int), start=1) == 1.0
    assert exact.policy_gain(P, R, np.zeros(2, int), start=[0.5, 0.5]) == 0.5
    with pytest.raises(ValueError, match="^model: relative value iteration did not converge"):
        exact.optimal(P, R, max_iter=1000)


def test_access_control_parameters_and_start():
    env = tasks.make("access_control", num_servers=3, priorities=[1, 5], free_probability=0.5)
    assert env.num_states == 8 and env.num_features == 16
    assert tasks.make(env.name, **env.params).params == env.params
    starts, features = jax.jit(lambda key: (jax.vmap(env.reset)(jax.random.split(key, 200)),  # one program
                                            env.features(jnp.int32(3))), compiler_options=LIGHT)(jax.random.key(0))
    assert set(np.asarray(starts).tolist()) == {0, 1}  # 0 busy, either priority
    np.testing.assert_array_equal(np.asarray(features), [[3], [11]])


def test_registry_errors():
    assert {"access_control", "river_swim", "two_choice"} <= set(tasks.names())
    with pytest.raises(ValueError, match="task: unknown continuing task 'nope'; known: .*two_choice"):
        tasks.make("nope")
    with pytest.raises(ValueError, match="^num_server: not a parameter of access_control; allowed: num_servers"):
        tasks.make("access_control", num_server=3)
    with pytest.raises(ValueError, match="^gamma: .*no discount"):
        tasks.make("two_choice", gamma=0.9)
    with pytest.raises(ValueError, match="^free_probability: a probability"):
        tasks.make("access_control", free_probability=1.5)
    with pytest.raises(ValueError, match="^priorities: .*distinct"):
        tasks.make("access_control", priorities=[1, 1])
    with pytest.raises(ValueError, match="^task: cannot import"):
        tasks.make("no_such_module_xyz:f")
    with pytest.raises(ValueError, match="already registered"):
        tasks.register("two_choice", tabular.river_swim)
    env = tasks.make("bec_jax.control.continuing.tabular:river_swim")
    assert env.name == "river_swim" and "bec_jax.control.continuing.tabular:river_swim" not in tasks.names()
