"""`bec-jax run` on tiny sweeps, checked by reading the files it writes."""
import json
import shutil
import subprocess

import numpy as np
import pytest

from bec_jax.cli.commands import main

TINY = ["run", "--env", "two_state", "--algorithm", "ctd", "--alpha", "0.01,0.005",
        "--beta", "0.1,0.05,0.01", "--steps", "200", "--seeds", "4", "--log-every", "50"]


@pytest.fixture(scope="module")
def tiny_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "sweep"
    assert main(TINY + ["--out", str(out)]) == 0
    return out


def test_run_writes_curves_and_summary(tiny_out):
    with np.load(tiny_out / "curves.npz") as z:
        assert z["steps"].tolist() == [0, 50, 100, 150, 200]
        assert z["mean"].shape == (6, 5) and z["std"].shape == (6, 5)
        np.testing.assert_allclose(z["grid_alpha"], [0.01] * 3 + [0.005] * 3)
        np.testing.assert_allclose(z["grid_beta"], [0.1, 0.05, 0.01] * 2)
        assert "grid_zeta" not in z.files  # CTD has no zeta
        # Every run starts from theta0 = 1: RMSCBE = |theta| * 0.5 on this example.
        np.testing.assert_allclose(z["mean"][:, 0], 0.5, rtol=1e-6)
        mean = z["mean"]
    recs = json.load(open(tiny_out / "summary.json"))
    assert len(recs) == 6
    assert list(recs[0]) == ["env", "algorithm", "alpha", "beta", "final_mean", "final_std", "final_ci_low",
                             "final_ci_high", "auc", "auc_ci_low", "auc_ci_high", "diverged_fraction",
                             "exact_verdict"]
    for r in recs:  # 95% intervals around the means (all 4 seeds alive)
        assert r["final_ci_low"] < r["final_mean"] < r["final_ci_high"]
        assert r["auc_ci_low"] < r["auc"] < r["auc_ci_high"]
    assert recs[0]["env"] == "two_state" and recs[0]["algorithm"] == "ctd"
    for r, row in zip(recs, mean):
        assert r["final_mean"] == pytest.approx(row[-1], rel=1e-6)
        assert r["auc"] == pytest.approx(row.mean(), rel=1e-6)
        assert r["diverged_fraction"] == 0.0
    meta = json.load(open(tiny_out / "meta.json"))
    assert meta["spec"]["algorithm"] == "ctd" and meta["run_time_s"] >= 0


def test_config_file_gives_the_same_result(tiny_out, tmp_path):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text('env = "two_state"\nalgorithm = "ctd"\nalpha = [0.01, 0.005]\n'
                   'beta = [0.1, 0.05, 0.01]\nsteps = 200\nseeds = 4\nlog_every = 50\n')
    out = tmp_path / "from_toml"
    assert main(["run", "--config", str(cfg), "--out", str(out)]) == 0
    with np.load(out / "curves.npz") as a, np.load(tiny_out / "curves.npz") as b:
        np.testing.assert_array_equal(a["mean"], b["mean"])


@pytest.mark.parametrize("args,field", [
    (["--env", "nope"], "env"),
    (["--algorithm", "sarsa"], "algorithm"),
    (["--alpha", "-0.1"], "alpha"),
    (["--alpha", "nan"], "alpha"),
    (["--zeta", "0.1"], "zeta"),
    (["--steps", "0"], "steps"),
    (["--log-every", "1000"], "log_every"),
    (["--sampler", "mcmc"], "sampler"),
    (["--schedule", "cosine"], "schedule"),
    (["--metrics", "rmse"], "metrics"),
])
def test_bad_input_exits_2_with_one_line(args, field, tmp_path, capsys):
    argv = list(TINY)
    for flag, value in zip(args[::2], args[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    out = tmp_path / "never"
    assert main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bec-jax: error: {field}")
    assert not out.exists()


def test_refuses_nonempty_out_dir(tiny_out, capsys):
    assert main(TINY + ["--out", str(tiny_out)]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_bad_toml(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('env = "two_state"\nalgorithm = "td"\nalpha = [0.01]\nlearning_rate = 3\n')
    assert main(["run", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "learning_rate: unknown field" in capsys.readouterr().err
    bad.write_text("env = \n")
    assert main(["run", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_console_script_installed():
    exe = shutil.which("bec-jax")
    assert exe, "the bec-jax entry point is not installed"
    p = subprocess.run([exe, "run", "--env", "nope", "--algorithm", "td", "--alpha", "0.1", "--out", "/tmp/x"],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert "known: baird, boyan_chain, kolter, random_mdp, random_walk" in p.stderr


def test_help_lists_the_registries(capsys):
    """The help names what is registered now, a user's registrations included:
    it is read from the registries, not spelled out."""
    import dataclasses

    from bec_jax.control import algorithms as control_algorithms
    from bec_jax.control import tasks as control_tasks
    from bec_jax.theory import metrics
    try:
        metrics.register_metric("help_metric_test", lambda env: np.ones((1, env.num_features + 1)), "a test")
        control_tasks.register("help_task_test", control_tasks.maze)
        control_algorithms.register(dataclasses.replace(control_algorithms.Q, name="help_alg_test"))
        assert main(["run", "--help"]) == 0
        run_help = " ".join(capsys.readouterr().out.split())
        assert main(["control", "--help"]) == 0
        control_help = " ".join(capsys.readouterr().out.split())
    finally:
        metrics.METRIC_REGISTRY.pop("help_metric_test", None)
        control_tasks.TASKS.pop("help_task_test", None)
        control_algorithms.ALGORITHMS.pop("help_alg_test", None)
    assert "rmscbe (default), rmspcbe," in run_help and "fixpoint_distance, help_metric_test" in run_help
    assert "markov (default) or iid" in run_help and "constant (default) or robbins_monro" in run_help
    assert "boyan_chain (default)" in run_help and "ctd (default)" in run_help
    assert "acrobot, cliff_walking, help_task_test, maze, mountain_car or package.module:function" in control_help
    assert "rcq_value, help_alg_test or package.module:attribute" in control_help


def test_a_closed_pipe_ends_the_command_quietly():
    """`bec-jax list | head -1`: a reader that leaves before the output ends
    gets no traceback on stderr; the exit status is a shell's for SIGPIPE."""
    import os
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)  # the reader has gone: every write raises BrokenPipeError
    try:
        p = subprocess.run([sys.executable, "-m", "bec_jax", "list", "continuing-tasks"], stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    assert p.returncode == 141 and "Traceback" not in p.stderr, p.stderr
