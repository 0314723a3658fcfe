"""Successive halving (bec_jax.engine.search) on the episodic control front
(`bec-jax control --search halving`): rungs end at steps of the runs' step
budget, the last at the runs' ends. A survivor's episodes equal the full
grid's bit for bit (a stopped point's, those finished by its last rung's
end), each rung's choice against its scores recomputed from the full grid,
fewer run-steps than the full grid's, the chosen point the best of the last
rung, the result saved, read back and drawn, the command line's search line,
its confirmation on fresh seeds, and bad input in one line each."""
import numpy as np
import pytest

from bec_jax.control import program, sweep
from bec_jax.control.results import ControlResult
from bec_jax.control.spec import ControlSpec

# 27 points (3 rungs: 27 -> 9 -> 3), 3 seeds, 20 episodes of CliffWalking in a budget of 20,000 steps.
BASE = dict(task="cliff_walking", algorithm="cq", hyperparameters={"alpha": [0.05, 0.3, 1.0], "beta": [1e-4, 0.01, 0.1]},
            epsilon=[0.02, 0.1, 0.3], episodes=20, seeds=3, max_steps=20000)


@pytest.fixture(scope="module")
def both():
    full = sweep.run(ControlSpec(**BASE))
    found = sweep.run(ControlSpec(**BASE, search={"rate": 3}))
    return full, found


def _finished_by(lengths, steps):
    return (lengths > 0) & (np.cumsum(lengths, -1) <= steps)


def test_survivors_equal_the_full_grid_bit_for_bit(both):
    full, found = both
    sched = found.spec.search_schedule()
    K = found.spec.block_steps
    assert sched.points == (27, 9, 3) and found.num_points == full.num_points == 27
    for i in range(full.num_points):
        s = found.stopped_rung[i]
        if s == sched.rungs - 1:
            for k in ("returns", "lengths", "diverged_step", "omega"):
                np.testing.assert_array_equal(getattr(found, k)[i], getattr(full, k)[i])
            continue
        by = _finished_by(full.lengths[i], sched.ends[s] * K)  # the episodes finished by its last rung's end
        np.testing.assert_array_equal(found.returns[i], np.where(by, full.returns[i], np.nan))
        np.testing.assert_array_equal(found.lengths[i], np.where(by, full.lengths[i], 0))
        assert np.isnan(found.omega[i]).all() and not found.valid[i].any()
        d = full.diverged_step[i]
        np.testing.assert_array_equal(found.diverged_step[i], np.where(d <= sched.ends[s] * K, d, -1))
    assert list(np.bincount(found.stopped_rung, minlength=sched.rungs)) == [18, 6, 3]


def test_each_rung_keeps_its_best_and_spends_less(both):
    """Rung r's scores are each running point's mean return per episode over
    the episodes its runs finished by the rung's end step, averaged over seeds
    (recomputed from the full grid's episodes); the best ceil(k / 3) go on,
    ties to the lower index; the chosen point is the best of the last rung on
    its whole runs, and the search computed fewer run-steps than the full grid."""
    full, found = both
    sched = found.spec.search_schedule()
    K = found.spec.block_steps
    running = np.arange(full.num_points)
    for r in range(sched.rungs - 1):
        by = _finished_by(full.lengths, sched.ends[r] * K)
        want = (np.where(by, full.returns, 0).sum(-1) / by.sum(-1)).mean(-1)  # every run finished one by then
        np.testing.assert_allclose(found.rung_scores[running, r], want[running], rtol=1e-5)
        assert np.isnan(np.delete(found.rung_scores[:, r], running)).all()
        order = sorted(running, key=lambda i: (-found.rung_scores[i, r], i))
        running = np.sort(np.asarray(order[:sched.points[r + 1]]))
        np.testing.assert_array_equal(np.flatnonzero(found.stopped_rung > r), running)
    best = found.best_index("return")
    assert best == running[np.argmax(full.auc("return")[running])]
    assert np.isnan(np.delete(found.auc("return"), running)).all()  # a stopped point is never chosen
    # The full grid runs every run until its slowest run's last episode: its run-steps.
    blocks = -(-full.lengths.astype(np.int64).sum(-1) // K)
    full_steps = int(np.where(full.valid, blocks, -(-found.spec.total_steps // K)).max()) * K * 27 * 3
    m = found.meta["search"]
    assert 0 < m["search_run_steps"] < full_steps and m["full_run_steps_at_least"] <= full_steps
    assert m["rung_steps"] == [e * K for e in sched.ends] and m["rung_points"] == [27, 9, 3]


def test_a_search_result_saves_loads_and_draws_its_rungs(both, tmp_path, monkeypatch):
    from bec_jax.control import plotting

    _, found = both
    found.save(str(tmp_path / "s"))
    back = ControlResult.load(str(tmp_path / "s"))
    np.testing.assert_array_equal(back.stopped_rung, found.stopped_rung)
    np.testing.assert_array_equal(back.rung_scores, found.rung_scores)
    np.testing.assert_array_equal(back.returns, found.returns)
    assert back.spec.search == found.spec.search == {"method": "halving", "rate": 3, "rungs": None,
                                                     "min_steps": None, "metric": "return"}
    rows = back.summary()
    assert rows[found.best_index("return")]["auc_return"] is not None
    assert sum(r["auc_return"] is None for r in rows) == 24  # the points stopped early
    fig, ax = plotting.new_figure(1, 1)
    plotting.rungs(ax[0, 0], back)
    assert plotting.save_figure(fig, str(tmp_path), "rungs", formats=("png",))  # it renders
    # `bec-jax plot`'s figures (`plot_results`) include the rungs (rendering skipped: the test above renders one)
    monkeypatch.setattr(plotting, "save_figure", lambda fig, out, name, **kw: [f"{out}/{name}.png"])
    assert "rungs_cq.png" in [p.rsplit("/", 1)[1] for p in plotting.plot_results({"cq": back}, str(tmp_path))]


def test_the_score_ranks_failed_runs_last():
    """A point with a run that finished no episode by the rung's end, or whose
    weights left the bound by then, scores -inf; the length metric is negated."""
    spec = ControlSpec(**{**BASE, "search": {"metric": "length"}})
    K = spec.block_steps
    lengths = np.array([[[3, 4, 0], [5, 0, 0]], [[3, 4, 0], [9 * K, 0, 0]], [[2, 2, 2], [2, 2, 2]]], np.int32)
    logs = {"returns": -lengths.astype(np.float32), "lengths": lengths,
            "diverged_step": np.array([[-1, -1], [-1, -1], [-1, K]], np.int32)}
    s = np.asarray(program.search_score(spec)(logs, np.arange(10) < 1))  # one block of K steps
    assert s[0] == -(3.5 + 5) / 2 and s[1] == -np.inf and s[2] == -np.inf


@pytest.mark.parametrize("changes,field", [
    ({"search": {"rate": 1.5}}, "halving_rate"),
    ({"search": {"rungs": 9}}, "rungs"),
    ({"search": {"rungs": 1}}, "rungs"),
    ({"search": {"min_steps": 0}}, "min_steps"),
    ({"search": {"min_steps": 20001}}, "min_steps"),
    ({"search": {"min_steps": 20000, "rungs": 3}}, "rungs"),
    ({"search": {"method": "bayes"}}, "search"),
    ({"search": {"eta": 3}}, "search.eta"),
    ({"search": {"metric": "auc"}}, "search.metric"),
    ({"search": {}, "hyperparameters": {"alpha": [0.1], "beta": [0.01]}, "epsilon": 0.1}, "search"),
    ({"search": {}, "task_axes": {"max_episode_steps": [500, 1000]}}, "search"),
])
def test_bad_searches_one_line_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"^{field}: ") as e:
        ControlSpec(**{**BASE, **changes})
    assert "\n" not in str(e.value)


def test_what_a_search_cannot_do_is_refused():
    spec = ControlSpec(**BASE, search={})
    assert sweep.joint_key(spec, sweep.jax.devices()) is None  # a search's program runs alone
    with pytest.raises(ValueError, match="^search: "):
        sweep.final_states(spec)


def test_command_line_search_its_line_confirmation_and_refusals(both, tmp_path, capsys):
    """`bec-jax control ... --search halving` runs the search (the program of
    `both`), prints its line, confirms the chosen point on fresh seeds, and
    refuses what a search cannot do in one line, writing nothing."""
    import json

    from bec_jax.cli.commands import main

    _, found = both
    args = ["control", "--task", "cliff_walking", "--algorithm", "cq", "--alpha", "0.05,0.3,1", "--beta",
            "0.0001,0.01,0.1", "--epsilon", "0.02,0.1,0.3", "--episodes", "20", "--seeds", "3", "--max-steps", "20000"]
    out = tmp_path / "s"
    assert main(args + ["--search", "halving", "--out", str(out), "--confirm-seeds", "2"]) == 0
    text = capsys.readouterr().out
    m = found.meta["search"]
    assert (f"successive halving at rate 3 by return per episode: 3 rungs ending at steps "
            f"{m['rung_steps'][0]:,}, {m['rung_steps'][1]:,} and the runs' ends (at most 20,000) with 27 -> 9 -> 3 "
            f"points; {m['search_run_steps']:,} run-steps, at most") in text
    back = ControlResult.load(str(out))
    np.testing.assert_array_equal(back.returns, found.returns)
    conf = json.loads((out / "confirm.json").read_text())
    assert conf["point"] == found.point(found.best_index("return")) and conf["confirmation"]["seed_streams"] == [3, 4]
    for extra, field in ((["--halving-rate", "3"], "halving_rate"), (["--search", "halving", "--halving-rate", "1"],
                         "halving_rate"), (["--search", "halving", "--chunks", "1/2"], "chunks"),
                         (["--search", "halving", "--rungs", "50"], "rungs"),
                         (["--search", "halving", "--min-steps", "0"], "min_steps")):
        bad = tmp_path / "bad"
        assert main(args + extra + ["--out", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"bec-jax: error: {field}: ") and "\n" not in err, err
        assert not bad.exists()
