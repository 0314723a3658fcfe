"""`bec-jax reproduce --paper reward-centering --deep`: Naik et al.'s deep
experiments on the continuing front's network learners, the quick form run end
to end at a small size (every task, both learners: six programs), and what it
writes checked; the full form's grids against their configs; its projections
against the FLOP count they are made from."""
import csv
import json

import numpy as np
import pytest

from bec_jax.cli.commands import main
from bec_jax.control.continuing import deep
from bec_jax.control.continuing.csuite import NAIK_PENDULUM
from bec_jax.experiments import reward_centering_deep as rcd

# The quick corner's grid at a small size: 2 runs of 320 steps (10 updates), a ring of 64.
TINY = {"seeds": 2, "steps": 320, "learner_params": {"buffer": 64}}
FIGURES = ("rc_gamma", "rc_offset", "rc_curves")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("repro") / "deep"
    meta = rcd.reproduce(str(out), quick=True, sizes=TINY, log=lambda *a: None)
    return out, meta


@pytest.mark.long
def test_writes_its_files(quick):
    out, meta = quick
    for name in FIGURES:
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("report.md", "table.md", "table.csv", "grid.csv", "meta.json"):
        assert (out / name).stat().st_size > 0
    saved = json.loads((out / "meta.json").read_text())
    assert saved["kind"] == rcd.KIND and saved["complete"] is True and saved["quick"] is True
    assert rcd.is_reproduce_dir(str(out))
    assert saved["timing"]["run_steps"] == sum(s["run_steps"] for s in saved["sweeps"]) == 6 * 12 * 2 * 320
    spec = saved["specs"]["catch"]["cdqn_unbiased"]
    assert spec["learner_params"]["batch"] == "full" and spec["learner_params"]["buffer"] == 64
    assert spec["learner_params"]["target_rbar"] == "old"
    assert spec["task_params"] == {"features": "board"} and spec["epsilon"] == 0.1


@pytest.mark.long
def test_table_holds_the_best_of_each_grid(quick):
    out, _ = quick
    rows = list(csv.DictReader(open(out / "table.csv")))
    grid = list(csv.DictReader(open(out / "grid.csv")))
    assert len(rows) == sum(len(rcd.QUICK[t]["gamma"]) * len(rcd.QUICK[t]["offset"]) for t in rcd.FULL) * 2
    for row in rows:
        same = [g for g in grid if g["task"] == row["task"] and g["algorithm"] == row["learner"]
                and float(g["gamma"]) == float(row["gamma"]) and float(g["reward_offset"]) == float(row["offset"])]
        assert len(same) == len(rcd.QUICK[row["task"]]["alpha"])
        assert float(row["reward_rate_last50"]) == pytest.approx(max(float(g["reward_rate_last50"]) for g in same),
                                                                 rel=1e-9)
        assert (row["rbar_minus_offset"] == "") == (row["learner"] == "dqn")  # DQN keeps no rbar


@pytest.mark.long
def test_report_gives_a_verdict_for_each_claim_and_the_projection(quick):
    out, meta = quick
    rep = (out / "report.md").read_text()
    assert "**Quick run**" in rep
    for claim in ("(i)", "(ii)"):
        for title in ("Catch", "Pendulum", "PuckWorld"):
            assert f"**Verdict {claim}, {title}" in rep
    for name in FIGURES:
        assert f"({name}.png)" in rep
    assert "bec-jax continuing --task catch --task-param features=board --algorithm cdqn_unbiased" in rep
    rate = meta["flops_per_s"]
    assert rate == pytest.approx(sum(s["flops"] for s in meta["sweeps"]) / sum(s["run_time_s"] for s in meta["sweeps"]))
    for row in meta["projections"]:
        spec = rcd.grid_spec(row["task"], row["learner"])
        assert row["flops"] == deep.sweep_flops(spec) and row["points"] == spec.num_points
        assert row["cpu_hours"] == pytest.approx(row["flops"] / rate / 3600)
        assert row["gpu_hours"] == pytest.approx(row["flops"] / rcd.GPU_FLOPS / 3600)


def test_full_grids_are_their_configs():
    catch = rcd.grid_spec("catch", "cdqn_unbiased")
    assert catch.num_points == 7 * 7 * 7 * 5 and catch.seeds == 15 and catch.steps == 80_000
    assert catch.hyperparameters["alpha"] == tuple(2.0 ** -k for k in range(9, 2, -1))
    # What their runs computed: full-batch updates, the target with rbar before the update.
    assert catch.settings == deep.Settings(layers=(50, 128, 3), activation="tanh", buffer=10_000, batch=0,
                                           update_period=32, sync_period=128, optimizer="adam", target_rbar="old")
    assert rcd.grid_spec("catch", "dqn").num_points == 7 * 7 * 5
    pend = rcd.grid_spec("pendulum", "cdqn_unbiased")
    assert pend.settings.layers == (3, 64, 64, 3) and pend.steps == 100_000
    assert {k: pend.task_params[k] for k in NAIK_PENDULUM} == NAIK_PENDULUM
    assert tuple(pend.hyperparameters["reward_offset"]) == (-12.0, -6.0, 0.0, 6.0, 12.0)
    puck = rcd.grid_spec("puckworld", "cdqn_unbiased")
    assert puck.settings.layers == (6, 32, 32, 4) and puck.steps == 400_000 and puck.seeds == 3
    assert puck.hyperparameters["eta"] == (0.003, 0.01, 0.03, 0.1)
    # One update of their Catch CDQN, two FLOPs a multiply-add: the network's pass and its backward over 10,001
    # rows (3 x 6,784 - 6,400 a row: no input gradient for the first layer), and the target's pass over the
    # ring's 10,001 slots at a sync, over the 32 new observations between syncs (3 of every 4 updates).
    net = 2 * 10_001 * (3 * 6784 - 6400)
    assert deep.update_flops(catch.settings, sync=True) == net + 2 * 10_001 * 6784
    assert deep.update_flops(catch.settings, sync=False) == net + 2 * 32 * 6784
    assert deep.update_flops(catch.settings) == net + (2 * 10_001 * 6784 + 3 * 2 * 32 * 6784) / 4
    assert np.isclose(rcd.grid_flops(catch), 1715 * 15 * (2500 * deep.update_flops(catch.settings)
                                                           + 2 * 6784 * 80_000))


def test_deep_goes_with_reward_centering_only(tmp_path, capsys):
    assert main(["reproduce", "--paper", "tdrc", "--deep", "--out", str(tmp_path / "x")]) == 2
    assert "deep: --deep runs the network learners of --paper reward-centering" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
