"""Exact mean-square stability (bec_jax.theory.mean_square) against a hand-worked
scalar case, a Monte Carlo estimate of E[Gamma (x) Gamma] from the package's own
sampler, and an independent NumPy construction of Costa-Fragoso-Marques'
operator on a small off-policy MDP."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax import algorithms, mdp
from bec_jax.prediction import sampling
from bec_jax.theory import mean_square as msq

# ------------------------------------------------------------------ hand-worked

def _scalar_env():
    """Two states, one action, s' ~ (1/2, 1/2) from either (so Markov = i.i.d.),
    phi = (1, 3), gamma = 0, reward 1 on leaving state 0. TD is then
    x' = (1 - alpha phi^2) x + alpha r phi: Gamma = 1 - alpha or 1 - 9 alpha,
    b = alpha or 0, each with probability 1/2."""
    R = np.zeros((2, 1, 2))
    R[0] = 1.0
    return mdp.make_mdp(pi=np.ones((2, 1)), mu=np.ones((2, 1)), P=np.full((2, 1, 2), 0.5), R=R,
                        phi=np.array([[1.0], [3.0]]), gamma=0.0)


@pytest.mark.parametrize("sampler", ["iid", "markov"])
def test_scalar_mean_stable_variance_grows_by_hand(sampler):
    env = _scalar_env()
    # alpha = 0.3: E[Gamma] = 1 - 5 alpha = -0.5, E[Gamma^2] = 1 - 10 alpha + 41 alpha^2 = 1.69.
    ms = msq.mean_square(env, "td", {"alpha": 0.3}, sampler)
    assert ms.mean_radius == pytest.approx(0.5, abs=1e-12)
    assert ms.radius == pytest.approx(1.69, abs=1e-12)
    assert ms.mean_stable and not ms.bounded and ms.stationary is None
    assert ms.label == "mean stable, variance grows"
    assert ms.rate == pytest.approx(0.5 * np.log(1.69), abs=1e-12) and ms.rate > 0
    assert ms.mean_rate == pytest.approx(np.log(0.5), abs=1e-12)
    # alpha = 0.1: E[Gamma] = 0.5, E[Gamma^2] = 0.41, E[b] = 0.05, E[Gamma b] = 0.045,
    # E[b^2] = 0.005: stationary mean 0.05 / 0.5 = 0.1, second moment
    # (2 * 0.045 * 0.1 + 0.005) / (1 - 0.41) = 0.014 / 0.59.
    ms = msq.mean_square(env, "td", {"alpha": 0.1}, sampler)
    assert ms.bounded and ms.label == "stable in mean square"
    assert ms.radius == pytest.approx(0.41, abs=1e-12)
    assert ms.steps_to_tol == pytest.approx(np.log(1e-3) / (0.5 * np.log(0.41)), rel=1e-12)
    assert ms.stationary.mean[0] == pytest.approx(0.1, abs=1e-12)
    assert ms.stationary.second[0, 0] == pytest.approx(0.014 / 0.59, abs=1e-12)
    assert ms.stationary.fixpoint[0] == pytest.approx(0.1, abs=1e-12)  # alpha r phi / alpha phi^2 averaged
    # the boundary: E[Gamma^2] = 1 at alpha = 10/41; 1 - 5 alpha > -1 there too.
    assert msq.mean_square(env, "td", {"alpha": 10 / 41}, sampler).radius == pytest.approx(1.0, abs=1e-12)
    # both moments diverge past alpha = 0.4 (|1 - 5 alpha| > 1)
    assert msq.mean_square(env, "td", {"alpha": 0.45}, sampler).label == "diverges in mean"


# ------------------------------------------------------------------ a small off-policy MDP

def _small_env(seed=3):
    rng = np.random.default_rng(seed)
    S, A, k = 3, 2, 2
    P = rng.dirichlet(np.ones(S), size=(S, A))
    pi = rng.dirichlet(np.ones(A), size=S)
    mu = rng.dirichlet(np.ones(A) * 3, size=S)
    return mdp.make_mdp(pi=pi, mu=mu, P=P, R=rng.normal(size=(S, A, S)), phi=rng.normal(size=(S, k)), gamma=0.9)


def _ctd_numpy(phi, phi_n, r, g, rho, alpha, beta):
    """CTD's (Gamma, b) for one transition, from the paper's eqs. (30)-(31):
    theta += alpha rho (delta - omega) phi, omega += beta rho (delta - omega)."""
    k = len(phi)
    d = g * phi_n - phi                       # delta = r + d^T theta
    Gam = np.eye(k + 1)
    Gam[:k, :k] += alpha * rho * np.outer(phi, d)
    Gam[:k, k] -= alpha * rho * phi
    Gam[k, :k] += beta * rho * d
    Gam[k, k] -= beta * rho
    return Gam, np.concatenate([alpha * rho * r * phi, [beta * rho * r]])


def _cfm(env, alpha, beta):
    """Costa-Fragoso-Marques' operator built independently: the mode is the
    outcome Y = (s, a, s') itself, p_ij = [s'_i = s_j] mu(a_j|s_j) P(s'_j|s_j, a_j),
    T[j, i] = p_ij Gamma_i (x) Gamma_i (CFM Prop. 3.1), and the stationary
    moments with the affine term from their eqs. for q_j, Q_j, solved densely."""
    S, A = env.mu.shape
    P, mu, pi = np.asarray(env.P), np.asarray(env.mu), np.asarray(env.pi)
    Pmu = np.einsum("sa,sat->st", mu, P)
    w, V = np.linalg.eig(Pmu.T)
    d = np.real(V[:, np.argmin(np.abs(w - 1))])
    d = d / d.sum()
    out = [(s, a, t) for s in range(S) for a in range(A) for t in range(S) if mu[s, a] * P[s, a, t] > 0]
    m = len(out)
    phi = np.asarray(env.phi)
    G, B = zip(*[_ctd_numpy(phi[s], phi[t], env.R[s, a, t], 0.9, pi[s, a] / mu[s, a], alpha, beta)
                 for s, a, t in out])
    n = G[0].shape[0]
    p = np.array([[mu[sj, aj] * P[sj, aj, tj] if out[i][2] == sj else 0.0 for i in range(m)]
                  for (sj, aj, tj) in out])             # p[j, i]
    stat = np.array([d[s] * mu[s, a] * P[s, a, t] for s, a, t in out])
    T = np.zeros((m * n * n, m * n * n))
    Bop = np.zeros((m * n, m * n))
    for j in range(m):
        for i in range(m):
            T[j * n * n:(j + 1) * n * n, i * n * n:(i + 1) * n * n] = p[j, i] * np.kron(G[i], G[i])
            Bop[j * n:(j + 1) * n, i * n:(i + 1) * n] = p[j, i] * G[i]
    c1 = np.concatenate([sum(p[j, i] * stat[i] * B[i] for i in range(m)) for j in range(m)])
    q = np.linalg.solve(np.eye(m * n) - Bop, c1).reshape(m, n)
    c2 = np.concatenate([sum(p[j, i] * (np.outer(G[i] @ q[i], B[i]) + np.outer(B[i], G[i] @ q[i])
                                         + stat[i] * np.outer(B[i], B[i])) for i in range(m)).ravel()
                         for j in range(m)])
    Q = np.linalg.solve(np.eye(m * n * n) - T, c2).reshape(m, n, n)
    return (np.abs(np.linalg.eigvals(T)).max(), np.abs(np.linalg.eigvals(Bop)).max(), q.sum(0), Q.sum(0))


@pytest.mark.parametrize("alpha,beta", [(0.05, 0.1), (0.4, 0.9)])
def test_markov_operator_matches_an_independent_numpy_construction(alpha, beta):
    env = _small_env()
    radius, mean_radius, mean, second = _cfm(env, alpha, beta)
    system = msq.jump_system(env, "ctd", {"alpha": alpha, "beta": beta}, "markov")
    for method in ("dense", "arnoldi"):
        ms = msq.analyse(system, "markov", method=method)
        assert ms.neutral == 0 and ms.method == method
        # Two float64 constructions of one spectrum (differently ordered sums): rounding only.
        assert ms.radius == pytest.approx(radius, rel=1e-9)
        assert ms.mean_radius == pytest.approx(mean_radius, rel=1e-9)
        if radius < 1:
            np.testing.assert_allclose(ms.stationary.mean, mean, rtol=1e-7, atol=1e-9)
            np.testing.assert_allclose(ms.stationary.second, second, rtol=1e-7, atol=1e-9)
        else:
            assert ms.stationary is None
    # The two settings differ on this chain: Markov noise is correlated.
    iid = msq.mean_square(env, "ctd", {"alpha": alpha, "beta": beta}, "iid")
    assert abs(iid.radius - radius) > 1e-6
    assert iid.mean_radius ** 2 <= iid.radius + 1e-12 and mean_radius ** 2 <= radius + 1e-12  # Jensen


def test_stationary_moments_by_gmres_match_the_dense_solve(monkeypatch):
    """The matrix-free path (GMRES on I - T) of the stationary moments, forced on
    the small case, against the independent dense construction."""
    env = _small_env()
    _, _, mean, second = _cfm(env, 0.05, 0.1)
    monkeypatch.setattr(msq, "STATIONARY_DENSE_MAX", 0)
    ms = msq.mean_square(env, "ctd", {"alpha": 0.05, "beta": 0.1}, "markov")
    # GMRES stops at a relative residual of 1e-10; the operator's condition
    # number here is about 1 / (1 - radius) ~ 1e2.
    np.testing.assert_allclose(ms.stationary.mean, mean, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(ms.stationary.second, second, rtol=1e-6, atol=1e-8)
    assert msq.mean_square(env, "ctd", {"alpha": 0.05, "beta": 0.1}, stationary=False).stationary is None


def test_the_small_case_has_both_verdicts():
    """The chosen step sizes above give one bounded and one unbounded second moment."""
    env = _small_env()
    assert _cfm(env, 0.05, 0.1)[0] < 1 < _cfm(env, 0.4, 0.9)[0]


# ------------------------------------------------------------------ Monte Carlo

def test_iid_operator_matches_a_monte_carlo_estimate_from_the_sampler():
    """E[Gamma (x) Gamma] estimated from transitions drawn by the package's i.i.d.
    sampler, with Gamma the Jacobian of CTDC's update by autodiff (not the
    unit-vector reading of `jump_system`)."""
    env = _small_env()
    hp = {"alpha": 0.2, "beta": 0.3, "zeta": 0.5}
    alg = algorithms.get("ctdc")
    k = env.num_features
    N = 20_000
    with jax.enable_x64(True):
        sampler = sampling.make_sampler(env, "iid", jnp.float64)
        keys = jax.random.split(jax.random.key(0), N)
        tr, _ = jax.vmap(lambda key: sampler.step(key, jnp.int32(0)))(keys)

        def step(x, t):
            s = alg.init(x[:k])._replace(u=x[k:2 * k], omega=x[2 * k])
            new = alg.apply(s, t, hp)
            return jnp.concatenate([new.theta, new.u, new.omega[None]])

        J = np.asarray(jax.vmap(jax.jacfwd(step), in_axes=(None, 0))(jnp.zeros(2 * k + 1), tr))
    kron = np.einsum("ijk,ilm->ijlkm", J, J).reshape(N, -1)
    est, se = kron.mean(0), kron.std(0) / np.sqrt(N)
    exact = msq.jump_system(env, "ctdc", hp, "iid").second_moment_matrix().ravel()
    z = np.abs(est - exact) / np.maximum(se, 1e-12)
    # Each entry within 5 standard errors (a 1e-6 chance per entry under the CLT);
    # entries without noise (se = 0) must agree to rounding.
    assert np.all((z < 5) | (np.abs(est - exact) < 1e-12)), z.max()
    assert np.abs(est - exact).max() > 0  # the estimate is an estimate
    # and the radius of the estimate is close to the exact one
    ms = msq.mean_square(env, "ctdc", hp, "iid")
    n = 2 * k + 1
    assert np.abs(np.linalg.eigvals(est.reshape(n * n, n * n))).max() == pytest.approx(ms.radius, rel=2e-2)


# ------------------------------------------------------------------ structure and refusals

def test_neutral_directions_are_factored_out_on_baird():
    from bec_jax import envs
    env = envs.make("baird")  # 8 features, 7 states: one feature null direction in theta (and u)
    ms = msq.mean_square(env, "ctdc", {"alpha": 0.01, "beta": 0.0005, "zeta": 0.05})
    assert ms.neutral == 3 and ms.basis.shape == (17, 14)
    assert ms.bounded and 0.9998 < ms.radius < 1 and ms.method == "arnoldi"
    assert ms.mean_radius ** 2 <= ms.radius + 1e-12
    dense = msq.analyse(msq.jump_system(env, "ctdc", {"alpha": 0.01, "beta": 0.0005, "zeta": 0.05}),
                        method="dense", stationary=False)
    # Two eigen-solvers in float64; ARPACK stops at a relative accuracy of 1e-10.
    assert dense.method == "dense" and dense.radius == pytest.approx(ms.radius, rel=1e-9)


def test_refusals_name_the_field():
    env = _scalar_env()
    with pytest.raises(ValueError, match=r"^algorithm: ctd_lambda carries traces"):
        msq.mean_square(env, "ctd_lambda", {"alpha": 0.1, "beta": 0.1})
    with pytest.raises(ValueError, match=r"^hyperparameters.beta: the mean-square analysis needs"):
        msq.mean_square(env, "ctd", {"alpha": 0.1})
    with pytest.raises(ValueError, match=r"^sampler: expected one of markov, iid"):
        msq.mean_square(env, "td", {"alpha": 0.1}, "uniform")
    with pytest.raises(ValueError, match=r"^hyperparameters.alpha: must be a step size"):
        msq.mean_square(env, "td", {"alpha": -1.0})


# ------------------------------------------------------------------ bec-jax analyze

def test_analyze_command_table_map_and_overlay(tmp_path, capsys):
    import json
    import os

    from bec_jax import envs
    from bec_jax.cli import analyze
    from bec_jax.cli import commands as cli
    out = str(tmp_path / "an")
    rc = cli.main(["analyze", "--env", "two_state", "--algorithm", "ctd", "--alpha", "1e-3,0.3",
                   "--beta", "0.01,0.5", "--out", out, "--map-points", "3"])
    assert rc == 0
    printed = capsys.readouterr().out
    rows = json.load(open(os.path.join(out, "analysis.json")))["rows"]
    assert [(r["hyperparameters"]["alpha"], r["hyperparameters"]["beta"]) for r in rows] == [
        (1e-3, 0.01), (1e-3, 0.5), (0.3, 0.01), (0.3, 0.5)]
    env = envs.make("two_state")
    for r in rows:
        ms = msq.mean_square(env, "ctd", r["hyperparameters"], "markov")
        assert r["mean_square_radius"] == ms.radius and r["mean_radius"] == ms.mean_radius  # same program
        assert r["verdict"] == ms.label and r["verdict"] in printed
    assert rows[2]["verdict"] == "diverges in mean" and rows[3]["verdict"] == "stable in mean square"
    assert os.path.getsize(os.path.join(out, "stability_map.png")) > 10_000
    m = json.load(open(os.path.join(out, "analysis.json")))["map"]
    assert m["axes"] == ["alpha", "beta"] and np.asarray(m["mean_square_radius"]).shape == (3, 3)
    assert m["x"] == pytest.approx([1e-3, np.sqrt(0.3e-3), 0.3])  # log-spaced: the values span decades
    # bad input: one line, exit 2
    assert cli.main(["analyze", "--env", "two_state", "--algorithm", "ctd", "--alpha", "0.1"]) == 2
    assert "beta: the analysis needs the step size beta" in capsys.readouterr().err
    assert cli.main(["analyze", "--env", "two_state", "--algorithm", "ctd", "--alpha", "0.1", "--beta", "0.1",
                     "--sampler", "uniform"]) == 2
    with pytest.raises(ValueError, match=r"^map: 'gamma' is neither"):
        analyze.map_values("two_state", "ctd", {"alpha": [0.1, 0.2], "beta": [0.1]}, None, ("alpha", "gamma"))


def test_analyze_overlays_a_runs_divergence(tmp_path, capsys):
    """A short run of the same grid: the point that diverges in mean (rate +0.021
    per step, past the 1e6 bound within ~700 steps) diverged in every seed, the
    points stable in mean square in none."""
    import json
    import os

    from bec_jax.cli import commands as cli
    grid = ["--env", "two_state", "--algorithm", "ctd", "--alpha", "1e-3,0.3", "--beta", "0.01,0.5"]
    run = str(tmp_path / "run")
    assert cli.main(["run", *grid, "--steps", "2000", "--seeds", "4", "--log-every", "100", "--out", run]) == 0
    out = str(tmp_path / "an")
    assert cli.main(["analyze", *grid, "--out", out, "--run", run, "--map-points", "3"]) == 0
    capsys.readouterr()
    rec = json.load(open(os.path.join(out, "analysis.json")))
    sim = {(x, y): f for x, y, f in zip(rec["run"]["x"], rec["run"]["y"], rec["run"]["diverged"])}
    verdict = {(r["hyperparameters"]["alpha"], r["hyperparameters"]["beta"]): r["verdict"] for r in rec["rows"]}
    assert sim.keys() == verdict.keys()
    for p, f in sim.items():
        assert f == (1.0 if verdict[p] == "diverges in mean" else 0.0), (p, f, verdict[p])


def test_readme_analyze_section_runs_as_pasted(capsys):
    """The `bec-jax analyze` section of docs/theory.md: its Python block prints
    what its comment says, and its command lines parse."""
    import re
    import shlex

    from docs_blocks import code as block

    from bec_jax.cli import commands as cli
    title = "Exact stability: `bec-jax analyze`"
    code = block("docs/theory.md", "python", section=title)
    exec(compile(code, "docs/theory.md", "exec"), {})
    want = re.search(r"^# (.*)$", code, re.M).group(1)
    assert capsys.readouterr().out.strip() == want
    lines = block("docs/theory.md", "bash", section=title).strip().splitlines()
    assert [shlex.split(x)[1] for x in lines] == ["run", "analyze"]
    args = cli.parse(shlex.split(lines[1])[1:])
    assert args.command == "analyze" and args.run == "runs/baird-ctd" and args.hyper == {
        "alpha": "0.001,0.01,0.03,0.1", "beta": "0.001,0.01,0.1"}


def test_marginal_modes_count_as_stable():
    """Tabular CTD on the episodic random walk: the constant is a direction of the
    fixpoint set that terminal transitions move, so both radii are 1 up to rounding
    (not a common neutral direction, not growth): marginal, stable, no stationary
    moments."""
    from bec_jax import envs
    ms = msq.mean_square(envs.make("random_walk", features="tabular"), "ctd", {"alpha": 0.5, "beta": 0.5})
    assert ms.neutral == 0 and ms.marginal
    assert abs(ms.mean_radius - 1) < 1e-12 and abs(ms.radius - 1) < 1e-12
    assert ms.mean_stable and ms.bounded and ms.label == "stable in mean square"
    assert ms.stationary is None and ms.steps_to_tol == np.inf
    # CTDC there: the noise multiplies the marginal direction, and the second
    # moment grows slowly, for real (a simple eigenvalue: LAPACK and ARPACK agree
    # on it to 1e-12 relative, far above rounding at 1 + 3e-7).
    env = envs.make("random_walk", features="tabular", pad_to=5)
    hp = {"alpha": 0.25, "beta": 0.5, "zeta": 2 ** -4}
    ms = msq.mean_square(env, "ctdc", hp, stationary=False)
    arnoldi = msq.analyse(msq.jump_system(env, "ctdc", hp), method="arnoldi", stationary=False)
    assert ms.marginal and abs(ms.mean_radius - 1) < 1e-12
    assert 2e-7 < ms.radius - 1 < 4e-7 and arnoldi.radius - 1 == pytest.approx(ms.radius - 1, rel=1e-4)
    assert ms.label == "mean stable, variance grows"
