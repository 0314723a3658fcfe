"""The samplers against the model's probabilities, with tolerances from the sample size.

Every bound below is 5 standard errors of the estimate it checks, with the standard
error computed from the sample size (and, for Markov visit frequencies, from the
spread across independent chains, which accounts for the chain's autocorrelation).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax import envs
from bec_jax import mdp as mdp_lib
from bec_jax.prediction import sampling
from bec_jax.transition import Transition

NUM_CHAINS, CHAIN_LEN = 500, 400  # 200k draws per sampler

# A custom 4-state, 3-action model with one-hot features (so phi names the state),
# zero-probability actions and outcomes, rho != 1, and R(s, a, s') = 100 s + 10 a + s'
# (so the reward names the action).
_P = np.zeros((4, 3, 4))
_P[0, 0] = [0, 0.5, 0.5, 0]
_P[0, 1] = [1, 0, 0, 0]
_P[0, 2] = [0, 0, 0, 1]
_P[1, 0] = [0, 0, 1, 0]
_P[1, 1] = [0.2, 0, 0, 0.8]
_P[1, 2] = [0, 1, 0, 0]
_P[2, 0] = [1, 0, 0, 0]
_P[2, 1] = [0, 0, 0.5, 0.5]
_P[2, 2] = [0, 0.25, 0.25, 0.5]
_P[3, 0] = [0.5, 0.5, 0, 0]
_P[3, 1] = [0, 0, 0, 1]
_P[3, 2] = [0, 0, 1, 0]
_MU = np.array([[0.5, 0.3, 0.2], [0.0, 0.6, 0.4], [0.7, 0.3, 0.0], [1 / 3, 1 / 3, 1 / 3]])
_PI = np.array([[0.1, 0.9, 0.0], [0.0, 0.5, 0.5], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
_S, _A, _T = np.meshgrid(np.arange(4), np.arange(3), np.arange(4), indexing="ij")
_R = (100 * _S + 10 * _A + _T).astype(float)


@pytest.fixture(scope="module")
def custom():
    return mdp_lib.make_mdp(pi=_PI, mu=_MU, P=_P, R=_R, phi=np.eye(4), gamma=0.8)


def draw(sampler, key, num_chains=NUM_CHAINS, length=CHAIN_LEN):
    """(s, s_next, transition) of `num_chains` independent runs of `length` steps."""
    def chain(k):
        k0, k1 = jax.random.split(k)
        u = jax.random.uniform(k1, (length, sampler.num_uniforms), dtype=jnp.float32)

        def body(s, u_t):
            tr, s2 = sampler.step_from_uniforms(u_t, s)
            return s2, (s, s2, tr)

        return jax.lax.scan(body, sampler.init(k0), u)[1]

    out = jax.jit(lambda k: jax.lax.map(chain, jax.random.split(k, num_chains)))(key)
    return jax.tree.map(np.asarray, out)


def decode(env, s, s2, tr):
    """Checks the transition's phi/phi_next/reward/rho against the model; returns
    flat (s, a, s') arrays."""
    s, s2 = s.reshape(-1), s2.reshape(-1)
    phi = tr.phi.reshape(-1, env.num_features)
    phi_next = tr.phi_next.reshape(-1, env.num_features)
    np.testing.assert_array_equal(phi, env.phi[s])
    np.testing.assert_array_equal(phi_next, env.phi[s2])
    reward = tr.reward.reshape(-1).astype(np.float64)
    a = np.rint((reward - 100 * s - s2) / 10).astype(int)
    assert np.all((a >= 0) & (a < env.num_actions))
    np.testing.assert_array_equal(reward, env.R[s, a, s2])
    np.testing.assert_allclose(tr.rho.reshape(-1), mdp_lib.rho(env)[s, a], rtol=1e-6)
    np.testing.assert_array_equal(tr.discount, np.float32(env.gamma))
    return s, a, s2


def assert_conditional_freqs(s, s2, P, num_se=5.0):
    """Empirical next-state frequencies per state vs P (binomial standard errors)."""
    S = P.shape[0]
    counts = np.zeros((S, S))
    np.add.at(counts, (s, s2), 1)
    n = counts.sum(1, keepdims=True)
    assert np.all(n[:, 0] > 1000), n
    freq = counts / n
    se = np.sqrt(P * (1 - P) / n)
    assert np.all(counts[P == 0] == 0), "a zero-probability next state was drawn"
    np.testing.assert_array_less(np.abs(freq - P), num_se * se + 1e-12)


def assert_joint_freqs(env, s, a, s2, weights_s, num_se=5.0):
    """Empirical (s, a, s') frequencies vs weights_s(s) mu(a|s) P(s'|s,a)."""
    p = weights_s[:, None, None] * env.mu[:, :, None] * env.P
    counts = np.zeros(p.shape)
    np.add.at(counts, (s, a, s2), 1)
    N = len(s)
    freq = counts / N
    assert np.all(counts[p == 0] == 0), "a zero-probability (s, a, s') was drawn"
    np.testing.assert_array_less(np.abs(freq - p), num_se * np.sqrt(p * (1 - p) / N) + 1e-12)


# ----------------------------------------------------------------------- Markov


@pytest.fixture(scope="module")
def markov_draws(custom):
    return draw(sampling.make_sampler(custom, "markov"), jax.random.key(0))


def test_markov_fields_match_model(custom, markov_draws):
    decode(custom, *markov_draws)


def test_markov_is_one_trajectory(markov_draws):
    s, s2, _ = markov_draws
    np.testing.assert_array_equal(s[:, 1:], s2[:, :-1])


def test_markov_next_state_frequencies(custom, markov_draws):
    s, s2, _ = markov_draws
    assert_conditional_freqs(s.reshape(-1), s2.reshape(-1), mdp_lib.P_mu(custom))


def test_markov_action_and_outcome_frequencies(custom, markov_draws):
    s, a, s2 = decode(custom, *markov_draws)
    # Given s, the pair (a, s') is a fresh draw from mu(a|s) P(s'|s,a).
    counts = np.zeros((4, 3, 4))
    np.add.at(counts, (s, a, s2), 1)
    n = counts.sum((1, 2))[:, None, None]
    p = custom.mu[:, :, None] * custom.P
    assert np.all(counts[p == 0] == 0)
    np.testing.assert_array_less(np.abs(counts / n - p), 5 * np.sqrt(p * (1 - p) / n) + 1e-12)


def test_markov_visit_frequencies(custom, markov_draws):
    s, _, _ = markov_draws
    d = mdp_lib.d_mu(custom)
    per_chain = np.stack([(s == i).mean(1) for i in range(4)], axis=1)  # (chains, S)
    se = per_chain.std(0, ddof=1) / np.sqrt(per_chain.shape[0])
    assert np.all(se > 0)
    np.testing.assert_array_less(np.abs(per_chain.mean(0) - d), 5 * se)


def test_markov_mean_rho_is_one(markov_draws):
    rho = markov_draws[2].rho.reshape(-1).astype(np.float64)
    # rho_t - 1 is a martingale difference, so the plain standard error applies.
    assert abs(rho.mean() - 1.0) < 5 * rho.std() / np.sqrt(rho.size)
    assert rho.std() > 0.1  # off-policy: rho really varies


def test_markov_start_distribution():
    # Boyan starts in state 0: with one-hot-identifiable features the first phi is Phi[0].
    env = envs.boyan_chain()
    sampler = sampling.make_sampler(env, "markov")
    starts = jax.jit(jax.vmap(sampler.init))(jax.random.split(jax.random.key(1), 1000))
    np.testing.assert_array_equal(starts, 0)


def test_markov_start_frequencies(custom):
    start = np.array([0.1, 0.0, 0.6, 0.3])
    sampler = sampling.make_sampler(custom._replace(start=start), "markov")
    N = 100_000
    s0 = np.asarray(jax.jit(jax.vmap(sampler.init))(jax.random.split(jax.random.key(2), N)))
    freq = np.bincount(s0, minlength=4) / N
    assert freq[1] == 0
    np.testing.assert_array_less(np.abs(freq - start), 5 * np.sqrt(start * (1 - start) / N) + 1e-12)


# -------------------------------------------------------------------------- iid


@pytest.fixture(scope="module")
def iid_draws(custom):
    # The i.i.d. sampler ignores its input state, so s is read off the one-hot phi.
    # A start distribution far from d_mu: i.i.d. states must not follow it.
    env = custom._replace(start=np.array([0.0, 0.0, 0.0, 1.0]))
    _, s2, tr = draw(sampling.make_sampler(env, "iid"), jax.random.key(3))
    return np.argmax(tr.phi, axis=-1), s2, tr


def test_iid_fields_match_model(custom, iid_draws):
    decode(custom, *iid_draws)


def test_iid_state_frequencies(custom, iid_draws):
    s = iid_draws[0].reshape(-1)
    d = mdp_lib.d_mu(custom)
    freq = np.bincount(s, minlength=4) / s.size
    np.testing.assert_array_less(np.abs(freq - d), 5 * np.sqrt(d * (1 - d) / s.size))


def test_iid_next_state_frequencies(custom, iid_draws):
    s, s2, _ = iid_draws
    assert_conditional_freqs(s.reshape(-1), s2.reshape(-1), mdp_lib.P_mu(custom))


def test_iid_joint_frequencies(custom, iid_draws):
    s, a, s2 = decode(custom, *iid_draws)
    assert_joint_freqs(custom, s, a, s2, mdp_lib.d_mu(custom))


def test_iid_draws_are_independent_of_the_previous_state(iid_draws):
    # Consecutive i.i.d. draws: s_{t+1} is not s'_t more often than chance.
    s, s2, _ = iid_draws
    same = (s[:, 1:] == s2[:, :-1]).mean()
    counts = np.bincount(s.reshape(-1), minlength=4) / s.size
    chance = float(np.sum(counts * (np.bincount(s2.reshape(-1), minlength=4) / s.size)))
    assert abs(same - chance) < 5 * np.sqrt(chance * (1 - chance) / s[:, 1:].size)


# ------------------------------------------------------------------------ Baird


@pytest.fixture(scope="module")
def baird_markov():
    env = envs.baird()
    return env, draw(sampling.make_sampler(env, "markov"), jax.random.key(4))


def test_baird_markov_structure(baird_markov):
    env, (s, s2, tr) = baird_markov
    rho = tr.rho.reshape(-1)
    s2 = s2.reshape(-1)
    # rho is 7 (solid, to the lower state 6) or 0 (dashed, to an upper state): never else.
    assert set(np.unique(rho).tolist()) == {0.0, 7.0}
    np.testing.assert_array_equal(s2[rho == 7.0], 6)
    assert np.all(s2[rho == 0.0] < 6)
    np.testing.assert_array_equal(tr.reward, 0.0)
    np.testing.assert_array_equal(tr.phi_next.reshape(-1, 8), env.phi[s2])
    np.testing.assert_array_equal(tr.phi.reshape(-1, 8), env.phi[s.reshape(-1)])
    # P(solid) = 1/7 and mean rho = 1.
    p = 1 / 7
    assert abs((rho == 7.0).mean() - p) < 5 * np.sqrt(p * (1 - p) / rho.size)
    assert abs(rho.mean() - 1.0) < 5 * rho.std() / np.sqrt(rho.size)


def test_baird_markov_frequencies(baird_markov):
    env, (s, s2, _) = baird_markov
    assert_conditional_freqs(s.reshape(-1), s2.reshape(-1), mdp_lib.P_mu(env))
    per_chain = np.stack([(s == i).mean(1) for i in range(7)], axis=1)
    se = per_chain.std(0, ddof=1) / np.sqrt(per_chain.shape[0])
    np.testing.assert_array_less(np.abs(per_chain.mean(0) - 1 / 7), 5 * se)


# ------------------------------------------------------- deterministic edge cases

U_MAX = float(np.nextafter(np.float32(1.0), np.float32(0.0)))  # largest float32 below 1


def test_tables_layout(custom):
    """Per state: the positive-probability (a, s') outcomes in row-major order, their
    cumulative probabilities, and every entry from the last real one on above any
    uniform (so float32 rounding cannot select padding)."""
    t = sampling.build_tables(custom)
    joint = custom.mu[:, :, None] * custom.P
    for s in range(4):
        a, s2 = np.nonzero(joint[s] > 0)
        n = len(a)
        np.testing.assert_array_equal(t.next_state[s, :n], s2)
        np.testing.assert_array_equal(t.reward[s, :n], custom.R[s, a, s2].astype(np.float32))
        np.testing.assert_allclose(t.rho[s, :n], mdp_lib.rho(custom)[s, a], rtol=1e-6)
        np.testing.assert_allclose(t.cdf[s, :n - 1], np.cumsum(joint[s, a, s2])[:-1], rtol=1e-6)
        assert np.all(np.asarray(t.cdf[s, n - 1:]) > 1.0)


def test_extreme_uniforms_never_select_zero_probability_outcomes(custom):
    tables = sampling.build_tables(custom)
    joint = custom.mu[:, :, None] * custom.P
    for s in range(4):
        for u in (0.0, 1e-9, 0.5, 1 - 1e-7, U_MAX):
            tr, s2 = sampling.markov_step_from_uniforms(
                tables, jnp.array([u], jnp.float32), jnp.int32(s))
            s2 = int(s2)
            a = int(round((float(tr.reward) - 100 * s - s2) / 10))
            assert joint[s, a, s2] > 0, (s, u, a, s2)
        # u = 0 picks the first positive (a, s') in row-major order, u -> 1 the last.
        support = np.argwhere(joint[s] > 0)
        for u, (a_want, s2_want) in ((0.0, support[0]), (U_MAX, support[-1])):
            tr, s2 = sampling.markov_step_from_uniforms(
                tables, jnp.array([u], jnp.float32), jnp.int32(s))
            assert int(s2) == s2_want
            assert float(tr.reward) == custom.R[s, a_want, s2_want]


def test_iid_extreme_uniforms(custom):
    tables = sampling.build_tables(custom)
    d = mdp_lib.d_mu(custom)
    for u0 in (0.0, U_MAX):
        for u1 in (0.0, U_MAX):
            tr, s2 = sampling.iid_step_from_uniforms(
                tables, jnp.array([u0, u1], jnp.float32), jnp.int32(0))
            s = int(np.argmax(np.asarray(tr.phi)))
            assert d[s] > 0
            assert s == (0 if u0 == 0.0 else np.flatnonzero(d > 0)[-1])
            assert mdp_lib.P_mu(custom)[s, int(s2)] > 0


def test_zero_probability_state_never_drawn_iid():
    # State 1 is transient (only left, never entered), so d_mu(1) = 0.
    P = np.zeros((3, 1, 3))
    P[0, 0, 2] = 1.0
    P[1, 0, 0] = 1.0
    P[2, 0, 0] = 1.0
    env = mdp_lib.make_mdp(pi=np.ones((3, 1)), mu=np.ones((3, 1)), P=P, R=np.zeros((3, 1)),
                           phi=np.eye(3), gamma=0.5)
    np.testing.assert_allclose(mdp_lib.d_mu(env), [0.5, 0.0, 0.5], atol=1e-12)
    sampler = sampling.make_sampler(env, "iid")
    u = jnp.linspace(0.0, U_MAX, 4001, dtype=jnp.float32)
    u = jnp.stack([u, jnp.zeros_like(u)], axis=1)
    tr, _ = jax.jit(jax.vmap(sampler.step_from_uniforms, in_axes=(0, None)))(u, jnp.int32(0))
    s = np.argmax(np.asarray(tr.phi), axis=1)
    assert 1 not in s
    assert abs((s == 0).mean() - 0.5) < 1e-3


# --------------------------------------------------------------- jit and vmap


@pytest.mark.parametrize("kind", sampling.KINDS)
def test_step_under_jit_and_vmap_over_keys(custom, kind):
    sampler = sampling.make_sampler(custom, kind)
    keys = jax.random.split(jax.random.key(5), 4)
    states = jnp.arange(4, dtype=jnp.int32)
    tr_b, s_b = jax.jit(jax.vmap(sampler.step))(keys, states)
    assert isinstance(tr_b, Transition)
    assert tr_b.phi.shape == (4, 4) and tr_b.reward.shape == (4,) and tr_b.rho.shape == (4,)
    assert tr_b.phi.dtype == jnp.float32 and s_b.dtype == jnp.int32
    for i in range(4):
        tr, s2 = sampler.step(keys[i], states[i])
        assert int(s2) == int(s_b[i])
        for x, y in zip(tr, tr_b):
            np.testing.assert_array_equal(x, y[i])


def test_step_from_uniforms_matches_step(custom):
    sampler = sampling.make_sampler(custom, "iid")
    key = jax.random.key(6)
    u = jax.random.uniform(key, (sampler.num_uniforms,), dtype=jnp.float32)
    a = sampler.step(key, jnp.int32(2))
    b = sampler.step_from_uniforms(u, jnp.int32(2))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


def test_unknown_sampler_kind(custom):
    with pytest.raises(ValueError, match="markov.*iid"):
        sampling.make_sampler(custom, "nope")
