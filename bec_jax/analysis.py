"""Exact quantities from the model matrices, in float64.

Notation (all from the model; d = d_mu, D = diag(d), P = P_pi, r = r_pi):
  TD:        A = Phi^T D (I - gamma P) Phi,            b = Phi^T D r
  centered:  A_c = Phi^T (D - d d^T)(I - gamma P) Phi, b_c = Phi^T (D - d d^T) r
  C = Phi^T D Phi.
The centered TD fixpoint solves A_c theta = b_c (paper eq. centeredTDfixpoint and
Theorem 1). When A_c is singular (Boyan: the constant vector is in the feature
span; Baird: more features than states) the fixpoints form an affine subspace:
`centered_td_fixpoint` returns its minimum-norm point, `fixpoint_set` the whole set.

Metrics are affine maps of theta followed by a Euclidean norm,
metric(theta) = || W [theta; 1] ||, and W is compressed by a QR factorisation to at
most k + 1 rows. Evaluating one inside a scan costs O(k^2) and stays a sum of
squares of a short vector, so it keeps its relative precision in float32 (an
expanded quadratic form theta^T H theta + 2 h^T theta + h0 cancels catastrophically
near the minimum).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax import mdp as mdp_lib
from bec_jax.algorithms.base import StepSizes
from bec_jax.mdp import FiniteMDP

METRICS = ("rmscbe", "rmspcbe", "rmspbe", "rmsve")
_RANK_TOL = 1e-10


class _Model(NamedTuple):
    phi: np.ndarray
    d: np.ndarray
    P: np.ndarray
    r: np.ndarray
    gamma: float


def _model(env: FiniteMDP) -> _Model:
    return _Model(np.asarray(env.phi, np.float64), mdp_lib.d_mu(env), mdp_lib.P_pi(env),
                  mdp_lib.r_pi(env), float(env.gamma))


def td_matrices(env: FiniteMDP) -> tuple[np.ndarray, np.ndarray]:
    """(A, b) of the off-policy TD fixpoint A theta = b, with d = d_mu."""
    m = _model(env)
    D = np.diag(m.d)
    A = m.phi.T @ D @ (np.eye(len(m.d)) - m.gamma * m.P) @ m.phi
    return A, m.phi.T @ D @ m.r


def centered_td_matrices(env: FiniteMDP) -> tuple[np.ndarray, np.ndarray]:
    """(A_c, b_c) of the centered TD fixpoint: A_c = Phi^T (D - d d^T)(I - gamma P) Phi,
    b_c = Phi^T (D - d d^T) r, d = d_mu. A_c is the (off-policy) CTD matrix of the
    paper's lemma and of Theorem 1 (there written Cov(phi, phi - gamma phi'))."""
    m = _model(env)
    K = np.diag(m.d) - np.outer(m.d, m.d)
    A = m.phi.T @ K @ (np.eye(len(m.d)) - m.gamma * m.P) @ m.phi
    return A, m.phi.T @ K @ m.r


def feature_covariance(env: FiniteMDP) -> np.ndarray:
    """C = E[phi phi^T] = Phi^T D Phi under d_mu (TDC's auxiliary matrix)."""
    m = _model(env)
    return m.phi.T @ np.diag(m.d) @ m.phi


class FixpointSet(NamedTuple):
    """The solutions of A theta = b.

    Attributes:
      theta: the minimum-norm (least-squares) solution.
      null_space: (k, k - rank) orthonormal basis of null(A); every
        theta + null_space @ z is a fixpoint too (empty when A is nonsingular).
      rank: rank of A.
      residual: ||A theta - b|| (0 up to rounding when a solution exists).
    """

    theta: np.ndarray
    null_space: np.ndarray
    rank: int
    residual: float

    @property
    def unique(self) -> bool:
        return self.null_space.shape[1] == 0

    def describe(self) -> str:
        if self.unique:
            return "unique fixpoint"
        return (f"fixpoints form an affine subspace of dimension {self.null_space.shape[1]} "
                f"(A has rank {self.rank}); minimum-norm point returned")


def fixpoint_set(A: np.ndarray, b: np.ndarray) -> FixpointSet:
    """All solutions of A theta = b via the SVD: the minimum-norm point and null(A)."""
    U, s, Vt = np.linalg.svd(A)
    tol = _RANK_TOL * max(1.0, s.max(initial=0.0))
    rank = int(np.sum(s > tol))
    s_inv = np.where(s > tol, 1.0 / np.where(s > tol, s, 1.0), 0.0)
    theta = Vt.T @ (s_inv * (U.T @ b))
    return FixpointSet(theta, Vt[rank:].T, rank, float(np.linalg.norm(A @ theta - b)))


def centered_td_fixpoint_set(env: FiniteMDP) -> FixpointSet:
    """The set of centered TD fixpoints (paper eq. centeredTDfixpoint)."""
    return fixpoint_set(*centered_td_matrices(env))


def centered_td_fixpoint(env: FiniteMDP) -> np.ndarray:
    """The minimum-norm centered TD fixpoint A_c^+ b_c (see `centered_td_fixpoint_set`
    for whether it is unique)."""
    return centered_td_fixpoint_set(env).theta


def td_fixpoint_set(env: FiniteMDP) -> FixpointSet:
    """The set of (off-policy) TD fixpoints A theta = b."""
    return fixpoint_set(*td_matrices(env))


def td_fixpoint(env: FiniteMDP) -> np.ndarray:
    """The minimum-norm TD fixpoint."""
    return td_fixpoint_set(env).theta


# ---------------------------------------------------------------- expected updates

def _expectation_pieces(env: FiniteMDP):
    m = _model(env)
    D = np.diag(m.d)
    A, b = td_matrices(env)
    f = m.phi.T @ m.d                                    # E[rho phi]
    mvec = m.phi.T @ (m.gamma * m.P - np.eye(len(m.d))).T @ m.d  # E[rho delta] = c0 + mvec.theta
    c0 = float(m.d @ m.r)
    H = m.gamma * m.phi.T @ m.P.T @ D @ m.phi           # E[rho gamma phi' phi^T]
    C = m.phi.T @ D @ m.phi                              # E[rho phi phi^T]
    return A, b, f, mvec, c0, H, C


def expected_update(env: FiniteMDP, algorithm: str,
                    step_sizes: StepSizes = StepSizes(1.0, 1.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """(G, g) with E[x_{t+1} - x_t | x_t = x] = G x + g under i.i.d. samples
    s ~ d_mu, a ~ mu, s' ~ P, for the stacked state x of `algorithm`
    (theta, then u, then omega or rbar: `Algorithm.state_fields`).

    With unit step sizes (the default) G is the algorithm's ODE matrix; the
    recursion is locally stable when every eigenvalue of G has negative real part.
    """
    A, b, f, mvec, c0, H, C = _expectation_pieces(env)
    k = A.shape[0]
    al, be, ze = (float(v) for v in step_sizes)
    Z = np.zeros
    if algorithm == "td":
        return -al * A, al * b
    if algorithm == "tdc":
        G = np.block([[-A, -H], [-A, -C]])
        return np.diag(np.r_[[al] * k, [ze] * k]) @ G, np.r_[al * b, ze * b]
    if algorithm in ("ctd", "vrc", "src"):
        if algorithm == "src":  # rbar tracks the behaviour's mean reward, independent of theta
            m = _model(env)
            mvec, c0 = np.zeros(k), float(m.d @ mdp_lib.r_mu(env))
        G = np.block([[-A, -f[:, None]], [mvec[None, :], -np.ones((1, 1))]])
        return np.diag(np.r_[[al] * k, be]) @ G, np.r_[al * b, be * c0]
    if algorithm in ("ctdc", "ctdc_literal"):
        if algorithm == "ctdc_literal":  # omega without rho tracks E_mu[delta]
            m = _model(env)
            Pm = mdp_lib.P_mu(env)
            mvec = m.phi.T @ (m.gamma * Pm - np.eye(len(m.d))).T @ m.d
            c0 = float(m.d @ mdp_lib.r_mu(env))
        G = np.block([
            [-A, -H, -f[:, None]],
            [-A, -C, -f[:, None]],
            [mvec[None, :], Z((1, k)), -np.ones((1, 1))],
        ])
        return np.diag(np.r_[[al] * k, [ze] * k, be]) @ G, np.r_[al * b, ze * b, be * c0]
    raise ValueError(f"algorithm: unknown algorithm {algorithm!r}; known: "
                     "td, tdc, ctd, ctdc, ctdc_literal, src, vrc")


def ode_eigenvalues(env: FiniteMDP, algorithm: str,
                    step_sizes: StepSizes = StepSizes(1.0, 1.0, 1.0)) -> np.ndarray:
    """Eigenvalues of the expected-update matrix G of `expected_update`."""
    return np.linalg.eigvals(expected_update(env, algorithm, step_sizes)[0])


def slow_ode_matrix(env: FiniteMDP, algorithm: str) -> np.ndarray:
    """The theta-ODE matrix once the faster recursions have equilibrated (the
    two-timescale limit of Theorems 1 and 2): -A (TD), -A^T C^+ A (TDC),
    -A_c (CTD, VRC), -A^T C^+ A_c (CTDC).

    For CTDC this is the Schur complement of `expected_update`'s G over (u, omega):
    with u* = C^+ (b_c - A_c theta), the correction -gamma phi' phi^T u is not
    centered, so E[dtheta] = (C - H) u* = A^T C^+ (b_c - A_c theta), with the
    uncentered TD matrix A on the left. (The proof of Theorem 2 writes
    -A_c^T C^-1 A_c, which would be stable wherever A_c is nonsingular; on the
    2-state counterexample the actual matrix is -A^T C^-1 A_c = +0.02.)"""
    C_pinv = np.linalg.pinv(feature_covariance(env), rcond=_RANK_TOL)
    if algorithm == "td":
        return -td_matrices(env)[0]
    if algorithm == "tdc":
        A = td_matrices(env)[0]
        return -A.T @ C_pinv @ A
    if algorithm in ("ctd", "vrc"):
        return -centered_td_matrices(env)[0]
    if algorithm == "ctdc":
        return -td_matrices(env)[0].T @ C_pinv @ centered_td_matrices(env)[0]
    raise ValueError(f"algorithm: no slow ODE matrix for {algorithm!r}; known: td, tdc, ctd, vrc, ctdc")


# ----------------------------------------------------------------------- metrics

class Metric(NamedTuple):
    """metric(theta) = || R theta + h ||, with R of shape (m, k), m <= k + 1.

    A pytree: cast with `astype` and evaluate with `evaluate` inside jitted code.
    """

    R: jax.Array
    h: jax.Array

    def astype(self, dtype) -> "Metric":
        return Metric(jnp.asarray(self.R, dtype), jnp.asarray(self.h, dtype))


def evaluate(metric: Metric, theta: jax.Array) -> jax.Array:
    """|| R theta + h ||: O(k^2) and a sum of squares of a short vector."""
    e = metric.R @ theta + metric.h
    return jnp.sqrt(jnp.sum(e * e))


def _compress(W: np.ndarray) -> Metric:
    R = np.linalg.qr(W, mode="r")
    return Metric(R[:, :-1], R[:, -1])


def _pinv_sqrt(C: np.ndarray) -> np.ndarray:
    """L with L^T L = C^+ (so ||L y||^2 = y^T C^+ y)."""
    w, U = np.linalg.eigh(C)
    tol = _RANK_TOL * max(1.0, w.max(initial=0.0))
    keep = w > tol
    return (U[:, keep] / np.sqrt(w[keep])).T


def metric(env: FiniteMDP, name: str) -> Metric:
    """The closed-form metric `name` of `env` (float64), one of:

      rmscbe:  || delta_bar - (d^T delta_bar) 1 ||_D, delta_bar = r + gamma P Phi theta
               - Phi theta the expected TD error under pi (the paper's RMSCBE);
      rmspcbe: || Pi (delta_bar - (d^T delta_bar) 1) ||_D (zero at the centered TD fixpoint);
      rmspbe:  || Pi delta_bar ||_D (zero at the TD fixpoint);
      rmsve:   || Phi theta - v_pi ||_D.
    D = diag(d_mu) and Pi is the D-weighted projection onto the feature span.
    """
    m = _model(env)
    S = len(m.d)
    sqrt_d = np.sqrt(m.d)[:, None]
    # delta_bar(theta) = [M, r] [theta; 1]
    affine = np.hstack([(m.gamma * m.P - np.eye(S)) @ m.phi, m.r[:, None]])
    centering = np.eye(S) - np.outer(np.ones(S), m.d)
    if name == "rmscbe":
        W = sqrt_d * (centering @ affine)
    elif name in ("rmspcbe", "rmspbe"):
        x = centering @ affine if name == "rmspcbe" else affine
        W = _pinv_sqrt(m.phi.T @ np.diag(m.d) @ m.phi) @ (m.phi.T @ (m.d[:, None] * x))
    elif name == "rmsve":
        v = np.linalg.solve(np.eye(S) - m.gamma * m.P, m.r)
        W = sqrt_d * np.hstack([m.phi, -v[:, None]])
    else:
        raise ValueError(f"metric: unknown metric {name!r}; known: {', '.join(METRICS)}")
    return _compress(W)


def _value(env: FiniteMDP, name: str, theta) -> float:
    M = metric(env, name)
    e = M.R @ np.asarray(theta, np.float64) + M.h
    return float(np.sqrt(e @ e))


def rmscbe(env: FiniteMDP, theta) -> float:
    """Root mean squared centered Bellman error of one theta (float64)."""
    return _value(env, "rmscbe", theta)


def rmspcbe(env: FiniteMDP, theta) -> float:
    """Root mean squared projected centered Bellman error of one theta (float64)."""
    return _value(env, "rmspcbe", theta)


def rmspbe(env: FiniteMDP, theta) -> float:
    """Root mean squared projected Bellman error of one theta (float64)."""
    return _value(env, "rmspbe", theta)


def rmsve(env: FiniteMDP, theta) -> float:
    """Root mean squared value error ||Phi theta - v_pi||_{d_mu} of one theta (float64)."""
    return _value(env, "rmsve", theta)
