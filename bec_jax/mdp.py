"""The finite MDP model: a validated pytree of arrays, plus its derived quantities.

The model is the single source of truth. Samplers build their tables from it and
`bec_jax.theory.expected_updates` computes exact quantities from it; update functions never see it.
Derived quantities are computed on the host in float64 (they feed closed forms).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Tolerance for "rows sum to one": generous enough for hand-typed fractions like 1/7.
_ROW_SUM_TOL = 1e-6


class FiniteMDP(NamedTuple):
    """A finite MDP with a target and a behaviour policy and linear features.

    Shapes: S states, A actions, k features.

    Attributes:
      pi: (S, A) target policy pi(a|s).
      mu: (S, A) behaviour policy mu(a|s).
      P: (S, A, S) transition probabilities P(s'|s, a).
      R: (S, A, S) rewards R(s, a, s').
      phi: (S, k) feature matrix Phi (row s is phi(s)).
      gamma: () constant discount in [0, 1), or (S, A, S) per-transition discount
        gamma(s, a, s') in [0, 1] (0 where an episode ends; see `discounts`).
      start: (S,) start distribution of a trajectory.
      theta0: (k,) initial weights.
    """

    pi: np.ndarray
    mu: np.ndarray
    P: np.ndarray
    R: np.ndarray
    phi: np.ndarray
    gamma: np.ndarray
    start: np.ndarray
    theta0: np.ndarray

    @property
    def num_states(self) -> int:
        return int(self.P.shape[0])

    @property
    def num_actions(self) -> int:
        return int(self.P.shape[1])

    @property
    def num_features(self) -> int:
        return int(self.phi.shape[1])


def _as_float_array(name: str, value, ndim: int | None) -> np.ndarray:
    try:
        if np.asarray(value).dtype.kind == "c":
            raise ValueError("complex values")
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: expected a numeric array ({e})") from None
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: all values must be finite, got non-finite entries")
    return arr


def _check_distribution(name: str, arr: np.ndarray) -> None:
    """Checks that the last axis of `arr` holds probability distributions."""
    if np.any(arr < 0):
        idx = tuple(int(i) for i in np.argwhere(arr < 0)[0])
        raise ValueError(f"{name}: probabilities must be non-negative, got {arr[idx]} at index {idx}")
    sums = arr.sum(axis=-1)
    bad = np.abs(sums - 1.0) > _ROW_SUM_TOL
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(bad)[0]) if sums.ndim else ()
        raise ValueError(
            f"{name}: each row must sum to 1, got row {idx} summing to {float(sums[idx]) if idx else float(sums)}"
        )


FIELDS = FiniteMDP._fields
REQUIRED_FIELDS = ("pi", "mu", "P", "R", "phi", "gamma")


def _check_gamma(gamma, S: int, A: int) -> np.ndarray:
    """gamma as a float64 array of shape () or (S, A, S)."""
    if isinstance(gamma, (str, bytes, bool, np.bool_)):  # float("0.9") and float(True) would pass
        raise ValueError(f"gamma: expected a number in [0, 1) or an (S, A, S) array, got {gamma!r}")
    g = _as_float_array("gamma", gamma, None)
    if g.ndim == 0:
        if not (0.0 <= float(g) < 1.0):
            raise ValueError(f"gamma: must be in [0, 1), got {float(g)!r}")
        return np.float64(g)
    if g.shape != (S, A, S):
        raise ValueError(f"gamma: expected a number or shape (S, A, S) = {(S, A, S)} to match P, got {g.shape}")
    if np.any((g < 0) | (g > 1)):
        idx = tuple(int(i) for i in np.argwhere((g < 0) | (g > 1))[0])
        raise ValueError(f"gamma: per-transition discounts must be in [0, 1], got {g[idx]} at (s, a, s') = {idx}")
    return g


def make_mdp(
    *,
    pi,
    mu,
    P,
    R,
    phi,
    gamma,
    start=None,
    theta0=None,
) -> FiniteMDP:
    """Builds and validates a `FiniteMDP`; raises `ValueError` naming the bad field.

    Args:
      pi: (S, A) target policy. mu: (S, A) behaviour policy.
      P: (S, A, S) transition probabilities. R: (S, A, S) rewards, or (S, A) for
        rewards that do not depend on s'.
      phi: (S, k) features.
      gamma: a constant discount in [0, 1), or an (S, A, S) array of
        per-transition discounts gamma(s, a, s') in [0, 1] (transition-based
        discounting, White 2017): an episodic task is a continuing chain whose
        episode-ending transitions go to a start state with gamma = 0.
      start: (S,) start distribution; default the behaviour's stationary one.
      theta0: (k,) initial weights; default zeros.

    Checks: finite values, consistent shapes, non-negative probabilities whose rows
    sum to one, gamma in range, coverage (pi(a|s) > 0 requires mu(a|s) > 0), a
    unique stationary distribution of the behaviour chain, and, with
    per-transition discounts, that every episode under pi ends (the discounted
    target matrix has spectral radius < 1, so v_pi exists).

    Features: rank-deficient ones (a zero column, a repeated one, fewer
    independent columns than k) are legal, as in linear TD: the fixpoints are
    then a set, the projected metrics use a pseudo-inverse, and
    `theory.fixpoints` reports the set. Features of rank 0 (all zero) are
    refused: a linear learner would learn nothing. Values beyond a run's
    floating-point range are refused where the dtype is known (`check_range`).
    """
    pi, mu, P, R, phi = _model_arrays(pi, mu, P, R, phi)
    S, A = pi.shape
    g = _check_gamma(gamma, S, A)

    _check_distribution("pi", pi)
    _check_distribution("mu", mu)
    _check_distribution("P", P)
    uncovered = (pi > 0) & (mu <= 0)
    if np.any(uncovered):
        s, a = (int(i) for i in np.argwhere(uncovered)[0])
        raise ValueError(
            f"mu: coverage violated at state {s}, action {a}: pi(a|s) = {pi[s, a]} > 0 requires mu(a|s) > 0"
        )

    k = phi.shape[1]
    theta0 = np.zeros(k) if theta0 is None else _as_float_array("theta0", theta0, 1)
    if theta0.shape != (k,):
        raise ValueError(f"theta0: expected shape ({k},) to match phi, got {theta0.shape}")

    mdp = FiniteMDP(pi=pi, mu=mu, P=P, R=R, phi=phi, gamma=g,
                    start=np.zeros(S), theta0=theta0)
    if start is None:
        start = stationary_distribution(transition_matrix(mdp, mdp.mu))
    start = _as_float_array("start", start, 1)
    if start.shape != (S,):
        raise ValueError(f"start: expected shape ({S},), got {start.shape}")
    _check_distribution("start", start)
    mdp = mdp._replace(start=start)
    # Fail at construction, not deep inside analysis, when d_mu is not unique.
    d_mu(mdp)
    if g.ndim:
        _check_episodes_end(mdp)
    return mdp


def _model_arrays(pi, mu, P, R, phi) -> tuple:
    """(pi, mu, P, R, phi) as float arrays of consistent shapes (R of shape
    (S, A) repeated over s'); `ValueError` naming the first bad field."""
    P = _as_float_array("P", P, 3)
    S, A, S2 = P.shape
    if S != S2 or S == 0 or A == 0:
        raise ValueError(f"P: expected shape (S, A, S) with S, A > 0, got {P.shape}")
    pi = _as_float_array("pi", pi, 2)
    mu = _as_float_array("mu", mu, 2)
    for name, arr in (("pi", pi), ("mu", mu)):
        if arr.shape != (S, A):
            raise ValueError(f"{name}: expected shape (S, A) = {(S, A)} to match P, got {arr.shape}")
    R = _as_float_array("R", R, None)
    if R.ndim not in (2, 3):
        raise ValueError(f"R: expected shape (S, A, S) or (S, A), got {R.shape}")
    if R.ndim == 2:
        R = np.repeat(R[:, :, None], S, axis=2)
    R = _as_float_array("R", R, 3)
    if R.shape != (S, A, S):
        raise ValueError(f"R: expected shape (S, A, S) = {(S, A, S)} to match P, got {R.shape}")
    phi = _as_float_array("phi", phi, 2)
    if phi.shape[0] != S or phi.shape[1] == 0:
        raise ValueError(f"phi: expected shape (S, k) with S = {S} rows and k > 0, got {phi.shape}")
    if not np.any(phi):  # rank 0: every update and every projection would be 0 (and the projected metrics empty)
        raise ValueError("phi: the features are all zero (rank 0); a linear learner would learn nothing")
    return pi, mu, P, R, phi


def check_value_range(field: str, value, dtype) -> None:
    """`ValueError` naming `field` when some entry of `value` (a number or an
    array) is beyond the largest finite number of `dtype` (float32: 3.4e+38):
    a run in that dtype would turn it into inf before its first step."""
    arr = np.asarray(value, np.float64).ravel()
    top = float(np.finfo(np.dtype(dtype)).max)
    if arr.size and np.any(np.abs(arr) > top):
        worst = float(arr[np.argmax(np.abs(arr))])
        raise ValueError(f"{field}: {worst:g} is beyond {np.dtype(dtype).name}'s range (max {top:.2g})")


# The fields that validation leaves unbounded (the others are probabilities or
# discounts in [0, 1]).
UNBOUNDED_FIELDS = ("R", "phi", "theta0")


def check_range(mdp: FiniteMDP, dtype) -> None:
    """`ValueError` naming the first field of `mdp` with an entry beyond
    `dtype`'s range (`check_value_range`); a model is float64, a run may be float32."""
    for name in UNBOUNDED_FIELDS:
        check_value_range(name, getattr(mdp, name), dtype)


def _check_episodes_end(mdp: FiniteMDP) -> None:
    """`ValueError` on `gamma` unless every episode under the target policy ends
    (the discounted target matrix has spectral radius < 1, so v_pi exists)."""
    radius = float(np.max(np.abs(np.linalg.eigvals(discounted_matrix(mdp, mdp.pi)))))
    if radius > 1.0 - 1e-10:
        raise ValueError(
            "gamma: under the target policy some episodes never end (the discounted transition "
            f"matrix sum_a pi(a|s) P(s'|s,a) gamma(s,a,s') has spectral radius {radius:.6g}, not < 1), "
            "so v_pi is undefined; give the terminating transitions gamma = 0")


def transition_matrix(mdp: FiniteMDP, policy: np.ndarray) -> np.ndarray:
    """(S, S) state-to-state matrix sum_a policy(a|s) P(s'|s,a)."""
    return np.einsum("sa,sat->st", np.asarray(policy, np.float64), np.asarray(mdp.P, np.float64))


def discounts(mdp: FiniteMDP) -> np.ndarray:
    """(S, A, S) per-transition discounts gamma(s, a, s') (a constant gamma broadcast)."""
    S, A = mdp.num_states, mdp.num_actions
    return np.broadcast_to(np.asarray(mdp.gamma, np.float64), (S, A, S))


def discounted_matrix(mdp: FiniteMDP, policy: np.ndarray) -> np.ndarray:
    """(S, S) matrix sum_a policy(a|s) P(s'|s,a) gamma(s,a,s'): the expected
    discounted successor, so that the Bellman operator is T v = r + P_gamma v
    (gamma P for a constant gamma)."""
    return np.einsum("sa,sat,sat->st", np.asarray(policy, np.float64), np.asarray(mdp.P, np.float64),
                     discounts(mdp))


def P_pi_gamma(mdp: FiniteMDP) -> np.ndarray:
    """(S, S) discounted transition matrix under the target policy."""
    return discounted_matrix(mdp, mdp.pi)


def v_pi(mdp: FiniteMDP) -> np.ndarray:
    """(S,) true values of the target policy, (I - P_pi_gamma)^-1 r_pi."""
    S = mdp.num_states
    return np.linalg.solve(np.eye(S) - P_pi_gamma(mdp), r_pi(mdp))


def P_pi(mdp: FiniteMDP) -> np.ndarray:
    """(S, S) state transition matrix under the target policy."""
    return transition_matrix(mdp, mdp.pi)


def P_mu(mdp: FiniteMDP) -> np.ndarray:
    """(S, S) state transition matrix under the behaviour policy."""
    return transition_matrix(mdp, mdp.mu)


def expected_reward(mdp: FiniteMDP, policy: np.ndarray) -> np.ndarray:
    """(S,) expected one-step reward sum_a policy(a|s) sum_s' P(s'|s,a) R(s,a,s')."""
    return np.einsum("sa,sat,sat->s", np.asarray(policy, np.float64), mdp.P, mdp.R)


def r_pi(mdp: FiniteMDP) -> np.ndarray:
    """(S,) expected reward under the target policy (the paper's R^pi)."""
    return expected_reward(mdp, mdp.pi)


def r_mu(mdp: FiniteMDP) -> np.ndarray:
    """(S,) expected reward under the behaviour policy."""
    return expected_reward(mdp, mdp.mu)


def stationary_distribution(P: np.ndarray) -> np.ndarray:
    """The unique stationary distribution d of a row-stochastic P (d^T P = d^T).

    Raises `ValueError` if the chain has several (it is not unichain).
    """
    P = np.asarray(P, np.float64)
    S = P.shape[0]
    # d^T (P - I) = 0 with 1^T d = 1, as a stacked least-squares system.
    M = np.vstack([P.T - np.eye(S), np.ones((1, S))])
    rhs = np.zeros(S + 1)
    rhs[-1] = 1.0
    rank = np.linalg.matrix_rank(M, tol=1e-10)
    if rank < S:
        raise ValueError(
            f"mu: the behaviour chain has {S - rank + 1} closed classes, so its stationary "
            "distribution is not unique; make the behaviour chain unichain"
        )
    d, *_ = np.linalg.lstsq(M, rhs, rcond=None)
    d = np.clip(d, 0.0, None)
    return d / d.sum()


def d_mu(mdp: FiniteMDP) -> np.ndarray:
    """(S,) stationary state distribution of the behaviour policy."""
    return stationary_distribution(P_mu(mdp))


def rho(mdp: FiniteMDP) -> np.ndarray:
    """(S, A) importance ratios pi(a|s) / mu(a|s) (0 where mu(a|s) = 0)."""
    pi = np.asarray(mdp.pi, np.float64)
    mu = np.asarray(mdp.mu, np.float64)
    return np.divide(pi, mu, out=np.zeros_like(pi), where=mu > 0)


def is_on_policy(mdp: FiniteMDP) -> bool:
    """True when the target and behaviour policies agree on every state."""
    return bool(np.allclose(mdp.pi, mdp.mu, rtol=0, atol=1e-12))


def validate(mdp) -> FiniteMDP:
    """`mdp` (a `FiniteMDP`, or a dict of its fields) validated by `make_mdp`."""
    fields = mdp._asdict() if isinstance(mdp, FiniteMDP) else dict(mdp)
    return make_mdp(**fields)


def fingerprint(mdp: FiniteMDP) -> str:
    """A short hash of the model's arrays: two MDPs with the same fingerprint are
    the same model (recorded with results, checked on resume)."""
    import hashlib
    h = hashlib.sha256()
    for name in FIELDS:
        a = np.ascontiguousarray(np.asarray(getattr(mdp, name), np.float64))
        h.update(name.encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]
