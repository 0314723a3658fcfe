"""Successive halving (bec_jax.engine.search) on the prediction front
(`bec-jax run --search halving`): every point's statistics equal the full
grid's bit for bit up to its last rung (the survivors' to the end, their
finals too), each rung's ranking against the areas recomputed from the full
grid, the chosen point the full grid's best for fewer run-steps, the result
saved and read back, the command line's line, confirmation and refusals, and
bad input one line each. One full grid and one search, compiled once each
(the command line runs the search's program again)."""
import json
import re
import warnings

import numpy as np
import pytest

from bec_jax.engine import memory
from bec_jax.prediction import prune, results, sweep
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import SweepSpec

# 18 points; alpha = 30 diverges within the first rung (3 log blocks): +inf, ranked last.
GRID = {"alpha": [0.01, 0.03, 0.1, 0.3, 1.0, 30.0], "beta": [0.01, 0.1, 0.5]}
BASE = dict(env="boyan_chain", algorithm="ctd", hyperparameters=GRID, seeds=3, steps=300, log_every=10)
SEARCH = {"rungs": 3}  # ends at 30, 100, 300 steps with 18 -> 6 -> 2 points


@pytest.fixture(autouse=True)
def _no_exact_verdicts(monkeypatch):
    """The summary's exact verdicts (seconds for 18 points, and not the
    search's) left out of the saved results here."""
    monkeypatch.setattr(results, "exact_verdict_requests", lambda spec: [])
    monkeypatch.setattr(SweepResult, "exact_verdicts",
                        lambda self, indices=None: [None] * (self.num_points if indices is None else len(indices)))


@pytest.fixture(scope="module")
def both():
    full = sweep.run(SweepSpec(**BASE))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "non-finite values" warning for the points that stopped
        found = sweep.run(SweepSpec(**BASE, search=SEARCH))
    return full, found


def test_every_point_equals_the_full_grid_up_to_its_last_rung(both):
    full, found = both
    sched = found.spec.search_schedule()
    assert sched.ends == (3, 10, 30) and sched.points == (18, 6, 2)
    assert list(np.bincount(found.stopped_rung, minlength=3)) == [12, 4, 2]
    for i in range(full.num_points):
        e = sched.ends[found.stopped_rung[i]] + 1  # log points 0 .. the rung's last block
        for k in ("mean", "std", "sem"):
            np.testing.assert_array_equal(getattr(found, k)[:, i, :e], getattr(full, k)[:, i, :e])
            assert np.isnan(getattr(found, k)[:, i, e:]).all()
        np.testing.assert_array_equal(found.alive[i, :e], full.alive[i, :e])
        assert (found.alive[i, e:] == -1).all()
        d = full.diverged_step[i]  # a divergence after the point stopped was not seen
        np.testing.assert_array_equal(found.diverged_step[i], np.where(d <= (e - 1) * 10, d, -1))
        if found.stopped_rung[i] == 2:
            np.testing.assert_array_equal(found.final[:, i], full.final[:, i])
            np.testing.assert_array_equal(found.auc_seed[:, i], full.auc_seed[:, i])
        else:
            finite = found.diverged_step[i] < 0
            assert np.isnan(found.final[:, i][:, finite]).all() and np.isinf(found.final[:, i][:, ~finite]).all()
    assert (found.diverged_step[15:] >= 0).all() and (found.stopped_rung[15:] == 0).all()  # alpha = 30: out first


def test_each_rung_keeps_its_best_by_the_area_so_far(both):
    """Rung r's score is each running point's area under its mean curve over
    log points 0 .. ends[r] (recomputed from the full grid; +inf where a seed
    diverged by then); the best ceil(k / 3) go on, ties to the lower index;
    the chosen point is the full grid's best, for fewer run-steps."""
    full, found = both
    sched = found.spec.search_schedule()
    running = np.arange(full.num_points)
    for r in range(sched.rungs - 1):
        e = sched.ends[r]
        dead = ((full.diverged_step >= 0) & (full.diverged_step <= e * 10)).any(1)
        want = np.where(dead, np.inf, full.mean[0, :, :e + 1].astype(np.float64).mean(1))[running]
        np.testing.assert_allclose(found.rung_scores[running, r], want, rtol=1e-5)
        assert np.isnan(np.delete(found.rung_scores[:, r], running)).all()
        order = sorted(running, key=lambda i: (found.rung_scores[i, r], i))
        running = np.sort(np.asarray(order[:sched.points[r + 1]]))
        np.testing.assert_array_equal(np.flatnonzero(found.stopped_rung > r), running)
    assert np.isnan(found.rung_scores[:, -1]).all()  # the last rung chooses by the whole run's area
    assert found.best_index() == full.best_index() == 11 and 11 in running
    m = found.meta["search"]
    assert m["full_run_steps"] == 18 * 3 * 300 == full.meta["updates"]
    assert m["search_run_steps"] == (18 * 3 + 6 * 7 + 2 * 20) * 3 * 10 == found.meta["updates"] < m["full_run_steps"]
    assert m["rung_steps"] == [30, 100, 300] and m["rung_points"] == [18, 6, 2]


def test_a_search_result_saves_and_loads(both, tmp_path):
    _, found = both
    found.save(str(tmp_path / "s"))
    back = SweepResult.load(str(tmp_path / "s"))
    np.testing.assert_array_equal(back.stopped_rung, found.stopped_rung)
    np.testing.assert_array_equal(back.rung_scores, found.rung_scores)
    np.testing.assert_array_equal(back.mean, found.mean)
    np.testing.assert_array_equal(back.alive, found.alive)
    assert back.spec.search == found.spec.search == {"method": "halving", "rate": 3, "rungs": 3, "min_steps": None}
    assert back.best_index() == found.best_index()
    rows = back.summary()
    assert rows[found.best_index()]["final_mean"] is not None
    assert sum(r["final_mean"] is None for r in rows) == int((found.stopped_rung < 2).sum())
    sub = back.subset(back.select(beta=0.5))
    np.testing.assert_array_equal(sub.stopped_rung, found.stopped_rung[2::3])
    assert "search" not in SweepSpec(**BASE).to_dict()  # a full sweep's saved spec is as before


def test_rungs_figure_and_line(both, tmp_path):
    from bec_jax.prediction import plotting

    _, found = both
    fig, axes = plotting.new_figure()
    plotting.rungs(axes[0, 0], found)
    lines = axes[0, 0].get_lines()  # a line a point, then the chosen point's star
    assert len(lines) == 19 and lines[-1].get_label() == "chosen: \u03b1=0.3, \u03b2=0.5"
    np.testing.assert_array_equal(lines[-1].get_ydata(), [found.auc()[11]])
    assert plotting.search_line(found) == (
        "successive halving at rate 3: 3 rungs ending at steps 30, 100, 300 with 18 -> 6 -> 2 points; "
        "4,080 run-steps, 0.252x the full grid's 16,200")


@pytest.mark.parametrize("search_,field", [
    ({"rate": 1.5}, "halving_rate"),
    ({"rate": 1}, "halving_rate"),
    ({"rungs": 9}, "rungs"),
    ({"rungs": 1}, "rungs"),
    ({"min_steps": 0}, "min_steps"),
    ({"min_steps": 301}, "min_steps"),
    ({"min_steps": 300, "rungs": 3}, "rungs"),
    ({"method": "bayes"}, "search"),
    ({"eta": 3}, "search.eta"),
    ("halving", "search"),
])
def test_bad_searches_one_line_naming_the_field(search_, field):
    with pytest.raises(ValueError, match=rf"^{field}: ") as e:
        SweepSpec(**BASE, search=search_)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("changes", [
    {"hyperparameters": {"alpha": [0.1], "beta": [0.1]}},  # one point
    {"env": "random_mdp", "env_params": {"states": 10, "features": [3, 5]}, "algorithm": "td",
     "hyperparameters": {"alpha": [0.1]}},
])
def test_grids_a_search_cannot_rank_one_line(changes):
    """A one-point grid, and a grid whose points need two programs (feature
    counts differ): `search: ...`."""
    with pytest.raises(ValueError, match=r"^search: ") as e:
        SweepSpec(**{**BASE, **changes}, search={})
    assert "\n" not in str(e.value)


def test_search_plans_one_call_alone_and_prunes_first():
    """A search is one unpadded chunk on one device with no time segments,
    never in a joint program; a budget it does not fit is one line; --prune
    theory prunes first and the search ranks the points left."""
    spec = SweepSpec(**{**BASE, "steps": 3000}, search=SEARCH)
    pl = sweep.plan_memory(spec, 2)
    assert (pl.grid, pl.seeds, pl.blocks) == (18, 3, 300)
    groups, chunks = sweep.plan(spec, 1)
    assert len(chunks) == 1 and list(chunks[0].indices) == list(range(18))
    with pytest.raises(memory.TooLarge, match=r"^memory_budget: a search runs every grid point") as e:
        sweep.plan_memory(spec, 1, memory_budget=100_000)
    assert "\n" not in str(e.value)
    assert sweep.shared_programs([SweepSpec(**BASE, search=SEARCH), SweepSpec(**{**BASE, "algorithm": "td",
                                  "hyperparameters": {"alpha": GRID["alpha"]}}, search={})]) == [[0], [1]]
    two = SweepSpec(env="two_state", algorithm="td", alpha=[0.01, 0.1, 1.0, 4.0, 8.0], steps=1000, seeds=2,
                    search={})
    kept = prune.prune(two).spec
    assert kept.num_points == 3 and kept.search == two.search and kept.search_schedule().points == (3, 1)


def test_command_line_search_confirm_and_refusals(both, tmp_path, capsys):
    """`bec-jax run ... --search halving` runs the search (the program of
    `both`), prints its line, confirms the chosen point on fresh seeds, and
    refuses in one line what a search cannot do, writing nothing."""
    from bec_jax.cli.commands import main

    full, found = both
    args = ["run", "--env", "boyan_chain", "--algorithm", "ctd", "--alpha", "0.01,0.03,0.1,0.3,1,30",
            "--beta", "0.01,0.1,0.5", "--seeds", "3", "--steps", "300", "--log-every", "10"]
    out = tmp_path / "s"
    assert main(args + ["--search", "halving", "--rungs", "3", "--out", str(out), "--confirm-seeds", "2"]) == 0
    text = capsys.readouterr().out
    assert "3 rungs ending at steps 30, 100, 300 with 18 -> 6 -> 2 points; 4,080 run-steps, 0.252x" in text
    assert "best by AUC: {'alpha': 0.3, 'beta': 0.5}" in text
    back = SweepResult.load(str(out))
    np.testing.assert_array_equal(back.mean, found.mean)
    with open(out / "confirm.json") as f:
        conf = json.load(f)
    assert conf["point"] == found.point(found.best_index()) and conf["confirmation"]["seed_streams"] == [3, 4]
    for extra, field in ((["--halving-rate", "3"], "halving_rate"),
                         (["--search", "halving", "--halving-rate", "1"], "halving_rate"),
                         (["--search", "halving", "--chunks", "1/2"], "chunks"),
                         (["--search", "halving", "--rungs", "50"], "rungs"),
                         (["--search", "halving", "--min-steps", "0"], "min_steps")):
        bad = tmp_path / "bad"
        assert main(args + extra + ["--out", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"bec-jax: error: {field}: ") and "\n" not in err, err
        assert not bad.exists()


def test_a_study_searches_each_sweep(both, tmp_path, capsys):
    """`bec-jax study FILE --search halving` gives every sweep the search (a
    sweep's own table wins): its result is the lone search's bit for bit, its
    line says what it spent; --chunks, --submit, --search on a resume and a
    one-point sweep are refused in one line, writing nothing."""
    from bec_jax.cli.commands import main

    _, found = both
    toml = tmp_path / "s.toml"
    toml.write_text('seeds = 3\nsteps = 300\nlog_every = 10\n\n[[sweep]]\nname = "ctd"\nenv = "boyan_chain"\n'
                    'algorithm = "ctd"\nalpha = [0.01, 0.03, 0.1, 0.3, 1.0, 30.0]\nbeta = [0.01, 0.1, 0.5]\n')
    out = tmp_path / "st"
    assert main(["study", str(toml), "--out", str(out), "--search", "halving", "--rungs", "3"]) == 0
    text = capsys.readouterr().out
    assert "ctd: boyan_chain / ctd, 18 points x 3 seeds x 300 steps in " in text
    assert "; successive halving at rate 3: 3 rungs ending at steps 30, 100, 300 with 18 -> 6 -> 2 points; " in text
    back = SweepResult.load(str(out / "ctd"))
    for k in ("mean", "std", "final", "alive", "stopped_rung", "rung_scores"):
        np.testing.assert_array_equal(getattr(back, k), getattr(found, k), err_msg=k)
    one = tmp_path / "one.toml"
    one.write_text(toml.read_text().replace("alpha = [0.01, 0.03, 0.1, 0.3, 1.0, 30.0]\nbeta = [0.01, 0.1, 0.5]",
                                            "alpha = [0.1]\nbeta = [0.1]"))
    for argv, field in (([str(toml), "--search", "halving", "--chunks", "1/2"], "chunks"),
                        ([str(toml), "--search", "halving", "--submit", "slurm", "--parts", "2"], "submit"),
                        (["--resume", "--search", "halving"], "search"),
                        ([str(one), "--search", "halving"], r"sweep\[0\] \(ctd\): search")):
        bad = tmp_path / "bad"
        assert main(["study", *argv, "--out", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert re.match(rf"bec-jax: error: {field}: ", err) and "\n" not in err, err
        assert not bad.exists()
