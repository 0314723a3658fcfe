"""Failures contained: an address-space limit (`ulimit -v`) counted by the plan,
memory running out mid-run, and a user's algorithm that raises. Each gives one
line and exit status 2, keeps what a resume needs, and leaves nothing that
blocks running the same command again."""
import errno
import os
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from bec_jax.engine import execute, memory
from bec_jax.files import NpyFile
from bec_jax.prediction import sweep
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import SweepSpec
from bec_jax.run import runner


def _env() -> dict:
    """One CPU device (JAX's CPU backend, on a GPU machine too: the limits are the
    host's), no compilation cache, the caller's other XLA flags kept."""
    env = dict(os.environ, BEC_JAX_NO_CACHE="1", BEC_JAX_CPU_DEVICES="1", JAX_PLATFORMS="cpu")
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags)
    return env


# The child limits itself before it imports anything: a preexec_fn would run
# Python between fork and exec in this process full of JAX threads.
LIMITED = ("import resource, runpy, sys; n = int(sys.argv.pop(1)); "
           "resource.setrlimit(resource.RLIMIT_AS, (n, n)) if n else None; "
           "sys.argv[0] = 'bec-jax'; runpy.run_module('bec_jax.cli.commands', run_name='__main__')")


def bec(args, cwd, limit: int | None = None) -> subprocess.CompletedProcess:
    """`bec-jax ARGS` in a fresh process, its address space limited to `limit`
    bytes (as `ulimit -v` does)."""
    return subprocess.run([sys.executable, "-c", LIMITED, str(limit or 0), *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=300)


def one_line(p: subprocess.CompletedProcess, start: str) -> str:
    """The command's one error line; its progress lines (shown once a run has
    taken 2 s, as on a busy machine) are not errors and are left out."""
    lines = [x for x in p.stderr.splitlines() if x.strip() and not x.startswith("[bec-jax] ")]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith(f"bec-jax: error: {start}"), lines[0]
    return lines[0]


def curves(out) -> dict:
    with np.load(os.path.join(out, "curves.npz")) as z:
        return {k: z[k] for k in z.files}


def assert_same_files(a, b):
    x, y = curves(a), curves(b)
    assert sorted(x) == sorted(y)
    for k in x:
        assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k], equal_nan=True), k


# ------------------------------------------------------------------ the address-space limit

LIMIT = 4 << 30  # JAX takes about 1.4 GB of it before anything runs


def test_plan_refuses_logs_that_would_not_fit_under_ulimit_v(tmp_path):
    """2 x 10^8 log points: 4.8 GB of log files, which the finished run maps."""
    args = ["run", "--env", "baird", "--algorithm", "td", "--alpha", "0.1", "--steps", "200000000",
            "--seeds", "2", "--log-every", "1", "--out", "run"]
    p = bec(args, tmp_path, LIMIT)
    line = one_line(p, "log_every: the run needs about ")
    assert "address space limited to 4.0 GiB by ulimit -v (4194304 kB)" in line
    assert "a larger --log-every" in line and "raise the limit" in line
    assert not (tmp_path / "run").exists()
    again = bec(args, tmp_path, LIMIT)  # refused the same way, not by "already exists"
    # the same line but for the address space this process had (1.4 or 1.5 GB, from run to run)
    mask = lambda s: re.sub(r"on top of the [0-9.]+ \S+ this process has", "on top of what this process has", s)
    assert "this process has" in line and mask(one_line(again, "log_every:")) == mask(line)


def test_default_budget_fits_under_the_limit(monkeypatch):
    """On a CPU the default budget of a call is at most half the address space left."""
    monkeypatch.setattr(memory, "address_space_limit", lambda: memory.address_space_used() + (1 << 30))
    cpu = jax.devices("cpu")[0]
    assert memory.default_budget(cpu) == ((1 << 30) - memory.ADDRESS_MARGIN) // 2
    monkeypatch.setattr(memory, "address_space_limit", lambda: None)
    assert memory.default_budget(cpu) == min(memory.DEFAULT_BUDGET, memory.device_available(cpu))


def test_load_refuses_logs_that_cannot_be_mapped(tmp_path, monkeypatch):
    spec = SweepSpec(env="two_state", algorithm="td", alpha=(0.1,), steps=40, seeds=2, log_every=10)
    monkeypatch.setattr(memory, "LAZY_LOG_BYTES", 10)
    runner.run_to_dir(spec, str(tmp_path / "r"), progress=False, devices=jax.devices()[:1])

    real = np.load

    def load(path, *a, **k):  # what a mapping beyond `ulimit -v` gives
        if k.get("mmap_mode"):
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real(path, *a, **k)

    monkeypatch.setattr(np, "load", load)
    with pytest.raises(ValueError, match=r"^logs: cannot map .*curves/.*\.npy.*ulimit -v"):
        SweepResult.load(str(tmp_path / "r"))


# ------------------------------------------------------------------ logs written in slabs

def test_slab_files_equal_memory_mapped_ones(tmp_path):
    """`NpyFile` writes the bytes `open_memmap` does, a slab at a time."""
    x = np.random.default_rng(0).standard_normal((3, 2, 11)).astype(np.float32)
    a = np.lib.format.open_memmap(tmp_path / "a.npy", mode="w+", dtype=x.dtype, shape=x.shape)
    a[...] = x
    a.flush()
    del a
    b = NpyFile.create(str(tmp_path / "b.npy"), x.shape, x.dtype)
    for t in range(0, 11, 4):
        b[:, :, t:t + 4] = x[..., t:t + 4]
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()
    c = NpyFile.open(str(tmp_path / "b.npy"))
    rows = np.array([2, 0])
    np.testing.assert_array_equal(c[rows, ..., 3:9], x[rows, ..., 3:9])
    np.testing.assert_array_equal(np.asarray(c), x)
    np.testing.assert_array_equal(c.mapped(), x)


def test_streamed_logs_of_an_unsegmented_run_keep_the_inf_convention(tmp_path, monkeypatch):
    """Logs bound for files from a chunk run in one call: +inf where every seed
    diverged, as in memory (they were left NaN)."""
    spec = SweepSpec(env="boyan_chain", algorithm="ctdc",
                     hyperparameters={"alpha": [0.05, 5.0], "beta": [0.1], "zeta": [0.5]},
                     steps=120, seeds=3, log_every=10, divergence_bound=10.0)
    ref = sweep.run(spec, progress=False, devices=jax.devices()[:1])
    assert (ref.alive[1] == 0).any() and np.isposinf(ref.mean[0, 1]).any()
    monkeypatch.setattr(memory, "LAZY_LOG_BYTES", 10)
    r = runner.run_to_dir(spec, str(tmp_path / "r"), progress=False, devices=jax.devices()[:1])
    assert r.meta["blocks_per_segment"] == spec.steps // spec.log_every  # one call
    back = SweepResult.load(str(tmp_path / "r"))
    for k in ("mean", "std", "sem", "alive"):
        np.testing.assert_array_equal(np.asarray(getattr(back, k)), getattr(ref, k))


# ------------------------------------------------------------------ the user's algorithm

USER_MODULE = textwrap.dedent('''
    import os
    import jax
    from bec_jax.algorithms import Algorithm, step_size, td

    FAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault")

    def _mode():
        return open(FAULT).read().strip() if os.path.exists(FAULT) else ""

    def _check(eta):
        # a fault at run time: at once, or in the grid's second point (chunk 2
        # with --chunk-size 1)
        if _mode() == "runtime":
            raise ZeroDivisionError("float division by zero at run time")
        if _mode() == "memory" and (abs(eta - 0.2) < 1e-6).any():
            raise MemoryError("simulated: a host buffer could not be allocated")

    def update(state, tr, eta):
        if _mode() == "trace":
            return 1 / 0
        jax.debug.callback(_check, eta)  # always there: every run compiles the same program
        return td.update(state, tr, eta)

    ALG = Algorithm(name="user_td", init=td.init, update=update, hyperparameters=(step_size("eta", "step size"),))
''')


@pytest.fixture
def user_dir(tmp_path):
    # A name of this directory's own: a module run in this process stays imported.
    name = f"user_alg_{os.getpid()}_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    return tmp_path, name


def bec_here(args, cwd, monkeypatch, capsys) -> subprocess.CompletedProcess:
    """`bec-jax ARGS` run in this process in `cwd` (`cli.main`, what the script
    exits with): its exit status and stderr, as `bec` gives them. The user's
    algorithm's faults need no fresh process (the address-space limit does):
    here the runs share one start-up and one compiled program."""
    from bec_jax.cli import commands as cli
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))
    capsys.readouterr()
    code = cli.main(args)
    return subprocess.CompletedProcess(args, code, "", capsys.readouterr().err)


def _run_args(name, out, *extra):
    return ["run", "--env", "two_state", "--algorithm", f"{name}:ALG", "--eta", "0.1,0.2,0.3",
            "--steps", "200", "--seeds", "3", "--log-every", "20", "--chunk-size", "1", "--out", out, *extra]


@pytest.mark.parametrize("mode,expected", [
    ("trace", "ZeroDivisionError: division by zero"),
    pytest.param("runtime", "ZeroDivisionError: float division by zero at run time", marks=pytest.mark.long),
])
def test_a_failing_user_algorithm_is_one_line_and_the_command_runs_again(user_dir, mode, expected, monkeypatch,
                                                                         capsys):
    d, name = user_dir
    (d / "fault").write_text(mode)
    (d / "empty").mkdir()
    for out in ("fresh", "empty"):
        p = bec_here(_run_args(name, out), d, monkeypatch, capsys)
        line = one_line(p, f"algorithm: {name}:ALG (module {name}) failed: ")
        assert line.endswith(expected), line
    # Nothing was saved: nothing blocks the same command, and a directory that was
    # there is as it was found.
    assert not (d / "fresh").exists() and list((d / "empty").iterdir()) == []
    (d / "fault").unlink()
    for out in ("fresh", "empty"):
        p = bec_here(_run_args(name, out), d, monkeypatch, capsys)
        assert p.returncode == 0, p.stderr
    assert_same_files(d / "fresh", d / "empty")


def test_memory_running_out_after_a_chunk_is_saved_resumes_to_the_same_files(user_dir, monkeypatch, capsys):
    d, name = user_dir
    clean = bec_here(_run_args(name, "clean"), d, monkeypatch, capsys)
    assert clean.returncode == 0, clean.stderr
    (d / "fault").write_text("memory")
    p = bec_here(_run_args(name, "run"), d, monkeypatch, capsys)
    line = one_line(p, "memory: the run ran out of memory (MemoryError: simulated: a host buffer could not be "
                       "allocated); ")
    assert "lower --memory-budget or log less often (a larger --log-every)" in line
    assert line.endswith("1 of 3 chunks are saved in run/chunks (and the finished segments of the chunk in "
                         "progress): continue with --resume")
    (d / "fault").unlink()
    p = bec_here(["run", "--out", "run", "--resume"], d, monkeypatch, capsys)
    assert p.returncode == 0, p.stderr
    assert_same_files(d / "clean", d / "run")


def test_an_internal_error_keeps_its_traceback_and_leaves_nothing(tmp_path, monkeypatch):
    """A bug of bec_jax itself is not dressed as the user's: it propagates as it
    was, and a fresh run that saved nothing leaves no chunk store behind."""
    def broken(*a, **k):
        raise KeyError("an internal bug")

    monkeypatch.setattr(execute, "call", broken)
    spec = SweepSpec(env="two_state", algorithm="td", alpha=(0.1,), steps=40, seeds=2, log_every=10)
    out = tmp_path / "r"
    with pytest.raises(KeyError, match="an internal bug"):
        runner.run_to_dir(spec, str(out), progress=False, devices=jax.devices()[:1])
    assert not out.exists()


def test_a_mapping_refused_mid_run_is_one_line_naming_the_limit(tmp_path, monkeypatch):
    """OSError ENOMEM (what `ulimit -v` gives a mapping) in chunk 2: one line with
    the limit, and the first chunk kept for --resume."""
    real, calls = execute.call, {"n": 0}

    def failing(exe, *args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(12, "Cannot allocate memory")
        return real(exe, *args)

    monkeypatch.setattr(execute, "call", failing)
    monkeypatch.setattr(memory, "address_space_limit", lambda: 16_000_000 * 1024)
    spec = SweepSpec(env="two_state", algorithm="td", alpha=(0.1, 0.2), steps=40, seeds=2, log_every=10)
    out = str(tmp_path / "r")
    with pytest.raises(memory.OutOfMemory) as e:
        runner.run_to_dir(spec, out, chunk_size=1, progress=False, devices=jax.devices()[:1])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("memory: the run ran out of memory (OSError: [Errno 12] Cannot "
                                              "allocate memory); address space limited to 15.3 GiB by ulimit -v")
    assert "raise the limit (ulimit -v)" in msg and msg.endswith("continue with --resume")
    monkeypatch.setattr(execute, "call", real)
    r = runner.run_to_dir(None, out, resume=True, progress=False, devices=jax.devices()[:1])
    ref = sweep.run(spec, chunk_size=1, progress=False, devices=jax.devices()[:1])  # uninterrupted: its program
    np.testing.assert_array_equal(r.mean, ref.mean)


def test_control_run_failing_before_a_chunk_is_saved_leaves_nothing(tmp_path, monkeypatch, capsys):
    """`bec-jax control` is contained the same way: one line, and the same
    command runs once the fault is gone."""
    from bec_jax.cli import commands as cli
    real = execute.call

    def failing(exe, *args):
        raise MemoryError("simulated")

    monkeypatch.setattr(execute, "call", failing)
    args = ["control", "--task", "cliff_walking", "--algorithm", "q", "--alpha", "0.1", "--episodes", "5",
            "--seeds", "2", "--out", str(tmp_path / "c")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bec-jax: error: memory: the run ran out of memory (MemoryError: "
                                               "simulated)"), err
    assert not (tmp_path / "c").exists()
    monkeypatch.setattr(execute, "call", real)
    assert cli.main(args) == 0
