"""Waiting for a compiled call without losing the process to it.

XLA cannot cancel a computation or a compile, and a thread blocked in one does
not run Python's signal handlers. So a call's results are awaited (and a
program compiled, `run_stoppable`) by a helper thread while the caller waits
on it in short, interruptible waits (`await_result`):
between them it can tick a progress line, and inside `stop_when(check)` it
gives up on the call as soon as `check()` says stop (`Stopped`). The call is
then left running; a process that stopped this way exits without waiting for
it (`abandoned`).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
from typing import Callable

import jax

_WAIT_S = 0.05         # how often an awaited call asks whether to stop
_STOP: list = [None]   # the check of the innermost `stop_when`
_ABANDONED = [False]   # a call was left running by a stop
_WAITER: list = []     # one thread that blocks on results, so the main thread stays free for signals
_WORKERS: list = []    # threads that compile while the caller waits, so a stop need not wait for XLA


class Stopped(Exception):
    """A run stopped while a call was in flight (`stop_when`): `chunk` the chunk
    abandoned (-1: a compile, `run_stoppable`); `segment` (chunk, log blocks
    done, log blocks) where a segmented chunk's last finished segment was
    checkpointed."""

    def __init__(self, chunk: int, segment: tuple | None = None):
        super().__init__(chunk)
        self.chunk = chunk
        self.segment = segment


@contextlib.contextmanager
def stop_when(check: Callable[[], bool]):
    """While active, `run_chunks` awaits each call's results in short waits and
    raises `Stopped` as soon as `check()` is true (a signal caught, say)."""
    old = _STOP[0]
    _STOP[0] = check
    try:
        yield
    finally:
        _STOP[0] = old


def abandoned() -> bool:
    """Whether a stop left a computation running on a device: the process should
    exit at once (`os._exit`) rather than wait for it at interpreter exit."""
    return _ABANDONED[0]


def await_result(x, chunk: int, tick: Callable | None = None):
    """`x` (a call's outputs) once ready, calling `tick()` while it runs (a
    progress line); `Stopped` if the innermost `stop_when` asks for a stop
    first (the call is left running)."""
    check = _STOP[0]
    if check is None and tick is None:
        return x
    if check is not None and check():
        _ABANDONED[0] = True  # `x` is a call already dispatched (its outputs), left running
        raise Stopped(chunk)
    return _in_thread(_WAITER, 1, "bec-jax-wait", jax.block_until_ready, (x,), chunk, check, tick)


def run_stoppable(fn: Callable, *args):
    """`fn(*args)`; inside `stop_when`, run in a helper thread while this one
    waits in short waits, so that a stop (`Stopped`) need not wait for it (a
    compile: XLA's seconds cannot be interrupted either). Thread-local JAX
    settings of the caller (a `with jax.enable_x64()` block) do not reach the
    helper thread; bec_jax sets its own globally."""
    check = _STOP[0]
    if check is None:
        return fn(*args)
    if check():
        raise Stopped(-1)
    return _in_thread(_WORKERS, 2, "bec-jax-compile", fn, args, -1, check)


def _in_thread(pool: list, workers: int, name: str, fn: Callable, args: tuple, chunk: int, check, tick=None):
    """`fn(*args)` run by `pool`'s threads (made on first use) while this thread
    waits in short waits, a condition wait in which a signal's handler runs:
    `tick()` between them, `Stopped(chunk)` once `check()` says stop (`fn` is
    left running, and the process exits without waiting for it)."""
    if not pool:
        pool.append(concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=name))
    done = pool[0].submit(fn, *args)
    while True:
        try:
            return done.result(timeout=_WAIT_S)
        except concurrent.futures.TimeoutError:
            if check is not None and check():
                _ABANDONED[0] = True
                raise Stopped(chunk) from None
            if tick is not None:
                tick()
