"""A full disk (issue 44), faked where bec_jax's files reach the disk
(`os.fsync` of their temporary file, where a real full disk reports ENOSPC at
the latest): a run that cannot write a chunk or its result files ends with one
line and exit status 2, keeps what it saved, and `--resume` with space again
gives a clean run's files bit for bit. Through the command line, in this
process."""
import errno
import json
import os

import jax
import numpy as np
import pytest

from bec_jax.cli import commands as cli

jax.devices()  # the backends with this process's device count, before the CLI calls below

GRID = ["run", "--env", "boyan_chain", "--algorithm", "ctdc", "--alpha", "0.01,0.1,0.5", "--beta", "0.1",
        "--zeta", "0.01", "--seeds", "3", "--steps", "400", "--log-every", "20", "--chunk-size", "1"]


def _cli(argv, capsys):
    code = cli.main([str(a) for a in argv])
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    return code, [x for x in lines if x.strip() and not x.startswith("[bec-jax] ")]


def _disk_full_at(mp, where: str, n: int) -> None:
    """The n-th .npz file written into `where` (a directory) finds the disk full."""
    real, seen = os.fsync, {"n": 0}

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.dirname(path) == os.path.realpath(where) and path.endswith(".npz"):
            seen["n"] += 1
            if seen["n"] == n:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real(fd)

    mp.setattr(os, "fsync", fsync)


def _same(a, b):
    with np.load(a / "curves.npz") as za, np.load(b / "curves.npz") as zb:
        assert sorted(za.files) == sorted(zb.files)
        for k in za.files:  # the same program on one machine: bit for bit
            assert np.array_equal(za[k], zb[k], equal_nan=za[k].dtype.kind == "f"), k
    assert json.load(open(a / "summary.json")) == json.load(open(b / "summary.json"))


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "run"
    assert cli.main(GRID + ["--out", str(out)]) == 0
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name an fd's file")
@pytest.mark.parametrize("where, n, saved", [("chunks", 2, ["chunk_00000.npz"]),
                                             (".", 1, ["chunk_00000.npz", "chunk_00001.npz", "chunk_00002.npz"])],
                         ids=["a chunk", "the results"])
def test_a_full_disk_is_one_line_keeps_what_was_saved_and_resumes_bit_for_bit(tmp_path, capsys, clean, where, n,
                                                                               saved):
    out = tmp_path / "run"
    out.mkdir()
    (tmp_path / "notes.txt").write_text("the user's")
    with pytest.MonkeyPatch.context() as mp:
        _disk_full_at(mp, str(out / where), n)
        code, err = _cli(GRID + ["--out", out, "--overwrite"], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("bec-jax: error: disk: cannot write the run's files: No space left on device"), err
    assert "--resume" in err[0]
    assert sorted(f for f in os.listdir(out / "chunks") if f.endswith(".npz")) == saved
    assert not [f for f in os.listdir(out) if f.startswith(".tmp-")]  # no half-written file left
    assert (tmp_path / "notes.txt").read_text() == "the user's"
    code, err = _cli(["run", "--out", out, "--resume"], capsys)
    assert code == 0 and err == [], err
    _same(out, clean)
    assert not (out / "chunks").exists()
