"""The divergence check and the revert that freezes diverged runs, shared by
every front's program.

A program checks its runs once per block, not per step (a per-step check
costs more than the update): a run whose state left [-bound, bound], or
stopped being finite, during the block goes back to its state at the block's
start, stays frozen there, and is flagged with the block's last step. Runs
are batched over two leading axes (grid and seed, in the front's order) or
one (a flat batch of runs);
`axes` (a pytree like the state, None for an unbatched leaf such as a shared
update counter) says which leaves are per run.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def max_abs(x: jax.Array, batch: int = 2) -> jax.Array:
    """max |x| over the axes after the first `batch` (the runs'). The max over the
    minor axis is unrolled into elementwise maxima: a minor-axis reduction is
    slow on the CPU (see `algorithms.base.vdot`)."""
    x = jnp.abs(x.reshape(x.shape[:batch] + (-1,)))
    m = x[..., 0]
    for i in range(1, x.shape[-1]):
        m = jnp.maximum(m, x[..., i])
    return m


def run_ok(state, bound: float, axes=None, view: Callable | None = None, batch: int = 2) -> jax.Array:
    """(B0, B1) True where every per-run float leaf of `state` is finite and within
    `bound` (NaN fails the comparison, so it counts as diverged); runs batched
    over the first `batch` axes (two: (B0, B1); one: a flat (B,)). `view(leaf)`,
    where given, maps a per-run vector leaf (B0, B1, d) to the values the check
    reads instead of the whole vector (control checks the action values at the
    current state: O(A m) per run, whatever d)."""
    ok = None
    leaves = jax.tree_util.tree_leaves(state)
    axes = [0] * len(leaves) if axes is None else jax.tree_util.tree_leaves(axes, is_leaf=lambda a: a is None)
    for x, ax in zip(leaves, axes):
        if ax is None or not jnp.issubdtype(x.dtype, jnp.floating):
            continue
        if view is not None and x.ndim > batch:
            x = view(x)
        leaf_ok = max_abs(x, batch) <= bound
        ok = leaf_ok if ok is None else ok & leaf_ok
    return ok


def broadcast_mask(mask: jax.Array, x: jax.Array) -> jax.Array:
    """`mask` reshaped to broadcast against `x` (trailing axes of one)."""
    return mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))


def revert(keep: jax.Array, new, old, axes=None):
    """`new` where `keep`, else `old`, leaf by leaf; `keep` has the runs' batch
    shape, leaves with axis None (shared, not per run) keep `new`."""
    if axes is None:
        return jax.tree_util.tree_map(lambda n, o: jnp.where(broadcast_mask(keep, n), n, o), new, old)
    return jax.tree_util.tree_map(lambda n, o, ax: n if ax is None else jnp.where(broadcast_mask(keep, n), n, o),
                                  new, old, axes)


def skippable(conditional: bool, needed: jax.Array, work: Callable, unchanged):
    """`work()` where `needed` (a scalar), else `unchanged`: as a conditional
    that skips the work (`conditional`), or as the work every time and a select
    of the two, the conditional's values exactly. On a GPU a conditional reads
    `needed` back to the host each time round (`tuning.KernelForm.branches`)."""
    if conditional:
        return jax.lax.cond(needed, work, lambda: unchanged)
    return jax.tree_util.tree_map(lambda a, b: jnp.where(needed, a, b), work(), unchanged)


def flag(dstep: jax.Array, alive: jax.Array, keep: jax.Array, step) -> jax.Array:
    """The divergence steps after a block ending at `step`: -1 for a run still
    alive, the step at which a run first failed the check."""
    return jnp.where(alive & ~keep, step, dstep)


__all__ = ["broadcast_mask", "flag", "max_abs", "revert", "run_ok", "skippable"]
