"""Planning, the part every front shares: groups of grid points (one compiled
program each) and the chunks (one compiled call each) they run in.

A front says which points form a group (`Engine.plan`). A group runs in chunks
of at most the planned size; a group smaller than that runs in one chunk
padded to its bucket size (`engine.buckets.bucket`), so grids of sizes within
a bucket share one program. The layout depends on the spec and the chunk size
only, so a point's result depends on neither.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bec_jax.engine.buckets import bucket


class Group(NamedTuple):
    """Grid points that share one compiled program.

    Attributes:
      indices: (n,) the points' grid indices, in grid order.
      models: the distinct models of these points (E of them, equal shapes;
        none for a front whose programs take no model).
      env_index: (n,) int32 which model each point uses.
      static: the static hyperparameters' values, as sorted (name, value) pairs.
    """

    indices: np.ndarray
    models: list
    env_index: np.ndarray
    static: tuple


class Chunk(NamedTuple):
    """One compiled call: `indices` (padded by repeating the last point) of group
    `group`; the first `n` are real."""

    group: int
    indices: np.ndarray
    n: int


def split(groups: list[Group], chunk: int) -> list[Chunk]:
    """Each group's points in chunks of at most `chunk` (a group smaller than
    `chunk` in one chunk of its bucket size, `bucket(n)`, capped at `chunk`;
    the padding repeats its last point, computed and discarded), in group
    order; every front's layout."""
    chunks = []
    for gi, g in enumerate(groups):
        n = len(g.indices)
        size = min(chunk, bucket(n))
        for start in range(0, n, size):
            stop = min(start + size, n)
            pos = np.minimum(np.arange(start, start + size), stop - 1)
            chunks.append(Chunk(gi, pos, stop - start))
    return chunks


def pad(indices: np.ndarray, n_devices: int) -> np.ndarray:
    """A chunk's `indices` padded to a multiple of `n_devices` by repeating the last."""
    size = -(-len(indices) // n_devices) * n_devices
    return np.concatenate([indices, np.repeat(indices[-1:], size - len(indices))])
