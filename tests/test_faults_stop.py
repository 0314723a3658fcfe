"""A stop within seconds on any machine (`engine.execute.stop_when`): SIGTERM
while a long compiled call runs ends `bec-jax run` and `bec-jax control` within
2 s, measured on the machine the test runs on, whatever the call's length (or
the compile's); the
abandoned call is computed again on resume, bit for bit; segments shortened by
their measured time change nothing in the results."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from xla_env import xla_flags

from bec_jax.engine import execute
from bec_jax.prediction import sweep
from bec_jax.prediction.spec import SweepSpec

# One long call per chunk: no segments, whatever its length (the stop may not
# wait for a segment boundary).
DRIVER = textwrap.dedent("""
    import sys
    from bec_jax.cli import commands as cli
    from bec_jax.engine import memory
    memory.SEGMENT_UPDATES = 10 ** 13
    sys.exit(cli.main(sys.argv[1:]))
""")

STOP_WITHIN_S = 2.0
ENV = dict(xla_flags(devices=1), BEC_JAX_NO_CACHE="1")


def _start(args: list, out, watch):
    """A DRIVER process running `args` into `out`, once `watch` (a path) exists
    and its program has had time to compile and start running."""
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, *args, "--out", str(out)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not os.path.exists(watch) and proc.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.02)
    return proc


def _stop(proc) -> tuple[float, str]:
    """SIGTERM `proc`: (seconds until it exited, its stderr)."""
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    t = time.monotonic()
    _, err = proc.communicate(timeout=120)
    return time.monotonic() - t, err


LONG_RUN = ["run", "--env", "boyan_chain", "--algorithm", "ctdc", "--alpha", "0.01", "--beta", "0.1", "--zeta", "0.05",
            "--seeds", "1000", "--steps", "50000000", "--log-every", "1000"]  # about a minute in one call


@pytest.mark.parametrize("delay", [0.3, 4.0], ids=["while it compiles", "while its call runs"])
def test_sigterm_ends_a_long_run_within_2_s(tmp_path, delay):
    out = tmp_path / "long"
    proc = _start(LONG_RUN, out, out / "chunks" / "manifest.json")
    time.sleep(delay)  # the compile takes seconds, the call about a minute: longer than the stop may
    took, err = _stop(proc)
    assert proc.returncode == 143, err
    assert took < STOP_WITHIN_S, (took, err)
    assert "interrupted by SIGTERM after 0 of 1 chunks" in err and "--resume" in err
    assert (out / "chunks" / "manifest.json").exists()  # the resume's record is kept


LONG_CONTROL = ["control", "--task", "cliff_walking", "--algorithm", "cgq", "--alpha", "0.1", "--beta", "0.001",
                "--zeta", "0.005", "--episodes", "200000", "--seeds", "64", "--epsilon", "0.05"]


def test_sigterm_ends_a_long_control_call_within_2_s(tmp_path):
    out = tmp_path / "control"
    proc = _start(LONG_CONTROL, out, out / "chunks" / "manifest.json")
    time.sleep(4.0)
    took, err = _stop(proc)
    assert proc.returncode == 143, err
    assert took < STOP_WITHIN_S, (took, err)
    assert "interrupted by SIGTERM" in err and "--resume" in err


# Chunks of about a second each: the signal lands inside the second (and last) chunk's call. Two chunks
# suffice (one saved, one abandoned); a third would add a chunk's run to the resume and the clean run.
CHUNKED = ["run", "--env", "boyan_chain", "--algorithm", "ctdc", "--alpha", "0.01,0.02", "--beta", "0.1",
           "--zeta", "0.05", "--seeds", "200", "--steps", "400000", "--log-every", "20000", "--chunk-size", "1"]


@pytest.mark.long
def test_an_abandoned_call_is_computed_again_on_resume_bit_for_bit(tmp_path):
    out, clean = tmp_path / "stopped", tmp_path / "clean"
    proc = _start(CHUNKED, out, out / "chunks" / "chunk_00000.npz")
    time.sleep(0.3)  # inside chunk 2's call
    took, err = _stop(proc)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal (a very fast machine)")
    assert proc.returncode == 143, err
    assert took < STOP_WITHIN_S, (took, err)
    again = subprocess.run([sys.executable, "-c", DRIVER, "run", "--out", str(out), "--resume"], env=ENV,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    ref = subprocess.run([sys.executable, "-c", DRIVER, *CHUNKED, "--out", str(clean)], env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    with np.load(out / "curves.npz") as a, np.load(clean / "curves.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)  # the same program on one machine


# ------------------------------------------------------------------ segments by measured time

def test_a_segment_measured_too_long_is_halved_until_it_fits():
    S = execute.SEGMENT_SECONDS
    assert execute._measured_blocks(64, 64, 1.9 * S) == 64          # within twice the target: kept
    assert execute._measured_blocks(64, 64, 8 * S) == 8             # 8x too long: an eighth
    assert execute._measured_blocks(64, 64, 5 * S) == 8             # halved until about the target
    assert execute._measured_blocks(64, 16, 100 * S) == 64          # a short remainder says nothing
    assert execute._measured_blocks(1, 1, 100 * S) == 1


def test_segments_shortened_by_time_change_nothing(monkeypatch):
    spec = SweepSpec(env="boyan_chain", algorithm="ctdc", hyperparameters={"alpha": [0.05, 0.2], "beta": [0.1],
                                                                           "zeta": [0.5]},
                     steps=3000, seeds=5, log_every=50)
    whole = sweep.run(spec, chunk_size=2)
    lengths = []
    real = execute._measured_blocks

    def fast_clock(blocks, n, seconds):  # every segment "took" ten targets: 20 blocks, then 2, then 1
        lengths.append(n)
        return real(blocks, n, 10 * execute.SEGMENT_SECONDS)

    monkeypatch.setattr(execute, "_measured_blocks", fast_clock)
    # 20 blocks a segment divide the 60: no program for a shorter last segment, compiled and never run.
    seg = sweep.run(spec, chunk_size=2, segment_blocks=20)
    assert lengths[:3] == [20, 2, 1] and sum(lengths) == 60, lengths
    for k in ("mean", "std", "sem", "alive", "final", "auc_seed", "diverged_step"):
        np.testing.assert_array_equal(getattr(seg, k), getattr(whole, k), err_msg=k)
