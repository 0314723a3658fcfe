"""The stall watchdog (issue 28, item 3): a run that stops using CPU (jaxlib's CPU
LAPACK deadlock) is stopped with its thread stacks on disk, one line and exit
status 75, and `--resume` then finishes it; a busy or beating run is left alone.

The stalls are injected: a main thread that sleeps, and in `bec-jax run` a user
algorithm whose host callback sleeps (no CPU, like a deadlock) while a flag file
exists. Every subprocess is bounded by a timeout.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from bec_jax.cli.commands import main
from bec_jax.run import watchdog

BEC_JAX = shutil.which("bec-jax") or "bec-jax"

# Backends now, with the default device count: the in-process CLI calls below
# would otherwise set one device per core for the rest of the session.
jax.devices()


def python(code: str, *args, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


# ============================================================ the watchdog alone

SLEEPER = """
import sys, time
from bec_jax.run.watchdog import Watchdog

def sleeping_in_the_main_thread():
    time.sleep(30)

with Watchdog(1.0, sys.argv[1], "rerun it"):
    sleeping_in_the_main_thread()
print("not stopped")
"""


def test_a_sleeping_process_is_stopped_with_its_stacks(tmp_path):
    t0 = time.monotonic()
    p = python(SLEEPER, tmp_path)
    took = time.monotonic() - t0
    assert p.returncode == watchdog.EXIT_STALLED == 75, p.stderr
    assert took < 10, took  # not the 30 s sleep
    assert "not stopped" not in p.stdout
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    m = re.fullmatch(r"bec-jax: stalled: no CPU progress for 1 s; thread stacks in (\S+); rerun it", lines[0])
    assert m, lines[0]
    path = m.group(1)
    assert os.path.dirname(path) == str(tmp_path) and re.fullmatch(r"stall-\d+\.txt", os.path.basename(path))
    text = open(path).read()
    assert "sleeping_in_the_main_thread" in text  # the hung thread's frame
    assert "_stalled" in text  # and the watchdog's own thread: all threads


def test_the_stall_line_does_not_run_into_an_unfinished_progress_line(tmp_path):
    # A chunk's progress line ends with its next report; a stall before then must
    # still print its line whole, on a line of its own.
    code = SLEEPER.replace("with Watchdog(", "from bec_jax.engine import execute\n"
                           "execute._progress(1, 2, time.perf_counter() - 3.0, 1, 2)\nwith Watchdog(")
    p = python(code, tmp_path, timeout=60)
    assert p.returncode == watchdog.EXIT_STALLED, p.stderr
    lines = [x for x in p.stderr.splitlines() if x]  # text mode reads the report's leading "\r" as a newline
    assert re.fullmatch(r"\[bec-jax\] chunk 1/2 +3\.0s elapsed +~ *3\.0s left", lines[0]), lines
    assert re.fullmatch(r"bec-jax: stalled: no CPU progress for 1 s; thread stacks in \S+; rerun it", lines[-1]), lines
    assert len(lines) == 2, lines


def test_a_busy_process_is_not_stopped(tmp_path):
    code = """
import sys, time
from bec_jax.run.watchdog import Watchdog
with Watchdog(1.0, sys.argv[1]):
    t = time.process_time()
    while time.process_time() - t < 3:
        pass
print("finished")
"""
    p = python(code, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "finished" and p.stderr == ""
    assert os.listdir(tmp_path) == []


def test_heartbeats_keep_an_idle_process_alive(tmp_path):
    # A GPU run's host, or a part waiting for its manifest, idles between chunks.
    code = """
import sys, time
from bec_jax.run import watchdog
with watchdog.Watchdog(1.0, sys.argv[1]):
    for _ in range(10):
        time.sleep(0.3)
        watchdog.beat()
print("finished")
"""
    p = python(code, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "finished"


def test_off_and_the_timeout_settings(tmp_path, monkeypatch):
    with watchdog.Watchdog(0, str(tmp_path)) as w:
        assert watchdog._current is None and w._thread is None  # off: no thread
    with watchdog.Watchdog(60, str(tmp_path)) as outer:
        with watchdog.Watchdog(60, str(tmp_path)) as inner:
            assert watchdog._current is inner
            before = (outer._last_beat, inner._last_beat)
            time.sleep(0.01)
            watchdog.beat()  # every active watchdog hears it
            assert outer._last_beat > before[0] and inner._last_beat > before[1]
        assert watchdog._current is outer
    assert watchdog._current is None
    monkeypatch.delenv(watchdog.ENV_VAR, raising=False)
    assert watchdog.timeout_for(3) == 3.0 and watchdog.timeout_for(0) == 0.0
    # 120 s on JAX's CPU backend; off (0) on a GPU, where the host waits idle while the device computes.
    assert watchdog.timeout_for() == (watchdog.DEFAULT_TIMEOUT_S if jax.default_backend() == "cpu" else 0.0)
    monkeypatch.setenv(watchdog.ENV_VAR, "7.5")
    assert watchdog.timeout_for() == 7.5 and watchdog.timeout_for(2) == 2.0  # the option wins
    for bad in ("abc", "-1", "nan", "inf"):
        monkeypatch.setenv(watchdog.ENV_VAR, bad)
        with pytest.raises(ValueError, match=f"stall_timeout: {watchdog.ENV_VAR} must be"):
            watchdog.timeout_for()


def test_a_bad_stall_timeout_is_a_usage_error(capsys, tmp_path, monkeypatch):
    for cmd in (["run", "--env", "baird", "--algorithm", "td"], ["control"], ["study", "f.toml"], ["reproduce"]):
        assert main(cmd + ["--out", str(tmp_path / "x"), "--stall-timeout", "-2"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["bec-jax: error: stall_timeout: --stall-timeout must be a number of seconds >= 0 "
                       "(0 turns the watchdog off), got '-2'"], err
    assert not (tmp_path / "x").exists()
    monkeypatch.setenv(watchdog.ENV_VAR, "soon")
    tiny = ["--alpha", "0.1", "--steps", "20", "--seeds", "2", "--log-every", "10"]
    assert main(["run", "--env", "boyan_chain", "--algorithm", "td", *tiny, "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"bec-jax: error: stall_timeout: {watchdog.ENV_VAR} must be a number of seconds >= 0 (0 turns the "
        "watchdog off), got 'soon'"]
    assert not (tmp_path / "x").exists()  # refused before anything is written


def test_the_runner_beats_on_every_chunk(tmp_path, monkeypatch):
    from bec_jax.prediction.spec import SweepSpec
    from bec_jax.run import runner
    beats = []
    monkeypatch.setattr(watchdog, "beat", lambda: beats.append(1))
    spec = SweepSpec(env="boyan_chain", algorithm="td", alpha=(0.1, 0.2, 0.3), steps=20, seeds=2, log_every=10)
    runner.run_to_dir(spec, str(tmp_path / "run"), chunk_size=1, devices=jax.devices()[:1])
    assert len(beats) >= 3


# ============================================================ end to end: bec-jax run, stalled and resumed

STALLING_ALGORITHM = '''
"""TD(0) whose update calls the host while the flag file $STALL_FLAG exists, and
then sleeps, using no CPU, as a deadlocked XLA:CPU would, but only for step sizes
above 0.15, so the first chunk finishes and is saved before the stall."""
import os
import time

import jax
import numpy as np

from bec_jax.algorithms import Algorithm, step_size, td

FLAG = os.environ["STALL_FLAG"]


def _wait_while_flagged(eta):
    if np.max(np.asarray(eta)) > 0.15:
        while os.path.exists(FLAG):
            time.sleep(0.05)


def update(state, transition, eta):
    jax.debug.callback(_wait_while_flagged, eta)
    return td.update(state, transition, eta)


ALG = Algorithm(name="stalling_td", init=td.init, update=update,
                hyperparameters=(step_size("eta", "step size"),), equations="eq. (7) [td(0)theta]")
'''

RUN = ["run", "--env", "boyan_chain", "--algorithm", "stalling_mod:ALG", "--eta", "0.1,0.2", "--steps", "20",
       "--seeds", "2", "--log-every", "10", "--chunk-size", "1"]


@pytest.mark.long
def test_a_stalled_run_stops_and_resumes_to_the_same_results(tmp_path):
    (tmp_path / "stalling_mod.py").write_text(STALLING_ALGORITHM)
    flag = tmp_path / "stall.flag"
    flag.write_text("")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, STALL_FLAG=str(flag), BEC_JAX_CPU_DEVICES="1", BEC_JAX_NO_CACHE="1")
    env.pop(watchdog.ENV_VAR, None)
    out, clean = tmp_path / "run", tmp_path / "clean"

    def bec(args):
        return subprocess.run([BEC_JAX] + args, capture_output=True, text=True, env=env, timeout=90)

    p = bec(RUN + ["--out", str(out), "--stall-timeout", "3"])
    assert p.returncode == 75, (p.returncode, p.stderr)
    lines = [x for x in p.stderr.splitlines() if "stalled" in x]
    assert len(lines) == 1 and p.stderr.splitlines()[-1] == lines[0], p.stderr
    m = re.fullmatch(r"bec-jax: stalled: no CPU progress for 3 s; thread stacks in (\S+); "
                     r"to continue: bec-jax run --out (\S+) --resume", lines[0])
    assert m and m.group(2) == str(out), lines[0]
    assert glob.glob(str(out / "stall-*.txt")) == [m.group(1)]
    assert "_wait_while_flagged" in open(m.group(1)).read()  # the hung callback's frame
    saved = sorted(os.listdir(out / "chunks"))
    assert "chunk_00000.npz" in saved and "chunk_00001.npz" not in saved  # the first chunk was kept

    flag.unlink()
    p = bec(RUN + ["--out", str(out), "--stall-timeout", "3", "--resume"])
    assert p.returncode == 0, p.stderr
    assert "1 of 2 chunks from the interrupted run" in p.stdout
    p = bec(RUN + ["--out", str(clean)])
    assert p.returncode == 0, p.stderr
    with np.load(out / "curves.npz") as a, np.load(clean / "curves.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k  # bit for bit: same program, same machine
    assert json.load(open(out / "summary.json")) == json.load(open(clean / "summary.json"))
