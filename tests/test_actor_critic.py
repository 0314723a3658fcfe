"""The centered actor-critic experiment (`bec_jax.experiments.actor_critic`): the
update against hand-computed steps and an independent plain actor-critic loss, the
variants' identities (beta = 0 is TD, c = 0 is no shift), reproducibility."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bec_jax.agents import value_learning
from bec_jax.experiments import actor_critic as ac

pytest.importorskip("gymnax")  # the experiment's only extra dependency

SMALL = dataclasses.replace(ac.small_config(), steps=200, log_every=50)


def linear_v(theta, x):
    return jnp.dot(theta, x)


def linear_logits(W, x):
    return x @ W


def hand_batch():
    """Two hand-made transitions: the second one terminates (discount 0)."""
    return ac.Batch(obs=jnp.array([[1.0, -0.5, 0.25], [0.5, 2.0, -1.0]], jnp.float32),
                    action=jnp.array([1, 0], jnp.int32),
                    reward=jnp.array([1.0, 0.3], jnp.float32),
                    discount=jnp.array([0.9, 0.0], jnp.float32),
                    next_obs=jnp.array([[0.0, 1.0, -2.0], [3.0, 3.0, 3.0]], jnp.float32))


@pytest.mark.parametrize("omega", [0.0, 0.4])
def test_update_equals_hand_step(omega):
    """SGD, linear v and linear-softmax policy: one update of two transitions is
    theta + a_c mean((delta - omega) x), W + a_a mean((delta - omega) x (e_a - pi)^T),
    omega + beta mean(delta - omega): eqs. thetawithrho, omegawithrho (rho = 1)."""
    a_lr, c_lr, beta = 0.1, 0.05, 0.2
    theta = np.array([0.3, -0.2, 0.5])
    W = np.array([[0.1, -0.3], [0.2, 0.0], [-0.4, 0.25]])
    b = hand_batch()
    x, a, r, g, xn = (np.asarray(f, np.float64) for f in b)
    a = a.astype(int)
    delta = r + g * (xn @ theta) - x @ theta
    err = delta - omega
    theta_hand = theta + c_lr * np.mean(err[:, None] * x, axis=0)
    logits = x @ W
    pi = np.exp(logits - logits.max(1, keepdims=True))
    pi /= pi.sum(1, keepdims=True)
    score = np.einsum("bi,bj->bij", x, np.eye(2)[a] - pi)  # grad_W log pi(a|x)
    W_hand = W + a_lr * np.mean(err[:, None, None] * score, axis=0)
    omega_hand = omega + beta * np.mean(err)

    update = ac.make_update(linear_logits, linear_v, optax.sgd(a_lr), optax.sgd(c_lr), ent_coef=0.0)
    params = ac.Params(actor=jnp.asarray(W, jnp.float32), critic=jnp.asarray(theta, jnp.float32))
    opt_a, opt_c = optax.sgd(a_lr), optax.sgd(c_lr)
    agent = ac.AgentState(params, opt_a.init(params.actor), opt_c.init(params.critic),
                          value_learning.omega_init(omega))
    new, deltas = jax.jit(update)(agent, b, beta)
    np.testing.assert_allclose(deltas, delta, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(new.params.critic, theta_hand, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(new.params.actor, W_hand, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(new.omega.omega, omega_hand, rtol=1e-6, atol=1e-6)
    # the terminating transition bootstraps nothing: delta = r - v(s)
    np.testing.assert_allclose(deltas[1], r[1] - x[1] @ theta, rtol=1e-6)


def test_loss_matches_plain_actor_critic_and_centering():
    """omega = 0: the gradient equals an independently written one-step
    actor-critic loss (TD critic, advantage delta, entropy bonus); omega != 0: the
    critic's gradient equals minus `value_learning.batch_centered_td_direction`."""
    key = jax.random.key(3)
    params = ac.init_params(key, 3, 2, (8,))
    b = hand_batch()
    ent = 0.05

    def plain_loss(p):
        v = jax.vmap(ac.mlp_value, (None, 0))(p.critic, b.obs)
        vn = jax.vmap(ac.mlp_value, (None, 0))(p.critic, b.next_obs)
        delta = jax.lax.stop_gradient(b.reward + b.discount * vn) - v
        logp = jax.nn.log_softmax(jax.vmap(ac.mlp, (None, 0))(p.actor, b.obs))
        logp_a = logp[jnp.arange(2), b.action]
        ent_ = -jnp.sum(jnp.exp(logp) * logp, axis=1)
        return (0.5 * jnp.mean(delta ** 2) - jnp.mean(jax.lax.stop_gradient(delta) * logp_a)
                - ent * jnp.mean(ent_))

    g_ref = jax.jit(jax.grad(plain_loss))(params)
    grad = jax.jit(lambda p, om: jax.grad(ac.actor_critic_loss, argnums=2, has_aux=True)(
        ac.mlp, ac.mlp_value, p, om, b, ent)[0])
    g = grad(params, 0.0)
    for u, w in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(u, w, rtol=1e-5, atol=1e-6)

    g = grad(params, 0.7)
    d, _ = jax.jit(lambda p: value_learning.batch_centered_td_direction(
        ac.mlp_value, p, 0.7, b.obs, b.reward, b.discount, b.next_obs))(params.critic)
    for u, w in zip(jax.tree.leaves(g.critic), jax.tree.leaves(value_learning.to_grads(d))):
        np.testing.assert_allclose(u, w, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def train():
    return ac.make_train(SMALL)


def _f(xs):
    return jnp.asarray(xs, jnp.float32)


def test_identities_beta0_and_shift0(train):
    """In one program: centered with beta = 0, omega0 = 0 and the shift control with
    c = 0 are bit-identical to the plain agent (same seeds, same keys)."""
    logs = jax.device_get(train(jax.random.key(0), _f([0.0, 0.0, 0.0]), _f([0.0, 0.0, 0.0]),
                                _f([0.0, 0.0, 0.0])))
    for name in ac.LOGS:
        np.testing.assert_array_equal(logs[name][1], logs[name][0], err_msg=name)
        np.testing.assert_array_equal(logs[name][2], logs[name][0], err_msg=name)
    assert np.all(logs["omega"] == 0.0)
    # and with beta > 0 the centered agent differs and omega moves
    logs = jax.device_get(train(jax.random.key(0), _f([0.0, 0.05, 0.0]), _f([0.0, 0.0, 0.0]),
                                _f([0.0, 0.0, 0.5])))
    assert not np.array_equal(logs["value"][1], logs["value"][0])
    assert not np.array_equal(logs["value"][2], logs["value"][0])
    assert np.all(logs["omega"][1, :, -1] > 0.0)


@pytest.fixture(scope="module")
def auto():
    """The default path (shift = None): two calls, plain + centered then the
    control with c = the centered agent's final omega."""
    return ac.train_variants(SMALL)


@pytest.mark.long
def test_tiny_run_reproducible_and_shaped(train, auto, tmp_path):
    """The tiny run is reproducible bit for bit: its plain and centered agents and
    those of a separately built and compiled program (three variants vmapped instead
    of two, the control at another c) agree exactly, so a variant's result depends
    on its seed and settings only. The control's c is the centered agent's final
    omega. Arrays are finite with shapes (seeds, steps // log_every); the summary
    and its files exist."""
    a, c = auto
    assert set(a) == set(ac.VARIANTS)
    assert c == pytest.approx(float(np.mean(a["centered"]["omega"][:, -1])))
    assert np.all(a["shift"]["omega"] == 0.0)
    other = jax.device_get(train(jax.random.key(SMALL.seed), _f([0.0, SMALL.beta, 0.0]),
                                 _f([0.0, SMALL.omega0, 0.0]), _f([0.0, 0.0, 0.5])))
    L = SMALL.steps // SMALL.log_every
    for name in ac.LOGS:
        np.testing.assert_array_equal(a["plain"][name], other[name][0], err_msg=name)
        np.testing.assert_array_equal(a["centered"][name], other[name][1], err_msg=name)
    for v in ac.VARIANTS:
        for name in ac.LOGS:
            assert a[v][name].shape == (SMALL.seeds, L), (v, name)
            if name != "delta_terminal":
                assert np.all(np.isfinite(a[v][name])), (v, name)
        assert np.all(a[v]["episodes"].sum(1) > 0)
    s = ac.summarise(SMALL, a, c)
    assert s["env_steps"][-1] == SMALL.steps * SMALL.envs
    for v in ac.VARIANTS:
        assert np.isfinite(s["variants"][v]["final_return"]["mean"])
        assert len(s["variants"][v]["curve_mean"]) == L
    paths = ac.write(s, str(tmp_path))
    assert all((tmp_path / p.split("/")[-1]).stat().st_size > 0 for p in paths)
    assert len(ac.table(s)) == 3 and "centered" in ac.report(s)
