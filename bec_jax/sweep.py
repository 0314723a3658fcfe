"""The sweep engine: a whole sweep as one compiled XLA program per model shape.

    program(seed_keys, grid) = jit(shard_map_over_grid(
        scan over log points (
            scan over log_every steps (
                sample one transition per seed (and model)   # common random numbers
                update every (grid point, seed) pair         # vmap(grid) o vmap(seed)
            freeze runs that diverged)
            metrics of every run -> mean/std/sem over surviving seeds)))

The grid's columns are the algorithm's hyperparameters and the environment's
parameters. Points whose models have equal shapes (and equal static
hyperparameters) form a *group* that runs as one program: with one model the
transitions are drawn once per seed and broadcast to every grid point; with
several (a gamma sweep, say) the models are stacked as one block-diagonal chain
and every grid point samples its own model from the same per-seed uniforms, so
a grid point sees exactly the transitions a run of its model alone would see.

A seed's random stream depends only on the base seed and its index, and a
point's arithmetic only on its own values, so a point's result does not depend
on the other points in the grid, the chunk size or the number of devices.
Memory is O(grid x seeds x state) inside the program and O(grid x log points)
out of it: no per-step parameters are kept.

The pieces: `plan` (groups and chunks), `make_program` (compile), `run_chunks`
(execute, with resume), `assemble` (the `SweepResult`); `run` does all four.
`run_many` runs several sweeps, one program for those that differ only in
algorithm and step sizes (`make_joint_program`), each result as `run` gives it.
Compiled with XLA's fusion emitters a program takes its run-fast form
(`fast_program`: updates under `algorithms.sharing`, log blocks in pairs), with
the same results.
"""
from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bec_jax import analysis, memory, provenance, sampling
from bec_jax.algorithms.base import sharing
from bec_jax.mdp import fingerprint
from bec_jax.results import NpyFile, SweepResult, copy_rows
from bec_jax.schedules import robbins_monro
from bec_jax.spec import SweepSpec

GRID_AXIS = "grid"
ENV_INDEX = "env_index"  # the grid-chunk entry saying which of a group's models a point uses

# Steps per iteration of the inner scan. Unrolling amortises the while loop's
# per-iteration copies of the carried state (2 doubled TD's speed in isolation),
# but lets XLA fuse across steps and duplicate the TD error's computation into
# every consumer, which for CTDC grows exponentially with the unroll (3 steps ran
# 10x slower). On the standard workload 1 beats 2 (164 vs 155 M updates/s).
UNROLL = 1

# LLVM's -O1 halves XLA's CPU compile time for these small scanned kernels with no
# measurable loss of run time (measured on the paper's sweeps); see README.
_CPU_O1 = {"xla_backend_optimization_level": 1}
CPU_COMPILER_OPTIONS = {**_CPU_O1,
                        # Copy insertion with region analysis sees that the step's
                        # loop may update omega in place: without it XLA:CPU copied
                        # omega every step (run-fast form, one core: 419-427 ->
                        # 446-448 M updates/s, the same bits). The classic emitters'
                        # programs do not gain (236 against 245 M), so the light
                        # options leave it out.
                        "xla_cpu_copy_insertion_use_region_analysis": True}
# XLA:CPU's classic loop emitters instead of its MLIR fusion emitters: compiles in
# under half the time, runs about 20% slower (the fusion emitters' programs take
# the run-fast form, `fast_program`), bit for bit the same results (standard
# workload on two devices: 0.74 against 1.80 s, 416 against 533 M updates/s).
# Below 10^9 updates the compile saved is worth about as much as the run time
# lost, or more.
CPU_LIGHT_OPTIONS = {**_CPU_O1, "xla_cpu_use_fusion_emitters": False}
LIGHT_COMPILE_UPDATES = 1_000_000_000


def default_compiler_options(spec, platform: str, group=None, updates: int | None = None) -> dict:
    """The XLA options a group's program compiles with when the caller gives none.

    None off the CPU. On the CPU, `CPU_LIGHT_OPTIONS` for a prediction sweep of
    fewer than `LIGHT_COMPILE_UPDATES` updates in all and for every control sweep
    (their programs run as fast with them: cliff walking Q 0.82 against 0.78 s,
    Acrobot RCQ 6.92 against 7.30 s); else `CPU_COMPILER_OPTIONS`. A group of
    several models (an environment-parameter sweep) always gets the fusion
    emitters: with the loop emitters its metrics can round differently in the last
    bit from a one-model run of the same point (tests/test_open_engine.py), while
    one-model programs give the same bits either way (tests/test_sweep.py).
    `updates`: the program's updates when it runs more than `spec` (a program
    shared by several sweeps, `run_many`)."""
    if platform != "cpu":
        return {}
    if group is not None and len(getattr(group, "models", ())) > 1:
        return CPU_COMPILER_OPTIONS
    if updates is None and isinstance(spec, SweepSpec):
        updates = spec.num_points * spec.seeds * spec.steps
    if updates is not None and updates >= LIGHT_COMPILE_UPDATES:
        return CPU_COMPILER_OPTIONS
    return CPU_LIGHT_OPTIONS


def _on_cpu(devices) -> bool:
    """Whether a program for `devices` (None: JAX's default devices) runs on a CPU."""
    return (list(devices) if devices is not None else jax.devices())[0].platform == "cpu"


def fast_program(compiler_options: dict | None) -> bool:
    """Whether a program compiled with `compiler_options` takes its run-fast form
    (`make_program`'s `fast`, see `_kernel`): everywhere but with XLA:CPU's classic emitters
    (`CPU_LIGHT_OPTIONS`, the compile-light choice). With them the longer program
    of paired log blocks compiles half as long again (standard workload: 0.59 ->
    0.91 s, where the fusion emitters' barely moves: 1.15 -> 1.21 s), and
    `algorithms.sharing` makes their loops slower (197 -> 165 M updates/s on one
    core), not faster (fusion emitters: 223 -> 317 M)."""
    return bool((compiler_options or {}).get("xla_cpu_use_fusion_emitters", True))

# ------------------------------------------------------------------ planning

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
    (see `bec_jax.memory.plan`)."""
    if chunk_size is None:
        return memory.plan(spec, n_devices, memory_budget=memory_budget).grid
    if not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool) or chunk_size <= 0:
        raise ValueError(f"chunk_size: must be a positive integer, got {chunk_size!r}")
    return -(-int(chunk_size) // n_devices) * n_devices


def plan(spec: SweepSpec, chunk: int) -> tuple[list[Group], list[Chunk]]:
    """The groups and the chunks of at most `chunk` points each, in group order
    (a group smaller than `chunk` runs in one chunk of its own size). The layout
    depends on the spec and `chunk` only; `run_chunks` pads each chunk to a
    multiple of the device count."""
    groups = plan_groups(spec)
    chunks = []
    for gi, g in enumerate(groups):
        n = len(g.indices)
        size = min(chunk, n)
        for start in range(0, n, size):
            stop = min(start + size, n)
            pos = np.minimum(np.arange(start, start + size), stop - 1)
            chunks.append(Chunk(gi, pos, stop - start))
    return groups, chunks


def num_chunks(spec: SweepSpec, chunk: int) -> int:
    """How many compiled calls a sweep of `spec` makes with chunks of `chunk` points."""
    return len(plan(spec, chunk)[1])


def _pad(indices: np.ndarray, n_devices: int) -> np.ndarray:
    size = -(-len(indices) // n_devices) * n_devices
    return np.concatenate([indices, np.repeat(indices[-1:], size - len(indices))])


def seed_keys(spec: SweepSpec) -> jax.Array:
    """The per-seed keys: seed i's key is fold_in(key(spec.seed), spec.seed_offset
    + i), so a seed's stream does not depend on how many seeds the sweep has.
    (The sweep program computes the same keys inside itself, from the seed.)"""
    return _seed_keys(np.uint32(spec.seed), spec.seeds, spec.seed_offset)


def _block_uniforms(stream_key, j, K: int, nu: int, dtype) -> jax.Array:
    """(K, nu) uniforms driving log block j of one seed's stream."""
    return jax.random.uniform(jax.random.fold_in(stream_key, j), (K, nu), dtype)


def _seed_keys(seed, n: int, offset: int = 0) -> jax.Array:
    base = jax.random.key(seed)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(n) + offset)


def seed_transitions(spec: SweepSpec, seed_index: int = 0, env_params: dict | None = None):
    """The transitions seed `seed_index` of `spec` sees, a `Transition` of (steps,)
    arrays, drawn exactly as the sweep program draws them: for replaying a run
    with the public update functions, or for inspecting its data. `env_params`
    picks the model (default: the first grid point's)."""
    if not 0 <= seed_index < spec.seeds:
        raise ValueError(f"seed_index: must be in [0, {spec.seeds}), got {seed_index!r}")
    dtype = jnp.dtype(spec.dtype)
    tables = sampling.build_tables(spec.mdp(env_params), dtype)
    step_fn = sampling.markov_step_from_uniforms if spec.sampler == "markov" else sampling.iid_step_from_uniforms
    K, L, nu = spec.log_every, spec.steps // spec.log_every, sampling.NUM_UNIFORMS[spec.sampler]

    @jax.jit
    def draw(key):
        init_key, stream_key = jax.random.split(key)
        s0 = sampling.init_state_from_uniform(tables, jax.random.uniform(init_key, dtype=dtype))
        u = jax.vmap(lambda j: _block_uniforms(stream_key, j, K, nu, dtype))(jnp.arange(L, dtype=jnp.int32))
        return jax.lax.scan(lambda s, uu: step_fn(tables, uu, s)[::-1], s0, u.reshape(L * K, nu))[1]

    return draw(seed_keys(spec)[seed_index])


# ------------------------------------------------------------------ the program

def _state_axes(template, counter: str | None, skip=()):
    """vmap axes of the state: 0 for every leaf but the declared update counter,
    which is the same for every run and kept as one copy (None). Fields named in
    `skip` get None too (used to leave traces out of the divergence check)."""
    def axis(path, _):
        last = path[-1] if path else None
        name = getattr(last, "name", None) or getattr(last, "key", None)
        return None if (counter is not None and name == counter) or name in skip else 0
    return jax.tree_util.tree_map_with_path(axis, template)


def _counter_index(template, counter: str | None) -> int | None:
    """The position among the state's leaves of the update counter, the one scalar
    leaf named `counter` (the leaf `_state_axes` keeps unbatched); None if there
    is no such leaf. (Not `getattr`: every NamedTuple has a `count` method.)"""
    hits = [i for i, (path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(template)[0])
            if counter is not None and path and getattr(leaf, "shape", None) == ()
            and (getattr(path[-1], "name", None) or getattr(path[-1], "key", None)) == counter]
    return hits[0] if len(hits) == 1 else None


def _run_ok(state, bound: float, axes=None) -> jax.Array:
    """True where every batched float leaf of the state is finite and within the
    bound (NaN fails the comparison, so it counts as diverged), over the leaves'
    two batch axes ((N, G) for the program's seed-major states). The max over a
    leaf's feature axis is unrolled: a minor-axis reduction is slow on CPU (see
    `algorithms.base.vdot`)."""
    ok = None
    leaves = jax.tree_util.tree_leaves(state)
    axes = [0] * len(leaves) if axes is None else jax.tree_util.tree_leaves(axes, is_leaf=lambda a: a is None)
    for x, ax in zip(leaves, axes):
        if ax is None or not jnp.issubdtype(x.dtype, jnp.floating):
            continue
        x = jnp.abs(x.reshape(x.shape[:2] + (-1,)))
        m = x[..., 0]
        for i in range(1, x.shape[-1]):
            m = jnp.maximum(m, x[..., i])
        leaf_ok = m <= bound
        ok = leaf_ok if ok is None else ok & leaf_ok
    return ok


def _seed_major(vals: jax.Array) -> jax.Array:
    """(M, G, N) <-> (M, N, G): metric values to the per-seed area sums' layout, and back."""
    return jnp.swapaxes(vals, 1, 2)


def _bcast(mask: jax.Array, x: jax.Array) -> jax.Array:
    return mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))


def _tree_reduce(x: jax.Array, op, pad: float, xp=jnp) -> jax.Array:
    """Reduces the last axis by pairwise halving (padded with `pad` to a power of two).

    Only elementwise ops, in an order fixed by the axis length alone: XLA's reduce
    may combine in an order that depends on the rest of the batch shape, which would
    make a grid point's statistics depend on the chunk size in the last bit.

    The padded array is never made: the first halving adds `pad` to the elements
    whose partners it would hold, and joins the two parts. The same operations,
    without a pass that writes the padded array (the statistics of one log point
    of the standard workload, one core: 68 -> 37 us with XLA:CPU's fusion
    emitters, 45 -> 15 us with its classic ones)."""
    n = x.shape[-1]
    width = 1 << max(0, (n - 1).bit_length())
    if width != n:
        half, r = width // 2, n - width // 2  # r < half: x[r:half] has no partner
        p = xp.asarray(pad, x.dtype)
        if xp is jnp:  # hidden from XLA, which folds x + 0 to x (-0 + 0 is +0, as on the host)
            p = jax.lax.optimization_barrier(p)
        x = xp.concatenate([op(x[..., :r], x[..., half:]), op(x[..., r:half], p)], axis=-1)
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = op(x[..., :half], x[..., half:])
    return x[..., 0]


def _divide(a, b, xp=jnp):
    """a / b, one correctly rounded division in the program as on the host.

    The divisor passes through a select on the numerator's own values, so XLA
    never sees a division by a broadcast, a constant or a product it could split:
    it would turn the first two into a multiplication by a reciprocal, and
    (a / b) / c into a / (b * c), which round differently. NaN in `a` stays NaN,
    as it would anyway."""
    return a / xp.where(xp.isnan(a), xp.nan, b)


def _seed_stats(values, alive, exact_ties: bool = False, xp=jnp, count=None):
    """Mean, std (ddof=0) and sem (ddof=1) over the seed axis (last) among alive runs.

    values: (M, G, N); alive: (G, N); count: alive.sum(-1) if the caller has it
    (the program does: counting again from the (M, G, N) broadcast was a slow
    pass). Returns three (M, G) arrays, NaN where no run is alive. Dead runs are
    masked with `where`, never multiplied, so their values cannot leak NaN or
    inf into the statistics. With `exact_ties` (used at step 0,
    where every seed starts from theta0), a point whose alive seeds all have the
    same value gets that value as its mean and exactly 0 as its spread, whatever
    the rounding of the sum; it costs two more reductions, so the log steps inside
    the scan do without it.

    The host takes a seed-chunked run's statistics with this same function
    (`xp=np`) from the per-seed values, bit for bit as the program does: each
    operation is rounded on its own, in an order fixed by the seed count alone
    (`_tree_reduce`); a square reaches the sum through a select, so no fused
    multiply-add can form; and every division goes through `_divide`.
    """
    alive = xp.broadcast_to(alive[None], values.shape)
    zero = values.dtype.type(0)
    count = alive.sum(axis=-1) if count is None else xp.broadcast_to(count, alive.shape[:-1])
    n = count.astype(values.dtype)  # (M, G); integer counts are exact
    mean = _divide(_tree_reduce(xp.where(alive, values, zero), xp.add, 0.0, xp), n, xp)
    if exact_ties:
        lo = _tree_reduce(xp.where(alive, values, xp.inf), xp.minimum, xp.inf, xp)
        hi = _tree_reduce(xp.where(alive, values, -xp.inf), xp.maximum, -xp.inf, xp)
        mean = xp.where(lo == hi, lo, mean)
    dev = xp.where(alive, values - mean[..., None], zero)
    ss = _tree_reduce(xp.where(alive, dev * dev, zero), xp.add, 0.0, xp)
    std = xp.sqrt(_divide(ss, n, xp))
    sem = xp.where(n > 1, xp.sqrt(_divide(ss, xp.maximum(n - 1, 1) * n, xp)), zero)
    return mean.astype(values.dtype), std.astype(values.dtype), sem.astype(values.dtype)


def _alive_count(alive, xp=jnp):
    """(G,) int32: the alive runs of each grid point, alive (G, N). Summed as
    `_tree_reduce` sums, elementwise, where XLA:CPU's reduce of a boolean axis
    took a conversion and two passes of their own (integer sums: the same count)."""
    return _tree_reduce(alive.astype(xp.int32), xp.add, 0, xp)


def _log_point(values, alive, exact_ties: bool = False, xp=jnp, count=None) -> tuple:
    """A log point's report: mean, std and sem over the seeds (`_seed_stats`) and
    the alive count (int32; `_alive_count`, unless the caller has it), counted
    once for both."""
    count = _alive_count(alive, xp) if count is None else count
    return (*_seed_stats(values, alive, exact_ties, xp, count=count), count)


@dataclass
class Program:
    """A compiled-on-demand program for one group and a fixed chunk size.

    `fn(seed, grid)` runs `chunk` grid points for the spec's seeds: `seed` the
    base seed (a uint32 scalar), `grid` a dict of (chunk,) arrays: the traced
    hyperparameters by name and `env_index`.
    """

    spec: SweepSpec
    group: Group
    fn: Callable
    chunk: int
    mesh: Mesh | None


UPDATES_PER_REPORT = 200_000_000


class _Kernel(NamedTuple):
    """The pieces of one group's program, as functions to trace (see `_kernel`)."""

    setup: Callable    # (seed, grids, offset, n_seeds) -> context
    start: Callable    # (ctx, per_seed) -> (carry, first)
    blocks: Callable   # (ctx, carry, js, per_seed) -> (carry, ys)
    finish: Callable   # (ctx, carry) -> {"final", "auc_seed", "diverged_step"}
    axes: tuple        # each member's state's vmap axes (None: the unbatched counter)


class _Member(NamedTuple):
    """One algorithm's share of a program: its grid points' states and update."""

    alg: object
    traced: list       # the traced hyperparameters (the grid's columns)
    axes: object       # the state's vmap axes
    check_axes: object  # the axes the divergence check reads (traces left out)
    update: Callable   # (states (N, G, ...), transitions (N, ...) or, per point, (N, G, ...), values) -> states


def _member(spec: SweepSpec, group: Group, k: int, dtype, tr_axis) -> _Member:
    alg = spec.algorithm_def
    schedule = spec.schedule
    static = dict(group.static)
    traced = [h for h in alg.hyperparameters if not h.static]
    template = jax.eval_shape(alg.init, jax.ShapeDtypeStruct((k,), dtype))  # no eager op to compile
    axes = _state_axes(template, alg.counter)
    # Traces (a followon trace on Baird, say) may grow large while the weights
    # stay bounded: divergence is judged on the other fields only.
    check_axes = _state_axes(template, alg.counter, skip=tuple(alg.traces))
    if not hasattr(template, alg.weights):
        raise ValueError(f"algorithm: {alg.name} declares weights {alg.weights!r}, but its state "
                         f"({type(template).__name__}) has no such field")
    scheduled = schedule.kind == "robbins_monro" and any(h.step_size for h in traced)
    counter_at = _counter_index(template, alg.counter)
    if scheduled and counter_at is None:
        raise ValueError(f"schedule: robbins_monro is evaluated at the update counter, but {alg.name} "
                         + ("declares none (counter=None)" if alg.counter is None else
                            f"declares counter {alg.counter!r} and its state ({type(template).__name__}) "
                            "has no such field (one scalar)"))

    def update_one(state, tr, hp_vals):
        hp = dict(static)
        for h in traced:
            v = hp_vals[h.name]
            if h.step_size and scheduled:
                # Resolved here, at the count the update reads before incrementing it,
                # so an update always gets an array: a user's `eta * c` needs no
                # `resolve_step`, and a built-in's own resolve is then a no-op (the
                # same operations on the same values: the same bits).
                count = jax.tree_util.tree_leaves(state)[counter_at]
                v = robbins_monro(v, schedule.t0, schedule.exponent(h.name))(count)
            hp[h.name] = v
        return alg.apply(state, tr, hp)

    # Seeds outside, grid points inside: a seed's transition is the same for all
    # its grid points, so in the (seeds, grid, features) layout it is constant
    # over each seed's whole plane of states, and XLA:CPU's loops read it once
    # (the bare CTDC loop on one core under `sharing`: 409 -> 641 M updates/s;
    # alone, 238 -> 303 M; classic emitters 246 -> 320 M; the same bits).
    update = jax.vmap(jax.vmap(update_one, in_axes=(axes, tr_axis, 0), out_axes=axes),
                      in_axes=(axes, 0, None), out_axes=axes)
    return _Member(alg, traced, axes, check_axes, update)


def _split(x: jax.Array, sizes: tuple) -> list:
    """x cut along its first axis into consecutive parts of `sizes` (one part: x itself)."""
    if len(sizes) == 1:
        return [x]
    return jnp.split(x, np.cumsum(sizes)[:-1].tolist())


def _kernel(spec: SweepSpec, group: Group, chunk: int, on_block: Callable | None = None,
            others: tuple = (), fast: bool = True, devices=None) -> _Kernel:
    """The traced pieces of a group's program: the context of a (seed, grid
    chunk, seed range), the start state, a run of log blocks, and the end.

    `_whole_run` chains them once over the whole time axis; the segmented
    programs (`make_segment_programs`) call the same pieces over a part of the
    time axis or of the seeds, so every run does the same arithmetic either way.
    With `per_seed` the log blocks report each seed's metric values and alive
    flags instead of the statistics over seeds (a seed-chunked run combines
    them on the host, with the same `_seed_stats`).

    `others`: (spec, group) pairs of sweeps that differ from `spec` only in
    their algorithm and its hyperparameters, all of one model (see
    `make_joint_program`). Each such *member* keeps its own states and update;
    the transitions, the metrics, the statistics and the divergence bookkeeping
    are shared, over the members' grid points laid end to end. `grids` holds
    one grid chunk per member.

    `fast`: the run-fast form (see `fast_program`), the same arithmetic bit for
    bit. Its log blocks run two an iteration, each with its first step outside
    its loop of steps, so the state needs no copy between blocks (one core,
    fusion emitters, standard workload: 205-208 -> 214-222 M updates/s), in a
    program about twice as long; and on a CPU (`devices`, None: JAX's default)
    the updates run under `algorithms.sharing`, each TD error and dot product
    computed once a step (310 against 214 M updates/s)."""
    paired, share = fast, fast and _on_cpu(devices)
    dtype = jnp.dtype(spec.dtype)
    models = group.models
    E = len(models)
    if others and E > 1:
        raise ValueError("others: a program shared by several sweeps needs one model per sweep")
    tables_np = sampling.build_tables(models, dtype, as_numpy=True)
    step_fn = sampling.markov_step_from_uniforms if spec.sampler == "markov" else sampling.iid_step_from_uniforms
    nu = sampling.NUM_UNIFORMS[spec.sampler]
    K, L = spec.log_every, spec.steps // spec.log_every
    # Progress reports (on_block): a host callback stalls the program (about
    # 0.7 ms each on a 2-core CPU), so one per UPDATES_PER_REPORT, at most 100 a chunk.
    report_every = max(1, L // int(np.clip(chunk * spec.seeds * spec.steps // UPDATES_PER_REPORT, 1, 100)))
    bound = float(spec.divergence_bound)
    theta0 = np.stack([np.asarray(m.theta0, np.float64) for m in models])  # (E, k)
    k = theta0.shape[1]

    if E == 1:
        mets = [analysis.metric(models[0], m) for m in spec.metrics]  # constants, unrolled over nonzeros
        nonzero = None
    else:
        per_model = [[analysis.metric(m, name) for m in models] for name in spec.metrics]
        # A metric's factor has as many rows as its rank (a projected error of
        # rank-deficient features has fewer): zero rows pad them to one shape,
        # adding exact zeros to the sum of squares. NumPy arrays: constants made
        # inside the trace.
        stacked, nonzero = [], []
        for ms in per_model:
            rows = max(mm.R.shape[0] for mm in ms)
            R = np.stack([np.pad(mm.R, ((0, rows - mm.R.shape[0]), (0, 0))) for mm in ms])
            h = np.stack([np.pad(mm.h, (0, rows - mm.h.shape[0])) for mm in ms])
            stacked.append((R.astype(dtype), h.astype(dtype)))
            nonzero.append(np.any(R != 0, axis=0))

    # With several models, each seed's trajectory of every model is sampled once
    # per step and each grid point gathers its model's transition (`per_model`);
    # only when a chunk holds fewer points than the group has models does every
    # point sample its own (the same transitions either way).
    per_model = 1 < E <= chunk
    tr_axis = None if E == 1 else 0
    members = [_member(s, g, k, dtype, tr_axis) for s, g in ((spec, group), *others)]

    class Ctx(NamedTuple):
        sizes: tuple       # each member's grid points (their sum: the program's)
        N: int
        tables: object
        hp_vals: list
        init_keys: jax.Array
        stream_keys: jax.Array
        env_idx: object
        mets_g: list

    def setup(seed, grids, offset, N):
        sizes = tuple(g[ENV_INDEX].shape[0] for g in grids)
        keys = _seed_keys(seed, N, offset)
        # Constants of the program, made inside the trace (nothing compiled to place them).
        tables = sampling.SamplerTables(*(jnp.asarray(x) for x in tables_np))
        hp_vals = [{h.name: g[h.name].astype(dtype) for h in mb.traced} for mb, g in zip(members, grids)]
        init_keys, stream_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
        if E == 1:
            env_idx, mets_g = None, mets
        else:
            env_idx = grids[0][ENV_INDEX]
            mets_g = [analysis.Metric(jnp.asarray(R)[env_idx], jnp.asarray(h)[env_idx]) for R, h in stacked]
        return Ctx(sizes, N, tables, hp_vals, init_keys, stream_keys, env_idx, mets_g)

    def metric_values(ctx, states):
        """(M, G, N) metric values of the states (seed-major: (N, G, ...)).

        Taken grid-major, on each weight's column turned (G, N), as before the
        states were seed-major: taken on the seed-major weights directly, a
        final value of one program form (fusion emitters, 8-point chunks) came
        out 1 ulp apart from the others', which the bit-for-bit tests caught.
        Turning the columns rather than the whole (N, G, k) array lets XLA:CPU
        read them in the metric's loop (the standard workload on one core: 4%
        faster, the same bits)."""
        w = [getattr(st, mb.alg.weights) for mb, st in zip(members, states)]
        w = w[0] if len(w) == 1 else jnp.concatenate(w, axis=1)
        return analysis.metric_values(ctx.mets_g, [w[..., i].T for i in range(w.shape[-1])], nonzero)

    def report(vals, keep, per_seed, exact_ties=False, count=None):
        if per_seed:
            return vals, keep
        return _log_point(vals, keep, exact_ties, count=count)

    def start(ctx, per_seed):
        N = ctx.N
        u0 = jax.vmap(lambda key: jax.random.uniform(key, dtype=dtype))(ctx.init_keys)  # (N,)
        states = []
        if E == 1:
            samp = jax.vmap(lambda u: sampling.init_state_from_uniform(ctx.tables, u))(u0)  # (N,)
        else:
            starts = jnp.arange(E, dtype=jnp.int32) if per_model else ctx.env_idx
            samp = jax.vmap(lambda e: jax.vmap(lambda u: sampling.init_state_from_uniform(ctx.tables, u, e))(u0))(
                starts)
        for mb, G in zip(members, ctx.sizes):
            if E == 1:
                st0 = mb.alg.init(jnp.asarray(theta0[0].astype(dtype)))
            else:
                st0 = jax.vmap(mb.alg.init, out_axes=mb.axes)(jnp.asarray(theta0.astype(dtype))[ctx.env_idx])
            # Batched leaves to (N, G, ...), seed-major (see `_member`): per point
            # (E > 1) or one start for all (E = 1).
            states.append(jax.tree_util.tree_map(
                lambda x, ax: x if ax is None else (jnp.broadcast_to(x[None], (N, G) + x.shape[1:]) if E > 1
                                                    else jnp.broadcast_to(x, (N, G) + x.shape)),
                st0, mb.axes))
        states = tuple(states)
        dstep = jnp.full((sum(ctx.sizes), N), -1, jnp.int32)
        alive0 = dstep < 0
        if E == 1:  # one start for all: its metrics once (XLA folds them), broadcast
            vals0 = jnp.concatenate([jnp.broadcast_to(analysis.metric_values(
                ctx.mets_g, getattr(st, mb.alg.weights)[:1, :1], nonzero), (len(mets), G, N))
                for mb, st, G in zip(members, states, ctx.sizes)], axis=1)
        else:
            vals0 = metric_values(ctx, states)
        return (states, samp, dstep, _seed_major(vals0)), report(vals0, alive0, per_seed, exact_ties=True)

    def step(ctx, carry, u):
        states, samp = carry
        if E == 1:
            tr, samp = jax.vmap(lambda uu, s: step_fn(ctx.tables, uu, s))(u, samp)
        else:
            # Transitions seed-major, (N, E or G, ...) as the states; samplers (E or G, N).
            tr, samp = jax.vmap(jax.vmap(lambda uu, s: step_fn(ctx.tables, uu, s)), in_axes=(None, 0),
                                out_axes=(1, 0))(u, samp)
            if per_model:  # (N, E) -> (N, G): each point its model's transition
                tr = jax.tree_util.tree_map(lambda x: x[:, ctx.env_idx], tr)
        # A uniform of this step: a number XLA cannot fold, as `sharing` needs.
        with sharing(u.reshape(-1)[0]) if share else contextlib.nullcontext():
            states = tuple(mb.update(st, tr, hp) for mb, st, hp in zip(members, states, ctx.hp_vals))
        return (states, samp), None

    def draw(ctx, j):
        """(K, N, nu): log block j's uniforms, step axis first."""
        return jnp.swapaxes(jax.vmap(lambda kk: _block_uniforms(kk, j, K, nu, dtype))(ctx.stream_keys), 0, 1)

    def block(ctx, carry, j, u, per_seed):
        """Log block j: (states, samp, dstep) -> the same, its metric values, its report."""
        states, samp, dstep = carry
        if paired:
            # The first step reads the block's start state and writes a new one, so
            # the start state stays for the revert without the copy XLA makes of a
            # while loop's input that is read after the loop.
            (new, samp), _ = step(ctx, (states, samp), u[0])
            (new, samp), _ = jax.lax.scan(lambda c, uu: step(ctx, c, uu), (new, samp), u[1:], unroll=UNROLL)
        else:
            (new, samp), _ = jax.lax.scan(lambda c, uu: step(ctx, c, uu), (states, samp), u, unroll=UNROLL)
        # Divergence is checked once per log block, not per step (a per-step
        # check costs more than the update): a run that left the bound during
        # the block is reverted to its state at the block's start, frozen there,
        # and flagged with the block's last step.
        alive = dstep < 0
        oks = [_run_ok(st, bound, mb.check_axes) for mb, st in zip(members, new)]  # (N, G) each
        keep = alive & (oks[0] if len(oks) == 1 else jnp.concatenate(oks, axis=1)).T
        count = _alive_count(keep)  # the report's, and whether any run is not kept
        # Reverting is a pass over the state, needed only where some run is not
        # kept (diverged now or before: a diverged run stays frozen); in most
        # sweeps most blocks have none. A run that diverges is flagged there too.
        states, dstep = jax.lax.cond(
            jnp.any(count < ctx.N),
            lambda: (tuple(jax.tree_util.tree_map(
                lambda n, o, ax: n if ax is None else jnp.where(_bcast(kp, n), n, o), nw, st, mb.axes)
                for mb, nw, st, kp in zip(members, new, states, [k.T for k in _split(keep, ctx.sizes)])),
                jnp.where(alive & ~keep, (j + 1) * K, dstep)),
            lambda: (new, dstep))
        if on_block is not None:
            jax.lax.cond((j + 1) % report_every == 0, lambda: jax.debug.callback(on_block, j + 1),
                         lambda: None)
        vals = metric_values(ctx, states)
        return (states, samp, dstep), vals, report(vals, keep, per_seed, count=count)

    def blocks(ctx, carry, js, per_seed):
        def one(c, j):
            *c, auc_sum = c
            c, vals, y = block(ctx, c, j, draw(ctx, j), per_seed)
            return (*c, auc_sum + _seed_major(vals)), y

        if not paired or js.shape[0] < 2:
            return jax.lax.scan(one, carry, js)

        # Two log blocks an iteration: the state moves between two buffers and is
        # back in the loop's own after the second, where a loop of single blocks
        # copies it back after each. The two blocks' uniforms are drawn together,
        # and their metric values join the areas' sums in one pass, added in turn.
        # The sums are kept seed-major (M, N, G), the layout XLA:CPU computes the
        # metric values in: summed grid-major, the pass read them across the seeds
        # (the standard workload on one core: 5% faster, the same bits: the
        # same additions in the same order).
        def two(c, jj):
            *c, auc_sum = c
            u = jax.vmap(lambda j: draw(ctx, j))(jj)
            c, v0, y0 = block(ctx, c, jj[0], u[0], per_seed)
            c, v1, y1 = block(ctx, c, jj[1], u[1], per_seed)
            return ((*c, auc_sum + _seed_major(v0) + _seed_major(v1)),
                    jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), y0, y1))

        n = js.shape[0] // 2 * 2
        carry, ys = jax.lax.scan(two, carry, js[:n].reshape(-1, 2))
        ys = jax.tree_util.tree_map(lambda a: a.reshape((n,) + a.shape[2:]), ys)
        if n < js.shape[0]:
            carry, y = one(carry, js[n])
            ys = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b[None]]), ys, y)
        return carry, ys

    def finish(ctx, carry):
        states, _, dstep, auc_sum = carry
        auc_sum = _seed_major(auc_sum)  # (M, N, G) -> (M, G, N)
        vals = metric_values(ctx, states)
        alive = jnp.broadcast_to((dstep < 0)[None], vals.shape)
        final = jnp.where(alive, vals, jnp.nan)  # (M, G, N)
        # Each seed's area under its curve: the mean over the logged points.
        auc_seed = jnp.where(alive, auc_sum / (L + 1), jnp.nan)
        return {"final": jnp.moveaxis(final, 1, 0), "auc_seed": jnp.moveaxis(auc_seed, 1, 0), "diverged_step": dstep}

    return _Kernel(setup, start, blocks, finish, tuple(mb.axes for mb in members))


def make_program(spec: SweepSpec, group: Group, chunk: int, devices=None,
                 on_block: Callable | None = None, fast: bool = True) -> Program:
    """Python-side setup for one group of `spec`: the models' sampler tables and
    metrics are baked in, and the returned program maps (base seed, grid chunk)
    -> statistics, over every seed and the whole time axis in one call.

    With several devices, the grid axis of the chunk is split over them with
    `shard_map` on a 1-D `Mesh`; `chunk` must be a multiple of the device count.
    `on_block(j)`, if given, is called on the host after log block j (1-based)
    every few blocks (one report per `UPDATES_PER_REPORT`, at most 100 a chunk),
    once per device holding a shard: a progress report, not a per-step callback.
    `fast`: the run-fast form (see `fast_program`): log blocks in pairs and, on a
    CPU, the updates under `algorithms.sharing`; the same results either way.
    """
    kern = _kernel(spec, group, chunk, on_block, fast=fast, devices=devices)
    whole = _whole_run(spec, kern)

    def sweep_program(seed, grid):  # the name XLA's module gets (tests count compiles by it)
        return whole(seed, (grid,))

    mesh = _mesh(devices, chunk)
    return Program(spec=spec, group=group, fn=_jit_over_grid(sweep_program, mesh), chunk=chunk, mesh=mesh)


def _jit_over_grid(fn: Callable, mesh: Mesh | None) -> Callable:
    """`jit(fn)` for fn(seed, grid inputs) -> outputs with the grid axis first;
    with a mesh, each device runs its share of the grid (`shard_map`)."""
    if mesh is None:
        return jax.jit(fn)
    spec_g = PartitionSpec(GRID_AXIS)
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(PartitionSpec(), spec_g), out_specs=spec_g,
                                 check_vma=False))


def _whole_run(spec: SweepSpec, kern: _Kernel) -> Callable:
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


def make_joint_program(members: list, devices=None, fast: bool = True) -> Program:
    """One program for several sweeps that differ only in their algorithm and its
    hyperparameters (same model, seeds, steps, sampler, metrics, schedule):
    `members` is a list of (spec, group, size), each group of one model, each
    size (the member's padded points) a multiple of the device count. The
    transitions are drawn once per seed for all of them (they are the same
    transitions each sweep draws alone), and the sweeps' points are laid end to
    end for the metrics and statistics; each point's arithmetic is its own.

    `fn(seed, grids)` takes one grid chunk per member and returns the outputs of
    every member's points, grid axis first: per device (with a mesh) the
    members' shares of that device in order; `split_joint` cuts them apart."""
    (spec, group, _), others = members[0], members[1:]
    sizes = [size for *_, size in members]
    kern = _kernel(spec, group, sum(sizes), others=tuple((s, g) for s, g, _ in others), fast=fast,
                   devices=devices)
    whole = _whole_run(spec, kern)
    mesh = _mesh(devices, int(np.gcd.reduce(sizes)))  # every member's size a multiple of the devices
    return Program(spec=spec, group=group, fn=_jit_over_grid(whole, mesh), chunk=sum(sizes), mesh=mesh)


def split_joint(out: dict, sizes: list, n_devices: int) -> list[dict]:
    """A joint program's outputs (see `make_joint_program`) cut into each member's
    (its `sizes[i]` points, grid axis first, in its chunk's order)."""
    local = [n // n_devices for n in sizes]
    starts = np.concatenate([[0], np.cumsum(local)])
    parts = [{} for _ in sizes]
    for name, arr in out.items():
        arr = np.asarray(arr)
        by_dev = arr.reshape((n_devices, -1) + arr.shape[1:])
        for m, n in enumerate(sizes):
            parts[m][name] = by_dev[:, starts[m]:starts[m + 1]].reshape((n,) + arr.shape[1:])
    return parts


def _mesh(devices, chunk: int) -> Mesh | None:
    devices = list(devices) if devices is not None else jax.devices()
    if len(devices) <= 1:
        return None
    if chunk % len(devices):
        raise ValueError(f"chunk: must be a multiple of the {len(devices)} devices, got {chunk}")
    return Mesh(np.array(devices), (GRID_AXIS,))


def _segment_mesh(devices, chunk: int, by_seed: bool) -> Mesh | None:
    """The mesh of a segmented chunk's programs: over the seed axis for a seed
    chunk on several devices (any `chunk`), else as `_mesh` (over the grid)."""
    devices = list(devices)
    if by_seed and len(devices) > 1:
        return Mesh(np.array(devices), (GRID_AXIS,))
    return _mesh(devices, chunk)


class SegmentPrograms(NamedTuple):
    """The programs of a time-segmented or seed-chunked run of one group (see
    `make_segment_programs`); each maps explicit state to state, so the carried
    state can leave the device between calls."""

    start: Callable            # (seed, grid, offset) -> (carry, first)
    advance: Callable          # (seed, grid, offset, carry, j0) -> (carry, ys); `blocks` log blocks
    finish: Callable           # (seed, grid, offset, carry) -> per-seed finals
    blocks: int
    per_seed: bool
    mesh: Mesh | None
    carry_sharding: Callable   # carry -> its shardings (or None on one device)


def make_segment_programs(spec: SweepSpec, group: Group, chunk: int, seeds: int, blocks: int,
                          devices=None, fast: bool = True) -> SegmentPrograms:
    """The three programs of a segmented run of one group: `start` (the initial
    carry and the step-0 report), `advance` (`blocks` log blocks from block j0 on)
    and `finish` (the per-seed finals), for `chunk` grid points and `seeds`
    seeds from seed index `offset` (relative to the spec's seed_offset). With
    `seeds < spec.seeds` (a seed chunk) the reports are per seed (`per_seed`):
    the host combines the seed chunks with `_seed_stats`. Chained over every
    segment and seed chunk they compute exactly what `make_program` does.

    With several devices the grid axis is split over them; in a seed chunk,
    which has no statistic over seeds inside, the seed axis is (`seeds` must
    then be a multiple of the device count, `chunk` need not be)."""
    devices = list(devices) if devices is not None else jax.devices()
    per_seed = seeds < spec.seeds
    n_dev = len(devices)
    by_seed = per_seed and n_dev > 1
    if by_seed and seeds % n_dev:
        raise ValueError(f"seeds: a seed chunk must be a multiple of the {n_dev} devices, got {seeds}")
    kern = _kernel(spec, group, chunk, fast=fast, devices=devices)
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

    mesh = _segment_mesh(devices, chunk, by_seed)
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


# ------------------------------------------------------------------ running

class BlockProgress:
    """A progress bar (tqdm) in steps over the chunks a run computes, advanced by
    a host callback every few log blocks (see `make_program`); shown once the
    run has taken 2 s."""

    def __init__(self, spec: SweepSpec, chunks_todo: int, chunks_total: int, local_shards: int,
                 show: bool = True):
        from tqdm.auto import tqdm
        self.steps, self.K, self.shards = spec.steps, spec.log_every, max(1, local_shards)
        self.total_chunks = chunks_total
        self.bar = tqdm(total=chunks_todo * spec.steps, unit="step", unit_scale=True, delay=2.0, file=sys.stderr,
                        desc="[bec-jax]", dynamic_ncols=True, leave=True, disable=not show)
        self._ticks, self._last = 0, 0
        self._lock = threading.Lock()

    def chunk(self, i: int) -> None:
        """Names the chunk now running."""
        self.bar.set_description(f"[bec-jax] chunk {i + 1}/{self.total_chunks}", refresh=False)
        self._last = 0

    def __call__(self, j) -> None:
        """Block j (1-based) of the running chunk has finished on one device."""
        with self._lock:  # one call per device shard
            self._ticks += 1
            if self._ticks % self.shards == 0:
                step = int(j) * self.K
                self.bar.update(step - self._last)
                self._last = step

    def end_chunk(self) -> None:
        """The chunk is done: the bar moves to its end (the blocks after the last report)."""
        with self._lock:
            self.bar.update(self.steps - self._last)
            self._last = self.steps

    def close(self) -> None:
        self.bar.close()


def _want_block_progress(progress: bool | None) -> bool:
    """Block progress is compiled in when asked for, or by default where someone
    watches: stderr a terminal and one JAX process (every process of a
    jax.distributed run must compile the same program)."""
    if progress is not None:
        return bool(progress)
    return jax.process_count() == 1 and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def _progress(done: int, total: int, t0: float, ran: int, todo: int) -> None:
    """The per-chunk progress line: `done` of `total` chunks, `ran` of this run's
    `todo` computed since `t0` (the estimate counts only those)."""
    el = time.perf_counter() - t0
    sys.stderr.write(f"\r[bec-jax] chunk {done}/{total}  {el:6.1f}s elapsed")
    if ran < todo:
        sys.stderr.write(f"  ~{el / ran * (todo - ran):5.1f}s left")
    else:
        sys.stderr.write("\n")
    sys.stderr.flush()


class ChunkRun(NamedTuple):
    """What `run_chunks` returns: every chunk's outputs, the timings and the
    number of programs compiled (not counting those reused from this process's
    earlier sweeps)."""

    results: dict
    compile_time_s: float
    run_time_s: float
    programs: int
    computed_points: int


def _check_done(done: dict, chunks: list[Chunk]) -> None:
    for i, arrays in done.items():
        if not 0 <= i < len(chunks):
            raise ValueError(f"done_chunks: chunk {i} does not exist (the sweep has {len(chunks)} chunks)")
        for name, arr in arrays.items():
            if np.shape(arr)[:1] != (chunks[i].n,):
                raise ValueError(f"done_chunks: chunk {i}'s {name!r} has shape {np.shape(arr)}; "
                                 f"expected {chunks[i].n} grid points first (a different chunk size?)")


def _placements(mesh: Mesh | None, device, by_seed: bool = False) -> tuple:
    """Where a call's (seed, grid inputs) go: with a mesh, the seed replicated and
    the grid split over its axis (a seed chunk's grid replicated too: its seeds
    are split instead); without, both on `device`."""
    if mesh is None:
        return device, device
    return (NamedSharding(mesh, PartitionSpec()),
            NamedSharding(mesh, PartitionSpec() if by_seed else PartitionSpec(GRID_AXIS)))


def _place(x, where):
    """`x` (a NumPy array) on `where` (a device or a sharding). With several JAX
    processes (`jax.distributed`) each process places the part of the global
    array its own devices hold."""
    if jax.process_count() > 1 and isinstance(where, NamedSharding):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, where, lambda idx: x[idx])
    return jax.device_put(x, where)


def _fetch(out: dict) -> dict:
    """The program's outputs as NumPy arrays; gathered from every process when
    the grid is sharded over several JAX processes."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        return {k: np.asarray(multihost_utils.process_allgather(v, tiled=True)) for k, v in out.items()}
    return jax.device_get(out)


# Compiled programs kept in this process, so a sweep run again with another base
# seed (a confirmation on fresh seeds, say), or a chunk shape seen before, skips
# compiling: the seed is an argument of the program, everything else that shapes
# it is in the key. The least recently used are dropped beyond MAX_EXECUTABLES.
MAX_EXECUTABLES = 32
_EXECUTABLES: OrderedDict = OrderedDict()
_EXECUTABLES_LOCK = threading.Lock()  # sweeps may run in threads (the reproductions do)


def clear_compiled() -> None:
    """Forgets the compiled programs kept in this process: the next sweep
    compiles afresh (benchmarks that time compiles call it)."""
    with _EXECUTABLES_LOCK:
        _EXECUTABLES.clear()


def _memo_get(memo):
    """The compiled program kept under `memo` (None: nothing kept, or no key)."""
    if memo is None:
        return None
    with _EXECUTABLES_LOCK:
        hit = _EXECUTABLES.get(memo)
        if hit is not None:
            _EXECUTABLES.move_to_end(memo)
    return hit


def _memo_put(memo, hit) -> None:
    """Keeps `hit` under `memo`, dropping the least recently used beyond MAX_EXECUTABLES."""
    if memo is None:
        return
    with _EXECUTABLES_LOCK:
        _EXECUTABLES[memo] = hit
        while len(_EXECUTABLES) > MAX_EXECUTABLES:
            _EXECUTABLES.popitem(last=False)


def _memo_key(spec, group: Group, size: int, devices, compiler_options, eng) -> tuple:
    """What a compiled chunk program depends on: the spec but its base seed, the
    group's models (by content), the algorithm's functions, the chunk size, the
    devices, the compiler options and the engine."""
    d = spec.to_dict()
    d.pop("seed", None)
    alg = spec.algorithm_def
    models = tuple(fingerprint(m) for m in group.models)
    return (json.dumps(d, sort_keys=True, default=str), models, id(alg.init), id(alg.update), group.static,
            tuple(np.asarray(group.indices).tolist()), size, tuple(dev.id for dev in devices),
            json.dumps(compiler_options, sort_keys=True, default=str), eng.__name__)


# ------------------------------------------------------------------ segmented runs

class MemoryOutputs:
    """Where a segmented chunk's logged statistics go: arrays in memory (the
    default of `run_chunks`). `runner.ChunkStore` offers the same methods on disk:
    .npy files written a segment's slab at a time, and checkpoints of the
    carried state so a stopped chunk resumes at its last finished segment."""

    def arrays(self, index: int, shapes: dict) -> dict:
        """Writable arrays {name: array of shape, dtype} for chunk `index`'s logs."""
        return {k: np.empty(shape, dtype) for k, (shape, dtype) in shapes.items()}

    def restore(self, index: int) -> dict | None:
        """The checkpoint of chunk `index` ({"next_block", "carries"}), if any."""
        return None

    def checkpoint(self, index: int, next_block: int, carries: list, logs: dict) -> None:
        """Keeps chunk `index`'s carried states (host arrays) after `next_block`
        blocks, with `logs` (what `arrays` gave) written up to there."""


def _host_log_point(values: np.ndarray, alive: np.ndarray, exact_ties: bool) -> tuple:
    """`_log_point` on the host, for a seed-chunked run (see `_seed_stats`)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return _log_point(values, alive, exact_ties, xp=np)


def _combine_seeds(reports: list, N: int, exact_ties: bool) -> tuple:
    """The statistics over all seeds from the seed chunks' per-seed reports
    (values (n, M, G, Ns), alive (n, G, Ns) each), trimmed to the spec's N seeds;
    one log point at a time, so the host holds a few copies of one point's values."""
    n = reports[0][0].shape[0]
    out = [], [], [], []
    for t in range(n):
        vals = np.concatenate([np.asarray(r[0][t]) for r in reports], axis=-1)[..., :N]
        alive = np.concatenate([np.asarray(r[1][t]) for r in reports], axis=-1)[..., :N]
        for lst, x in zip(out, _host_log_point(vals, alive, exact_ties)):
            lst.append(x)
    return tuple(np.stack(x) for x in out)


def _write_logs(arrays: dict, n: int, l0: int, stats: tuple) -> int:
    """Writes statistics (mean, std, sem (T, M, G), alive (T, G)) of log points
    l0.. into the chunk's arrays (grid first, the first `n` points), with the
    saved convention applied (+inf where no seed is alive); returns how many
    statistics are NaN (suspect)."""
    mean, std, sem, alive = (np.asarray(x) for x in stats)
    T = alive.shape[0]
    alive_g = alive.T[:n]  # (n, T)
    dead = (alive_g == 0)[:, None, :]
    bad = 0
    for name, x in (("mean", mean), ("std", std), ("sem", sem)):
        x = np.moveaxis(x, (0, 1, 2), (2, 1, 0))[:n]  # (n, M, T)
        bad += int((np.isnan(x) & ~dead).sum())  # NaN where no seed is alive is the +inf below
        arrays[name][:, :, l0:l0 + T] = np.where(dead, np.inf, x)
    arrays["alive"][:, l0:l0 + T] = alive_g
    return bad


def _run_segmented(spec, progs: dict, c: Chunk, seed_dev, grid, index: int, outputs, on_segment,
                   ranges: list, place_carry, timing: dict) -> dict:
    """One chunk, segment by segment and seed chunk by seed chunk (see
    `make_segment_programs`): logs written into `outputs`, the finals returned.
    With one seed chunk the carry stays on the device between segments; with
    several, each chunk's carry waits on the host. A checkpoint (`outputs.checkpoint`)
    is taken when `on_segment` asks for one, and after an out-of-memory error."""
    N, M = spec.seeds, len(spec.metrics)
    L = spec.steps // spec.log_every
    per_seed = len(ranges) > 1
    dt = np.dtype(spec.dtype)
    shapes = {"mean": ((c.n, M, L + 1), dt), "std": ((c.n, M, L + 1), dt), "sem": ((c.n, M, L + 1), dt),
              "alive": ((c.n, L + 1), np.int32)}
    arrays = outputs.arrays(index, shapes)
    offsets = [np.int32(o) for o in ranges]
    on_device = (lambda x: place_carry(x)) if per_seed else (lambda x: x)
    ck = outputs.restore(index)
    if ck is None:
        carries, firsts = [], []
        for off in offsets:
            carry, first = _execute(progs["start"], seed_dev, grid, off)
            carries.append(jax.device_get(carry) if per_seed else carry)
            firsts.append(jax.device_get(first))
        if per_seed:
            stats = _combine_seeds([(f[0][None], f[1][None]) for f in firsts], N, True)
        else:
            stats = tuple(np.asarray(x)[None] for x in firsts[0])
        timing["nan"] = timing.get("nan", 0) + _write_logs(arrays, c.n, 0, stats)
        j = 0
    else:
        carries = [jax.tree_util.tree_unflatten(progs["carry_tree"], leaves) for leaves in ck["carries"]]
        if len(carries) != len(offsets):
            raise ValueError(f"resume: chunk {index}'s checkpoint holds {len(carries)} seed chunks, "
                             f"the plan has {len(offsets)}; start over with --overwrite")
        carries = carries if per_seed else [place_carry(x) for x in carries]
        j = int(ck["next_block"])
    done = {"j": j}

    def save():
        outputs.checkpoint(index, done["j"], [jax.device_get(x) for x in carries], arrays)

    try:
        while done["j"] < L:
            j = done["j"]
            n = min(progs["blocks"], L - j)
            reports, new = [], []
            for s, off in enumerate(offsets):
                carry, ys = _execute(progs["advance"][n], seed_dev, grid, off, on_device(carries[s]), np.int32(j))
                reports.append(jax.device_get(ys))
                new.append(jax.device_get(carry) if per_seed else carry)
            carries[:] = new  # all seed chunks at block j + n together (a failed segment leaves them at j)
            stats = _combine_seeds(reports, N, False) if per_seed else reports[0]
            timing["nan"] = timing.get("nan", 0) + _write_logs(arrays, c.n, j + 1, stats)
            done["j"] = j + n
            if on_segment is not None:
                on_segment(index, done["j"], L, save)
    except Exception as e:
        if (_is_oom(e) or memory.is_memory_error(e)) and done["j"] > 0:
            try:
                save()  # the segments finished so far are kept for --resume
            except (OSError, MemoryError):
                pass  # memory or disk too short even for that: the chunk starts over
        raise
    fins = [jax.device_get(_execute(progs["finish"], seed_dev, grid, off, on_device(carries[s])))
            for s, off in enumerate(offsets)]
    out = {k: np.concatenate([f[k] for f in fins], axis=-1)[..., :N][: c.n] for k in fins[0]}
    out.update(arrays)
    return out


def _segment_programs(spec, group: Group, size: int, devices, plan_seeds: int, blocks: int, seed_dev, grid,
                      compiler_options) -> tuple[dict, int]:
    """The programs of a segmented chunk, compiled: start, advance for each
    segment length in use, finish; and how many were compiled. On one device
    they are compiled ahead of time with `compiler_options`; over a mesh, by
    `jit` on first use (their inputs' shardings come from the programs)."""
    L = spec.steps // spec.log_every
    lengths = sorted({n for _, n in _segment_list(L, blocks)})
    sps = {n: make_segment_programs(spec, group, size, plan_seeds, n, devices, fast_program(compiler_options))
           for n in lengths}
    sp = sps[lengths[-1]]
    off = np.int32(0)
    carry_shape = jax.eval_shape(sp.start, seed_dev, grid, off)[0]
    progs = {"blocks": blocks, "carry_sharding": sp.carry_sharding, "mesh": sp.mesh,
             "carry_tree": jax.tree_util.tree_structure(carry_shape)}
    if sp.mesh is not None:  # the carry as the programs shard it
        carry_shape = jax.tree_util.tree_map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                                             carry_shape, sp.carry_sharding(carry_shape))
    opts = compiler_options or None
    progs.update(
        start=sp.start.lower(seed_dev, grid, off).compile(opts),
        advance={n: q.advance.lower(seed_dev, grid, off, carry_shape, np.int32(0)).compile(opts)
                 for n, q in sps.items()},
        finish=sp.finish.lower(seed_dev, grid, off, carry_shape).compile(opts))
    return progs, 2 + len(lengths)


def _segment_list(L: int, blocks: int) -> list[tuple[int, int]]:
    return [(j, min(blocks, L - j)) for j in range(0, L, blocks)]


def _execute(exe, *args):
    """Calls a compiled program (tests replace it to inject failures)."""
    return exe(*args)


def _is_oom(e: Exception) -> bool:
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def _carry_placer(progs: dict, devices) -> Callable:
    """Puts a chunk's carried state (host arrays) back where its programs want it."""
    if progs["mesh"] is None:
        return lambda carry: jax.device_put(carry, devices[0])
    return lambda carry: jax.device_put(carry, progs["carry_sharding"](carry))


def run_chunks(spec: SweepSpec, groups: list[Group], chunks: list[Chunk], devices, *,
               done: dict | None = None, only=None, compiler_options: dict | None = None,
               on_chunk: Callable | None = None, progress: bool | None = None, engine=None,
               seeds_per_call: int | None = None, blocks_per_segment: int | None = None,
               outputs=None, on_segment: Callable | None = None) -> ChunkRun:
    """Compiles each group's program (once, when its first chunk is due) and runs
    every chunk not in `done` (and, with `only`, in `only`); calls
    `on_chunk(i, arrays)` after chunk i. `engine`: the module whose `make_program`
    and `chunk_grid` make the programs (default this one; control sweeps pass
    `bec_jax.control.sweep`).

    With `seeds_per_call` below the spec's seeds or `blocks_per_segment` below
    its log blocks (a `memory.Plan`), each chunk runs in segments of the time
    axis and seed chunks: the logs go into `outputs` (default `MemoryOutputs`)
    as they come, and `on_segment(i, blocks_done, blocks, checkpoint)` is
    called after each segment (it may call `checkpoint()` to keep the carried
    state, and raise to stop). A device out-of-memory error raises
    `memory.OutOfMemory` (one line) after checkpointing what it can; the chunks
    finished before it have been passed to `on_chunk`."""
    eng = engine if engine is not None else sys.modules[__name__]
    L = spec.steps // spec.log_every if engine is None else 0
    seeds_per_call = min(seeds_per_call or spec.seeds, spec.seeds)
    blocks_per_segment = min(blocks_per_segment or L, L) if L else 0
    segmented = engine is None and (seeds_per_call < spec.seeds or blocks_per_segment < L)
    if segmented and jax.process_count() > 1:
        raise ValueError("seeds: a run in time segments or seed chunks does not support jax.distributed yet; "
                         "raise --memory-budget (or give fewer seeds or steps) so it runs in one call per chunk")
    outputs = outputs if outputs is not None else MemoryOutputs()
    ranges = list(range(0, spec.seeds, seeds_per_call)) if segmented else [0]
    # A seed chunk splits its seeds, not the grid, over the devices.
    by_seed = segmented and seeds_per_call < spec.seeds and len(devices) > 1
    if by_seed and seeds_per_call % len(devices):
        raise ValueError(f"seed_chunk: must be a multiple of the {len(devices)} devices, got {seeds_per_call}")
    timing = {"run": 0.0}
    done = dict(done or {})
    _check_done(done, chunks)
    todo = [i for i in range(len(chunks)) if i not in done and (only is None or i in only)]
    results = dict(done)
    seed = np.uint32(spec.seed)
    compiled: dict[tuple, Callable] = {}
    compile_time, t_run, shown, n_compiled = 0.0, 0.0, False, 0
    t_start = time.perf_counter()
    bar = None
    if todo and engine is None and not segmented and _want_block_progress(progress):
        local = [d for d in devices if d.process_index == jax.process_index()]
        bar = BlockProgress(spec, len(todo), len(chunks), len(local) if len(devices) > 1 else 1,
                            show=jax.process_index() == 0)
    state = {"n": 0, "shown": False, "last": 0.0, "since": None}

    def seg_progress(i, blocks_done, blocks, checkpoint):
        # A line per segment (at most one a second): a long chunk shows it is alive
        # and when it will end (estimated from this process's pace: a resumed
        # chunk starts part way).
        now = time.perf_counter()
        if state["since"] is None or state["since"][0] != i:
            state["since"] = (i, blocks_done, now)
        el = now - t_start
        if (jax.process_index() == 0 and progress is not False and (progress or el > 2.0)
                and now - state["last"] >= 1.0):
            _, b0, t0 = state["since"]
            rate = (blocks_done - b0) / (now - t0) if blocks_done > b0 and now > t0 else None
            left = (blocks - blocks_done) / rate if rate else None
            chunks_left = len(todo) - state["n"] - 1
            sys.stderr.write(f"\r[bec-jax] chunk {len(done) + state['n'] + 1}/{len(chunks)}  log block "
                             f"{blocks_done}/{blocks}  {el:6.1f}s elapsed"
                             + (f"  ~{left:6.1f}s left in this chunk" if left is not None else "")
                             + (f" ({chunks_left} more chunks)" if chunks_left else ""))
            sys.stderr.flush()
            state["shown"], state["last"] = True, now
        if on_segment is not None:
            on_segment(i, blocks_done, blocks, checkpoint)

    try:
        for n, i in enumerate(todo):
            state["n"] = n
            if bar is not None:
                bar.chunk(i)
            c = chunks[i]
            c = c._replace(indices=_pad(c.indices, 1 if by_seed else len(devices)))
            size = len(c.indices)
            key = (c.group, size)
            grid = None
            if key not in compiled:  # this run's first chunk of this shape
                t = time.perf_counter()
                opts = compiler_options if compiler_options is not None else \
                    default_compiler_options(spec, devices[0].platform, groups[c.group])
                memo = None if bar is not None else _memo_key(spec, groups[c.group], size, devices, opts, eng)
                if memo is not None and segmented:
                    memo += ("segmented", seeds_per_call, blocks_per_segment)
                hit = _memo_get(memo)
                if hit is None:
                    if segmented:
                        mesh = _segment_mesh(devices, size, by_seed)
                    else:
                        program = eng.make_program(spec, groups[c.group], size, devices, on_block=bar,
                                                   fast=fast_program(opts))
                        mesh = program.mesh
                    placed = _placements(mesh, devices[0], by_seed)
                    seed_dev = _place(seed, placed[0])
                    grid = {k: _place(v, placed[1]) for k, v in eng.chunk_grid(spec, groups[c.group], c).items()}
                    if segmented:
                        exe, made = _segment_programs(spec, groups[c.group], size, devices, seeds_per_call,
                                                      blocks_per_segment, seed_dev, grid, opts)
                    else:
                        exe, made = program.fn.lower(seed_dev, grid).compile(opts or None), 1
                    hit = (exe, placed)
                    compile_time += time.perf_counter() - t
                    n_compiled += made
                    _memo_put(memo, hit)
                # The seed is placed per run: a memoised program may come from another seed's run.
                compiled[key] = (*hit, _place(seed, hit[1][0]))
            exe, placed, seed_dev = compiled[key]
            if grid is None:
                grid = {k: _place(v, placed[1]) for k, v in eng.chunk_grid(spec, groups[c.group], c).items()}
            t = time.perf_counter()
            try:
                if segmented:
                    results[i] = _run_segmented(spec, exe, c, seed_dev, grid, i, outputs, seg_progress, ranges,
                                                _carry_placer(exe, devices), timing)
                else:
                    out = _fetch(_execute(exe, seed_dev, grid))
                    results[i] = {name: np.asarray(arr)[: c.n] for name, arr in out.items()}
            except jax.errors.JaxRuntimeError as e:
                if not _is_oom(e):
                    raise
                from bec_jax.memory import OutOfMemory
                raise OutOfMemory(
                    f"memory: the device ran out of memory in chunk {i + 1} of {len(chunks)} ({c.n} grid points x "
                    f"{seeds_per_call} seeds per call; another process may hold memory); use a smaller "
                    "--memory-budget, fewer seeds or a smaller --chunk-size", chunk=i) from None
            t_run += time.perf_counter() - t
            if bar is not None:
                bar.end_chunk()
            if on_chunk is not None:
                on_chunk(i, results[i])
            if bar is None and jax.process_index() == 0 and (
                    progress or (progress is None and len(todo) > 1 and time.perf_counter() - t_start > 2.0)):
                _progress(len(done) + n + 1, len(chunks), t_start, n + 1, len(todo))
                shown = n + 1 < len(todo)
    finally:
        if bar is not None:
            bar.close()
        if shown or state["shown"]:  # end an unfinished progress line before anyone else writes
            sys.stderr.write("\n")
            sys.stderr.flush()
    if timing.get("nan"):
        warnings.warn(f"sweep: {timing['nan']} logged statistics are NaN where the divergence check flagged "
                      "no run; these statistics are not trustworthy", RuntimeWarning, stacklevel=3)
    computed = sum(chunks[i].n for i in todo)
    return ChunkRun(results, compile_time, t_run, n_compiled, computed)


def _unbounded_where_diverged(cat: dict, logs: bool = True) -> dict:
    """The program reports NaN statistics where no seed is alive and NaN finals for
    diverged seeds; the saved convention is +inf there (the error is unbounded).
    Shapes here: mean/std/sem (G, M, L), alive (G, L), final (G, M, N), diverged_step (G, N).
    `logs=False` leaves the statistics as they are (already converted)."""
    cat = dict(cat)
    dead = (cat["alive"] == 0)[:, None, :]
    for k in ("mean", "std", "sem") if logs else ():
        cat[k] = np.where(dead, np.inf, cat[k])
    for k in ("final", "auc_seed"):
        if k in cat:
            cat[k] = np.where((cat["diverged_step"] >= 0)[:, None, :], np.inf, cat[k])
    return cat


def _check_finite(cat: dict) -> None:
    """Warns when a statistic is NaN or a surviving run's final value is not finite:
    the divergence check should have caught such a run, so the numbers are suspect."""
    # Memory-mapped logs were checked segment by segment as they were written.
    bad = {k: int(np.isnan(cat[k]).sum()) for k in ("mean", "std", "sem") if not isinstance(cat[k], np.memmap)}
    alive_final = (cat["diverged_step"] < 0)[:, None, :]
    bad["final of surviving seeds"] = int((~np.isfinite(cat["final"]) & alive_final).sum())
    bad = {k: v for k, v in bad.items() if v}
    if bad:
        warnings.warn("sweep: non-finite values that the divergence check did not flag ("
                      + ", ".join(f"{k}: {v}" for k, v in bad.items())
                      + "); these statistics are not trustworthy", RuntimeWarning, stacklevel=3)


def gather(num_points: int, groups: list[Group], chunks: list[Chunk], results: dict,
           alloc: Callable | None = None) -> dict:
    """{output: array with the grid axis first, in grid order} from every
    chunk's outputs (`results[i]` for chunk i). `alloc(name, shape, dtype)`
    makes each array (default `np.empty`; for logs that stream to disk a
    `results.NpyFile`, written a slab at a time)."""
    alloc = alloc or (lambda name, shape, dtype: np.empty(shape, dtype))
    cat = {}
    for name in results[0]:
        first = results[0][name]
        arr = alloc(name, (num_points,) + first.shape[1:], first.dtype)
        for i, c in enumerate(chunks):
            copy_rows(arr, groups[c.group].indices[c.indices[: c.n]], results[i][name])
        cat[name] = arr
    return cat


def _steps(spec: SweepSpec, alloc: Callable | None) -> np.ndarray:
    """(L,) the logged steps; with `alloc`, in its array, filled a slab at a time."""
    L, K = spec.num_logs, spec.log_every
    if alloc is None:
        return np.arange(L) * K
    out = alloc("steps", (L,), np.dtype(np.int64))
    for t in range(0, L, 1 << 22):
        out[t:t + (1 << 22)] = np.arange(t, min(L, t + (1 << 22))) * K
    return out


def _mapped(x):
    """Logs written to a file in slabs, mapped read-only once complete (the
    address space this takes is in the memory plan)."""
    return x.mapped() if isinstance(x, NpyFile) else x


def assemble(spec: SweepSpec, groups: list[Group], chunks: list[Chunk], results: dict,
             meta: dict | None = None, alloc: Callable | None = None) -> SweepResult:
    """The `SweepResult` in grid order from every chunk's outputs (see `gather`
    for `alloc`). Logs on disk (a segmented run's, which already hold the +inf
    convention, and `alloc`'s files) stay there, memory-mapped read-only."""
    if alloc is not None:  # logs bound for files get the +inf convention on the way, chunk by chunk
        results = {i: _unbounded_where_diverged(r) if type(r["mean"]) is np.ndarray else r
                   for i, r in results.items()}
    cat = {k: _mapped(v) for k, v in gather(spec.num_points, groups, chunks, results, alloc).items()}
    cat = _unbounded_where_diverged(cat, logs=not isinstance(cat["mean"], np.memmap))
    _check_finite(cat)
    steps = _mapped(_steps(spec, alloc))
    return SweepResult(
        spec=spec, steps=steps, grid=spec.grid_arrays(),
        mean=np.moveaxis(cat["mean"], 0, 1), std=np.moveaxis(cat["std"], 0, 1),
        sem=np.moveaxis(cat["sem"], 0, 1), alive=cat["alive"],
        final=np.moveaxis(cat["final"], 0, 1), diverged_step=cat["diverged_step"],
        auc_seed=np.moveaxis(cat["auc_seed"], 0, 1) if "auc_seed" in cat else None, meta=dict(meta or {}))


def run(spec: SweepSpec, *, chunk_size: int | None = None, devices=None,
        memory_budget: int | None = None, progress: bool | None = None,
        compiler_options: dict | None = None,
        on_chunk: Callable[[int, dict], None] | None = None,
        done_chunks: dict[int, dict] | None = None, seed_chunk: int | None = None,
        segment_blocks: int | None = None, outputs=None, on_segment: Callable | None = None,
        out: str | None = None, alloc: Callable | None = None,
        memory_plan=None) -> SweepResult:
    """Runs the sweep and returns a `SweepResult`.

    Args:
      spec: what to run.
      chunk_size: grid points per compiled call (default: all that fit in
        `memory_budget`). Results do not depend on it.
      devices: devices to shard the grid axis over (default: all of `jax.devices()`).
      memory_budget: bytes of device memory one compiled call may use (default:
        `memory.DEFAULT_BUDGET` or what the device has free, the less). A sweep
        whose grid point does not fit with all its seeds runs in seed chunks;
        one longer than `memory.SEGMENT_UPDATES` updates per call runs in time
        segments (`memory.plan`). Results do not depend on either, bit for bit.
      progress: True: a progress bar advanced every few log blocks (a host
        callback, never per step), shown once the run has taken 2 s;
        False: none; None (default): the bar when stderr is a terminal (and one
        JAX process), else a line per chunk once a multi-chunk run has taken
        more than 2 s. Results do not depend on it.
      compiler_options: XLA options for the compile (default
        `default_compiler_options`: on the CPU a lighter compile for sweeps
        under 10^9 updates; none elsewhere). Results do not depend on them.
      on_chunk: called as `on_chunk(index, arrays)` after chunk `index` (of
        `num_chunks(spec, chunk)`) has run, with the program's
        outputs for that chunk's grid points (numpy arrays, grid axis first,
        padding removed). An exception it raises stops the run (the chunks done
        so far were reported). `results.ChunkStore.save` is such a callback.
      done_chunks: {index: arrays} of chunks already computed (as passed to
        `on_chunk` by an earlier run of the same spec and chunk size): they are
        not run again. With every chunk done nothing is compiled.
      seed_chunk, segment_blocks: force seeds per call and log blocks per
        segment (default: planned from the budget).
      memory_plan: a `memory.Plan` made for this spec and these devices (as
        `runner.run_to_dir` makes one before it writes anything); it replaces
        the plan, so chunk_size, memory_budget, seed_chunk and segment_blocks
        are not consulted.
      outputs, on_segment: where a segmented run's logs go and the per-segment
        callback (see `run_chunks`; `runner.run_to_dir` passes its chunk store).
      out: the directory the result will be saved in (the plan then checks the
        disk and lets large logs stream there); alloc: allocates the assembled
        log arrays (see `assemble`).

    Where every seed of a grid point has diverged, its statistics are +inf, and a
    diverged seed's final values are +inf (see `SweepResult`). A run that cannot
    fit raises `memory.TooLarge` before any work.
    """
    if spec.dtype == "float64" and not jax.config.jax_enable_x64:
        raise ValueError("dtype: float64 needs JAX's 64-bit mode; set JAX_ENABLE_X64=1 "
                         "or jax.config.update('jax_enable_x64', True) before running")
    devices = list(devices) if devices is not None else jax.devices()
    if chunk_size is not None:
        chunk_size = plan_chunk(spec, chunk_size, len(devices))
    pl = memory_plan or memory.plan(spec, len(devices), memory_budget=memory_budget, chunk_size=chunk_size,
                                    seed_chunk=seed_chunk, segment_blocks=segment_blocks, device=devices[0],
                                    out=out)
    chunk = pl.grid
    groups, chunks = plan(spec, chunk)
    ran = run_chunks(spec, groups, chunks, devices, done=done_chunks, compiler_options=compiler_options,
                     on_chunk=on_chunk, progress=progress, seeds_per_call=pl.seeds,
                     blocks_per_segment=pl.blocks, outputs=outputs, on_segment=on_segment)
    meta = _meta(spec, devices, pl, groups, chunks, ran, len(done_chunks or {}))
    return assemble(spec, groups, chunks, ran.results, meta, alloc=alloc)


def _meta(spec: SweepSpec, devices, pl, groups: list[Group], chunks: list[Chunk], ran: ChunkRun,
          resumed: int = 0) -> dict:
    """A run's `SweepResult.meta`: where and how it ran, and its timings."""
    return {
        **provenance.collect(devices),
        "chunk_size": pl.grid,
        "num_chunks": len(chunks),
        "num_programs": len(groups),
        "seeds_per_call": pl.seeds,
        "blocks_per_segment": pl.blocks,
        "memory_estimate": {"device_bytes_per_call": pl.device_bytes, "host_bytes": pl.host_bytes,
                            "disk_bytes": pl.disk_bytes, "budget": pl.budget},
        "compiled_programs": ran.programs,
        "resumed_chunks": resumed,
        "compile_time_s": ran.compile_time_s,
        "run_time_s": ran.run_time_s,
        "updates": spec.num_points * spec.seeds * spec.steps,
        "updates_per_s": (ran.computed_points * spec.seeds * spec.steps / ran.run_time_s
                          if ran.run_time_s > 0 and ran.computed_points else None),
        "env_fingerprints": sorted({fingerprint(m) for g in groups for m in g.models}),
    }


def _joint_key(spec, devices) -> tuple | None:
    """(key, memory plan) of `spec` for `run_many`: the key is what sweeps must
    share to run as one program, everything but the algorithm and its
    hyperparameters, and the model. None when `spec` cannot share (several
    chunks, models or calls, logs too large to hold, or several processes)."""
    if not isinstance(spec, SweepSpec) or jax.process_count() > 1:
        return None
    groups = plan_groups(spec)
    if len(groups) != 1 or len(groups[0].models) != 1:
        return None
    pl = memory.plan(spec, len(devices), device=devices[0])
    if pl.segmented or pl.grid < spec.num_points or memory.log_bytes(spec) > memory.LAZY_LOG_BYTES:
        return None  # several calls, or logs that a run into a directory would stream to disk
    d = spec.to_dict()
    for field in ("algorithm", "hyperparameters"):
        d.pop(field, None)
    return (json.dumps(d, sort_keys=True, default=str), fingerprint(groups[0].models[0])), pl


def _packs(specs: list, devices) -> tuple[list[list[int]], dict]:
    """(packs, plans): `specs`' indices in the programs `run_many` gives them, in
    order of their first sweep, and the memory plan each shareable sweep was
    judged by."""
    packs: list[list[int]] = []
    open_pack: dict = {}  # key -> the pack its next sweep may join
    plans: dict = {}
    for i, spec in enumerate(specs):
        found = _joint_key(spec, devices)
        if found is None:
            packs.append([i])
            continue
        key, plans[i] = found
        pack = open_pack.get(key)
        if pack is None or not memory.fits_together([specs[j] for j in pack] + [spec], len(devices),
                                                     device=devices[0]):
            pack = open_pack[key] = []
            packs.append(pack)
        pack.append(i)
    return packs, plans


def shared_programs(specs: list, devices=None) -> list[list[int]]:
    """How `run_many` runs `specs`: lists of their indices, one per compiled
    program (a list of one: that sweep runs alone, by `run`)."""
    devices = list(devices) if devices is not None else jax.devices()
    return _packs(specs, devices)[0]


def run_many(specs: list, *, devices=None, compiler_options: dict | None = None,
             progress: bool | None = False) -> list[SweepResult]:
    """Runs every sweep of `specs`; returns their `SweepResult`s in order, each
    bit for bit what `run(spec)` returns.

    Sweeps that differ only in their algorithm and its hyperparameters (the
    four algorithms of one task, say) and each fit in one call share one
    compiled program, as many together as fit one call (`memory.fits_together`):
    a compile is most of the cost of a small sweep. The rest run one by one
    with `run` (`shared_programs` tells which). A shared program's compile and
    run times are in the meta of the first sweep it ran (with `shared_program`,
    the algorithms it ran, and `shared_program_index`, each sweep's place
    among them; `cost_note` says it in a line)."""
    devices = list(devices) if devices is not None else jax.devices()
    out: list = [None] * len(specs)
    packs, plans = _packs(specs, devices)
    for pack in packs:
        if len(pack) == 1:
            out[pack[0]] = run(specs[pack[0]], devices=devices, compiler_options=compiler_options,
                               progress=progress)
        else:
            for i, r in zip(pack, _run_joint([specs[i] for i in pack], [plans[i] for i in pack], devices,
                                             compiler_options)):
                out[i] = r
    return out


def cost_note(r: SweepResult) -> str:
    """What a result's sweep cost, for a log line: 'compile 1.21 s, run 0.05 s'
    (with the shared program's algorithms for the first sweep of a `run_many`
    program), or "in td's program" for a later sweep of one."""
    m = r.meta
    shared = m.get("shared_program")
    if shared and m.get("shared_program_index", 0) > 0:
        return f"in {shared[0]}'s program"
    n = m.get("compiled_programs", 0)
    return (f"{n} programs, " if n > 1 else "") + f"compile {m['compile_time_s']:.2f} s, run {m['run_time_s']:.2f} s" \
        + (f" (one program for {', '.join(shared)})" if shared else "")


def _run_joint(specs: list, plans: list, devices, compiler_options: dict | None) -> list[SweepResult]:
    """Sweeps that `run_many` found able to share one program (each with the
    memory plan it was judged by), run by one."""
    n_dev = len(devices)
    groups, chunks = [], []
    for spec, pl in zip(specs, plans):
        (group,), (chunk,) = plan(spec, pl.grid)  # one group, one chunk: why it could share
        groups.append(group)
        chunks.append(chunk._replace(indices=_pad(chunk.indices, n_dev)))
    sizes = [len(c.indices) for c in chunks]
    updates = sum(s.num_points * s.seeds * s.steps for s in specs)
    opts = compiler_options if compiler_options is not None else \
        default_compiler_options(specs[0], devices[0].platform, groups[0], updates=updates)
    t = time.perf_counter()
    memo = tuple(_memo_key(s, g, n, devices, opts, sys.modules[__name__])
                 for s, g, n in zip(specs, groups, sizes)) + ("joint",)

    def inputs(placed):  # (seed, one grid chunk per sweep), placed as the program wants them
        return (_place(np.uint32(specs[0].seed), placed[0]),
                tuple({k: _place(v, placed[1]) for k, v in chunk_grid(s, g, c).items()}
                      for s, g, c in zip(specs, groups, chunks)))

    hit, made = _memo_get(memo), 0
    if hit is None:
        program = make_joint_program(list(zip(specs, groups, sizes)), devices, fast_program(opts))
        placed = _placements(program.mesh, devices[0])
        args = inputs(placed)
        hit, made = (program.fn.lower(*args).compile(opts or None), placed), 1
        _memo_put(memo, hit)
    else:
        args = inputs(hit[1])
    compile_time = time.perf_counter() - t if made else 0.0
    t = time.perf_counter()
    out = _fetch(_execute(hit[0], *args))
    run_time = time.perf_counter() - t
    results = []
    names = [s.algorithm for s in specs]
    for m, (spec, pl, group, chunk, part) in enumerate(zip(specs, plans, groups, chunks,
                                                           split_joint(out, sizes, n_dev))):
        first = m == 0
        ran = ChunkRun({0: {k: v[: chunk.n] for k, v in part.items()}}, compile_time if first else 0.0,
                       run_time if first else 0.0, made if first else 0, chunk.n if first else 0)
        meta = {**_meta(spec, devices, pl, [group], [chunk], ran), "shared_program": names,
                "shared_program_index": m}
        if first:
            meta["updates_per_s"] = updates / run_time if run_time > 0 else None
        results.append(assemble(spec, [group], [chunk], ran.results, meta))
    return results
