"""Control updates (bec_jax.control.algorithms) against steps computed by hand in
NumPy with dense feature vectors, plus ties, schedules, jit/vmap and the identity
value-based reward centering = centered Q-learning."""
import ast
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bec_jax.control import algorithms as ca
from bec_jax.control.transition import ControlTransition

D, A, M = 8, 2, 2
ALPHA, BETA, ZETA = 0.3, 0.2, 0.25
H = {"alpha": ALPHA, "beta": BETA, "zeta": ZETA}
NAMES = ["q", "cq", "gq", "cgq", "gq_authors", "cgq_authors", "rcq_simple", "rcq_value"]
AUX = {"q": (), "cq": ("omega",), "gq": ("u",), "cgq": ("u", "omega"), "gq_authors": ("u",),
       "cgq_authors": ("u", "omega"), "rcq_simple": ("rbar",), "rcq_value": ("rbar",)}


# ------------------------------------------------------------------ NumPy reference (dense)

def dense(idx, d=D):
    phi = np.zeros(d)
    np.add.at(phi, np.asarray(idx), 1.0)
    return phi


def np_step(name, x, t, al, be, ze):
    """One step of `name` from the dense linear formulas, in float64."""
    w = x["w"]
    phi = dense(t["active"], len(w))
    phin = [dense(row, len(w)) for row in t["next_active"]]
    q_next = np.array([w @ p for p in phin])
    a_star = int(np.argmax(q_next))
    r, disc, gamma = t["reward"], t["discount"], t["gamma"]
    delta = r + disc * q_next[a_star] - w @ phi
    out = {}
    if name == "q":
        out["w"] = w + al * delta * phi
    elif name == "cq":
        err = delta - x["omega"]
        out["w"] = w + al * err * phi
        out["omega"] = x["omega"] + be * err
    elif name in ("gq", "gq_authors", "cgq", "cgq_authors"):
        g = gamma if name.endswith("_authors") else disc
        err = delta - x["omega"] if name.startswith("c") else delta
        p = x["u"] @ phi
        out["w"] = w + al * (err * phi - g * p * phin[a_star])
        out["u"] = x["u"] + ze * (err - p) * phi
        if name.startswith("c"):
            out["omega"] = x["omega"] + be * err
    elif name in ("rcq_simple", "rcq_value"):
        dbar = r - x["rbar"] + disc * q_next[a_star] - w @ phi
        out["w"] = w + al * dbar * phi
        out["rbar"] = x["rbar"] + be * ((r - x["rbar"]) if name == "rcq_simple" else dbar)
    else:
        raise AssertionError(name)
    return out


# ------------------------------------------------------------------ helpers

def as_tr(t, dtype=jnp.float32):
    return ControlTransition(
        active=jnp.asarray(t["active"], jnp.int32), reward=jnp.asarray(t["reward"], dtype),
        discount=jnp.asarray(t["discount"], dtype), gamma=jnp.asarray(t["gamma"], dtype),
        next_active=jnp.asarray(t["next_active"], jnp.int32))


def make_state(name, x, count=0):
    st = ca.get(name).init(jnp.asarray(x["w"], jnp.float32))
    vals = {f: jnp.asarray(x[f], jnp.float32) for f in st._fields if f != "count"}
    return st._replace(count=jnp.asarray(count, jnp.int32), **vals)


def random_state(seed, d=D):
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(size=d), "u": rng.normal(size=d),
            "omega": float(rng.normal()), "rbar": float(rng.normal())}


def overlap_case(seed, terminal):
    """State and transition where (s, a) = {1, 5} and the greedy (s', a*) = {1, 7}
    share index 1; a* = 0 is forced by a large w[7]."""
    x = random_state(seed)
    x["w"][7] = 5.0
    t = {"active": [1, 5], "next_active": [[1, 7], [3, 4]], "reward": 0.7,
         "discount": 0.0 if terminal else 0.9, "gamma": 0.9}
    return x, t


@functools.cache
def jitted(name):
    alg = ca.get(name)
    return jax.jit(lambda s, tr, h: alg.apply(s, tr, h))


def assert_state_close(st, want, rtol=2e-5, atol=2e-6):
    for f, v in want.items():
        np.testing.assert_allclose(np.asarray(getattr(st, f)), v, rtol=rtol, atol=atol, err_msg=f)


# ------------------------------------------------------------------ one step by hand

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("terminal", [False, True])
def test_one_step_matches_hand_step(name, terminal):
    x, t = overlap_case(3, terminal)
    new = jitted(name)(make_state(name, x, count=4), as_tr(t), H)
    want = np_step(name, x, t, ALPHA, BETA, ZETA)
    assert_state_close(new, want)
    assert int(new.count) == 5
    for f in want:  # every field moved, so the comparison is not vacuous
        assert not np.allclose(np.asarray(getattr(new, f)), x[f], atol=1e-3), f
    # untouched weights stay exactly as they were
    w = np.asarray(new.w)
    touched = {1, 5} | ({7} if name in ("gq", "cgq", "gq_authors", "cgq_authors") and
                        (not terminal or name.endswith("_authors")) else set())
    for i in set(range(D)) - touched:
        assert w[i] == np.float32(x["w"][i]), i


def test_overlap_adds_both_terms_at_the_shared_index():
    x, t = overlap_case(5, False)
    new = jitted("gq")(make_state("gq", x), as_tr(t), H)
    delta = t["reward"] + 0.9 * (x["w"][1] + x["w"][7]) - (x["w"][1] + x["w"][5])
    p = x["u"][1] + x["u"][5]
    w = np.asarray(new.w)
    np.testing.assert_allclose(w[1], x["w"][1] + ALPHA * delta - ALPHA * 0.9 * p, rtol=1e-5)
    np.testing.assert_allclose(w[5], x["w"][5] + ALPHA * delta, rtol=1e-5)
    np.testing.assert_allclose(w[7], x["w"][7] - ALPHA * 0.9 * p, rtol=1e-5)


@pytest.mark.parametrize("pair", [("gq", "gq_authors"), ("cgq", "cgq_authors")])
def test_published_and_authors_forms_differ_only_at_termination(pair):
    pub, auth = pair
    for terminal in (False, True):
        x, t = overlap_case(7, terminal)
        a = jitted(pub)(make_state(pub, x), as_tr(t), H)
        b = jitted(auth)(make_state(auth, x), as_tr(t), H)
        np.testing.assert_array_equal(np.asarray(a.u), np.asarray(b.u))
        same = np.array_equal(np.asarray(a.w), np.asarray(b.w))
        assert same == (not terminal)
        if terminal:  # published: no correction at all, so w[7] is untouched
            assert np.asarray(a.w)[7] == np.float32(x["w"][7])
            p = x["u"][1] + x["u"][5]
            np.testing.assert_allclose(np.asarray(b.w)[7], x["w"][7] - ALPHA * 0.9 * p, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_random_sequence_matches_numpy(name):
    """50 random transitions (random overlaps, repeated indices, terminations)."""
    rng = np.random.default_rng(11)
    n = 50
    trs = {"active": rng.integers(0, D, (n, M)), "next_active": rng.integers(0, D, (n, A, M)),
           "reward": rng.normal(size=n), "discount": np.where(rng.random(n) < 0.2, 0.0, 0.9),
           "gamma": np.full(n, 0.9)}
    x = random_state(12)
    x = {k: (v * 0.3) for k, v in x.items()}
    st = make_state(name, x)
    step = jitted(name)
    al, be, ze = 0.1, 0.05, 0.07
    for i in range(n):
        t = {k: v[i] for k, v in trs.items()}
        st = step(st, as_tr(t), {"alpha": al, "beta": be, "zeta": ze})
        x = {**x, **np_step(name, x, t, al, be, ze)}
    assert_state_close(st, {f: x[f] for f in ("w",) + AUX[name]}, rtol=1e-4, atol=1e-5)
    assert int(st.count) == n


# ------------------------------------------------------------------ greedy target

def test_argmax_ties_go_to_the_lowest_index():
    w = jnp.zeros(D).at[jnp.array([2, 3, 4, 5])].set(jnp.array([0.25, 0.25, 1.0, 0.0]))
    # Q(s', .) = [0.5, 1.0, 1.0]: a tie between actions 1 and 2
    tr = ControlTransition(active=jnp.array([0, 1], jnp.int32), reward=jnp.float32(1.0),
                           discount=jnp.float32(0.5), gamma=jnp.float32(0.5),
                           next_active=jnp.array([[2, 3], [4, 6], [5, 4]], jnp.int32))
    delta, a_star = ca.greedy_td_error(w, tr)
    assert int(a_star) == 1
    np.testing.assert_allclose(float(delta), 1.0 + 0.5 * 1.0, rtol=1e-6)
    # all equal: action 0; Greedy-GQ's correction lands on (s', 0)'s indices only
    st = ca.gq_init(jnp.zeros(D))._replace(u=jnp.ones(D))
    tr0 = tr._replace(next_active=jnp.array([[6, 7], [2, 3], [4, 5]], jnp.int32))
    new = ca.gq_update(st, tr0, alpha=0.5, zeta=0.1)
    w_new = np.asarray(new.w)
    assert w_new[6] != 0.0 and w_new[7] != 0.0
    assert np.all(w_new[2:6] == 0.0)


# ------------------------------------------------------------------ schedules

def test_schedules_give_the_step_at_count():
    sched_a = optax.linear_schedule(0.5, 0.1, 10)
    sched_b = optax.exponential_decay(0.3, 1, 0.5)
    sched_z = optax.polynomial_schedule(0.4, 0.05, 2, 10)
    x, t = overlap_case(9, False)
    count = 3
    for name in NAMES:
        alg = ca.get(name)
        hs = {"alpha": sched_a, "beta": sched_b, "zeta": sched_z}
        got = alg.apply(make_state(name, x, count=count), as_tr(t), hs)
        fixed = {k: float(v(count)) for k, v in hs.items()}
        assert fixed["alpha"] != fixed["beta"] != fixed["zeta"]
        want = np_step(name, x, t, fixed["alpha"], fixed["beta"], fixed["zeta"])
        assert_state_close(got, want)
        assert int(got.count) == count + 1
    # and not the step at count 0
    got = ca.q_update(make_state("q", x, count=count), as_tr(t), alpha=sched_a)
    wrong = np_step("q", x, t, float(sched_a(0)), 0, 0)
    assert not np.allclose(np.asarray(got.w), wrong["w"], atol=1e-3)


# ------------------------------------------------------------------ jit and vmap

@pytest.mark.parametrize("name", NAMES)
def test_vmap_equals_per_example_loop(name):
    rng = np.random.default_rng(21)
    B = 5
    xs = [random_state(100 + i) for i in range(B)]
    ts = [{"active": rng.integers(0, D, M), "next_active": rng.integers(0, D, (A, M)),
           "reward": float(rng.normal()), "discount": [0.0, 0.9][i % 2], "gamma": 0.9}
          for i in range(B)]
    states = [make_state(name, x, count=i) for i, x in enumerate(xs)]
    trs = [as_tr(t) for t in ts]
    stack = lambda items: jax.tree.map(lambda *a: jnp.stack(a), *items)
    alg = ca.get(name)
    batched = jax.jit(jax.vmap(lambda s, tr: alg.apply(s, tr, H)))(stack(states), stack(trs))
    for i in range(B):
        one = jitted(name)(states[i], trs[i], H)
        for f in one._fields:
            np.testing.assert_allclose(np.asarray(getattr(batched, f))[i], np.asarray(getattr(one, f)),
                                       rtol=1e-6, atol=1e-7, err_msg=f)
        assert_state_close(one, np_step(name, xs[i], ts[i], ALPHA, BETA, ZETA))


# ------------------------------------------------------------------ value-based reward centering = CQ

def test_rcq_value_is_cq_over_200_steps():
    rng = np.random.default_rng(31)
    n, d = 200, 12
    trs = ControlTransition(
        active=jnp.asarray(rng.integers(0, d, (n, 3)), jnp.int32),
        reward=jnp.asarray(rng.normal(size=n) - 1.0, jnp.float32),
        discount=jnp.asarray(np.where(rng.random(n) < 0.1, 0.0, 0.95), jnp.float32),
        gamma=jnp.full(n, 0.95, jnp.float32),
        next_active=jnp.asarray(rng.integers(0, d, (n, 4, 3)), jnp.int32))
    w0 = jnp.asarray(rng.normal(size=d), jnp.float32)

    def run(update, state):
        return jax.lax.scan(lambda s, tr: (update(s, tr, 0.1, 0.05), None), state, trs)[0]

    cq = jax.jit(lambda: run(ca.cq_update, ca.cq_init(w0)))()
    rv = jax.jit(lambda: run(ca.rcq_value_update, ca.rcq_init(w0)))()
    np.testing.assert_array_max_ulp(np.asarray(rv.w), np.asarray(cq.w), maxulp=1)
    np.testing.assert_array_max_ulp(np.asarray(rv.rbar), np.asarray(cq.omega), maxulp=1)
    assert abs(float(cq.omega)) > 1e-3 and not np.allclose(np.asarray(cq.w), np.asarray(w0))
    # and simple centering is not the same algorithm
    rs = jax.jit(lambda: run(ca.rcq_simple_update, ca.rcq_init(w0)))()
    assert not np.allclose(np.asarray(rs.w), np.asarray(cq.w), atol=1e-3)


# ------------------------------------------------------------------ registry and descriptors

def test_registry_order_and_descriptors():
    assert ca.names() == NAMES == list(ca.ALGORITHMS)
    for name in NAMES:
        alg = ca.get(name)
        assert alg.name == name and alg.weights == "w" and alg.counter == "count" and alg.equations
        order = [h for h in ("alpha", "beta", "zeta") if h in alg.names]
        assert list(alg.names) == order and alg.names[0] == "alpha"
        assert set(alg.names) - {"alpha"} == {{"omega": "beta", "u": "zeta", "rbar": "beta"}[f]
                                              for f in AUX[name]}
        st = alg.init(jnp.zeros(D, jnp.float32))
        assert st._fields == ("w",) + AUX[name] + ("count",)
        assert st.count.dtype == jnp.int32 and st.count.shape == ()
        for f in AUX[name]:
            v = getattr(st, f)
            assert v.dtype == jnp.float32 and not np.any(np.asarray(v))
            assert v.shape == ((D,) if f == "u" else ())


def test_get_unknown_name_raises():
    with pytest.raises(ValueError, match="algorithm") as e:
        ca.get("sarsa")
    assert "cgq_authors" in str(e.value)
    with pytest.raises(ValueError, match="algorithm"):
        ca.get(3)


def test_shape_checks():
    x, t = overlap_case(1, False)
    tr = as_tr(t)
    with pytest.raises(AssertionError):
        ca.q_update(make_state("q", x), tr._replace(active=tr.active[None]), alpha=0.1)
    with pytest.raises(AssertionError):
        ca.q_update(make_state("q", x), tr._replace(next_active=tr.next_active[:, :1]), alpha=0.1)
    with pytest.raises(AssertionError):
        ca.q_update(make_state("q", x), tr._replace(reward=tr.reward[None]), alpha=0.1)


def test_module_imports_no_task_code():
    src = pathlib.Path(ca.__file__).read_text()
    mods = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ImportFrom):
            mods.add(node.module)
        elif isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
    # bec_jax.algorithms for import_attribute (package.module:attribute references).
    assert mods <= {"__future__", "typing", "chex", "jax", "jax.numpy", "bec_jax.algorithms",
                    "bec_jax.algorithms.base", "bec_jax.control.transition"}, mods


# ------------------------------------------------------------------ discovery and registration

def test_every_module_level_algorithm_is_registered_in_definition_order():
    # Read from the source, not from the registry: an Algorithm defined in the
    # module is registered without being added to any list.
    tree = ast.parse(pathlib.Path(ca.__file__).read_text())
    defined = [n.targets[0].id for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
               and getattr(n.value.func, "id", "") == "Algorithm"]
    assert len(defined) == len(NAMES)
    assert [getattr(ca, v).name for v in defined] == ca.names()


def test_register_get_and_module_attribute(tmp_path, monkeypatch):
    import dataclasses

    from bec_jax.control import sweep
    from bec_jax.control.spec import ControlSpec
    mine = dataclasses.replace(ca.Q, name="q_copy_test", label="Q (a copy)")
    try:
        assert ca.register(mine) is mine and ca.names() == NAMES + ["q_copy_test"]
        assert ca.get("q_copy_test") is mine and ca.get(mine) is mine
        with pytest.raises(ValueError, match="'q' is already registered"):
            ca.register(dataclasses.replace(ca.Q, label="another Q"))
        # A registered algorithm runs as its original does, bit for bit.
        kw = dict(task="cliff_walking", hyperparameters={"alpha": [0.1]}, seeds=2, episodes=5)
        a = sweep.run(ControlSpec(algorithm="q_copy_test", **kw), progress=False)
        b = sweep.run(ControlSpec(algorithm="q", **kw), progress=False)
        np.testing.assert_array_equal(a.lengths, b.lengths)
        np.testing.assert_array_equal(a.returns, b.returns)
    finally:
        ca.ALGORITHMS.pop("q_copy_test", None)
    assert ca.names() == NAMES
    (tmp_path / "my_control_algs.py").write_text(
        "import dataclasses\nfrom bec_jax.control import algorithms as ca\n"
        "MINE = dataclasses.replace(ca.CQ, name='cq_mine')\nNOT_ONE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert ca.get("my_control_algs:MINE").name == "cq_mine" and "cq_mine" not in ca.names()
    with pytest.raises(ValueError, match="is a int, not a bec_jax Algorithm"):
        ca.get("my_control_algs:NOT_ONE")
    with pytest.raises(ValueError, match="has no attribute 'NOPE'"):
        ca.get("my_control_algs:NOPE")
