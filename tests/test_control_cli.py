"""`bec-jax control`, `bec-jax plot` on control runs and `bec-jax reproduce
--paper control --quick`, checked by reading the files they write."""
import json
import os

import numpy as np
import pytest

from bec_jax.cli.commands import main
from bec_jax.control.results import ControlResult

TINY = ["control", "--task", "cliff_walking", "--algorithm", "cgq", "--alpha", "0.1,0.3", "--beta", "0.001",
        "--zeta", "0.005", "--episodes", "40", "--seeds", "3", "--epsilon", "0.05"]


@pytest.fixture(scope="module")
def tiny_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("control") / "run"
    assert main(TINY + ["--out", str(out)]) == 0
    return out


def test_control_writes_results(tiny_out, capsys):
    r = ControlResult.load(str(tiny_out))
    assert r.lengths.shape == (2, 3, 40) and r.valid.all()
    np.testing.assert_allclose(r.grid["alpha"], [0.1, 0.3])
    recs = json.load(open(tiny_out / "summary.json"))
    for rec, lengths in zip(recs, r.lengths):
        assert rec["auc_length"] == pytest.approx(lengths.mean(), rel=1e-9)
        k = 4  # the last 10% of 40 episodes
        assert rec["final_length"] == pytest.approx(lengths[:, -k:].mean(), rel=1e-9)
        assert rec["omega_mean"] is not None and rec["diverged_fraction"] == 0.0
    meta = json.load(open(tiny_out / "meta.json"))
    assert meta["spec"]["kind"] == "control" and meta["logged_steps"] == int(r.lengths.sum())


def test_config_file_gives_the_same_result(tiny_out, tmp_path):
    cfg = tmp_path / "control.toml"
    cfg.write_text('task = "cliff_walking"\nalgorithm = "cgq"\nepisodes = 40\nseeds = 3\nepsilon = 0.05\n'
                   '[hyperparameters]\nalpha = [0.1, 0.3]\nbeta = 0.001\nzeta = 0.005\n')
    out = tmp_path / "from_toml"
    assert main(["control", "--config", str(cfg), "--out", str(out)]) == 0
    np.testing.assert_array_equal(ControlResult.load(str(out)).lengths, ControlResult.load(str(tiny_out)).lengths)


def test_plot_writes_figures(tiny_out, tmp_path):
    out = tmp_path / "plots"
    assert main(["plot", str(tiny_out), "--out", str(out)]) == 0
    assert (out / "curves.png").stat().st_size > 1000 and (out / "sensitivity.png").stat().st_size > 1000


@pytest.mark.parametrize("args,field", [
    (["--task", "nope"], "task"),
    (["--algorithm", "sarsa"], "algorithm"),
    (["--alpha", "-1"], "alpha"),
    (["--episodes", "0"], "episodes"),
    (["--task-param", "bins=3"], "bins"),
    (["--epsilon", "2"], "epsilon"),
])
def test_bad_input_exits_2_naming_the_field(args, field, tmp_path, capsys):
    base = dict(zip(TINY[1::2], TINY[2::2]))
    argv = ["control"]
    given = dict(zip(args[::2], args[1::2]))
    for k, v in {**base, **given}.items():
        argv += [k, v]
    out = tmp_path / "x"
    assert main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bec-jax: error: {field}"), err
    assert not out.exists()


def test_refuses_a_nonempty_out(tiny_out, capsys):
    assert main(TINY + ["--out", str(tiny_out)]) == 2
    assert "--overwrite" in capsys.readouterr().err


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce") / "control"
    assert main(["reproduce", "--paper", "control", "--quick", "--out", str(out)]) == 0
    return out


@pytest.mark.long
def test_reproduce_control_quick_writes_report_table_and_figures(quick):
    for name in ("report.md", "table.md", "table.csv", "control_curves.png", "control_curves_by_step.png",
                 "control_sensitivity.png"):
        assert (quick / name).stat().st_size > 200, name
    meta = json.load(open(quick / "meta.json"))
    assert meta["complete"] and meta["quick"]
    rows = {r["algorithm"]: r for r in meta["table"]}
    assert set(rows) == {"q", "cq", "gq", "cgq", "rcq_simple", "rcq_value"}
    for r in rows.values():
        if "steps_per_episode" in r:
            assert r["steps_per_episode_ci_low"] <= r["steps_per_episode"] <= r["steps_per_episode_ci_high"]
            assert r["steps_per_episode"] >= 13  # the shortest path has 13 steps
    # Value-based reward centering is CQ, run for run.
    assert meta["vrc_equals_cq"] == {"cliff_walking": True}
    if "steps_per_episode" in rows["cq"]:
        assert rows["rcq_value"]["steps_per_episode"] == rows["cq"]["steps_per_episode"]
    report = (quick / "report.md").read_text()
    assert "Quick run" in report and "identical" in report
    # A second reproduce into the same directory is allowed (it wrote it).
    assert os.path.isfile(quick / "meta.json")
