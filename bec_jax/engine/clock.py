"""The process's compile clock: every program's trace (jit's lowering) and XLA
compile timed apart, and whether JAX's persistent compilation cache served it.

Every front compiles through `compile_program`, which adds to process-wide
totals (programs compile in threads in the reproductions, so the totals are
summed over threads). `snapshot()` reads them; `since(snap)` is what was added
after `snap`; `timing(...)` is the `timing` record a run's meta.json carries.
A persistent-cache hit is JAX's own event ('/jax/compilation_cache/cache_hits'):
its compile seconds are then the cache's load, not XLA's work.
"""
from __future__ import annotations

import os
import threading
import time

from bec_jax.engine import waits

_LOCK = threading.Lock()
_TOTALS = {"trace_s": 0.0, "compile_s": 0.0, "programs": 0, "cache_requests": 0, "cache_hits": 0}
_LISTENING = [False]
_IMPORT_S: list = [None]


_IN_PROGRAM = threading.local()  # .active: this thread is in `compile_program`
_TRACE_WAITERS: list = []  # events `traced_event` handed out, set once a program's trace is done


def traced_event() -> threading.Event:
    """An event set once the next program's tracing is done (its XLA compile
    starting, or a program loaded whole): work that would compete with the
    trace for the GIL can wait for it (`verdicts.Prefetch`)."""
    ev = threading.Event()
    with _LOCK:
        _TRACE_WAITERS.append(ev)
    return ev


def _traced() -> None:
    with _LOCK:
        waiters, _TRACE_WAITERS[:] = list(_TRACE_WAITERS), []
    for ev in waiters:
        ev.set()


def _on_event(name: str, **_) -> None:
    key = {"/jax/compilation_cache/compile_requests_use_cache": "cache_requests",
           "/jax/compilation_cache/cache_hits": "cache_hits"}.get(name)
    # Only a program's own compile: not the small analysis programs another
    # thread may compile meanwhile (`verdicts.Prefetch`).
    if key is not None and getattr(_IN_PROGRAM, "active", False):
        if key == "cache_hits":
            _IN_PROGRAM.hit = True
        with _LOCK:
            _TOTALS[key] += 1


def _listen() -> None:
    """Registers the cache-event listener once per process, and mends JAX's
    persistent cache (`engine.jax_cache`: a damaged entry is compiled again
    and replaced, not warned about on every run)."""
    with _LOCK:
        if _LISTENING[0]:
            return
        _LISTENING[0] = True
    import jax.monitoring

    from bec_jax.engine import jax_cache
    jax.monitoring.register_event_listener(_on_event)
    jax_cache.mend()


def compile_program(fn, args: tuple, options: dict | None):
    """`fn.lower(*args).compile(options)`, its trace and compile seconds added
    to the process's totals. Inside `waits.stop_when` it runs in a helper thread
    that a stop abandons (`waits.run_stoppable`): a signal during a long compile
    stops the run at once too."""
    exe, hit = waits.run_stoppable(_compile_here, fn, args, options)
    _IN_PROGRAM.hit = hit  # the caller's thread asks `was_cache_hit`
    return exe


def _compile_here(fn, args: tuple, options: dict | None) -> tuple:
    """(`compile_program`'s executable, whether JAX's cache served it), in this thread."""
    _listen()
    t0 = time.perf_counter()
    _IN_PROGRAM.active, _IN_PROGRAM.hit = True, False
    try:
        lowered = fn.lower(*args)
        t1 = time.perf_counter()
        _traced()
        exe = lowered.compile(options)
    finally:
        _IN_PROGRAM.active = False
    t2 = time.perf_counter()
    with _LOCK:
        _TOTALS["trace_s"] += t1 - t0
        _TOTALS["compile_s"] += t2 - t1
        _TOTALS["programs"] += 1
    return exe, bool(getattr(_IN_PROGRAM, "hit", False))


def was_cache_hit() -> bool:
    """Whether this thread's last `compile_program` was served by JAX's
    persistent cache (its executable was loaded, not compiled)."""
    return bool(getattr(_IN_PROGRAM, "hit", False))


def add_loaded(seconds: float) -> None:
    """Adds a program loaded whole from disk (`engine.program_cache`): nothing
    traced, its load seconds as compile seconds, a persistent-cache hit."""
    _traced()
    with _LOCK:
        _TOTALS["compile_s"] += seconds
        _TOTALS["programs"] += 1
        _TOTALS["cache_requests"] += 1
        _TOTALS["cache_hits"] += 1


def snapshot() -> dict:
    """The process's totals so far (trace_s, compile_s, programs,
    cache_requests, cache_hits)."""
    with _LOCK:
        return dict(_TOTALS)


def since(snap: dict | None) -> dict:
    """What was added to the totals after `snap` (None: since the process started)."""
    now = snapshot()
    return now if snap is None else {k: now[k] - snap[k] for k in now}


def cache_state(d: dict) -> str:
    """'off' (the persistent cache was not asked), 'hit' (every program loaded
    from it), 'miss' (every program compiled) or 'mixed', of a `since` record;
    'none' when nothing compiled."""
    if not d["programs"]:
        return "none"
    if not d["cache_requests"]:
        return "off"
    if d["cache_hits"] >= d["programs"]:
        return "hit"
    return "miss" if d["cache_hits"] == 0 else "mixed"


def process_age() -> float | None:
    """Seconds since this process started (Python's start and every import
    included), from /proc; None where there is no /proc."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def note_import() -> None:
    """Notes this process's start-up so far (`process_age`) as its import
    seconds: the command line calls it when its work begins."""
    _IMPORT_S[0] = process_age()


def timing(snap: dict | None, run_s: float, total_s: float | None = None) -> dict:
    """The `timing` record of a run's meta.json: `import_s` (the process's
    start and imports before the command's work began, `note_import`; None
    outside the command line), then from the clock since `snap`: `trace_s`
    (jit's tracing and lowering), `compile_s` (XLA's compile, or the
    persistent cache's load), `programs`, `cache` (`cache_state`) and
    `cache_hits`; `run_s` (the programs running) and `total_s` (the work's
    seconds, import not included) where given."""
    d = since(snap)
    out = {"import_s": _IMPORT_S[0], "trace_s": d["trace_s"], "compile_s": d["compile_s"], "programs": d["programs"],
           "cache": cache_state(d), "cache_hits": d["cache_hits"], "run_s": run_s}
    if total_s is not None:
        out["total_s"] = total_s
    return out
