"""The prediction front: a whole sweep as one compiled XLA program per model shape.

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

`run` does it all: `plan` (groups and chunks), `make_program` (compile),
`run_chunks` (execute, with resume), `assemble` (the `SweepResult`). `run_many`
runs several sweeps, one program for those that differ only in algorithm and
step sizes (`make_joint_program`), each result as `run` gives it. The engine's
pieces live in `bec_jax.engine` (one job per module); the names re-exported
here are the ones users and the rest of the library call through `sweep`.
This module is the prediction front of the engine (`engine.protocol.Engine`,
named by `SweepSpec.engine`), as `bec_jax.control.sweep` is the control front.
"""
from __future__ import annotations

import json
import time
import warnings
from typing import Callable

import jax
import numpy as np

from bec_jax.engine import clock, execute, memory, tuning
from bec_jax.engine.execute import (
    BlockProgress,
    ChunkRun,
    MemoryOutputs,
    fetch,
    place,
    placements,
    run_chunks,
)
from bec_jax.engine.plan import (
    Chunk,
    Group,
    chunk_grid,
    num_chunks,
    pad,
    plan,
    plan_chunk,
    plan_groups,
)
from bec_jax.engine.programs import (
    Program,
    SegmentPrograms,
    make_joint_program,
    make_program,
    make_segment_programs,
    split_joint,
)
from bec_jax.engine.protocol import check_dtype, gather, run_meta
from bec_jax.engine.streams import seed_keys, seed_transitions
from bec_jax.engine.tuning import (
    CPU_COMPILER_OPTIONS,
    CPU_LIGHT_OPTIONS,
    LIGHT_COMPILE_UPDATES,
    KernelForm,
    choose_form,
    clear_compiled,
    memo_get,
    memo_key,
    memo_put,
)
from bec_jax.files import NpyFile
from bec_jax.mdp import fingerprint
from bec_jax.prediction.results import SweepResult, prefetch_summary  # noqa: F401  (the front's summary hook)
from bec_jax.prediction.spec import SweepSpec

KIND = "prediction"
SEGMENTS = True        # a chunk may run in time segments and seed chunks
BLOCK_PROGRESS = True  # programs report log blocks to a progress bar

__all__ = [
    # the prediction front
    "run", "run_many", "shared_programs", "cost_note", "assemble", "gather", "plan_memory", "fingerprints",
    # re-exported from bec_jax.engine
    "Group", "Chunk", "plan_groups", "plan_chunk", "plan", "num_chunks", "chunk_grid",
    "seed_keys", "seed_transitions",
    "Program", "SegmentPrograms", "make_program", "make_joint_program", "split_joint", "make_segment_programs",
    "CPU_COMPILER_OPTIONS", "CPU_LIGHT_OPTIONS", "LIGHT_COMPILE_UPDATES", "KernelForm",
    "choose_form", "clear_compiled",
    "run_chunks", "ChunkRun", "MemoryOutputs", "BlockProgress",
]


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


def plan_memory(spec: SweepSpec, n_devices: int = 1, **kwargs) -> memory.Plan:
    """The memory plan of `spec` (`memory.plan`, with a prediction sweep's sizes)."""
    return memory.plan(spec, n_devices, **kwargs)


def fingerprints(spec: SweepSpec) -> list[str]:
    """The fingerprints of the grid's models, which a resume checks."""
    return sorted({fingerprint(m) for m in spec.point_mdps()})


def updates(spec: SweepSpec) -> int:
    """The sweep's work: every grid point's seeds' updates (`tuning.choose_form` weighs it)."""
    return spec.num_points * spec.seeds * spec.steps


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
        `memory_budget`); a group of fewer points runs padded to its bucket
        size (`engine.buckets.bucket`), never past it. Results do not depend on it.
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
        `choose_form`'s: on the CPU a lighter compile for sweeps
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
    check_dtype(spec)
    devices = list(devices) if devices is not None else jax.devices()
    if chunk_size is not None:
        chunk_size = plan_chunk(spec, chunk_size, len(devices))
    pl = memory_plan or plan_memory(spec, len(devices), memory_budget=memory_budget, chunk_size=chunk_size,
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
    """A run's `SweepResult.meta`: where and how it ran (`protocol.run_meta`,
    with the memory plan's layout), and its timings and updates."""
    layout = {"num_programs": len(groups), "seeds_per_call": pl.seeds, "blocks_per_segment": pl.blocks,
              "memory_estimate": {"device_bytes_per_call": pl.device_bytes, "host_bytes": pl.host_bytes,
                                  "disk_bytes": pl.disk_bytes, "budget": pl.budget}}
    work = {"updates": spec.num_points * spec.seeds * spec.steps,
            "updates_per_s": (ran.computed_points * spec.seeds * spec.steps / ran.run_time_s
                              if ran.run_time_s > 0 and ran.computed_points else None),
            "env_fingerprints": sorted({fingerprint(m) for g in groups for m in g.models})}
    return run_meta(devices, pl.grid, len(chunks), ran, resumed, layout, work)


def _joint_key(spec, devices) -> tuple | None:
    """(key, memory plan) of `spec` for `run_many`: the key is what sweeps must
    share to run as one program, everything but the algorithm and its
    hyperparameters, and the models (in order: a point's model index must name
    the same model in every sweep). None when `spec` cannot share (several
    chunks, groups or calls, logs too large to hold, or several processes)."""
    if spec.engine.KIND != KIND or jax.process_count() > 1:  # another front's sweep runs on its own
        return None
    groups = plan_groups(spec)
    if len(groups) != 1:
        return None
    pl = memory.plan(spec, len(devices), device=devices[0])
    if pl.segmented or pl.grid < spec.num_points or memory.log_bytes(spec) > memory.LAZY_LOG_BYTES:
        return None  # several calls, or logs that a run into a directory would stream to disk
    d = spec.to_dict()
    for field in ("algorithm", "hyperparameters"):
        d.pop(field, None)
    return (json.dumps(d, sort_keys=True, default=str), tuple(fingerprint(m) for m in groups[0].models)), pl


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
        chunks.append(chunk._replace(indices=pad(chunk.indices, n_dev)))
    sizes = [len(c.indices) for c in chunks]
    updates = sum(s.num_points * s.seeds * s.steps for s in specs)
    form = tuning.choose_form(specs[0], devices, groups[0], compiler_options, updates=updates)
    t = time.perf_counter()
    memo = tuple(memo_key(s, g, n, devices, form, "prediction")
                 for s, g, n in zip(specs, groups, sizes)) + ("joint",)

    def inputs(placed):  # (seed, one grid chunk per sweep), placed as the program wants them
        return (place(np.uint32(specs[0].seed), placed[0]),
                tuple({k: place(v, placed[1]) for k, v in chunk_grid(s, g, c).items()}
                      for s, g, c in zip(specs, groups, chunks)))

    hit, made = memo_get(memo), 0
    if hit is None:
        program = make_joint_program(list(zip(specs, groups, sizes)), devices, form)
        placed = placements(program.mesh, devices[0])
        args = inputs(placed)
        hit, made = (clock.compile_program(program.fn, args, form.compiler_options), placed), 1
        memo_put(memo, hit)
    else:
        args = inputs(hit[1])
    compile_time = time.perf_counter() - t if made else 0.0
    t = time.perf_counter()
    out = fetch(execute.call(hit[0], *args))
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
