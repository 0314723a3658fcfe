"""Faults in the run directory (issue 44): a chunk file, checkpoint or streamed
log that does not prove what it is (truncated, overwritten, another chunk's) is
set aside with one line on stderr and recomputed, to a clean run's bits;
--overwrite deletes only what bec-jax wrote; one run at a time writes a
directory; leftover temporary files go; a study's sweep cannot be named
study.json. Every case goes through the command line, in this process (one
device, programs compiled once) except the concurrent run."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest
from xla_env import xla_flags

from bec_jax.cli import commands as cli
from bec_jax.engine import execute, memory
from bec_jax.run import rundir

# JAX's backends with the default device count now (one CPU device), before the
# in-process CLI calls below could give them one device per core.
jax.devices()

GRID = ["run", "--env", "boyan_chain", "--algorithm", "ctdc", "--alpha", "0.01,0.05,0.1,0.2", "--beta", "0.1",
        "--zeta", "0.01", "--seeds", "3", "--steps", "400", "--log-every", "20", "--chunk-size", "1"]
RESULT_FILES = ["curves.npz", "meta.json", "summary.csv", "summary.json"]


def _cli(argv, capsys):
    code = cli.main([str(a) for a in argv])
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    return code, [x for x in lines if x.strip() and not x.startswith("[bec-jax] ")]  # less the progress lines


def _fail_at(mp, n: int) -> None:
    """The n-th compiled call runs out of memory (the run keeps what it finished)."""
    real, calls = execute.call, {"n": 0}

    def failing(exe, *args):
        calls["n"] += 1
        if calls["n"] == n:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 7800001608 bytes")
        return real(exe, *args)

    mp.setattr(execute, "call", failing)


def assert_same_results(a, b):
    """curves.npz bit for bit and summary.json equal."""
    with np.load(a / "curves.npz") as za, np.load(b / "curves.npz") as zb:
        assert sorted(za.files) == sorted(zb.files)
        for k in za.files:
            assert za[k].dtype == zb[k].dtype and za[k].shape == zb[k].shape, k
            assert np.array_equal(za[k], zb[k], equal_nan=za[k].dtype.kind == "f"), k
    assert json.load(open(a / "summary.json")) == json.load(open(b / "summary.json"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A clean run of the grid, in one go."""
    out = tmp_path_factory.mktemp("ref") / "run"
    assert cli.main(GRID + ["--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == RESULT_FILES
    return out


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, reference):
    """The grid stopped in its third chunk: chunks 0 and 1 saved (one call each)."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    with pytest.MonkeyPatch.context() as mp:
        _fail_at(mp, 3)
        assert cli.main(GRID + ["--out", str(out)]) == 2
    assert sorted(os.listdir(out / "chunks")) == ["chunk_00000.npz", "chunk_00001.npz", "manifest.json"]
    return out


@pytest.fixture(scope="module")
def segmented(tmp_path_factory, reference):
    """The grid run in segments, stopped inside chunk 1: chunk 0 saved with its
    logs streamed to chunks/chunk_00000/*.npy, chunk 1 checkpointed."""
    out = tmp_path_factory.mktemp("segmented") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(memory, "SEGMENT_UPDATES", 7 * (3 * 20 + memory.BLOCK_OVERHEAD))  # 7 log blocks a segment
        _fail_at(mp, 5 + 3)  # chunk 0: start, 3 segments, finish; chunk 1: start, a segment, then out of memory
        assert cli.main(GRID + ["--out", str(out)]) == 2
    chunks = out / "chunks"
    assert json.load(open(chunks / "manifest.json"))["blocks_per_segment"] == 7
    with np.load(chunks / "chunk_00000.npz") as z:
        assert sorted(z[rundir.STREAMED_KEY].tolist()) == ["alive", "mean", "sem", "std"]
    with np.load(chunks / "chunk_00001" / rundir.CHECKPOINT_FILE) as z:
        assert int(z["next_block"]) == 7
    return out


def _copy(src, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(src, out)
    return out


def _resume_and_check(out, reference, capsys, says: str, moved: dict):
    """Resumes `out`: exit 0, exactly one line on stderr (naming `says`), the
    files set aside kept byte for byte (`moved`: set-aside name -> bytes), the
    results a clean run's."""
    code, err = _cli(["run", "--out", out, "--resume"], capsys)
    assert code == 0, err
    assert len(err) == 1 and err[0].startswith("bec-jax: resume: ") and "set aside as" in err[0], err
    assert says in err[0], err
    assert_same_results(reference, out)
    aside = out / "chunks" / rundir.SET_ASIDE_DIR
    assert sorted(os.listdir(out)) == sorted(RESULT_FILES + ["chunks"])
    assert os.listdir(out / "chunks") == [rundir.SET_ASIDE_DIR]  # the rest of the chunk store is gone
    assert sorted(os.listdir(aside)) == sorted(moved)
    for name, data in moved.items():
        assert (aside / name).read_bytes() == data, name


# ------------------------------------------------------------------ chunk files that do not prove themselves

def test_truncated_chunk_file_is_set_aside_and_recomputed(reference, stopped, tmp_path, capsys):
    out = _copy(stopped, tmp_path)
    f = out / "chunks" / "chunk_00000.npz"
    data = f.read_bytes()[:300]
    f.write_bytes(data)
    _resume_and_check(out, reference, capsys, "chunk_00000.npz' cannot be read", {"chunk_00000.npz.1": data})


def test_another_chunks_file_is_set_aside_and_recomputed(reference, stopped, tmp_path, capsys):
    out = _copy(stopped, tmp_path)
    chunks = out / "chunks"
    shutil.copy(chunks / "chunk_00000.npz", chunks / "chunk_00001.npz")  # cp chunk 0 over chunk 1
    data = (chunks / "chunk_00001.npz").read_bytes()
    _resume_and_check(out, reference, capsys, "chunk_00001.npz' holds chunk 0, not chunk 1",
                      {"chunk_00001.npz.1": data})


def _flip(path, at: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    return bytes(data)


def _truncate(path) -> bytes:
    data = path.read_bytes()
    data = data[:len(data) // 2]
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("name,change,says,aside", [
    # A finished chunk's streamed log: a byte overwritten, or the file cut short.
    ("chunk_00000/mean.npy", lambda p: _flip(p, -3), "chunk_00000/mean.npy', which is missing or does not match",
     ["chunk_00000.npz.1", "chunk_00000-mean.npy.1"]),
    ("chunk_00000/mean.npy", _truncate, "does not match its sha256",
     ["chunk_00000.npz.1", "chunk_00000-mean.npy.1"]),
    # A checkpoint cut short, and a log point it vouches for overwritten.
    ("chunk_00001/checkpoint.npz", _truncate, "checkpoint.npz' cannot be read",
     ["chunk_00001-checkpoint.npz.1"]),
    ("chunk_00001/alive.npy", lambda p: _flip(p, 128), "alive.npy', whose first 8 log points do not match",
     ["chunk_00001-alive.npy.1", "chunk_00001-checkpoint.npz.1"]),
])
def test_segmented_run_files_that_changed_are_set_aside(reference, segmented, tmp_path, capsys, name, change, says,
                                                        aside):
    out = _copy(segmented, tmp_path)
    target = out / "chunks" / name
    changed = change(target)
    moved = {}
    for a in aside:  # what is set aside: the changed file as it is now, what lists it as it was
        orig = out / "chunks" / a[:-2].replace("-", "/")
        moved[a] = changed if orig == target else orig.read_bytes()
    _resume_and_check(out, reference, capsys, says, moved)


# ------------------------------------------------------------------ --overwrite, concurrent runs, leftovers

def test_overwrite_deletes_only_what_bec_jax_wrote(reference, tmp_path, capsys):
    out = tmp_path / "d"
    (out / "chunks").mkdir(parents=True)
    user = out / "chunks" / "important.dat"
    user.write_text("x")
    (out / "notes.txt").write_text("mine")
    code, err = _cli(GRID + ["--out", out, "--overwrite"], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("bec-jax: error: out: ") and str(user) in err[0], err
    assert user.read_text() == "x" and sorted(os.listdir(out)) == ["chunks", "notes.txt"]
    assert os.listdir(out / "chunks") == ["important.dat"]
    # Moved away, --overwrite starts over: the user's file at the top is left alone.
    user.unlink()
    code, err = _cli(GRID + ["--out", out, "--overwrite"], capsys)
    assert code == 0 and err == [], err
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(out)) == sorted(RESULT_FILES + ["notes.txt"])
    assert_same_results(reference, out)


SLOW_DRIVER = textwrap.dedent("""
    import sys, time
    from bec_jax.cli import commands as cli
    from bec_jax.engine import execute
    real = execute.call
    def slow(exe, *args):  # a run that takes long enough for a second one to come
        time.sleep(1.0)
        return real(exe, *args)
    execute.call = slow
    sys.exit(cli.main(sys.argv[1:]))
""")


def test_two_overwrite_runs_into_one_directory(reference, tmp_path, capsys):
    out = tmp_path / "d"
    env = xla_flags(devices=1, cpu=False)  # compared with `reference`, run on the default device
    first = subprocess.Popen([sys.executable, "-c", SLOW_DRIVER, *GRID, "--out", str(out), "--overwrite"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not (out / "chunks" / "manifest.json").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() - t0 < 120
            time.sleep(0.02)
        code, err = _cli(GRID + ["--out", out, "--overwrite"], capsys)
        assert first.poll() is None  # the second came while the first ran
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith("bec-jax: error: out: another bec-jax run is writing to"), err
        _, first_err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, first_err
    assert sorted(os.listdir(out)) == RESULT_FILES  # the lock file is gone too
    assert_same_results(reference, out)


def test_leftover_temporary_files_and_a_stale_lock_are_removed_on_resume(reference, stopped, tmp_path, capsys):
    out = _copy(stopped, tmp_path)
    # What a kill -9 during the final write leaves: a temporary file, the lock file.
    (out / ".tmp-k9x2ab.json").write_text("{\"half\": ")
    (out / "chunks" / ".tmp-3fq1zz.npz").write_bytes(b"PK")
    (out / ".bec-jax.lock").write_text("")  # rundir.LOCK_FILE, which no process holds
    code, err = _cli(["run", "--out", out, "--resume"], capsys)
    assert code == 0 and err == [], err
    assert not (out / ".tmp-k9x2ab.json").exists()
    assert sorted(os.listdir(out)) == RESULT_FILES
    assert_same_results(reference, out)


# ------------------------------------------------------------------ a study's sweep named study.json

def test_a_sweep_named_like_the_studys_file_is_refused_before_anything_is_written(tmp_path, capsys):
    toml = tmp_path / "s.toml"
    toml.write_text(textwrap.dedent("""
        seeds = 2
        steps = 40
        log_every = 20

        [[sweep]]
        name = "study.json"
        env = "boyan_chain"
        algorithm = "ctdc"
        alpha = [0.1]
        beta = [0.1]
        zeta = [0.01]
    """))
    out = tmp_path / "st"
    code, err = _cli(["study", toml, "--out", out], capsys)
    assert not out.exists()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("bec-jax: error: sweep[0] (study.json).name: 'study.json'"), err
