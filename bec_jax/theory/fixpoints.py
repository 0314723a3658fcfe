"""The closed-form TD fixpoints of a finite model, in float64.

Notation (all from the model; d = d_mu, D = diag(d), r = r_pi, and
P_g = sum_a pi(a|s) P(s'|s,a) gamma(s,a,s') the discounted target matrix, which
is gamma P_pi for a constant gamma; see `mdp.discounted_matrix`):
  TD:        A = Phi^T D (I - P_g) Phi,            b = Phi^T D r
  centered:  A_c = Phi^T (D - d d^T)(I - P_g) Phi, b_c = Phi^T (D - d d^T) r
  C = Phi^T D Phi.
With per-transition discounts (episodic tasks) these are the standard forms of
transition-based discounting (White 2017): the Bellman operator is
T v = r + P_g v. The centered TD fixpoint solves A_c theta = b_c (paper eq. (27)
[centeredTDfixpoint] and Theorem 1). When A_c is singular (Boyan: the constant
vector is in the feature span; Baird: more features than states) the fixpoints
form an affine subspace: `centered_td_fixpoint` returns its minimum-norm point,
`fixpoint_set` the whole set.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bec_jax import mdp as mdp_lib
from bec_jax.mdp import FiniteMDP

# Singular values below RANK_TOL times the largest count as zero.
RANK_TOL = 1e-10


class ModelArrays(NamedTuple):
    """The model's float64 arrays the closed forms use: features Phi (S, k),
    d_mu (S,), the discounted target matrix P_g (S, S) and r_pi (S,)."""

    phi: np.ndarray
    d: np.ndarray
    Pg: np.ndarray   # discounted target matrix P_g
    r: np.ndarray


def model_arrays(env: FiniteMDP) -> ModelArrays:
    """The `ModelArrays` of `env`."""
    return ModelArrays(np.asarray(env.phi, np.float64), mdp_lib.d_mu(env), mdp_lib.P_pi_gamma(env),
                  mdp_lib.r_pi(env))


def td_matrices(env: FiniteMDP) -> tuple[np.ndarray, np.ndarray]:
    """(A, b) of the off-policy TD fixpoint A theta = b, with d = d_mu."""
    m = model_arrays(env)
    D = np.diag(m.d)
    A = m.phi.T @ D @ (np.eye(len(m.d)) - m.Pg) @ m.phi
    return A, m.phi.T @ D @ m.r


def centered_td_matrices(env: FiniteMDP) -> tuple[np.ndarray, np.ndarray]:
    """(A_c, b_c) of the centered TD fixpoint: A_c = Phi^T (D - d d^T)(I - P_g) Phi,
    b_c = Phi^T (D - d d^T) r, d = d_mu. A_c is the (off-policy) CTD matrix of the
    paper's lemma and of Theorem 1 (there written Cov(phi, phi - gamma phi'))."""
    m = model_arrays(env)
    K = np.diag(m.d) - np.outer(m.d, m.d)
    A = m.phi.T @ K @ (np.eye(len(m.d)) - m.Pg) @ m.phi
    return A, m.phi.T @ K @ m.r


def feature_covariance(env: FiniteMDP) -> np.ndarray:
    """C = E[phi phi^T] = Phi^T D Phi under d_mu (TDC's auxiliary matrix)."""
    m = model_arrays(env)
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
    tol = RANK_TOL * max(1.0, s.max(initial=0.0))
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

__all__ = ["RANK_TOL", "FixpointSet", "ModelArrays", "centered_td_fixpoint", "centered_td_fixpoint_set",
           "centered_td_matrices", "feature_covariance", "fixpoint_set", "model_arrays", "td_fixpoint",
           "td_fixpoint_set", "td_matrices"]
