"""Exact average-reward quantities of a finite MDP (numpy, float64).

For a model (P (S, A, S), R (S, A) expected reward) and a stationary policy pi
(S, A), the gain (average reward) is g = P*_pi r_pi with P*_pi the limiting
(Cesaro) matrix of P_pi (Puterman 1994, *Markov Decision Processes*, Sec. 8.2).
A unichain policy's gain is one number, d_pi . r_pi for its stationary
distribution d_pi; a multichain policy's depends on where it starts.

Periodicity. TwoChoice's loops have period 5, so powers of P_pi do not
converge and plain relative value iteration can cycle. Both computations here
use the aperiodicity transform P' = tau P + (1 - tau) I with 0 < tau < 1
(Puterman Sec. 8.5.4): every policy keeps its gain and stationary
distributions, P' is aperiodic, and its differential values are h' = h / tau.

`optimal` runs relative value iteration (Puterman Sec. 8.5.5; White 1963) on
the transformed MDP. It is chosen over policy iteration because it needs no
linear solve per policy, so multichain policies met on the way do no harm;
for a weakly communicating MDP (every task here) it converges to the optimal
gain, and the span of T h - h bounds the error of the gain at every iteration
(Puterman Thm. 8.5.5), which is the stopping rule.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

TAU = 0.5  # the aperiodicity transform's weight on P
_SQUARINGS = 80  # P'^(2^80): far past any mixing time of the tasks here


class Optimal(NamedTuple):
    """The optimal average-reward solution of a model (`optimal`).

    Attributes:
      gain: g*, the optimal average reward (float).
      policy: (S,) int, a greedy optimal action per state (the first of ties).
      h: (S,) differential state values, h[ref] = 0: g* + h(s) = max_a
        [R(s, a) + sum_s' P(s' | s, a) h(s')].
      q: (S, A) differential action values q(s, a) = R(s, a) - g* + sum_s'
        P(s' | s, a) h(s'), so max_a q(s, a) = h(s) (the fixed point of
        differential Q-learning, Wan, Naik and Sutton 2021, Eq. 5).
      ref: the reference state.
    """

    gain: float
    policy: np.ndarray
    h: np.ndarray
    q: np.ndarray
    ref: int


def _model(P, R) -> tuple[np.ndarray, np.ndarray]:
    P = np.asarray(P, np.float64)
    R = np.asarray(R, np.float64)
    if P.ndim != 3 or P.shape[0] != P.shape[2] or R.shape != P.shape[:2]:
        raise ValueError(f"model: P must be (S, A, S) and R (S, A), got {P.shape} and {R.shape}")
    if P.min() < 0 or not np.allclose(P.sum(-1), 1.0, atol=1e-10):
        raise ValueError("model: every P[s, a] must be a probability distribution over next states")
    return P, R


def _policy(pi, num_states: int, num_actions: int) -> np.ndarray:
    """pi as (S, A) probabilities; (S,) integer actions become one-hot rows."""
    pi = np.asarray(pi)
    if pi.shape == (num_states,) and np.issubdtype(pi.dtype, np.integer):
        if pi.min() < 0 or pi.max() >= num_actions:
            raise ValueError(f"policy: actions must be in [0, {num_actions}), got {pi.min()}..{pi.max()}")
        return np.eye(num_actions)[pi]
    pi = pi.astype(np.float64)
    if pi.shape != (num_states, num_actions) or pi.min() < 0 or not np.allclose(pi.sum(-1), 1.0, atol=1e-10):
        raise ValueError(f"policy: ({num_states}, {num_actions}) rows of action probabilities or ({num_states},) "
                         f"integer actions, got shape {pi.shape}")
    return pi


def policy_matrices(P, R, pi) -> tuple[np.ndarray, np.ndarray]:
    """(P_pi (S, S), r_pi (S,)) of policy pi: P_pi(s, s') = sum_a pi(a|s)
    P(s'|s, a), r_pi(s) = sum_a pi(a|s) R(s, a) (Puterman Sec. 8.2)."""
    P, R = _model(P, R)
    pi = _policy(pi, *R.shape)
    return np.einsum("sa,sat->st", pi, P), (pi * R).sum(-1)


def limiting_matrix(P_pi, tau: float = TAU) -> np.ndarray:
    """The limiting matrix P* = lim_n (1/n) sum_k P_pi^k (Puterman Sec. A.4),
    as lim_n P'^n of the aperiodic P' = tau P_pi + (1 - tau) I (same limit) by
    repeated squaring. `ValueError` if it has not converged (a chain mixing
    over more than ~2^80 steps)."""
    P_pi = np.asarray(P_pi, np.float64)
    m = tau * P_pi + (1.0 - tau) * np.eye(len(P_pi))
    for _ in range(_SQUARINGS):
        nxt = m @ m
        if np.abs(nxt - m).max() < 1e-13:
            return nxt
        m = nxt
    raise ValueError("policy: the chain's limiting matrix did not converge (it mixes too slowly)")


def gain_vector(P, R, pi) -> np.ndarray:
    """(S,) the gain of pi from each start state, g = P*_pi r_pi (Puterman
    Eq. 8.2.2); constant for a unichain policy."""
    P_pi, r_pi = policy_matrices(P, R, pi)
    return limiting_matrix(P_pi) @ r_pi


def policy_gain(P, R, pi, start=None) -> float:
    """The average reward of the stationary policy pi ((S, A) probabilities or
    (S,) actions) under the model (P, R) (Puterman Sec. 8.2). A multichain
    policy's gain depends on the start: give `start`, a state index or an (S,)
    distribution; without one, `ValueError` naming the differing gains."""
    g = gain_vector(P, R, pi)
    if start is not None:
        start = np.asarray(start)
        if start.ndim == 0:
            return float(g[int(start)])
        return float(np.asarray(start, np.float64) @ g)
    scale = max(1.0, float(np.abs(R).max()))
    if g.max() - g.min() > 1e-9 * scale:
        raise ValueError(f"policy: multichain, its gain depends on the start state ({g.min():.6g} .. "
                         f"{g.max():.6g}); give start")
    return float(g.mean())


def optimal(P, R, *, ref: int = 0, tau: float = TAU, tol: float = 1e-10, max_iter: int = 100_000) -> Optimal:
    """The optimal gain, a greedy optimal policy, the differential values h
    (h[ref] = 0) and q of the model, by relative value iteration on the
    aperiodicity-transformed MDP (module docstring; Puterman Sec. 8.5.5):
    h'_{k+1} = T' h'_k - (T' h'_k)[ref], stopped when span(T' h' - h') < tol
    times max(1, max |R|); then h = tau h'. `ValueError` if it does not
    converge in `max_iter` sweeps (a multichain MDP, whose optimal gain differs
    by start state)."""
    P, R = _model(P, R)
    num_states = R.shape[0]
    if not 0 <= ref < num_states:
        raise ValueError(f"ref: a state in [0, {num_states}), got {ref!r}")
    if not 0.0 < tau < 1.0:
        raise ValueError(f"tau: a number in (0, 1), got {tau!r}")
    scale = max(1.0, float(np.abs(R).max()))
    h = np.zeros(num_states)
    for _ in range(max_iter):
        th = (R + tau * (P @ h)).max(1) + (1.0 - tau) * h
        diff = th - h
        lo, hi = diff.min(), diff.max()
        h = th - th[ref]
        if hi - lo < tol * scale:
            break
    else:
        raise ValueError(f"model: relative value iteration did not converge in {max_iter} sweeps (span "
                         f"{hi - lo:.3g}); the MDP may be multichain")
    gain = 0.5 * (lo + hi)
    h = tau * h
    q = R + P @ h - gain
    policy = np.argmax(q >= q.max(1, keepdims=True) - 1e-9 * scale, axis=1)
    return Optimal(gain=float(gain), policy=policy, h=h - h[ref], q=q, ref=int(ref))


def greedy_optimal_fraction(q_learned, opt: Optimal, atol: float = 1e-8):
    """The fraction of states where the learned greedy action argmax_a
    q_learned(s, a) (the first of ties, as `jnp.argmax`) is optimal, an action
    being optimal where opt.q(s, a) is within `atol` times max(1, max |q*|) of
    max_a opt.q(s, a) (issue 46's metric; ties among optimal actions all count).
    q_learned is (S, A) (a float) or (..., S, A) (an array over the leading
    axes)."""
    q_learned = np.asarray(q_learned)
    if q_learned.shape[-2:] != opt.q.shape:
        raise ValueError(f"q_learned: (..., {opt.q.shape[0]}, {opt.q.shape[1]}) action values, got {q_learned.shape}")
    scale = max(1.0, float(np.abs(opt.q).max()))
    is_opt = opt.q >= opt.q.max(1, keepdims=True) - atol * scale  # (S, A)
    greedy = np.argmax(q_learned, axis=-1)  # (..., S)
    hit = np.take_along_axis(np.broadcast_to(is_opt, q_learned.shape), greedy[..., None], axis=-1)[..., 0]
    frac = hit.mean(-1)
    return float(frac) if frac.ndim == 0 else frac


__all__ = ["TAU", "Optimal", "gain_vector", "greedy_optimal_fraction", "limiting_matrix", "optimal",
           "policy_gain", "policy_matrices"]
