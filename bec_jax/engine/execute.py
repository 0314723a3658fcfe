"""Execution: running a sweep's chunks, in one call each or in segments.

`run_chunks` compiles each group's program once (or takes it from the process's
cache, `tuning.memo_get`), places a chunk's inputs on the devices, runs every
chunk not yet done and hands each chunk's outputs to `on_chunk`; the programs
are the front's (`engine.protocol.Engine`). A chunk whose memory plan asks for
it runs in time segments and seed chunks (the front's
`make_segment_programs`), its logs written as they come into `MemoryOutputs`
or the runner's chunk store, with checkpoints for resuming. Progress is the
host's: a line per chunk or segment, and a line that ticks while a long call
runs where someone watches (`watched`). No callback is compiled into a
program, so a run at a terminal runs the very program a run without one does
(and finds it in the caches).

Stopping. Inside `waits.stop_when(check)` a call's results are awaited in
short waits that ask `check()` between them: once it says stop, the call in
flight is abandoned (`waits.Stopped`; a segmented chunk keeps its last
finished segment), so a stop takes well under a second however long a call
runs, on any machine. The abandoned work is what a resume computes again, and
segments are kept to about `SEGMENT_SECONDS` each by their measured time, so
little is lost.
"""
from __future__ import annotations

import sys
import time
import warnings
from typing import Callable, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bec_jax.engine import clock, memory, program_cache, tuning
from bec_jax.engine.plan import Chunk, Group, pad
from bec_jax.engine.programs import GRID_AXIS, segment_mesh
from bec_jax.engine.seed_stats import combine_seeds
from bec_jax.engine.tuning import memo_get, memo_key, memo_put
from bec_jax.engine.waits import Stopped, await_result

SEGMENT_SECONDS = 2.0  # a segment measured longer than twice this is shortened to about this
def watched(progress: bool | None) -> bool:
    """Whether a call's progress line ticks while it runs: when asked for, or by
    default where someone watches (stderr a terminal); process 0 only. The
    line is the host's, between its waits for the call: nothing of it is in
    the program, which is the same with a terminal and without."""
    if jax.process_index() != 0:
        return False
    if progress is not None:
        return bool(progress)
    return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


# Whether a progress line on stderr waits for its end (its next report, or the
# newline when the chunks are done): the watchdog's stall line starts a line of
# its own then (`progress_line_open`).
_LINE_OPEN = [False]


def progress_line_open() -> bool:
    """Whether this process's progress line on stderr is unfinished (it was
    written with no newline)."""
    return _LINE_OPEN[0]


def end_line() -> None:
    """Ends this process's unfinished progress line on stderr, if any."""
    if _LINE_OPEN[0]:
        sys.stderr.write("\n")
        sys.stderr.flush()
        _LINE_OPEN[0] = False


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
    _LINE_OPEN[0] = ran < todo


class CallLine:
    """The progress line of a chunk's call while it runs (`watched`), at most
    once a second once the call has taken 2 s: the chunk, the time elapsed and,
    from the chunks this run finished, about how long is left."""

    def __init__(self, total: int):
        self.total, self.started, self.last, self.per_chunk = total, 0.0, 0.0, []
        self.label = ""

    def start(self, i: int) -> None:
        """Chunk `i`'s call has started."""
        self.label, self.started, self.last = f"chunk {i + 1}/{self.total}", time.perf_counter(), 0.0

    def end(self) -> None:
        """The call has finished: its time estimates the next ones."""
        self.per_chunk.append(time.perf_counter() - self.started)

    def __call__(self) -> None:
        now = time.perf_counter()
        el = now - self.started
        if el < 2.0 or now - self.last < 1.0:
            return
        left = ""
        if self.per_chunk:
            left = f"  ~{max(sum(self.per_chunk) / len(self.per_chunk) - el, 0.0):6.1f}s left in this chunk"
        sys.stderr.write(f"\r[bec-jax] {self.label}  {el:6.1f}s in this chunk{left}")
        sys.stderr.flush()
        self.last, _LINE_OPEN[0] = now, True


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
    """Refuses `done` chunks that do not fit `chunks` (another chunk size, say)."""
    for i, arrays in done.items():
        if not 0 <= i < len(chunks):
            raise ValueError(f"done_chunks: chunk {i} does not exist (the sweep has {len(chunks)} chunks)")
        for name, arr in arrays.items():
            if np.shape(arr)[:1] != (chunks[i].n,):
                raise ValueError(f"done_chunks: chunk {i}'s {name!r} has shape {np.shape(arr)}; "
                                 f"expected {chunks[i].n} grid points first (a different chunk size?)")


def placements(mesh: Mesh | None, device, by_seed: bool = False) -> tuple:
    """Where a call's (seed, grid inputs) go: with a mesh, the seed replicated and
    the grid split over its axis (a seed chunk's grid replicated too: its seeds
    are split instead); without, both on `device`."""
    if mesh is None:
        return device, device
    return (NamedSharding(mesh, PartitionSpec()),
            NamedSharding(mesh, PartitionSpec() if by_seed else PartitionSpec(GRID_AXIS)))


def place(x, where):
    """`x` (a NumPy array) on `where` (a device or a sharding). With several JAX
    processes (`jax.distributed`) each process places the part of the global
    array its own devices hold."""
    if jax.process_count() > 1 and isinstance(where, NamedSharding):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, where, lambda idx: x[idx])
    return jax.device_put(x, where)


def fetch(out: dict) -> dict:
    """The program's outputs as NumPy arrays; gathered from every process when
    the grid is sharded over several JAX processes."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        return {k: np.asarray(multihost_utils.process_allgather(v, tiled=True)) for k, v in out.items()}
    return jax.device_get(out)


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


def _run_segmented(spec, engine, progs: dict, c: Chunk, seed_dev, grid, index: int, outputs, on_segment,
                   ranges: list, place_carry, timing: dict) -> dict:
    """One chunk, segment by segment and seed chunk by seed chunk (the front's
    `make_segment_programs`): logs written into `outputs` (laid out as the
    front's `log_shapes` says), the finals returned.
    With one seed chunk the carry stays on the device between segments; with
    several, each chunk's carry waits on the host. A checkpoint (`outputs.checkpoint`)
    is taken when `on_segment` asks for one, and after an out-of-memory error."""
    N, L = spec.seeds, engine.log_blocks(spec)
    per_seed = len(ranges) > 1
    arrays = outputs.arrays(index, engine.log_shapes(spec, c.n))
    offsets = [np.int32(o) for o in ranges]
    on_device = (lambda x: place_carry(x)) if per_seed else (lambda x: x)
    carries, j = _begin_segments(spec, progs, c, seed_dev, grid, index, outputs, offsets, place_carry, arrays,
                                 timing)
    done = {"j": j}

    def save():
        outputs.checkpoint(index, done["j"], [jax.device_get(x) for x in carries], arrays)

    blocks = progs["blocks"]
    try:
        while done["j"] < L:
            j = done["j"]
            n = min(blocks, L - j)
            reports, new = [], []
            t = time.perf_counter()
            for s, off in enumerate(offsets):
                carry, ys = call(progs["advance"](n), seed_dev, grid, off, on_device(carries[s]), np.int32(j))
                reports.append(jax.device_get(await_result(ys, index)))
                new.append(jax.device_get(carry) if per_seed else carry)
            carries[:] = new  # all seed chunks at block j + n together (a failed segment leaves them at j)
            blocks = _measured_blocks(blocks, n, time.perf_counter() - t)
            stats = combine_seeds(reports, N, False) if per_seed else reports[0]
            timing["nan"] = timing.get("nan", 0) + _write_logs(arrays, c.n, j + 1, stats)
            done["j"] = j + n
            if on_segment is not None:
                on_segment(index, done["j"], L, save)
    except Stopped:
        if done["j"] > 0:
            save()  # the finished segments are kept; the one in flight is computed again on resume
        raise Stopped(index, (index, done["j"], L)) from None
    except Exception as e:
        if (_is_oom(e) or memory.is_memory_error(e)) and done["j"] > 0:
            try:
                save()  # the segments finished so far are kept for --resume
            except (OSError, MemoryError):
                pass  # memory or disk too short even for that: the chunk starts over
        raise
    fins = [jax.device_get(await_result(call(progs["finish"], seed_dev, grid, off, on_device(carries[s])), index))
            for s, off in enumerate(offsets)]
    out = {k: np.concatenate([f[k] for f in fins], axis=-1)[..., :N][: c.n] for k in fins[0]}
    out.update(arrays)
    return out


def _begin_segments(spec, progs: dict, c: Chunk, seed_dev, grid, index: int, outputs, offsets: list, place_carry,
                    arrays: dict, timing: dict) -> tuple[list, int]:
    """(carries, first block to run) of a segmented chunk: from its checkpoint,
    else from the start program (the step-0 report written into `arrays`)."""
    N, per_seed = spec.seeds, len(offsets) > 1
    ck = outputs.restore(index)
    if ck is not None:
        carries = [jax.tree_util.tree_unflatten(progs["carry_tree"], leaves) for leaves in ck["carries"]]
        if len(carries) != len(offsets):
            raise ValueError(f"resume: chunk {index}'s checkpoint holds {len(carries)} seed chunks, "
                             f"the plan has {len(offsets)}; start over with --overwrite")
        return (carries if per_seed else [place_carry(x) for x in carries]), int(ck["next_block"])
    carries, firsts = [], []
    for off in offsets:
        carry, first = call(progs["start"], seed_dev, grid, off)
        carries.append(jax.device_get(carry) if per_seed else carry)
        firsts.append(jax.device_get(await_result(first, index)))
    if per_seed:
        stats = combine_seeds([(f[0][None], f[1][None]) for f in firsts], N, True)
    else:
        stats = tuple(np.asarray(x)[None] for x in firsts[0])
    timing["nan"] = timing.get("nan", 0) + _write_logs(arrays, c.n, 0, stats)
    return carries, 0


def _measured_blocks(blocks: int, n: int, seconds: float) -> int:
    """Log blocks of the next segments: `blocks` unless a segment of `n` took
    over twice `SEGMENT_SECONDS`, then halved until one would take about that
    long (halving keeps the segment lengths, each a compiled program, few)."""
    if n < blocks or seconds <= 2 * SEGMENT_SECONDS:
        return blocks
    while blocks > 1 and seconds * blocks / n > SEGMENT_SECONDS:
        blocks //= 2
    return blocks


def _segment_programs(spec, engine, group: Group, size: int, devices, plan_seeds: int, blocks: int, seed_dev,
                      grid, form) -> tuple[dict, int]:
    """The programs of a segmented chunk, compiled: start, advance for each
    segment length in use, finish; and how many were compiled. On one device
    they are compiled ahead of time with `form`'s compiler options; over a mesh, by
    `jit` on first use (their inputs' shardings come from the programs)."""
    L = engine.log_blocks(spec)
    lengths = sorted({n for _, n in _segment_list(L, blocks)})
    sps = {n: engine.make_segment_programs(spec, group, size, plan_seeds, n, devices, form)
           for n in lengths}
    sp = sps[lengths[-1]]
    off = np.int32(0)
    carry_shape = jax.eval_shape(sp.start, seed_dev, grid, off)[0]
    progs = {"blocks": blocks, "carry_sharding": sp.carry_sharding, "mesh": sp.mesh,
             "carry_tree": jax.tree_util.tree_structure(carry_shape)}
    if sp.mesh is not None:  # the carry as the programs shard it
        carry_shape = jax.tree_util.tree_map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                                             carry_shape, sp.carry_sharding(carry_shape))
    opts = form.compiler_options
    args = (seed_dev, grid, off, carry_shape, np.int32(0))
    made = {n: clock.compile_program(q.advance, args, opts) for n, q in sps.items()}

    def advance(n: int):
        """The program of a segment of `n` log blocks; compiled on first use for a
        length the plan did not foresee (a segment shortened by its time)."""
        if n not in made:
            q = engine.make_segment_programs(spec, group, size, plan_seeds, n, devices, form)
            made[n] = clock.compile_program(q.advance, args, opts)
        return made[n]

    progs.update(
        start=clock.compile_program(sp.start, (seed_dev, grid, off), opts), advance=advance,
        finish=clock.compile_program(sp.finish, (seed_dev, grid, off, carry_shape), opts))
    return progs, 2 + len(lengths)


def _segment_list(L: int, blocks: int) -> list[tuple[int, int]]:
    """(first block, blocks) of each segment of `L` log blocks."""
    return [(j, min(blocks, L - j)) for j in range(0, L, blocks)]


def call(exe, *args):
    """Calls a compiled program (tests replace it to inject failures)."""
    return exe(*args)


def _is_oom(e: Exception) -> bool:
    """Whether `e` is a device out-of-memory error."""
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def _carry_placer(progs: dict, devices) -> Callable:
    """Puts a chunk's carried state (host arrays) back where its programs want it."""
    if progs["mesh"] is None:
        return lambda carry: jax.device_put(carry, devices[0])
    return lambda carry: jax.device_put(carry, progs["carry_sharding"](carry))


class _Layout(NamedTuple):
    """How each chunk runs (see `run_chunks`): in one call, or in segments of
    `blocks` log blocks and seed chunks of `seeds` from each of `ranges`, the
    seeds split over the devices when `by_seed`."""

    segmented: bool
    seeds: int
    blocks: int
    ranges: list
    by_seed: bool


def _layout(spec, engine, devices, seeds_per_call: int | None, blocks_per_segment: int | None) -> _Layout:
    """The layout `run_chunks` runs `spec`'s chunks in; refuses one it cannot."""
    if engine is None:
        raise ValueError("engine: run_chunks needs the spec's front (an engine.protocol.Engine)")
    L = engine.log_blocks(spec) if engine.SEGMENTS else 0
    seeds = min(seeds_per_call or spec.seeds, spec.seeds)
    blocks = min(blocks_per_segment or L, L) if L else 0
    segmented = engine.SEGMENTS and (seeds < spec.seeds or blocks < L)
    if segmented and jax.process_count() > 1:
        raise ValueError("seeds: a run in time segments or seed chunks does not support jax.distributed yet; "
                         "raise --memory-budget (or give fewer seeds or steps) so it runs in one call per chunk")
    ranges = list(range(0, spec.seeds, seeds)) if segmented else [0]
    # A seed chunk splits its seeds, not the grid, over the devices.
    by_seed = segmented and seeds < spec.seeds and len(devices) > 1
    if by_seed and seeds % len(devices):
        raise ValueError(f"seed_chunk: must be a multiple of the {len(devices)} devices, got {seeds}")
    return _Layout(segmented, seeds, blocks, ranges, by_seed)


class _SegmentLine:
    """The progress line of a segmented run, one a segment (at most one a second),
    shown by process 0 once the run has taken 2 s (or always with `progress`):
    a long chunk shows it is alive and when it will end, estimated from this
    process's pace (a resumed chunk starts part way). Passes each segment on to
    `on_segment`."""

    def __init__(self, progress, on_segment, t_start: float, todo: int, done: int, total: int):
        self.progress, self.on_segment, self.t_start = progress, on_segment, t_start
        self.todo, self.done, self.total = todo, done, total
        self.n, self.shown, self.last, self.since = 0, False, 0.0, None

    def __call__(self, i, blocks_done, blocks, checkpoint):
        """Segment `blocks_done` of `blocks` of chunk i has finished."""
        now = time.perf_counter()
        if self.since is None or self.since[0] != i:
            self.since = (i, blocks_done, now)
        el = now - self.t_start
        if (jax.process_index() == 0 and self.progress is not False and (self.progress or el > 2.0)
                and now - self.last >= 1.0):
            _, b0, t0 = self.since
            rate = (blocks_done - b0) / (now - t0) if blocks_done > b0 and now > t0 else None
            left = (blocks - blocks_done) / rate if rate else None
            chunks_left = self.todo - self.n - 1
            sys.stderr.write(f"\r[bec-jax] chunk {self.done + self.n + 1}/{self.total}  log block "
                             f"{blocks_done}/{blocks}  {el:6.1f}s elapsed"
                             + (f"  ~{left:6.1f}s left in this chunk" if left is not None else "")
                             + (f" ({chunks_left} more chunks)" if chunks_left else ""))
            sys.stderr.flush()
            self.shown, self.last, _LINE_OPEN[0] = True, now, True
        if self.on_segment is not None:
            self.on_segment(i, blocks_done, blocks, checkpoint)


def _compile(spec, engine, group: Group, c: Chunk, devices, form, lay: _Layout, memo) -> tuple:
    """(exe, placements, grid placed, programs compiled) for chunk `c`'s shape:
    the kept program under `memo` if any (grid None: not placed yet), else
    compiled now and kept."""
    size = len(c.indices)
    hit = memo_get(memo)
    if hit is not None:
        return (*hit, None, 0)
    if lay.segmented:
        mesh = segment_mesh(devices, size, lay.by_seed)
    else:
        program = engine.make_program(spec, group, size, devices, form=form)
        mesh = program.mesh
    placed = placements(mesh, devices[0], lay.by_seed)
    seed_dev = place(np.uint32(spec.seed), placed[0])
    grid = {k: place(v, placed[1]) for k, v in engine.chunk_grid(spec, group, c).items()}
    if lay.segmented:
        exe, made = _segment_programs(spec, engine, group, size, devices, lay.seeds, lay.blocks, seed_dev, grid,
                                      form)
    else:
        # Kept on disk by what the program is made from: found with nothing traced.
        key = None if memo is None else program_cache.file_key(spec, group, size, devices, form, engine)
        exe = program_cache.compile_or_load(key, devices, program.fn, (seed_dev, grid), form.compiler_options)
        made = 1
    memo_put(memo, (exe, placed))
    return exe, placed, grid, made


def _chunks_left(chunks: list, todo: list) -> dict:
    """{group: chunks of it still to run}, for `_release`."""
    left: dict = {}
    for i in todo:
        left[chunks[i].group] = left.get(chunks[i].group, 0) + 1
    return left


def _release(compiled: dict, left: dict, group: int) -> None:
    """Counts one chunk of `group` done; once it has none left, drops this
    run's hold on the group's programs. Each group of untraced task axes or
    models has programs of its own (about 7 MB of executable each for a
    continuing task on a CPU): held to the end of the run, a 500-value task
    axis would keep 500 of them, outside the memory plan. The process's cache
    (`tuning.memo_put`) still keeps the most recent `tuning.MAX_EXECUTABLES`."""
    left[group] -= 1
    if left[group] == 0:
        for key in [k for k in compiled if k[0] == group]:
            del compiled[key]


def _first_of_shape(spec, engine, group: Group, c: Chunk, devices, compiler_options, lay: _Layout) -> tuple:
    """((exe, placements, seed placed), grid placed or None, programs compiled,
    compile seconds) for a run's first chunk of `c`'s shape: its program from
    the process's cache or compiled now (`_compile`), in the form
    `tuning.choose_form` picks."""
    t = time.perf_counter()
    form = tuning.choose_form(spec, devices, group, compiler_options, front=engine)
    memo = memo_key(spec, group, len(c.indices), devices, form, engine)
    if lay.segmented:
        memo += ("segmented", lay.seeds, lay.blocks)
    exe, placed, grid, made = _compile(spec, engine, group, c, devices, form, lay, memo)
    seconds = time.perf_counter() - t if made else 0.0
    # The seed is placed per run: a memoised program may come from another seed's run.
    return (exe, placed, place(np.uint32(spec.seed), placed[0])), grid, made, seconds


def _run_chunk(spec, engine, exe, c: Chunk, seed_dev, grid, i: int, n_chunks: int, lay: _Layout, outputs,
               lines: tuple, devices, timing: dict) -> dict:
    """Chunk i's outputs (its real points); a device out-of-memory error becomes
    `memory.OutOfMemory`, one line. `lines`: (the segment line, the call line
    or None)."""
    seg_line, call_line = lines
    try:
        if lay.segmented:
            return _run_segmented(spec, engine, exe, c, seed_dev, grid, i, outputs, seg_line, lay.ranges,
                                  _carry_placer(exe, devices), timing)
        if call_line is not None:
            call_line.start(i)
        out = fetch(await_result(call(exe, seed_dev, grid), i, call_line))
        if call_line is not None:
            call_line.end()
        return {name: np.asarray(arr)[: c.n] for name, arr in out.items()}
    except jax.errors.JaxRuntimeError as e:
        if not _is_oom(e):
            raise
        raise memory.OutOfMemory(
            f"memory: the device ran out of memory in chunk {i + 1} of {n_chunks} ({c.n} grid points x "
            f"{lay.seeds} seeds per call; another process may hold memory); use a smaller "
            "--memory-budget, fewer seeds or a smaller --chunk-size", chunk=i) from None


def run_chunks(spec, groups: list[Group], chunks: list[Chunk], devices, *,
               done: dict | None = None, only=None, compiler_options: dict | None = None,
               on_chunk: Callable | None = None, progress: bool | None = None, engine=None,
               seeds_per_call: int | None = None, blocks_per_segment: int | None = None,
               outputs=None, on_segment: Callable | None = None) -> ChunkRun:
    """Compiles each group's program (once, when its first chunk is due) and runs
    every chunk not in `done` (and, with `only`, in `only`); calls
    `on_chunk(i, arrays)` after chunk i. `engine` (required): the spec's front,
    an `engine.protocol.Engine`, whose `make_program` and `chunk_grid` make
    the programs. `progress`: True shows a line per chunk (and, while a call
    runs, a line that ticks); None shows them where stderr is a terminal and
    the run has taken 2 s; False none.

    With `seeds_per_call` below the spec's seeds or `blocks_per_segment` below
    its log blocks (a `memory.Plan`), each chunk runs in segments of the time
    axis and seed chunks: the logs go into `outputs` (default `MemoryOutputs`)
    as they come, and `on_segment(i, blocks_done, blocks, checkpoint)` is
    called after each segment (it may call `checkpoint()` to keep the carried
    state, and raise to stop). A device out-of-memory error raises
    `memory.OutOfMemory` (one line) after checkpointing what it can; the chunks
    finished before it have been passed to `on_chunk`."""
    lay = _layout(spec, engine, devices, seeds_per_call, blocks_per_segment)
    outputs = outputs if outputs is not None else MemoryOutputs()
    timing = {"run": 0.0}
    done = dict(done or {})
    _check_done(done, chunks)
    todo = [i for i in range(len(chunks)) if i not in done and (only is None or i in only)]
    results = dict(done)
    compiled: dict[tuple, tuple] = {}
    left = _chunks_left(chunks, todo)
    compile_time, t_run, n_compiled = 0.0, 0.0, 0
    t_start = time.perf_counter()
    seg_line = _SegmentLine(progress, on_segment, t_start, len(todo), len(done), len(chunks))
    call_line = CallLine(len(chunks)) if watched(progress) and not lay.segmented else None
    try:
        for n, i in enumerate(todo):
            seg_line.n = n
            c = chunks[i]
            c = c._replace(indices=pad(c.indices, 1 if lay.by_seed else len(devices)))
            key = (c.group, len(c.indices))
            grid = None
            if key not in compiled:  # this run's first chunk of this shape
                compiled[key], grid, made, seconds = _first_of_shape(spec, engine, groups[c.group], c, devices,
                                                                     compiler_options, lay)
                compile_time += seconds
                n_compiled += made
            exe, placed, seed_dev = compiled[key]
            if grid is None:
                grid = {k: place(v, placed[1]) for k, v in engine.chunk_grid(spec, groups[c.group], c).items()}
            t = time.perf_counter()
            results[i] = _run_chunk(spec, engine, exe, c, seed_dev, grid, i, len(chunks), lay, outputs,
                                    (seg_line, call_line), devices, timing)
            t_run += time.perf_counter() - t
            _release(compiled, left, c.group)
            if on_chunk is not None:
                on_chunk(i, results[i])
            if jax.process_index() == 0 and (
                    progress or (progress is None and len(todo) > 1 and time.perf_counter() - t_start > 2.0)
                    or (call_line is not None and call_line.last)):
                _progress(len(done) + n + 1, len(chunks), t_start, n + 1, len(todo))
    finally:
        end_line()  # an unfinished progress line ends before anyone else writes
    if timing.get("nan"):
        warnings.warn(f"sweep: {timing['nan']} logged statistics are NaN where the divergence check flagged "
                      "no run; these statistics are not trustworthy", RuntimeWarning, stacklevel=3)
    computed = sum(chunks[i].n for i in todo)
    return ChunkRun(results, compile_time, t_run, n_compiled, computed)
