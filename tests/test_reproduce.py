"""`bec-jax reproduce --quick`: runs the whole pipeline on small grids and checks
what it writes."""
import csv
import json

import numpy as np
import pytest

from bec_jax import envs
from bec_jax.cli.commands import main
from bec_jax.prediction.results import SweepResult
from bec_jax.theory import verdicts


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("repro") / "paper"
    assert main(["reproduce", "--quick", "--out", str(out)]) == 0
    return out


def test_writes_every_figure_as_png_and_pdf(quick):
    for name in ("figure1", "sensitivity_boyan_chain", "sensitivity_two_state", "sensitivity_baird"):
        png = (quick / f"{name}.png").read_bytes()
        pdf = (quick / f"{name}.pdf").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
        assert pdf[:5] == b"%PDF-" and len(pdf) > 5_000


def test_table_matches_the_saved_sweeps(quick):
    rows = list(csv.DictReader(open(quick / "table.csv")))
    assert len(rows) == 12
    assert {(r["env"], r["algorithm"]) for r in rows} == {
        (e, a) for e in ("boyan_chain", "two_state", "baird") for a in ("td", "tdc", "ctd", "ctdc")}
    for r in rows:
        res = SweepResult.load(str(quick / "sweeps" / r["env"] / r["algorithm"]))
        b = res.best_index()
        assert float(r["alpha"]) == res.point(b)["alpha"]
        assert float(r["final_mean"]) == pytest.approx(res.mean[0, b, -1], rel=1e-6)
        assert r["verdict"] in verdicts.LABELS and r["verdict_reason"].startswith("analysis: ")
        # The verdict's analysis is the exact one of the chosen point.
        ex = verdicts.exact_for(envs.make(r["env"]), r["algorithm"], res.point(b))
        assert (r["stable"] == "True") == ex.stable
    md = (quick / "table.md").read_text()
    assert sum(line.startswith("| ") for line in md.splitlines()) == 13  # header + 12 rows


def test_known_facts_show_up(quick):
    rows = {(r["env"], r["algorithm"]): r for r in csv.DictReader(open(quick / "table.csv"))}
    # Every run of an environment starts from the same theta0, so the same error.
    for env, rmscbe0 in (("boyan_chain", 0.9434593), ("two_state", 0.5), ("baird", 3.1493440)):
        for a in ("td", "tdc", "ctd", "ctdc"):
            assert float(rows[(env, a)]["initial_rmscbe"]) == pytest.approx(rmscbe0, rel=1e-5)
    # TD diverges on both counterexamples, even at its best step size: unstable by
    # the analysis, and the run's error grew.
    assert rows[("two_state", "td")]["verdict"] == "diverges"
    assert rows[("baird", "td")]["verdict"] == "diverges"
    # 2-state CTDC is unstable at every constant step size (the determinant argument).
    assert rows[("two_state", "ctdc")]["stable"] == "False"
    assert rows[("two_state", "ctdc")]["verdict"] in ("diverges", "unstable (not yet visible)")


def test_report_states_each_claim_and_the_lemma(quick):
    rep = (quick / "report.md").read_text()
    for claim in ("Off-policy TD diverges", "TDC, CTD and CTDC converge", "On the Boyan chain CTD and CTDC",
                  "Off-policy CTD converges on the 2-state"):
        assert claim in rep
    assert "--quick run" in rep
    meta = json.load(open(quick / "meta.json"))
    assert meta["lemma"]["cases"] == 900 and meta["lemma"]["max_rel_error"] < 1e-12
    assert meta["lemma"]["min_A"] > 0
    assert meta["specs"]["baird"]["ctdc"]["algorithm"] == "ctdc" and meta["quick"] is True
    assert np.isfinite(meta["timing"]["total_s"])
    # The long run of CTDC on the 2-state example is recorded with its outcome.
    assert len(meta["long_run"]["final"]) == 2


# ------------------------------------------------------------------ --paper tdrc

@pytest.fixture(scope="module")
def quick_tdrc(tmp_path_factory):
    out = tmp_path_factory.mktemp("repro") / "tdrc"
    assert main(["reproduce", "--paper", "tdrc", "--quick", "--out", str(out)]) == 0
    return out


@pytest.mark.long
def test_tdrc_reproduction_writes_its_files(quick_tdrc):
    for name in ("tdrc_curves", "tdrc_sensitivity", "tdrc_bars"):
        assert (quick_tdrc / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (quick_tdrc / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
    rows = list(csv.DictReader(open(quick_tdrc / "table.csv")))
    assert {(r["problem"], r["method"]) for r in rows} == {
        (p, m) for p in ("rw_tabular", "rw_inverted", "rw_dependent", "baird")
        for m in ("td", "tdc", "gtd2", "tdrc", "etd", "ctd", "ctdc", "cetd")}
    by = {(r["problem"], r["method"]): r for r in rows}
    # The AUCs are relative to TDRC's, so TDRC's own is 1.
    for p in ("rw_tabular", "rw_inverted", "rw_dependent", "baird"):
        assert float(by[(p, "tdrc")]["relative_auc"]) == pytest.approx(1.0)
    # Every run of a random-walk problem starts at theta = 0: the closed-form RMSPBE there.
    meta = json.load(open(quick_tdrc / "meta.json"))
    assert meta["kind"] == "bec-jax reproduce --paper tdrc" and meta["quick"] is True
    stab = meta["suite_stability"]
    assert stab["full"]["baird"]["td"] == pytest.approx(0.2393, abs=1e-3)   # TD unstable on Baird
    assert stab["full"]["two_state"]["tdrc"] > 0 > stab["full"]["two_state"]["tdc"]
    rep = (quick_tdrc / "report.md").read_text()
    for part in ("Set-up and deviations", "Claims of the paper checked", "Exact stability on the suite",
                 "TDRC on the 2-state counterexample", "The centered fixpoint, tabular"):
        assert part in rep
    # A second run over its own output is allowed; a foreign directory is not.
    assert main(["reproduce", "--paper", "tdrc", "--out", str(quick_tdrc / "table.csv")]) == 2


def test_reproduce_rejects_an_unknown_paper(tmp_path, capsys):
    assert main(["reproduce", "--paper", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "paper: unknown paper 'nope'; known: bec, tdrc" in capsys.readouterr().err


def test_report_gives_the_exact_analysis_of_each_claim(quick):
    rep = (quick / "report.md").read_text()
    # The determinant argument for 2-state CTDC, the rho convention, why Boyan and
    # Baird escape, and Theorem 2's hypotheses next to the claims.
    assert "det(G1) = 0.05 > 0" in rep
    assert "+0.02 with rho on omega" in rep and "-0.034 without" in rep
    assert "constant in the span yes" in rep and "constant in the span no" in rep
    assert "A_c has rank 3 of 4" in rep and "A_c has rank 6 of 8; C has rank 7 of 8" in rep
    assert "stable only for beta/alpha above 0.2 " in rep
    for name in ("ctd_stability", "ctdc_rho", "figure1_rmspcbe", "figure1_fixpoint_distance"):
        assert (quick / f"{name}.png").stat().st_size > 5_000, name
    rows = {(r["env"], r["algorithm"]): r for r in csv.DictReader(open(quick / "table.csv"))}
    assert float(rows[("boyan_chain", "ctd")]["final_rmspcbe"]) > 0
    # One section per claim with its hypotheses, analysis, simulation and one-line verdict.
    for part in ("## 1. Off-policy TD diverges", "**Hypotheses**", "**Exact analysis**", "**Simulation**",
                 "**Verdict:**", "Theorem 2's conditions (i.i.d. samples", "on fresh seeds"):
        assert part in rep, part
    meta = json.load(open(quick / "meta.json"))
    # VRC is CTD and SRC is TD (zero rewards), run for run, on both counterexamples.
    for env in ("two_state", "baird"):
        assert meta["reward_centering"][env]["vrc_equals_ctd"] and meta["reward_centering"][env]["src_equals_td"]
    # The confirmation: fresh seeds differ from the selection's, at the same point.
    c = meta["confirmation"]["boyan_chain"]["ctd"]
    assert c["fresh"]["final_mean"] != c["selection"]["final_mean"]
    lo, hi = c["fresh"]["final_ci"]
    assert lo < c["fresh"]["final_mean"] < hi
    assert float(rows[("boyan_chain", "ctd")]["fresh_final_mean"]) == pytest.approx(c["fresh"]["final_mean"])
    # Under the theorems' conditions 2-state CTD reaches the fixpoint set and CTDC moves away.
    ts = meta["timescale_runs"]["two_state"]
    assert ts["ctd"]["final_distance"] < ts["ctd"]["initial_distance"]
    assert ts["ctdc"]["final_distance"] > ts["ctdc"]["initial_distance"]
