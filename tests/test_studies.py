"""Studies, plots, tables for pandas, honest statistics, and scale-out: study
files resumed after SIGTERM, --chunks K/N parts, two jax.distributed processes,
summary.csv and DataFrames against the JSON and npz, confidence intervals against
scipy, confirmation on fresh seeds, and the packaging files."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib

import jax
import numpy as np
import pytest
from xla_env import xla_flags

import bec_jax
from bec_jax.cli import commands as cli
from bec_jax.prediction import sweep
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import SweepSpec
from bec_jax.run.study import load_frame
from bec_jax.stats import t_interval

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEC_JAX = shutil.which("bec-jax") or "bec-jax"

STUDY = """
seeds = 20
steps = 400
log_every = 20
metrics = ["rmscbe", "rmspbe"]

[[sweep]]
name = "first"
env = "two_state"
algorithm = "ctd"
alpha = [0.01, 0.05]
beta = [0.1]

[[sweep]]
name = "long"
env = "baird"
algorithm = "ctdc"
alpha = [0.001, 0.002, 0.005, 0.01]
beta = [0.01, 0.1]
zeta = [0.01, 0.05]
steps = 10000      # 8 chunks of 2 points under --chunk-size 2: a SIGTERM after the first lands before the last
log_every = 500
seeds = 50

[[sweep]]
env = "random_walk"
algorithm = "tdrc"
alpha = [0.03125]
reg = [0.0, 1.0]
[sweep.env_params]
features = ["tabular", "dependent"]
"""


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("xla-cache")
    return dict(os.environ, BEC_JAX_CPU_DEVICES="2", BEC_JAX_CACHE_DIR=str(cache))


def _arrays(path):
    with np.load(os.path.join(path, "curves.npz")) as z:
        return {k: z[k] for k in z.files}


def _same_results(a_dir, b_dir, names):
    for n in names:
        a, b = _arrays(os.path.join(a_dir, n)), _arrays(os.path.join(b_dir, n))
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{n}/{k}")
        assert json.load(open(os.path.join(a_dir, n, "summary.json"))) == \
            json.load(open(os.path.join(b_dir, n, "summary.json")))
        assert open(os.path.join(a_dir, n, "summary.csv")).read() == open(os.path.join(b_dir, n, "summary.csv")).read()


@pytest.mark.long
def test_study_interrupted_by_sigterm_resumes_to_identical_files(tmp_path, cli_env):
    (tmp_path / "study.toml").write_text(STUDY)
    names = ["first", "long", "random_walk-tdrc"]
    ref = tmp_path / "ref"
    p = subprocess.run([BEC_JAX, "study", "study.toml", "--out", str(ref)], cwd=tmp_path, env=cli_env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "out"
    proc = subprocess.Popen([BEC_JAX, "study", "study.toml", "--out", str(out), "--chunk-size", "2"],
                            cwd=tmp_path, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not (out / "long" / "chunks" / "chunk_00000.npz").exists():  # the first sweep done, the second going
        assert proc.poll() is None and time.time() - t0 < 300, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert "bec-jax study --out" in err and "--resume" in err
    status = json.load(open(out / "study.json"))["status"]
    assert status["first"] == "done" and status["long"] == "running" and status["random_walk-tdrc"] == "pending"
    assert (out / "first" / "curves.npz").exists() and not (out / "long" / "curves.npz").exists()
    p = subprocess.run([BEC_JAX, "study", "--out", str(out), "--resume"], cwd=tmp_path, env=cli_env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "first: finished earlier, not run again" in p.stdout and "chunks resumed" in p.stdout
    _same_results(ref, out, names)
    assert json.load(open(out / "study.json"))["status"] == {n: "done" for n in names}


def test_bad_sweep_is_refused_before_any_work(tmp_path, capsys):
    bad = STUDY.replace('alpha = [0.001, 0.002, 0.005, 0.01]', 'alpha = [0.001, -2.0]')
    (tmp_path / "bad.toml").write_text(bad)
    assert cli.main(["study", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bec-jax: error: sweep[1] (long): alpha: must be a step size")
    assert not (tmp_path / "o").exists()
    (tmp_path / "dup.toml").write_text(STUDY.replace('name = "long"', 'name = "first"'))
    assert cli.main(["study", str(tmp_path / "dup.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "sweep[1] (first).name: 'first' is used by another sweep" in capsys.readouterr().err
    (tmp_path / "none.toml").write_text("seeds = 3\n")
    assert cli.main(["study", str(tmp_path / "none.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "study: give at least one [[sweep]] table" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _two_parts(argv: list, env: dict) -> list[str]:
    """Runs `bec-jax *argv --chunks 1/2` and `--chunks 2/2` at the same time; their stdout."""
    procs = [subprocess.Popen([BEC_JAX, *argv, "--chunks", f"{k}/2"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in (1, 2)]
    outs = []
    for q in procs:
        o, e = q.communicate(timeout=300)
        assert q.returncode == 0, e
        outs.append(o)
    return outs


@pytest.mark.long
def test_chunk_parts_from_two_processes_assemble_bitwise(tmp_path, cli_env, capsys):
    args = ["run", "--env", "baird", "--algorithm", "ctdc", "--alpha", "0.001,0.005,0.01,0.05", "--beta",
            "0.01,0.1", "--zeta", "0.01,0.05", "--steps", "400", "--seeds", "20", "--log-every", "20",
            "--chunk-size", "4", "--confirm-seeds", "4"]
    single = tmp_path / "single"
    p = subprocess.run([BEC_JAX, *args, "--out", str(single)], env=cli_env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    shared = tmp_path / "shared"
    base = args[:-2]  # without --confirm-seeds 4
    for o in _two_parts([*base, "--out", str(shared)], cli_env):
        assert "When every part has finished: bec-jax run --out" in o
    assert not (shared / "curves.npz").exists()
    assert sorted(os.listdir(shared / "chunks")) == ["chunk_00000.npz", "chunk_00001.npz", "chunk_00002.npz",
                                                     "chunk_00003.npz", "manifest.json"]
    p = subprocess.run([BEC_JAX, "run", "--out", str(shared), "--resume", "--confirm-seeds", "4"], env=cli_env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "assembled from 4 saved chunks" in p.stdout and "0.00 s compile" in p.stdout
    a, b = _arrays(single), _arrays(shared)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert json.load(open(single / "confirm.json")) == json.load(open(shared / "confirm.json"))
    # A malformed part is refused (in-process: a refusal needs no process of its own).
    capsys.readouterr()
    assert cli.main([*base, "--out", str(tmp_path / "x"), "--chunks", "3/2"]) == 2
    assert "chunks: expected K/N with 1 <= K <= N, got 3/2" in capsys.readouterr().err


@pytest.mark.long
def test_study_parts_assemble_to_the_single_study(tmp_path, cli_env, capsys):
    (tmp_path / "s.toml").write_text('seeds = 6\nsteps = 60\nlog_every = 20\n[[sweep]]\nenv = "two_state"\n'
                                     'algorithm = "ctd"\nalpha = [0.01, 0.05, 0.1]\nbeta = [0.1, 0.2]\n'
                                     '[[sweep]]\nenv = "boyan_chain"\nalgorithm = "td"\nalpha = [0.1, 0.5, 1.0]\n')
    base = ["study", str(tmp_path / "s.toml"), "--chunk-size", "2"]
    one = subprocess.run([BEC_JAX, *base, "--out", str(tmp_path / "one")], env=cli_env, capture_output=True,
                         text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    shared = tmp_path / "parts"
    for o in _two_parts([*base, "--out", str(shared)], cli_env):
        assert "When every part has finished: bec-jax study --out" in o
    assert not (shared / "two_state-ctd" / "curves.npz").exists()
    p = subprocess.run([BEC_JAX, "study", "--out", str(shared), "--resume"], env=cli_env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "(+ 0.00 s compile)" in p.stdout and "3 chunks resumed" in p.stdout
    _same_results(tmp_path / "one", shared, ["two_state-ctd", "boyan_chain-td"])
    # A part with --resume or --confirm-seeds is refused, naming the option (in-process, as above).
    capsys.readouterr()
    assert cli.main([*base, "--out", str(tmp_path / "x"), "--chunks", "1/2", "--confirm-seeds", "3"]) == 2
    assert "chunks: a part only computes its share" in capsys.readouterr().err


def test_float64_run_and_study_resume_without_their_spec(tmp_path, cli_env):
    """A resume given only --out turns on JAX's 64-bit mode for a float64 spec
    read back from the directory, as the first command did."""
    run = ["run", "--env", "two_state", "--algorithm", "td", "--alpha", "0.01,0.1", "--steps", "40", "--seeds",
           "3", "--log-every", "20", "--dtype", "float64"]
    (tmp_path / "s.toml").write_text('dtype = "float64"\nseeds = 3\nsteps = 40\nlog_every = 20\n[[sweep]]\n'
                                     'env = "two_state"\nalgorithm = "td"\nalpha = [0.01, 0.1]\n')
    for first, again in ((run + ["--out", str(tmp_path / "r"), "--chunks", "1/1"],
                          ["run", "--out", str(tmp_path / "r"), "--resume"]),
                         (["study", str(tmp_path / "s.toml"), "--out", str(tmp_path / "s"), "--chunks", "1/1"],
                          ["study", "--out", str(tmp_path / "s"), "--resume"])):
        for argv in (first, again):
            p = subprocess.run([BEC_JAX, *argv], env=cli_env, capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, p.stderr
    for d in (tmp_path / "r", tmp_path / "s" / "two_state-td"):
        assert _arrays(d)["mean"].dtype == np.float64


def _two_processes(argv: list, env: dict) -> list[str]:
    """Runs `bec-jax *argv --distributed` as processes 0 and 1 of one jax.distributed
    run on 127.0.0.1; their stdout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([BEC_JAX, *argv, "--distributed", f"127.0.0.1:{port},2,{i}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    outs = []
    for q in procs:
        try:
            o, e = q.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for r in procs:
                r.kill()
            pytest.fail("the two processes did not finish in 240 s")
        assert q.returncode == 0, e[-3000:]
        outs.append(o)
    return outs


def test_two_jax_processes_equal_one_bit_for_bit(tmp_path, cli_env, capsys):
    """`bec-jax run --distributed` on two processes of two CPU devices each (gloo
    collectives on 127.0.0.1): the grid is sharded over four devices in two
    processes, process 0 writes, and every array equals one process's run."""
    env = xla_flags(cli_env, cpu=True)  # CPU devices and gloo, on a GPU machine too
    # The two-state task, not Baird's: half the work a process does (its compile and
    # the summary's exact verdicts). Alpha 3 diverges, every seed.
    args = ["run", "--env", "two_state", "--algorithm", "ctdc", "--alpha", "3.0,0.005,0.01", "--beta", "0.01,0.1",
            "--zeta", "0.01,0.05", "--seeds", "20", "--steps", "200", "--log-every", "20", "--metrics",
            "rmscbe,rmspbe", "--chunk-size", "4", "--confirm-seeds", "4"]
    out = tmp_path / "dist"
    outs = _two_processes([*args, "--out", str(out)], env)
    assert "12 grid points x 20 seeds" in outs[0] and "confirmed on 4 fresh seeds" in outs[0]
    assert "grid points" not in outs[1] and "confirmed" not in outs[1]  # one report, from process 0
    single = tmp_path / "single"
    p = subprocess.run([BEC_JAX, *args, "--out", str(single)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    a, b = _arrays(single), _arrays(out)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(b[k], a[k], err_msg=k)
    diverged = [r["diverged_fraction"] for r in json.load(open(single / "summary.json"))]
    assert diverged == [1.0] * 4 + [0.0] * 8  # the revert ran: alpha 3 diverged
    assert json.load(open(single / "confirm.json")) == json.load(open(out / "confirm.json"))
    meta = json.load(open(out / "meta.json"))
    assert meta["num_devices"] == 4
    assert sorted(os.listdir(out)) == sorted(os.listdir(single))
    # Malformed coordinates are refused before anything runs (in-process: no process joins anything).
    capsys.readouterr()
    assert cli.main([*args, "--out", str(tmp_path / "x"), "--distributed", "127.0.0.1,2"]) == 2
    assert "distributed: expected 'auto' or HOST:PORT,N,ID" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.long
def test_distributed_study_equals_one_process(tmp_path, cli_env):
    env = xla_flags(cli_env, cpu=True)  # CPU devices and gloo, on a GPU machine too
    (tmp_path / "s.toml").write_text('seeds = 8\nsteps = 100\nlog_every = 20\n[[sweep]]\nenv = "two_state"\n'
                                     'algorithm = "ctd"\nalpha = [0.01, 0.05, 0.1]\nbeta = [0.1]\n'
                                     '[[sweep]]\nenv = "boyan_chain"\nalgorithm = "td"\nalpha = [0.1, 0.5]\n')
    base = ["study", str(tmp_path / "s.toml"), "--confirm-seeds", "3"]
    _two_processes([*base, "--out", str(tmp_path / "d")], env)
    p = subprocess.run([BEC_JAX, *base, "--out", str(tmp_path / "one")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    _same_results(tmp_path / "one", tmp_path / "d", ["two_state-ctd", "boyan_chain-td"])
    for n in ("two_state-ctd", "boyan_chain-td"):
        assert json.load(open(tmp_path / "one" / n / "confirm.json")) == \
            json.load(open(tmp_path / "d" / n / "confirm.json"))
    assert json.load(open(tmp_path / "d" / "study.json"))["status"] == {"two_state-ctd": "done",
                                                                         "boyan_chain-td": "done"}


# ------------------------------------------------------------------ tables and statistics

@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    spec = SweepSpec(env="baird", algorithm="td", alpha=(0.3, 0.001, 0.003), seeds=12, steps=400, log_every=40,
                     metrics=("rmscbe", "rmsve"))
    r = sweep.run(spec)
    out = tmp_path_factory.mktemp("run")
    r.save(str(out))
    return r, out


def test_summary_csv_and_frame_agree_with_json_and_npz(small_run):
    import csv
    r, out = small_run
    recs = json.load(open(out / "summary.json"))
    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert len(rows) == len(recs) == 3
    for rec, row in zip(recs, rows):
        assert list(row) == list(rec)
        for k, v in rec.items():
            assert row[k] == ("" if v is None else str(v)), k   # the same numbers, written by repr
    assert recs[0]["final_mean"] is None and rows[0]["auc"] == ""  # alpha = 0.3 diverges: unbounded
    df = load_frame(str(out))
    assert len(df) == r.num_points * len(r.metrics) * len(r.steps)
    z = _arrays(out)
    for name in r.metrics:
        sub = df[df.metric == name]
        np.testing.assert_array_equal(sub["mean"].to_numpy().reshape(3, -1), z[f"mean_{name}"])
        np.testing.assert_array_equal(sub["std"].to_numpy().reshape(3, -1), z[f"std_{name}"])
        np.testing.assert_array_equal(sub["alive"].to_numpy().reshape(3, -1), z["alive"])
    np.testing.assert_array_equal(df[df.metric == "rmscbe"]["alpha"].to_numpy().reshape(3, -1)[:, 0], z["grid_alpha"])
    np.testing.assert_array_equal(df["step"].to_numpy()[: len(r.steps)], z["steps"])


def test_confidence_intervals_match_scipy_and_per_seed_areas(small_run):
    from scipy import stats
    sample = np.array([0.3, 0.5, 0.2, 0.9, 0.4, 0.45])
    mean, lo, hi = t_interval(sample)
    want = stats.t.interval(0.95, len(sample) - 1, loc=sample.mean(), scale=stats.sem(sample))
    assert mean == pytest.approx(sample.mean()) and lo == pytest.approx(want[0]) and hi == pytest.approx(want[1])
    r, _ = small_run
    i = 1
    f = r.final[0, i]
    want = stats.t.interval(0.95, len(f) - 1, loc=f.mean(), scale=stats.sem(f))
    f_lo, f_hi = r.ci("final")
    assert f_lo[i] == pytest.approx(want[0], rel=1e-5) and f_hi[i] == pytest.approx(want[1], rel=1e-5)
    # A seed's area is its mean over the logged points; their mean is the mean curve's area.
    np.testing.assert_allclose(r.auc_seed[0, i].mean(), r.auc()[i], rtol=1e-5)
    assert np.all(r.auc_seed[0, 0] == np.inf)  # every seed diverged at alpha = 0.3
    rec = r.summary()[i]
    a_lo, a_hi = r.ci("auc")
    assert rec["auc_ci_low"] == pytest.approx(a_lo[i]) and rec["auc_ci_low"] < rec["auc"] < rec["auc_ci_high"]


def test_welch_interval_matches_scipy():
    from scipy import stats as sst

    from bec_jax.stats import welch_interval
    a = np.array([0.3, 0.5, 0.2, 0.9, 0.4, 0.45, np.inf])  # non-finite values are left out
    b = np.array([0.1, 0.35, 0.15, 0.3, 0.25])
    d, lo, hi = welch_interval(a, b)
    want = sst.ttest_ind(a[:-1], b, equal_var=False).confidence_interval(0.95)
    assert d == pytest.approx(a[:-1].mean() - b.mean())
    assert lo == pytest.approx(want.low) and hi == pytest.approx(want.high)
    assert np.isnan(welch_interval([1.0], b)).all()
    assert welch_interval([1.0, 1.0], [0.5, 0.5]) == (0.5, 0.5, 0.5)


def test_confirmation_uses_fresh_disjoint_seeds(small_run, tmp_path):
    from bec_jax.run import runner
    r, _ = small_run
    rep = runner.confirm(r, str(tmp_path), seeds=6)
    assert rep["point"] == r.point(r.best_index())
    assert rep["selection"]["seed_streams"] == [0, 11] and rep["confirmation"]["seed_streams"] == [12, 17]
    again = SweepResult.load(str(tmp_path / "confirm"))
    assert again.spec.seed_offset == 12 and again.num_points == 1
    # The confirmation seeds are the streams after the selection's: a sweep of 18 seeds
    # has the same numbers for its last 6.
    full = sweep.run(r.spec.replace(points=[rep["point"]], seeds=18))
    np.testing.assert_array_equal(full.final[:, 0, 12:], again.final[:, 0])
    np.testing.assert_array_equal(full.final[:, 0, :12], r.final[:, r.best_index()])
    assert json.load(open(tmp_path / "confirm.json"))["confirmation"]["seeds"] == 6
    c_lo, c_hi = again.ci("final")
    assert rep["confirmation"]["final"] == pytest.approx(float(again.mean[0, 0, -1]))
    assert rep["confirmation"]["final_ci95"] == pytest.approx([float(c_lo[0]), float(c_hi[0])])
    line = runner.confirm_line(rep, "D")
    assert line.startswith("confirmed on 6 fresh seeds (streams 12-17): final rmscbe ")
    assert f"{rep['confirmation']['final']:.4g} [{c_lo[0]:.4g}, {c_hi[0]:.4g}]" in line
    # The table carries the confirmation where it re-ran the row's setting and metric.
    from bec_jax.prediction.plotting import summary_rows
    row, = summary_rows({"x": r}, None, {"x": rep})
    assert row["confirm_seeds"] == 6 and row["confirm_final"] == rep["confirmation"]["final"]
    assert row["confirm_auc_ci_high"] == rep["confirmation"]["auc_ci95"][1]
    other, = summary_rows({"x": r}, "rmsve", {"x": rep})
    assert other["confirm_final"] is None and other["confirm_seeds"] is None


# STUDY's sweeps for the plots, "long" on first's task, seeds, steps and
# logging: the two share one compiled program.
PLOT_STUDY = """
seeds = 20
steps = 400
log_every = 20
metrics = ["rmscbe", "rmspbe"]

[[sweep]]
name = "first"
env = "two_state"
algorithm = "ctd"
alpha = [0.01, 0.05]
beta = [0.1]

[[sweep]]
name = "long"
env = "two_state"
algorithm = "ctdc"
alpha = [0.001, 0.002, 0.005, 0.01]
beta = [0.01, 0.1]
zeta = [0.01, 0.05]

[[sweep]]
env = "random_walk"
algorithm = "tdrc"
alpha = [0.03125]
reg = [0.0, 1.0]
[sweep.env_params]
features = ["tabular", "dependent"]
"""


def test_plot_and_compare_write_their_files(small_run, tmp_path, capsys):
    _, out = small_run
    st = tmp_path / "study"
    (tmp_path / "s.toml").write_text(PLOT_STUDY)
    assert cli.main(["study", str(tmp_path / "s.toml"), "--out", str(st)]) == 0
    assert SweepResult.load(str(st / "long")).meta["shared_program"] == ["ctd", "ctdc"]
    assert cli.main(["plot", str(st)]) == 0
    files = sorted(os.listdir(st / "plots"))
    assert files == ["curves.png", "curves_first.png", "curves_long.png", "curves_random_walk-tdrc.png",
                     "sensitivity_first.png", "sensitivity_long.png", "table.csv", "table.md"]
    # random_walk-tdrc varies no step size (one alpha): no sensitivity panel for it.
    for f in files:
        if f.endswith(".png"):
            assert (st / "plots" / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (st / "plots" / "table.md").read_text()
    for name in ("first", "long", "random_walk-tdrc"):
        best = SweepResult.load(str(st / name))
        rec = best.summary()[best.best_index()]
        assert f"| {name} |" in table and f"{rec['auc']:.4g}" in table
    assert cli.main(["compare", str(out), str(st / "first"), "--labels", "baird,two", "--out",
                     str(tmp_path / "cmp.png")]) == 0
    assert (tmp_path / "cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    df = load_frame(str(st))
    assert set(df["sweep"]) == {"first", "long", "random_walk-tdrc"}
    capsys.readouterr()
    assert cli.main(["plot", str(tmp_path / "nothing")]) == 2
    assert "dirs: " in capsys.readouterr().err


def test_progress_is_the_hosts_and_changes_no_program(capsys):
    """Progress lines come from the host between calls: a run that shows them
    runs the very program (from the process's cache: nothing compiled) a quiet
    run compiled, with the same bits, and writes a line per chunk."""
    spec = SweepSpec(env="two_state", algorithm="ctd", alpha=(0.01, 0.05, 0.1), beta=(0.1,), seeds=6, steps=120,
                     log_every=10)
    one = jax.devices()[:1]
    quiet = sweep.run(spec, progress=False, chunk_size=2, devices=one)
    assert "[bec-jax]" not in capsys.readouterr().err
    shown = sweep.run(spec, progress=True, chunk_size=2, devices=one)
    err = capsys.readouterr().err
    assert "[bec-jax] chunk 1/2" in err and "[bec-jax] chunk 2/2" in err and err.endswith("\n")
    assert shown.meta["compiled_programs"] == 0 < quiet.meta["compiled_programs"]
    for name in ("mean", "std", "sem", "final", "auc_seed", "alive", "diverged_step"):
        np.testing.assert_array_equal(getattr(shown, name), getattr(quiet, name), err_msg=name)


def test_worked_study_file_is_valid():
    from bec_jax.run import study
    st = study.load(os.path.join(REPO, "experiments", "studies", "centering_boyan.toml"))
    assert st.names == ["boyan-td", "boyan-ctd", "boyan-tdc", "boyan-ctdc"]
    assert [s.num_points for _, s in st.sweeps] == [6, 24, 12, 48]
    assert all(s.seeds == 50 and s.steps == 2000 and s.metrics == ("rmscbe", "rmspcbe") for _, s in st.sweeps)


def test_pandas_is_optional(tmp_path):
    code = ("import sys; sys.modules['pandas'] = None\n"
            "import bec_jax, bec_jax.prediction.results as r\n"
            "try:\n    r.import_pandas()\nexcept ImportError as e:\n    print('MSG', e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "MSG pandas is an optional extra of bec_jax: pip install 'bec_jax[pandas]'" in p.stdout


# ------------------------------------------------------------------ packaging

def test_packaging_files():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        pp = tomllib.load(f)
    assert pp["project"]["license"] == "MIT" and pp["project"]["license-files"] == ["LICENSE"]  # SPDX form
    assert open(os.path.join(REPO, "LICENSE")).readline().strip() == "MIT License"
    assert pp["project"]["dynamic"] == ["version"]
    assert pp["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "bec_jax.__version__"}
    from importlib.metadata import version
    assert version("bec_jax") == bec_jax.__version__
    cff = open(os.path.join(REPO, "CITATION.cff")).read()
    assert "preferred-citation:" in cff and 'title: "Bellman Error Centering"' in cff
    assert f"version: {bec_jax.__version__}" in cff
    assert os.path.isfile(os.path.join(os.path.dirname(bec_jax.__file__), "py.typed"))
    assert "py.typed" in pp["tool"]["setuptools"]["package-data"]["bec_jax"]


# Two sweeps on one model that share a program, and one on another model.
TWO_STATE_TD = {"env": "two_state", "algorithm": "td", "alpha": [0.01, 0.1]}
TWO_STATE_CTD = {"env": "two_state", "algorithm": "ctd", "alpha": [0.01], "beta": [0.1, 0.2]}
BOYAN_TD = {"env": "boyan_chain", "algorithm": "td", "alpha": [0.1]}
SHARING = {"seeds": 5, "steps": 60, "log_every": 20}


def test_study_sweeps_that_differ_in_algorithm_share_a_program(tmp_path):
    """A study's sweeps on one model run as one program (`sweep.run_many`), each
    written bit for bit as it would be alone; a chunk size given keeps them apart."""
    from bec_jax.run import runner, study
    st = study.from_dict({**SHARING, "sweep": [TWO_STATE_TD, BOYAN_TD, TWO_STATE_CTD]})
    lines = []
    res = study.run(st, str(tmp_path / "s"), log=lines.append)
    assert res["two_state-td"].meta["shared_program"] == ["td", "ctd"]
    assert "shared_program" not in res["boyan_chain-td"].meta
    assert any(line.startswith("two_state-ctd:") and "in two_state-td's program" in line for line in lines)
    for name, spec in st.sweeps:  # each as run alone into its directory
        runner.run_to_dir(spec, str(tmp_path / "alone" / name))
    _same_results(tmp_path / "s", tmp_path / "alone", st.names)
    assert SweepResult.load(str(tmp_path / "s" / "two_state-ctd")).meta["shared_program"] == ["td", "ctd"]
    # Finished: a resume runs nothing; a chunk size given: each sweep alone.
    lines.clear()
    study.run(st, str(tmp_path / "s"), resume=True, log=lines.append)
    assert all("not run again" in line for line in lines)
    apart = study.run(st, str(tmp_path / "apart"), chunk_size=4, log=lambda *a: None)
    assert all("shared_program" not in r.meta for r in apart.values())


def test_a_signal_during_a_shared_program_keeps_what_it_computed(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from bec_jax.run import runner, study
    # The shared program of the test above (kept compiled in this process).
    st = study.from_dict({**SHARING, "sweep": [TWO_STATE_TD, TWO_STATE_CTD, BOYAN_TD]})
    stop = SimpleNamespace(signum=None)
    real = sweep.run_many

    def signalled(specs, **kw):  # SIGTERM arrives while the shared program runs
        out = real(specs, **kw)
        stop.signum = signal.SIGTERM
        return out
    monkeypatch.setattr(sweep, "run_many", signalled)
    with pytest.raises(runner.Interrupted):
        study.run(st, str(tmp_path / "s"), stop=stop, log=lambda *a: None)
    assert (tmp_path / "s" / "two_state-td" / "curves.npz").exists()
    assert (tmp_path / "s" / "two_state-ctd" / "curves.npz").exists()
    assert not (tmp_path / "s" / "boyan_chain-td" / "curves.npz").exists()
