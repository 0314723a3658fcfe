"""The continuing learners (bec_jax.control.continuing.learners): each update
against one step worked out by hand on a tiny one-hot example, value-based
reward centering = CQ run for run, differential Q-learning ignoring gamma, the
unbiased step size forgetting rbar's initial value, under jit and vmap."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax.control.continuing import learners as cl
from bec_jax.control.transition import ControlTransition

NAMES = ["q", "q_src", "q_vrc", "q_src_unbiased", "q_vrc_unbiased", "cq", "cgq", "diff_q", "rvi_q"]


def tr_of(active, next_active, reward, gamma):
    g = jnp.float32(gamma)
    return ControlTransition(active=jnp.asarray(active, jnp.int32), reward=jnp.float32(reward),
                             discount=g, gamma=g, next_active=jnp.asarray(next_active, jnp.int32))


@functools.cache
def jitted(name):
    alg = cl.get(name)
    return jax.jit(lambda s, tr, h: alg.apply(s, tr, h))


def start(name, w, **fields):
    st = cl.get(name).init(jnp.asarray(w, jnp.float32))
    return st._replace(**{k: jnp.float32(v) for k, v in fields.items()})


# ------------------------------------------------------------------ one step by hand

# Three states x two actions, one-hot: weight i is Q of pair i. (s, a) = pair 1,
# Q(s', .) = (w[2], w[3]) = (0.5, -1), so max Q(s') = 0.5; the weights sum to 6
# (mean 1). r = 1, gamma = 0.5, alpha = 0.5, eta = 0.5 (beta = 0.25), rbar = 0.25:
#   delta = 1 + 0.5 * 0.5 - 2 = -0.75
W0 = [1.0, 2.0, 0.5, -1.0, 3.0, 0.5]
TR = dict(active=[1], next_active=[[2], [3]], reward=1.0, gamma=0.5)
H = {"alpha": 0.5, "eta": 0.5, "beta": 0.25}
HAND = [
    # q: w1 = 2 + 0.5 (-0.75)
    ("q", {}, {"w1": 1.625}),
    # q_src: delta - rbar = -1; w1 = 2 - 0.5; rbar = 0.25 + 0.25 (1 - 0.25)
    ("q_src", {"rbar": 0.25}, {"w1": 1.5, "rbar": 0.4375}),
    # q_vrc: w1 = 2 - 0.5; rbar = 0.25 + 0.25 (-1)
    ("q_vrc", {"rbar": 0.25}, {"w1": 1.5, "rbar": 0.0}),
    # cq at beta = 0.25 = eta alpha: the same numbers as q_vrc, omega for rbar
    ("cq", {"omega": 0.25}, {"w1": 1.5, "omega": 0.0}),
    # diff_q, no discount: delta_d = 1 - 0.25 + 0.5 - 2 = -0.75; w1 = 2 - 0.375;
    # rbar = 0.25 + 0.25 (-0.75)
    ("diff_q", {"rbar": 0.25}, {"w1": 1.625, "rbar": 0.0625}),
    # rvi_q: f = mean(w) = 1; delta = 1 - 1 + 0.5 - 2 = -1.5; w1 = 2 - 0.75
    ("rvi_q", {}, {"w1": 1.25, "rbar": 1.0}),
    # unbiased, first step (o = 0): o' = 0.25, beta = 0.25 / 0.25 = 1;
    # value-based: rbar' = 0.25 + (-0.75 - 0.25) = -0.75; w1 = 2 + 0.5 (-0.75 + 0.75)
    ("q_vrc_unbiased", {"rbar": 0.25}, {"w1": 2.0, "rbar": -0.75, "o": 0.25}),
    # simple: rbar' = 0.25 + (1 - 0.25) = 1; w1 = 2 + 0.5 (-0.75 - 1)
    ("q_src_unbiased", {"rbar": 0.25}, {"w1": 1.125, "rbar": 1.0, "o": 0.25}),
    # later step (o = 0.25): o' = 0.25 + 0.25 * 0.75 = 0.4375, beta = 0.25 / 0.4375 = 4/7;
    # value-based: rbar' = 0.25 - 4/7; w1 = 2 + 0.5 (-0.75 - rbar')
    ("q_vrc_unbiased", {"rbar": 0.25, "o": 0.25},
     {"w1": 2 + 0.5 * (-0.75 - (0.25 - 4 / 7)), "rbar": 0.25 - 4 / 7, "o": 0.4375}),
    # simple: rbar' = 0.25 + (4/7) 0.75; w1 = 2 + 0.5 (-0.75 - rbar')
    ("q_src_unbiased", {"rbar": 0.25, "o": 0.25},
     {"w1": 2 + 0.5 * (-0.75 - (0.25 + 3 / 7)), "rbar": 0.25 + 3 / 7, "o": 0.4375}),
]


@pytest.mark.parametrize("name,fields,want", HAND, ids=[f"{c[0]}-{i}" for i, c in enumerate(HAND)])
def test_one_step_by_hand(name, fields, want):
    new = jitted(name)(start(name, W0, **fields), tr_of(**TR), H)
    w = np.asarray(new.w)
    np.testing.assert_allclose(w[1], want["w1"], rtol=1e-6)
    untouched = [i for i in range(6) if i != 1]
    np.testing.assert_array_equal(w[untouched], np.float32(W0)[untouched])
    for f, v in want.items():
        if f != "w1":
            np.testing.assert_allclose(float(getattr(new, f)), v, rtol=1e-6, atol=1e-7, err_msg=f)
    assert int(new.count) == 1


DEEP = ["dqn", "cdqn", "cdqn_unbiased", "cdqn_simple", "cdqn_simple_unbiased", "diff_dqn"]


def test_every_learner_is_registered_with_its_rate_field():
    assert cl.names() == NAMES + DEEP  # the network learners (control.continuing.deep) after the linear ones
    assert [cl.rate_field(n) for n in DEEP] == [None] + ["rbar"] * 5
    for name in NAMES:
        field = cl.rate_field(name)
        st = cl.get(name).init(jnp.zeros(4))
        assert field is None or field in st._fields, name
    assert cl.rate_field("q") is None and cl.rate_field("cq") == "omega"
    assert cl.get("bec_jax.control.continuing.learners:DIFF_Q") is cl.DIFF_Q
    with pytest.raises(ValueError, match="q_vrc"):
        cl.get("nope")


def test_eta_zero_is_allowed_and_eta_is_required():
    traced, _ = cl.Q_VRC.resolve_hyperparameters({"alpha": 0.1, "eta": 0.0})
    assert traced == {"alpha": 0.1, "eta": 0.0}
    with pytest.raises(ValueError, match="eta"):
        cl.Q_VRC.resolve_hyperparameters({"alpha": 0.1, "eta": -1.0})
    with pytest.raises(ValueError, match="eta"):
        cl.Q_VRC.resolve_hyperparameters({"alpha": 0.1})


# ------------------------------------------------------------------ random streams

D, A, M, T = 12, 3, 2, 200


def stream(seed, T=T):
    """T transitions with M = 2 active indices per (s, a) out of D (tile-coding-like,
    indices may repeat), rewards with an offset, gamma in (0, 1]."""
    rng = np.random.default_rng(seed)
    g = rng.choice([0.5, 0.9, 0.99, 1.0], size=T).astype(np.float32)
    return ControlTransition(
        active=jnp.asarray(rng.integers(0, D, (T, M)), jnp.int32),
        reward=jnp.asarray(rng.normal(4.0, 1.0, T), jnp.float32),
        discount=jnp.asarray(g), gamma=jnp.asarray(g),
        next_active=jnp.asarray(rng.integers(0, D, (T, A, M)), jnp.int32))


@functools.partial(jax.jit, static_argnums=0)
def run(name, w0, trs, h):
    """Every state along a run of `name` over the stream `trs`."""
    alg = cl.get(name)

    def step(s, tr):
        s = alg.apply(s, tr, h)
        return s, s
    return jax.lax.scan(step, alg.init(w0), trs)[1]


def w_start(seed):
    return jnp.asarray(np.random.default_rng(seed).normal(size=D), jnp.float32)


@pytest.mark.parametrize("alpha,eta", [(0.1, 0.3), (2.0 ** -4, 2.0 ** -2), (0.37, 0.011)])
def test_value_based_centering_is_cq_bit_for_bit(alpha, eta):
    trs = stream(1)
    w0 = w_start(2)
    a, e = np.float32(alpha), np.float32(eta)
    # beta as the float32 product q_vrc forms: then every operation is the same
    vrc = run("q_vrc", w0, trs, {"alpha": a, "eta": e})
    cq = run("cq", w0, trs, {"alpha": a, "beta": a * e})
    np.testing.assert_array_equal(np.asarray(vrc.w), np.asarray(cq.w))
    np.testing.assert_array_equal(np.asarray(vrc.rbar), np.asarray(cq.omega))
    assert np.isfinite(np.asarray(vrc.w)).all()
    assert not np.array_equal(np.asarray(vrc.rbar)[-1], 0.0)


def test_value_based_centering_is_cq_under_vmap_over_a_grid():
    trs, w0 = stream(3), w_start(4)
    alphas = jnp.asarray([0.05, 0.1, 0.2], jnp.float32)
    etas = jnp.asarray([0.0, 0.5, 1.0], jnp.float32)
    vrc = jax.vmap(lambda a, e: run("q_vrc", w0, trs, {"alpha": a, "eta": e}))(alphas, etas)
    cq = jax.vmap(lambda a, b: run("cq", w0, trs, {"alpha": a, "beta": b}))(alphas, alphas * etas)
    np.testing.assert_array_equal(np.asarray(vrc.w), np.asarray(cq.w))
    np.testing.assert_array_equal(np.asarray(vrc.rbar), np.asarray(cq.omega))
    # the vmapped run equals the single run, member by member
    one = run("q_vrc", w0, trs, {"alpha": alphas[1], "eta": etas[1]})
    np.testing.assert_array_equal(np.asarray(vrc.w[1]), np.asarray(one.w))


def test_diff_q_ignores_gamma_and_is_value_based_centering_at_gamma_one():
    trs, w0 = stream(5), w_start(6)
    h = {"alpha": np.float32(0.1), "eta": np.float32(0.25)}
    base = run("diff_q", w0, trs, h)
    for g in (0.0, 0.5, 0.99):
        other = trs._replace(discount=jnp.full(T, g, jnp.float32), gamma=jnp.full(T, g, jnp.float32))
        np.testing.assert_array_equal(np.asarray(run("diff_q", w0, other, h).w), np.asarray(base.w))
    ones = trs._replace(discount=jnp.ones(T, jnp.float32), gamma=jnp.ones(T, jnp.float32))
    vrc = run("q_vrc", w0, ones, h)
    np.testing.assert_array_equal(np.asarray(vrc.w), np.asarray(base.w))
    np.testing.assert_array_equal(np.asarray(vrc.rbar), np.asarray(base.rbar))
    # while q_vrc does see gamma
    assert not np.array_equal(np.asarray(run("q_vrc", w0, trs, h).w), np.asarray(base.w))


def test_rvi_q_ignores_gamma_and_its_reference_shifts_with_q():
    trs, w0 = stream(7), w_start(8)
    h = {"alpha": np.float32(0.05)}
    base = run("rvi_q", w0, trs, h)
    other = trs._replace(discount=jnp.zeros(T, jnp.float32), gamma=jnp.zeros(T, jnp.float32))
    np.testing.assert_array_equal(np.asarray(run("rvi_q", w0, other, h).w), np.asarray(base.w))
    # f(Q + c) = f(Q) + c: adding c to every Q(s, a) is adding c / M to every weight
    active = trs.active[0]
    f = cl.reference_value(w0, active)
    np.testing.assert_allclose(float(cl.reference_value(w0 + 3.0 / M, active)), float(f) + 3.0, rtol=1e-6)
    dense = ControlTransition(active=jnp.ones(D), reward=jnp.float32(0), discount=jnp.float32(1),
                              gamma=jnp.float32(1), next_active=jnp.ones((A, D)))
    with pytest.raises(ValueError, match="sparse"):
        cl.RVI_Q.apply(cl.RVI_Q.init(w0), dense, h)


@pytest.mark.parametrize("name", ["q_vrc_unbiased", "q_src_unbiased"])
def test_unbiased_step_size_forgets_the_initial_rbar(name):
    trs, w0 = stream(9, T=50), w_start(10)
    alg = cl.get(name)
    h = {"alpha": np.float32(0.1), "eta": np.float32(0.5)}

    @jax.jit
    @jax.vmap
    def from_rbar(rbar0):
        def step(s, tr):
            s = alg.apply(s, tr, h)
            return s, s
        return jax.lax.scan(step, alg.init(w0)._replace(rbar=rbar0), trs)[1]

    runs = from_rbar(jnp.asarray([-100.0, 0.0, 7.5], jnp.float32))
    # after the first step o = beta0 = eta alpha, so beta = 1 and rbar took its first value fully
    np.testing.assert_allclose(np.asarray(runs.o[:, 0]), 0.05, rtol=1e-6)
    for f in ("w", "rbar", "o"):
        got = np.asarray(getattr(runs, f))
        np.testing.assert_array_equal(got[0], got[1], err_msg=f)
        np.testing.assert_array_equal(got[2], got[1], err_msg=f)
    # the biased form remembers it (the worked example's step, from two rbar0)
    one = [jitted(name.replace("_unbiased", ""))(start("q_vrc", W0, rbar=r0), tr_of(**TR), H)
           for r0 in (0.0, 7.5)]
    assert float(one[0].rbar) != float(one[1].rbar)


def test_unbiased_at_eta_zero_is_q_learning():
    trs, w0 = stream(11), w_start(12)
    a = np.float32(0.1)
    unb = run("q_vrc_unbiased", w0, trs, {"alpha": a, "eta": np.float32(0.0)})
    q = run("q", w0, trs, {"alpha": a})
    assert np.isfinite(np.asarray(unb.rbar)).all()
    np.testing.assert_array_equal(np.asarray(unb.rbar), 0.0)
    np.testing.assert_array_equal(np.asarray(unb.w), np.asarray(q.w))


def test_every_learner_runs_under_vmap_over_a_grid():
    trs, w0 = stream(13), w_start(14)

    @jax.jit
    def all_learners(trs):  # one program for all eight: one compilation
        out = {}
        for name in NAMES:
            alg = cl.get(name)
            grid = {n: jnp.asarray([0.05, 0.2], jnp.float32) for n in alg.names}
            out[name] = jax.vmap(lambda h, alg=alg: jax.lax.scan(
                lambda s, tr: (alg.apply(s, tr, h),) * 2, alg.init(w0), trs)[1])(grid)
        return out

    for name, out in all_learners(trs).items():
        assert out.w.shape == (2, T, D), name
        assert np.isfinite(np.asarray(out.w)).all(), name
        assert not np.array_equal(np.asarray(out.w[0]), np.asarray(out.w[1])), name
        field = cl.rate_field(name)
        if field is not None:
            assert getattr(out, field).shape == (2, T), name
