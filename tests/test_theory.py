"""`bec_jax.experiments.theory` against quantities derived by hand here, from the
2-state chain's arrays and CTDC's update equations (not from `bec_jax.theory.expected_updates`)."""
import json

import numpy as np
import pytest

from bec_jax import envs
from bec_jax.experiments import theory
from bec_jax.theory import expected_updates as analysis


def hand_outcomes(env):
    """(p, rho, phi, phi', gamma, r) for every (s, a, s') with p = d_mu(s) mu(a|s)
    P(s'|s,a) > 0; d_mu the stationary distribution of P_mu, solved here."""
    mu, pi, P, R = (np.asarray(x, np.float64) for x in (env.mu, env.pi, env.P, env.R))
    phi = np.asarray(env.phi, np.float64)
    gamma = np.broadcast_to(np.asarray(env.gamma, np.float64), P.shape)
    S = P.shape[0]
    P_mu = np.einsum("sa,sat->st", mu, P)
    # d^T P_mu = d^T, sum d = 1
    M = np.vstack([P_mu.T - np.eye(S), np.ones((1, S))])
    d = np.linalg.lstsq(M, np.r_[np.zeros(S), 1.0], rcond=None)[0]
    out = []
    for s in range(S):
        for a in range(P.shape[1]):
            for t in range(S):
                p = d[s] * mu[s, a] * P[s, a, t]
                if p > 0:
                    out.append((p, pi[s, a] / mu[s, a], phi[s], phi[t], gamma[s, a, t], R[s, a, t]))
    return out


def hand_ctdc_matrix(env, rho_on_omega=True):
    """The Jacobian of E[increment] of (theta, u, omega) at unit step sizes, from
    theta += rho[(delta - omega) phi - gamma phi' (phi^T u)], u += rho(delta - omega
    - phi^T u) phi, omega += (rho or 1)(delta - omega), delta = r + gamma phi'^T theta
    - phi^T theta."""
    k = env.num_features
    G = np.zeros((2 * k + 1, 2 * k + 1))
    t, u, w = slice(0, k), slice(k, 2 * k), 2 * k
    for p, rho, x, y, g, _ in hand_outcomes(env):
        dd = g * y - x                    # d delta / d theta
        c = rho if rho_on_omega else 1.0
        G[t, t] += p * rho * np.outer(x, dd)
        G[t, u] += -p * rho * g * np.outer(y, x)
        G[t, w] += -p * rho * x
        G[u, t] += p * rho * np.outer(x, dd)
        G[u, u] += -p * rho * np.outer(x, x)
        G[u, w] += -p * rho * x
        G[w, t] += p * c * dd
        G[w, w] += -p * c
    return G


def hand_pieces(env):
    """A = E[rho phi (phi - gamma phi')^T], C = E[phi phi^T], f = E[phi],
    f_A = E[rho (phi - gamma phi')], f_mu = E[phi - gamma phi'], A_c = A - f f_A^T."""
    k = env.num_features
    A, C = np.zeros((k, k)), np.zeros((k, k))
    f, f_A, f_mu = np.zeros(k), np.zeros(k), np.zeros(k)
    for p, rho, x, y, g, _ in hand_outcomes(env):
        A += p * rho * np.outer(x, x - g * y)
        C += p * np.outer(x, x)
        f += p * x
        f_A += p * rho * (x - g * y)
        f_mu += p * (x - g * y)
    return {"A": A, "C": C, "f": f, "f_A": f_A, "f_mu": f_mu, "A_c": A - np.outer(f, f_A)}


def schur_slow(G, k):
    """theta's matrix once (u, omega) sit at their equilibrium."""
    return G[:k, :k] - G[:k, k:] @ np.linalg.solve(G[k:, k:], G[k:, :k])


@pytest.fixture(scope="module")
def two_state():
    return envs.make("two_state")


def test_hand_ctdc_matrix_is_the_expected_update(two_state):
    G = hand_ctdc_matrix(two_state)
    # By hand: A = -0.2, H = E[rho gamma phi' phi] = 2.7, C = 2.5, E[phi] = 1.5, E[rho delta] = 0.3 theta.
    np.testing.assert_allclose(G, [[0.2, -2.7, -1.5], [0.2, -2.5, -1.5], [0.3, 0.0, -1.0]], atol=1e-12)
    np.testing.assert_allclose(analysis.expected_update(two_state, "ctdc")[0], G, atol=1e-12)
    np.testing.assert_allclose(analysis.expected_update(two_state, "ctdc_omega_no_rho")[0],
                               hand_ctdc_matrix(two_state, rho_on_omega=False), atol=1e-12)


def test_ctdc_determinant_two_state(two_state):
    G = hand_ctdc_matrix(two_state)
    det = np.linalg.det(G)
    assert det == pytest.approx(0.05, abs=1e-12)
    facts = theory.ctdc_determinant("two_state", samples=300)
    assert facts["det"] == pytest.approx(det, abs=1e-12)
    assert facts["positive_determinant_argument_applies"]
    assert facts["scaling_max_abs_diff"] < 1e-12
    assert facts["layout"] == {"theta": [0, 1], "u": [1, 2], "omega": [2, 3]}
    np.testing.assert_allclose(facts["G1"], G, atol=1e-12)
    # Independently: at random positive step sizes diag(alpha, zeta, beta) G has a
    # real positive eigenvalue, and it matches the theory module's count.
    rng = np.random.default_rng(1)
    for alpha, beta, zeta in 10.0 ** rng.uniform(-5, 0, size=(50, 3)):
        M = np.diag([alpha, zeta, beta]) @ G
        ev = np.linalg.eigvals(M)
        real = ev[np.abs(ev.imag) <= 1e-12 * np.abs(ev).max()].real
        assert real.size and real.max() > 0, (alpha, beta, zeta, ev)
        assert np.prod(ev).real == pytest.approx(alpha * zeta * beta * det, rel=1e-8)
    for key in ("grid_check", "sample_check"):
        chk = facts[key]
        assert chk["all_have_positive_real_eigenvalue"] and chk["largest_real_eigenvalue_min"] > 0
        assert chk["unstable_points"] == chk["points"]
    assert facts["grid_check"]["points"] == 5 * 5 * 7       # the reproduction's 2-state CTDC grid
    assert facts["sample_check"]["points"] == 300
    # the unit-step ODE's unstable eigenvalue
    assert facts["unit_max_real"] == pytest.approx(np.linalg.eigvals(G).real.max(), abs=1e-12)
    assert facts["unit_max_real"] > 0.017


def test_ctdc_unit_matrix_on_boyan_and_baird_has_no_unstable_mode():
    for env_name, zeros in (("boyan_chain", 1), ("baird", 3)):
        f = theory.ctdc_determinant(env_name, samples=50)
        assert not f["positive_determinant_argument_applies"]
        assert f["unit_max_real"] < 1e-12 and f["unit_max_real_nonzero"] < -0.04
        assert f["unit_zero_eigenvalues"] == zeros == f["unit_nullity"], env_name
        assert f["grid_check"]["unstable_points"] == (0 if env_name == "boyan_chain" else 66), env_name
    # Baird with alpha far above beta and zeta (against Theorem 2's alpha = o(zeta) = o(beta)):
    # the hand-built 17 x 17 matrix has an unstable eigenvalue, ~0.058 at (0.3, 5e-4, 5e-4).
    baird = envs.make("baird")
    G = hand_ctdc_matrix(baird)
    np.testing.assert_allclose(analysis.expected_update(baird, "ctdc")[0], G, atol=1e-12)
    D = np.r_[[0.3] * 8, [5e-4] * 8, 5e-4]
    assert np.linalg.eigvals(D[:, None] * G).real.max() == pytest.approx(0.0582, abs=1e-4)


def test_rho_convention_against_hand_slow_matrices(two_state):
    p = hand_pieces(two_state)
    A, C, A_c, f, f_mu = p["A"], p["C"], p["A_c"], p["f"], p["f_mu"]
    np.testing.assert_allclose([A[0, 0], C[0, 0], A_c[0, 0]], [-0.2, 2.5, 0.25], atol=1e-12)
    with_rho = -A.T @ np.linalg.inv(C) @ A_c                          # +0.02
    no_rho = -A.T @ np.linalg.inv(C) @ (A - np.outer(f, f_mu))       # -0.034
    np.testing.assert_allclose(schur_slow(hand_ctdc_matrix(two_state), 1), with_rho, atol=1e-12)
    np.testing.assert_allclose(schur_slow(hand_ctdc_matrix(two_state, False), 1), no_rho, atol=1e-12)
    r = theory.rho_convention("two_state")
    assert r["ctdc_rho_on_omega"]["slow_max_real"] == pytest.approx(with_rho[0, 0], abs=1e-12)
    assert r["ctdc_omega_no_rho"]["slow_max_real"] == pytest.approx(no_rho[0, 0], abs=1e-12)
    assert with_rho[0, 0] == pytest.approx(0.02) and no_rho[0, 0] == pytest.approx(-0.034)
    assert r["ctdc_rho_on_omega"]["verdict"] == "unstable" and r["ctdc_omega_no_rho"]["verdict"] == "stable"
    assert r["verdict_flips"]
    assert r["rejection_vs_ctdc_max_abs_diff"] < 1e-12
    # The proof's matrix -A_c^T C^-1 A_c would be stable: -0.025.
    w = theory.why_escape("two_state")
    assert w["proof_matrix_max_real"] == pytest.approx(-(A_c[0, 0] ** 2) / C[0, 0], abs=1e-12)


def test_hypotheses_ranks():
    boyan, baird, two = (theory.hypotheses(e) for e in ("boyan_chain", "baird", "two_state"))
    assert (boyan["k"], boyan["A_c"]["rank"], boyan["A"]["rank"], boyan["C"]["rank"]) == (4, 3, 4, 4)
    assert (baird["k"], baird["A_c"]["rank"], baird["A"]["rank"], baird["C"]["rank"]) == (8, 6, 7, 7)
    assert boyan["A_c"]["singular"] and not boyan["C"]["singular"]
    assert baird["A_c"]["singular"] and baird["C"]["singular"]
    assert not boyan["theorem2_hypotheses_hold"] and not baird["theorem2_hypotheses_hold"]
    assert two["theorem2_hypotheses_hold"]      # ... and yet CTDC's slow ODE is unstable there


def test_why_escape(two_state):
    p = hand_pieces(two_state)
    extra = np.outer(p["f_A"], p["f"]) @ np.linalg.inv(p["C"]) @ p["A_c"]     # -0.045
    w = theory.why_escape("two_state")
    assert not w["one_in_feature_span"] and w["one_residual_plain_rms"] > 0.3
    assert w["extra_term_norm"] == pytest.approx(abs(extra[0, 0]), abs=1e-12)
    assert w["extra_term_norm"] == pytest.approx(0.045) and not w["extra_term_vanishes"]
    for env_name in ("boyan_chain", "baird"):
        w = theory.why_escape(env_name)
        assert w["one_in_feature_span"], env_name
        assert w["extra_term_norm"] < 1e-12 and w["extra_term_vanishes"], env_name
    for env_name in theory.ENVIRONMENTS:
        w = theory.why_escape(env_name)
        assert w["slow_repo_vs_formula_max_abs_diff"] < 1e-12
        assert w["slow_identity_max_abs_diff"] < 1e-12
        assert w["rank_one_identity_max_abs_diff"] < 1e-12


def test_ctd_stability_map():
    m = theory.ctd_stability_map("two_state")
    # Hand: the (theta, omega) matrix is [[-A, -f], [-f_A, -1]] = [[0.2, -1.5], [0.3, -1]];
    # with beta = r alpha: trace 0.2 - r, det 0.25 r > 0, so stable iff r > 0.2.
    assert 0.1 <= m["threshold_grid"] <= 0.4
    assert m["threshold"] == pytest.approx(0.2, abs=1e-9)
    assert m["threshold_closed_form"] == pytest.approx(0.2, abs=1e-12)
    assert m["stable_set_is_upward_closed"]
    for r, x in zip(m["ratios"], m["max_real_over_alpha"]):
        ev = np.linalg.eigvals(np.array([[0.2, -1.5], [0.3 * r, -r]]))
        assert x == pytest.approx(ev.real.max(), abs=1e-9), r
    b = theory.ctd_stability_map("baird")
    assert b["stable_set_is_upward_closed"] and 0.2 < b["threshold"] < 0.32
    assert b["unit_zero_eigenvalues"] == 2      # null(A_c): the fixpoints form a plane


def test_all_facts_is_json():
    facts = theory.all_facts()
    text = json.dumps(facts, allow_nan=False)
    assert set(facts) == {"ctdc_determinant", "why_escape", "rho_convention", "hypotheses", "ctd_stability_map"}
    assert json.loads(text)["ctdc_determinant"]["two_state"]["det"] == pytest.approx(0.05)
