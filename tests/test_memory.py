"""Long and large runs (`bec_jax.engine.memory`, the segmented engine, the run directory):
the memory estimate against XLA's own buffer assignment, seed chunks and time
segments invisible in the results (bit for bit), refusals before any work, a
SIGTERM at a segment boundary resumed to identical files, an injected
out-of-memory error, and logs that stream to disk and load memory-mapped."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest
from xla_env import xla_flags

from bec_jax import files
from bec_jax.cli import commands as cli
from bec_jax.engine import execute, memory, tuning
from bec_jax.prediction import sizes as prediction_sizes
from bec_jax.prediction import sweep
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import SweepSpec
from bec_jax.run import rundir, runner

ARRAYS = ("steps", "mean", "std", "sem", "alive", "final", "diverged_step", "auc_seed")


def small_spec(**kw):
    base = dict(env="boyan_chain", algorithm="ctdc",
                hyperparameters={"alpha": [0.05, 0.2, 2.0], "beta": [0.1], "zeta": [0.5]},
                steps=120, seeds=7, log_every=10, divergence_bound=10.0)  # alpha 2: 2 of 7 seeds diverge
    base.update(kw)
    return SweepSpec(**base)


def assert_same(a: SweepResult, b: SweepResult):
    """Every array bit for bit (NaN where NaN)."""
    for k in ARRAYS:
        x, y = np.asarray(getattr(a, k)), np.asarray(getattr(b, k))
        assert x.dtype == y.dtype and x.shape == y.shape, k
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k


@pytest.fixture(scope="module")
def reference():
    """One grid chunk, every seed, one segment: the program `sweep.run` always ran."""
    spec = small_spec()
    r = sweep.run(spec, progress=False, devices=jax.devices()[:1])
    assert r.meta["seeds_per_call"] == spec.seeds and r.meta["blocks_per_segment"] == spec.steps // 10
    return spec, r


# ------------------------------------------------------------------ the estimate

@pytest.mark.parametrize("env,alg,hp,seeds,G,K,L", [
    pytest.param("baird", "td", {"alpha": None}, 20000, 1, 10, 4, marks=pytest.mark.long),
    ("boyan_chain", "ctdc", {"alpha": None, "beta": [0.1], "zeta": [0.1]}, 5000, 2, 50, 4),
])
def test_estimate_bounds_xla_buffer_assignment(env, alg, hp, seeds, G, K, L, cpu_backend):
    """The model's bytes per call are never below what XLA allocates for the
    program (arguments + outputs + temporaries) and at most 3x it, for the whole
    program and for a seed chunk's segment program, in the run-fast form
    (`tuning.KernelForm.paired`: log blocks in pairs, two blocks' uniforms live at once)
    and without it. Against XLA:CPU's buffer assignment (compile options below), on a GPU machine too."""
    hp = {k: (list(np.linspace(0.01, 0.1, G)) if v is None else v) for k, v in hp.items()}
    spec = SweepSpec(env=env, algorithm=alg, hyperparameters=hp, steps=K * L, seeds=seeds, log_every=K)
    groups, chunks = sweep.plan(spec, G)
    grid = sweep.chunk_grid(spec, groups[0], chunks[0])
    dev = cpu_backend

    def xla(compiled):
        m = compiled.memory_analysis()
        return m.temp_size_in_bytes + m.output_size_in_bytes + m.argument_size_in_bytes

    sz = prediction_sizes.sizes(spec)
    est = memory.call_bytes(sz, G, seeds, L, False)
    est_seg = memory.call_bytes(sz, G, seeds // 2, 2, True)
    for fast in (True, False):
        form = tuning.choose_form(spec, dev, groups[0], tuning.CPU_COMPILER_OPTIONS if fast else tuning.CPU_LIGHT_OPTIONS,
                                  front=sweep)
        # The fast form compiles with XLA's defaults (a user's compiler_options={}),
        # which keep more temporaries than its own options: the stricter bound. The
        # light form with its own, as the engine compiles it (the loop emitters: a
        # third of the compile time, the same buffers as with XLA's defaults).
        options = None if fast else form.compiler_options
        full = xla(sweep.make_program(spec, groups[0], G, dev, form=form).fn.lower(np.uint32(0), grid).compile(options))
        assert 1.0 <= est / full <= 3.0, (fast, est, full)
        sp = sweep.make_segment_programs(spec, groups[0], G, seeds // 2, 2, dev, form=form)
        carry = jax.eval_shape(sp.start, np.uint32(0), grid, np.int32(0))[0]
        seg = xla(sp.advance.lower(np.uint32(0), grid, np.int32(0), carry, np.int32(0)).compile(options))
        assert 1.0 <= est_seg / seg <= 3.0, (fast, est_seg, seg)


def test_plan_chunks_seeds_only_when_a_point_does_not_fit():
    spec = SweepSpec(env="baird", algorithm="td", hyperparameters={"alpha": [0.1]}, steps=100,
                     seeds=30_000_000, log_every=10)
    sz = prediction_sizes.sizes(spec)
    p = sweep.plan_memory(spec, 1, memory_budget=3 * 10**9, host_budget=10**12)
    assert p.segmented and p.seeds < spec.seeds and p.grid == 1
    assert p.device_bytes <= 3 * 10**9
    assert memory.call_bytes(sz, 1, spec.seeds, 1, False) > 3 * 10**9  # all seeds would not fit
    # The standard workload runs as before: every point and seed in one call.
    std = SweepSpec(env="boyan_chain", algorithm="ctdc", hyperparameters={
        "alpha": list(np.geomspace(1e-3, 1, 24)), "beta": list(np.geomspace(1e-3, 1, 24)), "zeta": [0.5]},
        steps=1000, seeds=50, log_every=10)
    q = sweep.plan_memory(std, 1, memory_budget=2 << 30)
    assert (q.grid, q.seeds, q.blocks, q.segmented) == (576, 50, 100, False)


def test_parse_size():
    assert memory.parse_size("3GB") == 3 * 10**9
    assert memory.parse_size("500MiB") == 500 * 2**20
    assert memory.parse_size("2e9") == 2 * 10**9
    with pytest.raises(ValueError, match="memory_budget"):
        memory.parse_size("lots")


# ------------------------------------------------------------------ invisible layouts

@pytest.fixture(scope="module")
def seed_chunked(reference):
    spec, _ = reference
    return sweep.run(spec, progress=False, devices=jax.devices()[:1], seed_chunk=3)


def test_time_segments_are_bitwise_invisible(reference):
    spec, ref = reference
    r = sweep.run(spec, progress=False, devices=jax.devices()[:1], segment_blocks=5)
    assert r.meta["blocks_per_segment"] == 5 and r.meta["compiled_programs"] == 4  # start, 5 and 2 blocks, finish
    assert 0 < r.diverged_fraction[2] < 1  # some seeds diverge: freezing and masked statistics exercised
    assert_same(ref, r)


def test_seed_chunks_match_one_call(reference, seed_chunked):
    """Bit for bit, the statistics over seeds included: the host takes them from
    the per-seed values with the program's own `seed_stats.mean_std_sem`."""
    _, ref = reference
    assert seed_chunked.meta["seeds_per_call"] == 3
    assert_same(ref, seed_chunked)


def test_any_two_seed_chunkings_are_bitwise_equal(reference, seed_chunked):
    spec, _ = reference
    # The layout the injected out-of-memory test inside a segment runs: it reuses these programs.
    other = sweep.run(spec, progress=False, devices=jax.devices()[:1], seed_chunk=4, segment_blocks=3,
                      chunk_size=2)
    assert other.meta["seeds_per_call"] == 4
    assert_same(seed_chunked, other)


def test_seed_chunks_over_several_models():
    # Not the 3-feature "dependent" random walk: on AVX-512, XLA:CPU compiles its
    # update differently for different seed counts, and the last bit can differ
    # (see docs/large-runs.md; with --xla_cpu_max_isa=AVX2 it agrees bit for bit).
    spec = SweepSpec(env="random_walk", algorithm="tdc", hyperparameters={"alpha": [0.1], "zeta": [0.1]},
                     env_params={"gamma": [0.9, 0.5], "features": ["tabular", "inverted"]},
                     steps=60, seeds=30, log_every=5)
    dev = jax.devices()[:1]
    # Two segments of 6 blocks: one segment program (a program of several models
    # compiles with the fusion emitters, the costly ones).
    r = sweep.run(spec, progress=False, devices=dev, seed_chunk=12, segment_blocks=6)
    assert r.meta["seeds_per_call"] == 12 and r.meta["blocks_per_segment"] == 6
    assert_same(sweep.run(spec, progress=False, devices=dev), r)


# ------------------------------------------------------------------ refusals

def _cli(argv, capsys):
    code = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


@pytest.mark.parametrize("budget,says", [("100B", "one run of this spec needs about"),
                                         ("1MB", "the run would take 24 calls")])
def test_refused_when_the_budget_is_too_small(tmp_path, capsys, monkeypatch, budget, says):
    monkeypatch.setattr(memory, "MAX_CALLS", 10)
    out = tmp_path / "x"
    code, err = _cli(["run", "--env", "baird", "--algorithm", "td", "--alpha", "0.1", "--steps", "100",
                      "--seeds", "30000", "--log-every", "10", "--memory-budget", budget, "--out", str(out)],
                     capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("bec-jax: error: memory_budget:"), err
    assert says in err[0] and not out.exists()


def test_refused_when_the_files_do_not_fit_on_disk(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(memory, "disk_free", lambda path: 10**9)
    out = tmp_path / "x"
    code, err = _cli(["run", "--env", "baird", "--algorithm", "td", "--alpha", "0.1", "--steps", "1000000000",
                      "--seeds", "2", "--log-every", "1", "--out", str(out)], capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith("bec-jax: error: log_every:") and "40.0 GB on disk" in err[0] and "1.0 GB" in err[0]
    assert not out.exists()


def test_refused_when_per_seed_results_exceed_host_memory(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(memory, "host_available", lambda: 10**8)
    out = tmp_path / "x"
    code, err = _cli(["run", "--env", "baird", "--algorithm", "td", "--alpha", "0.1", "--steps", "100",
                      "--seeds", "30000000", "--log-every", "10", "--out", str(out)], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("bec-jax: error: seeds: 30000000 seeds")
    assert not out.exists()


def test_in_memory_logs_refused_without_a_directory(monkeypatch):
    monkeypatch.setattr(memory, "host_available", lambda: 10**9)
    spec = SweepSpec(env="baird", algorithm="td", hyperparameters={"alpha": [0.1]}, steps=10**9, seeds=2,
                     log_every=1)
    with pytest.raises(memory.TooLarge, match=r"^log_every: .* host memory; .*--out"):
        sweep.plan_memory(spec)


# ------------------------------------------------------------------ out of memory at run time

def _fail_call(monkeypatch, n: int):
    """Makes the n-th compiled call raise XLA's out-of-memory error; returns the real caller."""
    real, calls = execute.call, {"n": 0}

    def failing(exe, *args):
        calls["n"] += 1
        if calls["n"] == n:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 7800001608 bytes")
        return real(exe, *args)

    monkeypatch.setattr(execute, "call", failing)
    return real


def test_injected_oom_keeps_finished_chunks_and_resumes(tmp_path, reference, monkeypatch):
    spec, ref = reference
    out = str(tmp_path / "run")
    real = _fail_call(monkeypatch, 2)
    with pytest.raises(memory.OutOfMemory) as e:
        runner.run_to_dir(spec, out, chunk_size=1, devices=jax.devices()[:1], progress=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("memory: the device ran out of memory in chunk 2 of 3")
    assert "1 of 3 chunks are saved" in msg and "--resume" in msg
    assert sorted(os.listdir(os.path.join(out, "chunks"))) == ["chunk_00000.npz", "manifest.json"]
    monkeypatch.setattr(execute, "call", real)
    assert_same(ref, runner.run_to_dir(None, out, resume=True, devices=jax.devices()[:1], progress=False))


def test_injected_oom_inside_a_segment_keeps_the_finished_segments(tmp_path, reference, monkeypatch):
    spec, ref = reference
    out = str(tmp_path / "run")
    # Chunks of 2 points: the programs of test_any_two_seed_chunkings_are_bitwise_equal.
    real = _fail_call(monkeypatch, 5)  # two starts, a segment of both seed chunks, then the next fails
    with pytest.raises(memory.OutOfMemory):
        runner.run_to_dir(spec, out, devices=jax.devices()[:1], progress=False, seed_chunk=4,
                          segment_blocks=3, chunk_size=2)
    ck = rundir.ChunkStore(out).restore(0)
    assert ck is not None and ck["next_block"] == 3 and len(ck["carries"]) == 2
    monkeypatch.setattr(execute, "call", real)
    assert_same(ref, runner.run_to_dir(None, out, resume=True, devices=jax.devices()[:1], progress=False))


# ------------------------------------------------------------------ logs on disk

def test_large_logs_stream_to_disk_and_load_memory_mapped(tmp_path, reference, monkeypatch):
    spec, ref = reference
    monkeypatch.setattr(memory, "LAZY_LOG_BYTES", 100)  # the plan streams the logs
    monkeypatch.setattr(files, "LAZY_LOG_BYTES", 100)   # and SweepResult.save writes them as .npy files
    out = str(tmp_path / "lazy")
    # The segments of test_time_segments_are_bitwise_invisible: it reuses its programs.
    r = runner.run_to_dir(spec, out, devices=jax.devices()[:1], progress=False, segment_blocks=5)
    assert sorted(os.listdir(os.path.join(out, "curves"))) == ["alive.npy", "mean.npy", "sem.npy", "std.npy",
                                                               "steps.npy"]
    assert not os.path.exists(os.path.join(out, "chunks"))
    back = SweepResult.load(out)
    assert isinstance(back.mean, np.memmap) and isinstance(back.alive, np.memmap)
    assert_same(ref, back)
    assert_same(ref, r)
    assert back.summary() == ref.summary()
    # An in-memory result larger than the threshold is written the same way.
    ref.save(str(tmp_path / "saved"))
    assert os.path.isfile(os.path.join(tmp_path, "saved", "curves", "mean.npy"))
    assert_same(ref, SweepResult.load(str(tmp_path / "saved")))


# ------------------------------------------------------------------ SIGTERM at a segment boundary

DRIVER = textwrap.dedent("""
    import sys
    from bec_jax.cli import commands as cli
    from bec_jax.engine import memory
    from bec_jax.run import runner
    memory.SEGMENT_UPDATES = 400_000   # 20 segments of 1000 log blocks, a fraction of a second each
    runner.CHECKPOINT_EVERY_S = 0.0    # a checkpoint after every segment: the test sees the run going
    sys.exit(cli.main(sys.argv[1:]))
""")

LONG = ["run", "--env", "boyan_chain", "--algorithm", "ctdc", "--alpha", "0.1", "--beta", "0.1", "--zeta", "0.5",
        "--steps", "2000000", "--seeds", "4", "--log-every", "100", "--chunk-size", "1"]


@pytest.mark.long
def test_sigterm_stops_at_a_segment_and_resume_is_identical(tmp_path):
    # cpu=False: compared below with this process's run, on the default device.
    env = dict(xla_flags(devices=1, cpu=False), BEC_JAX_NO_CACHE="1")
    out = tmp_path / "long"
    ck = out / "chunks" / "chunk_00000" / rundir.CHECKPOINT_FILE
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, *LONG, "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not ck.exists() and proc.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    t_sig = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert time.monotonic() - t_sig < 5.0
    assert "its state is saved" in err and "--resume" in err
    with np.load(ck) as z:
        stopped_at = int(z["next_block"])
    assert 0 < stopped_at < 20000
    again = subprocess.run([sys.executable, "-c", DRIVER, "run", "--out", str(out), "--resume"], env=env, check=False,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    # The same spec in one call here: segments are invisible, bit for bit.
    spec = SweepSpec(env="boyan_chain", algorithm="ctdc", hyperparameters={"alpha": [0.1], "beta": [0.1],
                                                                           "zeta": [0.5]},
                     steps=2_000_000, seeds=4, log_every=100)
    whole = sweep.run(spec, progress=False, devices=jax.devices()[:1])
    assert whole.meta["blocks_per_segment"] == 20000
    with np.load(out / "curves.npz") as a:
        b = whole.arrays()
        assert sorted(a.files) == sorted(b)
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k
