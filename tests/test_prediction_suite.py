"""The off-policy prediction suite: each task against a hand-written model, the
RMSPBE against Ghiassian et al. (2020)'s own formulas, GTD2, TDRC, ETD and
centered ETD against hand-computed steps and hand-derived expected updates, and
convergence where the literature says so."""
import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from hand_derived import episodic_env, hand_pieces

from bec_jax import algorithms, envs
from bec_jax import mdp as mdp_lib
from bec_jax.prediction import sweep
from bec_jax.prediction.spec import SweepSpec
from bec_jax.theory import expected_updates as analysis
from bec_jax.theory import fixpoints, metrics
from bec_jax.transition import Transition

S5 = 5


# ------------------------------------------------------------------ tasks by hand

def test_random_walk_model_by_hand():
    env = envs.make("random_walk")
    P, R, g = np.zeros((5, 2, 5)), np.zeros((5, 2, 5)), np.ones((5, 2, 5))
    for s in range(5):
        if s > 0:
            P[s, 0, s - 1] = 1
        if s < 4:
            P[s, 1, s + 1] = 1
    P[0, 0, 2] = P[4, 1, 2] = 1       # leaving an end: back to the middle state 2 ...
    R[0, 0, 2], R[4, 1, 2] = -1, 1    # ... with reward -1 or +1 ...
    g[0, 0, 2] = g[4, 1, 2] = 0       # ... and the episode ends
    np.testing.assert_array_equal(env.P, P)
    np.testing.assert_array_equal(env.R, R)
    np.testing.assert_array_equal(mdp_lib.discounts(env), g)
    np.testing.assert_array_equal(env.pi, np.tile([0.4, 0.6], (5, 1)))
    np.testing.assert_array_equal(env.mu, np.tile([0.5, 0.5], (5, 1)))
    np.testing.assert_array_equal(env.start, [0, 0, 1, 0, 0])
    np.testing.assert_allclose(mdp_lib.d_mu(env), np.array([1, 2, 3, 2, 1]) / 9, atol=1e-12)
    np.testing.assert_array_equal(env.phi, np.eye(5))
    inv = (np.ones((5, 5)) - np.eye(5)) / 2.0
    np.testing.assert_allclose(envs.make("random_walk", features="inverted").phi, inv)
    dep = np.array([[1, 0, 0], [1, 1, 0], [1, 1, 1], [0, 1, 1], [0, 0, 1]], float)
    dep /= np.linalg.norm(dep, axis=1, keepdims=True)
    np.testing.assert_allclose(envs.make("random_walk", features="dependent").phi, dep)
    padded = envs.make("random_walk", features="dependent", pad_to=5).phi
    np.testing.assert_allclose(padded, np.hstack([dep, np.zeros((5, 2))]))
    # v_pi of the episodic walk: v = P_g v + r under pi, solved here from scratch.
    pl, pr = 0.4, 0.6
    M = np.zeros((5, 5))
    r = np.zeros(5)
    for s in range(5):
        if s > 0:
            M[s, s - 1] = pl
        if s < 4:
            M[s, s + 1] = pr
    r[0], r[4] = -pl, pr
    np.testing.assert_allclose(mdp_lib.v_pi(env), np.linalg.solve(np.eye(5) - M, r), atol=1e-12)
    with pytest.raises(ValueError, match="features: 'dependent' needs an odd number"):
        envs.make("random_walk", n=4, features="dependent")
    with pytest.raises(ValueError, match="pad_to: at least the 3 features"):
        envs.make("random_walk", features="dependent", pad_to=2)


def test_continuing_random_walk_by_hand():
    env = envs.make("random_walk_continuing", n=7, gamma=0.8)
    assert float(env.gamma) == 0.8 and env.gamma.ndim == 0        # one discount, no episode ends
    assert env.P[0, 0, 3] == 1 and env.R[0, 0, 3] == -1 and env.P[6, 1, 3] == 1 and env.R[6, 1, 3] == 1
    assert env.P[3, 0, 2] == 1 and env.P[3, 1, 4] == 1 and env.R[3].sum() == 0
    np.testing.assert_allclose(mdp_lib.d_mu(env).sum(), 1.0)
    with pytest.raises(ValueError, match="gamma: must be in"):
        envs.make("random_walk_continuing", gamma=1.0)


def tdrc_code_rmspbe(features: str, w) -> float:
    """Ghiassian et al.'s RMSPBE exactly as their code computes it
    (environments/RandomWalk.getXPRD, utils/errors.buildRMSPBE): a terminal
    sixth state with a zero feature vector, P and R under the target policy, the
    behaviour's state distribution D, gamma 1."""
    N = 5
    X = np.zeros((N + 1, envs.make("random_walk", features=features).num_features))
    X[:N] = envs.make("random_walk", features=features).phi
    P = np.zeros((N + 1, N + 1))
    pl, pr = 0.4, 0.6
    P[0, 1], P[0, N] = pr, pl
    P[N - 1, N - 2], P[N - 1, N] = pl, pr
    for i in range(1, N - 1):
        P[i, i - 1], P[i, i + 1] = pl, pr
    R = np.zeros(N + 1)
    R[0], R[N - 1] = -pl, pr
    D = np.diag([1, 2, 3, 2, 1, 0]) / 9.0
    A = X.T @ D @ (np.eye(N + 1) - P) @ X
    b = X.T @ D @ R
    C = X.T @ D @ X
    v = b - A @ w
    return float(np.sqrt(v @ np.linalg.pinv(C) @ v))


@pytest.mark.parametrize("features", ["tabular", "inverted", "dependent"])
def test_random_walk_rmspbe_matches_the_papers_code(features):
    env = envs.make("random_walk", features=features)
    rng = np.random.default_rng(1)
    for w in [np.zeros(env.num_features), *rng.normal(size=(4, env.num_features))]:
        assert metrics.rmspbe(env, w) == pytest.approx(tdrc_code_rmspbe(features, w), rel=1e-10, abs=1e-13)
    # The value at 0 for tabular features: sqrt(r_D^T C^-1 r_D) with r_D = D r.
    if features == "tabular":
        d = np.array([1, 2, 3, 2, 1]) / 9
        r = np.array([-0.4, 0, 0, 0, 0.6])
        assert metrics.rmspbe(env, np.zeros(5)) == pytest.approx(np.sqrt(np.sum(d * r * r)), rel=1e-12)


def test_kolter_counterexample_by_hand():
    env = envs.make("kolter")
    eps = 0.01
    p = (2961 + 45240 * eps + 40400 * eps ** 2) / (4141 + 84840 * eps + 40400 * eps ** 2)
    np.testing.assert_allclose(env.mu, [[p, 1 - p], [p, 1 - p]])
    np.testing.assert_allclose(env.pi, 0.5)
    np.testing.assert_allclose(env.phi, [[1.0], [1.06]])
    np.testing.assert_allclose(env.R[0], -0.01475)
    np.testing.assert_allclose(env.R[1], 0.03525)
    np.testing.assert_allclose(mdp_lib.d_mu(env), [p, 1 - p], atol=1e-12)
    # By hand: A = sum_s d_s phi_s (phi_s - gamma * mean phi), which the chosen p makes 0.
    phi = np.array([1.0, 1.06])
    d = np.array([p, 1 - p])
    A_hand = np.sum(d * phi * (phi - 0.99 * phi.mean()))
    assert abs(A_hand) < 1e-12
    A, b = fixpoints.td_matrices(env)
    assert abs(A[0, 0]) < 1e-12 and abs(b[0]) > 1e-3     # the TD fixpoint b / A is at infinity
    # The value function is nearly representable: the best weight has a small error.
    v = mdp_lib.v_pi(env)
    best = np.sum(d * phi * v) / np.sum(d * phi * phi)
    assert metrics.rmsve(env, [best]) < 0.05 * np.abs(v).max()
    # A different behaviour (p = 1/2, on-policy) has a finite fixpoint.
    assert abs(fixpoints.td_matrices(envs.make("kolter", p=0.5))[0][0, 0]) > 0.01


def test_sutton_barto_11_4_same_data_different_bellman_error():
    left, right = envs.make("sutton_barto_11_4", mrp="left"), envs.make("sutton_barto_11_4", mrp="right")

    def data_distribution(env, length):
        """P(x(S_0), R_1, x(S_1), ..., R_n, x(S_n)) with S_0 ~ d, by enumeration."""
        d = mdp_lib.d_mu(env)
        out = {}
        for path in itertools.product(range(env.num_states), repeat=length + 1):
            p = d[path[0]]
            key = [tuple(env.phi[path[0]])]
            for s, s2 in zip(path, path[1:]):
                p *= env.P[s, 0, s2]
                key += [float(env.R[s, 0, s2]), tuple(env.phi[s2])]
            if p > 0:
                out[tuple(key)] = out.get(tuple(key), 0.0) + p
        return out

    for n in (1, 2, 3):
        a, b = data_distribution(left, n), data_distribution(right, n)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], abs=1e-12)
    w = np.zeros(2)
    assert metrics.rmsbe(left, w) == pytest.approx(0.0, abs=1e-12)
    assert metrics.rmsbe(right, w) == pytest.approx(np.sqrt(2 / 3), rel=1e-12)   # errors +1 and -1 on B, B'
    assert metrics.rmscbe(right, w) == pytest.approx(np.sqrt(2 / 3), rel=1e-12)
    # Both are 0 in exact arithmetic; the two models' matrices round differently (6.8e-17 on
    # an AVX2 CPU, 0.0 on AVX-512), so each is compared with 0, not with the other.
    assert metrics.rmspbe(left, w) == pytest.approx(0.0, abs=1e-12)
    assert metrics.rmspbe(right, w) == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(fixpoints.td_fixpoint(left), fixpoints.td_fixpoint(right), atol=1e-12)


def test_random_mdp_generator_validates_for_many_seeds():
    for seed in range(60):
        for off in (True, False):
            env = envs.make("random_mdp", states=6, actions=3, features=3, sparsity=0.6, off_policy=off, seed=seed)
            mdp_lib.validate(env)  # every draw is a valid model
            if not off:
                np.testing.assert_array_equal(env.pi, env.mu)
    a, b = envs.make("random_mdp", seed=7), envs.make("random_mdp", seed=7)
    assert mdp_lib.fingerprint(a) == mdp_lib.fingerprint(b)
    assert mdp_lib.fingerprint(a) != mdp_lib.fingerprint(envs.make("random_mdp", seed=8))
    dense = envs.make("random_mdp", states=20, sparsity=0.0, seed=1)
    sparse = envs.make("random_mdp", states=20, sparsity=0.8, seed=1)
    assert (sparse.P > 0).mean() < 0.5 * (dense.P > 0).mean()
    assert envs.make("random_mdp", features=3, constant=True).phi[:, -1].tolist() == [1.0] * 10


def test_tabular_boyan_centered_fixpoint_is_the_centered_value_function():
    env = envs.make("boyan_chain", features="tabular")
    fs = fixpoints.centered_td_fixpoint_set(env)
    assert fs.null_space.shape[1] == 1  # the constant shift
    d, v = mdp_lib.d_mu(env), mdp_lib.v_pi(env)
    values = env.phi @ fs.theta
    # C V = C v_pi: equal up to a constant (the paper's centered fixpoint, eq. (26)).
    np.testing.assert_allclose(values - d @ values, v - d @ v, atol=1e-8)
    assert metrics.rmscbe(env, fs.theta) < 1e-9


# ------------------------------------------------------------------ steps by hand

K, GAMMA = 4, 0.9


def transition(seed, rho=1.7, discount=GAMMA):
    r = np.random.default_rng(seed)
    return dict(phi=r.normal(size=K), phi_next=r.normal(size=K), reward=float(r.normal()), discount=discount,
                rho=rho)


def as_tr(t):
    return Transition(phi=jnp.asarray(t["phi"], jnp.float32), reward=jnp.float32(t["reward"]),
                      discount=jnp.float32(t["discount"]), phi_next=jnp.asarray(t["phi_next"], jnp.float32),
                      rho=jnp.float32(t["rho"]))


def delta(th, t):
    return t["reward"] + t["discount"] * t["phi_next"] @ th - t["phi"] @ th


def test_gtd2_and_tdrc_steps_by_hand():
    r = np.random.default_rng(0)
    th, h = r.normal(size=K), r.normal(size=K)
    t = transition(1)
    a, eta, reg = 0.05, 0.5, 0.3
    d, dh = delta(th, t), h @ t["phi"]
    # GTD2 (the TDRC paper's code): theta += a rho dh (x - g x'); h += eta a (rho d - dh) x
    st = algorithms.gtd2.GTD2State(jnp.asarray(th, jnp.float32), jnp.asarray(h, jnp.float32), jnp.int32(0))
    new = algorithms.get("gtd2").apply(st, as_tr(t), {"alpha": a, "eta": eta})
    np.testing.assert_allclose(new.theta, th + a * t["rho"] * dh * (t["phi"] - GAMMA * t["phi_next"]), rtol=2e-5)
    np.testing.assert_allclose(new.h, h + eta * a * (t["rho"] * d - dh) * t["phi"], rtol=2e-5)
    # TDRC: theta += a rho (d x - g dh x'); h += eta a [(rho d - dh) x - reg h]
    st = algorithms.tdrc.TDRCState(jnp.asarray(th, jnp.float32), jnp.asarray(h, jnp.float32), jnp.int32(0))
    new = algorithms.get("tdrc").apply(st, as_tr(t), {"alpha": a, "eta": eta, "reg": reg})
    np.testing.assert_allclose(new.theta, th + a * t["rho"] * (d * t["phi"] - GAMMA * dh * t["phi_next"]),
                               rtol=2e-5)
    np.testing.assert_allclose(new.h, h + eta * a * ((t["rho"] * d - dh) * t["phi"] - reg * h), rtol=2e-5)
    # reg = 0 is the code's TDC.
    new0 = algorithms.get("tdrc").apply(st, as_tr(t), {"alpha": a, "eta": eta, "reg": 0.0})
    np.testing.assert_allclose(new0.h, h + eta * a * (t["rho"] * d - dh) * t["phi"], rtol=2e-5)


def test_etd_and_centered_etd_steps_by_hand():
    """Three steps: the followon trace F_t = rho_{t-1} gamma_t F_{t-1} + i, cut by an
    episode's end (discount 0)."""
    a, b, i = 0.05, 0.2, 1.5
    ts = [transition(10, rho=2.0), transition(11, rho=0.5, discount=0.0), transition(12, rho=1.2)]
    th = np.random.default_rng(3).normal(size=K)
    th_e, th_c, om, F_prev, rho_prev, g_prev = th.copy(), th.copy(), 0.3, 0.0, 0.0, 0.0
    st_e = algorithms.etd.init(jnp.asarray(th, jnp.float32))
    st_c = algorithms.etd.init_centered(jnp.asarray(th, jnp.float32), 0.3)
    for t in ts:
        F = rho_prev * g_prev * F_prev + i
        th_e = th_e + a * t["rho"] * F * delta(th_e, t) * t["phi"]
        err = delta(th_c, t) - om
        th_c, om = th_c + a * t["rho"] * F * err * t["phi"], om + b * t["rho"] * F * err
        F_prev, rho_prev, g_prev = F, t["rho"], t["discount"]
        st_e = algorithms.get("etd").apply(st_e, as_tr(t), {"alpha": a, "interest": i})
        st_c = algorithms.get("cetd").apply(st_c, as_tr(t), {"alpha": a, "beta": b, "interest": i})
        np.testing.assert_allclose(st_e.theta, th_e, rtol=2e-5)
        np.testing.assert_allclose(st_c.theta, th_c, rtol=2e-5)
        np.testing.assert_allclose(st_c.omega, om, rtol=2e-5)
        np.testing.assert_allclose(st_e.f, rho_prev * g_prev * F, rtol=2e-6)
    assert float(st_e.f) == pytest.approx(1.2 * GAMMA * i)  # the trace restarted after the episode's end


# ------------------------------------------------------------------ expected updates by hand

def emphatic_m(env, interest=1.0):
    d = mdp_lib.d_mu(env)
    Pg = np.einsum("sa,sat,sat->st", env.pi, env.P, mdp_lib.discounts(env))
    return np.linalg.solve(np.eye(len(d)) - Pg.T, d * interest), Pg


@pytest.mark.parametrize("env_name", ["two_state", "episodic", "kolter", "random_walk"])
def test_expected_updates_of_the_baselines_by_hand(env_name):
    env = episodic_env() if env_name == "episodic" else envs.make(env_name)
    p = hand_pieces(env)
    A, b, H, C = p["A"], p["b"], p["H"], p["C"]
    k = A.shape[0]
    eta, reg = 0.7, 0.4
    # GTD2: E[dtheta] = A^T h, E[dh] = eta (b - A theta - C h).
    G, g = analysis.expected_update(env, "gtd2", {"eta": eta})
    np.testing.assert_allclose(G, np.block([[np.zeros((k, k)), A.T], [-eta * A, -eta * C]]), atol=1e-12)
    np.testing.assert_allclose(g, np.r_[np.zeros(k), eta * b], atol=1e-12)
    # TDRC: E[dtheta] = b - A theta - H h, E[dh] = eta (b - A theta - (C + reg I) h).
    G, g = analysis.expected_update(env, "tdrc", {"eta": eta, "reg": reg})
    np.testing.assert_allclose(G, np.block([[-A, -H], [-eta * A, -eta * (C + reg * np.eye(k))]]), atol=1e-12)
    np.testing.assert_allclose(g, np.r_[b, eta * b], atol=1e-12)
    # ETD: Phi^T M (r + (P_g - I) Phi theta) with M = diag(m), m = (I - P_g^T)^-1 (d i).
    m, Pg = emphatic_m(env, 2.0)
    Phi = np.asarray(env.phi, float)
    r = np.einsum("sa,sat,sat->s", env.pi, env.P, env.R)
    G, g = analysis.expected_update(env, "etd", {"interest": 2.0})
    A_m = Phi.T @ np.diag(m) @ (np.eye(len(m)) - Pg) @ Phi
    np.testing.assert_allclose(G, -A_m, atol=1e-12)
    np.testing.assert_allclose(g, Phi.T @ (m * r), atol=1e-12)
    # Centered ETD: theta's row less Phi^T m omega; omega: m^T (r + (P_g - I) Phi theta) - (1^T m) omega.
    G, g = analysis.expected_update(env, "cetd", {"alpha": 0.5, "beta": 0.2, "interest": 2.0})
    Gh = np.block([[-0.5 * A_m, -0.5 * (Phi.T @ m)[:, None]],
                   [0.2 * (m @ (Pg - np.eye(len(m))) @ Phi)[None, :], -0.2 * np.full((1, 1), m.sum())]])
    np.testing.assert_allclose(G, Gh, atol=1e-12)
    np.testing.assert_allclose(g, np.r_[0.5 * Phi.T @ (m * r), 0.2 * m @ r], atol=1e-12)
    # ETD's matrix is positive definite (Sutton, Mahmood & White 2016).
    assert np.linalg.eigvalsh(A_m + A_m.T).min() > -1e-12


def test_centered_td_lambda_expected_update_is_a_lambda():
    env = episodic_env()
    lam = 0.6
    d = mdp_lib.d_mu(env)
    Pg = np.einsum("sa,sat,sat->st", env.pi, env.P, mdp_lib.discounts(env))
    Phi = np.asarray(env.phi, float)
    S = len(d)
    A_lam = Phi.T @ np.diag(d) @ np.linalg.solve(np.eye(S) - lam * Pg, (np.eye(S) - Pg) @ Phi)
    G, g = analysis.expected_update(env, "ctd_lambda", {"lambda": lam})
    k = env.num_features
    np.testing.assert_allclose(G[:k, :k], -A_lam, atol=1e-12)
    assert list(analysis.state_layout(env, "ctd_lambda")) == ["theta", "omega"]
    G0, _ = analysis.expected_update(env, "ctd_lambda", {"lambda": 0.0})
    np.testing.assert_allclose(G0, analysis.expected_update(env, "ctd")[0], atol=1e-13)


# ------------------------------------------------------------------ convergence

@pytest.fixture(scope="module")
def baird_runs():
    spec = SweepSpec(env="baird", env_params={"start_state": 6}, algorithm="tdrc", alpha=(2.0 ** -6,),
                     reg=(0.0, 1.0), seeds=12, steps=20000, log_every=2000, metrics=("rmspbe",))
    return sweep.run(spec), sweep.run(spec.replace(algorithm="gtd2", hyperparameters={"alpha": (2.0 ** -6,)},
                                                   points=None))


def test_tdrc_tdc_and_gtd2_converge_on_baird(baird_runs):
    tdrc, gtd2 = baird_runs
    for r in (tdrc, gtd2):
        assert np.all(r.diverged_fraction == 0)
        assert np.all(r.mean[0, :, 0] > 1.0)          # RMSPBE starts large on Baird ...
        assert np.all(r.final_mean("rmspbe") < 0.05)  # ... and ends small
    # TD at the same step size diverges.
    td = sweep.run(SweepSpec(env="baird", algorithm="td", alpha=(2.0 ** -6,), seeds=4, steps=20000, log_every=2000))
    assert td.diverged_fraction[0] == 1.0


def test_on_policy_centered_etd_converges_to_its_fixpoint():
    """On-policy (behaviour = target) episodic random walk with dependent features:
    centered ETD goes to the zero of the emphatic projected centered error."""
    spec = SweepSpec(env="random_walk", env_params={"features": "dependent", "p_left_behaviour": 0.4},
                     algorithm="cetd", alpha=(0.005,), beta=(0.01,), seeds=16, steps=40000, log_every=4000,
                     metrics=("rmspcbe_emphatic",), schedule={"kind": "robbins_monro", "t0": 20000.0,
                                                              "p_alpha": 1.0, "p_beta": 0.7})
    r = sweep.run(spec)
    assert r.diverged_fraction[0] == 0
    # From 0.215 to about 0.02 (the emphasis, up to the episode's length with
    # gamma = 1, makes the updates noisy; the decaying step sizes slowly remove it).
    assert r.mean[0, 0, -1] < 0.12 * r.mean[0, 0, 0]
    assert r.mean[0, 0, 1:].max() < 0.2 * r.mean[0, 0, 0]
    # The exact analysis agrees: every eigenvalue of its ODE has negative real part here.
    env = envs.make("random_walk", features="dependent", p_left_behaviour=0.4)
    assert np.linalg.eigvals(analysis.expected_update(env, "cetd")[0]).real.max() < 0
