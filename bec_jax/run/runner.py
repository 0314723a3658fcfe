"""Run a spec into a directory, resumably: the output-directory policy, the
chunk store, the resume rules and stopping on a signal, in one place. The command
line is a thin parser over `run_to_dir`; Python callers get the same behaviour.

    result = runner.run_to_dir(spec, "runs/x")                 # a fresh run
    result = runner.run_to_dir(None, "runs/x", resume=True)    # continue an interrupted one

A run keeps each finished chunk of its grid in DIR/chunks/ as it goes (one
`chunk_00003.npz` per chunk, written atomically, and a manifest with the spec,
the chunk size and the device count). Inside `StopOnSignal`, Ctrl-C (SIGINT) or
SIGTERM stops it within a fraction of a second, keeping the finished chunks and
segments (the call in flight is computed again; a second signal stops at once):
`Interrupted` is raised, and `resume=True` later skips the finished work, with
results identical bit for bit to an uninterrupted run. The chunks are removed
once the results are written.

A run that fails (memory ran out, the user's algorithm raised, a file could not
be written) raises one line (`memory.OutOfMemory`, `AlgorithmFailed`,
`rundir.RunError`): with the chunks it saved kept for `resume=True`, or, when it saved
nothing, with nothing left behind, so the same call runs again.
"""
from __future__ import annotations

import errno
import functools
import os
import re
import signal
import sys
import threading
import time
import traceback

import numpy as np

from bec_jax import moved
from bec_jax.engine import clock, memory, waits
from bec_jax.files import LOG_LAYOUT, open_log
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import SweepSpec
from bec_jax.run import kinds, rundir, watchdog

CHECKPOINT_EVERY_S = 300.0  # a long segmented chunk also keeps its state this often


class AlgorithmFailed(RuntimeError):
    """The user's own algorithm code raised (while tracing, or at run time in a
    host callback): one line naming the algorithm, its module and the
    exception's last line; the original exception is the `__cause__`."""


# ------------------------------------------------------------------ signals

class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM (exit status 128 + the signal number).

    Attributes: signum; saved (chunks on disk) and total (chunks in the run),
    when the run had started; segment (chunk, log blocks done, log blocks) when
    it stopped at a segment boundary inside a chunk (its state is saved)."""

    def __init__(self, signum: int, saved: int | None = None, total: int | None = None,
                 segment: tuple | None = None):
        super().__init__(signum)
        self.signum = signum
        self.saved = saved
        self.total = total
        self.segment = segment  # (chunk, log blocks done, log blocks) when stopped inside a chunk


class StopOnSignal:
    """While active, the first SIGINT/SIGTERM stops the run within a fraction of
    a second: the finished chunks (and a segmented chunk's finished segments) are
    saved, the call in flight is abandoned (`engine.waits.stop_when`) and
    computed again on resume; a second signal stops at once. Only the main
    thread can install signal handlers; elsewhere it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum = None
        self._old = {}

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise Interrupted(signum)
        self.signum = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
            # A signal also ends the wait for a call in flight (within 0.05 s).
            self._waits = waits.stop_when(lambda: self.signum is not None)
            self._waits.__enter__()
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        if self._old:
            self._waits.__exit__(*exc)
        return False


# ------------------------------------------------------------------ run into a directory

def resume_spec(out: str) -> SweepSpec:
    """The spec of the interrupted run in `out` (for a resume given no spec)."""
    store = rundir.ChunkStore(out)
    if not store.exists():
        raise rundir.RunError(f"resume: {out!r} holds no interrupted run (no chunks/manifest.json); "
                       "give the spec to start one")
    return store.read_manifest()["spec"]


def check_resume(spec: SweepSpec, out: str, chunk_size: int | None = None) -> dict | None:
    """Before anything is written: the manifest of the interrupted run in `out`
    (None if there is none and `out` is empty or absent); `rundir.RunError` naming the
    first field in which `spec` or `chunk_size` differ from it, or when `out`
    holds something else."""
    store = rundir.ChunkStore(out)
    if store.exists():
        m = store.check(spec)
        if chunk_size is not None:
            if kinds.of_spec(spec).front.plan_chunk(spec, chunk_size, m["num_devices"]) != m["chunk_size"]:
                raise rundir.RunError(f"chunk_size: the interrupted run used chunks of {m['chunk_size']}, got "
                               f"{chunk_size}; resume with the same --chunk-size (or leave it out)")
        return m
    if os.path.isdir(out) and rundir.entries(out):
        raise rundir.RunError(f"resume: {out!r} holds no interrupted run (no chunks/manifest.json) "
                       "and is not empty; choose another directory or pass --overwrite")
    return None


def parse_part(text) -> tuple[int, int]:
    """"K/N" -> (K, N), 1 <= K <= N; `rundir.RunError` naming the field otherwise."""
    if isinstance(text, tuple):
        k, n = text
    else:
        try:
            k, n = (int(x) for x in str(text).split("/"))
        except ValueError:
            raise rundir.RunError(f"chunks: expected K/N (run the K-th of N parts), got {text!r}") from None
    if not (isinstance(k, int) and isinstance(n, int) and 1 <= k <= n):
        raise rundir.RunError(f"chunks: expected K/N with 1 <= K <= N, got {k}/{n}")
    return k, n


def is_writer() -> bool:
    """Only the first JAX process writes files (the others compute their share)."""
    import jax
    return jax.process_index() == 0


def _holding_the_lock(run):
    """`run_to_dir` gives back the lock on its directory (`rundir.lock_dir`)
    however it ends: a later run in this process may take it again."""
    @functools.wraps(run)
    def locked(spec, out, *args, **kwargs):
        try:
            return run(spec, out, *args, **kwargs)
        finally:
            rundir.unlock_dir(out)
    return locked


@_holding_the_lock
def run_to_dir(spec: SweepSpec | None, out: str, *, overwrite: bool = False, resume: bool = False,
               chunk_size: int | None = None, devices=None, stop: StopOnSignal | None = None,
               part: tuple[int, int] | None = None, **sweep_kwargs) -> SweepResult | dict:
    """Runs `spec` into the directory `out` (curves.npz, summary.json,
    summary.csv, meta.json, its `timing` the process's import and this run's
    trace, compile and run seconds: `engine.clock.timing`) and returns the result.

    Args:
      spec: what to run; None with `resume=True` takes the interrupted run's spec.
      out: the output directory. A non-empty one is refused unless `overwrite`
        (start over) or `resume` (continue the interrupted run it holds).
      resume: skip the chunks an interrupted run of the same spec saved in `out`.
      chunk_size: grid points per compiled call (a resume keeps the old size).
      devices: JAX devices (default: all, of every process under
        `jax.distributed`). A resume uses the same number as the interrupted run
        where it can; results do not depend on it.
      stop: a `StopOnSignal` in effect; when it has caught a signal the run stops
        (the call in flight abandoned, the finished work kept) and raises `Interrupted`.
      part: (K, N): compute only the chunks i with i % N == K - 1 into `out`'s
        chunk store, which N independent processes (a Slurm job array, say) share;
        returns {"part", "chunks_done", "chunks_total"} without assembling. A
        final `resume=True` run assembles the result without computing.
      sweep_kwargs: passed on to the spec's front's `run` (`kinds.of_spec`; memory_budget,
        progress, ...).

    Bad input raises `rundir.RunError` (a `ValueError`) before anything is written.
    Under `jax.distributed` every process calls this, and only process 0 writes.
    """
    import jax

    spec, part = _what_to_run(spec, out, overwrite, resume, part)
    front = kinds.of_spec(spec).front  # the spec's front (`engine.protocol.Engine`): plans and runs it
    store = rundir.ChunkStore(out)
    writer = is_writer()
    devices = list(devices) if devices is not None else jax.devices()
    if part is not None:
        return _run_part(spec, out, store, part, chunk_size, devices, stop, sweep_kwargs.get("progress"))
    manifest = check_resume(spec, out, chunk_size) if resume else None
    devices = _resume_devices(manifest, devices)
    pl = _memory_plan(front, spec, out, manifest, chunk_size, devices, sweep_kwargs)
    sweep_kwargs = {k: v for k, v in sweep_kwargs.items() if k not in ("seed_chunk", "segment_blocks", "memory_budget")}
    layout = {"seeds_per_call": pl.seeds, "blocks_per_segment": pl.blocks}
    created = not os.path.exists(out)
    if writer:
        rundir.prepare_out_dir(out, overwrite, allow=lambda d: resume)
        rundir.lock_dir(out)  # one run at a time writes `out` (parts share it through `ChunkStore.ensure`)
    chunk = manifest["chunk_size"] if manifest is not None else pl.grid
    done = _done_chunks(front, spec, store, manifest, writer, chunk, devices, layout)
    total = front.num_chunks(spec, chunk)
    on_chunk, count = _saving(store, writer, stop, total - len(done), len(done), total)
    snap, t0 = clock.snapshot(), time.perf_counter()
    # What the summary needs of the spec alone (its exact verdicts, its
    # intervals' quantile): worked out while XLA compiles the sweep and it
    # runs, not during its trace, which holds the GIL.
    # A front without a summary analysis has no hook (`engine.protocol.Engine`).
    hook = getattr(front, "prefetch_summary", None)
    labels = hook(spec, start=clock.traced_event()) if writer and hook is not None else None
    try:
        result = front.run(spec, chunk_size=chunk, devices=devices, on_chunk=on_chunk, done_chunks=done,
                                 memory_plan=pl, out=out, outputs=store if writer else None,
                                 alloc=_log_alloc(out) if pl.lazy and writer else None,
                                 on_segment=_segment_stop(stop, count, total), **sweep_kwargs)
        result.meta["timing"] = clock.timing(snap, result.meta["run_time_s"], time.perf_counter() - t0)
        if writer:
            result.save(out)
    except Interrupted as e:
        raise Interrupted(e.signum, count["saved"], total, e.segment) from None
    except waits.Stopped as e:  # a signal while a call was in flight: that call is abandoned
        raise Interrupted(stop.signum, count["saved"], total, e.segment) from None
    except Exception as e:
        # A fresh run that kept nothing resumable leaves nothing behind: the same
        # command runs again without --overwrite.
        kept = manifest is not None or not writer or store.has_work()
        if not kept:
            _discard(store, out, created)
        _raise_contained(e, spec, _saved_note(count["saved"], total, store) if kept else "")
        raise
    finally:
        if labels is not None:  # a stopped run does not wait for its analysis
            labels.close(wait=stop is None or stop.signum is None)
    if writer:
        store.remove()
    return result


def _resume_devices(manifest: dict | None, devices: list) -> list:
    """The devices a run uses: on a resume, as many as the interrupted run had
    where there are that many (the same sharding as before)."""
    import jax

    if manifest is not None and len(devices) >= manifest["num_devices"] and jax.process_count() == 1:
        return devices[:manifest["num_devices"]]
    return devices


def _done_chunks(front, spec, store, manifest: dict | None, writer: bool, chunk: int, devices: list,
                 layout: dict) -> dict:
    """The chunks an interrupted run saved (on a resume), else {} with the chunk
    store started (by the writing process)."""
    if manifest is not None:
        # Fewer devices than before is fine: the chunk layout depends on the spec and
        # chunk size only, and results do not depend on the device count.
        if manifest["num_chunks"] != front.num_chunks(spec, chunk):
            raise rundir.RunError(f"resume: {store.manifest_path!r} is inconsistent; start over with --overwrite")
        return store.load_done()
    if writer:
        store.start(spec, chunk, len(devices), devices[0].platform, layout)
    return {}


def _what_to_run(spec, out: str, overwrite: bool, resume: bool, part) -> tuple:
    """(spec, part) of a `run_to_dir` call, checked: the interrupted run's spec
    when resuming without one, the part parsed; `rundir.RunError` for a bad mix."""
    if resume and overwrite:
        raise rundir.RunError("resume: --resume continues the run in --out, --overwrite starts over; give one")
    if part is not None:
        part = parse_part(part)
        if overwrite:
            raise rundir.RunError("chunks: a part adds to a shared chunk store; --overwrite would delete the other "
                                  "parts")
    if spec is None:
        if not resume:
            raise rundir.RunError("spec: required unless resuming")
        spec = resume_spec(out)
    if getattr(spec, "search", None) is not None:  # a search ranks every point in one call
        import jax
        if part is not None:
            raise rundir.RunError("chunks: a search runs every grid point in one compiled call; run it whole, "
                                  "without --chunks")
        if jax.process_count() > 1:
            raise rundir.RunError("distributed: a search runs every grid point in one call on one device; run it "
                                  "in one process, without --distributed")
    return spec, part


def _memory_plan(front, spec, out: str, manifest: dict | None, chunk_size: int | None, devices,
                 sweep_kwargs: dict) -> memory.Plan:
    """The memory plan (`front.plan_memory`), before anything is written: a
    run that cannot fit is refused here (memory.TooLarge, one line naming the
    field). The sweep runs by this very plan; a resume keeps the layout the run
    started with."""
    if manifest is not None:
        forced = dict(chunk_size=manifest["chunk_size"], seed_chunk=manifest.get("seeds_per_call"),
                      segment_blocks=manifest.get("blocks_per_segment"))
    else:
        grid_chunk = None if chunk_size is None else front.plan_chunk(spec, chunk_size, len(devices))
        forced = dict(chunk_size=grid_chunk, seed_chunk=sweep_kwargs.get("seed_chunk"),
                      segment_blocks=sweep_kwargs.get("segment_blocks"))
    try:  # the plan traces the algorithm's init: a user's may fail here
        return front.plan_memory(spec, len(devices), memory_budget=sweep_kwargs.get("memory_budget"),
                                       device=devices[0], out=out, **forced)
    except Exception as e:
        _raise_contained(e, spec, "")
        raise


def _saved_note(saved: int, total: int, store: rundir.ChunkStore) -> str:
    return (f"; {saved} of {total} chunks are saved in {store.dir} (and the finished segments of the chunk in "
            "progress): continue with --resume")


def _discard(store: rundir.ChunkStore, out: str, created: bool) -> None:
    """Removes what a run that saved nothing wrote: its chunk store, and `out`
    itself when the run created it (only if nothing else is in it)."""
    store.remove()
    rundir.unlock_dir(out)  # its lock file goes too
    if created:
        try:
            os.rmdir(out)
        except OSError:
            pass


def _raise_contained(e: Exception, spec, note: str) -> None:
    """Raises the one-line error for a run's failure `e`, with `note` (what is
    saved) appended: memory (MemoryError, a refused mapping, a device out of
    memory) as `memory.OutOfMemory`, the user's algorithm code as
    `AlgorithmFailed`, a file that cannot be written as `rundir.RunError`. Returns for
    anything else (bad input found late, a ValueError, is one line already; an
    error of bec_jax itself keeps its traceback)."""
    limit = memory.address_space_limit()
    if isinstance(e, memory.OutOfMemory):
        bound = f"; {memory.address_space_note()}" if limit is not None else ""
        raise type(e)(f"{e}{bound}{note}", chunk=e.chunk) from None
    if memory.is_memory_error(e):
        todo = ("raise the limit (ulimit -v), lower --memory-budget or log less often (a larger --log-every)"
                if limit is not None else "lower --memory-budget or log less often (a larger --log-every)")
        raise memory.OutOfMemory(f"memory: the run ran out of memory ({memory.last_line(e)}); "
                                 f"{memory.address_space_note()}; {todo}{note}") from e
    user = user_failure(e, spec)
    if user is not None:
        raise AlgorithmFailed(f"{user}{note}") from e
    if isinstance(e, OSError):
        what = f"{e.strerror or e} ({e.filename})" if e.filename else str(e)
        field = "disk" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "out"
        raise rundir.RunError(f"{field}: cannot write the run's files: {what}{note}") from e


def user_failure(e: BaseException, spec) -> str | None:
    """'algorithm: mymod:ALG (module mymod) failed: ZeroDivisionError: ...' when
    `e` was raised with the code of the spec's algorithm on the stack, the
    user's own module (not bec_jax's); else None. An error in a host callback
    reaches here as JAX's runtime error carrying the callback's traceback as
    text, whose frames count too."""
    alg = spec.algorithm_def
    code = [f for f in (getattr(alg, n, None) for n in ("update", "apply", "init")) if callable(f)]
    ref = spec.algorithm if isinstance(spec.algorithm, str) else alg.name
    mods = [ref.partition(":")[0]] if ":" in ref else []
    mods += [getattr(f, "__module__", None) for f in code]
    mods = [m for m in dict.fromkeys(mods) if m and m != "bec_jax" and not m.startswith("bec_jax.")]
    files = set()
    for m in mods:
        path = getattr(sys.modules.get(m), "__file__", None)
        if path:
            files.add(os.path.realpath(path))
    for f in code:
        co = getattr(f, "__code__", None)
        if co is not None and getattr(f, "__module__", None) in mods:
            files.add(os.path.realpath(co.co_filename))
    if not files:
        return None
    seen, x = set(), e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        frames = [fr.filename for fr in traceback.extract_tb(x.__traceback__)]
        frames += re.findall(r'File "([^"]+)", line \d+', str(x))
        if any(os.path.realpath(f) in files for f in frames):
            return f"algorithm: {ref} (module {mods[0]}) failed: {memory.last_line(e)}"
        x = x.__cause__
    return None


def _log_alloc(out: str):
    """`sweep.assemble`'s allocator for a run whose logs stream to disk: the log
    arrays as files in `out/curves/` written a slab at a time (`NpyFile`), the
    rest in memory."""
    def alloc(name, shape, dtype):
        if name in LOG_LAYOUT:
            return open_log(out, name, shape, dtype)
        return np.empty(shape, dtype)
    return alloc


def _segment_stop(stop: StopOnSignal | None, count: dict, total: int):
    """`sweep.run`'s on_segment: tells the stall watchdog; once a signal has
    arrived, checkpoint the chunk in progress at this segment boundary and stop
    (`Interrupted`); otherwise checkpoint every CHECKPOINT_EVERY_S seconds."""
    last = {"t": time.monotonic()}

    def on_segment(i, blocks_done, blocks, checkpoint):
        watchdog.beat()  # progress, even where the host idles while a device computes
        if blocks_done >= blocks:
            return  # the chunk is finishing: it is saved whole next
        if stop is not None and stop.signum is not None:
            checkpoint()
            raise Interrupted(stop.signum, count["saved"], total, (i, blocks_done, blocks))
        if time.monotonic() - last["t"] > CHECKPOINT_EVERY_S:
            checkpoint()
            last["t"] = time.monotonic()

    return on_segment


def _saving(store: rundir.ChunkStore, writer: bool, stop: StopOnSignal | None, todo: int, saved: int, total: int):
    """(on_chunk, counts) for `sweep.run_chunks`: on_chunk saves each finished
    chunk (process 0 only), tells the stall watchdog and, once a signal has
    arrived, stops the run while work remains (`Interrupted` with the chunks
    saved so far)."""
    count = {"saved": saved, "left": todo}

    def on_chunk(i, arrays):
        if writer:
            store.save(i, arrays)
        watchdog.beat()
        count["saved"] += 1
        count["left"] -= 1
        if stop is not None and stop.signum is not None and count["left"] > 0:
            raise Interrupted(stop.signum, count["saved"], total)

    return on_chunk, count


def _run_part(spec, out, store, part, chunk_size, devices, stop, progress) -> dict:
    """`run_to_dir(part=(K, N))`: this part's chunks into the shared chunk store."""
    sweep = kinds.of_spec(spec).front
    if store.exists():
        store.check(spec)
    elif os.path.isdir(out) and rundir.entries(out) and not os.path.isdir(store.dir):
        raise rundir.RunError(f"out: {out!r} is not empty and holds no chunk store of this sweep")
    rundir.prepare_out_dir(out, True)
    manifest = store.ensure(spec, sweep.plan_chunk(spec, chunk_size, len(devices)), len(devices),
                            devices[0].platform)
    chunk = manifest["chunk_size"]
    k, n = part
    groups, chunks = sweep.plan(spec, chunk)
    total = len(chunks)
    mine = {i for i in range(total) if i % n == k - 1}
    done = store.load_done(clean=False)
    on_chunk, count = _saving(store, True, stop, len(mine - set(done)), len(done), total)
    pl = sweep.plan_memory(spec, len(devices), chunk_size=chunk, out=out)  # a long or large chunk: segments
    try:
        sweep.run_chunks(spec, groups, chunks, devices, done=done, only=mine, on_chunk=on_chunk,
                         progress=progress, seeds_per_call=pl.seeds, blocks_per_segment=pl.blocks, outputs=store,
                         on_segment=_segment_stop(stop, count, total), engine=sweep)
    except waits.Stopped as e:  # a signal while a call was in flight: that call is abandoned
        raise Interrupted(stop.signum, count["saved"], total, e.segment) from None
    return {"part": f"{k}/{n}", "chunks_done": store.count_done(), "chunks_total": total}


# ------------------------------------------------------------------ confirmation on fresh seeds

# Every kind's is `run.confirm`'s (which imports this module): `runner.confirm`
# and the others of 0.3 are found there.
_CONFIRM_NAMES = ("CONFIRM_DIR", "CONFIRM_FILE", "confirm", "confirm_line")


# The run directory's names, which this module re-exported in 0.3 (the docs
# named `runner.ChunkStore`): found in `rundir` for one more release.
_RUNDIR_NAMES = ("CHECKPOINT_FILE", "CHUNKS_DIR", "MANIFEST_FILE", "STREAMED_KEY", "ChunkStore", "RunError",
                 "check_out_dir", "entries", "prepare_out_dir", "spec_from_dict")


def __getattr__(name: str):
    """`runner.ChunkStore` and the run directory's other names: `rundir`'s, warning once;
    `runner.confirm` and the confirmation's other names: `run.confirm`'s."""
    if name in _RUNDIR_NAMES:
        moved.warn(f"bec_jax.run.runner.{name}", f"bec_jax.run.rundir.{name}")
        return getattr(rundir, name)
    if name in _CONFIRM_NAMES:
        from bec_jax.run import confirm
        return getattr(confirm, name)
    raise AttributeError(f"module 'bec_jax.run.runner' has no attribute {name!r}")
