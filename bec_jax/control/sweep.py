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
change nothing it reports. Planning, chunking, resume (`runner.run_to_dir`) and
parts (`--chunks K/N`) are the prediction engine's (`bec_jax.engine.execute.run_chunks`).
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from bec_jax import provenance
from bec_jax.engine import execute
from bec_jax.engine.layout import state_axes
from bec_jax.engine.plan import Chunk, Group
from bec_jax.engine.programs import GRID_AXIS
from bec_jax.engine.streams import per_seed_keys
from bec_jax.sweep import gather
from bec_jax.control import loop
from bec_jax.control.results import ControlResult
from bec_jax.control.spec import ControlSpec
from bec_jax.control.transition import q_values


def bytes_per_point(spec: ControlSpec) -> int:
    """Rough device memory of one grid point: learner states (a few live copies),
    loop states and the episode buffers of all its seeds."""
    item = np.dtype(spec.dtype).itemsize
    d = spec.make_task().num_features
    shapes = jax.eval_shape(spec.algorithm_def.init, jax.ShapeDtypeStruct((d,), jnp.dtype(spec.dtype)))
    floats = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))
    return spec.seeds * (floats * item * 4 + 256 + spec.episodes * (item + 4) * 3)


def plan_chunk(spec: ControlSpec, chunk_size: int | None = None, n_devices: int = 1,
               memory_budget: int = 2 << 30) -> int:
    """Grid points per compiled call: `chunk_size` rounded up to a multiple of the
    device count, or by default all that fit in `memory_budget` bytes."""
    if chunk_size is None:
        fit = max(1, memory_budget // bytes_per_point(spec))
        return -(-min(spec.num_points, fit) // n_devices) * n_devices
    if not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool) or chunk_size <= 0:
        raise ValueError(f"chunk_size: must be a positive integer, got {chunk_size!r}")
    return -(-int(chunk_size) // n_devices) * n_devices


def plan(spec: ControlSpec, chunk: int):
    """(groups, chunks) as `bec_jax.sweep.plan` gives them: one group (every
    point has the same shapes), chunks of at most `chunk` points."""
    G = spec.num_points
    group = Group(np.arange(G), [], np.zeros(G, np.int32), ())
    size = min(chunk, G)
    chunks = []
    for start in range(0, G, size):
        stop = min(start + size, G)
        chunks.append(Chunk(0, np.minimum(np.arange(start, start + size), stop - 1), stop - start))
    return [group], chunks


def num_chunks(spec: ControlSpec, chunk: int) -> int:
    """How many compiled calls a sweep of `spec` makes with chunks of `chunk` points."""
    return -(-spec.num_points // min(chunk, spec.num_points))


def chunk_grid(spec: ControlSpec, group, chunk) -> dict:
    """The program's grid input for one chunk: (chunk,) arrays of the hyperparameters."""
    columns = spec.grid_arrays()
    idx = group.indices[chunk.indices]
    return {n: columns[n][idx].astype(spec.dtype) for n in spec.names}


def _run_ok(learner, ls, axes, weights: str, bound: float) -> jax.Array:
    """(G, N) True where the run looks bounded: its scalar state (omega) and the
    action values of its current state, under every weight-like vector of the
    learner (w, and u where there is one), are finite and within the bound.
    Divergence of linear TD methods shows in the values they bootstrap from; an
    O(A m) check per block keeps the cost independent of the number of features
    (a full scan of 234,375 Acrobot weights per block cost more than the steps)."""
    ok = None
    leaves = jax.tree_util.tree_leaves(learner)
    ax = jax.tree_util.tree_leaves(axes, is_leaf=lambda a: a is None)
    for x, a in zip(leaves, ax):
        if a is None or not jnp.issubdtype(x.dtype, jnp.floating):
            continue
        if x.ndim == 2:  # a scalar per run
            v = jnp.abs(x)
        else:  # a (G, N, d) vector: its values at the current state's features
            v = jnp.abs(jax.vmap(jax.vmap(q_values))(x, ls.active)).max(axis=-1)
        leaf = v <= bound  # NaN fails the comparison
        ok = leaf if ok is None else ok & leaf
    return ok


@dataclass
class Program:
    """`fn(seed, grid)` runs `chunk` grid points for the spec's seeds."""

    spec: ControlSpec
    group: object
    fn: Callable
    chunk: int
    mesh: Mesh | None


def make_program(spec: ControlSpec, group=None, chunk: int = 1, devices=None, on_block=None,
                 keep_state: bool = False, form=None) -> Program:
    """The program for chunks of `chunk` grid points (`on_block` and `form` are
    accepted for the engine's interface and ignored: a control chunk reports when
    it ends, and runs its own loop).
    With `keep_state` it also returns the final learner states ("state": a
    pytree of (chunk, seeds, ...) arrays)."""
    alg = spec.algorithm_def
    task = spec.make_task()
    dtype = jnp.dtype(spec.dtype)
    behaviour = loop.Behaviour(spec.epsilon, spec.epsilon_decay, spec.epsilon_min)
    cap, gamma, E, K = spec.episode_cap, spec.discount, spec.episodes, spec.block
    max_blocks = -(-spec.total_steps // K)
    bound = spec.divergence_bound
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

    def program(seed, grid):
        names = spec.names
        G, N = grid[names[0]].shape[0], spec.seeds
        hp = {n: grid[n].astype(dtype) for n in names}
        keys = per_seed_keys(seed, N)
        init_keys, stream_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
        ls = jax.vmap(lambda k: loop.loop_init(task, k, dtype))(init_keys)
        ls = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (G,) + x.shape), ls)
        st0 = alg.init(jnp.zeros((d,), dtype))
        learner = jax.tree_util.tree_map(
            lambda x, a: x if a is None else jnp.broadcast_to(x, (G, N) + x.shape), st0, axes)
        log = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (G, N) + x.shape), loop.log_init(E, dtype))
        dstep = jnp.full((G, N), -1, jnp.int32)

        def block(carry):
            j, learner, ls, log, dstep = carry

            def one(c, i):
                t = j * K + i
                keys_t = jax.vmap(lambda k: jax.random.fold_in(k, t))(stream_keys)
                return step_all(c, keys_t, hp), None

            (nl, nls, nlog), _ = jax.lax.scan(one, (learner, ls, log), jnp.arange(K, dtype=jnp.int32))
            alive = dstep < 0
            # A run that left the bound during the block goes back to the block's
            # start and stays there, flagged with the block's last step. The
            # select over every state runs only when some run needs it.
            keep = alive & _run_ok(nl, nls, axes, alg.weights, bound)

            def revert(_):
                sel = lambda n, o: jnp.where(keep.reshape(keep.shape + (1,) * (n.ndim - 2)), n, o)
                return (jax.tree_util.tree_map(lambda n, o, a: n if a is None else sel(n, o), nl, learner, axes),
                        jax.tree_util.tree_map(sel, nls, ls), jax.tree_util.tree_map(sel, nlog, log))

            learner, ls, log = jax.lax.cond(jnp.any(keep != alive), revert, lambda _: (nl, nls, nlog), None)
            dstep = jnp.where(alive & ~keep, (j + 1) * K, dstep)
            return j + 1, learner, ls, log, dstep

        def more(carry):
            j, _, ls, _, dstep = carry
            return (j < max_blocks) & jnp.any((dstep < 0) & (ls.episodes < E))

        _, learner, ls, log, dstep = jax.lax.while_loop(more, block, (jnp.int32(0), learner, ls, log, dstep))
        out = {"returns": log.returns, "lengths": log.lengths, "diverged_step": dstep}
        if keep_state:
            out["state"] = learner
        for name in ("omega", "rbar"):
            if hasattr(learner, name):
                out["omega"] = getattr(learner, name)
        return out

    devices = list(devices) if devices is not None else jax.devices()
    mesh = None
    if len(devices) > 1:
        if chunk % len(devices):
            raise ValueError(f"chunk: must be a multiple of the {len(devices)} devices, got {chunk}")
        mesh = Mesh(np.array(devices), (GRID_AXIS,))
        spec_g = PartitionSpec(GRID_AXIS)
        fn = jax.jit(jax.shard_map(program, mesh=mesh, in_specs=(PartitionSpec(), spec_g),
                                   out_specs=spec_g, check_vma=False))
    else:
        fn = jax.jit(program)
    return Program(spec=spec, group=group, fn=fn, chunk=chunk, mesh=mesh)


def assemble(spec: ControlSpec, groups, chunks, results: dict, meta: dict | None = None) -> ControlResult:
    """The `ControlResult` in grid order from every chunk's outputs."""
    cat = gather(spec.num_points, groups, chunks, results)
    return ControlResult(spec=spec, grid=spec.grid_arrays(), returns=cat["returns"], lengths=cat["lengths"],
                         diverged_step=cat["diverged_step"], omega=cat.get("omega"), meta=dict(meta or {}))


def run(spec: ControlSpec, *, chunk_size: int | None = None, devices=None, memory_budget: int = 2 << 30,
        progress: bool | None = None, compiler_options: dict | None = None,
        on_chunk: Callable[[int, dict], None] | None = None,
        done_chunks: dict[int, dict] | None = None) -> ControlResult:
    """Runs the control sweep and returns a `ControlResult` (arguments as
    `bec_jax.sweep.run`: chunk_size, devices, memory_budget, progress,
    compiler_options, on_chunk, done_chunks)."""
    if spec.dtype == "float64" and not jax.config.jax_enable_x64:
        raise ValueError("dtype: float64 needs JAX's 64-bit mode; set JAX_ENABLE_X64=1 "
                         "or jax.config.update('jax_enable_x64', True) before running")
    devices = list(devices) if devices is not None else jax.devices()
    chunk = plan_chunk(spec, chunk_size, len(devices), memory_budget)
    groups, chunks = plan(spec, chunk)
    ran = execute.run_chunks(spec, groups, chunks, devices, done=done_chunks, compiler_options=compiler_options,
                             on_chunk=on_chunk, progress=progress,
                             engine=sys.modules[__name__])
    steps = int(sum(int(r["lengths"].sum()) for r in ran.results.values()))
    meta = {
        **provenance.collect(devices),
        "chunk_size": chunk,
        "num_chunks": len(chunks),
        "compiled_programs": ran.programs,
        "resumed_chunks": len(done_chunks or {}),
        "compile_time_s": ran.compile_time_s,
        "run_time_s": ran.run_time_s,
        "logged_steps": steps,
        "steps_per_s": steps / ran.run_time_s if ran.run_time_s > 0 and not done_chunks else None,
    }
    return assemble(spec, groups, chunks, ran.results, meta)


def run_chunks(spec: ControlSpec, groups, chunks, devices, **kwargs):
    """`bec_jax.engine.execute.run_chunks` with this module's programs (for `--chunks K/N` parts)."""
    return execute.run_chunks(spec, groups, chunks, devices, engine=sys.modules[__name__], **kwargs)


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
