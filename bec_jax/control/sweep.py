"""The control sweep: every (grid point, seed) run of a control spec as one
compiled XLA program per chunk of the grid.

    program(seed, grid) = jit(shard_map_over_grid(
        while some live run has fewer than `episodes` episodes (and steps remain):
            scan over `block` steps (
                every (grid point, seed) run: epsilon-greedy act, task step,
                update, log a finished episode, reset)   # vmap(grid) o vmap(seed)
            freeze runs whose weights left the bound)))

The loop is `bec_jax.control.loop` (one run), batched here. A run's randomness
is fold_in(its seed's stream key, step), so its episodes do not depend on the
other runs, the chunk size or the device count: the while loop may run a chunk
longer than one of its runs needs, but steps after a run's last logged episode
change nothing it reports.

This module is the control front of the engine (`bec_jax.engine.protocol.Engine`):
the memory plan (`memory.plan` with this front's `sizes`), the chunks
(`engine.plan.split`), the program record and jit over the grid
(`engine.programs`), the chunk loop with resume and parts
(`engine.execute.run_chunks`), the divergence check and revert
(`engine.divergence`), the float64 guard, `gather` and the meta record
(`engine.protocol`) are the engine's. It has no time segments or seed chunks:
a chunk runs every seed of its points in one call.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax import memory, threefry
from bec_jax.engine import divergence, execute
from bec_jax.engine.layout import state_axes
from bec_jax.engine.plan import Group, split
from bec_jax.engine.programs import Program, jit_over_grid, segment_mesh
from bec_jax.engine.protocol import check_dtype, gather, round_chunk, run_meta
from bec_jax.engine.streams import per_seed_keys
from bec_jax.control import loop
from bec_jax.control.results import ControlResult
from bec_jax.control.spec import ControlSpec
from bec_jax.control.transition import q_values

KIND = "control"
SEGMENTS = False        # a chunk runs every seed of its points in one call
BLOCK_PROGRESS = False  # a chunk reports when it ends
STATE_COPIES = 4        # live copies of the learner state in a block (the scan's, the revert's)
LOOP_BYTES = 256        # a run's loop state (task state, features, counters) and keys


def sizes(spec: ControlSpec) -> memory.Sizes:
    """This front's terms of the memory plan (`memory.Sizes`): per run, the
    learner state (a few live copies), the loop state and the episode log (the
    scan's and the revert's copies); as finals, the returns, lengths, divergence
    step and omega. No log blocks, and nothing carried between calls (so the
    prediction kernel's CPU cache rule does not apply). Calibrated as the
    prediction terms are: a call's estimate is between 1 and 3 times what XLA
    allocates (tests/test_engine_protocol.py)."""
    item = np.dtype(spec.dtype).itemsize
    d = spec.make_task().num_features
    alg = spec.algorithm_def
    shapes = jax.eval_shape(alg.init, jax.ShapeDtypeStruct((d,), jnp.dtype(spec.dtype)))
    axes = jax.tree_util.tree_leaves(state_axes(shapes, alg.counter), is_leaf=lambda a: a is None)
    state = sum(int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
                for leaf, ax in zip(jax.tree_util.tree_leaves(shapes), axes) if ax is not None)
    log = spec.episodes * (item + 4)
    return memory.Sizes(item=item, metrics=0, state=state, per_run=STATE_COPIES * state + LOOP_BYTES + 2 * log,
                        per_seed=32, report_stats=0, report_seed=0, finals=log + 4 + item, carry=0,
                        log_points=1, block_steps=spec.block)


def plan_memory(spec: ControlSpec, n_devices: int = 1, **kwargs) -> memory.Plan:
    """`memory.plan` with this front's `sizes` (kwargs as its); refuses a plan
    in seed chunks, which this front does not run."""
    pl = memory.plan(spec, n_devices, sz=sizes(spec), **kwargs)
    if pl.segmented:
        raise memory.TooLarge(f"memory_budget: one grid point's {spec.seeds} seeds need about "
                              f"{memory.human(memory.call_bytes(sizes(spec), 1, spec.seeds, 1, False))} of device "
                              f"memory; the budget is {memory.human(pl.budget)}; raise --memory-budget or use "
                              "fewer seeds (a control sweep runs every seed of a point in one call)")
    return pl


def plan_chunk(spec: ControlSpec, chunk_size: int | None = None, n_devices: int = 1,
               memory_budget: int | None = None) -> int:
    """Grid points per compiled call: `chunk_size` rounded up to a multiple of the
    device count, or by default all that fit the memory plan."""
    if chunk_size is None:
        return plan_memory(spec, n_devices, memory_budget=memory_budget).grid
    return round_chunk(chunk_size, n_devices)


def plan(spec: ControlSpec, chunk: int):
    """(groups, chunks) as `bec_jax.sweep.plan` gives them: one group (every
    point has the same shapes), chunks of at most `chunk` points."""
    G = spec.num_points
    groups = [Group(np.arange(G), [], np.zeros(G, np.int32), ())]
    return groups, split(groups, chunk)


def num_chunks(spec: ControlSpec, chunk: int) -> int:
    """How many compiled calls a sweep of `spec` makes with chunks of `chunk` points."""
    return len(plan(spec, chunk)[1])


def fingerprints(spec: ControlSpec) -> list[str]:
    """What a resume checks beyond the spec: nothing (a task is code, named in the spec)."""
    return []


def updates(spec: ControlSpec) -> None:
    """None: control programs always take the light compile (`tuning.choose_form`),
    with which they run as fast."""
    return None


def chunk_grid(spec: ControlSpec, group, chunk) -> dict:
    """The program's grid input for one chunk: (chunk,) arrays of the hyperparameters."""
    columns = spec.grid_arrays()
    idx = group.indices[chunk.indices]
    return {n: columns[n][idx].astype(spec.dtype) for n in spec.names}


def _run_ok(learner, ls, axes, bound: float) -> jax.Array:
    """(G, N) True where the run looks bounded (`engine.divergence.run_ok`): its
    scalar state (omega) and the action values of its current state, under every
    weight-like vector of the learner (w, and u where there is one), are finite
    and within the bound. Divergence of linear TD methods shows in the values
    they bootstrap from; an O(A m) check per block keeps the cost independent of
    the number of features (a full scan of 234,375 Acrobot weights per block
    cost more than the steps)."""
    return divergence.run_ok(learner, bound, axes, view=lambda x: jax.vmap(jax.vmap(q_values))(x, ls.active))


class _Context(NamedTuple):
    """What a control program is made of, fixed before tracing."""

    spec: ControlSpec
    alg: object
    task: object
    dtype: object
    d: int
    axes: object
    step_all: Callable
    max_blocks: int


def _context(spec: ControlSpec) -> _Context:
    """The program's pieces: the task, the algorithm, its state's batch axes and
    one step of every (grid point, seed) run with the resets of finished episodes."""
    alg = spec.algorithm_def
    task = spec.make_task()
    dtype = jnp.dtype(spec.dtype)
    behaviour = loop.Behaviour(spec.epsilon, spec.epsilon_decay, spec.epsilon_min)
    cap, gamma = spec.episode_cap, spec.discount
    d = task.num_features
    template = jax.eval_shape(alg.init, jax.ShapeDtypeStruct((d,), dtype))
    if not hasattr(template, alg.weights):
        raise ValueError(f"algorithm: {alg.name} declares weights {alg.weights!r}, but its state has no such field")
    axes = state_axes(template, alg.counter)

    def run_step(learner, ls, log, key, hp):
        return loop.advance(task, lambda st, tr: alg.apply(st, tr, hp), lambda st: getattr(st, alg.weights),
                            behaviour, cap, gamma, learner, ls, log, key, spec.reward_shift)

    over_seeds = jax.vmap(run_step, in_axes=(axes, 0, 0, 0, None), out_axes=(axes, 0, 0, 0))
    over_grid = jax.vmap(over_seeds, in_axes=(axes, 0, 0, None, 0), out_axes=(axes, 0, 0, 0))
    reset_grid = jax.vmap(jax.vmap(lambda ls, done, key: loop.reset_done(task, ls, done, key)),
                          in_axes=(0, 0, None))

    def step_all(c, keys_t, hp):
        # Resets (a task's reset and its features) are computed only on steps
        # where some run's episode ended: `loop.step`, with the reset skipped
        # when nothing would use it.
        learner, ls, log, done = over_grid(*c, keys_t, hp)
        ls = jax.lax.cond(jnp.any(done), lambda: reset_grid(ls, done, keys_t), lambda: ls)
        return learner, ls, log

    return _Context(spec, alg, task, dtype, d, axes, step_all, -(-spec.total_steps // spec.block))


def _block(ctx: _Context, hp: dict, stream_keys, carry):
    """One block of `spec.block` steps of every run; a run that left the bound
    during the block goes back to the block's start and stays there, flagged
    with the block's last step (the select over every state runs only when
    some run needs it)."""
    K, axes = ctx.spec.block, ctx.axes
    j, learner, ls, log, dstep = carry

    def one(c, i):
        t = j * K + i
        keys_t = threefry.fold_in(stream_keys, t)
        return ctx.step_all(c, keys_t, hp), None

    (nl, nls, nlog), _ = jax.lax.scan(one, (learner, ls, log), jnp.arange(K, dtype=jnp.int32))
    alive = dstep < 0
    keep = alive & _run_ok(nl, nls, axes, ctx.spec.divergence_bound)

    # The log is not reverted (keeping its block-start copy for a revert cost a
    # copy of every run's whole log per block): a reverted run's episode count
    # goes back, and `_runs` clears the entries past it at the end.
    def revert(_):
        return divergence.revert(keep, nl, learner, axes), divergence.revert(keep, nls, ls)

    learner, ls = jax.lax.cond(jnp.any(keep != alive), revert, lambda _: (nl, nls), None)
    dstep = divergence.flag(dstep, alive, keep, (j + 1) * K)
    return j + 1, learner, ls, nlog, dstep


def _runs(ctx: _Context, keep_state: bool, seed, grid) -> dict:
    """Every (grid point, seed) run of a chunk, block by block while some live
    run has fewer than `episodes` episodes (and steps remain)."""
    spec, task, dtype, d, alg = ctx.spec, ctx.task, ctx.dtype, ctx.d, ctx.alg
    E = spec.episodes
    names = spec.names
    G, N = grid[names[0]].shape[0], spec.seeds
    hp = {n: grid[n].astype(dtype) for n in names}
    keys = per_seed_keys(seed, N)
    init_keys, stream_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
    ls = jax.vmap(lambda k: loop.loop_init(task, k, dtype))(init_keys)
    ls = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (G,) + x.shape), ls)
    st0 = alg.init(jnp.zeros((d,), dtype))
    learner = jax.tree_util.tree_map(
        lambda x, a: x if a is None else jnp.broadcast_to(x, (G, N) + x.shape), st0, ctx.axes)
    log = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (G, N) + x.shape), loop.log_init(E, dtype))
    dstep = jnp.full((G, N), -1, jnp.int32)

    def more(carry):
        j, _, ls, _, dstep = carry
        return (j < ctx.max_blocks) & jnp.any((dstep < 0) & (ls.episodes < E))

    _, learner, ls, log, dstep = jax.lax.while_loop(more, partial(_block, ctx, hp, stream_keys),
                                                    (jnp.int32(0), learner, ls, log, dstep))
    logged = jax.lax.broadcasted_iota(jnp.int32, log.lengths.shape, log.lengths.ndim - 1) < ls.episodes[..., None]
    # (entries a revert left behind are cleared)
    out = {"returns": jnp.where(logged, log.returns, 0), "lengths": jnp.where(logged, log.lengths, 0),
           "diverged_step": dstep}
    if keep_state:
        out["state"] = learner
    for name in ("omega", "rbar"):
        if hasattr(learner, name):
            out["omega"] = getattr(learner, name)
    return out


def make_program(spec: ControlSpec, group=None, chunk: int = 1, devices=None, on_block=None,
                 keep_state: bool = False, form=None) -> Program:
    """The program (`engine.programs.Program`) for chunks of `chunk` grid points,
    jitted over the grid as every front's (`programs.jit_over_grid`). `on_block`
    and `form` are accepted for the engine's interface and ignored: a control
    chunk reports when it ends, and runs its own loop.
    With `keep_state` it also returns the final learner states ("state": a
    pytree of (chunk, seeds, ...) arrays)."""
    ctx = _context(spec)

    def program(seed, grid):  # the name XLA's module gets
        return _runs(ctx, keep_state, seed, grid)

    devices = list(devices) if devices is not None else jax.devices()
    mesh = segment_mesh(devices, chunk, False)  # the grid over the devices (None on one)
    return Program(spec=spec, group=group, fn=jit_over_grid(program, mesh), chunk=chunk, mesh=mesh)


def assemble(spec: ControlSpec, groups, chunks, results: dict, meta: dict | None = None) -> ControlResult:
    """The `ControlResult` in grid order from every chunk's outputs."""
    cat = gather(spec.num_points, groups, chunks, results)
    return ControlResult(spec=spec, grid=spec.grid_arrays(), returns=cat["returns"], lengths=cat["lengths"],
                         diverged_step=cat["diverged_step"], omega=cat.get("omega"), meta=dict(meta or {}))


def run(spec: ControlSpec, *, chunk_size: int | None = None, devices=None, memory_budget: int | None = None,
        progress: bool | None = None, compiler_options: dict | None = None,
        on_chunk: Callable[[int, dict], None] | None = None,
        done_chunks: dict[int, dict] | None = None, memory_plan: memory.Plan | None = None,
        out: str | None = None, outputs=None, on_segment: Callable | None = None,
        alloc: Callable | None = None) -> ControlResult:
    """Runs the control sweep and returns a `ControlResult` (arguments as
    `bec_jax.sweep.run`: chunk_size, devices, memory_budget, progress,
    compiler_options, on_chunk, done_chunks, memory_plan, out). `outputs`,
    `on_segment` and `alloc` are the interface's and unused: a control chunk
    runs in one call, and its logs are small."""
    check_dtype(spec)
    devices = list(devices) if devices is not None else jax.devices()
    if chunk_size is not None:
        chunk_size = plan_chunk(spec, chunk_size, len(devices))
    pl = memory_plan or plan_memory(spec, len(devices), memory_budget=memory_budget, chunk_size=chunk_size,
                                    device=devices[0], out=out)
    groups, chunks = plan(spec, pl.grid)
    ran = run_chunks(spec, groups, chunks, devices, done=done_chunks, compiler_options=compiler_options,
                     on_chunk=on_chunk, progress=progress)
    steps = int(sum(int(r["lengths"].sum()) for r in ran.results.values()))
    meta = run_meta(devices, pl.grid, len(chunks), ran, len(done_chunks or {}), work={
        "logged_steps": steps,
        "steps_per_s": steps / ran.run_time_s if ran.run_time_s > 0 and not done_chunks else None})
    return assemble(spec, groups, chunks, ran.results, meta)


run_chunks = execute.run_chunks  # with the programs of the spec's front: this module's


def final_states(spec: ControlSpec):
    """(result, states): the sweep's `ControlResult` and every run's final
    learner state (a NamedTuple of (G, N, ...) arrays; the update counter is
    shared, shape ()). One chunk, no resume: meant for small sweeps whose
    learned weights you want to inspect (a greedy policy, say)."""
    chunk = spec.num_points
    groups, chunks = plan(spec, chunk)
    prog = make_program(spec, groups[0], chunk, jax.devices()[:1], keep_state=True)
    out = jax.device_get(prog.fn(np.uint32(spec.seed), chunk_grid(spec, groups[0], chunks[0])))
    state = out.pop("state")
    return assemble(spec, groups, chunks, {0: out}), state
