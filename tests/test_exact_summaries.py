"""A run's summary, the plot and study tables and the run's summary line carry
each grid point's exact mean-square verdict, which agrees with the analysis
done directly and with what the runs did."""
import json

import numpy as np
import pytest

from bec_jax import envs
from bec_jax.cli import commands as cli
from bec_jax.prediction import plotting, sweep
from bec_jax.prediction.spec import SweepSpec
from bec_jax.theory import verdicts


@pytest.fixture(scope="module")
def baird_ctd():
    """CTD on Baird at a step size stable in mean square and at one where the
    mean converges but the second moment grows (every seed diverges)."""
    spec = SweepSpec(env="baird", algorithm="ctd", hyperparameters={"alpha": [0.01, 0.1], "beta": [0.1]},
                     seeds=4, steps=3000, log_every=100)
    return sweep.run(spec, progress=False)


def test_summary_carries_each_points_exact_verdict(baird_ctd, tmp_path):
    r = baird_ctd
    recs = r.summary()
    got = {rec["alpha"]: rec["exact_verdict"] for rec in recs}
    assert got == {0.01: "stable in mean square", 0.1: "mean stable, variance grows"}
    # the same as the analysis done directly, and as what the runs did
    env = envs.make("baird")
    for rec in recs:
        direct = verdicts.mean_square_for(env, "ctd", {"alpha": rec["alpha"], "beta": 0.1}, "markov").label
        assert rec["exact_verdict"] == direct
    assert r.diverged_fraction[list(got).index(0.1)] == 1.0 and r.diverged_fraction[0] == 0.0
    r.save(str(tmp_path))
    saved = json.load(open(tmp_path / "summary.json"))
    assert [s["exact_verdict"] for s in saved] == [rec["exact_verdict"] for rec in recs]


def test_plot_rows_give_the_best_points_verdict(baird_ctd):
    (row,) = plotting.summary_rows({"ctd": baird_ctd})
    assert row["setting"].startswith("alpha=0.01") and row["exact_verdict"] == "stable in mean square"


def test_no_verdict_where_the_analysis_does_not_apply():
    """Step sizes on a schedule, and a trace method: None, not a guess."""
    sched = SweepSpec(env="boyan_chain", algorithm="td", hyperparameters={"alpha": [0.1]}, seeds=2, steps=200,
                      log_every=100, schedule="robbins_monro")
    r = sweep.run(sched, progress=False)
    assert r.summary()[0]["exact_verdict"] is None
    env = envs.make("boyan_chain")
    assert verdicts.exact_label(env, "ctd_lambda", {"alpha": 0.1, "beta": 0.1, "lambda": 0.5}) is None
    # a one-step method on the same model is analysed (the None above is the trace's)
    assert verdicts.exact_label(env, "ctd", {"alpha": 0.1, "beta": 0.1}) == "stable in mean square"


def test_run_summary_line_names_the_exact_verdict(tmp_path, capsys):
    assert cli.main(["run", "--env", "boyan_chain", "--algorithm", "td", "--alpha", "0.1,0.3", "--seeds", "2",
                     "--steps", "200", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "; exact: stable in mean square" in out
    saved = json.load(open(tmp_path / "r" / "summary.json"))
    assert all(s["exact_verdict"] == "stable in mean square" for s in saved)
    assert np.isfinite([s["final_mean"] for s in saved]).all()


def test_fast_label_is_the_full_analysis_label():
    """`mean_square.label` (the mean's radius first, the second moment's only
    where the mean is stable) gives `mean_square(...).label` at points of all
    three labels, on both samplers."""
    from bec_jax.theory import mean_square
    env = envs.make("baird")
    seen = set()
    for sampler in ("markov", "iid"):
        for alpha in (0.001, 0.01, 0.1, 0.5, 2.0):
            for beta in (0.05, 0.5):
                hp = {"alpha": alpha, "beta": beta}
                full = mean_square.mean_square(env, "ctd", hp, sampler)
                assert mean_square.label(env, "ctd", hp, sampler) == full.label
                seen.add(full.label)
        hp = {"alpha": 0.05, "zeta": 0.1}
        assert mean_square.label(env, "tdc", hp, sampler) == mean_square.mean_square(env, "tdc", hp, sampler).label
    assert seen == {"stable in mean square", "mean stable, variance grows", "diverges in mean"}


def test_prefetch_starts_on_its_event_and_close_stops_it():
    import threading
    import time
    made = []
    start = threading.Event()
    p = verdicts.Prefetch([(made.append, (i,)) for i in range(3)], start=start)
    time.sleep(0.05)
    assert made == []  # waiting for its start (the sweep's trace)
    start.set()
    deadline = time.monotonic() + 10
    while len(made) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    p.close()
    assert made == [0, 1, 2]
    never = verdicts.Prefetch([(made.append, (9,))], start=threading.Event())
    never.close()  # a run that ends (or fails) before its trace: nothing made, nothing left waiting
    assert made == [0, 1, 2]


def test_a_label_asked_for_twice_at_once_is_computed_once(monkeypatch):
    import threading
    import time

    from bec_jax.theory import mean_square
    calls = []

    def slow_label(*args):
        calls.append(args)
        time.sleep(0.2)
        return "stable in mean square"

    monkeypatch.setattr(mean_square, "label", slow_label)
    env = envs.make("two_state")
    hp = {"alpha": 0.0123, "beta": 0.0456}
    got = []
    threads = [threading.Thread(target=lambda: got.append(verdicts.exact_label(env, "ctd", hp))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == ["stable in mean square"] * 3 and len(calls) == 1
