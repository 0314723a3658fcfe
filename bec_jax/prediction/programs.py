"""A prediction sweep's programs: the kernel (`prediction.kernel`) compiled
for a group and a chunk size.

`make_program` chains the kernel over the whole time axis in one call;
`make_joint_program` does the same for several sweeps that differ only in their
algorithm (`engine.programs.split_joint` cuts its outputs apart);
`make_segment_programs` gives the start / advance / finish programs of a run in
time segments or seed chunks; `searched` runs a successive-halving search
(`engine.search`) of the kernel's runs, split at log blocks. With several
devices the grid axis (or a seed chunk's seed axis) is split over a 1-D mesh
with `shard_map`.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bec_jax.engine import search
from bec_jax.engine.plan import Group
from bec_jax.engine.programs import GRID_AXIS, Program, SegmentPrograms, grid_mesh, jit_over_grid, segment_mesh
from bec_jax.engine.seed_stats import alive_count, mean_std_sem
from bec_jax.engine.tuning import KernelForm
from bec_jax.prediction.kernel import Kernel, make_kernel
from bec_jax.prediction.plan import ENV_INDEX
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
    if spec.search is not None:
        # Chunk 1: with several models each point samples its own (`make_kernel`), so a point's sampler
        # state is its own runs' and a batch of any points can run (the same transitions, bit for bit).
        kern = make_kernel(spec, group, 1, form=form, devices=devices)

        def search_program(seed, grid):  # the name XLA's module gets
            return searched(spec, kern, len(group.models), seed, grid)

        return Program(spec=spec, group=group, fn=jax.jit(search_program), chunk=chunk, mesh=None)
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


def _rows(x: jax.Array, N: int) -> jax.Array:
    """(N, b, ...) seed-major (the kernel's layout) -> (b N, ...) runs, point-major (the search's)."""
    return jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])


def _seed_major(x: jax.Array, N: int) -> jax.Array:
    """(b N, ...) runs, point-major -> (N, b, ...), the kernel's layout (`_rows` undone)."""
    return jnp.swapaxes(x.reshape((-1, N) + x.shape[1:]), 0, 1)


def search_stages(spec: SweepSpec, kern: Kernel, models: int, seed, batch: int,
                  start_values: jax.Array) -> search.Stages:
    """This front's `engine.search.Stages`: the kernel's runs (`make_kernel`,
    made for chunks of 1) in batches of `batch` grid points with all their N
    seeds (`Stages.batched`: a batch's transitions are drawn once per seed, as
    in the whole-run program), split at log blocks. A run's row (point-major)
    holds its learner state (the unbatched update counter copied to every
    row: it is every run's), its sampler state (each seed's, copied to each
    point; with several models its point's own), its divergence step and its
    area sums; a batch's rows are turned to the kernel's seed-major layout for
    its blocks and back. Every block's metric values and whether the run is
    still alive (1 or 0) are logged per run ("values" (n, M), "keep" (n,));
    the statistics over seeds are taken from them after the search
    (`searched`). `start_values` (G,): each point's first metric at step 0,
    which its score's area includes; `models`: the group's models."""
    N, dtype = spec.seeds, jnp.dtype(spec.dtype)
    axes = kern.axes[0]
    one_model = models == 1  # the sampler state per seed (N, ...), else per point (b, N, ...)

    def ctx_of(lanes):
        grid = {k: v[::N] for k, v in lanes.items()}  # a batch's points (its rows are point-major)
        return kern.setup(seed, (grid,), spec.seed_offset, N)

    def to_rows(carry):
        (state,), samp, dstep, auc = carry
        b = dstep.shape[0]
        state = jax.tree_util.tree_map(lambda x, ax: jnp.broadcast_to(x, (b * N,) + x.shape) if ax is None
                                       else _rows(x, N), state, axes)
        if one_model:  # (N, ...) per seed -> every point's rows
            samp = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x[None], (b,) + x.shape).reshape(
                (b * N,) + x.shape[1:]), samp)
        else:  # (b, N, ...) per point
            samp = jax.tree_util.tree_map(lambda x: x.reshape((b * N,) + x.shape[2:]), samp)
        return state, samp, dstep.reshape(-1), _rows(jnp.moveaxis(auc, 0, -1), N)

    def from_rows(rows):
        state, samp, dstep, auc = rows
        state = jax.tree_util.tree_map(lambda x, ax: x[0] if ax is None else _seed_major(x, N), state, axes)
        if one_model:  # every batch's first point's rows: its runs are at the batch's block
            samp = jax.tree_util.tree_map(lambda x: x[:N], samp)
        else:
            samp = jax.tree_util.tree_map(lambda x: x.reshape((-1, N) + x.shape[1:]), samp)
        return (state,), samp, dstep.reshape(-1, N), jnp.moveaxis(_seed_major(auc, N), -1, 0)

    def start(lanes):
        carry, _ = kern.start(ctx_of(lanes), True)
        return to_rows(carry)

    def advance(rows, lanes, j0, n: int):
        ctx = ctx_of(lanes)
        carry, (vals, keep) = kern.blocks(ctx, from_rows(rows), j0 + jnp.arange(n, dtype=jnp.int32), True)
        # vals (n, M, b, N), keep (n, b, N) -> per run (b N, n, M) and (b N, n)
        logs = {"values": _rows(jnp.transpose(vals, (3, 2, 0, 1)), N),
                "keep": _rows(jnp.transpose(keep, (2, 1, 0)), N).astype(dtype)}
        return to_rows(carry), logs

    def finish(rows, lanes):
        out = kern.finish(ctx_of(lanes), from_rows(rows))
        # auc_seed (b, M, N) -> (b N, M). The final values are the last block's, logged (`searched`).
        return {"auc_seed": _rows(jnp.transpose(out["auc_seed"], (2, 0, 1)), N)}

    return search.Stages(start=start, advance=advance, finish=finish, score=score(start_values), batch=batch * N,
                         unit=spec.search_unit(), batched=True)


def score(start_values: jax.Array):
    """The search's score hook (`engine.search.Stages.score`): minus each
    point's area under its first metric's mean curve so far (the mean over
    the logged points up to the rung's end, step 0's `start_values` (G,)
    included: the area `SweepResult.auc` takes at the end, the lower the
    better); -inf for a point with a seed that diverged."""

    def fn(logs: dict, valid: jax.Array):
        v = logs["values"][..., 0]  # (G, N, L)
        ok = jnp.where(valid, logs["keep"] == 1, True).all(axis=(1, 2))
        total = jnp.where(valid, v, 0).mean(axis=1).sum(-1)
        auc = (start_values + total) / (valid.sum() + 1).astype(total.dtype)
        return jnp.where(ok, -auc, -jnp.inf)

    return fn


def searched(spec: SweepSpec, kern: Kernel, models: int, seed, grid: dict) -> dict:
    """The spec's search over the points of `grid` (one chunk of every grid
    point): `engine.search.halving` on this front's stages (`search_stages`,
    in batches of the last rung's points) and score; the outputs of the
    whole-run program (mean, std, sem (G, M, L + 1), alive (G, L + 1), final,
    auc_seed (G, M, N), diverged_step (G, N)) with the statistics over seeds
    taken from each run's logged values (`seed_stats`, as the kernel takes
    them: the same bits), NaN (alive -1) where a point did not run and NaN
    finals for the points stopped early; plus "stopped_rung" (G,) and
    "rung_scores" (G, rungs): each point's area under its curve so far at the
    rungs it was ranked at (+inf: a seed diverged; NaN: not ranked there).
    `kern`: made for chunks of 1 (`make_program`); `models`: its group's."""
    N, K, L = spec.seeds, spec.log_every, spec.steps // spec.log_every
    G = grid[ENV_INDEX].shape[0]
    sched = spec.search_schedule()
    _, first = kern.start(kern.setup(seed, (grid,), spec.seed_offset, N), False)  # the step-0 report, (M, G)
    lanes = {k: jnp.repeat(v, N) for k, v in grid.items()}
    stages = search_stages(spec, kern, models, seed, sched.points[-1], first[0][0])
    out = search.halving(stages, lanes, G, N, L, sched)
    keep = out["keep"]  # (G, N, L): 1 alive, 0 not, NaN not run
    alive = jnp.transpose(keep == 1, (2, 0, 1))  # (L, G, N)
    count = alive_count(alive)  # (L, G)
    stats = mean_std_sem(jnp.transpose(out["values"], (3, 2, 0, 1)), alive, count=count)  # (M, L, G) each
    ran = jnp.arange(L)[:, None] < jnp.asarray(sched.ends)[out["stopped_rung"]][None, :]  # (L, G)
    logs = [jnp.concatenate([f[None], jnp.where(ran[None], x, jnp.nan).swapaxes(0, 1)]) for f, x in
            zip(first[:3], stats)]  # (L + 1, M, G)
    dead = keep == 0
    dstep = jnp.where(dead.any(-1), (jnp.argmax(dead, axis=-1).astype(jnp.int32) + 1) * K, -1).astype(jnp.int32)
    # The final values: the last block's, as the kernel's `finish` takes them from the same state (taken
    # again outside the blocks' loop, XLA:CPU may round a model-dependent metric 1 ulp apart); NaN where a
    # seed diverged (the last block's values are the frozen state's) or its point stopped (not run).
    final = jnp.where((dstep >= 0)[:, None, :], jnp.nan, jnp.moveaxis(out["values"][:, :, -1], -1, 1))
    return {"mean": jnp.moveaxis(logs[0], (0, 1, 2), (2, 1, 0)), "std": jnp.moveaxis(logs[1], (0, 1, 2), (2, 1, 0)),
            "sem": jnp.moveaxis(logs[2], (0, 1, 2), (2, 1, 0)),
            "alive": jnp.concatenate([first[3][None], jnp.where(ran, count, -1)]).T.astype(jnp.int32),
            "final": final, "auc_seed": jnp.swapaxes(out["auc_seed"], 1, 2),
            "diverged_step": dstep, "stopped_rung": out["stopped_rung"], "rung_scores": -out["rung_scores"]}


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
