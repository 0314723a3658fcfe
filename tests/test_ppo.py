"""The centered PPO experiment (`bec_jax.experiments.ppo`): its advantages against
rlax and hand-computed truncation/termination targets, omega's once-per-rollout
update by hand, the variants' identities (c = 0 is plain; a variant's run does not
depend on which others run beside it) and a tiny end-to-end run."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax.agents import value_learning
from bec_jax.experiments import ppo

pytest.importorskip("gymnax")
rlax = pytest.importorskip("rlax")

GAMMA, LAM = 0.99, 0.95
TINY = dataclasses.replace(ppo.small_config(), timesteps=3 * 2 * 32)  # 3 updates of 2 envs x 32 steps


def random_rollout(T=12, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.normal(size=T), jnp.float32),        # reward
            jnp.asarray(rng.normal(size=T + 1), jnp.float32),    # values
            jnp.asarray(rng.normal(size=T), jnp.float32))        # final values


@pytest.mark.parametrize("omega,shift", [(0.0, 0.0), (0.37, 0.0), (0.0, 0.8), (-0.5, 0.2)])
def test_advantages_equal_rlax_on_shifted_reward(omega, shift):
    """No episode end cut by a time limit: the agent's advantages are rlax's GAE of
    r - shift - omega (plain: omega = shift = 0), terminations as discount 0; the
    td_errors are the uncentered ones (rlax's GAE of r - shift with lambda 0)."""
    r, v, fv = random_rollout()
    term = jnp.zeros(12, bool).at[4].set(True).at[9].set(True)
    trunc = jnp.zeros(12, bool)
    out = ppo.advantages(r, term, trunc, v, fv, omega, gamma=GAMMA, lambda_=LAM, shift=shift)
    disc = jnp.where(term, 0.0, GAMMA)
    want = rlax.truncated_generalized_advantage_estimation(r - shift - omega, disc, LAM, v)
    np.testing.assert_allclose(out.advantages, want, rtol=1e-5, atol=1e-5)
    td = rlax.truncated_generalized_advantage_estimation(r - shift, disc, 0.0, v)
    np.testing.assert_allclose(out.td_errors, td, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.targets, v[:-1] + out.advantages, rtol=1e-6)


def test_truncation_bootstraps_from_final_observation():
    """A time-limit truncation at t = 5: td_error_5 = r_5 + gamma v(final obs) - v_5,
    and the trace is cut: advantages before it equal rlax's GAE of the episode
    [0, 5] with values (v_0..v_5, v(final obs)). A step both terminated and
    truncated is a termination (discount 0)."""
    r, v, fv = random_rollout(seed=1)
    term = jnp.zeros(12, bool).at[9].set(True)
    trunc = jnp.zeros(12, bool).at[5].set(True).at[9].set(True)
    out = ppo.advantages(r, term, trunc, v, fv, 0.25, gamma=GAMMA, lambda_=LAM)
    np.testing.assert_allclose(out.td_errors[5], r[5] + GAMMA * fv[5] - v[5], rtol=1e-5)
    np.testing.assert_allclose(out.td_errors[9], r[9] - v[9], rtol=1e-5)
    first = rlax.truncated_generalized_advantage_estimation(
        r[:6] - 0.25, jnp.full(6, GAMMA), LAM, jnp.concatenate([v[:6], fv[5:6]]))
    np.testing.assert_allclose(out.advantages[:6], first, rtol=1e-5, atol=1e-5)


def test_termination_option_bootstraps_absorbing_value():
    """terminal_option: a true termination's td_error is r + gamma (-omega/(1-gamma)) - v
    and the advantage there is that minus omega; off, it is r - v."""
    r, v, fv = random_rollout(seed=2)
    term = jnp.zeros(12, bool).at[3].set(True)
    trunc = jnp.zeros(12, bool)
    om = 0.6
    on = ppo.advantages(r, term, trunc, v, fv, om, gamma=GAMMA, lambda_=LAM, terminal_option=True)
    off = ppo.advantages(r, term, trunc, v, fv, om, gamma=GAMMA, lambda_=LAM, terminal_option=False)
    want = r[3] + GAMMA * (-om / (1 - GAMMA)) - v[3]
    np.testing.assert_allclose(on.td_errors[3], want, rtol=1e-5)
    np.testing.assert_allclose(on.advantages[3], want - om, rtol=1e-5)
    np.testing.assert_allclose(off.td_errors[3], r[3] - v[3], rtol=1e-5)
    np.testing.assert_allclose(on.advantages[4:], off.advantages[4:], rtol=1e-6)  # after the end: same


def test_omega_updates_once_per_rollout_on_the_mean():
    """omega + beta mean(delta - omega) over every step of every copy (T, N)."""
    td = jnp.asarray(np.random.default_rng(3).normal(1.0, 2.0, size=(7, 3)), jnp.float32)
    state = value_learning.omega_init()._replace(omega=jnp.float32(0.4))
    new = ppo.rollout_omega_update(state, td, 0.1)
    np.testing.assert_allclose(new.omega, 0.4 + 0.1 * (np.mean(np.asarray(td)) - 0.4), rtol=1e-6)
    assert int(new.count) == 1
    assert float(ppo.rollout_omega_update(state, td, 0.0).omega) == pytest.approx(0.4)


# ------------------------------------------------------------- the program

@pytest.fixture(scope="module")
def train():
    return ppo.make_train(TINY, "CartPole-v1")


@pytest.fixture(scope="module")
def first_pass(train):
    key = jax.random.key(TINY.seed)
    return jax.tree.map(np.asarray, train(key, *ppo.variant_arrays(TINY, ppo.VARIANTS[:3])))


def test_common_random_numbers_and_shift_zero(train, first_pass):
    """At the same batch shape, a variant's run does not depend on its companions
    or its position: (shift with c = 0, centered, plain) gives centered's and
    plain's runs of the first pass bit for bit, and shift with c = 0 equals plain
    bit for bit. plain's omega stays 0, the centered variants' omega moves, and
    their runs differ from plain's. (Across batch shapes, e.g. the shift control's
    second pass with one variant, XLA's CPU matmuls round differently: equal to
    about 1e-8 at first, not bit for bit.)"""
    key = jax.random.key(TINY.seed)
    other = jax.tree.map(np.asarray, train(key, *ppo.variant_arrays(TINY, ("shift", "centered", "plain"), 0.0)))
    for k in ppo.LOGS:
        np.testing.assert_array_equal(other[k][1], first_pass[k][1])
        np.testing.assert_array_equal(other[k][2], first_pass[k][0])
        np.testing.assert_array_equal(other[k][0], first_pass[k][0])
    assert np.all(first_pass["omega"][0] == 0.0)
    assert np.all(first_pass["omega"][1:] != 0.0)
    assert not np.array_equal(first_pass["value"][0], first_pass["value"][1])
    assert not np.array_equal(first_pass["omega"][1], first_pass["omega"][2])
    # omega after the first rollout = beta * mean td error: bounded by the reward scale
    assert np.all(np.abs(first_pass["omega"][1:, :, 0]) < TINY.beta * 10)


@pytest.mark.long
def test_end_to_end_writes_table_and_figure(train, first_pass, tmp_path):
    """train_task (second pass: shift with c = centered's final omega) -> summary,
    table, figure; every final return is finite and in CartPole's [1, 500]."""
    logs, c, secs = ppo.train_task(TINY, "CartPole-v1", train)
    for k in ppo.LOGS:  # the first pass is the fixture's, reproduced
        np.testing.assert_array_equal(logs["centered_terminal"][k], first_pass[k][2])
    assert c == pytest.approx(float(np.mean(first_pass["omega"][1, :, -1])))
    summary = ppo.summarise(TINY, {"CartPole-v1": (logs, c, secs)})
    paths = ppo.write(summary, {"CartPole-v1": (logs, c, secs)}, str(tmp_path))
    for name in ("ppo.png", "table.csv", "table.md", "curves.npz", "summary.json"):
        assert str(tmp_path / name) in paths and (tmp_path / name).stat().st_size > 0
    rows = ppo.table(summary)
    assert [r["variant"] for r in rows] == list(ppo.VARIANTS)
    for r in rows:
        assert 1.0 <= r["final_mean"] <= 500.0 and r["seeds"] == TINY.seeds
    assert "| CartPole-v1 |" in (tmp_path / "table.md").read_text()
    with np.load(tmp_path / "curves.npz") as z:
        np.testing.assert_array_equal(z["CartPole-v1/shift/episodes"], logs["shift"]["episodes"])
    # resume: the saved task is reused only with the same settings
    ppo.save_task(str(tmp_path), TINY, "CartPole-v1", (logs, c, secs))
    back, c2, _ = ppo.load_task(str(tmp_path), TINY, "CartPole-v1")
    assert c2 == c and all(np.array_equal(back[v][k], logs[v][k]) for v in logs for k in ppo.LOGS)
    assert ppo.load_task(str(tmp_path), dataclasses.replace(TINY, beta=0.2), "CartPole-v1") is None
