"""Bellman error centering for general value functions (`bec_jax.agents.value_learning`),
centered TD(lambda) (`bec_jax.algorithms.ctd_lambda`) and the worked agent."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bec_jax import algorithms, envs
from bec_jax.agents import value_learning
from bec_jax.algorithms import ctd, ctd_lambda, ctdc, td, tdc
from bec_jax.engine import tuning
from bec_jax.experiments import neural_agent
from bec_jax.prediction import sampling
from bec_jax.transition import Transition

K, T = 4, 40  # features, transitions per sequence
ALPHA, BETA, ZETA = 0.05, 0.1, 0.2
TOL = dict(rtol=2e-5, atol=2e-5)


def linear_v(theta, phi):
    return jnp.dot(theta, phi)


def f32(a):
    return jnp.asarray(a, jnp.float32)


def light():
    """The engine's light XLA:CPU options (`tuning.CPU_LIGHT_OPTIONS`, about half
    the compile) where JAX runs on the CPU; none elsewhere. The programs here are
    about what they compute, not how they are compiled."""
    return tuning.CPU_LIGHT_OPTIONS if jax.default_backend() == "cpu" else None


def random_transitions(seed, n=T, k=K, rho_range=(0.1, 3.0)):
    """n random transitions with rho far from 1 and a random discount (some 0).
    Drawn by NumPy: jax.random's programs would be compiled for every shape."""
    rng = np.random.default_rng(seed)
    phi, reward, phi_next = rng.normal(size=(n, k)), rng.normal(size=n), rng.normal(size=(n, k))
    discount = np.where(rng.uniform(size=n) < 0.1, 0.0, 0.9)
    rho = rng.uniform(rho_range[0], rho_range[1], n)
    return Transition(phi=f32(phi), reward=f32(reward), discount=f32(discount), phi_next=f32(phi_next), rho=f32(rho))


@pytest.fixture(scope="module")
def trs():
    return random_transitions(0)


@pytest.fixture(scope="module")
def theta0():
    return f32(0.5 * np.random.default_rng(1).normal(size=K))


def scan(step, init, trs):
    """Runs `step(carry, tr) -> carry` over `trs`, returning every carry."""
    def body(c, tr):
        c = step(c, tr)
        return c, c
    return jax.lax.scan(body, init, trs)[1]


# ---------------------------------------------------- linear case = same code path

@pytest.fixture(scope="module")
def linear_runs(trs, theta0):
    """Each linear algorithm next to the general API, over the same sequence, in one jit."""

    def general_ctd(c, tr):
        theta, om = c
        d, delta = value_learning.centered_td_direction(linear_v, theta, om.omega, *tr)
        return theta + ALPHA * d, value_learning.omega_update(om, delta, tr.rho, BETA)

    opt = optax.sgd(ALPHA)

    def general_ctd_optax(c, tr):
        theta, opt_state, om = c
        g, delta = jax.grad(value_learning.centered_td_loss, argnums=1, has_aux=True)(
            linear_v, theta, om.omega, *tr)
        up, opt_state = opt.update(g, opt_state, theta)
        return optax.apply_updates(theta, up), opt_state, value_learning.omega_update(om, delta, tr.rho, BETA)

    def general_ctdc(c, tr, centered=True):
        theta, h, om = c
        d = value_learning.centered_tdc_direction(linear_v, theta, h, om.omega, *tr)
        om = value_learning.omega_update(om, d.delta, tr.rho, BETA if centered else 0.0)
        return theta + ALPHA * d.params, h + ZETA * d.h, om

    def general_td(theta, tr):
        d, _ = value_learning.centered_td_direction(linear_v, theta, 0.0, *tr)
        return theta + ALPHA * d

    def general_td_optax(c, tr):
        theta, opt_state = c
        g, _ = jax.grad(value_learning.centered_td_loss, argnums=1, has_aux=True)(linear_v, theta, 0.0, *tr)
        up, opt_state = opt.update(g, opt_state, theta)
        return optax.apply_updates(theta, up), opt_state

    @functools.partial(jax.jit, compiler_options=light())
    def run(trs, theta0):
        om0 = value_learning.omega_init(0.3)
        h0 = jnp.zeros_like(theta0)
        return {
            "ctd": (scan(lambda s, tr: ctd.update(s, tr, ALPHA, BETA), ctd.init(theta0, 0.3), trs),
                    scan(general_ctd, (theta0, om0), trs),
                    scan(general_ctd_optax, (theta0, opt.init(theta0), om0), trs)),
            "ctdc": (scan(lambda s, tr: ctdc.update(s, tr, ALPHA, BETA, ZETA), ctdc.init(theta0, 0.3), trs),
                     scan(general_ctdc, (theta0, h0, om0), trs)),
            "td": (scan(lambda s, tr: td.update(s, tr, ALPHA), td.init(theta0), trs),
                   scan(general_td, theta0, trs),
                   scan(general_td_optax, (theta0, opt.init(theta0)), trs)),
            "tdc": (scan(lambda s, tr: tdc.update(s, tr, ALPHA, ZETA), tdc.init(theta0), trs),
                    scan(lambda c, tr: general_ctdc(c, tr, centered=False),
                         (theta0, h0, value_learning.omega_init(0.0)), trs)),
        }

    return run(trs, theta0)


def test_trajectories_move(linear_runs):
    # Guard against a vacuous equivalence: the runs really change theta and omega.
    ref = linear_runs["ctdc"][0]
    assert float(jnp.abs(ref.theta[-1] - ref.theta[0]).max()) > 0.1
    assert float(jnp.abs(ref.omega[-1] - ref.omega[0])) > 0.01


def test_linear_ctd_equivalence(linear_runs):
    ref, (theta, om), (theta_opt, _, om_opt) = linear_runs["ctd"]
    np.testing.assert_allclose(theta, ref.theta, **TOL)
    np.testing.assert_allclose(om.omega, ref.omega, **TOL)
    np.testing.assert_allclose(theta_opt, ref.theta, **TOL)
    np.testing.assert_allclose(om_opt.omega, ref.omega, **TOL)
    np.testing.assert_array_equal(om.count, ref.count)


def test_linear_ctdc_equivalence(linear_runs):
    ref, (theta, h, om) = linear_runs["ctdc"]
    np.testing.assert_allclose(theta, ref.theta, **TOL)
    np.testing.assert_allclose(h, ref.u, **TOL)
    np.testing.assert_allclose(om.omega, ref.omega, **TOL)


def test_linear_td_equivalence_centering_off(linear_runs):
    ref, theta, (theta_opt, _) = linear_runs["td"]
    np.testing.assert_allclose(theta, ref.theta, **TOL)
    np.testing.assert_allclose(theta_opt, ref.theta, **TOL)


def test_linear_tdc_equivalence_centering_off(linear_runs):
    ref, (theta, h, om) = linear_runs["tdc"]
    np.testing.assert_allclose(theta, ref.theta, **TOL)
    np.testing.assert_allclose(h, ref.u, **TOL)
    np.testing.assert_array_equal(om.omega, 0.0)  # beta = 0 keeps centering off


# ------------------------------------------------------------- centered TD(lambda)

@pytest.fixture(scope="module")
def lambda_runs(trs, theta0):
    def general(lam):
        def step(c, tr):
            theta, e, om = c
            d, e, delta = value_learning.centered_td_lambda_direction(linear_v, theta, e, om.omega, *tr,
                                                                 lam=lam)
            return theta + ALPHA * d, e, value_learning.omega_update(om, delta, tr.rho, BETA)
        return step

    @functools.partial(jax.jit, compiler_options=light())
    def run(trs, theta0):
        om0 = value_learning.omega_init(0.3)
        e0 = value_learning.trace_init(theta0)
        lin = lambda lam: scan(lambda s, tr: ctd_lambda.update(s, tr, ALPHA, BETA, lam),
                               ctd_lambda.init(theta0, 0.3), trs)
        return {
            "ctd": scan(lambda s, tr: ctd.update(s, tr, ALPHA, BETA), ctd.init(theta0, 0.3), trs),
            "lin0": lin(0.0), "gen0": scan(general(0.0), (theta0, e0, om0), trs),
            "lin7": lin(0.7), "gen7": scan(general(0.7), (theta0, e0, om0), trs),
        }

    return run(trs, theta0)


def test_lambda_zero_is_ctd_linear(lambda_runs):
    ref, lin = lambda_runs["ctd"], lambda_runs["lin0"]
    np.testing.assert_allclose(lin.theta, ref.theta, **TOL)
    np.testing.assert_allclose(lin.omega, ref.omega, **TOL)
    np.testing.assert_array_equal(lin.e, 0.0)


def test_lambda_zero_is_ctd_general(lambda_runs):
    ref, (theta, _, om) = lambda_runs["ctd"], lambda_runs["gen0"]
    np.testing.assert_allclose(theta, ref.theta, **TOL)
    np.testing.assert_allclose(om.omega, ref.omega, **TOL)


def test_lambda_general_matches_linear_module(lambda_runs):
    lin, (theta, e, om) = lambda_runs["lin7"], lambda_runs["gen7"]
    np.testing.assert_allclose(theta, lin.theta, **TOL)
    np.testing.assert_allclose(e, lin.e, **TOL)
    np.testing.assert_allclose(om.omega, lin.omega, **TOL)
    # lambda > 0 is a different algorithm from CTD on this sequence.
    assert float(jnp.abs(lin.theta[-1] - lambda_runs["ctd"].theta[-1]).max()) > 1e-3


def test_lambda_trace_by_hand():
    """Two steps written out: z1 = rho1 phi1; z2 = rho2 (g1 lam z1 + phi2), g1 the
    first transition's discount; a discount of 0 cuts the trace after its update."""
    lam, om0 = 0.8, 0.2
    phi = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32)
    tr = lambda i, g, rho: Transition(phi[i], jnp.float32(1.0), jnp.float32(g), phi[i + 1], jnp.float32(rho))
    update = jax.jit(ctd_lambda.update)  # one program for both steps
    s = ctd_lambda.init(jnp.zeros(2), om0)
    s1 = update(s, tr(0, 0.9, 2.0), 1.0, 0.0, lam)
    z1 = 2.0 * phi[0]
    np.testing.assert_allclose(s1.theta, (1.0 - om0) * z1)
    np.testing.assert_allclose(s1.e, 0.9 * lam * z1)
    s2 = update(s1, tr(1, 0.0, 0.5), 1.0, 0.0, lam)
    z2 = 0.5 * (0.9 * lam * z1 + phi[1])
    delta2 = 1.0 + 0.0 - np.dot(s1.theta, phi[1])
    np.testing.assert_allclose(s2.theta, s1.theta + (delta2 - om0) * z2, rtol=1e-6)
    np.testing.assert_array_equal(s2.e, 0.0)


def test_ctd_lambda_registry():
    alg = algorithms.get("ctd_lambda")
    assert alg.step_sizes == ("alpha", "beta") and alg.names == ("alpha", "beta", "lambda")
    assert set(algorithms.names()) >= {"td", "tdc", "ctd", "ctdc", "ctdc_omega_no_rho", "src", "vrc", "ctd_lambda"}
    assert alg.hyperparameter("lambda").default == ctd_lambda.DEFAULT_LAMBDA
    with pytest.raises(ValueError, match="lambda"):
        alg.hyperparameter("lambda").check(1.5)
    # Through the descriptor, with an optax schedule as a step size and lambda by name.
    h = {"alpha": optax.linear_schedule(0.1, 0.0, 10), "beta": 0.1, "lambda": 0.7}
    tr = jax.tree.map(lambda a: a[0], random_transitions(3, n=1))
    both = jax.jit(lambda tr: (alg.apply(alg.init(jnp.ones(K)), tr, h),  # one program for both
                               ctd_lambda.update(ctd_lambda.init(jnp.ones(K)), tr, 0.1, 0.1, 0.7)))
    s, ref = both(tr)
    np.testing.assert_allclose(s.theta, ref.theta, rtol=1e-6)
    assert int(s.count) == 1


def test_ctd_lambda_runs_in_the_sweep_engine():
    from bec_jax.prediction import sweep
    from bec_jax.prediction.spec import SweepSpec
    r = sweep.run(SweepSpec(env="boyan_chain", algorithm="ctd_lambda", alpha=(0.05,), beta=(0.1,),
                            seeds=2, steps=40, log_every=20, metrics=("rmscbe",)))
    assert np.all(np.isfinite(r.mean)) and r.mean[0, 0, -1] < r.mean[0, 0, 0]


# --------------------------------------------------- pytrees, jit, vmap and grad

def mlp_v(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.dot(h, params["w2"]) + params["b2"]


@pytest.fixture(scope="module")
def mlp():
    rng = np.random.default_rng(5)
    params = {"w1": f32(rng.normal(size=(K, 8)) / 2), "b1": f32(rng.normal(size=8)),
              "w2": f32(rng.normal(size=8) / 3), "b2": jnp.float32(0.3)}
    return params, random_transitions(6, n=16)


def test_loss_gradient_is_minus_direction(mlp):
    params, trs = mlp
    tr = jax.tree.map(lambda a: a[0], trs)
    opt = optax.sgd(0.1)

    @jax.jit  # one program for every check (op by op, each would be compiled alone)
    def both(params, tr):
        g, delta = jax.grad(value_learning.centered_td_loss, argnums=1, has_aux=True)(mlp_v, params, 0.4, *tr)
        d, delta2 = value_learning.centered_td_direction(mlp_v, params, 0.4, *tr)
        td = value_learning.td_error(mlp_v, params, tr.phi, tr.reward, tr.discount, tr.phi_next)
        # to_grads + optax.sgd moves along the direction.
        up, _ = opt.update(value_learning.to_grads(d), opt.init(params), params)
        return g, delta, d, delta2, td, up

    g, delta, d, delta2, td_err, up = both(params, tr)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, -b, rtol=1e-5, atol=1e-6), g, d)
    np.testing.assert_allclose(delta, delta2, rtol=1e-6)
    np.testing.assert_allclose(delta, td_err, rtol=1e-6)
    jax.tree.map(lambda u, a: np.testing.assert_allclose(u, 0.1 * a, rtol=1e-6), up, d)


def test_batches_are_vmap_means(mlp):
    params, trs = mlp
    h = jax.tree.map(lambda a: 0.1 * jnp.ones_like(a), params)
    traces = jax.tree.map(lambda a: jnp.ones((16,) + a.shape, a.dtype), params)
    close = lambda a, b: jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), a, b)

    @functools.partial(jax.jit, compiler_options=light())  # one program (op by op, each would be compiled alone)
    def both(params, trs, h, traces):
        one = lambda f, *a, **kw: jax.vmap(lambda *t: f(mlp_v, params, *a, *t, **kw))(*trs)
        mean = lambda tree: jax.tree.map(lambda a: a.mean(0), tree)
        out = {"loss": value_learning.batch_centered_td_loss(mlp_v, params, 0.4, *trs),
               "loss_1": one(value_learning.centered_td_loss, 0.4),
               "dir": value_learning.batch_centered_td_direction(mlp_v, params, 0.4, *trs)[0],
               "dir_1": mean(one(value_learning.centered_td_direction, 0.4)[0])}
        tdc_b = value_learning.batch_centered_tdc_direction(mlp_v, params, h, 0.4, *trs)
        tdc_1 = one(value_learning.centered_tdc_direction, h, 0.4)
        out["tdc"] = (tdc_b.params, tdc_b.h, tdc_b.delta)
        out["tdc_1"] = (mean(tdc_1.params), mean(tdc_1.h), tdc_1.delta)
        lb, tb, _ = value_learning.batch_centered_td_lambda_direction(mlp_v, params, traces, 0.4, *trs, lam=0.5)
        l1, t1, _ = jax.vmap(lambda e, *t: value_learning.centered_td_lambda_direction(
            mlp_v, params, e, 0.4, *t, lam=0.5))(traces, *trs)
        out["lambda"], out["lambda_1"] = (lb, tb), (mean(l1), t1)
        # omega_update on a batch
        out["omega"] = value_learning.omega_update(value_learning.omega_init(0.1), out["loss"][1], trs.rho, 0.5).omega
        return out

    out = both(params, trs, h, traces)
    (loss, deltas), (l1, d1) = out["loss"], out["loss_1"]
    np.testing.assert_allclose(loss, l1.mean(), rtol=1e-6)
    close(deltas, d1)
    for k in ("dir", "tdc", "lambda"):
        close(out[k], out[k + "_1"])
    # omega_update on a batch: the mean of the per-example increments.
    np.testing.assert_allclose(out["omega"], 0.1 + 0.5 * np.mean(np.asarray(trs.rho) * (np.asarray(deltas) - 0.1)),
                               rtol=1e-6)


def test_nonlinear_tdc_definition(mlp):
    params, trs = mlp
    tr = jax.tree.map(lambda a: a[0], trs)
    h = jax.tree.map(lambda a: 0.1 * jnp.ones_like(a), params)
    flat = lambda t: jnp.concatenate([jnp.ravel(a) for a in jax.tree.leaves(t)])

    @jax.jit  # one program (op by op, each would be compiled alone)
    def parts(params, tr, h):
        d = value_learning.centered_tdc_direction(mlp_v, params, h, 0.4, *tr)
        return d, flat(d.params), flat(d.h), flat(jax.grad(mlp_v)(params, tr.phi)), \
            flat(jax.grad(mlp_v)(params, tr.phi_next)), flat(h)

    d, d_params, d_h, g, gn, fh = parts(params, tr, h)
    g, gn, fh = (np.asarray(a, np.float64) for a in (g, gn, fh))
    err = float(d.delta) - 0.4
    gh = np.dot(g, fh)
    rho, disc = float(tr.rho), float(tr.discount)
    np.testing.assert_allclose(d_params, rho * (err * g - disc * gh * gn), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d_h, rho * (err - gh) * g, rtol=1e-5, atol=1e-6)


def test_grad_through_update(mlp):
    """Meta-gradients: differentiate the value after one centered step w.r.t. the
    step size and omega (checked against finite differences)."""
    params, trs = mlp
    tr = jax.tree.map(lambda a: a[0], trs)

    def after(alpha, omega):
        d, _ = value_learning.centered_td_direction(mlp_v, params, omega, *tr)
        new = jax.tree.map(lambda p, u: p + alpha * u, params, d)
        return mlp_v(new, tr.phi)

    ga, go = jax.jit(jax.grad(after, argnums=(0, 1)))(0.1, 0.4)
    eps = 1e-2
    at = jax.jit(after)  # one program for the four values
    fd_a = (at(0.1 + eps, 0.4) - at(0.1 - eps, 0.4)) / (2 * eps)
    fd_o = (at(0.1, 0.4 + eps) - at(0.1, 0.4 - eps)) / (2 * eps)
    np.testing.assert_allclose(ga, fd_a, rtol=1e-2)
    np.testing.assert_allclose(go, fd_o, rtol=1e-2)


def test_vmap_over_seeds_linear(trs, theta0):
    """ctd_lambda.update and the general API vmap over a batch of states."""
    thetas = theta0[None] + jnp.arange(3.0)[:, None]
    tr = jax.tree.map(lambda a: a[0], trs)

    @jax.jit  # one program (op by op, each would be compiled alone)
    def both(thetas, tr):
        s = jax.vmap(lambda th: ctd_lambda.update(ctd_lambda.init(th), tr, ALPHA, BETA, 0.5))(thetas)
        d, _ = jax.vmap(lambda th: value_learning.centered_td_direction(linear_v, th, 0.0, *tr))(thetas)
        return s, d, ctd_lambda.update(ctd_lambda.init(thetas[1]), tr, ALPHA, BETA, 0.5)

    s, d, one = both(thetas, tr)
    assert s.theta.shape == (3, K) and d.shape == (3, K)
    np.testing.assert_allclose(s.theta[1], one.theta, rtol=1e-6)


def test_shape_checks():
    tr = jax.tree.map(lambda a: a[:2], random_transitions(9, n=2))
    with pytest.raises(AssertionError):  # a batch passed to a one-example function
        value_learning.centered_td_loss(lambda p, x: x @ p, jnp.ones(K), 0.0, *tr)
    with pytest.raises(AssertionError):  # a vector omega
        value_learning.centered_td_direction(linear_v, jnp.ones(K), jnp.zeros(2),
                                        *jax.tree.map(lambda a: a[0], tr))
    with pytest.raises(AssertionError):
        value_learning.omega_update(value_learning.omega_init(), jnp.zeros(2, jnp.int32), 1.0, 0.1)


# ------------------------------------------------------ rho = 1 off-policy = on-policy

def test_rho_one_offpolicy_equals_onpolicy():
    """On an 'off-policy' two-state model whose target equals its behaviour, the
    sampler emits rho = 1 and the off-policy updates equal the on-policy ones
    (eqs. omega, theta; textbook TD(lambda) trace z <- gamma lambda z + phi)."""
    env = envs.make("two_state", a=0.3, b=0.6, x=0.3, y=0.6)
    smp = sampling.make_sampler(env, "markov")
    lam, theta0 = 0.6, jnp.asarray(env.theta0, jnp.float32)

    def gen(c, key):
        tr, s = smp.step(key, c)
        return s, tr

    def on_policy(c, tr):  # no rho anywhere
        theta, z, omega = c
        z = tr.discount * lam * z + tr.phi  # textbook order: decay then add (constant gamma here)
        delta = tr.reward + tr.discount * jnp.dot(theta, tr.phi_next) - jnp.dot(theta, tr.phi)
        return theta + ALPHA * (delta - omega) * z, z, omega + BETA * (delta - omega)

    def general_on(c, tr):  # rho omitted: defaults to the on-policy equations
        theta, e, om = c
        d, e, delta = value_learning.centered_td_lambda_direction(
            linear_v, theta, e, om.omega, tr.phi, tr.reward, tr.discount, tr.phi_next, lam=lam)
        return theta + ALPHA * d, e, value_learning.omega_update(om, delta, 1.0, BETA)

    @functools.partial(jax.jit, compiler_options=light())  # one program for the transitions and every run
    def runs(theta0):
        _, trs = jax.lax.scan(gen, smp.init(jax.random.key(3)), jax.random.split(jax.random.key(2), 60))
        return trs, {
            "on": scan(on_policy, (theta0, jnp.zeros_like(theta0), jnp.float32(0.0)), trs),
            "off": scan(lambda s, tr: ctd_lambda.update(s, tr, ALPHA, BETA, lam), ctd_lambda.init(theta0), trs),
            "gen_on": scan(general_on, (theta0, value_learning.trace_init(theta0), value_learning.omega_init()),
                           trs),
            "ctd_off": scan(lambda s, tr: ctd.update(s, tr, ALPHA, BETA), ctd.init(theta0), trs),
            "ctd_on": scan(lambda s, tr: ctd.update(s, tr._replace(rho=jnp.float32(1.0)), ALPHA, BETA),
                           ctd.init(theta0), trs)}

    trs, r = runs(theta0)
    np.testing.assert_array_equal(trs.rho, 1.0)
    on, off = r["on"], r["off"]
    np.testing.assert_allclose(off.theta, on[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(off.omega, on[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r["gen_on"][0], on[0], rtol=1e-5, atol=1e-6)
    # CTD: off-policy eqs. with rho = 1 are the on-policy eqs. In exact arithmetic
    # identical; here two computations (rho a constant XLA folds away in one), so
    # equal to rounding: XLA may contract the remaining multiply-adds differently.
    np.testing.assert_allclose(r["ctd_off"].theta, r["ctd_on"].theta, rtol=1e-6, atol=1e-7)
    assert np.abs(np.asarray(off.theta[-1]) - np.asarray(theta0)).max() > 1e-3


# ----------------------------------------------------------------- the worked agent

@pytest.fixture(scope="module")
def agent_run():
    """`neural_agent.run(small_config())`, its one program compiled with the light options."""
    cfg = neural_agent.small_config()
    key = jax.random.key(cfg.seed)
    train = neural_agent.make_train(cfg).lower(key).compile(compiler_options=light())
    return cfg, neural_agent.summarise(cfg, np.asarray(train(key)))


def test_worked_agent_reduces_error(agent_run):
    cfg, summary = agent_run
    assert summary["steps"][-1] == cfg.steps
    for m in neural_agent.METHODS:
        res = summary["methods"][m]
        first, last = res["initial_mean"], res["final_mean"]
        assert np.isfinite(list(last.values())).all()
        assert last["centered_value_error"] < 0.7 * first["centered_value_error"], m
        assert last["rmscbe"] < 0.7 * first["rmscbe"], m
    # TD learns the constant; CTD's v_hat + omega / (1 - gamma) recovers it.
    assert summary["methods"]["td"]["final_mean"]["rmsve"] < summary["methods"]["td"]["initial_mean"]["rmsve"]
    ctd_res = summary["methods"]["ctd"]["final_mean"]
    assert ctd_res["rmsve_offset_corrected"] < 0.5 * ctd_res["rmsve"]
