"""The control front of the engine (`bec_jax.engine.protocol.Engine`): plans,
runs and assembles control sweeps; the program itself is `control.program`.

One sweep runs by `run` (chunks of the grid, resume and parts by
`engine.execute.run_chunks`); several sweeps of one task run by `run_many` in
one program (`shared_programs` says which). The memory plan (`memory.plan`
with this front's `sizes`), the chunks (`engine.plan.split`), the program
record and jit over the grid (`engine.programs`), the divergence check and
revert (`engine.divergence`), the float64 guard, `gather` and the meta record
(`engine.protocol`) are the engine's. It has no time segments or seed chunks:
a chunk runs every seed of its points in one call.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax.control import program
from bec_jax.control.grid import task_groups
from bec_jax.control.results import ControlResult
from bec_jax.control.spec import ControlSpec
from bec_jax.engine import execute, joint, memory, search
from bec_jax.engine.buckets import bucket
from bec_jax.engine.layout import state_axes
from bec_jax.engine.plan import Chunk, Group
from bec_jax.engine.programs import Program
from bec_jax.engine.protocol import check_dtype, chunk_points, gather, run_meta, whole_points

KIND = "control"
STEP_COST = 100         # a control step's cost in prediction updates (`updates`)
SERIAL_FUSIONS = True   # its programs are many small dependent steps (`tuning.CPU_SERIAL_OPTIONS`)
SEGMENTS = False        # a chunk runs every seed of its points in one call
STATE_COPIES = 4        # live copies of the learner state in a block (the scan's, the revert's)
LOOP_BYTES = 256        # a run's loop state (task state, features, counters) and keys
_FRONT = sys.modules[__name__]  # this module: the front the engine is handed


def sizes(spec: ControlSpec, fused: bool = False) -> memory.Sizes:
    """This front's terms of the memory plan (`memory.Sizes`): per run, the
    learner state (a few live copies), the loop state and the episode log (the
    scan's and the revert's copies); as finals, the returns, lengths, divergence
    step and omega. No log blocks, and nothing carried between calls (so the
    prediction kernel's CPU cache rule does not apply). Calibrated as the
    prediction terms are: a call's estimate is between 1 and 3 times what XLA
    allocates (tests/test_engine_protocol.py). With `fused`, the learner state
    is that of the algorithm the sweep's is a case of, as a shared program may
    run it (`program.fusion`)."""
    item = np.dtype(spec.dtype).itemsize
    d = max(spec.make_task(a).num_features for a in spec.task_combinations())  # the largest task's
    alg = program.cases(spec.algorithm_def)[-1][0] if fused else spec.algorithm_def
    shapes = jax.eval_shape(alg.init, jax.ShapeDtypeStruct((d,), jnp.dtype(spec.dtype)))
    axes = jax.tree_util.tree_leaves(state_axes(shapes, alg.counter), is_leaf=lambda a: a is None)
    state = sum(int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
                for leaf, ax in zip(jax.tree_util.tree_leaves(shapes), axes) if ax is not None)
    log = spec.episodes * (item + 4)
    return memory.Sizes(item=item, metrics=0, state=state, per_run=STATE_COPIES * state + LOOP_BYTES + 2 * log,
                        per_seed=32, report_stats=0, report_seed=0, finals=log + 4 + item, carry=0,
                        log_points=1, block_steps=spec.block_steps, run_logs=spec.episodes)


def plan_memory(spec: ControlSpec, n_devices: int = 1, **kwargs) -> memory.Plan:
    """`memory.plan` with this front's `sizes` (kwargs as its); refuses a plan
    in seed chunks, which this front does not run, and a search (every point
    in one call, on one device) that does not fit the budget whole."""
    if spec.search is not None:
        n_devices, kwargs = 1, {**kwargs, "chunk_size": spec.num_points}
    sz = sizes(spec)
    pl = whole_points(memory.plan(spec, n_devices, sz=sz, **kwargs), spec, sz, "a control sweep")
    return search.check_fits(pl, spec.num_points, spec.seeds) if spec.search is not None else pl


def plan_chunk(spec: ControlSpec, chunk_size: int | None = None, n_devices: int = 1,
               memory_budget: int | None = None) -> int:
    """Grid points per compiled call (`engine.protocol.chunk_points`); a
    search's: every point, in one call."""
    if spec.search is not None:
        return spec.num_points
    return chunk_points(plan_memory, spec, chunk_size, n_devices, memory_budget)


def plan(spec: ControlSpec, chunk: int):
    """(groups, chunks) as the engine takes them (`engine.plan`), chunks of at
    most `chunk` points: one group of every point, or with task axes that
    cannot be traced (`ControlSpec.task_axes_traced`) one group per
    combination of their values, each its own task and program
    (`Group.static` holds the values). A search: every point in one chunk,
    unpadded (the search ranks them all)."""
    if spec.search is not None:
        G = spec.num_points
        return [Group(np.arange(G), [], np.zeros(G, np.int32), ())], [Chunk(0, np.arange(G), G)]
    return task_groups(spec, chunk, by_task=not spec.task_axes_traced)


def num_chunks(spec: ControlSpec, chunk: int) -> int:
    """How many compiled calls a sweep of `spec` makes with chunks of `chunk` points."""
    return len(plan(spec, chunk)[1])


def fingerprints(spec: ControlSpec) -> list[str]:
    """What a resume checks beyond the spec: nothing (a task is code, named in the spec)."""
    return []


def updates(spec: ControlSpec) -> int:
    """The sweep's work in prediction updates, which `tuning.choose_form` weighs:
    every run's step budget, a step counted as `STEP_COST` updates (a control
    step acts, steps the task and updates; measured in benchmarks/README.md).
    Small sweeps (tests, quick runs) get the light compile; the reproduction's
    sweeps run over twice as fast with the fusion emitters."""
    return spec.num_points * spec.seeds * spec.total_steps * STEP_COST


def chunk_grid(spec: ControlSpec, group, chunk) -> dict:
    """The program's input for one chunk: its runs' grid columns and seeds
    (`program.grid_inputs`)."""
    return program.grid_inputs(spec, group.indices[chunk.indices])


def make_program(spec: ControlSpec, group=None, chunk: int = 1, devices=None,
                 keep_state: bool = False, form=None) -> Program:
    """The program (`engine.programs.Program`) for chunks of `chunk` grid points
    (`control.program.make_program` with this one sweep). `form` is accepted for the engine's interface and
    ignored (the options it names are given when compiling). With `keep_state` it also
    returns the final learner states ("state": a pytree of (chunk, seeds, ...)
    arrays). A search's program is `program.make_search_program` (every
    point in one call; no final states)."""
    branches = form.branches if form is not None else None
    if spec.search is not None:
        if keep_state:
            raise ValueError("search: the final learner states are a full grid's (final_states); run the sweep "
                             "without a search")
        return program.make_search_program(spec, group, devices, branches)
    return program.make_program([spec], [chunk], devices, keep_state, group, branches=branches)


def assemble(spec: ControlSpec, groups, chunks, results: dict, meta: dict | None = None) -> ControlResult:
    """The `ControlResult` in grid order from every chunk's outputs."""
    cat = gather(spec.num_points, groups, chunks, results)
    return ControlResult(spec=spec, grid=spec.grid_arrays(), returns=cat["returns"], lengths=cat["lengths"],
                         diverged_step=cat["diverged_step"], omega=cat.get("omega"), meta=dict(meta or {}),
                         stopped_rung=cat.get("stopped_rung"), rung_scores=cat.get("rung_scores"))


def search_meta(spec: ControlSpec, out: dict) -> dict:
    """meta.json's `search` of a search's outputs `out` (one chunk of every
    point): the settings, the rungs' end steps (the last: the step budget;
    its runs end with their episodes) and points, the run-steps it computed
    (`search_run_steps`: every block each run was advanced while its point
    ran) and a lower bound of the full grid's (`full_run_steps_at_least`):
    the full grid advances every run until its slowest run has ended, and
    each run of the search is the full grid's up to where its point stopped
    (`program.searched`), so at least until the latest of: a survivor's run's
    end, a stopped run's end where it ended by its last rung, and one block
    past its last rung's end where it had not."""
    sched = spec.search_schedule()
    N, K = spec.seeds, spec.block_steps
    stopped = np.asarray(out["stopped_rung"])
    lengths, dstep = np.asarray(out["lengths"]), np.asarray(out["diverged_step"])
    ended = (lengths > 0).all(-1)
    finish = -(-lengths.astype(np.int64).sum(-1) // K)  # the block of a run's last episode's end
    going = np.where(stopped == sched.rungs - 1, sched.ends[-1], np.asarray(sched.ends)[stopped] + 1)[:, None]
    blocks = np.where(dstep >= 0, dstep // K, np.where(ended, finish, going))
    return {**spec.search, "rung_steps": [e * K for e in sched.ends], "rung_points": list(sched.points),
            "search_run_steps": int(np.asarray(out["units_run"], np.int64).sum()) * K,
            "full_run_steps_at_least": int(blocks.max()) * K * spec.num_points * N}


def run(spec: ControlSpec, *, chunk_size: int | None = None, devices=None, memory_budget: int | None = None,
        progress: bool | None = None, compiler_options: dict | None = None,
        on_chunk: Callable[[int, dict], None] | None = None,
        done_chunks: dict[int, dict] | None = None, memory_plan: memory.Plan | None = None,
        out: str | None = None, outputs=None, on_segment: Callable | None = None,
        alloc: Callable | None = None) -> ControlResult:
    """Runs the control sweep and returns a `ControlResult` (arguments as
    `bec_jax.prediction.sweep.run`: chunk_size, devices, memory_budget, progress,
    compiler_options, on_chunk, done_chunks, memory_plan, out). `outputs`,
    `on_segment` and `alloc` are the interface's and unused: a control chunk
    runs in one call, and its logs are small."""
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
    steps = int(sum(int(r["lengths"].sum()) for r in ran.results.values()))
    work = {"search": search_meta(spec, ran.results[0])} if spec.search is not None else {}
    meta = run_meta(devices, pl.grid, len(chunks), ran, len(done_chunks or {}), work={
        "logged_steps": steps,
        "steps_per_s": steps / ran.run_time_s if ran.run_time_s > 0 and not done_chunks else None, **work})
    if spec.task_axes:  # one program for every value, or one per value and why
        meta["task_axes"] = ("one program (traced)" if spec.task_axes_traced
                             else f"a program per value: {spec.task_axes_reason}")
    return assemble(spec, groups, chunks, ran.results, meta)


run_chunks = execute.run_chunks  # called with `engine=` this module


def program_sources(spec: ControlSpec) -> tuple:
    """The task's code the programs bake in, for the executable caches' keys
    (`ControlSpec.program_sources`)."""
    return tuple(spec.program_sources())


# -- joint runs: the hooks of `engine.joint` ----------------------------------------

def joint_key(spec: ControlSpec, devices) -> tuple | None:
    """(key, None): what sweeps must share to run as one program (everything
    but the algorithm and the grid); None when `spec` takes several calls."""
    if getattr(spec, "KIND", None) != KIND or jax.process_count() > 1 or spec.task_axes:  # a program per task
        return None
    if spec.search is not None:  # a search's program is its own (`program.make_search_program`)
        return None
    try:
        if plan_memory(spec, len(devices), device=devices[0]).grid < spec.num_points:
            return None
    except memory.TooLarge:
        return None
    d = spec.to_dict()
    for field in ("algorithm", "hyperparameters"):
        d.pop(field)
    return json.dumps(d, sort_keys=True, default=str), None


def fits_together(specs: list, devices) -> bool:
    """Whether sweeps of one key fit one call together: their calls' device
    bytes (each as a shared program may run it, `sizes(fused=True)`) within
    the default budget."""
    need = sum(memory.call_bytes(sizes(s, fused=True), bucket(s.num_points), s.seeds, 1, False) for s in specs)
    return need <= memory.default_budget(devices[0])


def joint_chunks(specs: list, infos: list, devices) -> tuple[list, list]:
    """Each sweep's one group and one chunk, padded as `run` pads it (the runs,
    not the points, are padded for the devices: `joint_grid`)."""
    planned = [plan(s, bucket(s.num_points)) for s in specs]
    return [g[0] for g, _ in planned], [c[0] for _, c in planned]


def joint_grid(spec: ControlSpec, group: Group, chunk, n_devices: int) -> dict:
    """One member's grid input (`program.grid_inputs`, its runs padded for the devices)."""
    return program.grid_inputs(spec, group.indices[chunk.indices], n_devices)


def _fused(form) -> bool:
    """Whether a joint program runs the cases of an algorithm as one member:
    where the compile is most of the cost, the light compile's small sweeps.
    Under the fusion emitters (over 10^7 run-steps) the cases' extra work and
    the runs that wait on the slowest of a larger member cost more than the
    compile saves (benchmarks/README.md, "One member for the cases of an
    algorithm")."""
    return form.emitters == "loop"


def joint_program(specs: list, groups: list, sizes: list, devices, form) -> Program:
    """One program for the sweeps (`control.program.make_program`)."""
    return program.make_program(list(specs), sizes, devices, fuse=_fused(form), branches=form.branches)


def split_joint(out, sizes: list, n_devices: int) -> list[dict]:
    """The joint program's outputs, one dict per member already."""
    return list(out)


def joint_meta(specs: list, m: int, group: Group, chunk, ran, info, devices, form, run_time: float) -> tuple:
    """(meta, more): member m's meta as `run` gives it, and the program's
    members, each the algorithm it runs as and the sweeps it runs
    (`program.fusion`)."""
    names = [s.algorithm for s in specs]
    members = [{"runs_as": f.host.name if f.host is not None else specs[f.sweeps[0]].algorithm,
                "sweeps": [names[i] for i in f.sweeps]} for f in program.fusion(list(specs), not _fused(form))]
    steps = int(ran.results[0]["lengths"].sum())
    return run_meta(devices, chunk.n, 1, ran, 0, work={
        "logged_steps": steps, "steps_per_s": steps / run_time if run_time > 0 else None}), {"members": members}


def shared_programs(specs: list, devices=None) -> list[list[int]]:
    """How `run_many` runs `specs`: lists of their indices, one per compiled
    program (a list of one: that sweep runs alone, by `run`). Sweeps join the
    program of the first sweep with their key while their calls' device bytes
    together fit the memory budget (`engine.joint.shared_programs`)."""
    return joint.shared_programs(specs, _FRONT, devices)


def run_many(specs: list, *, devices=None, compiler_options: dict | None = None,
             progress: bool | None = False) -> list[ControlResult]:
    """Runs every control sweep of `specs`; returns their `ControlResult`s in
    order, each what `run(spec)` returns, run for run (a run's randomness is its
    seed's: see `control.program`). Sweeps of one task that share their seeds,
    episodes and loop settings and differ in their algorithm and grid (every
    algorithm of a reproduction's task, say) run in one compiled program
    (`shared_programs`); a compile is much of the cost of a sweep. A shared
    program's compile and run times are in the meta of the first sweep it ran
    (with `shared_program`, the algorithms it ran, and `shared_program_index`);
    every sweep's meta has `members`: the program's members, each the algorithm
    it runs as and the sweeps it runs (`program.fusion`). The runner is the
    engine's, `engine.joint.run_many`."""
    return joint.run_many(specs, _FRONT, devices=devices, compiler_options=compiler_options, progress=progress)


def final_states(spec: ControlSpec):
    """(result, states): the sweep's `ControlResult` and every run's final
    learner state (a NamedTuple of (G, N, ...) arrays; the update counter is
    shared, shape ()). One chunk, no resume: meant for small sweeps whose
    learned weights you want to inspect (a greedy policy, say); not a search's."""
    if spec.search is not None:
        raise ValueError("search: the final learner states are a full grid's; give the spec without a search")
    chunk = spec.num_points
    groups, chunks = plan(spec, chunk)
    prog = make_program(spec, groups[0], chunk, jax.devices()[:1], keep_state=True)
    out = jax.device_get(prog.fn(np.uint32(spec.seed), chunk_grid(spec, groups[0], chunks[0])))
    state = out.pop("state")
    return assemble(spec, groups, chunks, {0: out}), state
