"""Kept programs and JAX's cache trust only their owner and their checksum
(`engine.program_cache`'s module docstring): a planted pickle is never
unpickled, from a directory open to others (even one signed with the user's
own secret) or without the user's HMAC; a flipped byte is a miss that rewrites
the file; a secret open to others and a read-only cache each turn the cache
off with one line on stderr. The CLI runs are tiny and share one reference
run, the one that filled the cache they copy."""
import json
import os
import pickle
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from bec_jax.engine import program_cache

# Kolter's two-state model: the smallest program to trace and compile, and the cheapest exact verdict.
RUN = ["run", "--env", "kolter", "--algorithm", "td", "--alpha", "0.1", "--seeds", "2", "--steps", "50",
       "--log-every", "10"]
# A child that, run as root (who may write anywhere), sees FAKE_READ_ONLY as
# not writable, as any other user would a 0555 directory.
_CHILD = r"""
import os, sys
ro = os.environ.get("FAKE_READ_ONLY")
if ro:
    real = os.access
    os.access = lambda p, m, *a, **k: False if m & os.W_OK and os.path.realpath(p) == ro else real(p, m, *a, **k)
from bec_jax.cli.commands import main
sys.exit(main(sys.argv[1:]))
"""
KEY = "ab" * 32


class Plant:
    """Unpickling it creates the file `marker`: the planted code that must never run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _sign(secret: bytes, key: str, payload: bytes) -> bytes:
    """A file in the kept-program format, signed with `secret`."""
    return program_cache._HEADER + program_cache._mac(secret, key, payload) + payload


def _cli(tmp, name, secret_dir, cache=None, **env):
    """`bec-jax run` (the tiny sweep) into tmp/name; (process, curves)."""
    drop = ("BEC_JAX_NO_CACHE", "JAX_COMPILATION_CACHE_DIR", "BEC_JAX_CACHE_DIR")
    e = {k: v for k, v in os.environ.items() if k not in drop}
    e.update({program_cache.SECRET_ENV: str(secret_dir), **env})
    if cache is None:
        e["BEC_JAX_NO_CACHE"] = "1"
    else:
        e["BEC_JAX_CACHE_DIR"] = str(cache)
    out = tmp / name
    p = subprocess.run([sys.executable, "-c", _CHILD, *RUN, "--out", str(out)], env=e, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    with np.load(out / "curves.npz") as z:
        return p, {k: z[k] for k in z.files}


def _same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _lines(stderr: str) -> list:
    return [ln for ln in stderr.splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A first run into an empty cache: its results (the reference, of a
    program it compiled), the cache it filled, its one kept program's key, the
    children's secret. (That a run without a cache gives the same results is
    checked by the read-only cache's run, which caches nothing.)"""
    tmp = tmp_path_factory.mktemp("faults_cache")
    secret_dir = tmp / "secret"
    _, ref = _cli(tmp, "first", secret_dir, cache=tmp / "cache")
    with open(tmp / "first" / "meta.json") as f:
        assert json.load(f)["timing"]["cache"] == "miss"
    (name,) = os.listdir(tmp / "cache" / program_cache.SUBDIR)
    with open(secret_dir / "secret", "rb") as f:
        secret = f.read()
    return {"tmp": tmp, "ref": ref, "cache": tmp / "cache", "key": name[:-4], "secret_dir": secret_dir,
            "secret": secret}


@pytest.mark.parametrize("route", ["BEC_JAX_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR"])
def test_a_planted_program_in_a_group_writable_cache_is_never_loaded(shared, tmp_path, route):
    """Signed with the user's own secret, so only the directory's mode stops
    it: through bec-jax's cache setting (JAX's cache stays off) and through
    JAX's own (the common /tmp/jax_cache recipe: the kept programs refuse it)."""
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    (cache / program_cache.SUBDIR).mkdir(parents=True, mode=0o700)
    path = cache / program_cache.SUBDIR / (shared["key"] + ".pkl")
    path.write_bytes(_sign(shared["secret"], shared["key"], pickle.dumps(Plant(marker))))
    os.chmod(path, 0o600)
    os.chmod(cache, 0o777)
    if route == "BEC_JAX_CACHE_DIR":
        p, curves = _cli(tmp_path, "out", shared["secret_dir"], cache=cache)
        assert os.listdir(cache) == [program_cache.SUBDIR]  # JAX's own cache was not turned on there
    else:
        p, curves = _cli(tmp_path, "out", shared["secret_dir"], BEC_JAX_NO_CACHE="1", JAX_COMPILATION_CACHE_DIR=str(cache))
    assert not marker.exists()
    about = [ln for ln in _lines(p.stderr) if str(cache) in ln]
    assert len(about) == 1 and f"chmod go-w {cache}" in about[0], p.stderr
    _same(curves, shared["ref"])


def test_a_planted_pickle_without_the_users_hmac_is_never_unpickled(shared, tmp_path):
    """In a 0700 directory of the user's own, in the kept-program format but
    signed with another secret: removed unread, a miss, and the program
    compiled and kept in its place."""
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    (cache / program_cache.SUBDIR).mkdir(parents=True, mode=0o700)
    os.chmod(cache, 0o700)
    path = cache / program_cache.SUBDIR / (shared["key"] + ".pkl")
    # the file's format, signed with a secret of the planter's own
    path.write_bytes(_sign(os.urandom(32), shared["key"], pickle.dumps(Plant(marker))))
    os.chmod(path, 0o600)
    p, curves = _cli(tmp_path, "out", shared["secret_dir"], cache=cache)
    assert not marker.exists() and not _lines(p.stderr)
    assert path.read_bytes().startswith(program_cache._HEADER)  # rewritten, signed
    _same(curves, shared["ref"])


def test_a_flipped_byte_is_a_miss_that_rewrites_the_program(shared, tmp_path):
    """One byte of a real kept program flipped: not loaded (no crash, no
    wrong numbers), compiled again, rewritten, and the results are a clean
    run's bit for bit."""
    cache = tmp_path / "cache"
    shutil.copytree(shared["cache"], cache)
    for name in os.listdir(cache):  # JAX's own entries: without them the program compiles, and is kept again
        if name != program_cache.SUBDIR:
            os.remove(cache / name)
    path = cache / program_cache.SUBDIR / (shared["key"] + ".pkl")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    p, curves = _cli(tmp_path, "out", shared["secret_dir"], cache=cache)
    assert not _lines(p.stderr)
    with open(tmp_path / "out" / "meta.json") as f:
        assert json.load(f)["timing"]["trace_s"] > 0  # a miss: traced and compiled
    kept = path.read_bytes()
    assert kept != bytes(data) and program_cache._read_verified(str(path), shared["key"], shared["secret"])
    _same(curves, shared["ref"])


def test_a_truncated_jax_cache_entry_is_replaced_without_a_warning(shared, tmp_path):
    """JAX's own entries cut to 1000 bytes (a disk that filled, a copy cut
    short): JAX alone warns in two lines on every run and never writes them
    again. Here the run is quiet, each entry is compiled again and replaced
    by one that decompresses whole, and the results are a clean run's. In
    the shared cache itself (JAX's keys follow its path), put back after."""
    from jax._src import compilation_cache
    cache, backup = shared["cache"], tmp_path / "backup"
    shutil.copytree(cache, backup)
    try:
        for name in os.listdir(cache / program_cache.SUBDIR):  # kept programs would skip JAX's cache
            os.remove(cache / program_cache.SUBDIR / name)
        entries = [cache / n for n in os.listdir(cache) if n.endswith("-cache")]
        assert entries
        for path in entries:
            os.truncate(path, 1000)
        p, curves = _cli(tmp_path, "out", shared["secret_dir"], cache=cache)
        assert not _lines(p.stderr), p.stderr
        assert sorted(n for n in os.listdir(cache) if n.endswith("-cache")) == sorted(p.name for p in entries)
        for path in entries:
            assert path.stat().st_size > 1000
            compilation_cache.decompress_executable(path.read_bytes())  # whole: a truncated stream raises
        _same(curves, shared["ref"])
    finally:
        shutil.rmtree(cache)
        shutil.copytree(backup, cache)


def test_a_read_only_cache_dir_is_one_line(shared, tmp_path):
    """Instead of JAX's warning for every program it cannot write. Root may
    write anywhere, so for root the child is told the directory is not
    writable (os.access), as any other user would find it."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o555)
    os.chmod(cache, 0o555)
    fake = {"FAKE_READ_ONLY": os.path.realpath(cache)} if os.getuid() == 0 else {}
    try:
        p, curves = _cli(tmp_path, "out", shared["secret_dir"], cache=cache, **fake)
    finally:
        os.chmod(cache, 0o700)
    lines = _lines(p.stderr)
    assert len(lines) == 1 and str(cache) in lines[0] and "not writable" in lines[0], p.stderr
    assert not os.listdir(cache)  # nothing cached there
    _same(curves, shared["ref"])


# In-process checks of `program_cache.load`/`save` on a tiny program.

@pytest.fixture
def home(tmp_path, monkeypatch):
    """A JAX cache directory (0700) with its programs directory, a secret of
    this test's own, and nothing yet told on stderr."""
    base = tmp_path / "jax"
    (base / program_cache.SUBDIR).mkdir(parents=True, mode=0o700)
    os.chmod(base, 0o700)
    monkeypatch.setattr(program_cache, "cache_dir", lambda: str(base / program_cache.SUBDIR))
    monkeypatch.setenv(program_cache.SECRET_ENV, str(tmp_path / "secret"))
    monkeypatch.setattr(program_cache, "_SECRET", {})
    monkeypatch.setattr(program_cache, "_TOLD", set())
    return base


@pytest.fixture(scope="module")
def exe():
    return jax.jit(lambda x: x * 2.0).lower(np.float32(1)).compile()


def test_a_kept_program_loads_and_is_private(home, exe):
    assert program_cache.save(KEY, exe)
    path = home / program_cache.SUBDIR / (KEY + ".pkl")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(program_cache.secret_path()).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(program_cache.secret_path())).st_mode & 0o777 == 0o700
    assert float(program_cache.load(KEY)(np.float32(3))) == 6.0
    # another key's file under this key's name does not verify
    shutil.copy(path, home / program_cache.SUBDIR / ("cd" * 32 + ".pkl"))
    assert program_cache.load("cd" * 32) is None and not (home / program_cache.SUBDIR / ("cd" * 32 + ".pkl")).exists()


@pytest.mark.parametrize("bad", ["base", "programs", "file", "owner", "symlink"])
def test_a_signed_plant_is_loaded_only_from_what_the_user_alone_can_write(home, tmp_path, monkeypatch, capsys, bad):
    """A pickle signed with the user's secret still runs nothing when the
    JAX cache dir, the programs dir or the file is open to others, or belongs
    to another user, or the file is a symlink: one line naming the path and
    its fix, and the file left where it is."""
    marker = tmp_path / "marker"
    programs = home / program_cache.SUBDIR
    secret = program_cache._secret()
    path = programs / (KEY + ".pkl")
    target = tmp_path / "elsewhere.pkl" if bad == "symlink" else path
    target.write_bytes(_sign(secret, KEY, pickle.dumps(Plant(marker))))
    os.chmod(target, 0o600)
    where, fix = {"base": (home, "chmod go-w"), "programs": (programs, "chmod go-w"), "file": (path, "chmod go-w"),
                  "owner": (home, "chown"), "symlink": (path, "not a regular file")}[bad]
    if bad == "symlink":
        os.symlink(target, path)
    elif bad == "owner":
        monkeypatch.setattr(os, "getuid", lambda: os.stat(home).st_uid + 1)
    else:
        os.chmod(where, 0o777 if bad != "file" else 0o666)
    assert program_cache.load(KEY) is None and program_cache.load(KEY) is None
    assert not marker.exists()
    lines = _lines(capsys.readouterr().err)
    assert len(lines) == 1 and str(where) in lines[0] and fix in lines[0], lines
    assert os.path.lexists(path)


def test_a_plant_without_the_hmac_and_a_short_file_are_removed_unread(home, tmp_path, capsys):
    """A bare pickle, one signed with another secret, and a cut header."""
    marker = tmp_path / "marker"
    path = home / program_cache.SUBDIR / (KEY + ".pkl")
    for data in (pickle.dumps(Plant(marker)), _sign(os.urandom(32), KEY, pickle.dumps(Plant(marker))),
                 program_cache._HEADER[:5]):
        path.write_bytes(data)
        os.chmod(path, 0o600)
        assert program_cache.load(KEY) is None and not path.exists()
    assert not marker.exists() and not capsys.readouterr().err


@pytest.mark.parametrize("bad", ["mode", "owner", "dir"])
def test_a_secret_open_to_others_turns_the_cache_off_in_one_line(home, exe, capsys, bad):
    secret = program_cache.secret_path()
    os.makedirs(os.path.dirname(secret), mode=0o700)
    with open(secret, "wb") as f:
        f.write(os.urandom(32))
    where = secret
    if bad == "mode":
        os.chmod(secret, 0o644)
    elif bad == "dir":
        where = os.path.dirname(secret)
        os.chmod(where, 0o777)
    elif os.getuid() != 0:
        pytest.skip("giving the secret to another user takes root")
    else:
        os.chown(secret, 12345, -1)
    assert not program_cache.save(KEY, exe) and program_cache.load(KEY) is None
    assert not os.listdir(home / program_cache.SUBDIR)
    lines = _lines(capsys.readouterr().err)
    fix = {"mode": "chmod 600", "owner": "chown", "dir": "chmod go-w"}[bad]
    assert len(lines) == 1 and where in lines[0] and fix in lines[0], lines


def test_the_key_follows_the_matmul_precision_and_the_accelerator(monkeypatch, tmp_path):
    """Issue 45 item 7: either changes what a program computes."""
    from bec_jax.engine import tuning
    from bec_jax.prediction import sweep
    from bec_jax.prediction.plan import plan
    from bec_jax.prediction.spec import SweepSpec
    monkeypatch.setattr(program_cache, "cache_dir", lambda: str(tmp_path))
    spec = SweepSpec(env="two_state", algorithm="td", seeds=2, steps=20, log_every=10, hyperparameters={"alpha": [0.1]})
    form = tuning.choose_form(spec, front=sweep)
    (group,), _ = plan(spec, 1)
    devices = jax.devices()[:1]
    base = program_cache.file_key(spec, group, 1, devices, form, sweep)
    with jax.default_matmul_precision("highest"):
        assert program_cache.file_key(spec, group, 1, devices, form, sweep) not in (None, base)

    class Client:
        platform_version = "cuda 12.8"

    class Gpu:
        platform, device_kind, id, client = "gpu", "H100", 0, Client()

    assert program_cache._accelerator(devices) == [] and program_cache._accelerator([Gpu()])[0] == "cuda 12.8"
    gpu = program_cache.file_key(spec, group, 1, [Gpu()], form, sweep)
    Client.platform_version = "cuda 12.9"
    assert program_cache.file_key(spec, group, 1, [Gpu()], form, sweep) != gpu
