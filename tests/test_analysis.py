"""Exact quantities: the paper's lemma, expected updates against the real update
functions, fixpoints, metrics against direct formulas, and ODE stability."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hand_derived import episodic_env, hand_expected_update

from bec_jax import algorithms, envs
from bec_jax import mdp as mdp_lib
from bec_jax.theory import expected_updates as analysis
from bec_jax.theory import fixpoints, metrics

ENV_NAMES = ("boyan_chain", "two_state", "baird")
ALG_NAMES = ("td", "tdc", "ctd", "ctdc", "ctdc_omega_no_rho", "src", "vrc")


def custom_env():
    """Off-policy with nonzero rewards (which none of the paper's three has), so the
    r_pi / r_mu distinctions of SRC and literal CTDC show."""
    rng = np.random.default_rng(42)
    P = rng.dirichlet(np.ones(4), size=(4, 3))
    P[0, 2] = [0, 0, 1, 0]
    mu = np.array([[0.2, 0.5, 0.3], [0.6, 0.4, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.1, 0.1, 0.8]])
    pi = np.array([[0.7, 0.0, 0.3], [0.0, 1.0, 0.0], [0.5, 0.25, 0.25], [0.0, 0.9, 0.1]])
    return mdp_lib.make_mdp(pi=pi, mu=mu, P=P, R=rng.normal(size=(4, 3, 4)) + 1.0,
                            phi=rng.normal(size=(4, 3)), gamma=0.8)


@pytest.fixture(scope="module", params=ENV_NAMES + ("custom",))
def env(request):
    return custom_env() if request.param == "custom" else envs.make(request.param)


@pytest.fixture(scope="module")
def all_envs():
    return {name: envs.make(name) for name in ENV_NAMES}


# ------------------------------------------------------------- (a) the lemma

LEMMA_CASES = [
    # a, b, x, y, m, n, gamma
    (0.5, 0.5, 0.0, 0.0, 1.0, 2.0, 0.9),     # the paper's instance: 0.25
    (0.3, 0.6, 0.2, 0.7, 1.5, -0.5, 0.8),
    (0.9, 0.1, 1.0, 0.0, 2.0, 1.0, 0.99),    # x = 1, y = 0: the smallest factor 1 - gamma
    (0.1, 0.9, 0.0, 1.0, -1.0, 3.0, 0.5),    # x = 0, y = 1: the largest factor 1 + gamma
    (0.25, 0.75, 0.5, 0.5, 0.5, 4.0, 0.0),
    (0.7, 0.2, 0.3, 0.1, 3.0, -2.0, 0.95),
]


@pytest.mark.parametrize("a,b,x,y,m,n,gamma", LEMMA_CASES)
def test_lemma_two_state_centered_td_matrix(a, b, x, y, m, n, gamma):
    env = envs.two_state(a=a, b=b, x=x, y=y, m=m, n=n, gamma=gamma)
    A_c, b_c = fixpoints.centered_td_matrices(env)
    closed = (1 - a) * b / (1 - a + b) ** 2 * (1 - x * gamma + y * gamma) * (m - n) ** 2
    assert A_c.shape == (1, 1)
    assert A_c[0, 0] == pytest.approx(closed, rel=1e-12)
    assert closed > 0  # positive definite, as the lemma says
    np.testing.assert_allclose(b_c, 0.0, atol=1e-15)  # zero rewards
    # The lemma's d_mu.
    np.testing.assert_allclose(mdp_lib.d_mu(env), [b / (1 - a + b), (1 - a) / (1 - a + b)],
                               atol=1e-12)


def test_lemma_on_random_instances():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.uniform(0.05, 0.95, 2)
        x, y = rng.uniform(0, 1, 2)
        m, n = rng.normal(size=2) * 2
        gamma = rng.uniform(0, 0.99)
        env = envs.two_state(a=a, b=b, x=x, y=y, m=m, n=n, gamma=gamma)
        closed = (1 - a) * b / (1 - a + b) ** 2 * (1 - x * gamma + y * gamma) * (m - n) ** 2
        assert fixpoints.centered_td_matrices(env)[0][0, 0] == pytest.approx(closed, rel=1e-10)


def test_two_state_td_matrix_by_hand(all_envs):
    # A = Phi^T D (I - gamma P_pi) Phi = 1/2 [1*(1 - .9*2) + 2*(2 - .9*2)] = -0.2 < 0.
    A, b = fixpoints.td_matrices(all_envs["two_state"])
    assert A[0, 0] == pytest.approx(-0.2, rel=1e-12)
    assert b[0] == 0.0


# ------------------------------------------- (b) expected update = matrix form

@pytest.mark.parametrize("alg_name", ALG_NAMES)
def test_generic_expected_update_equals_hand_derived(env, alg_name):
    """The expected update derived from each update function equals the hand-derived
    matrices, at unit and at distinct step sizes."""
    for h in ({}, {"alpha": 0.3, "beta": 0.7, "zeta": 0.45}):
        alg = algorithms.get(alg_name)
        hp = {n: v for n, v in h.items() if n in alg.names}
        G, g = analysis.expected_update(env, alg_name, hp)
        G0, g0 = hand_expected_update(env, alg_name, h)
        assert G.shape == G0.shape and g.shape == g0.shape
        scale = max(1.0, np.abs(G0).max())
        np.testing.assert_allclose(G, G0, rtol=1e-10, atol=1e-12 * scale)
        np.testing.assert_allclose(g, g0, rtol=1e-10, atol=1e-12 * max(1.0, np.abs(g0).max()))


@pytest.mark.parametrize("alg_name", ALG_NAMES)
def test_generic_expected_update_with_episodic_discounting(alg_name):
    env = episodic_env()
    G, g = analysis.expected_update(env, alg_name, {"alpha": 0.2, "beta": 0.5, "zeta": 0.3}
                                    if alg_name.startswith("ctdc") else None)
    h = {"alpha": 0.2, "beta": 0.5, "zeta": 0.3} if alg_name.startswith("ctdc") else {}
    G0, g0 = hand_expected_update(env, alg_name, h)
    np.testing.assert_allclose(G, G0, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, g0, rtol=1e-10, atol=1e-12)


def test_expected_update_layout_and_scaling(all_envs):
    env = all_envs["baird"]
    k = env.num_features
    lay = analysis.state_layout(env, "ctdc")
    assert lay == {"theta": slice(0, k), "u": slice(k, 2 * k), "omega": slice(2 * k, 2 * k + 1)}
    G1, g1 = analysis.expected_update(env, "ctdc")
    G, g = analysis.expected_update(env, "ctdc", {"alpha": 0.1, "beta": 0.2, "zeta": 0.3})
    scale = np.r_[[0.1] * k, [0.3] * k, 0.2]
    np.testing.assert_allclose(G, scale[:, None] * G1, rtol=1e-14)
    np.testing.assert_allclose(g, scale * g1, rtol=1e-14)
    with pytest.raises(ValueError, match="known"):
        analysis.expected_update(env, "nope")
    with pytest.raises(ValueError, match="lambda: ctdc does not take lambda"):
        analysis.expected_update(env, "ctdc", {"lambda": 0.5})


def test_expected_update_follows_a_model_changed_in_place():
    """A model's outcomes are kept between analyses (`analysis._prepared`), by the
    model's contents: changing an array in place gives the new model's G and g,
    those of a fresh copy, and changing it back the first ones again."""
    env = envs.make("two_state")
    G0, g0 = analysis.expected_update(env, "ctd")
    env.R[:] = env.R + 1.0  # every reward up by one
    G1, g1 = analysis.expected_update(env, "ctd")
    copy = mdp_lib.FiniteMDP(*(np.array(x) for x in env))
    G2, g2 = analysis.expected_update(copy, "ctd")
    assert not np.array_equal(g1, g0)
    np.testing.assert_array_equal(G1, G2)
    np.testing.assert_array_equal(g1, g2)
    env.R[:] = env.R - 1.0
    np.testing.assert_array_equal(analysis.expected_update(env, "ctd")[1], g0)


def test_non_affine_update_is_refused(all_envs):
    """An update quadratic in the TD error (defined here) is refused; a trace
    method declares its trace and is analysed (see test_prediction_suite)."""
    from bec_jax.algorithms import Algorithm, step_size, td, td_error

    def update(state, tr, alpha):
        d = td_error(state.theta, tr)
        return state._replace(theta=state.theta + alpha * d * d * tr.phi, count=state.count + 1)

    sq = Algorithm(name="squared_td", init=td.init, update=update,
                   hyperparameters=(step_size("alpha", "a"),), equations="none (a test)")
    with pytest.raises(ValueError, match="squared_td's expected update is not affine"):
        analysis.expected_update(all_envs["boyan_chain"], sq)
    # Without its declared trace, centered TD(lambda) is bilinear in (theta, e): refused too.
    import dataclasses
    no_trace = dataclasses.replace(algorithms.get("ctd_lambda"), traces={})
    with pytest.raises(ValueError, match="not affine"):
        analysis.expected_update(all_envs["boyan_chain"], no_trace)


def test_user_algorithm_gets_its_ode_matrix(all_envs):
    """An algorithm defined here, never registered: TD with a fixed extra factor
    c on the TD error, i.e. G = -c A."""
    from bec_jax.algorithms import Algorithm, parameter, step_size, td

    def update(state, tr, eta, c=1.0):
        return td.update(state, tr, eta * c)

    mine = Algorithm(name="scaled_td_for_analysis", init=td.init, update=update,
                     hyperparameters=(step_size("eta", "step size"),
                                      parameter("c", "factor", default=2.0, low=0.0)),
                     equations="eq. (7) [td(0)theta], scaled")
    env = all_envs["two_state"]
    G, g = analysis.expected_update(env, mine)
    np.testing.assert_allclose(G, -2.0 * fixpoints.td_matrices(env)[0], rtol=1e-12)
    np.testing.assert_allclose(analysis.ode_eigenvalues(env, mine, {"eta": 0.5, "c": 3.0}), [0.2 * 1.5],
                               rtol=1e-12)
    np.testing.assert_allclose(analysis.slow_ode_matrix(env, mine), [[0.4]], rtol=1e-12)


# --------------------------------------------------------- (c) fixpoints

def test_centered_fixpoint_solves_the_centered_equations(env):
    A_c, b_c = fixpoints.centered_td_matrices(env)
    fs = fixpoints.centered_td_fixpoint_set(env)
    theta = fixpoints.centered_td_fixpoint(env)
    np.testing.assert_allclose(theta, fs.theta)
    np.testing.assert_allclose(A_c @ theta, b_c, atol=1e-9 * max(1.0, np.abs(b_c).max()))
    assert fs.residual < 1e-9
    # The centered TD fixpoint zeroes the projected centered Bellman error.
    assert metrics.rmspcbe(env, theta) < 1e-9
    # Every point of the affine set is a fixpoint.
    for z in np.random.default_rng(0).normal(size=(3, fs.null_space.shape[1])) * 5:
        th = theta + fs.null_space @ z
        np.testing.assert_allclose(A_c @ th, b_c, atol=1e-8)
        assert metrics.rmspcbe(env, th) < 1e-8


def test_boyan_fixpoints_form_a_line_along_the_constant(all_envs):
    env = all_envs["boyan_chain"]
    fs = fixpoints.centered_td_fixpoint_set(env)
    assert not fs.unique and fs.rank == 3 and fs.null_space.shape == (4, 1)
    assert "dimension 1" in fs.describe()
    n = fs.null_space[:, 0]
    # Boyan's feature rows sum to one, so theta + c 1 shifts every value by c, which
    # centering cannot see: the null vector is (1, 1, 1, 1) / 2 up to sign.
    np.testing.assert_allclose(np.abs(n), 0.5, atol=1e-10)
    A_c, b_c = fixpoints.centered_td_matrices(env)
    for c in (-30.0, 7.0):
        np.testing.assert_allclose(A_c @ (fs.theta + c * n), b_c, atol=1e-8)
    # The TD fixpoint is unique on Boyan (on-policy, A nonsingular).
    assert fixpoints.td_fixpoint_set(env).unique


def test_two_state_fixpoints_are_zero(all_envs):
    env = all_envs["two_state"]
    fs = fixpoints.centered_td_fixpoint_set(env)
    assert fs.unique and "unique" in fs.describe()
    np.testing.assert_array_equal(fs.theta, [0.0])
    np.testing.assert_array_equal(fixpoints.td_fixpoint(env), [0.0])


def test_baird_centered_fixpoints(all_envs):
    env = all_envs["baird"]
    fs = fixpoints.centered_td_fixpoint_set(env)
    # b_c = 0; null(A_c) = null(Phi) (8 features, 7 states) plus the direction that
    # adds a constant to every value.
    assert fs.null_space.shape == (8, 2)
    np.testing.assert_allclose(fs.theta, 0.0, atol=1e-12)
    values = env.phi @ fs.null_space
    np.testing.assert_allclose(values - values.mean(0), 0.0, atol=1e-10)


def test_fixpoint_set_by_hand():
    A = np.array([[2.0, 0.0], [0.0, 0.0]])
    fs = fixpoints.fixpoint_set(A, np.array([4.0, 0.0]))
    np.testing.assert_allclose(fs.theta, [2.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(np.abs(fs.null_space[:, 0]), [0.0, 1.0])
    assert fs.rank == 1 and fs.residual == pytest.approx(0.0, abs=1e-14)
    # No solution: the least-squares point and its residual.
    fs = fixpoints.fixpoint_set(A, np.array([4.0, 1.0]))
    assert fs.residual == pytest.approx(1.0)


# --------------------------------------------------------------- (d) metrics

def direct_metrics(env, theta):
    """Every metric straight from its definition, in float64: the d_mu-weighted
    ones, the plain Bellman error, and the emphatic-weighted ones with
    m = (I - gamma P^T)^-1 d normalised to sum 1 (interest 1)."""
    d, P, r = mdp_lib.d_mu(env), mdp_lib.P_pi(env), mdp_lib.r_pi(env)
    Phi, gamma = np.asarray(env.phi), float(env.gamma)
    v = Phi @ theta
    dbar = r + gamma * P @ v - v
    v_pi = np.linalg.solve(np.eye(len(d)) - gamma * P, r)
    m = np.linalg.solve(np.eye(len(d)) - gamma * P.T, d)
    m = m / m.sum()
    out = {}
    for w, suffix in ((d, ""), (m, "_emphatic")):
        W = np.diag(w)
        Pi = Phi @ np.linalg.pinv(Phi.T @ W @ Phi) @ Phi.T @ W
        centered = dbar - w @ dbar

        def norm(x):
            return np.sqrt(np.sum(w * x * x))

        out.update({"rmscbe" + suffix: norm(centered), "rmspcbe" + suffix: norm(Pi @ centered),
                    "rmspbe" + suffix: norm(Pi @ dbar), "rmsve" + suffix: norm(v - v_pi)})
    out["rmsbe"] = np.sqrt(np.sum(d * dbar * dbar))
    # The centered TD fixpoints: least squares on A_c theta = b_c and null(A_c), by
    # scipy here; the distance is a least-squares problem over the set.
    import scipy.linalg
    A_c, b_c = fixpoints.centered_td_matrices(env)
    star = np.linalg.lstsq(A_c, b_c, rcond=None)[0]
    N = scipy.linalg.null_space(A_c, rcond=1e-10)
    z = np.linalg.lstsq(N, theta - star, rcond=None)[0] if N.shape[1] else np.zeros(0)
    out["fixpoint_distance"] = np.linalg.norm(theta - star - (N @ z if N.shape[1] else 0.0))
    return out


@pytest.mark.parametrize("name", metrics.METRICS)
def test_metrics_match_direct_computation(env, name):
    rng = np.random.default_rng(1)
    fn = getattr(metrics, name)
    M = metrics.metric(env, name)
    assert M.R.shape[0] <= env.num_features + 1
    for theta in [env.theta0, *(rng.normal(size=env.num_features) * 5 for _ in range(5))]:
        want = direct_metrics(env, theta)[name]
        assert fn(env, theta) == pytest.approx(want, rel=1e-9, abs=1e-12)
        with jax.enable_x64(True):
            got = float(metrics.evaluate(M.astype(jnp.float64), jnp.asarray(theta, jnp.float64)))
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_metric_values_by_hand(all_envs):
    env = all_envs["two_state"]
    # theta = 1: V = (1, 2), P_pi V = (2, 2), dbar = 0.9*2 - V = (0.8, -0.2),
    # mean 0.3, centered (0.5, -0.5): RMSCBE = 0.5; RMSVE = sqrt((1 + 4) / 2).
    assert metrics.rmscbe(env, [1.0]) == pytest.approx(0.5, rel=1e-12)
    assert metrics.rmsve(env, [1.0]) == pytest.approx(np.sqrt(2.5), rel=1e-12)
    # Projection onto span{(1, 2)} under D = I/2: Pi x = (1, 2)(x1 + 2 x2)/5.
    # PBE: x = (0.8, -0.2) -> (0.08, 0.16); PCBE: x = (0.5, -0.5) -> (-0.1, -0.2).
    assert metrics.rmspbe(env, [1.0]) == pytest.approx(np.sqrt((0.08**2 + 0.16**2) / 2), rel=1e-12)
    assert metrics.rmspcbe(env, [1.0]) == pytest.approx(np.sqrt((0.01 + 0.04) / 2), rel=1e-12)
    # Zero-reward counterexamples: every metric vanishes at theta = 0.
    for name in ("two_state", "baird"):
        for metric in metrics.METRICS:
            assert getattr(metrics, metric)(all_envs[name], np.zeros(all_envs[name].num_features)) == 0


def test_metric_values_from_columns(all_envs):
    # The sweep passes the weights' columns (each turned grid-major); the values
    # are those of the (G, N, k) array, bit for bit, and match the closed form.
    env = all_envs["boyan_chain"]
    mets = [metrics.metric(env, "rmscbe"), metrics.metric(env, "rmspbe")]
    theta = np.random.default_rng(3).normal(size=(3, 5, 4)).astype(np.float32)
    whole = np.asarray(metrics.metric_values(mets, jnp.asarray(theta)))
    cols = np.asarray(metrics.metric_values(mets, [jnp.asarray(theta[..., i]) for i in range(4)]))
    assert whole.shape == (2, 3, 5)
    np.testing.assert_array_equal(cols, whole)
    np.testing.assert_allclose(whole[0, 1, 2], metrics.rmscbe(env, theta[1, 2].astype(np.float64)), rtol=1e-5)
    np.testing.assert_allclose(whole[1, 2, 4], metrics.rmspbe(env, theta[2, 4].astype(np.float64)), rtol=1e-5)


def test_rmscbe_is_min_over_omega(all_envs):
    """MSCBE = min over omega of ||dbar - omega 1||_D^2 (the paper's MSCBE derivation)."""
    env = all_envs["boyan_chain"]
    theta = np.random.default_rng(2).normal(size=4)
    d = mdp_lib.d_mu(env)
    v = env.phi @ theta
    dbar = mdp_lib.r_pi(env) + float(env.gamma) * mdp_lib.P_pi(env) @ v - v
    omegas = np.linspace(-20, 20, 40001)
    vals = np.sqrt(((dbar[None, :] - omegas[:, None]) ** 2) @ d)
    assert metrics.rmscbe(env, theta) == pytest.approx(vals.min(), rel=1e-6)


def test_unknown_metric(all_envs):
    with pytest.raises(ValueError, match="rmspcbe"):
        metrics.metric(all_envs["baird"], "nope")


def _minimizer_at_norm(M, norm):
    """A point of the metric's minimizing set with |theta| ~ norm (or the unique one)."""
    theta, *_ = np.linalg.lstsq(M.R, -M.h, rcond=None)
    rank = np.linalg.matrix_rank(M.R)
    null = np.linalg.svd(M.R)[2][rank:].T
    if null.shape[1]:
        theta = theta + null[:, 0] * np.sqrt(max(norm**2 - theta @ theta, 0.0))
    return theta


def _expanded_float32(M, theta):
    """The naive alternative: [theta; 1]^T Q [theta; 1] with Q = W^T W, in float32."""
    W = np.hstack([M.R, M.h[:, None]])
    Q = (W.T @ W).astype(np.float32)
    x = np.r_[theta, 1.0].astype(np.float32)
    with np.errstate(invalid="ignore"):
        return float(np.sqrt(x @ Q @ x))


FLOAT32_CASES = [("boyan_chain", "rmspcbe"), ("boyan_chain", "rmspbe"), ("baird", "rmspcbe"),
                 ("baird", "rmspbe"), ("baird", "rmscbe"), ("baird", "rmsve")]


@pytest.mark.parametrize("env_name,name", FLOAT32_CASES)
def test_float32_metric_resolves_errors_near_the_minimum(all_envs, env_name, name):
    env = all_envs[env_name]
    M = metrics.metric(env, name)
    M32 = M.astype(jnp.float32)
    assert M32.R.dtype == jnp.float32
    base = _minimizer_at_norm(M, 10.0)
    assert np.linalg.norm(base) >= 9.99  # Boyan's TD fixpoint has norm 52
    assert np.linalg.norm(M.R @ base + M.h) < 1e-9
    f32 = jax.jit(metrics.evaluate)
    eps = float(np.finfo(np.float32).eps)
    rng = np.random.default_rng(3)
    naive_errors = []
    for _ in range(10):
        direction = rng.normal(size=base.shape)
        direction /= np.linalg.norm(direction)
        for offset in (1e-5, 1e-4, 1e-3):
            theta32 = np.asarray(base + offset * direction, np.float32)
            exact = float(np.linalg.norm(M.R @ theta32.astype(np.float64) + M.h))
            got = float(f32(M32, jnp.asarray(theta32)))
            # Backward stable: the float32 value is off by no more than a few ulps of
            # the inputs (the float32 rounding of theta itself moves the metric by as
            # much), whatever the cancellation.
            bound = 4 * eps * (np.linalg.norm(M.R) * np.linalg.norm(theta32) + np.linalg.norm(M.h))
            assert abs(got - exact) <= bound, (offset, got, exact, bound)
            if offset == 1e-3:
                assert abs(got - exact) / exact < 1e-2
            if offset == 1e-4:
                assert abs(got - exact) / exact < 0.1
                naive = _expanded_float32(M, theta32)
                naive_errors.append(abs(naive - exact) / exact if np.isfinite(naive) else np.inf)
    # An expanded quadratic form in float32 cannot resolve these values at all.
    assert max(naive_errors) > 1.0


# -------------------------------------------------------- (e) ODE stability

def hand_slow_matrix(env, alg_name):
    """The slow ODE matrices derived by hand: -A (TD, SRC), -A^T C^+ A (TDC), -A_c
    (CTD, VRC), -A^T C^+ A_c (CTDC)."""
    A = fixpoints.td_matrices(env)[0]
    A_c = fixpoints.centered_td_matrices(env)[0]
    C_pinv = np.linalg.pinv(fixpoints.feature_covariance(env), rcond=1e-10)
    return {"td": -A, "src": -A, "tdc": -A.T @ C_pinv @ A, "ctd": -A_c, "vrc": -A_c,
            "ctdc": -A.T @ C_pinv @ A_c}[alg_name]


@pytest.mark.parametrize("alg_name", ["td", "src", "tdc", "ctd", "vrc", "ctdc"])
def test_slow_ode_matrix_equals_hand_derived(env, alg_name):
    want = hand_slow_matrix(env, alg_name)
    np.testing.assert_allclose(analysis.slow_ode_matrix(env, alg_name), want,
                               atol=1e-10 * max(1.0, np.abs(want).max()))


def max_real(M):
    return float(np.linalg.eigvals(M).real.max())


def test_td_is_unstable_off_policy(all_envs):
    assert max_real(analysis.slow_ode_matrix(all_envs["baird"], "td")) > 0.2   # 0.239
    assert max_real(analysis.slow_ode_matrix(all_envs["two_state"], "td")) == pytest.approx(0.2)
    # ... but stable on-policy (Boyan).
    assert max_real(analysis.slow_ode_matrix(all_envs["boyan_chain"], "td")) < -0.02


def test_ctd_is_stable_on_two_state(all_envs):
    # -A_c = -(1/2)(1/2)(1)(1 - 2)^2 = -0.25 (the lemma).
    np.testing.assert_allclose(analysis.slow_ode_matrix(all_envs["two_state"], "ctd"), [[-0.25]])
    # The full (theta, omega) ODE: G = [[0.2 alpha, -1.5 alpha], [0.3 beta, -beta]]
    # (f = E[phi] = 1.5, E[rho delta] = 0.3 theta), det = 0.25 alpha beta > 0, so it is
    # stable iff the trace 0.2 alpha - beta < 0: omega must not be too slow.
    G, _ = analysis.expected_update(all_envs["two_state"], "ctd", {"alpha": 0.1, "beta": 0.7})
    np.testing.assert_allclose(G, [[0.02, -0.15], [0.21, -0.7]], atol=1e-14)
    for alpha, beta in [(1.0, 1.0), (0.01, 0.1), (0.1, 0.021), (0.1, 0.019), (0.1, 0.01)]:
        ev = analysis.ode_eigenvalues(all_envs["two_state"], "ctd", {"alpha": alpha, "beta": beta})
        assert (ev.real.max() < 0) == (beta > 0.2 * alpha), (alpha, beta, ev)


def test_tdc_is_stable_on_two_state(all_envs):
    # -A^T C^-1 A = -(0.04) / 2.5 with C = (1 + 4) / 2.
    np.testing.assert_allclose(analysis.slow_ode_matrix(all_envs["two_state"], "tdc"), [[-0.016]])


def test_ctdc_slow_ode_on_two_state(all_envs):
    """CTDC's slow ODE on the 2-state counterexample is -A^T C^-1 A_c = -(-0.2)(0.25)/2.5
    = +0.02: UNSTABLE, not the -A_c^T C^-1 A_c = -0.025 of the proof of Theorem 2 (the
    correction term -gamma phi' phi^T u is not centered). The full ODE agrees: with
    separated time scales its slow eigenvalue is about +0.02 alpha."""
    env = all_envs["two_state"]
    np.testing.assert_allclose(analysis.slow_ode_matrix(env, "ctdc"), [[0.02]], rtol=1e-12)
    A_c = fixpoints.centered_td_matrices(env)[0]
    C = fixpoints.feature_covariance(env)
    np.testing.assert_allclose(-A_c.T @ np.linalg.inv(C) @ A_c, [[-0.025]])  # the paper's claim
    for alpha in (1e-3, 1e-4):
        ev = analysis.ode_eigenvalues(env, "ctdc", {"alpha": alpha, "beta": 1.0, "zeta": 0.1})
        assert ev.real.max() == pytest.approx(0.02 * alpha, rel=0.05)


def test_centered_methods_on_baird_and_boyan_have_no_unstable_mode(all_envs):
    # CTD and CTDC: every eigenvalue has real part <= 0 (zeros from the null directions
    # of the centered fixpoint set), unlike TD on Baird.
    for env_name in ("baird", "boyan_chain"):
        for alg in ("ctd", "ctdc", "tdc"):
            assert max_real(analysis.slow_ode_matrix(all_envs[env_name], alg)) < 1e-10, (env_name, alg)


# ------------------------------------------------- (f) episodic discounting by hand

def hand_episodic_env(phi):
    """Two states: 0 -> 1 with reward 1 (gamma 1), then 1 -> 0 with reward 2 and
    gamma 0 (the episode ends and the next one starts in state 0)."""
    P = np.zeros((2, 1, 2))
    P[0, 0, 1] = P[1, 0, 0] = 1.0
    R = np.zeros((2, 1, 2))
    R[0, 0, 1], R[1, 0, 0] = 1.0, 2.0
    gamma = np.zeros((2, 1, 2))
    gamma[0, 0, 1] = 1.0
    return mdp_lib.make_mdp(pi=np.ones((2, 1)), mu=np.ones((2, 1)), P=P, R=R, phi=phi, gamma=gamma)


def test_episodic_quantities_worked_by_hand():
    # v(1) = 2, v(0) = 1 + 1 * 2 = 3; d = (1/2, 1/2); P_g = [[0, 1], [0, 0]].
    env = hand_episodic_env(np.ones((2, 1)))
    np.testing.assert_allclose(mdp_lib.v_pi(env), [3.0, 2.0])
    np.testing.assert_allclose(mdp_lib.P_pi_gamma(env), [[0.0, 1.0], [0.0, 0.0]])
    # One constant feature: (I - P_g) Phi = (0, 1), so A = 1/2, b = (1 + 2)/2 = 3/2, theta_TD = 3.
    A, b = fixpoints.td_matrices(env)
    np.testing.assert_allclose(A, [[0.5]])
    np.testing.assert_allclose(b, [1.5])
    np.testing.assert_allclose(fixpoints.td_fixpoint(env), [3.0])
    assert metrics.rmspbe(env, [3.0]) == pytest.approx(0.0, abs=1e-12)
    # RMSVE at theta = 3: values (3, 3) against (3, 2): sqrt(1/2 * 0 + 1/2 * 1).
    assert metrics.rmsve(env, [3.0]) == pytest.approx(np.sqrt(0.5), rel=1e-12)
    # RMSCBE at theta = 0: delta_bar = r = (1, 2), less its mean 3/2: (-1/2, 1/2), norm 1/2.
    assert metrics.rmscbe(env, [0.0]) == pytest.approx(0.5, rel=1e-12)
    # Centering removes the constant feature's whole signal: A_c = 0.
    np.testing.assert_allclose(fixpoints.centered_td_matrices(env)[0], [[0.0]], atol=1e-15)
    # TD's expected update at unit step size is -A theta + b; CTD adds omega's row:
    # E[delta] = d^T (r + (P_g - I) Phi theta) = 3/2 - theta/2.
    G, g = analysis.expected_update(env, "td")
    np.testing.assert_allclose(G, [[-0.5]])
    np.testing.assert_allclose(g, [1.5])
    G, g = analysis.expected_update(env, "ctd")
    np.testing.assert_allclose(G, [[-0.5, -1.0], [-0.5, -1.0]], atol=1e-15)
    np.testing.assert_allclose(g, [1.5, 1.5])
    # Tabular features: the TD fixpoint is v_pi itself.
    tab = hand_episodic_env(np.eye(2))
    np.testing.assert_allclose(fixpoints.td_fixpoint(tab), [3.0, 2.0])
    assert metrics.rmsve(tab, [3.0, 2.0]) == pytest.approx(0.0, abs=1e-12)


def test_episodic_discount_validation():
    P = np.zeros((2, 1, 2))
    P[0, 0, 1] = P[1, 0, 0] = 1.0
    kw = dict(pi=np.ones((2, 1)), mu=np.ones((2, 1)), P=P, R=np.zeros((2, 1, 2)), phi=np.ones((2, 1)))
    with pytest.raises(ValueError, match=r"^gamma: under the target policy some episodes never end"):
        mdp_lib.make_mdp(**kw, gamma=np.ones((2, 1, 2)))
    with pytest.raises(ValueError, match=r"^gamma: per-transition discounts must be in \[0, 1\]"):
        mdp_lib.make_mdp(**kw, gamma=np.full((2, 1, 2), 1.5))
    with pytest.raises(ValueError, match=r"^gamma: expected a number or shape \(S, A, S\)"):
        mdp_lib.make_mdp(**kw, gamma=np.full((2, 2), 0.5))
    # A constant gamma of 1 is still refused (a continuing task needs gamma < 1).
    with pytest.raises(ValueError, match=r"^gamma: must be in \[0, 1\)"):
        mdp_lib.make_mdp(**kw, gamma=1.0)


# ------------------------------------------------------------------ the metric registry

def _hand_rmsve_two_state(env):
    """RMSVE of the two-state example by hand: d = (1/2, 1/2) and zero rewards
    (v_pi = 0), so W = sqrt(1/2) [phi, 0]."""
    return np.hstack([np.sqrt(0.5) * np.asarray(env.phi, np.float64), np.zeros((2, 1))])


def _quarter(env):
    """A constant metric: || [0, ..., 0, 1/4] [theta; 1] || = 1/4 at every theta."""
    return np.hstack([np.zeros((1, env.num_features)), [[0.25]]])


def test_a_registered_metric_is_computed_by_a_sweep(all_envs):
    from bec_jax.prediction import sweep
    from bec_jax.prediction.spec import SweepSpec
    try:
        f = metrics.register_metric("hand_rmsve_test", _hand_rmsve_two_state, "RMSVE of two_state by hand.")
        metrics.register_metric("quarter_test", _quarter, "One quarter, whatever theta.")
        assert metrics.metric_names()[-2:] == ["hand_rmsve_test", "quarter_test"]
        assert f(all_envs["two_state"], [1.0]) == pytest.approx(np.sqrt(2.5), rel=1e-12)
        assert f.__name__ == "hand_rmsve_test" and "by hand" in f.__doc__
        spec = SweepSpec(env="two_state", algorithm="td", alpha=(0.01, 0.05), steps=60, seeds=3, log_every=10,
                         metrics=("rmsve", "hand_rmsve_test", "quarter_test"))
        r = sweep.run(spec, progress=False, devices=jax.devices()[:1])
        assert r.metrics == ("rmsve", "hand_rmsve_test", "quarter_test")
        assert np.isfinite(r.mean).all() and (r.mean[0, :, -1] != r.mean[0, :, 0]).all()  # theta moved
        np.testing.assert_allclose(r.mean[1], r.mean[0], rtol=2e-6)
        np.testing.assert_allclose(r.final[1], r.final[0], rtol=2e-6)
        assert (r.mean[2] == 0.25).all() and (r.final[2] == 0.25).all()
        # Registered again under its name, the metric bakes other constants into the
        # program: the same spec must not reuse the compiled one.
        metrics.register_metric("quarter_test", lambda env: 2 * _quarter(env), "One half.", replace=True)
        again = sweep.run(spec, progress=False, devices=jax.devices()[:1])
        assert (again.mean[2] == 0.5).all() and again.meta["compiled_programs"] == 1
    finally:
        metrics.METRIC_REGISTRY.pop("hand_rmsve_test", None)
        metrics.METRIC_REGISTRY.pop("quarter_test", None)
    with pytest.raises(ValueError, match="unknown metric 'quarter_test'"):
        SweepSpec(env="two_state", algorithm="td", alpha=(0.1,), metrics=("quarter_test",))


def test_metric_registry_lists_refuses_and_documents(all_envs):
    assert metrics.metric_names() == list(metrics.METRICS)  # the built-ins, in their order
    for name in metrics.METRICS:
        fn = getattr(metrics, name)
        assert fn.__name__ == name and metrics.metric_def(name).doc.split()[0] in fn.__doc__
    with pytest.raises(ValueError, match="'rmscbe' is already registered"):
        metrics.register_metric("rmscbe", _quarter, "another")
    with pytest.raises(ValueError, match="without ':'"):
        metrics.register_metric("a:b", _quarter, "bad name")
    with pytest.raises(ValueError, match="unknown metric 'nope'; known: rmscbe, rmspcbe"):
        metrics.metric_def("nope")
    assert metrics.metric_names() == list(metrics.METRICS)


def test_a_metric_of_ones_own_module_by_reference(tmp_path, monkeypatch):
    from bec_jax.prediction import sweep
    from bec_jax.prediction.spec import SweepSpec
    (tmp_path / "my_metrics_test.py").write_text(
        "import numpy as np\nfrom bec_jax.theory import metrics\n"
        "HALF = metrics.MetricDef('half', 'One half, whatever theta.', "
        "lambda env: np.hstack([np.zeros((1, env.num_features)), [[0.5]]]))\nNOT_ONE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = SweepSpec(env="two_state", algorithm="td", alpha=(0.01,), steps=30, seeds=2, log_every=10,
                     metrics=("rmsve", "my_metrics_test:HALF"))
    r = sweep.run(spec, progress=False, devices=jax.devices()[:1])
    assert (r.mean[1] == 0.5).all() and r.metrics[1] == "my_metrics_test:HALF"
    assert "my_metrics_test:HALF" not in metrics.metric_names()  # imported, not registered
    with pytest.raises(ValueError, match=r"^metrics: 'my_metrics_test:NOT_ONE' is a int, not a bec_jax"):
        SweepSpec(env="two_state", algorithm="td", alpha=(0.1,), metrics=("my_metrics_test:NOT_ONE",))
    with pytest.raises(ValueError, match=r"^metrics: cannot import 'no_such_module_test'"):
        SweepSpec(env="two_state", algorithm="td", alpha=(0.1,), metrics=("no_such_module_test:X",))
