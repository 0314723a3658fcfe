"""The engine interface: what a front (a problem kind) gives the engine and the
runner, and the pieces every front shares.

A front is a module that plans and runs one kind of spec (the prediction
sweep's, the control sweep's); the table of kinds names each kind's front, and
the runner, the study runner and the command line call the front through this
interface and never ask what kind of spec they hold. The engine never imports
a front: `execute.run_chunks`, `joint.run_many`, `tuning.choose_form`,
`tuning.memo_key` and `program_cache.file_key` take the front as an argument.

Layout convention, the same for every front: a chunk's programs take
`(seed, grid)` -- the base seed (a uint32 scalar, replicated) and a dict of
(chunk,) grid columns, split over a 1-D device mesh on `programs.GRID_AXIS`
(`programs.jit_over_grid`) -- and return a dict of outputs with the grid axis
first; inside a program per-run arrays are seed-major where a front batches
seeds (`engine.layout`). `gather` lays every chunk's outputs out in grid order.
"""
from __future__ import annotations

from typing import Callable, Protocol

import jax
import numpy as np

from bec_jax import provenance
from bec_jax.engine import memory
from bec_jax.files import copy_rows


class Engine(Protocol):
    """What a front implements (a module satisfies it structurally).

    Attributes:
      KIND: the front's name ("prediction", "control"), its specs' `KIND` and
        part of the executable caches' keys.
      SEGMENTS: whether a chunk may run in time segments and seed chunks
        (`memory.Plan.segmented`); a front without them runs each chunk in one
        call and its memory plan refuses what does not fit.
      SERIAL_FUSIONS: whether its programs are many small dependent steps
        (optional `serial_fusions(spec)`: the same, per spec),
        compiled on a CPU with `tuning.CPU_SERIAL_OPTIONS`.

    Segmented runs (only a front with SEGMENTS): `make_segment_programs(spec,
    group, chunk, seeds, blocks, devices, form)` -> `programs.SegmentPrograms`;
    `log_blocks(spec)`, the log blocks of a run; `log_shapes(spec, n)`,
    {name: (shape, dtype)} of the logs of a chunk of `n` points, which
    `execute` writes a segment's reports into (mean, std, sem (n, M, L + 1),
    alive (n, L + 1)).

    Optional: `prefetch_summary(spec, start)`, the work its result's summary
    needs of the spec alone, started in a thread that the runner closes once
    the summary is written.
    """

    KIND: str
    SEGMENTS: bool
    SERIAL_FUSIONS: bool

    # -- planning and the memory plan

    def plan_memory(self, spec, n_devices: int = 1, **kwargs) -> memory.Plan:
        """The calibrated `memory.plan` of `spec` with the front's own size
        terms (`memory.Sizes`); kwargs as `memory.plan`'s."""

    def plan_chunk(self, spec, chunk_size: int | None = None, n_devices: int = 1,
                   memory_budget: int | None = None) -> int:
        """Grid points per compiled call (`round_chunk` of `chunk_size`, or the memory plan's)."""

    def plan(self, spec, chunk: int) -> tuple[list, list]:
        """(groups, chunks): `engine.plan.Group`s and `engine.plan.Chunk`s of at most `chunk` points."""

    def num_chunks(self, spec, chunk: int) -> int:
        """How many compiled calls a sweep of `spec` makes with chunks of `chunk` points."""

    def updates(self, spec) -> int | None:
        """The work of the whole sweep in updates, which `tuning.choose_form`
        weighs (None: a front whose programs always take the light compile)."""

    # -- programs

    def chunk_grid(self, spec, group, chunk) -> dict:
        """The program's grid input for one chunk: (chunk,) NumPy arrays."""

    def make_program(self, spec, group, chunk: int, devices=None, form=None):
        """An `engine.programs.Program`: `fn(seed, grid)` for chunks of `chunk`
        points. It holds no host callback (progress is the host's, between calls)."""

    def program_sources(self, spec) -> tuple:
        """The front's code a program of `spec` bakes in beyond the algorithm's
        (a metric's builder, a task's factory: functions, or strings such as a
        library's version; None for code no key can follow), for the keys of
        the executable caches (`tuning.memo_key`, `program_cache.file_key`)."""

    # -- running and results

    def run_chunks(self, spec, groups, chunks, devices, **kwargs):
        """An `execute.ChunkRun`: `engine.execute.run_chunks` (pass `engine=` the front)."""

    def assemble(self, spec, groups, chunks, results: dict, meta: dict | None = None):
        """The front's result in grid order from every chunk's outputs."""

    def run(self, spec, **kwargs):
        """Plans, runs and assembles a whole sweep (kwargs: chunk_size, devices,
        memory_budget, progress, compiler_options, on_chunk, done_chunks,
        memory_plan, out, outputs, on_segment, alloc)."""

    def fingerprints(self, spec) -> list[str]:
        """What a resume checks beyond the spec (the models' fingerprints; [] if none)."""

    # -- joint runs (`engine.joint`)

    def run_many(self, specs: list, **kwargs) -> list:
        """Every sweep's result, those that can share a program by one (`joint.run_many`)."""

    def shared_programs(self, specs: list, devices=None) -> list[list[int]]:
        """How `run_many` runs `specs` (`joint.shared_programs`)."""

    def joint_key(self, spec, devices) -> tuple | None:
        """(key, info): sweeps of one key may share a program; `info` (a
        memory plan, say) goes back to `joint_chunks` and `joint_meta`. None:
        `spec` runs alone (several calls, several processes)."""

    def fits_together(self, specs: list, devices) -> bool:
        """Whether sweeps of one key fit one call together."""

    def joint_chunks(self, specs: list, infos: list, devices) -> tuple[list, list]:
        """(groups, chunks): each sweep's one group and one chunk, padded as
        the joint program takes them."""

    def joint_grid(self, spec, group, chunk, n_devices: int) -> dict:
        """One member's grid input to a joint program."""

    def joint_program(self, specs: list, groups: list, sizes: list, devices, form):
        """One `engine.programs.Program` for the sweeps, `fn(seed, grids)`
        with one grid per member."""

    def split_joint(self, out, sizes: list, n_devices: int) -> list[dict]:
        """A joint program's outputs (fetched) cut into each member's."""

    def joint_meta(self, specs: list, m: int, group, chunk, ran, info, devices, form,
                   run_time: float) -> tuple[dict, dict]:
        """(meta, more): member m's meta, before the shared-program fields, and
        what follows them; from `ran` (an `execute.ChunkRun`, the compile and
        run times in the first member's) and the program's `run_time`."""


def check_dtype(spec) -> None:
    """Refuses a float64 spec outside JAX's 64-bit mode (before any work)."""
    if spec.dtype == "float64" and not jax.config.jax_enable_x64:
        raise ValueError("dtype: float64 needs JAX's 64-bit mode; set JAX_ENABLE_X64=1 "
                         "or jax.config.update('jax_enable_x64', True) before running")


def whole_points(pl: memory.Plan, spec, sz: memory.Sizes, what: str) -> memory.Plan:
    """`pl`, or for a front that runs every seed of a point in one call (no
    seed chunks) a one-line `memory.TooLarge` where one point's seeds do not
    fit its budget; `what` names the front's sweep ("a control sweep")."""
    if pl.segmented:
        raise memory.TooLarge(f"memory_budget: one grid point's {spec.seeds} seeds need about "
                              f"{memory.human(memory.call_bytes(sz, 1, spec.seeds, 1, False))} of device memory; "
                              f"the budget is {memory.human(pl.budget)}; raise --memory-budget or use fewer seeds "
                              f"({what} runs every seed of a point in one call)")
    return pl


def chunk_points(plan_memory: Callable, spec, chunk_size, n_devices: int, memory_budget) -> int:
    """Grid points per compiled call of a front: `chunk_size` rounded up to a
    multiple of the device count, or by default all that fit the front's
    memory plan (`plan_memory(spec, n_devices, memory_budget=...)`)."""
    if chunk_size is None:
        return plan_memory(spec, n_devices, memory_budget=memory_budget).grid
    return round_chunk(chunk_size, n_devices)


def round_chunk(chunk_size, n_devices: int) -> int:
    """A given chunk size, checked, rounded up to a multiple of the device count."""
    if not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool) or chunk_size <= 0:
        raise ValueError(f"chunk_size: must be a positive integer, got {chunk_size!r}")
    return -(-int(chunk_size) // n_devices) * n_devices


def gather(num_points: int, groups: list, chunks: list, results: dict, alloc: Callable | None = None) -> dict:
    """{output: array with the grid axis first, in grid order} from every
    chunk's outputs (`results[i]` for chunk i). `alloc(name, shape, dtype)`
    makes each array (default `np.empty`; for logs that stream to disk a
    `files.NpyFile`, written a slab at a time)."""
    alloc = alloc or (lambda name, shape, dtype: np.empty(shape, dtype))
    cat = {}
    for name in results[0]:
        first = results[0][name]
        arr = alloc(name, (num_points,) + first.shape[1:], first.dtype)
        for i, c in enumerate(chunks):
            copy_rows(arr, groups[c.group].indices[c.indices[: c.n]], results[i][name])
        cat[name] = arr
    return cat


def run_meta(devices, chunk: int, num_chunks: int, ran, resumed: int, layout: dict | None = None,
             work: dict | None = None) -> dict:
    """A run's meta record: where it ran (`provenance.collect`), its chunks,
    the front's `layout` fields, the programs compiled, the chunks resumed, the
    timings of `ran` (an `execute.ChunkRun`) and the front's `work` fields (what
    was computed and how fast), in that order."""
    return {
        **provenance.collect(devices),
        "chunk_size": chunk,
        "num_chunks": num_chunks,
        **(layout or {}),
        "compiled_programs": ran.programs,
        "resumed_chunks": resumed,
        "compile_time_s": ran.compile_time_s,
        "run_time_s": ran.run_time_s,
        **(work or {}),
    }
