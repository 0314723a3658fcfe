"""`bec-jax reproduce --paper reward-centering --quick`: Naik et al.'s reward
centering on the continuing front, run end to end on a corner of each grid
through the command line, and what it writes checked. The claims themselves are
statistical and the quick runs short, so only what holds exactly is asserted:
value-based centering is CQ bit for bit, its conserved quantity, the exact
gains, and the tables agree with the grids they summarise."""
import csv
import json

import numpy as np
import pytest

from bec_jax.cli.commands import main
from bec_jax.control.continuing import exact
from bec_jax.control.continuing.tabular import access_control
from bec_jax.experiments import reward_centering as rc

FIGURES = ("rc_gamma", "rc_offset", "rc_estimate", "rc_curves")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("repro") / "reward_centering"
    assert main(["reproduce", "--paper", "reward-centering", "--quick", "--out", str(out)]) == 0
    return out


@pytest.mark.long
def test_writes_its_files(quick):
    for name in FIGURES:
        assert (quick / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (quick / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
    for name in ("report.md", "table.md", "table.csv", "grid.csv", "meta.json"):
        assert (quick / name).stat().st_size > 0
    meta = json.loads((quick / "meta.json").read_text())
    assert meta["kind"] == rc.KIND and meta["complete"] is True and meta["quick"] is True
    assert rc.is_reproduce_dir(str(quick))
    assert meta["timing"]["run_steps"] == sum(s["run_steps"] for s in meta["sweeps"])
    assert meta["specs"]["access_control"]["q_vrc"]["epsilon"] == 0.1


@pytest.mark.long
def test_value_based_centering_is_cq_bit_for_bit(quick):
    meta = json.loads((quick / "meta.json").read_text())
    for task in rc.TASKS:
        ident = meta["identity"][task]
        assert ident["identical"] is True and meta["verdicts"]["identity"][task] is True
        assert set(ident["max_abs_diff"].values()) == {0.0}
        assert ident["points"] == 16 and ident["runs"] == 16 * rc.IDENTITY_QUICK["seeds"]
        # rbar - eta sum Q is conserved: zero up to float32 rounding.
        assert meta["invariant"][task]["relative"] < 1e-4 and meta["invariant"][task]["max_abs_small"] < 1e-3
    rep = (quick / "report.md").read_text()
    assert "**Verdict (iv), Access-Control: holds, bit for bit (max difference 0).**" in rep


@pytest.mark.long
def test_exact_references(quick):
    refs = json.loads((quick / "meta.json").read_text())["references"]
    assert refs["two_choice"] == {"gain": pytest.approx(0.4), "eps_greedy_gain": pytest.approx(0.39)}
    g = exact.optimal(*access_control().model()).gain
    assert refs["access_control"]["gain"] == pytest.approx(g, rel=1e-12)
    assert refs["access_control"]["eps_greedy_gain"] < g
    # Value-based centering's fixed point: the optimal gain at gamma 1, below it under an offset at gamma < 1.
    assert rc.vrc_limit("two_choice", 1.0, 0.5, 4.0) == pytest.approx(0.4)
    assert rc.vrc_limit("two_choice", 0.99, 0.125, 0.0) == pytest.approx(0.3899, abs=1e-4)
    for row in (r for r in csv.DictReader(open(quick / "table.csv"))):
        assert float(row["optimal_gain"]) == pytest.approx(refs[row["task"]]["gain"])


@pytest.mark.long
def test_table_holds_the_best_of_each_grid(quick):
    rows = list(csv.DictReader(open(quick / "table.csv")))
    grid = list(csv.DictReader(open(quick / "grid.csv")))
    n = sum(len(rc.QUICK[t]["gamma"]) * len(rc.QUICK[t]["offset"]) for t in rc.TASKS) * len(rc.LEARNERS)
    assert len(rows) == n
    for row in rows:
        same = [g for g in grid if g["task"] == row["task"] and g["algorithm"] == row["learner"]
                and float(g["gamma"]) == float(row["gamma"]) and float(g["reward_offset"]) == float(row["offset"])]
        assert len(same) == len(rc.QUICK[row["task"]]["alpha"]) * (1 if row["learner"] == "q" else 2)
        best = max(float(g["reward_rate_last50"]) for g in same)
        assert float(row["reward_rate_last50"]) == pytest.approx(best, rel=1e-9)
        lo, hi = float(row["reward_rate_last50_ci_low"]), float(row["reward_rate_last50_ci_high"])
        assert lo <= float(row["reward_rate_last50"]) <= hi
        assert (row["rbar_minus_offset"] == "") == (row["learner"] == "q")


@pytest.mark.long
def test_report_gives_a_verdict_for_each_claim(quick):
    rep = (quick / "report.md").read_text()
    assert "**Quick run**" in rep
    for claim in ("(i)", "(ii)", "(iii)", "(iv)"):
        for title in ("Access-Control", "TwoChoice"):
            assert f"**Verdict {claim}, {title}" in rep
    for name in FIGURES:
        assert f"({name}.png)" in rep
    # TwoChoice's value-based estimate at gamma 1 settles on the optimal gain 0.4.
    est = json.loads((quick / "meta.json").read_text())["claims"]["estimate"]["two_choice"]["rows"]
    at1 = [r for r in est if r["learner"] == "q_vrc" and r["gamma"] == 1.0]
    assert at1 and all(abs(r["estimate"][0] - 0.4) < 0.02 for r in at1)


def test_specs_are_the_papers_grids():
    ac = rc.grid_spec("access_control", "q_vrc")
    assert ac.num_points == 8 * 5 * 7 * 5 and ac.seeds == 50 and ac.steps == 50_000
    assert ac.hyperparameters["alpha"] == tuple(2.0 ** -k for k in range(7, -1, -1))
    assert rc.grid_spec("access_control", "q").num_points == 8 * 7 * 5
    tc = rc.grid_spec("two_choice", "q_src")
    assert tc.num_points == 8 * 7 * 7 * 3 and tc.seeds == 30 and tc.steps == 10_000 and tc.block_steps == 8
    # Catch and Pendulum: full form only, tile-coded, Naik et al.'s (alpha, eta) as (alpha / n, n eta).
    assert rc.default_tasks(True) == tuple(rc.TASKS)
    assert rc.default_tasks(False) == (*rc.TASKS, "catch", "pendulum")
    for task, n, offsets in (("catch", 16, (-4.0, 0.0, 4.0)), ("pendulum", 8, (-12.0, 0.0, 12.0))):
        sp = rc.grid_spec(task, "q_vrc")
        assert sp.num_points == 4 * 3 * 3 * 3 and sp.epsilon == 0.1
        assert tuple(sp.hyperparameters["reward_offset"]) == offsets
        assert sp.make_task().num_active == n == rc.TILED[task]["tilings"]
        assert sp.hyperparameters["alpha"][0] == rc.TILED[task]["paper_alpha"][0] / n
        assert sp.hyperparameters["eta"][0] == rc.TILED[task]["paper_eta"][0] * n
        assert rc.references(task) == {"gain": None, "eps_greedy_gain": None}
    vrc, cq = rc.identity_specs("access_control")
    betas = np.asarray(cq.hyperparameters["beta"])
    for a in vrc.hyperparameters["alpha"]:
        for e in vrc.hyperparameters["eta"]:
            assert np.float32(e) * np.float32(a) in betas.astype(np.float32)


def test_unknown_paper_lists_reward_centering(tmp_path, capsys):
    assert main(["reproduce", "--paper", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "known: bec, tdrc, control, reward-centering" in capsys.readouterr().err
