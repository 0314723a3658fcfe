"""Each update function against a step computed by hand in numpy from the paper's equations."""
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bec_jax import algorithms, envs, schedules
from bec_jax.algorithms import ctd, ctdc, src, td, tdc, vrc
from bec_jax.prediction import sampling
from bec_jax.transition import Transition

K = 5
ALPHA, BETA, ZETA = 0.07, 0.3, 0.11  # all distinct
RHO, GAMMA = 2.5, 0.85


def random_transition(seed=0, rho=RHO, gamma=GAMMA):
    r = np.random.default_rng(seed)
    return dict(phi=r.normal(size=K), phi_next=r.normal(size=K), reward=float(r.normal()),
                discount=gamma, rho=rho)


def random_state(seed=1):
    r = np.random.default_rng(seed)
    return dict(theta=r.normal(size=K), u=r.normal(size=K), omega=float(r.normal()),
                rbar=float(r.normal()))


def as_transition(t, dtype=jnp.float32):
    return Transition(phi=jnp.asarray(t["phi"], dtype), reward=jnp.asarray(t["reward"], dtype),
                      discount=jnp.asarray(t["discount"], dtype),
                      phi_next=jnp.asarray(t["phi_next"], dtype), rho=jnp.asarray(t["rho"], dtype))


# ------------------------------------------------- the paper's equations in numpy

def np_delta(theta, t):
    return t["reward"] + t["discount"] * t["phi_next"] @ theta - t["phi"] @ theta


def np_td(x, t, al):
    # eq. (td(0)theta), off-policy form: theta += alpha rho delta phi
    return dict(theta=x["theta"] + al * t["rho"] * np_delta(x["theta"], t) * t["phi"])


def np_tdc(x, t, al, ze):
    # eqs. (thetavmtdc), (uvmtdc) with omega = 0, rho on both (authors' code)
    d, pu = np_delta(x["theta"], t), t["phi"] @ x["u"]
    return dict(
        theta=x["theta"] + al * t["rho"] * (d * t["phi"] - t["discount"] * t["phi_next"] * pu),
        u=x["u"] + ze * t["rho"] * (d - pu) * t["phi"])


def np_ctd(x, t, al, be):
    # eqs. (omegawithrho), (thetawithrho), both from the current omega
    d = np_delta(x["theta"], t)
    return dict(theta=x["theta"] + al * t["rho"] * (d - x["omega"]) * t["phi"],
                omega=x["omega"] + be * t["rho"] * (d - x["omega"]))


def np_ctdc(x, t, al, be, ze, rho_on_omega):
    # eqs. (thetavmtdc), (uvmtdc), (omegavmtdc); rho on theta and u, optionally on omega
    d, pu = np_delta(x["theta"], t), t["phi"] @ x["u"]
    err = d - x["omega"]
    return dict(
        theta=x["theta"] + al * t["rho"] * (err * t["phi"] - t["discount"] * t["phi_next"] * pu),
        u=x["u"] + ze * t["rho"] * (err - pu) * t["phi"],
        omega=x["omega"] + be * (t["rho"] if rho_on_omega else 1.0) * err)


def np_src(x, t, al, be):
    # eqs. (src1)-(src3): rbar tracks the reward, without rho
    dbar = np_delta(x["theta"], t) - x["rbar"]
    return dict(theta=x["theta"] + al * t["rho"] * dbar * t["phi"],
                rbar=x["rbar"] + be * (t["reward"] - x["rbar"]))


def np_vrc(x, t, al, be):
    # eqs. (rewardcentering1), (rewardcentering2)
    dbar = np_delta(x["theta"], t) - x["rbar"]
    return dict(theta=x["theta"] + al * t["rho"] * dbar * t["phi"],
                rbar=x["rbar"] + be * t["rho"] * dbar)


# name -> (module, jax update(state, tr, al, be, ze), numpy step(x, t, al, be, ze))
CASES = {
    "td": (td, lambda s, tr, a, b, z: td.update(s, tr, a),
           lambda x, t, a, b, z: np_td(x, t, a)),
    "tdc": (tdc, lambda s, tr, a, b, z: tdc.update(s, tr, a, z),
            lambda x, t, a, b, z: np_tdc(x, t, a, z)),
    "ctd": (ctd, lambda s, tr, a, b, z: ctd.update(s, tr, a, b),
            lambda x, t, a, b, z: np_ctd(x, t, a, b)),
    "ctdc": (ctdc, lambda s, tr, a, b, z: ctdc.update(s, tr, a, b, z),
             lambda x, t, a, b, z: np_ctdc(x, t, a, b, z, True)),
    "ctdc_omega_no_rho": (ctdc, lambda s, tr, a, b, z: ctdc.update(s, tr, a, b, z, rho_on_omega=False),
                     lambda x, t, a, b, z: np_ctdc(x, t, a, b, z, False)),
    "src": (src, lambda s, tr, a, b, z: src.update(s, tr, a, b),
            lambda x, t, a, b, z: np_src(x, t, a, b)),
    "vrc": (vrc, lambda s, tr, a, b, z: vrc.update(s, tr, a, b),
            lambda x, t, a, b, z: np_vrc(x, t, a, b)),
}
NAMES = list(CASES)


def make_state(name, x, count=0, dtype=jnp.float32):
    """The library's state for name, filled from the numpy dict x."""
    module = CASES[name][0]
    st = module.init(jnp.asarray(x["theta"], dtype))
    vals = {f: jnp.asarray(x[f], dtype) for f in st._fields if f not in ("count",)}
    return st._replace(count=jnp.asarray(count, jnp.int32), **vals)


def assert_state_close(st, want, rtol=2e-5, atol=2e-6):
    for f, v in want.items():
        np.testing.assert_allclose(np.asarray(getattr(st, f)), v, rtol=rtol, atol=atol, err_msg=f)


# --------------------------------------------------------------------- one step

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_update_equals_hand_step(name, seed):
    t = random_transition(seed)
    x = random_state(seed + 10)
    _, jax_update, np_step = CASES[name]
    new = jax_update(make_state(name, x, count=3), as_transition(t), ALPHA, BETA, ZETA)
    want = np_step(x, t, ALPHA, BETA, ZETA)
    assert_state_close(new, want)
    assert int(new.count) == 4
    # The step really moved every field (so the comparison is not vacuous).
    for f in want:
        assert not np.allclose(np.asarray(getattr(new, f)), x[f], atol=1e-3), f


H = {"alpha": ALPHA, "beta": BETA, "zeta": ZETA}


@pytest.mark.parametrize("name", NAMES)
def test_registry_update_uses_its_step_sizes(name):
    """`get(name).apply(state, tr, {name: value})` is the module update with the named sizes."""
    t, x = random_transition(3), random_state(4)
    alg = algorithms.get(name)
    new = alg.apply(make_state(name, x), as_transition(t), H)
    assert_state_close(new, CASES[name][2](x, t, ALPHA, BETA, ZETA))
    assert set(alg.step_sizes) <= {"alpha", "beta", "zeta"}
    # The module's own update takes exactly the declared hyperparameters by keyword.
    same = alg.update(make_state(name, x), as_transition(t), **{n: H[n] for n in alg.names})
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(same)))
    # Changing a step size the algorithm does not use changes nothing; a used one does.
    for field in ("alpha", "beta", "zeta"):
        other = alg.apply(make_state(name, x), as_transition(t), dict(H, **{field: H[field] * 3.0}))
        same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(other)))
        assert same == (field not in alg.step_sizes), field


def test_td_update_is_the_on_policy_equation_when_rho_is_one():
    t, x = random_transition(5, rho=1.0), random_state(6)
    new = td.update(td.init(jnp.asarray(x["theta"], jnp.float32)), as_transition(t), ALPHA)
    d = np_delta(x["theta"], t)
    np.testing.assert_allclose(new.theta, x["theta"] + ALPHA * d * t["phi"], rtol=2e-5, atol=2e-6)


def test_rho_zero_freezes_all_but_src_and_ctdc_omega_no_rho():
    t, x = random_transition(7, rho=0.0), random_state(8)
    for name in NAMES:
        st = make_state(name, x)
        new = CASES[name][1](st, as_transition(t), ALPHA, BETA, ZETA)
        for f in st._fields:
            if f == "count":
                continue
            moved = not np.array_equal(getattr(new, f), getattr(st, f))
            # SRC's rbar and literal CTDC's omega carry no rho.
            assert moved == ((name, f) in {("src", "rbar"), ("ctdc_omega_no_rho", "omega")}), (name, f)


def test_init_states():
    th = jnp.arange(K, dtype=jnp.float32)
    for name in NAMES:
        st = CASES[name][0].init(th)
        np.testing.assert_array_equal(st.theta, th)
        assert st.count.dtype == jnp.int32 and int(st.count) == 0
        for f in st._fields:
            if f not in ("theta", "count"):
                np.testing.assert_array_equal(getattr(st, f), 0.0)
                assert getattr(st, f).dtype == jnp.float32
    assert float(ctd.init(th, omega0=2.0).omega) == 2.0
    assert float(vrc.init(th, rbar0=-1.0).rbar) == -1.0


# --------------------------------------------------------------- schedules

SCHEDS = (optax.linear_schedule(0.2, 0.02, 50),
          optax.exponential_decay(0.5, 10, 0.5),
          schedules.robbins_monro(0.3, 10.0, 0.75))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("count", [0, 7, 40])
def test_schedule_step_size_equals_constant_at_that_count(name, count):
    t, x = random_transition(9), random_state(10)
    _, jax_update, np_step = CASES[name]
    st = make_state(name, x, count=count)
    new = jax_update(st, as_transition(t), *SCHEDS)
    consts = [float(s(count)) for s in SCHEDS]
    ref = jax_update(st, as_transition(t), *consts)
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(ref)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert_state_close(new, np_step(x, t, *consts))
    assert int(new.count) == count + 1


def test_schedule_values_by_hand():
    lin, expo, rm = SCHEDS
    assert float(lin(25)) == pytest.approx(0.2 + (0.02 - 0.2) * 25 / 50, rel=1e-6)
    assert float(expo(20)) == pytest.approx(0.5 * 0.5 ** 2, rel=1e-6)
    c = 0.3 * 10.0 ** 0.75
    assert float(rm(30)) == pytest.approx(c / (30 + 10.0) ** 0.75, rel=1e-6)
    assert float(rm(0)) == pytest.approx(0.3, rel=1e-6)


def test_schedule_is_followed_along_a_trajectory():
    """Three updates under a schedule use its values at counts 0, 1, 2."""
    sched = optax.piecewise_constant_schedule(0.1, {1: 2.0, 2: 0.25})  # 0.1, 0.2, 0.05
    x = random_state(11)
    st = make_state("ctd", x)
    want = dict(x)
    for i, lr in enumerate((0.1, 0.2, 0.05)):
        t = random_transition(20 + i)
        st = ctd.update(st, as_transition(t), sched, 0.5)
        want.update(np_ctd(want, t, lr, 0.5))
    assert int(st.count) == 3
    assert_state_close(st, {"theta": want["theta"], "omega": want["omega"]})


# ------------------------------------------------------------- jit and vmap

@pytest.mark.parametrize("name", NAMES)
def test_jit_and_vmap_over_transitions_and_step_sizes(name):
    alg = algorithms.get(name)
    B = 6
    ts = [random_transition(30 + i, rho=0.5 + i / 2) for i in range(B)]
    batch = Transition(*(jnp.stack(leaves) for leaves in zip(*(as_transition(t) for t in ts))))
    x = random_state(12)
    st = make_state(name, x)
    h = H

    over_tr = jax.jit(jax.vmap(alg.apply, in_axes=(None, 0, None)))(st, batch, h)
    hs = {"alpha": jnp.linspace(0.01, 0.1, B), "beta": jnp.linspace(0.2, 0.4, B),
          "zeta": jnp.linspace(0.05, 0.5, B)}
    over_h = jax.jit(jax.vmap(alg.apply, in_axes=(None, None, 0)))(st, as_transition(ts[0]), hs)
    jitted = jax.jit(alg.apply)(st, as_transition(ts[0]), h)
    assert_state_close(jitted, CASES[name][2](x, ts[0], ALPHA, BETA, ZETA))
    for i in range(B):
        a, b, z = (float(hs[n][i]) for n in ("alpha", "beta", "zeta"))
        assert_state_close(jax.tree.map(lambda v: v[i], over_tr), CASES[name][2](x, ts[i], ALPHA, BETA, ZETA))
        assert_state_close(jax.tree.map(lambda v: v[i], over_h), CASES[name][2](x, ts[0], a, b, z))
    np.testing.assert_array_equal(over_tr.count, np.ones(B))


def test_vmap_over_states_and_transitions_together():
    B = 4
    ts = [random_transition(40 + i) for i in range(B)]
    xs = [random_state(50 + i) for i in range(B)]
    batch = Transition(*(jnp.stack(leaves) for leaves in zip(*(as_transition(t) for t in ts))))
    sts = jax.tree.map(lambda *v: jnp.stack(v), *(make_state("ctdc", x) for x in xs))
    new = jax.jit(jax.vmap(lambda s, tr: ctdc.update(s, tr, ALPHA, BETA, ZETA)))(sts, batch)
    for i in range(B):
        assert_state_close(jax.tree.map(lambda v: v[i], new),
                           np_ctdc(xs[i], ts[i], ALPHA, BETA, ZETA, True))


def test_batched_inputs_without_vmap_are_rejected():
    """Updates are for one example: an extra batch axis is an error, not a broadcast."""
    t = as_transition(random_transition(0))
    batched = t._replace(phi=jnp.stack([t.phi, t.phi]))
    with pytest.raises(AssertionError):
        td.update(td.init(jnp.zeros(K)), batched, ALPHA)


def test_rank_promotion_is_raise():
    assert jax.config.jax_numpy_rank_promotion == "raise"
    with pytest.raises(ValueError):
        jnp.zeros(3) + jnp.zeros((2, 3))


# ----------------------------------------------------------- VRC == CTD

def test_vrc_and_ctd_give_identical_trajectories():
    """Section 3.1: value-based reward centering is off-policy CTD with omega = rbar."""
    env = envs.baird()
    sampler = sampling.make_sampler(env, "markov")
    theta0 = jnp.asarray(env.theta0, jnp.float32)
    h = {"alpha": 0.01, "beta": 0.05}

    @jax.jit
    def run(key):
        def body(carry, k):
            c, v, r, s = carry
            tr, s = sampler.step(k, s)
            c = algorithms.get("ctd").apply(c, tr, h)
            v = algorithms.get("vrc").apply(v, tr, h)
            r = algorithms.get("src").apply(r, tr, h)
            return (c, v, r, s), (c.theta, c.omega, v.theta, v.rbar, r.theta)

        k0, k1 = jax.random.split(key)
        init = (ctd.init(theta0), vrc.init(theta0), src.init(theta0), sampler.init(k0))
        return jax.lax.scan(body, init, jax.random.split(k1, 2000))[1]

    ct, co, vt, vr, st = run(jax.random.key(0))
    # Two update functions that compute the same recursion: equal to rounding, not
    # bit for bit (XLA may contract their multiply-adds differently on another CPU).
    # Any real difference in the recursion compounds over the 2000 steps far past this.
    np.testing.assert_allclose(ct, vt, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(co, vr, rtol=1e-5, atol=1e-6)
    assert np.abs(np.diff(co)).max() > 0.01  # omega really moved
    # SRC is not the same recursion: its rbar tracks the (zero) reward, not the TD error.
    assert np.abs(np.asarray(st[-1]) - np.asarray(ct[-1])).max() > 0.1


# ----------------------------------------------------------------- registry

def test_get_unknown_lists_names():
    with pytest.raises(ValueError, match="'nope'") as info:
        algorithms.get("nope")
    for name in ("td", "tdc", "ctd", "ctdc", "ctdc_omega_no_rho", "src", "vrc"):
        assert name in str(info.value)


def test_names_and_descriptors():
    assert set(algorithms.names()) >= {"td", "tdc", "ctd", "ctdc", "ctdc_omega_no_rho", "src", "vrc"}
    want = {"td": ("alpha",), "tdc": ("alpha", "zeta"), "ctd": ("alpha", "beta"),
            "ctdc": ("alpha", "beta", "zeta"), "ctdc_omega_no_rho": ("alpha", "beta", "zeta"),
            "src": ("alpha", "beta"), "vrc": ("alpha", "beta")}
    for name, sizes in want.items():
        alg = algorithms.get(name)
        assert alg.name == name and tuple(alg.step_sizes) == sizes


def test_algorithms_do_not_import_envs():
    code = ("import bec_jax.algorithms, sys; "
            "bad = [m for m in sys.modules if m.startswith('bec_jax.envs')]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------- self-description

def test_every_builtin_describes_itself():
    """Each module defines its own Algorithm: hyperparameters with ranges, the
    state field holding theta, and the paper's equations by printed number."""
    import re
    for name in algorithms.names():
        alg = algorithms.get(name)
        st = alg.init(jnp.zeros(3))
        assert hasattr(st, alg.weights) and hasattr(st, alg.counter)
        # The BEC paper's equations by printed number and label, or the paper the
        # method comes from where the BEC paper has none.
        assert (re.search(r"eqs?\. \(\d+\)", alg.equations) and "[" in alg.equations) or \
            ("no equation in the BEC paper" in alg.equations and re.search(r"\(20\d\d\)", alg.equations)), \
            (name, alg.equations)
        for h in alg.hyperparameters:
            assert h.doc and (h.default is not None or h.step_size)
    lam = algorithms.get("ctd_lambda").hyperparameter("lambda")
    assert (lam.default, lam.arg, lam.step_size, lam.range_text) == (0.5, "lambda_", False, "[0, 1]")
    with pytest.raises(ValueError, match=r"lambda: must be in \[0, 1\], got 1.5"):
        lam.check(1.5)
    with pytest.raises(ValueError, match=r"alpha: must be a step size in \(0, inf\), got 0"):
        algorithms.get("td").hyperparameter("alpha").check(0)
    with pytest.raises(ValueError, match="beta: td does not take beta"):
        algorithms.get("td").hyperparameter("beta")


def test_register_user_algorithm_and_collisions():
    from bec_jax.algorithms import Algorithm, parameter, step_size

    def init(theta0):
        return td.init(theta0)

    def update(state, tr, eta, scale=1.0):
        return td.update(state, tr, eta * scale)

    mine = Algorithm(name="test_scaled_td", init=init, update=update,
                     hyperparameters=(step_size("eta", "step size"),
                                      parameter("scale", "a factor", default=1.0, low=0.0)),
                     equations="eq. (7) [td(0)theta], scaled")
    try:
        assert algorithms.register(mine) is mine
        assert algorithms.get("test_scaled_td") is mine
        with pytest.raises(ValueError, match="already registered"):
            algorithms.register(Algorithm(name="test_scaled_td", init=init, update=update))
        with pytest.raises(ValueError, match="already registered"):
            algorithms.register(algorithms.get("td").__class__(name="td", init=init, update=update))
        t = as_transition(random_transition(2))
        st = td.init(jnp.ones(K))
        got = mine.apply(st, t, {"eta": 0.1, "scale": 2.0})
        want = td.update(st, t, 0.2)
        np.testing.assert_array_equal(got.theta, want.theta)
    finally:
        algorithms._REGISTRY.pop("test_scaled_td", None)
    with pytest.raises(ValueError, match="is a sweep field"):
        step_size("seeds", "not allowed")
    with pytest.raises(ValueError, match="hyperparameter names must be unique"):
        Algorithm(name="x", init=init, update=update,
                  hyperparameters=(step_size("eta", "a"), step_size("eta", "b")))


def test_get_module_attribute(tmp_path, monkeypatch):
    (tmp_path / "my_algs_for_test.py").write_text(
        "from bec_jax.algorithms import td, Algorithm, step_size\n"
        "MINE = Algorithm(name='mine', init=td.init, update=lambda s, tr, eta: td.update(s, tr, eta),\n"
        "                 hyperparameters=(step_size('eta', 'step size'),), equations='eq. (7) [td(0)theta]')\n"
        "NOT_ALG = 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    alg = algorithms.get("my_algs_for_test:MINE")
    assert alg.name == "mine" and alg.names == ("eta",)
    assert "mine" not in algorithms.names()  # importing does not register
    with pytest.raises(ValueError, match="not a bec_jax Algorithm"):
        algorithms.get("my_algs_for_test:NOT_ALG")
    with pytest.raises(ValueError, match="has no attribute 'NOPE'"):
        algorithms.get("my_algs_for_test:NOPE")
    with pytest.raises(ValueError, match="cannot import 'no_such_module_xyz'"):
        algorithms.get("no_such_module_xyz:X")
    assert algorithms.get(alg) is alg and algorithms.get("td") is algorithms.td.ALGORITHM


def test_old_name_resolve_says_where_it_went():
    # `resolve` (an algorithm by name) read like `resolve_step` (a step size at a count).
    with pytest.raises(AttributeError, match=r"algorithms.resolve was renamed algorithms.get \(an algorithm "
                                             r"by name\); for a step size at a count use algorithms.resolve_step"):
        algorithms.resolve("td")
    assert not hasattr(algorithms, "resolve") and "resolve" not in algorithms.__all__
    assert float(algorithms.resolve_step(lambda c: 0.5 / (c + 1), 1)) == 0.25
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        algorithms.nope


def test_renamed_algorithm_names_its_new_name():
    with pytest.raises(ValueError, match="'ctdc_literal' was renamed 'ctdc_omega_no_rho'"):
        algorithms.get("ctdc_literal")
