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

`run` does it all: `plan` (groups and chunks, `prediction.plan`),
`make_program` (compile, `prediction.programs`), `run_chunks` (execute, with
resume, `engine.execute`), `assemble` (the `SweepResult`). `run_many` runs
several sweeps, one program for those that differ only in algorithm and step
sizes (`prediction.programs.make_joint_program`), each result as `run` gives
it (`engine.joint`). This module is the prediction front of the engine
(`engine.protocol.Engine`), as `bec_jax.control.sweep` is the control front:
the engine's hooks that live in the prediction package are bound below.
"""
from __future__ import annotations

import json
import sys
import warnings
from typing import Callable

import jax
import numpy as np

from bec_jax import moved
from bec_jax.engine import execute, joint, memory, search
from bec_jax.engine.execute import ChunkRun
from bec_jax.engine.plan import Chunk, Group, pad
from bec_jax.engine.programs import split_joint as split_by_device
from bec_jax.engine.protocol import check_dtype, gather, run_meta
from bec_jax.files import NpyFile
from bec_jax.mdp import fingerprint
from bec_jax.prediction import plan as planning
from bec_jax.prediction import programs, results
from bec_jax.prediction import sizes as prediction_sizes
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import SweepSpec
from bec_jax.theory import metrics

KIND = "prediction"
SEGMENTS = True         # a chunk may run in time segments and seed chunks
SERIAL_FUSIONS = False  # its CPU programs keep XLA's parallel task assigner
_FRONT = sys.modules[__name__]  # this module: the front the engine is handed

# The engine's hooks (`engine.protocol.Engine`) that live in the prediction package.
chunk_grid = planning.chunk_grid
updates = planning.updates
make_program = programs.make_program
make_segment_programs = programs.make_segment_programs
run_chunks = execute.run_chunks  # called with `engine=` this module
prefetch_summary = results.prefetch_summary  # the summary's work of the spec alone, started early

__all__ = ["run", "run_many", "shared_programs", "cost_note", "assemble", "plan_memory", "fingerprints"]

# Names the docs showed as `sweep.X` up to 0.4, now read where they live (one
# `DeprecationWarning` each, `moved.warn`): {name: (module, attribute)}.
MOVED = {
    "CPU_COMPILER_OPTIONS": ("bec_jax.engine.tuning", "CPU_COMPILER_OPTIONS"),
    "CPU_LIGHT_OPTIONS": ("bec_jax.engine.tuning", "CPU_LIGHT_OPTIONS"),
    "KernelForm": ("bec_jax.engine.tuning", "KernelForm"),
    "choose_form": ("bec_jax.engine.tuning", "choose_form"),
    "seed_keys": ("bec_jax.prediction.streams", "seed_keys"),
    "seed_transitions": ("bec_jax.prediction.streams", "seed_transitions"),
}


def __getattr__(name: str):
    """An old name of this module (`MOVED`), read where it lives now, with one
    warning. `choose_form` comes with this front bound (`front=`), as the old
    `sweep.choose_form` weighed a prediction sweep's work."""
    if name not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import functools
    import importlib
    module, attr = MOVED[name]
    moved.warn(f"{__name__}.{name}", f"{module}.{attr}")
    found = getattr(importlib.import_module(module), attr)
    return functools.partial(found, front=_FRONT) if name == "choose_form" else found


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
    the divergence check should have caught such a run, so the numbers are suspect.
    A search's points stopped early (alive -1 where they did not run: NaN
    statistics and finals) are not suspect."""
    # Memory-mapped logs were checked segment by segment as they were written.
    bad = {k: int((np.isnan(cat[k]) & (cat["alive"] >= 0)[:, None, :]).sum()) for k in ("mean", "std", "sem")
           if not isinstance(cat[k], np.memmap)}
    alive_final = ((cat["diverged_step"] < 0) & (np.asarray(cat["alive"][:, -1:]) >= 0))[:, None, :]
    bad["final of surviving seeds"] = int((~np.isfinite(cat["final"]) & alive_final).sum())
    bad = {k: v for k, v in bad.items() if v}
    if bad:
        warnings.warn("sweep: non-finite values that the divergence check did not flag ("
                      + ", ".join(f"{k}: {v}" for k, v in bad.items())
                      + "); these statistics are not trustworthy", RuntimeWarning, stacklevel=3)


def plan_memory(spec: SweepSpec, n_devices: int = 1, **kwargs) -> memory.Plan:
    """The memory plan of `spec` (`memory.plan`, with a prediction sweep's sizes, `prediction.sizes`).
    A search's: every grid point and seed in one call on one device, no time
    segments; a one-line `memory.TooLarge` where that does not fit."""
    if spec.search is None:
        return prediction_sizes.plan_memory(spec, n_devices, **kwargs)
    kwargs = {**kwargs, "chunk_size": spec.num_points, "seed_chunk": None, "segment_blocks": log_blocks(spec)}
    pl = prediction_sizes.plan_memory(spec, 1, **kwargs)
    return search.check_fits(pl, spec.num_points, spec.seeds, extra=f" x {log_blocks(spec)} log blocks",
                             fewer="seeds, grid points or log points (a larger log_every)", split=pl.seeds < spec.seeds)


def plan_chunk(spec: SweepSpec, chunk_size: int | None = None, n_devices: int = 1,
               memory_budget: int | None = None) -> int:
    """Grid points per compiled call (`prediction.plan.plan_chunk`); a search's: every point, in one call."""
    if spec.search is not None:
        return spec.num_points
    return planning.plan_chunk(spec, chunk_size, n_devices, memory_budget)


def plan(spec: SweepSpec, chunk: int) -> tuple[list[Group], list[Chunk]]:
    """The groups and chunks (`prediction.plan.plan`); a search's: its one
    group in one chunk, unpadded (the search ranks every point, and only them)."""
    if spec.search is not None:
        (group,) = planning.plan_groups(spec)
        G = spec.num_points
        return [group], [Chunk(0, np.arange(G), G)]
    return planning.plan(spec, chunk)


def num_chunks(spec: SweepSpec, chunk: int) -> int:
    """How many compiled calls a sweep of `spec` makes with chunks of `chunk` points."""
    return len(plan(spec, chunk)[1])


def fingerprints(spec: SweepSpec) -> list[str]:
    """The fingerprints of the grid's models, which a resume checks."""
    return sorted({fingerprint(m) for m in spec.point_mdps()})


def program_sources(spec: SweepSpec) -> tuple:
    """The metrics' builders, baked into the program (a metric registered again
    under its name bakes other constants in): for the executable caches' keys."""
    return tuple(metrics.metric_def(m).build for m in spec.metrics)


def log_blocks(spec: SweepSpec) -> int:
    """The log blocks of a run (a segmented run's time axis)."""
    return spec.steps // spec.log_every


def log_shapes(spec: SweepSpec, n: int) -> dict:
    """{name: (shape, dtype)} of the logs of a chunk of `n` points, which a
    segmented run writes its reports into."""
    M, L, dt = len(spec.metrics), log_blocks(spec), np.dtype(spec.dtype)
    return {"mean": ((n, M, L + 1), dt), "std": ((n, M, L + 1), dt), "sem": ((n, M, L + 1), dt),
            "alive": ((n, L + 1), np.int32)}


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
        auc_seed=np.moveaxis(cat["auc_seed"], 0, 1) if "auc_seed" in cat else None, meta=dict(meta or {}),
        stopped_rung=cat.get("stopped_rung"), rung_scores=cat.get("rung_scores"))


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
        `memory.default_budget`: three quarters of what a GPU has free; on a CPU
        `memory.DEFAULT_BUDGET` or half the host's free memory, the less). A
        sweep whose grid point does not fit with all its seeds runs in seed
        chunks; one longer than `memory.segment_updates` updates per call runs
        in time segments (`memory.plan`). Results do not depend on either, bit
        for bit.
      progress: True: a line per chunk (or time segment) and, while a call
        runs, a line that ticks once a second; False: none; None (default):
        the lines once a run has taken 2 s, the ticking one only where stderr
        is a terminal. They are the host's: the program is the same either
        way, and results do not depend on it.
      compiler_options: XLA options for the compile (default
        `engine.tuning.choose_form`'s: on the CPU a lighter compile for sweeps
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
    if spec.search is not None:  # every point in one call, on one device
        devices, chunk_size = devices[:1], None
    if chunk_size is not None:
        chunk_size = plan_chunk(spec, chunk_size, len(devices))
    pl = memory_plan or plan_memory(spec, len(devices), memory_budget=memory_budget, chunk_size=chunk_size,
                                    seed_chunk=seed_chunk, segment_blocks=segment_blocks, device=devices[0],
                                    out=out)
    chunk = pl.grid
    groups, chunks = plan(spec, chunk)
    ran = run_chunks(spec, groups, chunks, devices, done=done_chunks, compiler_options=compiler_options,
                     on_chunk=on_chunk, progress=progress, seeds_per_call=pl.seeds,
                     blocks_per_segment=pl.blocks, outputs=outputs, on_segment=on_segment, engine=_FRONT)
    meta = _meta(spec, devices, pl, groups, chunks, ran, len(done_chunks or {}))
    return assemble(spec, groups, chunks, ran.results, meta, alloc=alloc)


def _meta(spec: SweepSpec, devices, pl, groups: list[Group], chunks: list[Chunk], ran: ChunkRun,
          resumed: int = 0) -> dict:
    """A run's `SweepResult.meta`: where and how it ran (`protocol.run_meta`,
    with the memory plan's layout), and its timings and updates."""
    layout = {"num_programs": len(groups), "seeds_per_call": pl.seeds, "blocks_per_segment": pl.blocks,
              "memory_estimate": {"device_bytes_per_call": pl.device_bytes, "host_bytes": pl.host_bytes,
                                  "disk_bytes": pl.disk_bytes, "budget": pl.budget}}
    full = spec.num_points * spec.seeds * spec.steps
    updates, computed, more = full, ran.computed_points * spec.seeds * spec.steps, {}
    if spec.search is not None:  # the updates the search ran: each rung's points for its steps
        sched = spec.search_schedule()
        updates = sched.run_blocks(spec.seeds) * spec.log_every
        computed = updates if ran.computed_points else 0
        more["search"] = {**spec.search, "rung_steps": [e * spec.log_every for e in sched.ends],
                          "rung_points": list(sched.points), "full_run_steps": full, "search_run_steps": updates}
    work = {"updates": updates,
            "updates_per_s": computed / ran.run_time_s if ran.run_time_s > 0 and computed else None,
            "env_fingerprints": sorted({fingerprint(m) for g in groups for m in g.models}), **more}
    return run_meta(devices, pl.grid, len(chunks), ran, resumed, layout, work)


# -- joint runs: the hooks of `engine.joint` ----------------------------------------

def joint_key(spec, devices) -> tuple | None:
    """(key, memory plan) of `spec` for `run_many`: the key is what sweeps must
    share to run as one program, everything but the algorithm and its
    hyperparameters, and the models (in order: a point's model index must name
    the same model in every sweep). None when `spec` cannot share (another
    front's, several chunks, groups or calls, logs too large to hold, or
    several processes)."""
    if getattr(spec, "KIND", None) != KIND or jax.process_count() > 1:  # another front's sweep runs on its own
        return None
    if spec.search is not None:  # a search is a program of its own (every point in one call)
        return None
    groups = planning.plan_groups(spec)
    if len(groups) != 1:
        return None
    pl = prediction_sizes.plan_memory(spec, len(devices), device=devices[0])
    if pl.segmented or pl.grid < spec.num_points or prediction_sizes.log_bytes(spec) > memory.LAZY_LOG_BYTES:
        return None  # several calls, or logs that a run into a directory would stream to disk
    d = spec.to_dict()
    for field in ("algorithm", "hyperparameters"):
        d.pop(field, None)
    return (json.dumps(d, sort_keys=True, default=str), tuple(fingerprint(m) for m in groups[0].models)), pl


def fits_together(specs: list, devices) -> bool:
    """Whether sweeps of one key fit one call together (`prediction.sizes.fits_together`)."""
    return prediction_sizes.fits_together(specs, len(devices), device=devices[0])


def joint_chunks(specs: list, infos: list, devices) -> tuple[list, list]:
    """Each sweep's one group and one chunk (as its memory plan lays it out),
    padded to a multiple of the device count."""
    groups, chunks = [], []
    for spec, pl in zip(specs, infos):  # each sweep's memory plan
        (group,), (chunk,) = plan(spec, pl.grid)  # one group, one chunk: why it could share
        groups.append(group)
        chunks.append(chunk._replace(indices=pad(chunk.indices, len(devices))))
    return groups, chunks


def joint_grid(spec: SweepSpec, group: Group, chunk: Chunk, n_devices: int) -> dict:
    """One member's grid input (`chunk_grid`; its chunk is padded already)."""
    return chunk_grid(spec, group, chunk)


def joint_program(specs: list, groups: list, sizes: list, devices, form):
    """The joint program of the sweeps (`programs.make_joint_program`)."""
    return programs.make_joint_program(list(zip(specs, groups, sizes)), devices, form)


def split_joint(out: dict, sizes: list, n_devices: int) -> list[dict]:
    """The joint program's outputs cut into each member's (`engine.programs.split_joint`)."""
    return split_by_device(out, sizes, n_devices)


def joint_meta(specs: list, m: int, group: Group, chunk: Chunk, ran: ChunkRun, info, devices, form,
               run_time: float) -> tuple:
    """(meta, more): member m's `SweepResult.meta` as `run` gives it; the first
    member's updates per second are the whole program's."""
    more = {}
    if m == 0:
        total = sum(updates(s) for s in specs)
        more["updates_per_s"] = total / run_time if run_time > 0 else None
    return _meta(specs[m], devices, info, [group], [chunk], ran), more  # info: the member's memory plan


def shared_programs(specs: list, devices=None) -> list[list[int]]:
    """How `run_many` runs `specs`: lists of their indices, one per compiled
    program (a list of one: that sweep runs alone, by `run`)."""
    return joint.shared_programs(specs, _FRONT, devices)


def run_many(specs: list, *, devices=None, compiler_options: dict | None = None,
             progress: bool | None = False) -> list[SweepResult]:
    """Runs every sweep of `specs`; returns their `SweepResult`s in order, each
    bit for bit what `run(spec)` returns.

    Sweeps that differ only in their algorithm and its hyperparameters (the
    four algorithms of one task, say) and each fit in one call share one
    compiled program, as many together as fit one call
    (`prediction.sizes.fits_together`): a compile is most of the cost of a
    small sweep. The rest run one by one with `run` (`shared_programs` tells
    which). A shared program's compile and run times are in the meta of the
    first sweep it ran (with `shared_program`, the algorithms it ran, and
    `shared_program_index`, each sweep's place among them; `cost_note` says
    it in a line). The runner is the engine's, `engine.joint.run_many`."""
    return joint.run_many(specs, _FRONT, devices=devices, compiler_options=compiler_options, progress=progress)


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
