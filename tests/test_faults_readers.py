"""Readers of a damaged run (issue 54, item 5) and chunk files that must not
prove themselves (item 9's first two surviving mutants). `plot`, `export`,
`compare --stat iqm` and `status` of a run whose curves.npz was cut short or
overwritten say so in one line, naming the file and the way back: `--resume`
where the run's chunks are still there (then bit for bit a clean run's
results), the study's `--resume` for a study's sweep, else running it again;
nothing is written. A chunk whose data changed under its old checksum, and a
chunk of the same sweep run at another chunk size, are set aside by a resume,
which then gives a clean run's results bit for bit; `status` (item 7) counts
only the chunks a resume would use. Through the command line, in this process."""
import json
import os
import shutil

import jax
import numpy as np
import pytest
from test_faults_slurm import SWEEP, _tool

from bec_jax.cli import commands as cli
from bec_jax.run import rundir, slurm

jax.devices()  # one CPU device, before the in-process CLI calls below could make one per core

GRID = 'env = "boyan_chain"\nalgorithm = "td"\nhyperparameters = {alpha = [0.01, 0.05, 0.1, 0.2]}\nseeds = 2\n' \
       'steps = 40\nlog_every = 10\n'
STUDY = "seeds = 2\nsteps = 40\nlog_every = 10\n[[sweep]]\nname = \"first\"\nenv = \"boyan_chain\"\n" \
        "algorithm = \"td\"\nalpha = [0.01, 0.05, 0.1, 0.2]\n"
RESULT_FILES = ["curves.npz", "meta.json", "summary.csv", "summary.json"]


def _cli(argv, capsys):
    code = cli.main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, [x for x in cap.err.replace("\r", "\n").splitlines()
                           if x.strip() and not x.startswith("[bec-jax] ")]


def assert_same_results(a, b):
    """curves.npz bit for bit and summary.json equal."""
    with np.load(a / "curves.npz") as za, np.load(b / "curves.npz") as zb:
        assert sorted(za.files) == sorted(zb.files)
        for k in za.files:
            assert za[k].dtype == zb[k].dtype and za[k].shape == zb[k].shape, k
            assert np.array_equal(za[k], zb[k], equal_nan=za[k].dtype.kind == "f"), k
    assert json.load(open(a / "summary.json")) == json.load(open(b / "summary.json"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """ref: the sweep run in one go (chunk size 1); parts: every chunk of it
    saved by one part of one (nothing assembled); two: its chunk 0 at chunk
    size 2; study: a study of the same sweep."""
    root = tmp_path_factory.mktemp("runs")
    (root / "g.toml").write_text(GRID)
    base = ["run", "--config", root / "g.toml"]
    assert cli.main([str(a) for a in base + ["--out", root / "ref", "--chunk-size", "1"]]) == 0
    assert cli.main([str(a) for a in base + ["--out", root / "parts", "--chunk-size", "1", "--chunks", "1/1"]]) == 0
    assert cli.main([str(a) for a in base + ["--out", root / "two", "--chunk-size", "2", "--chunks", "1/1"]]) == 0
    (root / "s.toml").write_text(STUDY)
    assert cli.main(["study", str(root / "s.toml"), "--out", str(root / "study")]) == 0
    assert sorted(os.listdir(root / "parts" / "chunks")) == [f"chunk_0000{i}.npz" for i in range(4)] + \
        ["manifest.json"]
    return root


def _snapshot(d) -> dict:
    return {os.path.relpath(os.path.join(p, f), d): open(os.path.join(p, f), "rb").read()
            for p, _, fs in os.walk(d) for f in fs}


def _flip(path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------ item 5: readers of a damaged run

def test_readers_of_a_truncated_curves_npz_give_one_line_and_write_nothing(runs, tmp_path, capsys):
    pytest.importorskip("rliable")
    pytest.importorskip("tensorboard")
    d = tmp_path / "run"
    shutil.copytree(runs / "ref", d)
    os.truncate(d / "curves.npz", 1000)  # truncate -s 1000 RUN/curves.npz
    before = _snapshot(d)
    why = (f"{str(d / 'curves.npz')!r} is damaged (BadZipFile: File is not a zip file); its chunks are gone (removed "
           "once the results were written): run the sweep again (its spec is in meta.json), into another directory "
           "or with --overwrite")
    for argv, field in ((["plot", d], "dirs"), (["export", d, "--to", "tensorboard", "--out", tmp_path / "tb"], "dirs"),
                        (["compare", d, "--out", tmp_path / "f.png", "--stat", "iqm"], "dirs"),
                        (["compare", d, "--out", tmp_path / "f.png"], "dirs"), (["status", d], "dir")):
        code, out, err = _cli(argv, capsys)
        assert code == 2 and out == "" and err == [f"bec-jax: error: {field}: {why}"], (argv, err)
    assert _snapshot(d) == before and sorted(os.listdir(tmp_path)) == ["run"]


def test_another_npz_in_place_of_curves_npz_is_named(runs, tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(runs / "ref", d)
    np.savez(d / "curves.npz", x=np.zeros(3))  # reads as a zip of arrays, but not this run's
    code, _, err = _cli(["plot", d], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"bec-jax: error: dirs: {str(d / 'curves.npz')!r} is damaged (not this run's arrays: "
                             "KeyError: "), err
    assert not (d / "plots").exists()


def test_a_damaged_result_whose_chunks_are_kept_says_resume_and_resumes_bit_for_bit(runs, tmp_path, capsys):
    """The parts saved every chunk, and the result files are there with a
    byte of curves.npz overwritten: the readers name the member whose CRC
    fails and `--resume`; the resume writes a clean run's results."""
    d = tmp_path / "run"
    shutil.copytree(runs / "parts", d)
    for f in RESULT_FILES:
        shutil.copy(runs / "ref" / f, d / f)
    _flip(d / "curves.npz", 2000)
    code, _, err = _cli(["plot", d], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"bec-jax: error: dirs: {str(d / 'curves.npz')!r} is damaged (its member "), err
    assert err[0].endswith(f"does not match its CRC); the run's chunks are still in {str(d / 'chunks')!r}: "
                           f"bec-jax run --out {d} --resume writes the results again"), err
    code, _, err = _cli(["run", "--out", d, "--resume"], capsys)
    assert code == 0 and err == [], err
    assert_same_results(runs / "ref", d)
    assert sorted(os.listdir(d)) == RESULT_FILES
    code, _, err = _cli(["plot", d], capsys)
    assert code == 0 and err == [], err


def test_a_damaged_sweep_of_a_study_says_how_the_study_computes_it_again(runs, tmp_path, capsys):
    s = tmp_path / "study"
    shutil.copytree(runs / "study", s)
    f = s / "first" / "curves.npz"
    os.truncate(f, 1000)
    code, _, err = _cli(["plot", s], capsys)
    assert code == 2 and err == [f"bec-jax: error: dirs: {str(f)!r} is damaged (BadZipFile: File is not a zip file); "
                                 f"its chunks are gone: move {str(f)!r} away, then bec-jax study --out {s} --resume "
                                 "computes that sweep again"], err
    shutil.move(f, tmp_path / "damaged.npz")  # as the line says
    code, _, err = _cli(["study", "--out", s, "--resume"], capsys)
    assert code == 0 and err == [], err
    assert_same_results(runs / "study" / "first", s / "first")


# ------------------------------------------------------------------ item 9: chunks that must not prove themselves

def test_a_resume_sets_aside_a_changed_value_and_another_chunk_sizes_chunk(runs, tmp_path, capsys):
    """Chunk 1 with one value changed (its _index, _fingerprint and _checksum
    kept), and chunk 0 of the chunk-size-2 run of the same sweep put in as
    chunk 0: both set aside, each in a line, byte for byte; the resumed run's
    results a clean run's."""
    d = tmp_path / "run"
    shutil.copytree(runs / "parts", d)
    c = d / "chunks"
    with np.load(c / "chunk_00001.npz") as z:
        arrays = {k: z[k] for k in z.files}
    assert {"_index", "_fingerprint", "_checksum"} <= set(arrays)
    key = next(k for k in sorted(arrays) if not k.startswith("_") and arrays[k].dtype.kind == "f")
    flat = arrays[key].copy().reshape(-1)
    flat[np.flatnonzero(np.isfinite(flat))[0]] += 1.0
    arrays[key] = flat.reshape(arrays[key].shape)
    np.savez(c / "chunk_00001.npz", **arrays)
    shutil.copy(runs / "two" / "chunks" / "chunk_00000.npz", c / "chunk_00000.npz")
    moved = {"chunk_00000.npz.1": (c / "chunk_00000.npz").read_bytes(),
             "chunk_00001.npz.1": (c / "chunk_00001.npz").read_bytes()}
    code, _, err = _cli(["run", "--out", d, "--resume"], capsys)
    assert code == 0 and len(err) == 2, err
    assert "chunk_00000.npz' belongs to another run (its spec, chunk size or model differ" in err[0], err
    assert "chunk_00001.npz' does not match its checksum" in err[1], err
    assert_same_results(runs / "ref", d)
    aside = c / "set_aside"
    assert sorted(os.listdir(aside)) == sorted(moved)
    for name, data in moved.items():
        assert (aside / name).read_bytes() == data, name


# ------------------------------------------------------------------ item 7: status counts what a resume would use

def _changed_value(src, dst) -> None:
    """Chunk file `src` with one value of its data changed, its index, fingerprint and checksum kept."""
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    key = next(k for k in sorted(arrays) if not k.startswith("_") and arrays[k].dtype.kind == "f"
               and arrays[k].size)
    flat = arrays[key].copy().reshape(-1)
    j = np.flatnonzero(np.isfinite(flat))[0]
    flat[j] += 1.0
    arrays[key] = flat.reshape(arrays[key].shape)
    np.savez(dst, **arrays)


def test_status_counts_only_the_chunks_a_resume_would_use(runs, tmp_path, capsys):
    """Planted chunk files (junk, a copy of another chunk, a chunk 99 of 4, one
    value changed under its old checksum, chunk 0 of the same sweep at another
    chunk size) are not counted; the counts are those `--resume` keeps."""
    d = tmp_path / "run"
    shutil.copytree(runs / "parts", d)
    c = d / "chunks"
    np.savez(c / "chunk_00001.npz", x=np.zeros(1))                   # junk
    shutil.copy(c / "chunk_00000.npz", c / "chunk_00099.npz")        # "chunk 99 of 4"
    _changed_value(c / "chunk_00002.npz", c / "chunk_00002.npz")    # data changed, checksum kept
    shutil.copy(runs / "two" / "chunks" / "chunk_00000.npz", c / "chunk_00003.npz")
    code, out, err = _cli(["status", d, "--parts", "2"], capsys)
    assert code == 0 and err == [], err
    assert out.splitlines()[1:4] == ["chunks saved: 1 of 4", "part 1: missing (1 of 2 chunks)",
                                     "part 2: missing (0 of 2 chunks)"]
    assert slurm.read_sweep(str(d)).saved == {0}
    # What a resume keeps of the same files: the same chunk.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rundir.ChunkStore, "_set_aside", lambda self, paths, why, then: None)
        assert sorted(rundir.ChunkStore(str(d)).load_done(clean=False)) == [0]
    # A copy of chunk 0 over chunk 3 (another chunk), and chunk 0 of the chunk-size-2 run as chunk 0.
    shutil.copy(c / "chunk_00000.npz", c / "chunk_00003.npz")
    shutil.copy(runs / "two" / "chunks" / "chunk_00000.npz", c / "chunk_00000.npz")
    assert slurm.read_sweep(str(d)).saved == frozenset()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """tests/test_faults_slurm.py's stand-in Slurm: an sbatch that records its
    calls and answers 101, 102, ...; an squeue that lists what squeue.txt holds."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "calls.txt"
    _tool(bin_, "sbatch", f'echo "sbatch $*" >> {calls}\nn=$(grep -c ^sbatch {calls})\necho $((100 + n))\n')
    _tool(bin_, "squeue", f"cat {tmp_path}/squeue.txt 2>/dev/null; exit 0\n")
    _tool(bin_, "scancel", f'echo "scancel $*" >> {calls}\n')
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweep.toml").write_text(SWEEP)
    return tmp_path


def test_status_from_the_files_alone(fake, runs, capsys):
    """Parts 1 and 3 of 3 saved their chunks (real ones: status reads each as
    a resume would), part 2 wrote a log and stopped: done, failed (its last
    line), done; and how to finish. (Moved here from tests/test_submit.py,
    whose planted zero arrays status no longer counts as chunks; the stand-in
    Slurm is the one of tests/test_faults_slurm.py.)"""
    d = fake
    assert cli.main(["run", "--config", "sweep.toml", "--out", "runs/x", "--submit", "slurm", "--parts", "3"]) == 0
    chunks = d / "runs/x/chunks"
    chunks.mkdir()
    shutil.copy(runs / "parts" / "chunks" / "manifest.json", chunks)
    for i in (0, 3, 2):  # part 1 owns 0, 3; part 2 owns 1; part 3 owns 2
        shutil.copy(runs / "parts" / "chunks" / f"chunk_{i:05d}.npz", chunks)
    (d / "runs/x/slurm/part-2.log").write_text("starting\nbec-jax: error: something broke\n\n")
    capsys.readouterr()
    assert cli.main(["status", "runs/x"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:6] == ["runs/x: a sweep submitted in 3 parts (job array 101, assembling job 102)",
                         "chunks saved: 3 of 4",
                         "part 1: done (2 of 2 chunks)",
                         "part 2: failed (0 of 1 chunks): bec-jax: error: something broke",
                         "part 3: done (1 of 1 chunks)",
                         "assembling: not run (cancelled, or Slurm has forgotten it: a part failed?)"]
    assert lines[6] == ("to finish: bec-jax run --config sweep.toml --out runs/x --submit slurm --parts 3   (the same "
                        "submission again: each part keeps the chunks it saved)")
    # squeue lists part 2 running and the assembling job waiting: the queue's word wins over the log.
    (d / "squeue.txt").write_text("101|2|RUNNING|None\n102|N/A|PENDING|Dependency\n")
    st = slurm.status("runs/x")
    assert [p.state for p in st.parts] == ["done", "running", "done"]
    assert st.assembling == "pending (until every part has succeeded)" and slurm.resubmit_hint(st) is None
    # Without the submission's record: the chunks alone, and parts only when given.
    os.remove(d / "runs/x/slurm/submission.json")
    assert slurm.status("runs/x").parts == ()
    assert [p.state for p in slurm.status("runs/x", parts=3).parts] == ["done", "failed", "done"]
