"""Planning: which grid points share a program (groups) and which run in one
call (chunks), and a chunk's grid input.

Points whose models have equal shapes and whose static hyperparameters are equal
form a group, one compiled program. A group runs in chunks of at most the
planned size (`plan_chunk`: the memory plan's, or the caller's); a group
smaller than that runs in one chunk padded to its bucket size
(`engine.buckets.bucket`), so grids of sizes within a bucket share one
program. The layout depends on the spec and the chunk size only, so a point's
result depends on neither.
"""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from bec_jax.engine import memory
from bec_jax.engine.buckets import bucket
from bec_jax.engine.protocol import round_chunk
from bec_jax.prediction.spec import SweepSpec

ENV_INDEX = "env_index"  # the grid-chunk entry saying which of a group's models a point uses


class Group(NamedTuple):
    """Grid points that share one compiled program.

    Attributes:
      indices: (n,) the points' grid indices, in grid order.
      models: the distinct `FiniteMDP`s of these points (E of them, equal shapes).
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


def plan_groups(spec: SweepSpec) -> list[Group]:
    """The grid split into groups of equal model shape and static hyperparameters,
    in order of first appearance."""
    alg = spec.algorithm_def
    statics = [h.name for h in alg.hyperparameters if h.static]
    points = spec.grid_points()
    models = spec.point_mdps()
    keyed: dict = {}
    for i, (p, m) in enumerate(zip(points, models)):
        key = (m.num_states, m.num_features, tuple((n, p[n]) for n in statics))
        keyed.setdefault(key, []).append(i)
    groups = []
    for key, idx in keyed.items():
        slot: dict[int, int] = {}  # id(model) -> its index among the group's models
        distinct, env_index = [], []
        for i in idx:
            m = models[i]
            if id(m) not in slot:
                slot[id(m)] = len(distinct)
                distinct.append(m)
            env_index.append(slot[id(m)])
        groups.append(Group(np.asarray(idx), distinct, np.asarray(env_index, np.int32), key[2]))
    return groups


def plan_chunk(spec: SweepSpec, chunk_size: int | None = None, n_devices: int = 1,
               memory_budget: int | None = None) -> int:
    """The grid points per compiled call `run` uses: `chunk_size` rounded up to a
    multiple of the device count, or by default all that fit in `memory_budget`
    (see `bec_jax.engine.memory.plan`)."""
    if chunk_size is None:
        return memory.plan(spec, n_devices, memory_budget=memory_budget).grid
    return round_chunk(chunk_size, n_devices)


def plan(spec: SweepSpec, chunk: int) -> tuple[list[Group], list[Chunk]]:
    """The groups and the chunks of at most `chunk` points each, in group order
    (a group smaller than `chunk` runs in one chunk, padded to its bucket size
    but never past `chunk`). The layout
    depends on the spec and `chunk` only; `run_chunks` pads each chunk to a
    multiple of the device count."""
    groups = plan_groups(spec)
    return groups, split(groups, chunk)


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


def num_chunks(spec: SweepSpec, chunk: int) -> int:
    """How many compiled calls a sweep of `spec` makes with chunks of `chunk` points."""
    return len(plan(spec, chunk)[1])


def pad(indices: np.ndarray, n_devices: int) -> np.ndarray:
    """A chunk's `indices` padded to a multiple of `n_devices` by repeating the last."""
    size = -(-len(indices) // n_devices) * n_devices
    return np.concatenate([indices, np.repeat(indices[-1:], size - len(indices))])


def chunk_grid(spec: SweepSpec, group: Group, chunk: Chunk) -> dict:
    """The program's grid input for one chunk: (chunk,) arrays of the traced
    hyperparameters and `env_index` (which of the group's models each point uses)."""
    dtype = jnp.dtype(spec.dtype)
    columns = spec.grid_arrays()
    idx = group.indices[chunk.indices]
    # NumPy arrays, cast on the host: placing them on devices then needs no program
    # of its own (a device-side cast or reshard would compile one).
    grid = {h.name: columns[h.name][idx].astype(dtype)
            for h in spec.algorithm_def.hyperparameters if not h.static}
    grid[ENV_INDEX] = group.env_index[chunk.indices].astype(np.int32)
    return grid


