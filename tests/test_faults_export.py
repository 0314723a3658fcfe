"""`bec-jax export` and `plot` under faults (issue 54, item 6, and item 8's
wandb that fails as it imports): a full disk during an export leaves OUT as
it was and a later --overwrite leaves nothing stale; --overwrite deletes only
entries whose names an export gives, listed in its manifest with the sha256
it recorded (a hostile manifest is one line, and nothing is deleted); one
export at a time writes OUT; an export or plot of a run that a run is writing
is refused; `plot` on a full disk is one line. Through the command line, in
this process (a concurrent export in a subprocess)."""
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import jax
import pytest

from bec_jax.cli import commands as cli
from bec_jax.run import export

pytest.importorskip("tensorboard")

jax.devices()  # one CPU device, before the in-process CLI calls below could make one per core

RUN = ["continuing", "--task", "two_choice", "--algorithm", "q", "--alpha", "0.1,0.3", "--seeds", "2", "--steps",
       "1000"]


def _cli(argv, capsys):
    code = cli.main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, [x for x in cap.err.replace("\r", "\n").splitlines()
                           if x.strip() and not x.startswith("[bec-jax] ")]


def _snapshot(d) -> dict:
    """{relative path: bytes (a link: its target)} of everything under `d`, folders included."""
    out = {}
    for p, ds, fs in os.walk(d):
        for name in ds + fs:
            full = os.path.join(p, name)
            rel = os.path.relpath(full, d)
            out[rel] = ("->" + os.readlink(full)) if os.path.islink(full) else \
                None if os.path.isdir(full) else open(full, "rb").read()
    return out


def _events(d) -> list[str]:
    return sorted(os.path.relpath(os.path.join(p, f), d) for p, _, fs in os.walk(d) for f in fs
                  if f.startswith("events.out.tfevents."))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "c"
    assert cli.main(RUN + ["--out", str(out)]) == 0
    return out


def _disk_full_after(mp, n: int) -> None:
    """The disk is full from the n-th file flushed to it on: at `os.fsync`,
    where a full disk says so at the latest, and at TensorBoard's own file
    writes (`gfile`, which bec_jax's event files went through before issue 54)."""
    real, seen = os.fsync, {"n": 0}

    def fsync(fd):
        seen["n"] += 1
        if seen["n"] >= n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    mp.setattr(os, "fsync", fsync)
    from tensorboard.compat.tensorflow_stub.io import gfile
    write = gfile.LocalFileSystem._write

    def tb_write(self, filename, content, mode):
        seen["n"] += 1
        if seen["n"] >= n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)
        return write(self, filename, content, mode)

    mp.setattr(gfile.LocalFileSystem, "_write", tb_write)


def test_a_full_disk_during_an_export_leaves_out_as_it_was_and_nothing_stale(run, tmp_path, capsys):
    out = tmp_path / "tb"
    code, _, err = _cli(["export", run, "--to", "tensorboard", "--out", out], capsys)
    assert code == 0 and err == [], err
    before = _snapshot(out)
    first = _events(out)
    assert len(first) == 3  # the experiment and 2 points
    for n in (1, 2, 3, 4):  # the disk fills at the 1st .. 3rd event file or at the manifest
        with pytest.MonkeyPatch.context() as mp:
            _disk_full_after(mp, n)
            code, out_text, err = _cli(["export", run, "--to", "tensorboard", "--out", out, "--overwrite"], capsys)
        assert code == 2 and out_text == "" and err == [
            f"bec-jax: error: disk: cannot write the export into {str(out)!r}: No space left on device; nothing of "
            f"it is kept, and {str(out)!r} is as it was; free some space and export again"], (n, err)
        assert _snapshot(out) == before, n  # the earlier export whole, no part of this one, no lock left
    # A first export into a folder it made: the folder goes too.
    with pytest.MonkeyPatch.context() as mp:
        _disk_full_after(mp, 2)
        assert _cli(["export", run, "--to", "tensorboard", "--out", tmp_path / "new"], capsys)[0] == 2
    assert not (tmp_path / "new").exists()
    # Space again: --overwrite leaves the new export alone, listed with its sha256.
    code, _, err = _cli(["export", run, "--to", "tensorboard", "--out", out, "--overwrite"], capsys)
    assert code == 0 and err == [], err
    now = _events(out)
    assert len(now) == 3 and not set(now) & set(first)
    m = json.load(open(out / export.MANIFEST))
    assert sorted(m["written"]) == now and set(m["sha256"]) == set(m["bytes"]) == set(now)
    for rel in now:
        assert export._proof(str(out / rel)) == (m["sha256"][rel], m["bytes"][rel])
    assert sorted(os.listdir(out)) == sorted(["c", export.MANIFEST] + [e for e in now if "/" not in e])


def _hostile(out, rel, make=None):
    """The manifest of the export in `out` made to list `rel` too, with the sha256 of what is there (if anything)."""
    if make is not None:
        make(out)
    m = json.load(open(out / export.MANIFEST))
    target = out / rel
    m["written"].append(rel)
    data = target.read_bytes() if os.path.isfile(target) else b""
    m.setdefault("sha256", {})[rel] = hashlib.sha256(data).hexdigest()  # what is there: the manifest says it is ours
    m.setdefault("bytes", {})[rel] = len(data)
    (out / export.MANIFEST).write_text(json.dumps(m))


def _event_named_link(out):
    (out / "notes.txt").write_text("mine")
    os.symlink("notes.txt", out / "events.out.tfevents.1.h.1.9.bec_jax")


def _changed_event_file(out):
    (name,) = [e for e in _events(out) if e.startswith("c/alpha=0.1/")]
    with open(out / name, "ab") as f:
        f.write(b"more")
    return name


@pytest.mark.parametrize("rel, make, why", [
    ("notes.txt", lambda o: (o / "notes.txt").write_text("mine"), "which is not a name an export gives"),
    ("mine", lambda o: ((o / "mine").mkdir(), (o / "mine" / "f.txt").write_text("mine")),
     "which is not a name an export gives"),
    ("wandb/offline-run-20240101_000000-abcd", lambda o: (o / "wandb/offline-run-20240101_000000-abcd").mkdir(
        parents=True), "whose sha256 is not the one the export recorded"),
    ("../outside/events.out.tfevents.1.h.1.1.bec_jax", None, "which is not a path inside it"),
    ("events.out.tfevents.1.h.1.9.bec_jax", _event_named_link, "which is not a file (as the export wrote it)"),
    (None, _changed_event_file, "whose sha256 is not the one the export recorded"),
])
def test_overwrite_deletes_nothing_a_manifest_lists_that_an_export_did_not_write(run, tmp_path, capsys, rel, make,
                                                                                 why):
    out = tmp_path / "tb"
    assert _cli(["export", run, "--to", "tensorboard", "--out", out], capsys)[0] == 0
    if rel is None:  # an event file the export wrote, changed since
        rel = make(out)
    else:
        _hostile(out, rel, make)
    before = _snapshot(out)
    code, _, err = _cli(["export", run, "--to", "tensorboard", "--out", out, "--overwrite"], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"bec-jax: error: out: {str(out / export.MANIFEST)!r} lists {rel!r}, {why}"), err
    assert err[0].endswith("; --overwrite deletes only what an export wrote: move it (or the manifest) away and "
                           "export again"), err
    assert _snapshot(out) == before  # nothing deleted, nothing written


def test_wandb_overwrite_replaces_the_runs_it_wrote_even_after_a_sync(run, tmp_path, capsys):
    pytest.importorskip("wandb")
    out = tmp_path / "wb"
    argv = ["export", run, "--to", "wandb", "--out", out, "--project", "tests"]
    assert _cli(argv, capsys)[0] == 0
    runs = lambda: sorted(d for d in os.listdir(out / "wandb") if d.startswith("offline-run-"))  # noqa: E731
    first = runs()
    assert len(first) == 2
    (rid,) = [f[4:-6] for f in os.listdir(out / "wandb" / first[0]) if f.endswith(".wandb")]
    (out / "wandb" / first[0] / f"run-{rid}.wandb.synced").write_text("")  # what `wandb sync` leaves
    (out / "wandb" / "mine.txt").write_text("mine")
    code, _, err = _cli(argv + ["--overwrite"], capsys)
    assert code == 0 and err == [], err
    now = runs()
    assert len(now) == 2 and not set(now) & set(first)
    assert sorted(json.load(open(out / export.MANIFEST))["written"]) == [f"wandb/{d}" for d in now]
    assert (out / "wandb" / "mine.txt").read_text() == "mine"
    assert os.path.realpath(out / "wandb" / "latest-run") in {str(out / "wandb" / d) for d in now}


SLOW_EXPORT = textwrap.dedent("""
    import sys, time
    from bec_jax.run import export
    real = export._new_event_file
    def slow(*args):  # an export that takes long enough for a second one to come
        time.sleep(0.6)
        return real(*args)
    export._new_event_file = slow
    from bec_jax.cli import commands as cli
    sys.exit(cli.main(sys.argv[1:]))
""")


def test_one_export_at_a_time_writes_out(run, tmp_path, capsys):
    out = tmp_path / "tb"
    first = subprocess.Popen([sys.executable, "-c", SLOW_EXPORT, "export", str(run), "--to", "tensorboard", "--out",
                              str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not any(n.startswith(export.STAGE_PREFIX) for n in (os.listdir(out) if out.exists() else [])):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() - t0 < 120
            time.sleep(0.02)
        code, _, err = _cli(["export", run, "--to", "tensorboard", "--out", out, "--overwrite"], capsys)
        assert first.poll() is None  # the second came while the first wrote
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"bec-jax: error: out: another bec-jax run is writing to {str(out)!r}"), err
        _, first_err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, first_err
    m = json.load(open(out / export.MANIFEST))
    assert sorted(m["written"]) == _events(out) and len(_events(out)) == 3  # the manifest lists all there is
    assert sorted(os.listdir(out)) == sorted(["c", export.MANIFEST] + [e for e in _events(out) if "/" not in e])


HOLD_LOCK = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(os.path.join(sys.argv[1], ".bec-jax.lock"), os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as rundir.lock_dir does for a run writing the directory
    print("locked", flush=True)
    time.sleep(120)
""")


def test_a_run_being_written_is_not_read(run, tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(run, d)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(d)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        for argv in (["export", d, "--to", "tensorboard", "--out", tmp_path / "tb"], ["plot", d]):
            code, _, err = _cli(argv, capsys)
            assert code == 2 and err == [f"bec-jax: error: dirs: a bec-jax run is writing to {str(d)!r} (it holds "
                                         f"{str(d / '.bec-jax.lock')!r}); wait for it to finish, then read it"], err
        assert not (tmp_path / "tb").exists() and not (d / "plots").exists()
    finally:
        holder.kill()
        holder.wait()
    assert _cli(["export", d, "--to", "tensorboard", "--out", tmp_path / "tb"], capsys)[0] == 0


def test_plot_on_a_full_disk_is_one_line_and_keeps_the_earlier_figures(run, tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(run, d)
    assert _cli(["plot", d], capsys)[0] == 0
    before = _snapshot(d)
    with pytest.MonkeyPatch.context() as mp:
        _disk_full_after(mp, 2)
        code, out, err = _cli(["plot", d], capsys)
    assert code == 2 and out == "" and err == [
        f"bec-jax: error: disk: cannot write the figures and tables into {str(d / 'plots')!r}: No space left on "
        "device; the files already there are as they were; free some space and run the command again"], err
    assert _snapshot(d) == before


def test_a_wandb_that_fails_as_it_imports_is_one_line(run, tmp_path, capsys, monkeypatch):
    broken = tmp_path / "site"
    (broken / "wandb").mkdir(parents=True)
    (broken / "wandb" / "__init__.py").write_text("raise RuntimeError('protobuf clash: a broken install')\n")
    monkeypatch.syspath_prepend(str(broken))
    for name in [m for m in sys.modules if m == "wandb" or m.startswith("wandb.")]:
        monkeypatch.delitem(sys.modules, name)
    code, out, err = _cli(["export", run, "--to", "wandb", "--out", tmp_path / "wb"], capsys)
    assert code == 2 and out == "" and err == [
        "bec-jax: error: export: --to wandb: Weights & Biases does not import here (RuntimeError: protobuf clash: a "
        "broken install); pip install --force-reinstall 'bec_jax[wandb]' brings a version that works"], err
    assert not (tmp_path / "wb").exists()
