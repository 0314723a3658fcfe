"""At a terminal the program is the same: `bec-jax run` with stderr a
pseudo-terminal compiles nothing into its program for the progress line (the
line is the host's), so a run at a terminal finds the program a run without
one kept, and a second run at a terminal compiles nothing."""
import json
import os
import subprocess
import sys

import pytest
from xla_env import xla_flags

# TD on the 2-state example: the claim is about the progress line, not the sweep; a small
# program compiles fast and its summary's exact verdicts are cheap (each run writes them).
RUN = ["run", "--env", "two_state", "--algorithm", "td", "--alpha", "0.05,0.1", "--seeds", "3", "--steps", "200",
       "--log-every", "20"]


def _run(out, cache, tty: bool) -> dict:
    """`bec-jax RUN --out out` with the program cache in `cache`, its stdout and
    stderr a pseudo-terminal when `tty`; the run's meta.json timing."""
    env = dict(xla_flags(devices=1), BEC_JAX_CACHE_DIR=str(cache))
    env.pop("BEC_JAX_NO_CACHE", None)
    cmd = [sys.executable, "-m", "bec_jax.cli", *RUN, "--out", str(out)]
    if tty:
        main, child = os.openpty()
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=child, stderr=child, close_fds=True)
        os.close(child)
        seen = b""
        while True:  # drained as it comes: a full terminal buffer would block the run
            try:
                data = os.read(main, 4096)
            except OSError:  # the terminal closed: the process has exited
                break
            if not data:
                break
            seen += data
        os.close(main)
        assert proc.wait(timeout=300) == 0, seen.decode(errors="replace")
    else:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    with open(os.path.join(out, "meta.json")) as f:
        return json.load(f)["timing"]


def test_a_terminal_run_compiles_nothing_the_second_time(tmp_path):
    if not hasattr(os, "openpty"):
        pytest.skip("no pseudo-terminals on this platform")
    cache = tmp_path / "cache"
    first = _run(tmp_path / "plain", cache, tty=False)
    assert first["programs"] >= 1 and first["cache_hits"] < first["programs"]  # compiled and kept
    for name in ("tty1", "tty2"):  # at a terminal: the very program kept without one
        t = _run(tmp_path / name, cache, tty=True)
        assert t["programs"] >= 1
        assert t["cache_hits"] == t["programs"], t  # every program loaded, none compiled
        assert t["trace_s"] == 0.0, t               # and nothing traced


def test_the_call_line_ticks_while_a_long_call_runs(monkeypatch, capsys):
    """The host's line for a call in flight: silent for its first 2 s, then at
    most once a second, with the time left from the chunks done before."""
    from bec_jax.engine import execute
    now = [100.0]
    monkeypatch.setattr(execute.time, "perf_counter", lambda: now[0])
    line = execute.CallLine(3)
    line.start(0)
    now[0] += 1.5
    line()
    assert capsys.readouterr().err == ""           # under 2 s: nothing
    now[0] += 1.0
    line()
    assert capsys.readouterr().err == "\r[bec-jax] chunk 1/3     2.5s in this chunk"
    now[0] += 0.5
    line()
    assert capsys.readouterr().err == ""           # at most once a second
    now[0] += 7.0
    line.end()                                     # chunk 1 took 10 s
    line.start(1)
    now[0] += 4.0
    line()
    assert capsys.readouterr().err == "\r[bec-jax] chunk 2/3     4.0s in this chunk  ~   6.0s left in this chunk"
    assert execute.progress_line_open()
    execute.end_line()
    assert capsys.readouterr().err == "\n" and not execute.progress_line_open()
