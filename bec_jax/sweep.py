"""The sweep engine: a whole step-size sweep as one compiled XLA program.

    program(seed_keys, grid) = jit(shard_map_over_grid(
        scan over log points (
            scan over log_every steps (
                sample one transition per seed           # common random numbers
                update every (grid point, seed) pair     # vmap(grid) o vmap(seed)
                freeze runs that diverge)
            metrics of every run -> mean/std/sem over surviving seeds)))

Each seed's transitions are drawn once and broadcast to every grid point, so all
grid points see the same data. A seed's random stream depends only on the base
seed and its index, and a grid point's arithmetic only on its own step sizes, so a
point's result does not depend on the other points in the grid, the chunk size or
the number of devices. Memory is O(grid x seeds x state) inside the program and
O(grid x log points) out of it: no per-step parameters are kept.
"""
from __future__ import annotations

import platform
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import bec_jax
from bec_jax import algorithms, analysis, envs, sampling
from bec_jax.algorithms.base import StepSizes
from bec_jax.schedules import robbins_monro
from bec_jax.results import SweepResult
from bec_jax.spec import STEP_NAMES, ScheduleSpec, SweepSpec

GRID_AXIS = "grid"

# Steps per iteration of the inner scan. Unrolling amortises the while loop's
# per-iteration copies of the carried state (2 doubled TD's speed in isolation),
# but lets XLA fuse across steps and duplicate the TD error's computation into
# every consumer, which for CTDC grows exponentially with the unroll (3 steps ran
# 10x slower). On the standard workload 1 beats 2 (164 vs 155 M updates/s).
UNROLL = 1


def _step_size_factors(schedule: ScheduleSpec, t: jax.Array, dtype) -> StepSizes:
    """Robbins-Monro multipliers of the grid's step sizes at step t (shared by all
    runs): `schedules.robbins_monro` with initial value 1."""
    t = t.astype(dtype)
    return StepSizes(*(robbins_monro(1.0, schedule.t0, getattr(schedule, f"p_{n}"))(t).astype(dtype)
                       for n in STEP_NAMES))


def _run_ok(state, bound: float) -> jax.Array:
    """(G, N) True where every float leaf of the state is finite and within the bound
    (NaN fails the comparison, so it counts as diverged). The max over a leaf's
    feature axis is unrolled: a minor-axis reduction is slow on CPU (see
    `algorithms.base.vdot`)."""
    ok = None
    for x in jax.tree_util.tree_leaves(state):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            continue
        x = jnp.abs(x.reshape(x.shape[:2] + (-1,)))
        m = x[..., 0]
        for i in range(1, x.shape[-1]):
            m = jnp.maximum(m, x[..., i])
        leaf_ok = m <= bound
        ok = leaf_ok if ok is None else ok & leaf_ok
    return ok


def _bcast(mask: jax.Array, x: jax.Array) -> jax.Array:
    return mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))


def _tree_sum(x: jax.Array) -> jax.Array:
    """Sum over the last axis by pairwise halving (zero-padded to a power of two).

    Only elementwise adds, in an order fixed by the axis length alone: XLA's reduce
    may sum in an order that depends on the rest of the batch shape, which would
    make a grid point's statistics depend on the chunk size in the last bit."""
    n = x.shape[-1]
    width = 1 << max(0, (n - 1).bit_length())
    if width != n:
        x = jnp.concatenate([x, jnp.zeros(x.shape[:-1] + (width - n,), x.dtype)], axis=-1)
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def _seed_stats(values: jax.Array, alive: jax.Array):
    """Mean, std (ddof=0) and sem (ddof=1) over the seed axis (last) among alive runs.

    values: (M, G, N); alive: (G, N). Returns three (M, G) arrays, NaN where no run
    is alive. Dead runs are masked with `where`, never multiplied, so their values
    cannot leak NaN or inf into the statistics.
    """
    alive = jnp.broadcast_to(alive[None], values.shape)
    n = alive.sum(axis=-1).astype(values.dtype)  # (M, G); integer counts are exact
    mean = _tree_sum(jnp.where(alive, values, 0.0)) / n
    dev = jnp.where(alive, values - mean[..., None], 0.0)
    ss = _tree_sum(dev * dev)
    std = jnp.sqrt(ss / n)
    sem = jnp.where(n > 1, jnp.sqrt(ss / jnp.maximum(n - 1, 1) / n), 0.0)
    return mean, std, sem


@dataclass
class Program:
    """A compiled-on-demand sweep program for a fixed chunk size.

    `fn(seed_keys, grid)` runs `chunk` grid points (StepSizes of (chunk,) arrays)
    for the spec's seeds; `lower(...)` gives the jitted function's lowering.
    """

    spec: SweepSpec
    fn: Callable
    chunk: int
    mesh: Mesh | None


def make_program(spec: SweepSpec, chunk: int, devices=None) -> Program:
    """Python-side setup for `spec`: the model's tables and metrics are baked in as
    constants, and the returned program maps (seed keys, grid chunk) -> statistics.

    With several devices, the grid axis of the chunk is split over them with
    `shard_map` on a 1-D `Mesh`; `chunk` must be a multiple of the device count.
    """
    env = envs.make(spec.env)
    alg = algorithms.get(spec.algorithm)
    dtype = jnp.dtype(spec.dtype)
    sampler = sampling.make_sampler(env, spec.sampler, dtype)
    mets = [analysis.metric(env, m) for m in spec.metrics]
    theta0 = jnp.asarray(env.theta0, dtype)
    K, L, nu = spec.log_every, spec.steps // spec.log_every, sampler.num_uniforms
    bound = float(spec.divergence_bound)
    schedule = spec.schedule

    update_grid_seed = jax.vmap(jax.vmap(alg.update, in_axes=(0, 0, None)), in_axes=(0, None, 0))

    k = env.num_features

    def metric_values(states) -> jax.Array:
        """(M, G, N) metrics of every run, ||R theta + h||, unrolled over R's
        nonzeros (R is triangular) as elementwise arithmetic. A dot or einsum here
        rounds differently depending on the batch shape (even between seeds of one
        batch), which would make results depend on the chunk size."""
        theta = states.theta  # (G, N, k)
        cols = [theta[..., i] for i in range(k)]
        out = []
        for m in mets:
            ss = None
            for r in range(m.R.shape[0]):
                e = jnp.full(theta.shape[:2], m.h[r], dtype)
                for i in np.flatnonzero(m.R[r]):
                    e = e + dtype.type(m.R[r, i]) * cols[i]
                sq = e * e
                ss = sq if ss is None else ss + sq
            out.append(jnp.sqrt(ss))
        return jnp.stack(out)

    def chunk_fn(seed_keys, grid: StepSizes):
        G, N = grid.alpha.shape[0], seed_keys.shape[0]
        init_keys, stream_keys = jnp.moveaxis(jax.vmap(jax.random.split)(seed_keys), 1, 0)
        samp = jax.vmap(sampler.init)(init_keys)
        states = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (G, N) + x.shape), alg.init(theta0))
        dstep = jnp.full((G, N), -1, jnp.int32)

        def step(carry, xs):
            states, samp = carry
            u, t = xs
            tr, samp = jax.vmap(sampler.step_from_uniforms)(u, samp)
            if schedule.kind == "constant":
                h_t = grid
            else:
                f = _step_size_factors(schedule, t, dtype)
                h_t = StepSizes(*(g * fac for g, fac in zip(grid, f)))
            return (update_grid_seed(states, tr, h_t), samp), None

        def block(carry, j):
            states, samp, dstep = carry
            u = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, j), (K, nu), dtype))(stream_keys)
            t = j * K + jnp.arange(K, dtype=jnp.int32)
            (new, samp), _ = jax.lax.scan(step, (states, samp), (jnp.swapaxes(u, 0, 1), t), unroll=UNROLL)
            # Divergence is checked once per log block, not per step (a per-step
            # check costs more than the update): a run that left the bound during
            # the block is reverted to its state at the block's start, frozen there,
            # and flagged with the block's last step.
            alive = dstep < 0
            keep = alive & _run_ok(new, bound)
            states = jax.tree_util.tree_map(lambda n, o: jnp.where(_bcast(keep, n), n, o), new, states)
            dstep = jnp.where(alive & ~keep, (j + 1) * K, dstep)
            return (states, samp, dstep), (*_seed_stats(metric_values(states), keep),
                                            keep.sum(-1).astype(jnp.int32))

        alive0 = dstep < 0
        first = (*_seed_stats(metric_values(states), alive0), alive0.sum(-1).astype(jnp.int32))
        (states, samp, dstep), ys = jax.lax.scan(block, (states, samp, dstep), jnp.arange(L, dtype=jnp.int32))
        # Stack step 0 in front; move the grid axis first: (M, L+1, G) -> (G, M, L+1).
        mean, std, sem = (jnp.moveaxis(jnp.concatenate([a[None], b]), (0, 1, 2), (2, 1, 0))
                          for a, b in zip(first[:3], ys[:3]))
        alive_t = jnp.concatenate([first[3][None], ys[3]]).T  # (G, L+1)
        vals = metric_values(states)
        final = jnp.where(jnp.broadcast_to((dstep < 0)[None], vals.shape), vals, jnp.nan)  # (M, G, N)
        return {"mean": mean, "std": std, "sem": sem, "alive": alive_t,
                "final": jnp.moveaxis(final, 1, 0), "diverged_step": dstep}

    devices = list(devices) if devices is not None else jax.devices()
    mesh = None
    if len(devices) > 1:
        if chunk % len(devices):
            raise ValueError(f"chunk: must be a multiple of the {len(devices)} devices, got {chunk}")
        mesh = Mesh(np.array(devices), (GRID_AXIS,))
        spec_g = PartitionSpec(GRID_AXIS)
        fn = jax.jit(jax.shard_map(chunk_fn, mesh=mesh, in_specs=(PartitionSpec(), spec_g),
                                   out_specs=spec_g, check_vma=False))
    else:
        fn = jax.jit(chunk_fn)
    return Program(spec=spec, fn=fn, chunk=chunk, mesh=mesh)


def seed_keys(spec: SweepSpec) -> jax.Array:
    """The per-seed keys: seed i's key is fold_in(key(spec.seed), i), so a seed's
    stream does not depend on how many seeds the sweep has."""
    base = jax.random.key(spec.seed)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(spec.seeds))


def bytes_per_point(spec: SweepSpec) -> int:
    """Rough device memory of one grid point inside the program: the states of all
    seeds (a few live copies in the scan) plus the logged statistics."""
    item = jnp.dtype(spec.dtype).itemsize
    k = envs.make(spec.env).num_features
    state_floats = 2 * k + 2  # theta, u, omega and the count, at most
    per_run = state_floats * item * 6 + 8
    return spec.seeds * per_run + spec.num_logs * len(spec.metrics) * 3 * item + 4 * spec.num_logs


def choose_chunk(spec: SweepSpec, n_devices: int, memory_budget: int = 2 << 30) -> int:
    """The largest chunk (a multiple of the device count) within `memory_budget` bytes."""
    G = spec.num_points
    per = bytes_per_point(spec)
    fit = max(1, memory_budget // per)
    chunk = min(G, fit)
    return max(n_devices, (chunk + n_devices - 1) // n_devices * n_devices if chunk >= n_devices else n_devices)


def _grid_chunks(spec: SweepSpec, chunk: int, dtype):
    """Yields (start, stop, StepSizes of (chunk,)) with the last chunk padded by
    repeating its last point (padded results are dropped)."""
    arrays = spec.grid_arrays()
    G = spec.num_points
    for start in range(0, G, chunk):
        stop = min(start + chunk, G)
        idx = np.minimum(np.arange(start, start + chunk), stop - 1)
        # Unused step sizes become 0: the update never reads them.
        yield start, stop, StepSizes(*(jnp.asarray(np.nan_to_num(arrays[n][idx]), dtype) for n in STEP_NAMES))


def _progress(done: int, total: int, t0: float) -> None:
    el = time.perf_counter() - t0
    eta = el / done * (total - done) if done else float("nan")
    sys.stderr.write(f"\r[bec-jax] chunk {done}/{total}  {el:6.1f}s elapsed  ~{eta:5.1f}s left")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


# LLVM's -O1 halves XLA's CPU compile time for these small scanned kernels with no
# measurable loss of run time (measured on the paper's sweeps); see README.
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


def plan_chunk(spec: SweepSpec, chunk_size: int | None = None, n_devices: int = 1,
               memory_budget: int = 2 << 30) -> int:
    """The grid points per compiled call `run` uses: `chunk_size` rounded up to a
    multiple of the device count, or by default all that fit in `memory_budget`."""
    if chunk_size is None:
        return choose_chunk(spec, n_devices, memory_budget)
    if not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool) or chunk_size <= 0:
        raise ValueError(f"chunk_size: must be a positive integer, got {chunk_size!r}")
    return -(-int(chunk_size) // n_devices) * n_devices


def num_chunks(spec: SweepSpec, chunk: int) -> int:
    """How many compiled calls a sweep of `spec` makes with `chunk` points each."""
    return -(-spec.num_points // chunk)


def _unbounded_where_diverged(cat: dict) -> dict:
    """The program reports NaN statistics where no seed is alive and NaN finals for
    diverged seeds; the saved convention is +inf there (the error is unbounded).
    Shapes here: mean/std/sem (G, M, L), alive (G, L), final (G, M, N), diverged_step (G, N)."""
    cat = dict(cat)
    dead = (cat["alive"] == 0)[:, None, :]
    for k in ("mean", "std", "sem"):
        cat[k] = np.where(dead, np.inf, cat[k])
    cat["final"] = np.where((cat["diverged_step"] >= 0)[:, None, :], np.inf, cat["final"])
    return cat


def _check_finite(cat: dict) -> None:
    """Warns when a statistic is NaN or a surviving run's final value is not finite:
    the divergence check should have caught such a run, so the numbers are suspect."""
    bad = {k: int(np.isnan(cat[k]).sum()) for k in ("mean", "std", "sem")}
    alive_final = (cat["diverged_step"] < 0)[:, None, :]
    bad["final of surviving seeds"] = int((~np.isfinite(cat["final"]) & alive_final).sum())
    bad = {k: v for k, v in bad.items() if v}
    if bad:
        warnings.warn("sweep: non-finite values that the divergence check did not flag ("
                      + ", ".join(f"{k}: {v}" for k, v in bad.items())
                      + "); these statistics are not trustworthy", RuntimeWarning, stacklevel=3)


def run(spec: SweepSpec, *, chunk_size: int | None = None, devices=None,
        memory_budget: int = 2 << 30, progress: bool | None = None,
        compiler_options: dict | None = None,
        on_chunk: Callable[[int, dict], None] | None = None,
        done_chunks: dict[int, dict] | None = None) -> SweepResult:
    """Runs the sweep and returns a `SweepResult`.

    Args:
      spec: what to run.
      chunk_size: grid points per compiled call (default: all that fit in
        `memory_budget`). Results do not depend on it.
      devices: devices to shard the grid axis over (default: all of `jax.devices()`).
      memory_budget: bytes of device memory a chunk may use.
      progress: print a progress line per chunk (default: once a multi-chunk run
        has taken more than 2 seconds).
      compiler_options: XLA options for the compile (default on CPU:
        `CPU_COMPILER_OPTIONS`; none elsewhere).
      on_chunk: called as `on_chunk(index, arrays)` after chunk `index` (of
        `num_chunks(spec, chunk)`) has run, with the program's outputs for that
        chunk's grid points (numpy arrays, grid axis first, padding removed).
        An exception it raises stops the run (the chunks done so far were
        reported). `results.ChunkStore.save` is such a callback.
      done_chunks: {index: arrays} of chunks already computed (as passed to
        `on_chunk` by an earlier run of the same spec and chunk size): they are
        not run again. With every chunk done nothing is compiled.

    Where every seed of a grid point has diverged, its statistics are +inf, and a
    diverged seed's final values are +inf (see `SweepResult`).
    """
    if spec.dtype == "float64" and not jax.config.jax_enable_x64:
        raise ValueError("dtype: float64 needs JAX's 64-bit mode; set JAX_ENABLE_X64=1 "
                         "or jax.config.update('jax_enable_x64', True) before running")
    devices = list(devices) if devices is not None else jax.devices()
    n_dev = len(devices)
    chunk = plan_chunk(spec, chunk_size, n_dev, memory_budget)
    dtype = jnp.dtype(spec.dtype)
    chunks = list(_grid_chunks(spec, chunk, dtype))
    done = dict(done_chunks or {})
    for i, arrays in done.items():
        if not 0 <= i < len(chunks):
            raise ValueError(f"done_chunks: chunk {i} does not exist (the sweep has {len(chunks)} "
                             f"chunks of {chunk} points)")
        start, stop, _ = chunks[i]
        for name, arr in arrays.items():
            if np.shape(arr)[:1] != (stop - start,):
                raise ValueError(f"done_chunks: chunk {i}'s {name!r} has shape {np.shape(arr)}; "
                                 f"expected {stop - start} grid points first (a different chunk size?)")
    todo = [i for i in range(len(chunks)) if i not in done]

    compile_time = 0.0
    if todo:
        program = make_program(spec, chunk, devices)
        keys = seed_keys(spec)
        if program.mesh is not None:
            keys = jax.device_put(keys, NamedSharding(program.mesh, PartitionSpec()))
            grid_sharding = NamedSharding(program.mesh, PartitionSpec(GRID_AXIS))
        t = time.perf_counter()
        first_grid = chunks[todo[0]][2]
        if program.mesh is not None:
            first_grid = jax.device_put(first_grid, grid_sharding)
        if compiler_options is None:
            compiler_options = CPU_COMPILER_OPTIONS if devices[0].platform == "cpu" else {}
        compiled = program.fn.lower(keys, first_grid).compile(compiler_options or None)
        compile_time = time.perf_counter() - t

    results: dict[int, dict] = dict(done)
    t = time.perf_counter()
    shown = False
    try:
        for n, i in enumerate(todo):
            start, stop, grid = chunks[i]
            if program.mesh is not None:
                grid = jax.device_put(grid, grid_sharding)
            out = jax.device_get(compiled(keys, grid))
            results[i] = {name: np.asarray(arr)[: stop - start] for name, arr in out.items()}
            if on_chunk is not None:
                on_chunk(i, results[i])
            if progress or (progress is None and len(todo) > 1 and time.perf_counter() - t > 2.0):
                _progress(len(done) + n + 1, len(chunks), t)
                shown = n + 1 < len(todo)
    finally:
        if shown:  # end an unfinished progress line before anyone else writes
            sys.stderr.write("\n")
            sys.stderr.flush()
    run_time = time.perf_counter() - t

    names = list(results[0])
    cat = _unbounded_where_diverged({k: np.concatenate([results[i][k] for i in range(len(chunks))])
                                     for k in names})
    _check_finite(cat)
    grid_np = spec.grid_arrays()
    n_updates = spec.num_points * spec.seeds * spec.steps
    computed = sum(chunks[i][1] - chunks[i][0] for i in todo) * spec.seeds * spec.steps
    meta = {
        "bec_jax_version": bec_jax.__version__,
        "jax_version": jax.__version__,
        "jaxlib_version": jax.lib.__version__ if hasattr(jax.lib, "__version__") else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(devices[0].device_kind if hasattr(devices[0], "device_kind") else devices[0]),
        "backend": devices[0].platform,
        "num_devices": n_dev,
        "chunk_size": chunk,
        "num_chunks": len(chunks),
        "resumed_chunks": len(done),
        "compile_time_s": compile_time,
        "run_time_s": run_time,
        "updates": n_updates,
        "updates_per_s": computed / run_time if run_time > 0 and computed else None,
    }
    return SweepResult(
        spec=spec,
        steps=np.arange(spec.num_logs) * spec.log_every,
        alpha=grid_np["alpha"], beta=grid_np["beta"], zeta=grid_np["zeta"],
        mean=np.moveaxis(cat["mean"], 0, 1), std=np.moveaxis(cat["std"], 0, 1),
        sem=np.moveaxis(cat["sem"], 0, 1), alive=cat["alive"],
        final=np.moveaxis(cat["final"], 0, 1), diverged_step=cat["diverged_step"],
        meta=meta,
    )
