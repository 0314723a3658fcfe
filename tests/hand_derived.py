"""Expected updates of the built-in algorithms derived by hand (independent of
`bec_jax.theory.expected_updates`), and a small episodic task, shared by the analysis tests."""
import numpy as np

from bec_jax import mdp as mdp_lib


def hand_pieces(env):
    """The expectation pieces of the hand derivation, with per-transition discounts:
    P_g = sum_a pi P gamma (target), A = Phi^T D (I - P_g) Phi, b = Phi^T D r_pi,
    f = E[rho phi] = Phi^T d, mvec and c0 with E[rho delta] = c0 + mvec . theta,
    H = E[rho gamma phi' phi^T] = Phi^T P_g^T D Phi, C = Phi^T D Phi."""
    d = mdp_lib.d_mu(env)
    Phi = np.asarray(env.phi, np.float64)
    D = np.diag(d)
    gam = mdp_lib.discounts(env)
    Pg = np.einsum("sa,sat,sat->st", env.pi, env.P, gam)
    r = np.einsum("sa,sat,sat->s", env.pi, env.P, env.R)
    S = len(d)
    A = Phi.T @ D @ (np.eye(S) - Pg) @ Phi
    b = Phi.T @ D @ r
    f = Phi.T @ d
    mvec = Phi.T @ (Pg - np.eye(S)).T @ d
    c0 = float(d @ r)
    H = Phi.T @ Pg.T @ D @ Phi
    C = Phi.T @ D @ Phi
    # Without rho (the behaviour's own expectation): SRC's rbar and literal CTDC's omega.
    Pg_mu = np.einsum("sa,sat,sat->st", env.mu, env.P, gam)
    r_mu = np.einsum("sa,sat,sat->s", env.mu, env.P, env.R)
    mvec_mu = Phi.T @ (Pg_mu - np.eye(S)).T @ d
    return dict(A=A, b=b, f=f, mvec=mvec, c0=c0, H=H, C=C, mvec_mu=mvec_mu, c0_mu=float(d @ r_mu),
                r_mu_mean=float(d @ r_mu))


def hand_expected_update(env, name, h):
    """(G, g) of each built-in algorithm, derived by hand (the pre-generic
    analysis's formulas), scaled by the step sizes h."""
    p = hand_pieces(env)
    A, b, f, mvec, c0, H, C = (p[k] for k in ("A", "b", "f", "mvec", "c0", "H", "C"))
    k = A.shape[0]
    al, be, ze = h.get("alpha", 1.0), h.get("beta", 1.0), h.get("zeta", 1.0)
    if name == "td":
        return -al * A, al * b
    if name == "tdc":
        G = np.block([[-A, -H], [-A, -C]])
        return np.diag(np.r_[[al] * k, [ze] * k]) @ G, np.r_[al * b, ze * b]
    if name in ("ctd", "vrc", "src"):
        if name == "src":  # rbar tracks the behaviour's mean reward, independent of theta
            mvec, c0 = np.zeros(k), p["r_mu_mean"]
        G = np.block([[-A, -f[:, None]], [mvec[None, :], -np.ones((1, 1))]])
        return np.diag(np.r_[[al] * k, be]) @ G, np.r_[al * b, be * c0]
    if name in ("ctdc", "ctdc_omega_no_rho"):
        if name == "ctdc_omega_no_rho":  # omega without rho tracks E_mu[delta]
            mvec, c0 = p["mvec_mu"], p["c0_mu"]
        G = np.block([[-A, -H, -f[:, None]], [-A, -C, -f[:, None]],
                      [mvec[None, :], np.zeros((1, k)), -np.ones((1, 1))]])
        return np.diag(np.r_[[al] * k, [ze] * k, be]) @ G, np.r_[al * b, ze * b, be * c0]
    raise AssertionError(name)


def episodic_env():
    """A small off-policy episodic task: 4 states, 2 actions, rewards, and
    transition-dependent discounts (gamma = 0 on the transitions out of state 3,
    which restart at state 0; 0.95 elsewhere, 1.0 on one transition)."""
    rng = np.random.default_rng(7)
    S, A = 4, 2
    P = rng.dirichlet(np.ones(S), size=(S, A))
    P[3] = 0.0
    P[3, :, 0] = 1.0
    gamma = np.full((S, A, S), 0.95)
    gamma[3] = 0.0
    gamma[0, 1, 2] = 1.0
    mu = np.array([[0.5, 0.5], [0.3, 0.7], [0.6, 0.4], [0.5, 0.5]])
    pi = np.array([[0.9, 0.1], [0.2, 0.8], [1.0, 0.0], [0.5, 0.5]])
    return mdp_lib.make_mdp(pi=pi, mu=mu, P=P, R=rng.normal(size=(S, A, S)), phi=rng.normal(size=(S, 3)),
                            gamma=gamma)
