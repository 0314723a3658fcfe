"""`bec-jax reproduce --quick`: runs the whole pipeline on small grids and checks
what it writes."""
import csv
import json

import numpy as np
import pytest

from bec_jax.cli import main
from bec_jax.results import SweepResult


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
        assert r["verdict"] in ("converged", "decreasing", "growing", "diverged")
    md = (quick / "table.md").read_text()
    assert sum(line.startswith("| ") for line in md.splitlines()) == 13  # header + 12 rows


def test_known_facts_show_up(quick):
    rows = {(r["env"], r["algorithm"]): r for r in csv.DictReader(open(quick / "table.csv"))}
    # Every run of an environment starts from the same theta0, so the same error.
    for env, rmscbe0 in (("boyan_chain", 0.9434593), ("two_state", 0.5), ("baird", 3.1493440)):
        for a in ("td", "tdc", "ctd", "ctdc"):
            assert float(rows[(env, a)]["initial_rmscbe"]) == pytest.approx(rmscbe0, rel=1e-5)
    # TD's error grows on both counterexamples, even at its best step size.
    assert rows[("two_state", "td")]["verdict"] == "growing"
    assert rows[("baird", "td")]["verdict"] == "growing"


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
