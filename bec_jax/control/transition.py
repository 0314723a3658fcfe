"""The transition record of control: sparse state-action features as indices.

Linear action values are Q(s, a) = sum_i w[active(s, a)_i]: one-hot features have
one active index per (s, a), tile coding one per tiling. A transition carries
the active indices an update needs, never dense vectors of mostly zeros, so the
update functions (`bec_jax.control.algorithms`) know nothing of the task.
"""
from typing import NamedTuple

import jax


class ControlTransition(NamedTuple):
    """One transition (s, a, r, s') of one run.

    Attributes:
      active: (m,) int32 indices into the weights of the features of (s, a).
      reward: () r.
      discount: () gamma, 0 where s' is terminal (a truncated episode's last
        transition keeps gamma: it is learned as non-terminal).
      gamma: () the task's discount, also at termination (the authors' Greedy-GQ
        applies its correction with it there; see `algorithms`).
      next_active: (A, m) int32 indices of the features of (s', b) for every action b.
    """

    active: jax.Array
    reward: jax.Array
    discount: jax.Array
    gamma: jax.Array
    next_active: jax.Array


def q_values(w: jax.Array, active: jax.Array) -> jax.Array:
    """Q(s, .) from weights w (d,) and active indices (A, m): (A,) sums of weights."""
    return w[active].sum(axis=-1)
