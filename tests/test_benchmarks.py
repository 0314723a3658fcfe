"""The benchmark scripts keep working: each one's --smoke mode runs in a subprocess
and writes JSON with the expected keys and positive numbers. Nothing here asserts a
speed (these are not timed tests); the targets are checked by the full runs.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import _common, baseline_numpy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, tmp_path, timeout=600):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, *args, "--smoke", "--out-dir", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _positive(d, *paths):
    for path in paths:
        v = d
        for k in path.split("."):
            v = v[k]
        assert isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, f"{path} = {v!r}"


def _machine_ok(d):
    assert d["machine"]["cpu_model"]
    _positive(d, "machine.cpu_cores", "machine.ram_bytes")


def test_standard_workload_is_the_papers_boyan_ctdc_sweep():
    from bec_jax.experiments.paper import spec_for

    spec = _common.standard_spec()
    # The reproduction also logs RMSPCBE and the fixpoint distance; the benchmark's
    # workload is its RMSCBE sweep (the metric the step sizes are chosen by).
    assert spec.to_dict() == spec_for("boyan_chain", "ctdc").replace(metrics=("rmscbe",)).to_dict()
    assert (spec.num_points, spec.seeds, spec.steps, spec.log_every, spec.dtype) == (576, 50, 1000, 10, "float32")
    assert spec.metrics == ("rmscbe",)


def test_baseline_loop_implements_bec_jax_ctdc():
    worst = baseline_numpy.check_against_bec_jax(steps=300)
    assert set(worst) == {"theta", "u", "omega", "rmscbe"}


def test_baseline_check_catches_a_different_update(monkeypatch):
    # A run that does not follow bec_jax's update (here: no step at all) must fail the check.
    def frozen(tables, R, h, a, b, z, steps, log_every, seed=0, uniforms=None, divergence_bound=1e6):
        log = np.full(steps // log_every + 1, np.sqrt(np.sum(h * h)))
        return log, tables.theta0.copy(), np.zeros_like(tables.theta0), 0.0, steps

    monkeypatch.setattr(baseline_numpy, "run_ctdc", frozen)
    with pytest.raises(AssertionError):
        baseline_numpy.check_against_bec_jax(steps=50)


def test_baseline_metric_is_rmscbe():
    from bec_jax import envs
    from bec_jax.theory import metrics

    tables, R, h = baseline_numpy.make_problem("boyan_chain")
    log, theta, *_ = baseline_numpy.run_ctdc(tables, R, h, 0.1, 0.1, 0.1, steps=100, log_every=10, seed=3)
    assert log.shape == (11,)
    np.testing.assert_allclose(log[-1], metrics.rmscbe(envs.make("boyan_chain"), theta), rtol=1e-10)


@pytest.mark.long
def test_baseline_script_smoke(tmp_path):
    _run(["benchmarks/baseline_numpy.py"], tmp_path)  # the file form of invocation
    d = json.loads((tmp_path / "baseline_numpy_smoke.json").read_text())
    assert d["smoke"] is True and d["dtype"] == "float64"
    _machine_ok(d)
    _positive(d, "updates", "seconds", "updates_per_s")


@pytest.mark.long
def test_throughput_script_smoke(tmp_path):
    # --runs 32: the smoke grid's 8 points x 4 seeds, as without it (through the sizing code).
    out = _run(["-m", "benchmarks.throughput", "--runs", "32"], tmp_path)
    assert "met" in out  # the targets are printed with met / NOT MET
    assert "plan: 8 grid points a call x 1 call(s), 4 seeds a call" in out
    d = json.loads((tmp_path / "throughput_smoke.json").read_text())
    assert d["smoke"] is True and d["workload"]["runs"] == 32 and d["command"].endswith("--smoke --runs 32")
    _machine_ok(d)
    assert d["jax"]["jax_version"] and d["jax"]["backend"]
    _positive(d, "jax.num_devices", "workload.updates", "baseline.updates_per_s", "bec_jax.updates_per_s",
              "bec_jax.run_time_s", "ratio", "compile.fresh_process_s", "compile.in_process_median_s",
              "compile.cache_cold_s", "compile.cache_warm_s", "memory.peak_rss_bytes",
              "memory.rss_before_sweep_bytes")
    assert d["jax"]["num_devices"] == d["bec_jax"]["num_devices"]
    assert d["compile"]["fresh_process_each_s"] and min(d["compile"]["fresh_process_each_s"]) > 0
    assert set(d["targets"]) == {"updates_per_s", "speedup_vs_numpy", "compile_time_s", "memory_bytes"}
    for t in d["targets"].values():
        assert isinstance(t["met"], bool) and t["value"] > 0 and t["target"] > 0
    assert len(d["baseline"]["rounds"]) == len(d["bec_jax"]["rounds"]) >= 1
    assert all(np.isfinite(d["plausibility"]["baseline"])) and all(np.isfinite(d["plausibility"]["bec_jax"]))


@pytest.mark.long
def test_runs_sizes_the_benchmarks_and_bad_values_are_one_line_errors():
    """`--runs N` (benchmarks.throughput and benchmarks.scaling): the standard grid
    with enough seeds, the batch axis a decade at a time up to N; anything but a
    whole number from 1 to 10^9 is refused in one line, before JAX starts."""
    from benchmarks import scaling, throughput

    assert throughput.parse_runs("1e7") == throughput.parse_runs("10_000_000") == 10**7
    spec = throughput.sized_spec(10**7)
    assert (spec.num_points, spec.seeds, spec.steps) == (576, 17362, 1000)  # 10,000,512 runs
    assert throughput.sized_spec(None).seeds == 50 and throughput.sized_spec(100, smoke=True).seeds == 13
    assert scaling.batch_configs() == scaling.BATCH_CONFIGS
    assert scaling.batch_configs(10**7) == scaling.BATCH_CONFIGS + [(200_000, 50, 1000)]
    assert scaling.batch_configs(3 * 10**7)[-2:] == [(200_000, 50, 1000), (600_000, 50, 1000)]
    assert scaling.batch_configs(10**4) == scaling.BATCH_CONFIGS[:5]
    for bad in ("0", "-5", "1.5", "2e9", "lots", "nan"):
        with pytest.raises(ValueError, match="^--runs must be a whole number"):
            throughput.parse_runs(bad)
    env = dict(os.environ, PYTHONPATH=REPO)
    for mod in ("benchmarks.throughput", "benchmarks.scaling"):
        p = subprocess.run([sys.executable, "-m", mod, "--runs", "1e10"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2 and p.stdout == "", p.stdout
        assert p.stderr.splitlines() == [f"python -m {mod}: error: --runs must be a whole number of runs (grid "
                                         "points x seeds) from 1 to 1e+09, such as 1e7; got '1e10'"], p.stderr


@pytest.mark.long
def test_scaling_script_smoke(tmp_path):
    _run(["-m", "benchmarks.scaling", "--no-docs"], tmp_path)
    d = json.loads((tmp_path / "scaling_smoke.json").read_text())
    assert d["smoke"] is True and d["plot_docs_copy"] is None
    _machine_ok(d)
    _positive(d, "jax.num_devices", "baseline_numpy_updates_per_s")
    assert d["batch"] and d["steps"]
    for c in d["batch"] + d["steps"]:
        for k in ("points", "seeds", "steps", "batch", "updates", "updates_per_s", "run_time_s",
                  "compile_first_s", "compile_median_s", "peak_rss_bytes", "rss_before_sweep_bytes"):
            assert c[k] > 0, (c["label"], k, c[k])
        assert c["peak_rss_bytes"] >= c["rss_before_sweep_bytes"]
    with open(tmp_path / "scaling_smoke.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.long
def test_compare_ref_script_smoke(tmp_path):
    """The working tree against HEAD: in a clean checkout the two are the same code,
    so the script must find bit-identical results (it would report any change)."""
    import shutil
    if shutil.which("git") is None or subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO,
                                                      capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    _run(["-m", "benchmarks.compare_ref", "--ref", "HEAD"], tmp_path)
    d = json.load(open(tmp_path / "compare_ref_smoke.json"))
    assert len(d["ref"]) == 40 and d["smoke"] is True
    _positive(d, "ref_result.updates_per_s_median", "work_result.updates_per_s_median",
              "ref_result.first_run_wall_s_median", "work_result.first_run_wall_s_median", "throughput_ratio")
    assert d["machine"]["cpu"]
    if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "bec_jax"], cwd=REPO).returncode == 0:
        assert d["bit_identical"] is True


@pytest.mark.long
def test_control_speed_script_smoke(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = tmp_path / "control_speed.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.control_speed", "--episodes", "30", "--seeds", "2",
                           "--json", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(out.read_text())
    b, n = d["authors"]["bec_jax"], d["authors"]["numpy"]
    # The same runs both ways: 4 algorithms x 2 seeds, every episode logged.
    assert b["runs"] == 8 and b["steps"] > 4 * 2 * 30 and n["steps"] > 4 * 2 * 30
    assert b["wall_s"] > 0 and n["wall_s"] > 0 and "target < 30 s" in proc.stdout


@pytest.mark.long
def test_control_engine_script_smoke(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.control_engine", "--smoke", "--out-dir", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads((tmp_path / "control_engine_smoke.json").read_text())
    (row,) = d["rows"]
    t = row["tasks"]["cliff_walking"]
    # Q, CQ, GQ and CGQ at the authors' setting, 2 seeds x 10 episodes, in one program.
    assert t["runs"] == 8 and t["steps"] >= 8 * 10 and t["how"] == "one program per task"
    assert set(t["last100"]) == {"q", "cq", "gq", "cgq"} and row["wall_s"] > t["compile_s"] > 0


@pytest.mark.long
def test_roofline_script_smoke(tmp_path):
    out = _run(["-m", "benchmarks.roofline"], tmp_path)
    d = json.loads((tmp_path / "roofline_smoke.json").read_text())
    _machine_ok(d)
    _positive(d, "bare_updates_per_s", "peak_flops", "peak_bytes_per_s", "roofline_updates_per_s")
    # XLA's count for one CTDC update with 4 features: at least the state's
    # theta, u (4 floats each) and omega read and written once (72 B), and at least
    # the hand count of the update's arithmetic (about 60 flops: two dot products
    # for the TD error, one for phi.u, the three parameter updates).
    assert 72 <= d["bytes_per_update"] <= 1000 and 60 <= d["flops_per_update"] <= 300
    assert "bandwidth ceiling" in out and "roofline bound" in out


@pytest.mark.long
def test_control_roofline_script_smoke(tmp_path):
    out = _run(["-m", "benchmarks.control_roofline"], tmp_path)
    d = json.loads((tmp_path / "control_roofline_smoke.json").read_text())
    _machine_ok(d)
    _positive(d, "bandwidth_Bps", "peak_flops")
    (row,) = d["rows"]
    _positive(row, "flops_per_run_step", "bytes_per_run_step", "run_step_ns", "bound_ns", "thunks_per_step")
    # CliffWalking: 4 actions, one-hot features (one index an action). CGQ reads
    # Q(s, .) and Q(s', .) (4 weights each) and reads and writes w and u at
    # (s, a) (4 values): 2 A m + 4 m = 12 float32 values, 48 bytes; XLA's count
    # (whole operands of its gathers and scatters) is above it.
    assert (row["actions"], row["active"], row["weights"]) == (4, 1, 192)
    assert row["touched_bytes"] == 48 and row["bytes_per_run_step"] > 48
    # A step is dozens of dispatched operations (act, the task, the update, the log, the reset's cond).
    assert 10 <= row["thunks_per_step"] <= 200
    assert "| cliff_walking |" in out


@pytest.mark.long
def test_reproduce_time_script_smoke(tmp_path):
    out = _run(["-m", "benchmarks.reproduce_time"], tmp_path)
    d = json.loads((tmp_path / "reproduce_time_smoke.json").read_text())
    _machine_ok(d)
    (cold,) = d["cold"]
    _positive(d, "cold_wall_median_s")
    assert d["quick"] and d["warm"] is None
    # The process's wall time holds the reproduction's own clock, which holds its
    # summed compile time over two compile threads only in part.
    assert cold["wall_s"] > cold["total_s"] > 0 and cold["compile_s"] > 0 and cold["run_s"] > 0
    assert cold["device"].startswith(d["machine"]["cpu_model"]) and " JAX " in cold["device"]
    assert "empty compilation cache" in out


@pytest.mark.long
def test_latency_script_smoke(tmp_path):
    import shutil
    if shutil.which("git") is None or subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO,
                                                      capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    out = _run(["-m", "benchmarks.latency", "--ref", "HEAD"], tmp_path)
    d = json.loads((tmp_path / "latency_smoke.json").read_text())
    _machine_ok(d)
    assert len(d["ref"]) == 40 and d["smoke"] is True and d["rounds"] == 1
    for tree in ("ref", "work"):
        (sweep,), (first,) = d["results"][tree]["sweep"], d["results"][tree]["first_compile"]
        assert sweep["value"] == sweep["wall_s"] > 0 and 0 < first["value"] < first["wall_s"]
    # This tree's run records its start-up, trace, compile (an empty cache: a miss) and run.
    t = d["results"]["work"]["sweep"][0]["timing"]
    assert t["cache"] == "miss" and t["programs"] == 1 and t["import_s"] > 0 and t["run_s"] > 0
    assert "| measurement | ref " in out and out.count("\n| ") >= 3


# ---------------------------------------------------------------- the C prototype (issue 15)

needs_cc = pytest.mark.skipif(not __import__("benchmarks.kernel_prototype").kernel_prototype.can_build(),
                              reason="no C compiler that takes -O3 -march=native: the kernel prototype cannot be built")


@needs_cc
def test_kernel_prototype_follows_the_numpy_loop():
    from benchmarks import kernel_prototype

    worst = kernel_prototype.check_against_numpy(steps=100)
    assert set(worst) == {"theta", "u", "omega", "rmscbe"} and max(worst.values()) < 1e-5


@needs_cc
def test_kernel_prototype_check_catches_a_different_loop(monkeypatch):
    # A loop that does not follow the NumPy loop (here: its step sizes halved) must fail the check.
    from benchmarks import kernel_prototype

    real = kernel_prototype.run
    monkeypatch.setattr(kernel_prototype, "run", lambda p, a, b, z, *args, **kw: real(p, a / 2, b, z, *args, **kw))
    with pytest.raises(AssertionError):
        kernel_prototype.check_against_numpy(steps=50)


@needs_cc
def test_kernel_prototype_reverts_freezes_and_takes_statistics_as_the_engine_does():
    from benchmarks import kernel_prototype as kp

    problem = kp.Problem()
    steps, K, N = 60, 10, 5
    u = np.random.default_rng(3).random((N, steps + 1)).astype(np.float32)
    # Point 0 stays small; point 1 (alpha = 3) leaves a bound of 50 in some seeds (at steps 30, 50 and 60).
    a, b, z = np.array([0.05, 3.0]), np.array([0.1, 0.1]), np.array([0.1, 0.1])
    got = kp.run(problem, a, b, z, N, steps, K, bound=50.0, uniforms=u)
    free = kp.run(problem, a, b, z, N, steps, K, bound=np.inf, uniforms=u)
    assert np.all(got["dstep"][:, 0] == -1)
    assert sorted(got["dstep"][:, 1]) == [-1, -1, 30, 50, 60]
    for n in range(N):
        d = int(got["dstep"][n, 1])
        if d < 0:
            np.testing.assert_array_equal(got["vals"][:, n, 1], free["vals"][:, n, 1])
            continue
        assert d % K == 0
        # Frozen at the state of the flagged block's start: a run of d - K steps on the same draws.
        before = kp.run(problem, a, b, z, N, d - K, K, bound=np.inf, uniforms=u[:, : d - K + 1])
        for name in ("theta", "u"):
            np.testing.assert_array_equal(got[name][n, :, 1], before[name][n, :, 1])
        assert got["omega"][n, 1] == before["omega"][n, 1]
        # Its log: the free run's until the block before, then that value held.
        l = d // K
        np.testing.assert_array_equal(got["vals"][:l, n, 1], free["vals"][:l, n, 1])
        assert np.all(got["vals"][l:, n, 1] == got["vals"][l - 1, n, 1])
        # Flagged at the first block's end where theta, u or omega was out of the bound.
        at = kp.run(problem, a, b, z, N, d, K, bound=np.inf, uniforms=u[:, : d + 1])
        size = lambda r: max(np.abs(r["theta"][n, :, 1]).max(), np.abs(r["u"][n, :, 1]).max(),  # noqa: E731
                             abs(r["omega"][n, 1]))
        assert size(at) > 50 >= size(before)
    # The statistics: over the seeds alive at each log point (flagged at step d: not alive from there on).
    steps_l = np.arange(steps // K + 1) * K
    for g in range(2):
        alive = (got["dstep"][None, :, g] < 0) | (got["dstep"][None, :, g] > steps_l[:, None])
        v = got["vals"][:, :, g].astype(np.float64)
        cnt = alive.sum(1)
        np.testing.assert_array_equal(got["count"][:, g], cnt)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(alive, v, 0).sum(1) / cnt
            ss = np.where(alive, (v - mean[:, None]) ** 2, 0).sum(1)
            std, sem = np.sqrt(ss / cnt), np.where(cnt > 1, np.sqrt(ss / ((cnt - 1) * cnt)), 0.0)
        np.testing.assert_allclose(got["mean"][:, g], np.where(cnt > 0, mean, np.nan), rtol=1e-6)
        np.testing.assert_allclose(got["std"][:, g], np.where(cnt > 0, std, np.nan), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got["sem"][:, g], np.where(cnt > 0, sem, np.nan), rtol=1e-4, atol=1e-6)


@pytest.mark.long
def test_continuing_speed_script_smoke(tmp_path):
    out = _run(["-m", "benchmarks.continuing_speed"], tmp_path)
    d = json.loads((tmp_path / "continuing_speed_smoke.json").read_text())
    _machine_ok(d)
    _positive(d, "run_steps_per_s", "loop_steps_per_s", "full_grid_s", "full_grid_loop_s", "ratio")
    b, loop = d["bec_jax"], d["python_loop"]
    # The smoke grid: two values of each of alpha, eta, gamma and offset, 2 seeds x 100 steps.
    assert (b["points"], b["seeds"], b["steps"]) == (16, 2, 100) and b["run_steps"] == 3200
    assert b["compile_s"] > 0 and b["run_s"] > 0 and loop["steps"] == 1000 and loop["wall_s"] > 0
    # Access-Control's rewards are priorities in {0, 1, 2, 4, 8}: a reward rate lies in [0, 8].
    assert 0 <= b["loop_setting_reward_rate"] <= 8 and 0 <= loop["reward_rate"] <= 8
    assert d["full_grid_run_steps"] == 1680 * 50 * 50_000 and "Python loop" in out


@needs_cc
@pytest.mark.long
def test_kernel_prototype_script_smoke(tmp_path):
    out = _run(["-m", "benchmarks.kernel_prototype"], tmp_path)
    d = json.loads((tmp_path / "kernel_prototype_smoke.json").read_text())
    _machine_ok(d)
    _positive(d, "engine_updates_per_s", "numpy_updates_per_s", "ratio_c_full_vs_numpy", "ratio_engine_vs_numpy")
    for c in d["c_loop"].values():
        assert c["bare_updates_per_s"] > 0 and c["full_updates_per_s"] > 0
    a = d["agreement_with_engine"]
    assert 0 <= a["c_vs_engine_within_3"] <= 1 and 0 <= a["engine_vs_engine_within_3"] <= 1
    assert "full / bare" in out and "the C loop follows the NumPy loop" in out


def test_control_waste_counts_run_steps_by_hand(tmp_path):
    """benchmarks.control_waste on two members of hand-made run lengths."""
    from benchmarks import control_waste as cw
    a = np.array([[10, 20], [100, 90]])  # 2 points x 2 seeds: the member steps 4 x 100
    b = np.array([[5, 5, 5]])            # 1 point x 3 seeds: 3 x 5
    assert cw.computed([a, b], "member") == 400 + 15
    assert cw.computed([a, b], "point") == 2 * 20 + 2 * 100 + 15
    # sorted [100, 90, 20, 10] in groups of 2: 2 x 100 + 2 x 20; [5, 5, 5]: 2 x 5 + 1 x 5
    assert cw.computed([a, b], "compacted", group=2) == 240 + 15
    with pytest.raises(ValueError, match="mode"):
        cw.computed([a], "nope")
    out = _run(["-m", "benchmarks.control_waste"], tmp_path)
    d = json.loads((tmp_path / "control_waste_smoke.json").read_text())
    _machine_ok(d)
    # task a: useful 235 run-steps; member-level 415, per point 255
    row = d["rows"][0]
    assert row["useful_run_steps"] == 235 and abs(row["useful_fraction_member"] - 235 / 415) < 1e-12
    assert abs(row["useful_fraction_point"] - 235 / 255) < 1e-12 and "| a | 7 | 2 |" in out
