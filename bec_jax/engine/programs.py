"""Programs, the part every front shares: the record of a compiled-on-demand
program (`Program`), jit over the grid (`jit_over_grid`) on a 1-D device mesh
(`grid_mesh`, `segment_mesh`), the programs of a segmented run
(`SegmentPrograms`), and a joint program's outputs cut into its members'
(`split_joint`). A front's program maker (`Engine.make_program`) builds its
programs from these. With several devices the grid axis (or a seed chunk's seed
axis) is split over a 1-D mesh with `shard_map`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from bec_jax.engine.plan import Group

GRID_AXIS = "grid"  # the mesh axis the grid (or a seed chunk's seeds) is split over


@dataclass
class Program:
    """A compiled-on-demand program for one group and a fixed chunk size.

    `fn(seed, grid)` runs `chunk` grid points for the spec's seeds: `seed` the
    base seed (a uint32 scalar), `grid` a dict of (chunk,) arrays (the
    front's `chunk_grid`).
    """

    spec: object
    group: Group
    fn: Callable
    chunk: int
    mesh: Mesh | None


def jit_over_grid(fn: Callable, mesh: Mesh | None) -> Callable:
    """`jit(fn)` for fn(seed, grid inputs) -> outputs with the grid axis first;
    with a mesh, each device runs its share of the grid (`shard_map`)."""
    if mesh is None:
        return jax.jit(fn)
    spec_g = PartitionSpec(GRID_AXIS)
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(PartitionSpec(), spec_g), out_specs=spec_g,
                                 check_vma=False))


def split_joint(out: dict, sizes: list, n_devices: int) -> list[dict]:
    """A joint program's outputs cut into each member's (its `sizes[i]` points,
    grid axis first, in its chunk's order), for a program whose outputs hold,
    per device, the members' shares of that device in order."""
    local = [n // n_devices for n in sizes]
    starts = np.concatenate([[0], np.cumsum(local)])
    parts = [{} for _ in sizes]
    for name, arr in out.items():
        arr = np.asarray(arr)
        by_dev = arr.reshape((n_devices, -1) + arr.shape[1:])
        for m, n in enumerate(sizes):
            parts[m][name] = by_dev[:, starts[m]:starts[m + 1]].reshape((n,) + arr.shape[1:])
    return parts


def grid_mesh(devices, chunk: int) -> Mesh | None:
    """The 1-D mesh over `devices` for chunks of `chunk` points (None on one device)."""
    devices = list(devices) if devices is not None else jax.devices()
    if len(devices) <= 1:
        return None
    if chunk % len(devices):
        raise ValueError(f"chunk: must be a multiple of the {len(devices)} devices, got {chunk}")
    return Mesh(np.array(devices), (GRID_AXIS,))


def segment_mesh(devices, chunk: int, by_seed: bool) -> Mesh | None:
    """The mesh of a segmented chunk's programs: over the seed axis for a seed
    chunk on several devices (any `chunk`), else as `grid_mesh` (over the grid)."""
    devices = list(devices)
    if by_seed and len(devices) > 1:
        return Mesh(np.array(devices), (GRID_AXIS,))
    return grid_mesh(devices, chunk)


class SegmentPrograms(NamedTuple):
    """The programs of a time-segmented or seed-chunked run of one group (a
    front's `Engine.make_segment_programs`); each maps explicit state to state,
    so the carried state can leave the device between calls. Chained over
    every segment and seed chunk they compute exactly what the front's whole-run
    program does; with `per_seed` the reports are per seed, combined on the
    host (`seed_stats.combine_seeds`)."""

    start: Callable            # (seed, grid, offset) -> (carry, first)
    advance: Callable          # (seed, grid, offset, carry, j0) -> (carry, ys); `blocks` log blocks
    finish: Callable           # (seed, grid, offset, carry) -> per-seed finals
    blocks: int
    per_seed: bool
    mesh: Mesh | None
    carry_sharding: Callable   # carry -> its shardings (or None on one device)
