"""Exact-analysis facts behind the reproduction's report, as JSON-ready dicts.

Everything here is computed in float64 from the model matrices
(`bec_jax.theory.expected_updates`): no sampling of transitions, no runs. The facts:

* `ctdc_determinant`: CTDC's expected-update matrix G1 at unit step sizes and
  det(G1). With step sizes the matrix is D G1 (D: alpha on theta's rows, zeta on
  u's, beta on omega's), so det(D G1) = alpha^k zeta^k beta det(G1). On the
  2-state counterexample (k = 1, a 3 x 3 matrix) det(G1) = 0.05 > 0, and a real
  matrix of odd order with positive determinant has a positive real eigenvalue:
  the mean dynamics are unstable at every positive step size.
* `why_escape`: why Boyan and Baird escape: CTDC's slow ODE matrix is
  -A^T C^+ A_c, Theorem 2's proof uses -A_c^T C^+ A_c; the difference
  (A - A_c)^T C^+ A_c vanishes when the constant vector is in the feature span.
* `rho_convention`: the slow eigenvalue with and without rho on omega.
* `hypotheses`: the ranks of A_c, A and C (Theorem 2 assumes A_c, C nonsingular).
* `ctd_stability_map`: off-policy CTD's full (theta, omega) ODE against beta / alpha.
* `all_facts`: all of the above for the report.

Notation as in `bec_jax.theory.expected_updates`: A = Phi^T D (I - P_g) Phi (TD, uncentered),
A_c = Phi^T (D - d d^T)(I - P_g) Phi (centered; the paper's "A" =
Cov(phi, phi - gamma phi')), C = Phi^T D Phi, d = d_mu.
"""
from __future__ import annotations

import copy
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax import algorithms, envs
from bec_jax import mdp as mdp_lib
from bec_jax.experiments.grids import PAPER
from bec_jax.prediction import sweep
from bec_jax.prediction.spec import SweepSpec
from bec_jax.theory import expected_updates as analysis
from bec_jax.theory import fixpoints, mean_square, verdicts

ENVIRONMENTS = ("two_state", "boyan_chain", "baird")
RANK_TOL = 1e-10        # relative (to the largest singular value) rank tolerance
ZERO_TOL = 1e-9         # an eigenvalue with |lambda| <= ZERO_TOL * max|lambda| counts as zero
STABLE_TOL = 1e-9       # max Re(eig) <= STABLE_TOL (scale-free ODE): no unstable mode
BISECT_TOL = 1e-12      # the same on the exact scale-free matrix diag(1, ..., ratio) G1
# Which step size scales which field's rows of the expected update.
FIELD_STEP = {"theta": "alpha", "u": "zeta", "omega": "beta"}


# ---------------------------------------------------------------- cached pieces

@functools.cache
def _env(name: str):
    return envs.make(name)


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, np.float64)
    a.setflags(write=False)
    return a


@functools.cache
def _unit_matrix(env_name: str, alg: str) -> np.ndarray:
    """G1: the expected-update matrix at unit step sizes (read-only)."""
    return _frozen(analysis.expected_update(_env(env_name), alg)[0])


@functools.cache
def _layout(env_name: str, alg: str) -> tuple:
    return tuple(analysis.state_layout(_env(env_name), alg).items())


@functools.cache
def _slow(env_name: str, alg: str) -> np.ndarray:
    return _frozen(analysis.slow_ode_matrix(_env(env_name), alg))


@functools.cache
def _matrices(env_name: str) -> tuple:
    """(A, A_c, C) of the model (read-only)."""
    env = _env(env_name)
    return (_frozen(fixpoints.td_matrices(env)[0]), _frozen(fixpoints.centered_td_matrices(env)[0]),
            _frozen(fixpoints.feature_covariance(env)))


def _step_vector(env_name: str, alg: str, steps: dict) -> np.ndarray:
    """The diagonal of D: each state coordinate's step size (`FIELD_STEP`)."""
    n = _unit_matrix(env_name, alg).shape[0]
    out = np.empty(n)
    for field, sl in _layout(env_name, alg):
        out[sl] = steps[FIELD_STEP[field]]
    return out


def _rank(M: np.ndarray) -> int:
    """Numerical rank, as `fixpoints.fixpoint_set` counts it."""
    return fixpoints.fixpoint_set(M, np.zeros(M.shape[0])).rank


def _pinv(C: np.ndarray) -> np.ndarray:
    return np.linalg.pinv(C, rcond=RANK_TOL, hermitian=True)


def _max_real(M: np.ndarray) -> float:
    return float(np.linalg.eigvals(M).real.max())


def _eigs(ev: np.ndarray) -> dict:
    ev = np.sort_complex(np.asarray(ev, complex))
    return {"real": [float(x) for x in ev.real], "imag": [float(x) for x in ev.imag]}


def _largest_real_eigenvalue(ev: np.ndarray) -> np.ndarray:
    """Per row of eigenvalues (N, n): the largest eigenvalue that is real (|imag|
    <= ZERO_TOL * max|lambda|); for a row with none flagged (possible only for
    even n or by rounding), the one with the smallest |imag| when n is odd, else nan."""
    scale = np.abs(ev).max(axis=1, keepdims=True)
    real = np.abs(ev.imag) <= ZERO_TOL * scale
    vals = np.where(real, ev.real, -np.inf).max(axis=1)
    none = ~real.any(axis=1)
    if none.any():
        if ev.shape[1] % 2 == 1:
            j = np.abs(ev.imag).argmin(axis=1)
            vals[none] = ev.real[np.arange(len(ev)), j][none]
        else:
            vals[none] = np.nan
    return vals


# ---------------------------------------------------------------- 1. the determinant

def _paper_grid(env_name: str) -> dict | None:
    g = PAPER.get(env_name)
    return None if g is None else {n: tuple(g[n]) for n in ("alpha", "beta", "zeta")}


def ctdc_determinant(env_name: str = "two_state", grid: dict | None = None, samples: int = 2000,
                     seed: int = 0, checks: int = 64) -> dict:
    """det of CTDC's unit-step expected-update matrix G1 and what it implies.

    G1 is `analysis.expected_update(env, "ctdc")` at alpha = beta = zeta = 1, in
    `analysis.state_layout` order (theta, u, omega). At step sizes (alpha, beta,
    zeta) the matrix is D G1, D = diag(alpha on theta, zeta on u, beta on omega)
    (checked against `expected_update` at up to `checks` grid points and 16
    sampled points: `scaling_max_abs_diff`). For an odd order n and det(G1) > 0,
    det(D G1) > 0 and D G1 has a positive real eigenvalue for every positive step
    size: checked at every point of `grid` (default: the reproduction's grid for
    this environment, `experiments.grids.PAPER`) and at `samples` log-uniform points
    of [1e-5, 1]^3. Also reports G1's eigenvalues as an ODE (max real part, number
    of ~zero eigenvalues), which is what matters where det(G1) = 0 (Boyan, Baird).
    """
    env = _env(env_name)
    G1 = _unit_matrix(env_name, "ctdc")
    n = G1.shape[0]
    ev1 = np.linalg.eigvals(G1)
    scale1 = np.abs(ev1).max()
    n_zero = int(np.sum(np.abs(ev1) <= ZERO_TOL * scale1))
    nonzero = ev1[np.abs(ev1) > ZERO_TOL * scale1]
    det = float(np.linalg.det(G1))
    det_rel = abs(det) / max(scale1 ** n, 1e-300)
    odd_positive = n % 2 == 1 and det_rel > ZERO_TOL

    grid = _paper_grid(env_name) if grid is None else {k: tuple(v) for k, v in grid.items()}
    names = ("alpha", "beta", "zeta")
    grid_pts = (np.array(list(itertools.product(*(grid[k] for k in names))), np.float64)
                if grid else np.zeros((0, 3)))
    rng = np.random.default_rng(seed)
    sample_pts = 10.0 ** rng.uniform(-5.0, 0.0, size=(samples, 3))

    def scaled(pts):
        Ds = np.stack([_step_vector(env_name, "ctdc", dict(zip(names, p))) for p in pts]) \
            if len(pts) else np.zeros((0, n))
        return Ds[:, :, None] * G1[None]

    def summarize(pts):
        if len(pts) == 0:
            return None
        M = scaled(pts)
        ev = np.linalg.eigvals(M)
        top = _largest_real_eigenvalue(ev)
        max_re = ev.real.max(axis=1)
        unstable = max_re > ZERO_TOL * np.abs(ev).max(axis=1)
        i_worst = int(np.argmax(max_re))
        out = {"points": len(pts),
               "max_real_part": {"min": float(max_re.min()), "max": float(max_re.max())},
               "max_real_part_max_at": dict(zip(names, map(float, pts[i_worst]))),
               # points with an eigenvalue of positive real part (beyond rounding)
               "unstable_points": int(unstable.sum())}
        if 0 < unstable.sum() < len(pts):
            out["unstable_at"] = [[float(v) for v in p] for p in pts[unstable][:100]]  # (alpha, beta, zeta)
        if odd_positive:
            i_min, i_max = int(np.nanargmin(top)), int(np.nanargmax(top))
            out.update({
                "all_have_positive_real_eigenvalue": bool(np.all(top > 0)),
                "largest_real_eigenvalue_min": float(top[i_min]),
                "largest_real_eigenvalue_min_at": dict(zip(names, map(float, pts[i_min]))),
                "largest_real_eigenvalue_max": float(top[i_max]),
                "largest_real_eigenvalue_max_at": dict(zip(names, map(float, pts[i_max]))),
                # E[x_{t+1}] = (I + D G1) E[x_t] exactly under i.i.d. sampling.
                "steps_to_grow_by_e": {"at_min": float(1.0 / np.log1p(top[i_min])) if top[i_min] > 0 else None,
                                       "at_max": float(1.0 / np.log1p(top[i_max])) if top[i_max] > 0 else None},
            })
        return out

    # D G1 against expected_update at the step sizes.
    sel = grid_pts[np.unique(np.linspace(0, len(grid_pts) - 1, min(checks, len(grid_pts))).astype(int))] \
        if len(grid_pts) else grid_pts
    chk = np.concatenate([sel, sample_pts[:16]])
    diff = 0.0
    for p, M in zip(chk, scaled(chk)):
        G, _ = analysis.expected_update(env, "ctdc", dict(zip(names, map(float, p))))
        diff = max(diff, float(np.abs(G - M).max()))

    out = {
        "env": env_name,
        "layout": {f: [sl.start, sl.stop] for f, sl in _layout(env_name, "ctdc")},
        "order": n,
        "G1": G1.tolist() if n <= 3 else None,
        "det": det,
        "det_relative": det_rel,
        "unit_eigenvalues": _eigs(ev1),
        "unit_max_real": float(ev1.real.max()),
        "unit_max_real_nonzero": float(nonzero.real.max()) if len(nonzero) else None,
        "unit_zero_eigenvalues": n_zero,
        "unit_nullity": n - _rank(G1),
        "scaling_max_abs_diff": diff,
        "scaling_checked_points": len(chk),
        "grid": {k: list(v) for k, v in grid.items()} if grid else None,
        "grid_check": summarize(grid_pts),
        "sample_check": dict(summarize(sample_pts), range=[1e-5, 1.0], seed=seed),
        "positive_determinant_argument_applies": bool(odd_positive),
    }
    if odd_positive:
        out["statement"] = (
            f"det(G1) = {det:.6g} > 0 for the {n} x {n} unit-step CTDC matrix, so det(D G1) = alpha^k zeta^k "
            "beta det(G1) > 0 for all positive step sizes; a real matrix of odd order with positive determinant "
            "has a positive real eigenvalue (real eigenvalues with a positive product include an even number of "
            "negative ones; complex ones come in conjugate pairs with positive product). So the expected update "
            "x' = D G1 x + g is unstable at every positive (alpha, beta, zeta), including every timescale "
            "ratio and the two-timescale limit (slow matrix -A^T C^-1 A_c > 0). Under i.i.d. sampling the mean "
            "iterate obeys E[x_{t+1}] = (I + D G1) E[x_t] + g exactly, so from any start with a component "
            "along the unstable direction it moves away from the fixpoint geometrically. Robbins-Monro schedules (decaying alpha_k = o(zeta_k), zeta_k = "
            "o(beta_k)) cannot help: they only change the time scale, and the limiting ODE itself is unstable.")
    else:
        out["statement"] = (
            f"det(G1) = {det:.3g} (relative {det_rel:.2g}): G1 is singular ({n_zero} zero eigenvalue(s), "
            f"nullity {out['unit_nullity']}), so the determinant argument does not apply. As an ODE x' = G1 x, "
            f"the largest real part is {out['unit_max_real']:.2g} (rounding), and "
            f"{out['unit_max_real_nonzero']:.4g} among the nonzero eigenvalues: no unstable mode at unit steps.")
        gc = out["grid_check"]
        if gc is not None:
            out["statement"] += (
                f" At the reproduction's {gc['points']} grid points, D G1 has an eigenvalue with positive real "
                f"part at {gc['unstable_points']} (largest {gc['max_real_part']['max']:.3g}, at "
                f"{gc['max_real_part_max_at']}).")
    return out


# ---------------------------------------------------------------- 2. why Boyan and Baird escape

def why_escape(env_name: str) -> dict:
    """Why CTDC's slow ODE is stable on Boyan and Baird but not on the 2-state example.

    With f = E[phi] = Phi^T d and f_A = E[rho (phi - gamma phi')] = Phi^T (I - P_g)^T d,
    A - A_c = f f_A^T (rank one). CTDC's slow matrix (`analysis.slow_ode_matrix`)
    is -A^T C^+ A_c (its correction -gamma phi' phi^T u is not centered, so the
    uncentered A stands on the left); the proof of Theorem 2 uses -A_c^T C^+ A_c.
    Their difference is -(A - A_c)^T C^+ A_c = -f_A f^T C^+ A_c. If Phi w = 1 for
    some w, then f = C w and f^T C^+ A_c = w^T A_c = 1^T (D - d d^T)(I - P_g) Phi = 0:
    the extra term vanishes and the slow matrix is the negative semidefinite
    -A_c^T C^+ A_c. C^+ is the pseudo-inverse (Baird's C is singular).
    Membership of 1 in the span is measured by two least-squares residuals:
    plain (RMS over states) and d_mu-weighted (||Phi w - 1||_{d_mu}).
    """
    env = _env(env_name)
    phi = np.asarray(env.phi, np.float64)
    S = phi.shape[0]
    d = mdp_lib.d_mu(env)
    ones = np.ones(S)
    w_plain = np.linalg.lstsq(phi, ones, rcond=None)[0]
    res_plain = float(np.linalg.norm(phi @ w_plain - ones) / np.sqrt(S))
    sd = np.sqrt(d)
    w_d = np.linalg.lstsq(sd[:, None] * phi, sd, rcond=None)[0]
    res_d = float(np.sqrt(d @ (phi @ w_d - ones) ** 2))

    A, A_c, C = _matrices(env_name)
    Cp = _pinv(C)
    f = phi.T @ d
    f_A = phi.T @ (np.eye(S) - mdp_lib.P_pi_gamma(env)).T @ d
    extra = (A - A_c).T @ Cp @ A_c                 # = f_A f^T C^+ A_c
    slow_formula = -A.T @ Cp @ A_c
    slow_proof = -A_c.T @ Cp @ A_c
    slow_repo = _slow(env_name, "ctdc")
    scale = max(1.0, float(np.abs(A).max()) * float(np.abs(Cp).max()) * float(np.abs(A_c).max()))
    extra_norm = float(np.linalg.norm(extra, 2))
    in_span = res_plain <= 1e-10
    return {
        "env": env_name,
        "one_in_feature_span": bool(in_span),
        "one_residual_plain_rms": res_plain,
        "one_residual_dmu": res_d,
        "rank_one_identity_max_abs_diff": float(np.abs(A - A_c - np.outer(f, f_A)).max()),
        "extra_term": "(A - A_c)^T C^+ A_c = E[rho (phi - gamma phi')] E[phi]^T C^+ A_c",
        "extra_term_norm": extra_norm,
        "extra_term_vanishes": bool(extra_norm <= 1e-10 * scale),
        "fT_Cpinv_Ac_norm": float(np.linalg.norm(f @ Cp @ A_c)),
        "slow_repo_vs_formula_max_abs_diff": float(np.abs(slow_repo - slow_formula).max()),
        "slow_identity_max_abs_diff": float(np.abs(slow_formula - (slow_proof - extra)).max()),
        "slow_max_real": _max_real(slow_repo),
        "proof_matrix_max_real": _max_real(slow_proof),
        "extra_term_matrix": extra.tolist() if extra.size <= 4 else None,
    }


# ---------------------------------------------------------------- 3. rho on omega or not

def _rejection_expected_update(env_name: str) -> np.ndarray:
    """The expected update per accepted transition of the paper's rho-free CTDC
    equations on transitions kept with probability rho / max(rho) (their
    (s, a, s') then follow d_mu(s) pi(a|s) P(s'|s,a)): evaluated from ctdc's own
    update function with rho = 1 at x = 0 and the unit vectors."""
    env = _env(env_name)
    alg = algorithms.get("ctdc")
    w, tr = analysis.outcomes(env)
    keep = w * np.asarray(tr.rho) / np.asarray(tr.rho).max()
    keep = keep / keep.sum()
    k = env.num_features
    n = 2 * k + 1
    hp = {"alpha": 1.0, "beta": 1.0, "zeta": 1.0}
    with jax.enable_x64(True):
        trj = jax.tree_util.tree_map(lambda v: jnp.asarray(np.asarray(v, np.float64)), tr)
        trj = trj._replace(rho=jnp.ones_like(trj.rho))

        def mean_inc(x):
            state = alg.init(x[:k])._replace(u=x[k:2 * k], omega=x[2 * k])
            new = jax.vmap(lambda t: alg.apply(state, t, hp))(trj)
            inc = jnp.concatenate([new.theta, new.u, new.omega[:, None]], axis=1) - x[None, :]
            return jnp.asarray(keep) @ inc

        X = jnp.asarray(np.concatenate([np.zeros((1, n)), np.eye(n)]))
        F = np.asarray(jax.jit(jax.vmap(mean_inc))(X), np.float64)
    return (F[1:] - F[0]).T


def rho_convention(env_name: str = "two_state") -> dict:
    """The slow ODE's largest real eigenvalue part under both rho conventions.

    `ctdc`: rho on theta, u and omega (the authors' code); slow matrix
    -A^T C^+ A_c. `ctdc_omega_no_rho`: rho on theta and u only; omega tracks the
    behaviour's E_mu[delta] and the slow matrix is -A^T C^+ (A - f f_mu^T), with
    f_mu = E_mu[phi - gamma phi']. Both from `analysis.slow_ode_matrix`, checked
    against those closed forms. Also: the paper's own rho-free equations on
    transitions kept by rejection (probability rho / max rho) have, per kept
    transition, the same expected update as `ctdc` (`rejection_vs_ctdc_max_abs_diff`),
    so `ctdc` is the paper's sub-sampled algorithm in the mean.
    """
    env = _env(env_name)
    A, A_c, C = _matrices(env_name)
    Cp = _pinv(C)
    phi = np.asarray(env.phi, np.float64)
    S = phi.shape[0]
    d = mdp_lib.d_mu(env)
    f = phi.T @ d
    f_mu = phi.T @ (np.eye(S) - mdp_lib.discounted_matrix(env, env.mu)).T @ d
    with_rho, no_rho = _slow(env_name, "ctdc"), _slow(env_name, "ctdc_omega_no_rho")
    e_with, e_no = _max_real(with_rho), _max_real(no_rho)
    G_rej = _rejection_expected_update(env_name)
    G1 = _unit_matrix(env_name, "ctdc")
    verdict = lambda e: "unstable" if e > STABLE_TOL else "stable"
    return {
        "env": env_name,
        "ctdc_rho_on_omega": {"slow_max_real": e_with, "slow_matrix": with_rho.tolist() if with_rho.size <= 4 else None,
                              "closed_form_max_abs_diff": float(np.abs(with_rho + A.T @ Cp @ A_c).max()),
                              "verdict": verdict(e_with)},
        "ctdc_omega_no_rho": {"slow_max_real": e_no, "slow_matrix": no_rho.tolist() if no_rho.size <= 4 else None,
                              "closed_form_max_abs_diff": float(
                                  np.abs(no_rho + A.T @ Cp @ (A - np.outer(f, f_mu))).max()),
                              "verdict": verdict(e_no)},
        "verdict_flips": verdict(e_with) != verdict(e_no),
        "rejection_vs_ctdc_max_abs_diff": float(np.abs(G_rej - G1).max()),
        "statement": (f"slow ODE max Re: {e_with:+.4g} with rho on omega (ctdc, {verdict(e_with)}), "
                      f"{e_no:+.4g} without (ctdc_omega_no_rho, {verdict(e_no)}). The paper's rho-free equations "
                      "on rejection-sampled transitions have ctdc's expected update (difference "
                      f"{float(np.abs(G_rej - G1).max()):.1e}), so the paper's algorithm behaves as ctdc in the mean"
                      + (" and is the unstable one." if verdict(e_with) == "unstable" else ".")),
    }


# ---------------------------------------------------------------- 4. Theorem 2's hypotheses

def hypotheses(env_name: str) -> dict:
    """Numerical ranks (singular values above 1e-10 times the largest) of A_c
    (the paper's A = Cov(phi, phi - gamma phi')), A (uncentered TD) and C = E[phi phi^T].
    Theorem 2 assumes A_c and C nonsingular (Theorem 1: A_c)."""
    env = _env(env_name)
    A, A_c, C = _matrices(env_name)
    k = env.num_features
    out = {"env": env_name, "k": k, "states": env.num_states}
    for name, M in (("A_c", A_c), ("A", A), ("C", C)):
        r = _rank(M)
        out[name] = {"rank": r, "singular": r < k,
                     "singular_values": [float(x) for x in np.linalg.svd(M, compute_uv=False)]}
    out["theorem2_hypotheses_hold"] = not (out["A_c"]["singular"] or out["C"]["singular"])
    return out


# ---------------------------------------------------------------- 5. CTD's stability map

def ctd_stability_map(env_name: str, ratios=None, alpha: float = 1e-3) -> dict:
    """Off-policy CTD's full (theta, omega) expected update at (alpha, beta =
    ratio * alpha), as a scale-free ODE: max Re(eig(G)) / alpha (G from
    `analysis.expected_update`). `threshold_grid`: the smallest grid ratio from
    which every larger grid ratio is stable (max Re <= 1e-9; zero eigenvalues are
    the null directions of a singular A_c); `threshold`: the crossing located by
    bisection on diag(1, ..., 1, ratio) G1 between the bracketing grid ratios;
    `threshold_closed_form` (one feature only): trace/determinant of the 2 x 2
    matrix, ratio* = G1[0, 0] / -G1[1, 1] when det(G1) > 0.
    """
    ratios = np.geomspace(1e-3, 10.0, 41) if ratios is None else np.asarray(ratios, np.float64)
    env = _env(env_name)
    G1 = _unit_matrix(env_name, "ctd")
    n = G1.shape[0]

    def ode(r):
        return _step_vector(env_name, "ctd", {"alpha": 1.0, "beta": float(r)})[:, None] * G1

    max_re, diff = [], 0.0
    for r in ratios:
        G, _ = analysis.expected_update(env, "ctd", {"alpha": alpha, "beta": float(r) * alpha})
        max_re.append(_max_real(G / alpha))
        diff = max(diff, float(np.abs(G / alpha - ode(r)).max()))
    max_re = np.array(max_re)
    stable = max_re <= STABLE_TOL
    # smallest index from which all larger ratios are stable
    idx = len(ratios)
    while idx > 0 and stable[idx - 1]:
        idx -= 1
    thr_grid = float(ratios[idx]) if idx < len(ratios) else None
    thr = None
    if 0 < idx < len(ratios):
        lo, hi = float(ratios[idx - 1]), float(ratios[idx])
        for _ in range(80):   # exact matrices: a tighter tolerance than the grid's
            mid = np.sqrt(lo * hi)
            lo, hi = (lo, mid) if _max_real(ode(mid)) <= BISECT_TOL else (mid, hi)
        thr = float(hi)
    closed = None
    if n == 2 and np.linalg.det(G1) > 0 and G1[1, 1] < 0:
        closed = float(G1[0, 0] / -G1[1, 1])
    return {
        "env": env_name, "alpha": alpha,
        "ratios": [float(r) for r in ratios],
        "max_real_over_alpha": [float(x) for x in max_re],
        "stable": [bool(s) for s in stable],
        "stable_set_is_upward_closed": bool(np.all(stable[idx:]) and not np.any(stable[:idx])),
        "stable_on_whole_grid": bool(stable.all()),
        "threshold_grid": thr_grid,
        "threshold": thr,
        "threshold_closed_form": closed,
        "scaling_max_abs_diff": diff,
        "unit_zero_eigenvalues": int(np.sum(np.abs(np.linalg.eigvals(G1)) <= ZERO_TOL
                                            * np.abs(np.linalg.eigvals(G1)).max())),
    }


# ---------------------------------------------------------------- 6. all of it

@functools.lru_cache(maxsize=1)
def _all_facts() -> dict:
    return {
        "ctdc_determinant": {e: ctdc_determinant(e) for e in ENVIRONMENTS},
        "why_escape": {e: why_escape(e) for e in ENVIRONMENTS},
        "rho_convention": {e: rho_convention(e) for e in ENVIRONMENTS},
        "hypotheses": {e: hypotheses(e) for e in ENVIRONMENTS},
        "ctd_stability_map": {e: ctd_stability_map(e) for e in ("two_state", "baird")},
    }


def all_facts() -> dict:
    """Every fact above for the report (the determinant and why_escape on all
    three environments, rho_convention and hypotheses on all three, CTD's
    stability map on the two off-policy ones); cached after the first call."""
    return copy.deepcopy(_all_facts())


# ---------------------------------------------------------------- 7. mean square against the runs

# Steps of simulation the long re-runs may take at most (a rate of 1e-6 per step
# needs 14 million steps to grow by 1e6: beyond this the point stays undecided).
LONG_CAP = 2_000_000
LONG_SEEDS = 20


def _state_scale(env) -> float:
    """max |x_0| of a run's initial state (theta0; the other fields start at 0)."""
    return max(float(np.abs(np.asarray(env.theta0)).max(initial=0.0)), 1e-3)


def predicted(ms) -> tuple[str, float]:
    """(label, rate of the failing moment): the mean's rate where it diverges, the
    RMS rate where only the second moment grows, the RMS rate where both are bounded."""
    if not ms.mean_stable:
        return ms.label, ms.mean_rate
    return ms.label, ms.rate


def steps_to_see(rate: float, scale: float, bound: float) -> float:
    """Steps for a quantity of size `scale` growing at `rate` per step to pass `bound`."""
    return math.log(bound / scale) / rate if rate > 0 else math.inf


def classify(label: str, needed: float, steps: int, fraction: float) -> str:
    """'agree', 'beyond the horizon' (growth predicted but too slow for `steps`) or
    'disagree', for a predicted `label` against a run's diverged `fraction`.

    A mean that diverges drives every seed past the bound; a second moment that
    grows only says some seeds do (the RMS is carried by the tail)."""
    if label == "stable in mean square":
        return "agree" if fraction == 0 else "disagree"
    if needed > steps:
        return "beyond the horizon" if fraction == 0 else "agree"
    if label == "diverges in mean":
        return "agree" if fraction == 1 else "disagree"
    return "agree" if fraction > 0 else "disagree"


def _env_params(r, i: int) -> dict:
    """The environment parameters of grid point i of a sweep result."""
    given = r.spec_dict.get("env_params") or {}
    p = r.point(i)
    out = {}
    for n, values in given.items():
        if n in p:
            v = p[n]
            # A grid column of integers comes back as floats; the factory wants the spec's type.
            ints = isinstance(values, (list, tuple)) and all(isinstance(x, int) for x in values)
            out[n] = int(v) if ints and isinstance(v, float) and v.is_integer() else v
    return out


@functools.lru_cache(maxsize=32)
def _env_of(source: str, params: tuple):
    return envs.make(source, **dict(params))


def mean_square_grid(r) -> list:
    """`mean_square.MeanSquare` of every grid point of a sweep result, under its
    sampler (None for a trace method, which the analysis does not cover)."""
    alg = algorithms.get(r.algorithm)
    if alg.traces:
        return [None] * r.num_points
    sampler = r.spec_dict.get("sampler", "markov")
    out = []
    for i in range(r.num_points):
        env = _env_of(r.env, tuple(sorted(_env_params(r, i).items())))
        p = r.point(i)
        out.append(mean_square.mean_square(env, alg, {n: p[n] for n in alg.names if n in p}, sampler,
                                           stationary=False))
    return out


def mean_square_comparison(results: dict, long: bool = True, cap: int = LONG_CAP, seeds: int = LONG_SEEDS) -> dict:
    """Every grid point of `results` ({task: {method: SweepResult}}): the predicted
    verdict (`mean_square`, the run's sampler) against the run's diverged
    fraction. With `long`, the points whose predicted growth is too slow to see
    in the run, and the disagreements, are run again (fresh seeds, same
    sampler) for as many steps as the rate needs, up to `cap`, and classified
    on that run. Trace methods are left out (counted as not analysed).
    Returns {"points": [...], "summary": {...}, "long_runs": {...}, ...}."""
    pts, again, skipped = [], {}, {}
    for task, by in results.items():
        for method, r in by.items():
            bound = float(r.spec_dict.get("divergence_bound", 1e6))
            mss = mean_square_grid(r)
            for i, ms in enumerate(mss):
                if ms is None:
                    skipped[f"{task}/{method}"] = skipped.get(f"{task}/{method}", 0) + 1
                    continue
                ep = _env_params(r, i)
                scale = _state_scale(_env_of(r.env, tuple(sorted(ep.items()))))
                label, rate = predicted(ms)
                needed = steps_to_see(rate, scale, bound) if label != "stable in mean square" else math.inf
                steps = int(r.steps[-1])
                frac = float(r.diverged_fraction[i])
                rec = {"env": task, "algorithm": method, "source": r.env, "env_params": ep,
                       "point": {k: float(v) for k, v in r.point(i).items() if isinstance(v, (int, float))
                                 and k not in ep},
                       "predicted": label, "mean_radius": ms.mean_radius, "radius": ms.radius, "rate": rate,
                       "steps_needed": needed, "steps": steps, "seeds": r.seeds, "diverged": frac,
                       "outcome": classify(label, needed, steps, frac)}
                pts.append(rec)
                if long and rec["outcome"] != "agree":
                    key = (task, method, tuple(sorted(ep.items())))
                    again.setdefault(key, []).append(len(pts) - 1)
    long_runs = {}
    for (task, method, ep), idx in again.items():
        r = results[task][method]
        alg = algorithms.get(r.algorithm)
        finite = [pts[j]["steps_needed"] for j in idx if math.isfinite(pts[j]["steps_needed"])]
        horizon = int(min(cap, max([2 * n for n in finite] + [10 * pts[idx[0]]["steps"]])))
        horizon = -(-horizon // 100) * 100
        spec = SweepSpec(env=r.env, algorithm=r.algorithm,
                         points=tuple({**dict(ep), **{n: pts[j]["point"][n] for n in alg.names
                                                      if n in pts[j]["point"]}} for j in idx),
                         seeds=seeds, steps=horizon, log_every=horizon // 10, seed=7,
                         sampler=r.spec_dict.get("sampler", "markov"), metrics=(r.metrics[0],))
        lr = sweep.run(spec)
        key = f"{task}/{method}"
        prev = long_runs.get(key, {"points": 0, "steps": 0, "seeds": seeds, "run_time_s": 0.0})
        long_runs[key] = {"points": prev["points"] + len(idx), "steps": max(prev["steps"], horizon), "seeds": seeds,
                          "run_time_s": prev["run_time_s"] + float(lr.meta.get("run_time_s") or 0.0)}
        for k, j in enumerate(idx):
            p = pts[j]
            frac = float(lr.diverged_fraction[k])
            fin = np.asarray(lr.final[0, k], np.float64)
            p.update(long_steps=horizon, long_seeds=seeds, long_diverged=frac, long_metric=r.metrics[0],
                     long_initial_rmscbe=float(lr.mean[0, k, 0]), long_final_rmscbe_median=float(np.median(fin)),
                     long_final_rmscbe_max=float(fin.max()),
                     outcome=classify(p["predicted"], p["steps_needed"], horizon, frac))
    summary = {}
    for p in pts:
        key = f"{p['env']}/{p['algorithm']}"
        s = summary.setdefault(key, {"points": 0, "agree": 0, "beyond the horizon": 0, "disagree": 0,
                                     **{lab: 0 for lab in verdicts.STABILITY_LABELS}})
        s["points"] += 1
        s[p["outcome"]] += 1
        s[p["predicted"]] += 1
    return {"points": pts, "summary": summary, "long_runs": long_runs, "long_seeds": seeds, "cap": cap,
            "not_analysed": skipped}


def explain(p: dict) -> str:
    """Why a grid point's run and its mean-square prediction differ."""
    steps = p.get("long_steps", p["steps"])
    frac = p.get("long_diverged", p["diverged"])
    if p["predicted"] == "stable in mean square":
        return ("the second moment is bounded, yet seeds left the bound: a transient (the iterates grow before "
                "they contract; the radius says nothing of the first steps)")
    if p["outcome"] == "beyond the horizon":
        return (f"growth at {p['rate']:+.2e} per step needs ~{p['steps_needed']:.3g} steps to pass the bound; "
                f"the longest run had {steps}")
    if p["predicted"] == "diverges in mean":
        if steps < 5 * p["steps_needed"]:
            return (f"{frac:.0%} of the seeds passed the bound in {steps} steps where ~{p['steps_needed']:.3g} are "
                    "needed on average: the seeds scatter around the mean's growth, the slowest still below the bound")
        return (f"only {frac:.0%} of the seeds passed the bound in {steps} steps, {steps / p['steps_needed']:.3g} times "
                "what the mean's growth needs: the mean's growth is carried by the seeds that blow up; the "
                "others stay below the bound (their almost-sure rate is smaller)")
    seen = ""
    if "long_final_rmscbe_median" in p:
        seen = (f" (here the seeds' {p.get('long_metric', 'error')} went from {p['long_initial_rmscbe']:.3g} to a "
                f"median of {p['long_final_rmscbe_median']:.3g}, largest {p['long_final_rmscbe_max']:.3g})")
    return ("the second moment grows, but no seed passed the bound: the RMS is carried by rare large excursions, "
            "and a typical seed follows the almost-sure rate (the top Lyapunov exponent, at most the RMS rate), "
            "which can be negative" + seen)


def _point_text(p: dict) -> str:
    return ", ".join([f"{k} {v}" for k, v in p.get("env_params", {}).items()]
                     + [f"{k} {v:g}" for k, v in p["point"].items()])


def comparison_markdown(ms_cmp: dict) -> str:
    """The comparison of `mean_square_comparison` as markdown: how it is judged,
    a summary table per task and method, the points beyond the horizon grouped,
    and every disagreement with its reason."""
    s = ["Each grid point's verdict from the exact analysis against its run's fraction of diverged seeds. "
         "*agree*: stable in mean square and no seed diverged; diverges in mean and every seed passed the bound; "
         "variance grows and some seed did. A predicted growth too slow to pass the bound within the run "
         f"is run again with {ms_cmp['long_seeds']} fresh seeds for twice the steps its rate needs (at most "
         f"{ms_cmp['cap']}); *beyond the horizon*: still too slow to see. Disagreements of the runs are run "
         "again the same way and judged on that run.\n",
         "| task | points | stable in mean square | mean stable, variance grows | diverges in mean "
         "| agree | beyond the horizon | disagree | long re-run |\n|---|---|---|---|---|---|---|---|---|"]
    for key, v in ms_cmp["summary"].items():
        lr = ms_cmp["long_runs"].get(key)
        s.append(f"| {key} | {v['points']} | {v['stable in mean square']} | {v['mean stable, variance grows']} | "
                 f"{v['diverges in mean']} | {v['agree']} | {v['beyond the horizon']} | {v['disagree']} | "
                 + (f"{lr['points']} points x {lr['seeds']} seeds x up to {lr['steps']} steps" if lr else "-")
                 + " |")
    s.append("")
    if ms_cmp.get("not_analysed"):
        s.append("Not analysed (trace methods): " + ", ".join(f"{k} ({n} points)"
                                                              for k, n in ms_cmp["not_analysed"].items()) + ".\n")
    slow: dict = {}
    for p in ms_cmp["points"]:
        if p["outcome"] == "beyond the horizon":
            slow.setdefault(f"{p['env']} {p['algorithm'].upper()}", []).append(p)
    if slow:
        s.append("Beyond the horizon (growth predicted, too slow to pass the bound in the longest run):\n")
        for key, ps in slow.items():
            rates = [p["rate"] for p in ps]
            need = [p["steps_needed"] for p in ps]
            med = [p["long_final_rmscbe_median"] for p in ps if "long_final_rmscbe_median" in p]
            ran = max(p.get("long_steps", p["steps"]) for p in ps)
            s.append(f"- {key}: {len(ps)} points, {ps[0]['predicted']} at {min(rates):+.2e} to {max(rates):+.2e} per "
                     f"step, needing {min(need):.3g} to {max(need):.3g} steps; run for {ran} steps (a predicted "
                     f"growth of the slow mode by {math.exp(min(rates) * ran):.3g} to "
                     f"{math.exp(max(rates) * ran):.3g}), none passed the bound"
                     + (f" (the seeds' median final {ps[0].get('long_metric', 'error')} {min(med):.3g} to "
                        f"{max(med):.3g}, from {ps[0]['long_initial_rmscbe']:.3g})" if med else ""))
        s.append("")
    odd = [p for p in ms_cmp["points"] if p["outcome"] == "disagree"]
    if odd:
        s.append("Disagreements, each with its reason:\n")
        s.extend(f"- {p['env']} {p['algorithm'].upper()} ({_point_text(p)}): predicted {p['predicted']}, "
                 f"{p.get('long_diverged', p['diverged']):.0%} diverged in {p.get('long_steps', p['steps'])} "
                 f"steps: {explain(p)}" for p in odd)
        s.append("")
    else:
        s.append("No disagreement.\n")
    return "\n".join(s)


def stationary_check(env_name: str, points: list[tuple[str, dict]], seeds: int = 200, cap: int = 200_000,
                     seed: int = 3) -> list[dict]:
    """The stationary RMSCBE at constant step sizes, sqrt(E[RMSCBE^2]) from the
    exact stationary moments (`mean_square.stationary_metric`), against runs of
    `seeds` fresh seeds for three times the steps the RMS needs to shrink by 1e-3
    (at least 2000, at most `cap`): the root of the seeds' mean squared final
    RMSCBE with its 95% interval (Student t on the squares)."""
    from bec_jax import stats
    from bec_jax.theory import metrics
    env = envs.make(env_name)
    M = metrics.metric(env, "rmscbe")
    out = []
    for alg, hp in points:
        a = algorithms.get(alg)
        ms = mean_square.mean_square(env, alg, hp)
        pred = mean_square.stationary_metric(ms, np.asarray(M.R), np.asarray(M.h),
                                             analysis.state_layout(env, alg)[a.weights])
        rec = {"env": env_name, "algorithm": alg, "point": dict(hp), "predicted": pred, "verdict": ms.label}
        if pred is not None:
            steps = int(min(cap, max(2000, 3 * ms.steps_to_tol)))
            steps = -(-steps // 100) * 100
            r = sweep.run(SweepSpec(env=env_name, algorithm=alg, points=(dict(hp),), seeds=seeds, steps=steps,
                                    log_every=steps // 10, metrics=("rmscbe",), seed=seed))
            m, lo, hi = stats.t_interval(np.asarray(r.final[0, 0], np.float64) ** 2)
            rec.update(steps=steps, seeds=seeds, simulated=math.sqrt(m), low=math.sqrt(max(lo, 0.0)),
                       high=math.sqrt(hi), within=bool(lo <= pred ** 2 <= hi), diverged=float(r.diverged_fraction[0]))
        out.append(rec)
    return out
