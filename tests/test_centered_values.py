"""Centered value targets (`bec_jax.agents.targets`) against rlax and hand values,
the episodic `terminal_t` closed form, and the `omega_update` guard/mask."""
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax.agents import targets as cv
from bec_jax.agents import value_learning

TOL = {"rtol": 1e-5, "atol": 1e-5}


# ------------------------------------------------------------------ helpers

def random_traj(seed, b, t, p_term=0.2, gamma=None):
    """B trajectories of length T: rewards, discounts (0 at some steps, else 0.9
    or `gamma`), values (T,), values (T+1,), rho, lambda (T,), terminal flags.
    Drawn by NumPy: jax.random's programs would be compiled for every shape."""
    rng = np.random.default_rng(seed)
    term = rng.uniform(size=(b, t)) < p_term
    g = 0.9 if gamma is None else gamma
    disc = np.where(term, 0.0, g)
    if gamma is None:  # non-constant discounts when no closed form is needed
        disc = disc * rng.uniform(0.5, 1.0, (b, t))
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    return {
        "r": f32(rng.normal(size=(b, t))),
        "disc": f32(disc),
        "v": f32(rng.normal(size=(b, t))),
        "values": f32(rng.normal(size=(b, t + 1))),
        "rho": f32(rng.uniform(0.1, 3.0, (b, t))),
        "lam": f32(rng.uniform(size=(b, t))),
        "term": jnp.asarray(term),
    }


OMEGA = jnp.float32(0.7)


# ------------------------------------------------------------ against rlax

@pytest.mark.parametrize("t", [1, 17])  # one step, and a scan of several
def test_matches_rlax_jit_vmap(t):
    """Each function, jitted and vmapped over 5 trajectories, against rlax on the
    reward r - omega (omega a scalar shared by the batch)."""
    rlax = pytest.importorskip("rlax")
    d = random_traj(t, 5, t)
    B = jax.vmap
    vtrace_cfgs = ((1.0, 1.0, 1.0), (0.9, 2.0, 0.5))

    @jax.jit
    def both(d, omega):
        vtm1, vt = d["values"][:, :-1], d["values"][:, 1:]
        r, dc, v, lam, rho = d["r"], d["disc"], d["v"], d["lam"], d["rho"]
        rc = r - omega
        out = {}
        # TD(0): scalars, vmap over the B*T transitions.
        flat = [x.ravel() for x in (vtm1, r, dc, vt)]
        out["td"] = (B(cv.centered_td_learning, (0, 0, 0, 0, None))(*flat, omega),
                     B(rlax.td_learning)(flat[0], flat[1] - omega, flat[2], flat[3]))
        out["lambda 0.8"] = (B(cv.centered_lambda_returns, (0, 0, 0, None, None))(r, dc, v, omega, 0.8),
                             B(rlax.lambda_returns, (0, 0, 0, None))(rc, dc, v, 0.8))
        out["lambda (T,)"] = (B(cv.centered_lambda_returns, (0, 0, 0, None, 0))(r, dc, v, omega, lam),
                              B(rlax.lambda_returns)(rc, dc, v, lam))
        gae = B(cv.centered_truncated_generalized_advantage_estimation, (0, 0, 0, 0, None))(
            r, dc, lam, d["values"], omega)
        out["gae"] = (gae.advantages,
                      B(rlax.truncated_generalized_advantage_estimation)(rc, dc, lam, d["values"]))
        out["gae td_errors"] = (gae.td_errors, r + dc * vt - vtm1)
        for cfg in vtrace_cfgs:
            ours = B(cv.centered_vtrace_td_error_and_advantage,
                     (0, 0, 0, 0, 0, None, None, None, None))(vtm1, vt, r, dc, rho, omega, *cfg)
            ref = B(rlax.vtrace_td_error_and_advantage, (0, 0, 0, 0, 0, None, None, None))(
                vtm1, vt, rc, dc, rho, *cfg)
            assert type(ours)._fields == type(ref)._fields
            for name, a, b_ in zip(ours._fields, ours, ref):
                out[f"vtrace {cfg} {name}"] = (a, b_)
        return out

    for name, (ours, ref) in both(d, OMEGA).items():
        assert ours.shape == ref.shape, name
        np.testing.assert_allclose(ours, ref, **TOL, err_msg=name)
    # the comparison can fail: a different omega on one side
    ours, ref = both(d, OMEGA)["gae"][0], both(d, OMEGA + 0.1)["gae"][1]
    assert not np.allclose(ours, ref, **TOL)


def test_vtrace_sample_mask_and_gradients_match_rlax():
    rlax = pytest.importorskip("rlax")
    d = random_traj(3, 1, 9)
    mask = jnp.arange(9) % 3 != 1
    args = (d["values"][0, :-1], d["values"][0, 1:], d["r"][0], d["disc"][0], d["rho"][0])

    @jax.jit  # one program for every check (op by op, each would be compiled alone)
    def both(args, mask):
        ours = cv.centered_vtrace_td_error_and_advantage(*args[:5], OMEGA, 0.9, sample_mask=mask)
        ref = rlax.vtrace_td_error_and_advantage(*args[:2], args[2] - OMEGA, *args[3:], 0.9,
                                                 sample_mask=mask)
        # gradients (stop_target_gradients both ways) agree with rlax on the same expression
        grads = []
        for stop in (True, False):
            g1 = jax.grad(lambda vs, stop=stop: cv.centered_td_learning(vs[0], 1.0, 0.9, vs[1], 0.3, stop) ** 2)(
                jnp.array([0.2, 0.5]))
            g2 = jax.grad(lambda vs, stop=stop: rlax.td_learning(vs[0], 1.0 - 0.3, 0.9, vs[1], stop) ** 2)(
                jnp.array([0.2, 0.5]))
            grads.append((g1, g2))
        return ours, ref, grads

    ours, ref, grads = both(args, mask)
    for a, b_ in zip(ours, ref):
        np.testing.assert_allclose(a, b_, **TOL)
    for g1, g2 in grads:
        np.testing.assert_allclose(g1, g2, **TOL)


def test_terminal_matches_rlax_with_substitutions():
    """With terminal_t: rlax on r - omega with discount gamma, value -omega/(1-gamma)
    and lambda 0 at the terminal steps."""
    rlax = pytest.importorskip("rlax")
    gamma = 0.9
    d = random_traj(11, 4, 12, p_term=0.3, gamma=gamma)
    vterm = -OMEGA / (1 - gamma)

    @jax.jit  # one program for both lambdas (lam traced)
    def both(d, lam):
        ours = jax.vmap(lambda r, dc, v, tm: cv.centered_lambda_returns(
            r, dc, v, OMEGA, lam, terminal_t=tm, gamma=gamma))(d["r"], d["disc"], d["v"], d["term"])
        ref = jax.vmap(lambda r, dc, v, tm: rlax.lambda_returns(
            r - OMEGA, jnp.where(tm, gamma, dc), jnp.where(tm, vterm, v),
            jnp.where(tm, 0.0, lam)))(d["r"], d["disc"], d["v"], d["term"])
        out = jax.vmap(lambda r, dc, vals, tm: cv.centered_truncated_generalized_advantage_estimation(
            r, dc, lam, vals, OMEGA, terminal_t=tm, gamma=gamma))(
            d["r"], d["disc"], d["values"], d["term"])
        # (values[t+1] is also step t+1's baseline, so the terminal bootstrap goes
        # into the reward, with discount 0: r - omega + gamma (-omega/(1-gamma)))
        ref_gae = jax.vmap(lambda r, dc, vals, tm: rlax.truncated_generalized_advantage_estimation(
            r - OMEGA + jnp.where(tm, gamma * vterm, 0.0), jnp.where(tm, 0.0, dc), lam, vals))(
            d["r"], d["disc"], d["values"], d["term"])
        # advantages are the GAE of td_errors - omega (the same cut at terminals)
        of_td = jax.vmap(lambda td, tm: rlax.truncated_generalized_advantage_estimation(
            td, jnp.where(tm, 0.0, gamma), lam, jnp.zeros(13)))(out.td_errors - OMEGA, d["term"])
        return ours, ref, out.advantages, ref_gae, of_td

    for lam in (0.0, 0.6):
        ours, ref, adv, ref_gae, of_td = both(d, jnp.float32(lam))
        np.testing.assert_allclose(ours, ref, **TOL)
        np.testing.assert_allclose(adv, ref_gae, **TOL)
        np.testing.assert_allclose(adv, of_td, **TOL)


def test_terminal_is_a_constant_shift():
    """Constant discount gamma, values shifted by c = omega/(1-gamma): centered
    lambda-returns = uncentered - c; centered advantages = uncentered GAE."""
    rlax = pytest.importorskip("rlax")
    gamma = 0.9
    d = random_traj(5, 4, 15, p_term=0.3, gamma=gamma)
    c = OMEGA / (1 - gamma)

    @jax.jit  # one program for every lambda (lam traced)
    def both(d, lam):
        ours = jax.vmap(lambda r, dc, v, tm: cv.centered_lambda_returns(
            r, dc, v - c, OMEGA, lam, terminal_t=tm, gamma=gamma))(
            d["r"], d["disc"], d["v"], d["term"])
        ref = jax.vmap(lambda r, dc, v: rlax.lambda_returns(r, dc, v, lam))(d["r"], d["disc"], d["v"])
        adv = jax.vmap(lambda r, dc, vals, tm: cv.centered_truncated_generalized_advantage_estimation(
            r, dc, lam, vals - c, OMEGA, terminal_t=tm, gamma=gamma).advantages)(
            d["r"], d["disc"], d["values"], d["term"])
        ref_gae = jax.vmap(lambda r, dc, vals: rlax.truncated_generalized_advantage_estimation(
            r, dc, lam, vals))(d["r"], d["disc"], d["values"])
        no_term = jax.vmap(lambda r, dc, v: cv.centered_lambda_returns(r, dc, v - c, OMEGA, lam))(
            d["r"], d["disc"], d["v"])
        return ours, ref, adv, ref_gae, no_term

    for lam in (0.5, 1.0):
        ours, ref, adv, ref_gae, no_term = both(d, jnp.float32(lam))
        np.testing.assert_allclose(ours, ref - c, rtol=1e-5, atol=5e-5)
        np.testing.assert_allclose(adv, ref_gae, rtol=1e-5, atol=5e-5)
        if lam == 0.5:  # ... and without terminal_t it is not
            assert np.max(np.abs(np.asarray(no_term) - (np.asarray(ref) - c))) > 1.0


# -------------------------------------------------------------- hand values

R3 = jnp.array([1.0, 0.0, 2.0])
D3 = jnp.array([0.5, 0.5, 0.0])


def test_td_learning_by_hand():
    # 2 + 0.9 * 3 - 1 - 0.5
    assert float(cv.centered_td_learning(1.0, 2.0, 0.9, 3.0, 0.5)) == pytest.approx(3.2)
    # terminal: target 2 - 0.5 / (1 - 0.9) = -3, minus v_tm1 = 1
    assert float(cv.centered_td_learning(1.0, 2.0, 0.0, 3.0, 0.5, terminal_t=True,
                                         gamma=0.9)) == pytest.approx(-4.0)
    assert float(cv.centered_td_learning(1.0, 2.0, 0.0, 3.0, 0.5, terminal_t=False,
                                         gamma=0.9)) == pytest.approx(0.5)


def test_lambda_returns_by_hand():
    # r - omega = [0.5, -0.5, 1.5]; lambda 0.5; v_t = [1, 2, 4]
    # G2 = 1.5; G1 = -0.5 + 0.5 (0.5*2 + 0.5*1.5) = 0.375; G0 = 0.5 + 0.5 (0.5*1 + 0.5*0.375)
    g = cv.centered_lambda_returns(R3, D3, jnp.array([1.0, 2.0, 4.0]), 0.5, 0.5)
    np.testing.assert_allclose(g, [0.84375, 0.375, 1.5], **TOL)


def test_gae_by_hand():
    # values [1, 2, 0, 4]: td_errors (uncentered) = [1 + 1 - 1, 0 + 0 - 2, 2 + 0 - 0] = [1, -2, 2]
    # centered [0.5, -2.5, 1.5]; A2 = 1.5; A1 = -2.5 + 0.25*1.5 = -2.125; A0 = 0.5 + 0.25*A1
    out = cv.centered_truncated_generalized_advantage_estimation(
        R3, D3, 0.5, jnp.array([1.0, 2.0, 0.0, 4.0]), 0.5)
    np.testing.assert_allclose(out.td_errors, [1.0, -2.0, 2.0], **TOL)
    np.testing.assert_allclose(out.advantages, [-0.03125, -2.125, 1.5], **TOL)
    # the advantages are the (uncentered) GAE of td_errors - omega: values 0 give delta = r
    again = cv.centered_truncated_generalized_advantage_estimation(
        out.td_errors - 0.5, D3, 0.5, jnp.zeros(4), 0.0)
    np.testing.assert_allclose(again.advantages, out.advantages, **TOL)


def test_vtrace_by_hand():
    # v_tm1 [1, 2, 0], v_t [2, 0, 4], rho [2, .5, 1], lambda 1, omega .5, clips 1:
    # c = [1, .5, 1]; td = [1*(.5+1-1), .5*(-.5+0-2), 1*1.5] = [.5, -1.25, 1.5]
    # errors: e2 = 1.5, e1 = -1.25 + .5*.5*1.5 = -.875, e0 = .5 + .5*1*(-.875) = .0625
    # targets = [1.0625, 1.125, 1.5]; q = r-omega + d*[1.125, 1.5, 4] = [1.0625, .25, 1.5]
    # pg = min(1, rho) (q - v_tm1) = [.0625, .5*(-1.75), 1.5]
    out = cv.centered_vtrace_td_error_and_advantage(
        jnp.array([1.0, 2.0, 0.0]), jnp.array([2.0, 0.0, 4.0]), R3, D3,
        jnp.array([2.0, 0.5, 1.0]), 0.5)
    np.testing.assert_allclose(out.errors, [0.0625, -0.875, 1.5], **TOL)
    np.testing.assert_allclose(out.q_estimate, [1.0625, 0.25, 1.5], **TOL)
    np.testing.assert_allclose(out.pg_advantage, [0.0625, -0.875, 1.5], **TOL)


# -------------------------------------------- episodic chain: closed form

GAMMA = 0.9
V_TRUE = np.array([-2.71, -1.9, -1.0])  # s0 -> s1 -> s2 -> end, reward -1 per step
STEPS_LEFT = np.array([3, 2, 1])


def expected_ctd_fixpoint(omega0, use_terminal, beta=0.0, iters=3000, alpha=0.3):
    """Expected (synchronous, tabular) centered TD on the chain, uniform state
    weighting; omega fixed (beta = 0) or learned from the uncentered TD errors."""
    terminal = jnp.array([False, False, True])
    disc = jnp.array([GAMMA, GAMMA, 0.0])
    r = -jnp.ones(3)

    def body(_, c):
        v, om = c
        v_next = jnp.concatenate([v[1:], jnp.zeros(1)])
        if use_terminal:
            dc = jax.vmap(lambda a, b, d_, e, tm: cv.centered_td_learning(
                a, b, d_, e, om.omega, terminal_t=tm, gamma=GAMMA))(v, r, disc, v_next, terminal)
        else:
            dc = jax.vmap(cv.centered_td_learning, (0, 0, 0, 0, None))(v, r, disc, v_next, om.omega)
        om = value_learning.omega_update(om, dc + om.omega, 1.0, beta)
        return v + alpha * dc, om

    v, om = jax.jit(lambda: jax.lax.fori_loop(
        0, iters, body, (jnp.zeros(3), value_learning.omega_init(omega0))))()
    return np.asarray(v), float(om.omega)


def test_episodic_chain_closed_form():
    omega = -1.0
    c = omega / (1 - GAMMA)  # -10
    v_c, _ = expected_ctd_fixpoint(omega, use_terminal=True)
    # with terminal_t: centered values = true values - omega/(1-gamma), every state
    np.testing.assert_allclose(v_c + c, V_TRUE, atol=1e-4)
    np.testing.assert_allclose(v_c, [7.29, 8.1, 9.0], atol=1e-4)
    # without: v_c = v - omega (1 - gamma^N) / (1 - gamma): the bias of v_c + c is
    # omega gamma^N / (1 - gamma) = [-7.29, -8.1, -9.0], state dependent
    v_c0, _ = expected_ctd_fixpoint(omega, use_terminal=False)
    np.testing.assert_allclose(v_c0, [0.0, 0.0, 0.0], atol=1e-4)  # r - omega = 0 per step
    bias = v_c0 + c - V_TRUE
    np.testing.assert_allclose(bias, omega * GAMMA ** STEPS_LEFT / (1 - GAMMA), atol=1e-4)
    np.testing.assert_allclose(bias, [-7.29, -8.1, -9.0], atol=1e-4)
    # differences between states (what a policy compares) are lost without terminal_t
    assert abs((v_c0[0] - v_c0[1]) - (V_TRUE[0] - V_TRUE[1])) > 0.5
    # and the zero-bias claim fails with a different omega in the closed form
    assert np.max(np.abs(v_c + 0.0 - V_TRUE)) > 5


def test_episodic_chain_learned_omega():
    """omega learned too (eq. omegawithrho, beta 0.05): whatever omega it settles at,
    v_c + omega/(1-gamma) = v with terminal_t; without, the bias is omega gamma^N/(1-gamma)."""
    v_c, om = expected_ctd_fixpoint(0.0, use_terminal=True, beta=0.05)
    assert om < -0.1  # it moved: it learned a nonzero mean TD error
    np.testing.assert_allclose(v_c + om / (1 - GAMMA), V_TRUE, atol=1e-3)
    v_c0, om0 = expected_ctd_fixpoint(0.0, use_terminal=False, beta=0.05)
    np.testing.assert_allclose(v_c0 + om0 / (1 - GAMMA) - V_TRUE,
                               om0 * GAMMA ** STEPS_LEFT / (1 - GAMMA), atol=1e-3)
    assert abs(om0) > 0.1


def test_without_terminal_centering_changes_the_greedy_choice():
    """End now (reward -1) vs a 3-step path (-1 per step), gamma 0.9, omega -1.5:
    Monte-Carlo (lambda 1) centered returns of the first step."""
    omega = -1.5
    short = {"r_t": jnp.array([-1.0]), "discount_t": jnp.array([0.0]), "v_t": jnp.zeros(1)}
    long = {"r_t": -jnp.ones(3), "discount_t": jnp.array([GAMMA, GAMMA, 0.0]), "v_t": jnp.zeros(3)}
    g_s = float(cv.centered_lambda_returns(**short, omega=omega)[0])
    g_l = float(cv.centered_lambda_returns(**long, omega=omega)[0])
    assert g_s == pytest.approx(0.5) and g_l == pytest.approx(1.355, abs=1e-5)
    assert g_l > g_s  # the worse path looks better
    term_s, term_l = jnp.array([True]), jnp.array([False, False, True])
    g_s = float(cv.centered_lambda_returns(**short, omega=omega, terminal_t=term_s, gamma=GAMMA)[0])
    g_l = float(cv.centered_lambda_returns(**long, omega=omega, terminal_t=term_l, gamma=GAMMA)[0])
    # shifted by -omega/(1-gamma) = 15 from the true returns -1 and -2.71
    assert g_s == pytest.approx(14.0, abs=1e-4) and g_l == pytest.approx(12.29, abs=1e-4)
    assert g_s > g_l


# ------------------------------------------------------------- light import

def test_light_import():
    code = ("import sys, bec_jax.agents.targets, bec_jax.agents.value_learning; "
            "print([m for m in ('matplotlib', 'bec_jax.prediction.sweep', 'bec_jax.envs', 'rlax') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# ---------------------------------------------------------------- bad input

def test_bad_rank_names_the_argument():
    r = jnp.zeros(3)
    with pytest.raises(ValueError, match="`v_t`"):
        cv.centered_lambda_returns(r, r, jnp.zeros((3, 2)), 0.0)
    with pytest.raises(ValueError, match="`discount_t`"):
        cv.centered_lambda_returns(r, jnp.zeros(4), r, 0.0)
    with pytest.raises(ValueError, match="`r_t`"):
        cv.centered_td_learning(0.0, r, 0.9, 0.0, 0.0)
    with pytest.raises(ValueError, match="`omega`"):
        cv.centered_lambda_returns(r, r, r, jnp.zeros(3))
    with pytest.raises(ValueError, match="`values`"):
        cv.centered_truncated_generalized_advantage_estimation(r, r, 0.9, r, 0.0)
    with pytest.raises(ValueError, match="`rho_tm1`"):
        cv.centered_vtrace_td_error_and_advantage(r, r, r, r, jnp.zeros((3, 1)), 0.0)
    with pytest.raises(ValueError, match="`gamma`"):
        cv.centered_lambda_returns(r, r, r, 0.0, terminal_t=r > 0)
    with pytest.raises(ValueError, match="`gamma`"):
        cv.centered_lambda_returns(r, r, r, 0.0, terminal_t=r > 0, gamma=1.0)
    with pytest.raises(AssertionError):  # also an AssertionError, like chex's
        cv.centered_lambda_returns(r, r, jnp.zeros((3, 2)), 0.0)
    with pytest.raises(ValueError, match="`r_t`.*float"):
        cv.centered_lambda_returns(jnp.zeros(3, jnp.int32), r, r, 0.0)


# ---------------------------------------------------- omega_update guard/mask

def test_omega_update_nan_is_skipped():
    st = value_learning.OmegaState(omega=jnp.float32(0.3), count=jnp.int32(4))  # no `skipped`
    assert st.skipped == 0
    up = jax.jit(value_learning.omega_update)
    bad = up(st, jnp.array([1.0, jnp.nan, 2.0]), 1.0, 0.5)
    assert float(bad.omega) == pytest.approx(0.3)
    assert int(bad.skipped) == 1 and int(bad.count) == 4
    bad = up(bad, jnp.array([jnp.inf, 0.0]), 1.0, 0.5)
    assert int(bad.skipped) == 2 and float(bad.omega) == pytest.approx(0.3)
    ok = up(bad, jnp.array([1.0, 2.0]), 1.0, 0.5)  # 0.3 + 0.5 * (1.5 - 0.3)
    assert float(ok.omega) == pytest.approx(0.9) and int(ok.count) == 5
    assert int(ok.skipped) == 2
    # an inf rho is caught too
    assert int(up(st, jnp.array([1.0]), jnp.array([jnp.inf]), 0.5).skipped) == 1


def test_omega_update_in_scan_with_a_nan_batch():
    deltas = jnp.array([[1.0, 1.0], [jnp.nan, 0.0], [1.0, 1.0]])

    def body(s, d):
        s = value_learning.omega_update(s, d, 1.0, 0.5)
        return s, s.omega

    st, om = jax.lax.scan(body, value_learning.omega_init(), deltas)
    np.testing.assert_allclose(om, [0.5, 0.5, 0.75], **TOL)
    assert int(st.count) == 2 and int(st.skipped) == 1


def test_omega_update_mask():
    up = jax.jit(value_learning.omega_update)  # one program a shape (op by op, each would be compiled alone)
    st = value_learning.omega_init(0.1)
    delta = np.array([1.0, 100.0, np.nan, 3.0], np.float32)
    rho = np.array([1.0, 2.0, 3.0, 0.5], np.float32)
    mask = np.array([True, False, False, True])
    got = up(st, delta, rho, 0.5, mask=mask)
    want = up(st, delta[mask], rho[mask], 0.5)
    assert float(got.omega) == pytest.approx(float(want.omega))
    # = 0.1 + 0.5 * mean(1*(1-.1), .5*(3-.1))
    assert float(got.omega) == pytest.approx(0.1 + 0.5 * (0.9 + 1.45) / 2)
    assert int(got.skipped) == 0 and int(got.count) == 1
    # an all-false mask is a no-op
    none = up(st, delta, rho, 0.5, mask=np.zeros(4, bool))
    assert float(none.omega) == pytest.approx(0.1)
    assert int(none.count) == 0 and int(none.skipped) == 0
    # a NaN inside the mask is skipped
    assert int(up(st, delta, rho, 0.5, mask=~mask).skipped) == 1
