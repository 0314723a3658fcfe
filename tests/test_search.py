"""Successive halving inside one compiled program (bec_jax.engine.search) on
the continuing front: the schedule by hand, a survivor's curves equal to the
full grid's bit for bit (and every stopped point's prefix), the choice each
rung made against its scores, the result saved and read back, bad input one
line each."""
import numpy as np
import pytest

from bec_jax.control.continuing import sweep
from bec_jax.control.continuing.results import ContinuingResult
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.engine import search

BASE = dict(task="access_control", algorithm="q_vrc",
            hyperparameters={"alpha": [2 ** -5, 2 ** -3, 2 ** -1], "eta": [2 ** -6, 2 ** -2, 1.0]},
            gamma=[0.9, 1.0], reward_offset=[0.0, 8.0], seeds=3, steps=2000)


@pytest.fixture(scope="module")
def both():
    full = sweep.run(ContinuingSpec(**BASE))
    found = sweep.run(ContinuingSpec(**BASE, search={"rate": 3}))
    return full, found


def test_schedule_by_hand():
    s = search.schedule(36, 100, rate=3)
    # 36 points: 36 -> 12 -> 4 (at least 3 left for the last rung), ends 100 / 9, / 3, 100 blocks.
    assert s.points == (36, 12, 4) and s.ends == (11, 33, 100)
    assert s.run_blocks(5) == 5 * (36 * 11 + 12 * 22 + 4 * 67)
    assert search.schedule(36, 100, rate=3, rungs=4).ends == (4, 11, 33, 100)
    assert search.schedule(36, 100, rate=3, min_blocks=20).ends == (33, 100)  # fewer rungs for a longer first
    assert search.schedule(9, 12, unit=4, rate=3).ends == (4, 12)  # rung ends on whole units
    # Access-Control's grid: at most 4 rungs by default, the first at 1/27 of the run (4 of 100 blocks).
    s = search.schedule(1680, 100, rate=3)
    assert s.points == (1680, 560, 187, 63) and s.ends == (4, 11, 33, 100)
    assert search.schedule(1680, 100, rate=3, rungs=5).points == (1680, 560, 187, 63, 21)


def test_survivors_equal_the_full_grid_bit_for_bit(both):
    full, found = both
    sched = found.spec.search_schedule()
    assert found.num_points == full.num_points == 36
    for i in range(full.num_points):
        e = sched.ends[found.stopped_rung[i]]
        for k in ("reward", "rate_estimate", "max_abs_w"):
            np.testing.assert_array_equal(getattr(found, k)[i, :, :e], getattr(full, k)[i, :, :e])
            assert np.isnan(getattr(found, k)[i, :, e:]).all()
        same = found.stopped_rung[i] == sched.rungs - 1
        assert np.array_equal(found.q_table[i], full.q_table[i]) if same else np.isnan(found.q_table[i]).all()
    assert list(np.bincount(found.stopped_rung, minlength=sched.rungs)) == [
        a - b for a, b in zip(sched.points, sched.points[1:] + (0,))]


def test_each_rung_keeps_its_best_by_the_reward_rate_so_far(both):
    """Rung r's scores are each running point's reward rate over its first
    ends[r] blocks, averaged over seeds (recomputed here from the full grid's
    logs); the points that go on are the best ceil(k / 3), ties to the lower
    index; the chosen point is the best survivor on the whole run."""
    full, found = both
    sched = found.spec.search_schedule()
    running = np.arange(full.num_points)
    for r in range(sched.rungs - 1):
        e = sched.ends[r]
        want = full.reward[running, :, :e].astype(np.float64).mean((1, 2))  # the blocks' mean reward per step
        np.testing.assert_allclose(found.rung_scores[running, r], want, rtol=1e-5)
        assert np.isnan(np.delete(found.rung_scores[:, r], running)).all()
        order = sorted(running, key=lambda i: (-found.rung_scores[i, r], i))
        running = np.sort(np.asarray(order[:sched.points[r + 1]]))
        np.testing.assert_array_equal(np.flatnonzero(found.stopped_rung > r), running)
    assert found.best_index() in running
    assert found.best_index() == running[np.argmax(full.reward_rate("all")[running].mean(-1))]
    m = found.meta["search"]
    assert m["search_run_steps"] == sched.run_blocks(3) * found.block_steps == found.meta["run_steps"]
    # 36 x 11 + 12 x 22 + 4 x 67 run-blocks of 3 seeds x 20 steps: 0.26 of the full grid's 36 x 100.
    assert m["full_run_steps"] == 36 * 3 * 2000 and m["search_run_steps"] == (36 * 11 + 12 * 22 + 4 * 67) * 3 * 20


def test_a_search_result_saves_and_loads(both, tmp_path):
    _, found = both
    found.save(str(tmp_path / "s"))
    back = ContinuingResult.load(str(tmp_path / "s"))
    np.testing.assert_array_equal(back.stopped_rung, found.stopped_rung)
    np.testing.assert_array_equal(back.rung_scores, found.rung_scores)
    assert back.spec.search == found.spec.search == {"method": "halving", "rate": 3, "rungs": None, "min_steps": None}
    rows = back.summary()
    assert rows[found.best_index()]["reward_rate_all"] is not None
    assert sum(r["reward_rate_last10"] is None for r in rows) == int((found.stopped_rung < found.stopped_rung.max()).sum())


@pytest.mark.parametrize("changes,field", [
    ({"search": {"rate": 1.5}}, "halving_rate"),
    ({"search": {"rungs": 9}}, "rungs"),
    ({"search": {"rungs": 1}}, "rungs"),
    ({"search": {"min_steps": 0}}, "min_steps"),
    ({"search": {"min_steps": 2000, "rungs": 3}}, "rungs"),
    ({"search": {"method": "bayes"}}, "search"),
    ({"search": {"eta": 3}}, "search.eta"),
    ({"search": {}, "hyperparameters": {"alpha": [0.1], "eta": [0.1]}, "gamma": 0.9, "reward_offset": 0.0}, "search"),
    ({"search": {}, "task_params": {"free_probability": [0.05, 0.06]}}, "search"),
])
def test_bad_searches_one_line_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"^{field}: ") as e:
        ContinuingSpec(**{**BASE, **changes})
    assert "\n" not in str(e.value)


def test_command_line_search_its_line_and_refusals(both, tmp_path, capsys):
    """`bec-jax continuing ... --search halving` runs the search (the program
    of `both`), prints its rungs and spent run-steps, and refuses what a search
    cannot do in one line, writing nothing."""
    from bec_jax.cli.commands import main

    full, found = both
    args = ["continuing", "--task", "access_control", "--algorithm", "q_vrc", "--alpha", "0.03125,0.125,0.5",
            "--eta", "0.015625,0.25,1", "--gamma", "0.9,1", "--offset", "0,8", "--seeds", "3", "--steps", "2000"]
    out = tmp_path / "s"
    assert main(args + ["--search", "halving", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    m = found.meta["search"]
    assert (f"3 rungs ending at steps 220, 660, 2,000 with 36 -> 12 -> 4 points; {m['search_run_steps']:,} run-steps, "
            f"{m['search_run_steps'] / m['full_run_steps']:.3f}x the full grid's 216,000") in text
    back = ContinuingResult.load(str(out))
    np.testing.assert_array_equal(back.reward, found.reward)
    for extra, field in ((["--halving-rate", "3"], "halving_rate"), (["--search", "halving", "--halving-rate", "1"],
                         "halving_rate"), (["--search", "halving", "--chunks", "1/2"], "chunks"),
                         (["--search", "halving", "--rungs", "50"], "rungs")):
        bad = tmp_path / "bad"
        assert main(args + extra + ["--out", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"bec-jax: error: {field}: ") and "\n" not in err, err
        assert not bad.exists()
