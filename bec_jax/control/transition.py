"""The transition record of control, and the two feature operations every
control update is written with.

Linear action values are Q(s, a) = w^T phi(s, a) over one weight vector w (d,)
covering all actions. A feature array comes in one of two kinds, told apart by
its dtype when the program is traced (no run-time branch):

  * sparse binary (an integer array): the indices i of the features that are 1,
    Q(s, a) = sum_i w[i]. One-hot features have one index per (s, a), tile
    coding one per tiling. Updates touch only those entries (`w.at[i].add`):
    the fast path, and the only one the paper's tasks use.
  * dense (a floating array): the vector phi(s, a) itself, (d,), Q(s, a) =
    w . phi(s, a), and updates add a multiple of it to every entry.

A transition carries the features an update needs, never a task's state, so
the update functions (`bec_jax.control.algorithms`) know nothing of the task
and are written once for both kinds with `q_values` and `add`.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp


class ControlTransition(NamedTuple):
    """One transition (s, a, r, s') of one run.

    Attributes:
      active: the features of (s, a): (m,) integer indices into the weights
        (sparse binary) or the (d,) float vector phi(s, a) (dense).
      reward: () r.
      discount: () gamma, 0 where s' is terminal (a truncated episode's last
        transition keeps gamma: it is learned as non-terminal).
      gamma: () the task's discount, also at termination (the authors' Greedy-GQ
        applies its correction with it there; see `algorithms`).
      next_active: the features of (s', b) for every action b: (A, m) integer
        indices or (A, d) float vectors, of the same kind as `active`.
    """

    active: jax.Array
    reward: jax.Array
    discount: jax.Array
    gamma: jax.Array
    next_active: jax.Array


def is_sparse(features: jax.Array) -> bool:
    """Whether `features` are sparse binary indices (an integer array) rather
    than dense vectors (a floating array); known at trace time."""
    return jnp.issubdtype(features.dtype, jnp.integer)


def q_values(w: jax.Array, features: jax.Array) -> jax.Array:
    """Q from weights w (d,): w . phi for each feature row. Sparse indices
    (..., m) give the sums of the indexed weights, dense vectors (..., d) their
    dot products with w (computed in w's dtype); (A, .) gives Q(s, .) (A,), one
    row (.,) gives Q(s, a) ()."""
    if is_sparse(features):
        return w[features].sum(axis=-1)
    # HIGHEST: not a GPU's default TF32 (algorithms.base._dot); the same bits on the CPU.
    return jnp.matmul(features.astype(w.dtype), w, precision=jax.lax.Precision.HIGHEST)


def add(w: jax.Array, features: jax.Array, amount: jax.Array) -> jax.Array:
    """w + amount phi for the features phi of one (s, a) and a scalar `amount`:
    sparse indices (m,) add `amount` at each index (a scatter-add, so an index
    given twice is added twice, as phi's entry 2 would be), dense vectors (d,)
    add amount * phi to every entry (in w's dtype)."""
    if is_sparse(features):
        return w.at[features].add(amount)
    return w + (amount * features.astype(w.dtype)).astype(w.dtype)
