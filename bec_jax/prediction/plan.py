"""A prediction sweep's plan: which grid points share a program (groups), the
grid points per call, and a chunk's grid input.

Points whose models have equal shapes and whose static hyperparameters are equal
form a group, one compiled program. A group runs in chunks of at most the
planned size (`plan_chunk`: the memory plan's, or the caller's), split as
every front's are (`engine.plan.split`).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from bec_jax.engine.plan import Chunk, Group, split
from bec_jax.engine.protocol import round_chunk
from bec_jax.prediction.sizes import plan_memory
from bec_jax.prediction.spec import SweepSpec

ENV_INDEX = "env_index"  # the grid-chunk entry saying which of a group's models a point uses


def plan_groups(spec: SweepSpec) -> list[Group]:
    """The grid split into groups of equal model shape and static hyperparameters,
    in order of first appearance."""
    models = spec.point_mdps()
    keyed: dict = {}
    for i, key in enumerate(spec.group_keys()):
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
    (see `engine.memory.plan`)."""
    if chunk_size is None:
        return plan_memory(spec, n_devices, memory_budget=memory_budget).grid
    return round_chunk(chunk_size, n_devices)


def plan(spec: SweepSpec, chunk: int) -> tuple[list[Group], list[Chunk]]:
    """The groups and the chunks of at most `chunk` points each, in group order
    (a group smaller than `chunk` runs in one chunk, padded to its bucket size
    but never past `chunk`). The layout
    depends on the spec and `chunk` only; `run_chunks` pads each chunk to a
    multiple of the device count."""
    groups = plan_groups(spec)
    return groups, split(groups, chunk)


def num_chunks(spec: SweepSpec, chunk: int) -> int:
    """How many compiled calls a sweep of `spec` makes with chunks of `chunk` points."""
    return len(plan(spec, chunk)[1])


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


def updates(spec: SweepSpec) -> int:
    """The sweep's work: every grid point's seeds' updates (`engine.tuning.choose_form` weighs it)."""
    return spec.num_points * spec.seeds * spec.steps
