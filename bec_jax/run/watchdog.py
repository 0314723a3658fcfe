"""A stall watchdog for long runs: a run that stops making progress is stopped
with a record of where it hung, instead of waiting forever.

jaxlib's CPU backend can deadlock (batched LAPACK splits its work over XLA's
thread pool and then waits on that same pool): the process sits idle for ever,
using no CPU. So progress is measured by the process's CPU time (all threads),
not by the clock: a computing run uses CPU, a deadlocked one does not. The
runner also calls `beat()` on every finished chunk and time segment, so only a
wait inside one chunk or segment counts. Waits that legitimately use no CPU
must stay shorter than the timeout: a GPU computing a chunk while the host
waits (so the default is off on GPUs), a `--chunks` part waiting up to 60 s for
another to write the manifest, a `jax.distributed` process waiting for a peer.

    with Watchdog(120, "runs/x", "to continue: bec-jax run --out runs/x --resume"):
        runner.run_to_dir(spec, "runs/x", ...)

After `timeout` seconds with less than `min_cpu` CPU-seconds and no `beat()`,
the watchdog writes every thread's stack to `OUT/stall-<pid>.txt`, prints one
line to stderr and ends the process at once with `EXIT_STALLED` (75, EX_TEMPFAIL:
try again). A hung thread cannot be stopped from Python, so nothing else could
end it; the files a run writes are all written atomically, so what was saved
(finished chunks, checkpointed segments) stays valid for a resume.
"""
from __future__ import annotations

import faulthandler
import math
import os
import sys
import tempfile
import threading
import time

EXIT_STALLED = 75  # EX_TEMPFAIL (sysexits.h): a temporary failure, try again
ENV_VAR = "BEC_JAX_STALL_TIMEOUT"
DEFAULT_TIMEOUT_S = 120.0  # on the CPU backend; off elsewhere (see `timeout_for`)
MIN_CPU_S = 0.5  # less CPU than this over the whole interval counts as none

_current: Watchdog | None = None  # the innermost active watchdog, for `beat()`


def beat() -> None:
    """Tells the active watchdogs (if any) that the run made progress: a chunk or
    a segment finished. Cheap; callable from any thread."""
    now = time.monotonic()
    w = _current
    while w is not None:
        w._last_beat = now  # one attribute store: no lock needed
        w = w._outer


def parse_timeout(text, source: str = "--stall-timeout") -> float:
    """A stall timeout in seconds from `text` (0 turns the watchdog off);
    `ValueError` naming stall_timeout and `source` for anything but a number >= 0."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        v = float("nan")
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"stall_timeout: {source} must be a number of seconds >= 0 (0 turns the watchdog "
                         f"off), got {text!r}")
    return v


def timeout_for(value: float | None = None) -> float:
    """The stall timeout in seconds (0: no watchdog): `value` (a --stall-timeout)
    when given, else the environment variable BEC_JAX_STALL_TIMEOUT, else 120 s
    on JAX's CPU backend and 0 on a GPU or TPU, where the host waits idle while
    the device computes, for as long as a chunk takes. `ValueError` naming
    stall_timeout for anything but a number >= 0."""
    if value is not None:
        return parse_timeout(value)
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return parse_timeout(env, ENV_VAR)
    import jax  # initialises the backends: call this once the run has set JAX up
    return DEFAULT_TIMEOUT_S if jax.default_backend() == "cpu" else 0.0


class Watchdog:
    """While active (a context manager), a daemon thread checks every `poll`
    seconds (default timeout/20, at most 1 s) whether the process used at least
    `min_cpu` CPU-seconds (default 0.5, at most a tenth of the timeout) or got a
    `beat()` since it last made progress; after `timeout` seconds without either
    it dumps every thread's stack into `out_dir`/stall-<pid>.txt (the temporary
    directory when `out_dir` does not exist), prints one line to stderr ending
    with `hint` (how to continue) and calls `os._exit(status)`. A timeout <= 0
    makes it do nothing."""

    def __init__(self, timeout: float, out_dir: str, hint: str = "", *, prog: str = "bec-jax",
                 min_cpu: float | None = None, poll: float | None = None, status: int = EXIT_STALLED):
        self.timeout = float(timeout)
        self.out_dir = out_dir
        self.hint = hint
        self.prog = prog
        self.min_cpu = min(MIN_CPU_S, 0.1 * self.timeout) if min_cpu is None else float(min_cpu)
        self.poll = min(1.0, self.timeout / 20) if poll is None else float(poll)
        self.status = status
        self._last_beat = time.monotonic()
        self._outer: Watchdog | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Progress: the watchdog's interval starts again."""
        self._last_beat = time.monotonic()

    def __enter__(self) -> Watchdog:
        global _current
        if self.timeout > 0 and self._thread is None:
            self._outer, _current = _current, self
            self._stop.clear()
            self._last_beat = time.monotonic()
            self._thread = threading.Thread(target=self._watch, name="bec-jax-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        global _current
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            _current = self._outer
        return False

    def _watch(self) -> None:
        since, cpu0 = time.monotonic(), time.process_time()
        while not self._stop.wait(self.poll):
            now, cpu = time.monotonic(), time.process_time()
            if cpu - cpu0 >= self.min_cpu or self._last_beat > since:
                since, cpu0 = now, cpu
            elif now - since >= self.timeout:
                self._stalled(now - since, cpu)

    def _stalled(self, idle: float, cpu: float) -> None:
        # Runs on the watchdog's thread while the others may hold any lock: no
        # imports, no shared file objects; stderr gets its line by os.write.
        path = self._dump(idle, cpu)
        _flush_stdio(1.0)  # what the run printed so far, unless a hung thread holds stdout
        where = f"thread stacks in {path}" if path else "thread stacks could not be written"
        line = f"{self.prog}: stalled: no CPU progress for {self.timeout:g} s; {where}"
        line += f"; {self.hint}" if self.hint else ""
        # On a line of its own where the run's progress line is unfinished (it
        # ends with its next report). The engine is looked up, not imported:
        # this thread must not import.
        engine = sys.modules.get("bec_jax.engine.execute")
        lead = "\n" if engine is not None and engine.progress_line_open() else ""
        os.write(2, (lead + line.replace("\n", " ") + "\n").encode(errors="replace"))
        os._exit(self.status)

    def _dump(self, idle: float, cpu: float) -> str | None:
        name = f"stall-{os.getpid()}.txt"
        # Not into a directory that does not exist yet: creating it would make a
        # fresh --out non-empty (and then refused) for the rerun.
        dirs = ([self.out_dir] if self.out_dir and os.path.isdir(self.out_dir) else []) + [tempfile.gettempdir()]
        for d in dirs:
            path = os.path.join(d, name)
            try:
                with open(path, "w") as f:
                    f.write(f"{self.prog}: stalled at {time.strftime('%Y-%m-%d %H:%M:%S')}: less than "
                            f"{self.min_cpu:g} CPU-seconds and no finished chunk or segment in {idle:.1f} s "
                            f"(stall timeout {self.timeout:g} s; {cpu:.1f} CPU-seconds in all)\n"
                            f"pid {os.getpid()}: {' '.join(sys.argv)}\n\n")
                    f.flush()  # faulthandler writes to the file descriptor directly
                    faulthandler.dump_traceback(f, all_threads=True)
                return path
            except (OSError, ValueError, RuntimeError):
                continue
        return None


def _flush_stdio(wait: float) -> None:
    """Flushes sys.stdout and sys.stderr from a helper thread, waiting at most
    `wait` seconds: a thread that hung while writing holds their lock."""
    def flush():
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:  # noqa: BLE001 -- a closed or odd stream: nothing to save
                pass
    t = threading.Thread(target=flush, daemon=True)
    t.start()
    t.join(wait)
