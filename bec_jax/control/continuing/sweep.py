"""The continuing control front of the engine (`bec_jax.engine.protocol.Engine`):
plans, runs and assembles continuing sweeps; the program itself is
`continuing.program`.

One sweep runs by `run`: chunks of the grid that fit the memory budget
(`memory.plan` with this front's `sizes`), each one compiled call of every
seed of its points (`engine.execute.run_chunks`: resume, parts, the
executable caches); `assemble` lays the chunks out in grid order. There are
no time segments or seed chunks (a run's logs are O(L)), no divergence
freeze (a continuing run always does its T steps; a blown-up learner shows in
`max_abs_w`) and no block progress bar (no host callbacks in the program).
Several sweeps run one by one (`run_many`): a joint program is left for later
(`joint_key` is None, so `shared_programs` gives singletons).
"""
from __future__ import annotations

import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax import networks, replay
from bec_jax.control.continuing import deep, program
from bec_jax.control.continuing.results import ContinuingResult
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.control.grid import task_groups
from bec_jax.engine import execute, joint, memory, search
from bec_jax.engine.plan import Chunk, Group
from bec_jax.engine.programs import Program
from bec_jax.engine.protocol import check_dtype, chunk_points, gather, run_meta, whole_points

KIND = "continuing"     # its specs' `KIND` (`ContinuingSpec.KIND`), part of the executable caches' keys
STEP_COST = 100         # a continuing step's cost in prediction updates (`updates`), as a control step's
SERIAL_FUSIONS = True   # its programs are many small dependent steps (`tuning.CPU_SERIAL_OPTIONS`)
SEGMENTS = False        # a chunk runs every seed of its points in one call
STATE_COPIES = 4        # live copies of the learner state in a step (the scans' carries, the update's)
LOOP_BYTES = 256        # a run's loop state (task state, features, keys, the block's sums)
DEEP_FLOPS_PER_UPDATE = 10  # a prediction update's order of arithmetic, to weigh a network's work (`updates`)
NET_COPIES = 6          # a network learner's parameter copies: network, target, Adam's m and v, gradient, step
UPDATE_ROW_UNITS = 4    # an update's live floats per row and unit: activations, their gradients, the target's pass
_FRONT = sys.modules[__name__]  # this module: the front the engine is handed

__all__ = ["KIND", "SEGMENTS", "SERIAL_FUSIONS", "serial_fusions", "assemble", "chunk_grid", "fingerprints",
           "make_program", "num_chunks", "plan", "plan_chunk", "plan_memory", "program_sources", "run",
           "run_chunks", "run_many", "shared_programs", "sizes", "updates"]


def deep_sizes(spec: ContinuingSpec, platform: str = "cpu", n_devices: int = 1) -> memory.Sizes:
    """The memory plan's terms of a network learner's sweep. A run holds its
    replay ring (`replay.nbytes`), `NET_COPIES` copies of the network's
    parameters (the network, its target, Adam's two moments, the gradient and
    the step), an update's working arrays (`UPDATE_ROW_UNITS` floats per row
    and unit: the full ring's C + 1 rows, or the batch), its loop state and
    its logs. Where a call runs its runs a batch at a time
    (`program.deep_batch`: on a CPU), only a batch per device is live
    (`Sizes.per_call`) beside every run's logs; elsewhere every run at once."""
    item = np.dtype(spec.dtype).itemsize
    st = spec.settings
    params = networks.num_params(st.layers) * item
    work = st.rows * (UPDATE_ROW_UNITS * sum(st.layers[1:]) + 2 * st.layers[0]) * item
    logs = spec.num_blocks * 3 * item
    state = replay.nbytes(st.buffer, st.layers[0], item) + NET_COPIES * params
    lane = state + work + LOOP_BYTES
    batch = program.deep_batch(spec, platform)
    in_turn = batch < program.DEEP_BATCH_RUNS
    return memory.Sizes(item=item, metrics=0, state=state, per_run=2 * logs + (0 if in_turn else lane),
                        per_seed=32, report_stats=0, report_seed=0, finals=logs, carry=0, log_points=1,
                        block_steps=spec.block_steps, per_call=n_devices * batch * lane if in_turn else 0,
                        run_logs=spec.num_blocks)


def sizes(spec: ContinuingSpec, platform: str = "cpu", n_devices: int = 1) -> memory.Sizes:
    """This front's terms of the memory plan (`memory.Sizes`): per run, the
    learner state (a few live copies), the loop state and the logs (L blocks
    of three numbers, the scan's and the output's copies); as finals the Q
    table of a tabular task. No reports over seeds, nothing carried between
    calls. A network learner's: `deep_sizes` (on `platform`, with `n_devices`)."""
    if deep.is_deep(spec.algorithm_def):
        return deep_sizes(spec, platform, n_devices)
    item = np.dtype(spec.dtype).itemsize
    task = max((spec.make_task(c) for c in spec.task_combinations()),  # the largest of the task axes' tasks
               key=lambda t: (t.num_features, t.num_states * t.num_actions))
    shapes = jax.eval_shape(spec.algorithm_def.init, jax.ShapeDtypeStruct((task.num_features,), jnp.dtype(spec.dtype)))
    state = sum(int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize for leaf in jax.tree_util.tree_leaves(shapes))
    logs = spec.num_blocks * 3 * item
    finals = task.num_states * task.num_actions * item
    return memory.Sizes(item=item, metrics=0, state=state, per_run=STATE_COPIES * state + LOOP_BYTES + 2 * logs,
                        per_seed=32, report_stats=0, report_seed=0, finals=logs + finals, carry=0, log_points=1,
                        block_steps=spec.block_steps, run_logs=spec.num_blocks)


def plan_memory(spec: ContinuingSpec, n_devices: int = 1, **kwargs) -> memory.Plan:
    """`memory.plan` with this front's `sizes` (kwargs as its; `device` sets
    the platform a network learner's sizes are for); refuses a plan in seed
    chunks, which this front does not run, and a network learner's run that
    cannot fit, with its sizes."""
    device = kwargs.get("device") or jax.devices()[0]
    if spec.search is not None:  # one call of every point, on one device
        n_devices, kwargs = 1, {**kwargs, "chunk_size": spec.num_points}
    sz = sizes(spec, device.platform, n_devices)
    if deep.is_deep(spec.algorithm_def):
        check_deep_fits(spec, sz, kwargs.get("memory_budget"), device)
    pl = whole_points(memory.plan(spec, n_devices, sz=sz, **kwargs), spec, sz, "a continuing sweep")
    return search.check_fits(pl, spec.num_points, spec.seeds) if spec.search is not None else pl


def check_deep_fits(spec: ContinuingSpec, sz: memory.Sizes, memory_budget, device) -> None:
    """A one-line `memory.TooLarge` where one grid point's runs of a network
    learner do not fit the budget, naming the replay buffer's and the update's
    sizes and what to lower."""
    one_point = memory.call_bytes(sz, 1, spec.seeds, 1, False)
    budget = memory.default_budget(device) if memory_budget is None else int(memory_budget)
    if one_point <= budget:
        return
    st = spec.settings
    ring = replay.nbytes(st.buffer, st.layers[0], sz.item)
    work = st.rows * (UPDATE_ROW_UNITS * sum(st.layers[1:]) + 2 * st.layers[0]) * sz.item
    raise memory.TooLarge(
        f"memory_budget: one grid point's {spec.seeds} runs of {spec.algorithm} need about "
        f"{memory.human(one_point)} of device memory (a run: a replay buffer of {st.buffer:,} transitions, "
        f"{memory.human(ring)}; the update's working arrays over {st.rows:,} rows, {memory.human(work)}); the "
        f"budget is {memory.human(budget)}; raise --memory-budget, or lower learner_params.buffer or batch, or use "
        "fewer seeds")


def plan_chunk(spec: ContinuingSpec, chunk_size: int | None = None, n_devices: int = 1,
               memory_budget: int | None = None) -> int:
    """Grid points per compiled call (`engine.protocol.chunk_points`); a
    search's: every point, in one call."""
    if spec.search is not None:
        return spec.num_points
    return chunk_points(plan_memory, spec, chunk_size, n_devices, memory_budget)


def plan(spec: ContinuingSpec, chunk: int) -> tuple[list, list]:
    """(groups, chunks) as the engine takes them (`engine.plan`), in chunks of
    at most `chunk` points: one group of every point (one program: every
    setting is a traced column), or with task axes one group per combination
    of their values, each its own task and program (`Group.static` holds the
    values), as episodic control's untraced task axes (`control.sweep.plan`).
    A search: every point in one chunk, unpadded (the search ranks them all)."""
    if spec.search is not None:
        G = spec.num_points
        return [Group(np.arange(G), [], np.zeros(G, np.int32), ())], [Chunk(0, np.arange(G), G)]
    return task_groups(spec, chunk)


def num_chunks(spec: ContinuingSpec, chunk: int) -> int:
    """How many compiled calls a sweep of `spec` makes with chunks of `chunk` points."""
    return len(plan(spec, chunk)[1])


def fingerprints(spec: ContinuingSpec) -> list[str]:
    """What a resume checks beyond the spec: nothing (a task is code, named in the spec)."""
    return []


def serial_fusions(spec: ContinuingSpec) -> bool:
    """`SERIAL_FUSIONS` for a linear learner's program; False for a network
    learner's, whose update is large products and elementwise passes over its
    rows that XLA:CPU's parallel task assigner splits over the cores."""
    return SERIAL_FUSIONS and not deep.is_deep(spec.algorithm_def)


def updates(spec: ContinuingSpec) -> int:
    """The sweep's work in prediction updates, which `tuning.choose_form`
    weighs: every run's steps, a step counted as `STEP_COST` updates; a
    network learner's, its products' FLOPs over `DEEP_FLOPS_PER_UPDATE`."""
    if deep.is_deep(spec.algorithm_def):
        return int(deep.sweep_flops(spec) // DEEP_FLOPS_PER_UPDATE)
    return spec.num_points * spec.seeds * spec.steps * STEP_COST


def chunk_grid(spec: ContinuingSpec, group, chunk) -> dict:
    """The program's input for one chunk: its points' grid columns
    (`program.grid_inputs`), less the task axes (fixed in the group's task)."""
    cols = program.grid_inputs(spec, group.indices[chunk.indices])
    return {n: v for n, v in cols.items() if n not in spec.task_axes}


def make_program(spec: ContinuingSpec, group=None, chunk: int = 1, devices=None, form=None) -> Program:
    """The program (`engine.programs.Program`) for chunks of `chunk` grid
    points (`continuing.program.make_program`). `form` is the interface's and
    unused (the compiler options it names are given when compiling). With task axes the program is that of
    the group's task (`ContinuingSpec.for_task` at `group.static`)."""
    return program.make_program(spec.for_task(dict(group.static)) if group is not None else spec, group, chunk,
                                devices)


def program_sources(spec: ContinuingSpec) -> tuple:
    """The task's code the programs bake in, for the executable caches' keys
    (`ContinuingSpec.program_sources`)."""
    return tuple(spec.program_sources())


def assemble(spec: ContinuingSpec, groups, chunks, results: dict, meta: dict | None = None) -> ContinuingResult:
    """The `ContinuingResult` in grid order from every chunk's outputs."""
    cat = gather(spec.num_points, groups, chunks, results)
    # The block means, divided here in the spec's dtype (IEEE division, as a
    # replay of the runs divides; `program.make_run`).
    reward = cat["reward_sum"] / np.asarray(spec.block_steps, cat["reward_sum"].dtype)
    return ContinuingResult(spec=spec, grid=spec.grid_arrays(), reward=reward,
                            rate_estimate=cat["rate_estimate"], max_abs_w=cat["max_abs_w"],
                            q_table=cat.get("q_table"), meta=dict(meta or {}),
                            stopped_rung=cat.get("stopped_rung"), rung_scores=cat.get("rung_scores"))


run_chunks = execute.run_chunks  # called with `engine=` this module


def run(spec: ContinuingSpec, *, chunk_size: int | None = None, devices=None, memory_budget: int | None = None,
        progress: bool | None = None, compiler_options: dict | None = None,
        on_chunk: Callable[[int, dict], None] | None = None,
        done_chunks: dict[int, dict] | None = None, memory_plan: memory.Plan | None = None,
        out: str | None = None, outputs=None, on_segment: Callable | None = None,
        alloc: Callable | None = None) -> ContinuingResult:
    """Runs the continuing sweep and returns a `ContinuingResult` (arguments as
    `bec_jax.control.sweep.run`: chunk_size, devices, memory_budget, progress,
    compiler_options, on_chunk, done_chunks, memory_plan, out). `outputs`,
    `on_segment` and `alloc` are the interface's and unused: a chunk runs in
    one call, and its logs are small."""
    check_dtype(spec)
    devices = list(devices) if devices is not None else jax.devices()
    if spec.search is not None:  # every point in one call, on one device
        devices, chunk_size = devices[:1], None
    if chunk_size is not None:
        chunk_size = plan_chunk(spec, chunk_size, len(devices))
    pl = memory_plan or plan_memory(spec, len(devices), memory_budget=memory_budget, chunk_size=chunk_size,
                                    device=devices[0], out=out)
    groups, chunks = plan(spec, pl.grid)
    ran = run_chunks(spec, groups, chunks, devices, done=done_chunks, compiler_options=compiler_options,
                     on_chunk=on_chunk, progress=progress, engine=_FRONT)
    steps = ran.computed_points * spec.seeds * spec.steps
    work = {}
    if spec.search is not None:
        sched = spec.search_schedule()
        full = spec.num_points * spec.seeds * spec.steps
        steps = sched.run_blocks(spec.seeds) * spec.block_steps if ran.computed_points else 0
        work["search"] = {**spec.search, "rung_steps": [e * spec.block_steps for e in sched.ends],
                          "rung_points": list(sched.points), "full_run_steps": full,
                          "search_run_steps": sched.run_blocks(spec.seeds) * spec.block_steps}
    chunk = spec.num_points if spec.search is not None else pl.grid
    meta = run_meta(devices, chunk, len(chunks), ran, len(done_chunks or {}), work={
        "run_steps": steps, "steps_per_s": steps / ran.run_time_s if ran.run_time_s > 0 else None, **work})
    return assemble(spec, groups, chunks, ran.results, meta)


# -- joint runs: the hooks of `engine.joint` ----------------------------------------
# A continuing sweep always runs alone for now (`joint_key` is None), so
# `engine.joint` never calls the hooks that build a shared program; they are
# here for the interface, and say so if called.

def joint_key(spec: ContinuingSpec, devices) -> None:
    """None: a continuing sweep runs alone (no joint program yet)."""
    return None


def _alone(*args, **kwargs):
    raise NotImplementedError("continuing sweeps run alone (joint_key is None): no joint program")


fits_together = joint_chunks = joint_grid = joint_program = split_joint = joint_meta = _alone


def shared_programs(specs: list, devices=None) -> list[list[int]]:
    """How `run_many` runs `specs`: each alone, by `run` (`engine.joint.shared_programs`
    with `joint_key` None: a list of one index per sweep)."""
    return joint.shared_programs(specs, _FRONT, devices)


def run_many(specs: list, *, devices=None, compiler_options: dict | None = None,
             progress: bool | None = False) -> list[ContinuingResult]:
    """Runs every continuing sweep of `specs`, each by `run`, in order
    (`engine.joint.run_many`)."""
    return joint.run_many(specs, _FRONT, devices=devices, compiler_options=compiler_options, progress=progress)
