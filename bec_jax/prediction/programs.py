"""A prediction sweep's programs: the kernel (`prediction.kernel`) compiled
for a group and a chunk size.

`make_program` chains the kernel over the whole time axis in one call;
`make_joint_program` does the same for several sweeps that differ only in their
algorithm (`engine.programs.split_joint` cuts its outputs apart);
`make_segment_programs` gives the start / advance / finish programs of a run in
time segments or seed chunks. With several devices the grid axis (or a seed
chunk's seed axis) is split over a 1-D mesh with `shard_map`.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bec_jax.engine.plan import Group
from bec_jax.engine.programs import GRID_AXIS, Program, SegmentPrograms, grid_mesh, jit_over_grid, segment_mesh
from bec_jax.engine.tuning import KernelForm
from bec_jax.prediction.kernel import Kernel, make_kernel
from bec_jax.prediction.spec import SweepSpec


def make_program(spec: SweepSpec, group: Group, chunk: int, devices=None,
                 form: KernelForm | None = None) -> Program:
    """Python-side setup for one group of `spec`: the models' sampler tables and
    metrics are baked in, and the returned program maps (base seed, grid chunk)
    -> statistics, over every seed and the whole time axis in one call.

    With several devices, the grid axis of the chunk is split over them with
    `shard_map` on a 1-D `Mesh`; `chunk` must be a multiple of the device count.
    The program holds no host callback: progress is the host's, between calls.
    `form`: the program's performance choices (`tuning.KernelForm`; default
    `tuning.choose_form`'s for a sweep of `spec`); the same results under each.
    """
    kern = make_kernel(spec, group, chunk, form=form, devices=devices)
    whole = _whole_run(spec, kern)

    def sweep_program(seed, grid):  # the name XLA's module gets (tests count compiles by it)
        return whole(seed, (grid,))

    mesh = grid_mesh(devices, chunk)
    return Program(spec=spec, group=group, fn=jit_over_grid(sweep_program, mesh), chunk=chunk, mesh=mesh)


def _whole_run(spec: SweepSpec, kern: Kernel) -> Callable:
    """(seed, grids) -> every output of a whole run: the kernel's pieces chained
    over the whole time axis, the grid axis first."""
    L = spec.steps // spec.log_every

    def whole(seed, grids):
        ctx = kern.setup(seed, grids, spec.seed_offset, spec.seeds)
        carry, first = kern.start(ctx, False)
        carry, ys = kern.blocks(ctx, carry, jnp.arange(L, dtype=jnp.int32), False)
        # Stack step 0 in front; move the grid axis first: (M, L+1, G) -> (G, M, L+1).
        mean, std, sem = (jnp.moveaxis(jnp.concatenate([a[None], b]), (0, 1, 2), (2, 1, 0))
                          for a, b in zip(first[:3], ys[:3]))
        alive_t = jnp.concatenate([first[3][None], ys[3]]).T  # (G, L+1)
        return {"mean": mean, "std": std, "sem": sem, "alive": alive_t, **kern.finish(ctx, carry)}

    return whole


def make_joint_program(members: list, devices=None, form: KernelForm | None = None) -> Program:
    """One program for several sweeps that differ only in their algorithm and its
    hyperparameters (same models, seeds, steps, sampler, metrics, schedule):
    `members` is a list of (spec, group, size), their groups of the same models
    in the same order (one or several), each size (the member's padded points)
    a multiple of the device count. The transitions are drawn once per seed for
    all of them (they are the same transitions each sweep draws alone), and the
    sweeps' points are laid end to end for the metrics and statistics; each
    point's arithmetic is its own.

    `fn(seed, grids)` takes one grid chunk per member and returns the outputs of
    every member's points, grid axis first: per device (with a mesh) the
    members' shares of that device in order; `split_joint` cuts them apart.
    `form`: as `make_program`'s."""
    (spec, group, _), others = members[0], members[1:]
    sizes = [size for *_, size in members]
    kern = make_kernel(spec, group, sum(sizes), others=tuple((s, g) for s, g, _ in others), form=form,
                       devices=devices)
    whole = _whole_run(spec, kern)
    mesh = grid_mesh(devices, int(np.gcd.reduce(sizes)))  # every member's size a multiple of the devices
    return Program(spec=spec, group=group, fn=jit_over_grid(whole, mesh), chunk=sum(sizes), mesh=mesh)


def make_segment_programs(spec: SweepSpec, group: Group, chunk: int, seeds: int, blocks: int,
                          devices=None, form: KernelForm | None = None) -> SegmentPrograms:
    """The three programs of a segmented run of one group: `start` (the initial
    carry and the step-0 report), `advance` (`blocks` log blocks from block j0 on)
    and `finish` (the per-seed finals), for `chunk` grid points and `seeds`
    seeds from seed index `offset` (relative to the spec's seed_offset). With
    `seeds < spec.seeds` (a seed chunk) the reports are per seed (`per_seed`):
    the host combines the seed chunks with `seed_stats.combine_seeds`. Chained over every
    segment and seed chunk they compute exactly what `make_program` does.

    With several devices the grid axis is split over them; in a seed chunk,
    which has no statistic over seeds inside, the seed axis is (`seeds` must
    then be a multiple of the device count, `chunk` need not be). `form`: as
    `make_program`'s."""
    devices = list(devices) if devices is not None else jax.devices()
    per_seed = seeds < spec.seeds
    n_dev = len(devices)
    by_seed = per_seed and n_dev > 1
    if by_seed and seeds % n_dev:
        raise ValueError(f"seeds: a seed chunk must be a multiple of the {n_dev} devices, got {seeds}")
    kern = make_kernel(spec, group, chunk, form=form, devices=devices)
    local = seeds // n_dev if by_seed else seeds

    def ctx_of(seed, grid, offset):
        if by_seed:  # this device's share of the seed chunk
            offset = offset + jax.lax.axis_index(GRID_AXIS).astype(offset.dtype) * local
        return kern.setup(seed, (grid,), spec.seed_offset + offset, local)

    def start(seed, grid, offset):
        return kern.start(ctx_of(seed, grid, offset), per_seed)

    def advance(seed, grid, offset, carry, j0):
        return kern.blocks(ctx_of(seed, grid, offset), carry, j0 + jnp.arange(blocks, dtype=jnp.int32), per_seed)

    def finish(seed, grid, offset, carry):
        return kern.finish(ctx_of(seed, grid, offset), carry)

    mesh = segment_mesh(devices, chunk, by_seed)
    if mesh is None:
        return SegmentPrograms(jax.jit(start), jax.jit(advance), jax.jit(finish),
                               blocks, per_seed, None, lambda carry: None)
    P, g = PartitionSpec, GRID_AXIS
    E = len(group.models)
    # carry = (states (N, G, ...), sampler states ((N,) with one model, (E or G, N)
    # with several), diverged step (G, N), area sums (M, N, G)).
    if by_seed:
        state_spec = jax.tree_util.tree_map(lambda ax: P() if ax is None else P(g), kern.axes,
                                            is_leaf=lambda a: a is None)
        carry_spec = (state_spec, P(g) if E == 1 else P(None, g), P(None, g), P(None, g))
        first_spec, ys_spec = (P(None, None, g), P(None, g)), (P(None, None, None, g), P(None, None, g))
        fin_spec = {"final": P(None, None, g), "auc_seed": P(None, None, g), "diverged_step": P(None, g)}
        grid_spec = P()
    else:
        state_spec = jax.tree_util.tree_map(lambda ax: P() if ax is None else P(None, g), kern.axes,
                                            is_leaf=lambda a: a is None)
        samp_spec = P() if E == 1 or 1 < E <= chunk else P(g)
        carry_spec = (state_spec, samp_spec, P(g), P(None, None, g))
        if per_seed:
            first_spec, ys_spec = (P(None, g), P(g)), (P(None, None, g), P(None, g))
        else:
            first_spec = (P(None, g),) * 3 + (P(g),)
            ys_spec = (P(None, None, g),) * 3 + (P(None, g),)
        fin_spec = {"final": P(g), "auc_seed": P(g), "diverged_step": P(g)}
        grid_spec = P(g)
    sm = partial(jax.shard_map, mesh=mesh, check_vma=False)
    start_fn = jax.jit(sm(start, in_specs=(P(), grid_spec, P()), out_specs=(carry_spec, first_spec)))
    advance_fn = jax.jit(sm(advance, in_specs=(P(), grid_spec, P(), carry_spec, P()),
                            out_specs=(carry_spec, ys_spec)))
    finish_fn = jax.jit(sm(finish, in_specs=(P(), grid_spec, P(), carry_spec), out_specs=fin_spec))

    def carry_sharding(carry):
        return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), carry_spec,
                                      is_leaf=lambda s: isinstance(s, PartitionSpec))

    return SegmentPrograms(start_fn, advance_fn, finish_fn, blocks, per_seed, mesh, carry_sharding)
