"""The engine's data layout: which leaves of a learner's state are batched over
runs, and the seed-major order of the program's per-run arrays.

Inside a program a batched state leaf is (seeds, grid points, ...) -- seeds
outside, grid points inside, so a seed's transition is constant over its whole
plane of states -- and the declared update counter is one unbatched copy shared
by every run. The per-seed area sums are (metrics, seeds, grid points); the
outputs keep the grid axis first. The memory plan sizes states by the same rule.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def state_axes(template, counter: str | None, skip=()):
    """vmap axes of the state: 0 for every leaf but the declared update counter,
    which is the same for every run and kept as one copy (None). Fields named in
    `skip` get None too (used to leave traces out of the divergence check)."""
    def axis(path, _):
        last = path[-1] if path else None
        name = getattr(last, "name", None) or getattr(last, "key", None)
        return None if (counter is not None and name == counter) or name in skip else 0
    return jax.tree_util.tree_map_with_path(axis, template)


def counter_index(template, counter: str | None) -> int | None:
    """The position among the state's leaves of the update counter, the one scalar
    leaf named `counter` (the leaf `state_axes` keeps unbatched); None if there
    is no such leaf. (Not `getattr`: every NamedTuple has a `count` method.)"""
    hits = [i for i, (path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(template)[0])
            if counter is not None and path and getattr(leaf, "shape", None) == ()
            and (getattr(path[-1], "name", None) or getattr(path[-1], "key", None)) == counter]
    return hits[0] if len(hits) == 1 else None


def seed_major(vals: jax.Array) -> jax.Array:
    """(M, G, N) <-> (M, N, G): metric values to the per-seed area sums' layout, and back."""
    return jnp.swapaxes(vals, 1, 2)

