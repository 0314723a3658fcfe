"""Feature kinds of control (bec_jax.control.transition, bec_jax.control.features)
against dense NumPy steps: sparse binary indices and dense vectors give the
updates of Q, CQ, GQ and CGQ written as the dense linear formulas."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax.control import algorithms as ca
from bec_jax.control import transition
from bec_jax.control.transition import ControlTransition

D, A = 9, 3
H = {"alpha": 0.3, "beta": 0.2, "zeta": 0.25}
NAMES = ["q", "cq", "gq", "cgq", "gq_authors", "cgq_authors", "rcq_simple", "rcq_value"]
AUX = {"q": (), "cq": ("omega",), "gq": ("u",), "cgq": ("u", "omega"), "gq_authors": ("u",),
       "cgq_authors": ("u", "omega"), "rcq_simple": ("rbar",), "rcq_value": ("rbar",)}


# ------------------------------------------------------------------ the dense NumPy step

def np_step(name, x, phi, phin, r, disc, gamma, h):
    """One step of `name` in float64 from dense phi(s, a) (d,) and phi(s', .) (A, d),
    as the papers write them (no index anywhere)."""
    w = x["w"]
    q_next = phin @ w
    a_star = int(np.argmax(q_next))
    delta = r + disc * q_next[a_star] - w @ phi
    out = {}
    al, be, ze = h["alpha"], h["beta"], h["zeta"]
    if name == "q":
        out["w"] = w + al * delta * phi
    elif name == "cq":
        err = delta - x["omega"]
        out["w"], out["omega"] = w + al * err * phi, x["omega"] + be * err
    elif name in ("gq", "gq_authors", "cgq", "cgq_authors"):
        g = gamma if name.endswith("_authors") else disc
        err = delta - x["omega"] if name.startswith("c") else delta
        p = x["u"] @ phi
        out["w"] = w + al * (err * phi - g * p * phin[a_star])
        out["u"] = x["u"] + ze * (err - p) * phi
        if name.startswith("c"):
            out["omega"] = x["omega"] + be * err
    else:
        dbar = delta - x["rbar"]
        out["w"] = w + al * dbar * phi
        out["rbar"] = x["rbar"] + be * ((r - x["rbar"]) if name == "rcq_simple" else dbar)
    return out


def one_hot_sum(idx, d=D):
    phi = np.zeros(d)
    np.add.at(phi, np.asarray(idx), 1.0)
    return phi


@functools.cache
def jitted(name):
    alg = ca.get(name)
    return jax.jit(lambda s, tr, h: alg.apply(s, tr, h))


def make_state(name, x):
    st = ca.get(name).init(jnp.asarray(x["w"], jnp.float32))
    return st._replace(**{f: jnp.asarray(x[f], jnp.float32) for f in st._fields if f != "count"})


def random_state(rng):
    return {"w": rng.normal(size=D) * 0.5, "u": rng.normal(size=D) * 0.5, "omega": float(rng.normal()),
            "rbar": float(rng.normal())}


def run_sequence(name, kind, n=30, seed=0):
    """n random transitions through the jitted update and the NumPy step; returns
    (jax state, numpy state)."""
    rng = np.random.default_rng(seed)
    x = random_state(rng)
    st = make_state(name, x)
    for i in range(n):
        r, disc = float(rng.normal()), (0.0 if i % 7 == 3 else 0.9)
        if kind == "sparse":  # 2 active indices per (s, a), overlaps and repeats allowed
            idx, nidx = rng.integers(0, D, 2), rng.integers(0, D, (A, 2))
            phi, phin = one_hot_sum(idx), np.stack([one_hot_sum(row) for row in nidx])
            f, fn = jnp.asarray(idx, jnp.int32), jnp.asarray(nidx, jnp.int32)
        else:
            phi, phin = rng.normal(size=D), rng.normal(size=(A, D))
            f, fn = jnp.asarray(phi, jnp.float32), jnp.asarray(phin, jnp.float32)
            phi, phin = np.asarray(f, np.float64), np.asarray(fn, np.float64)
        tr = ControlTransition(active=f, reward=jnp.float32(r), discount=jnp.float32(disc),
                               gamma=jnp.float32(0.9), next_active=fn)
        st = jitted(name)(st, tr, H)
        x = {**x, **np_step(name, x, phi, phin, np.float32(r), np.float32(disc), np.float32(0.9), H)}
    return st, x


@pytest.mark.parametrize("kind", ["sparse", "dense"])
@pytest.mark.parametrize("name", NAMES)
def test_updates_match_the_dense_numpy_step(name, kind):
    st, x = run_sequence(name, kind, seed=NAMES.index(name))
    # float32 updates against float64 NumPy over 30 steps: rounding only.
    for f in ("w",) + AUX[name]:
        np.testing.assert_allclose(np.asarray(getattr(st, f)), x[f], rtol=2e-4, atol=2e-5, err_msg=f)
    assert not np.allclose(np.asarray(st.w), random_state(np.random.default_rng(NAMES.index(name)))["w"],
                           atol=1e-2)


def test_dense_one_hot_equals_sparse_indices():
    """Dense one-hot vectors and their indices are the same features: the same
    GQ step, up to the order of float32 additions."""
    rng = np.random.default_rng(5)
    x = random_state(rng)
    idx, nidx = np.array([1, 4]), np.array([[2, 4], [0, 8], [3, 3]])
    kw = dict(reward=jnp.float32(0.5), discount=jnp.float32(0.9), gamma=jnp.float32(0.9))
    sparse = ControlTransition(active=jnp.asarray(idx, jnp.int32), next_active=jnp.asarray(nidx, jnp.int32), **kw)
    dense = ControlTransition(active=jnp.asarray(one_hot_sum(idx), jnp.float32),
                              next_active=jnp.asarray(np.stack([one_hot_sum(r) for r in nidx]), jnp.float32), **kw)
    for name in ("gq", "cgq"):
        a, b = jitted(name)(make_state(name, x), sparse, H), jitted(name)(make_state(name, x), dense, H)
        for f in ("w", "u"):
            np.testing.assert_allclose(np.asarray(a._asdict()[f]), np.asarray(b._asdict()[f]), rtol=1e-6, atol=1e-6)


def test_q_values_and_add_by_hand():
    w = jnp.asarray([1.0, 2.0, 4.0, 8.0], jnp.float32)
    np.testing.assert_array_equal(transition.q_values(w, jnp.asarray([[0, 2], [3, 3]], jnp.int32)), [5.0, 16.0])
    np.testing.assert_array_equal(transition.q_values(w, jnp.asarray([0.5, 0.0, 0.25, 1.0], jnp.float32)), 9.5)
    np.testing.assert_array_equal(transition.add(w, jnp.asarray([1, 1], jnp.int32), 0.5), [1.0, 3.0, 4.0, 8.0])
    np.testing.assert_array_equal(transition.add(w, jnp.asarray([2.0, 0.0, 0.0, -1.0], jnp.float32), 0.5),
                                  [2.0, 2.0, 4.0, 7.5])
    # dense features of another float dtype are used in w's dtype (the scan's carry keeps its type)
    assert transition.add(w, jnp.ones(4, jnp.float16), 1.0).dtype == jnp.float32
    assert transition.is_sparse(jnp.zeros(2, jnp.int32)) and not transition.is_sparse(jnp.zeros(2))


def test_shape_checks_of_dense_features():
    st = ca.q_init(jnp.zeros(D))
    tr = ControlTransition(active=jnp.zeros(D), reward=jnp.float32(0), discount=jnp.float32(0.9),
                           gamma=jnp.float32(0.9), next_active=jnp.zeros((A, D)))
    ca.q_update(st, tr, alpha=0.1)
    with pytest.raises(AssertionError):  # a dense vector must have the weights' length
        ca.q_update(st, tr._replace(active=jnp.zeros(D - 1), next_active=jnp.zeros((A, D - 1))), alpha=0.1)
    with pytest.raises(AssertionError):  # one kind for (s, a) and (s', .)
        ca.q_update(st, tr._replace(next_active=jnp.zeros((A, D), jnp.int32)), alpha=0.1)
