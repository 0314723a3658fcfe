"""Hyperparameter sensitivity across tasks (`bec_jax.run.sensitivity`, `bec-jax
compare STUDY --sensitivity`): Adkins et al.'s percentile normalization, Phi
and effective dimensionality and Patterson et al.'s CDF normalization and CHS
setting, each against a small case worked out by hand and against the outputs
of the authors' own code run once on the same inputs (recorded below); the
bootstrap's assembly; every kind's orientation and task split; the one-line
refusals (exit 2, nothing written); and one tiny study end to end through the
command, its printed numbers against the module's."""
from __future__ import annotations

import csv
import itertools
import json
import os
import re

import numpy as np
import pytest

from bec_jax.cli.commands import main
from bec_jax.control.continuing.results import ContinuingResult
from bec_jax.control.results import ControlResult
from bec_jax.prediction.results import SweepResult
from bec_jax.run import sensitivity as sens

# ------------------------------------------------------------------ a case by hand
# One algorithm, 2 tasks x 3 settings (alpha) x 3 seeds, higher is better.
ALPHAS = [0.1, 0.3, 1.0]
HAND = {"A": [[1, 2, 3], [4, 5, 6], [7, 8, 9]],
        "B": [[30, 40, 50], [10, 20, 30], [0, 0, 0]]}


def _hand(scores=None, higher=True) -> sens.Data:
    return sens.from_arrays({"q": {t: np.array(v, float) for t, v in (scores or HAND).items()}},
                            {"q": [{"alpha": a} for a in ALPHAS]}, higher)


def test_percentile_normalization_and_phi_by_hand():
    # Task A pools 1..9: NumPy's 5th percentile sits 0.4 of the way from the 1st
    # to the 2nd value, 1.4; the 95th 0.6 of the way from the 8th to the 9th,
    # 8.6; span 7.2. Task B pools 0,0,0,10,20,30,30,40,50: p5 = 0, p95 = 40 + 0.6 x 10 = 46.
    gamma = sens.percentile_normalized(_hand().cells)["q"]
    want = np.array([[(2 - 1.4) / 7.2, (5 - 1.4) / 7.2, (8 - 1.4) / 7.2],
                     [40 / 46, 20 / 46, 0 / 46]])
    np.testing.assert_allclose(gamma, want, rtol=1e-12)
    phi, tuned, across, best = sens.sensitivity(gamma)
    # Per task tuned: (11/12 + 40/46) / 2; across tasks the best is alpha 0.1, (1/12 + 40/46) / 2.
    assert tuned == pytest.approx((11 / 12 + 40 / 46) / 2, rel=1e-12)
    assert across == pytest.approx((1 / 12 + 40 / 46) / 2, rel=1e-12) and best == 0
    assert phi == pytest.approx(5 / 12, rel=1e-12)


def test_cdf_normalization_and_chs_by_hand():
    # CDF(x) = runs on the task strictly below x, of 9. A: CDF(k) = (k - 1)/9.
    # B: CDF(0) = 0, CDF(10) = 3/9, CDF(20) = 4/9, CDF(30) = 5/9, CDF(40) = 7/9, CDF(50) = 8/9.
    norm = sens.cdf_normalized(_hand().cells)["q"]
    want = np.array([[(0 + 1 + 2) / 27, (3 + 4 + 5) / 27, (6 + 7 + 8) / 27],
                     [(5 + 7 + 8) / 27, (3 + 4 + 5) / 27, 0]])
    np.testing.assert_allclose(norm, want, rtol=1e-12)
    # Means over tasks 23/54, 4/9, 7/18: the CHS setting is alpha 0.3, not Gamma's alpha 0.1.
    assert sens.chs(norm) == (1, pytest.approx(4 / 9, rel=1e-12))
    code = sens.codes([{"alpha": a} for a in ALPHAS], ("alpha",))
    np.testing.assert_allclose(sens.profile(norm, code, 0), [23 / 54, 4 / 9, 7 / 18], rtol=1e-12)


def test_percentiles_pool_every_algorithms_runs():
    # Task T: a's seeds {0, 10}, b's {20, 30}; pooled, p5 = 0 + 0.15 x 10 = 1.5 and
    # p95 = 20 + 0.85 x 10 = 28.5 (positions 0.15 and 2.85 of 0..3), span 27.
    cells = {"a": [np.array([[0.0, 10.0]]), np.array([[0.0, 0.0]])], "b": [np.array([[20.0, 30.0]]),
                                                                           np.array([[0.0, 0.0]])]}
    gamma = sens.percentile_normalized(cells)
    assert gamma["a"][0, 0] == pytest.approx(3.5 / 27) and gamma["b"][0, 0] == pytest.approx(23.5 / 27)
    assert gamma["a"][1, 0] == 0.0  # every run alike: span 1, all at p5


def test_cdf_averages_each_algorithms_cdf():
    # Patterson et al.'s CDF is the mean over algorithms of each one's own CDF:
    # on task T, a's runs {1, 2}, b's {0, 3, 3, 3}; a run scoring 2 is above
    # 1 of a's 2 and 1 of b's 4: (1/2 + 1/4)/2.
    cells = {"a": [np.array([[1.0, 2.0]]), np.array([[0.0, 0.0]])],
             "b": [np.array([[0.0, 3.0], [3.0, 3.0]]), np.array([[0.0, 0.0], [0.0, 0.0]])]}
    norm = sens.cdf_normalized(cells)
    assert norm["a"][0, 0] == pytest.approx(((0 / 2 + 1 / 4) / 2 + (1 / 2 + 1 / 4) / 2) / 2)
    assert norm["b"][0, 1] == pytest.approx((2 / 2 + 1 / 4) / 2)
    assert norm["a"][1, 0] == 0.0  # ties are not below


def test_dimensionality_by_hand():
    # Settings (a, b) = (0, 0), (0, 1), (1, 0), (1, 1); 2 tasks.
    code = sens.codes([{"a": a, "b": b} for a in (0, 1) for b in (0, 1)], ("a", "b"))
    gamma = np.array([[0.2, 0.4, 1.0, 0.6], [0.8, 0.6, 0.2, 0.1]])
    # Across tasks (0.5, 0.5, 0.6, 0.35): best (1, 0). Tuning a alone (b at 0):
    # (max(0.2, 1.0) + max(0.8, 0.2))/2 = 0.9; b alone (a at 1): (1.0 + 0.2)/2 = 0.6.
    _, tuned, _, best = sens.sensitivity(gamma)
    curve, which = sens.tuned_by_count(gamma, code, best)
    np.testing.assert_allclose(curve, [0.6, 0.9, 0.9])
    assert which == [(), (0,), (0, 1)]
    assert tuned == pytest.approx(0.9) and sens.dimensionality(curve) == 1
    gamma[1] = [0.8, 0.9, 0.2, 0.1]  # now best (0, 1); a alone: (0.6 + 0.9)/2, b alone: (0.4 + 0.9)/2
    _, tuned, _, best = sens.sensitivity(gamma)
    curve, which = sens.tuned_by_count(gamma, code, best)
    np.testing.assert_allclose(curve, [0.65, 0.75, 0.95])
    gamma[0, 0] = 0.95  # with the same cross-task setting, b alone (a at 0) now (0.95 + 0.9)/2 beats a alone
    assert which[1] == (0,) and sens.tuned_by_count(gamma, code, best)[1][1] == (1,)
    assert best == 1 and sens.dimensionality(curve) == 2  # 0.75 < 0.95 x 0.95
    assert sens.dimensionality(np.array([0.9, 0.92, 0.94])) == 0  # 0.9 >= 0.893
    assert sens.dimensionality(np.array([0.5, 0.87, 0.95])) == 2  # 0.87 < 0.9025 (but above 90%)
    # A negative per-task-tuned performance: 5% of its size below it, -0.42 (0.95 x -0.4 would be unreachable).
    assert sens.dimensionality(np.array([-1.0, -0.5, -0.41])) == 2
    assert sens.dimensionality(np.array([-1.0, -0.42, -0.4])) == 1


def test_errors_are_negated_and_failed_runs_score_as_the_worst():
    err = {t: -np.array(v, float) for t, v in HAND.items()}
    a, b = _hand(), _hand(err, higher=False)
    assert b.negated and not a.negated
    for x, y in zip(a.cells["q"], b.cells["q"]):
        np.testing.assert_array_equal(x, y)
    # A diverged seed (an error of +inf) on A scores as A's worst finite run: 2 once 1 is gone.
    err["A"] = err["A"].copy()
    err["A"][0, 0] = np.inf
    c = _hand(err, higher=False)
    assert c.failed == {"q": 1} and c.cells["q"][0][0, 0] == 2.0
    with pytest.raises(ValueError, match=r"^dirs: every run on B \(q\) diverged"):
        _hand({"A": HAND["A"], "B": np.full((3, 3), np.nan)})


# ------------------------------------------------------------------ against the authors' code
# Patterson et al.'s shb/shb.py (andnp/single-hyperparameter-benchmark at
# 09b313a599842dc076c69f8631e47d1c6d791cb9), run unmodified with PyExpUtils:
# SHB(selection_runs=3, algs=[(a, {"epsilon": [0.05, 0.1], "stepsize": [0.01, 0.1]}, {})
# for a in ("DQN", "ESARSA")], envs=["Acrobot", "Cartpole", "MountainCar"]); each
# selection job recorded CHS_DATA[alg, env, job.idx, job.run]; then pickParameters()
# and, per (alg, env, idx), the mean over runs of cdfScale(env, x). PyExpUtils
# numbers its settings with epsilon varying fastest.
CHS_DATA = np.random.default_rng(6).integers(0, 8, (2, 3, 4, 3))  # (algorithm, env, setting, run)
CHS_SETTINGS = [{"epsilon": e, "stepsize": s} for s in (0.01, 0.1) for e in (0.05, 0.1)]
CHS_PICKED = {"DQN": {"epsilon": 0.1, "stepsize": 0.01}, "ESARSA": {"epsilon": 0.05, "stepsize": 0.1}}
CHS_SCALED = {
    "DQN": [[0.3611111111111111, 0.3888888888888889, 0.3333333333333333, 0.5277777777777778],
            [0.5416666666666666, 0.4861111111111111, 0.2777777777777778, 0.5416666666666666],
            [0.513888888888889, 0.6805555555555557, 0.48611111111111116, 0.1111111111111111]],
    "ESARSA": [[0.6111111111111112, 0.4305555555555555, 0.5277777777777778, 0.23611111111111108],
               [0.5277777777777778, 0.16666666666666666, 0.40277777777777773, 0.47222222222222215],
               [0.23611111111111108, 0.3194444444444444, 0.5833333333333334, 0.5]]}


def test_cdf_and_chs_match_patterson_et_al_code():
    assert CHS_DATA[0, 0, 0].tolist() == [3, 4, 4] and CHS_DATA[1, 2, 3].tolist() == [3, 5, 4]  # the recorded draw
    envs = ("Acrobot", "Cartpole", "MountainCar")
    data = sens.from_arrays({a: {e: CHS_DATA[i, j].astype(float) for j, e in enumerate(envs)}
                             for i, a in enumerate(CHS_PICKED)}, {a: CHS_SETTINGS for a in CHS_PICKED})
    norm = sens.cdf_normalized(data.cells)
    for a in CHS_PICKED:
        np.testing.assert_allclose(norm[a], CHS_SCALED[a], rtol=1e-12)
        assert CHS_SETTINGS[sens.chs(norm[a])[0]] == CHS_PICKED[a]


# Adkins et al.'s analysis/utils.py compute_scores and analysis/plots.py
# generate_dimensionality_plot (jadkins99/hyperparameter_sensitivity at
# e571b0b90b7f21ef19a37533d12ce57d82f7eccf), run unmodified (pandas 2.1.4,
# NumPy 1.26.4; its DataFrame of int zeros takes floats only before pandas 3)
# on a table of percentile_normalized_return = ADK_GAMMA[alg, env, setting], the
# settings the product of ADK_GRID in order: compute_scores' per-environment
# tuned, cross-environment tuned and sensitivity_difference; the function's
# best_tune_n_performance (flipped: by hyperparameters tuned) read at its
# return, and its interpolated crossings of 95% (the dashed lines it draws).
ADK_GRID = {"gae_lambda": [0.1, 0.9], "ent_coef": [0.001, 0.01], "actor_lr": [1e-4, 1e-3], "critic_lr": [1e-4, 1e-3]}
ADK_GAMMA = np.random.default_rng(11).random((2, 5, 16)).round(3)  # (algorithm, env, setting)
ADK_SCORES = {"lambda_ac": (0.9454, 0.6352, 0.31020000000000003), "norm_obs": (0.923, 0.7952, 0.12780000000000002)}
ADK_CURVE = {"lambda_ac": [0.6352, 0.794, 0.9104000000000001, 0.9404, 0.9454],
             "norm_obs": [0.7952, 0.8286, 0.8987999999999999, 0.9088, 0.923]}
ADK_INTERPOLATED = {"lambda_ac": 1.8945876288659784, "norm_obs": 1.6873219373219381}
# Its most_important_hypers (the tuned ones, by how many are fixed: 3, 2, 1), the same for both algorithms.
ADK_TUNED = [("ent_coef",), ("actor_lr", "critic_lr"), ("ent_coef", "actor_lr", "critic_lr")]


def test_phi_and_dimensionality_match_adkins_et_al_code():
    settings = [dict(zip(ADK_GRID, v)) for v in itertools.product(*ADK_GRID.values())]
    code = sens.codes(settings, tuple(ADK_GRID))
    for i, a in enumerate(ADK_SCORES):
        phi, tuned, across, best = sens.sensitivity(ADK_GAMMA[i])
        np.testing.assert_allclose([tuned, across, phi], ADK_SCORES[a], rtol=1e-12)
        curve, which = sens.tuned_by_count(ADK_GAMMA[i], code, best)
        np.testing.assert_allclose(curve, ADK_CURVE[a], rtol=1e-12)
        assert [tuple(list(ADK_GRID)[j] for j in t) for t in which[1:4]] == ADK_TUNED
        # Their figure's crossing lies between whole counts; d is the whole count above it.
        assert sens.dimensionality(curve) == int(np.ceil(ADK_INTERPOLATED[a])) == 2


# ------------------------------------------------------------------ the bootstrap

def test_intervals_are_percentiles_of_resamples_of_each_sweeps_seeds():
    data = _hand()
    rep = sens.analyze(data, reps=30, seed=4).algorithms["q"]
    rng = np.random.default_rng(4)
    phis, chss = [], []
    for _ in range(30):  # each task's seeds drawn in task order, one draw for all its settings
        cells = {"q": [v[:, rng.integers(0, 3, 3)] for v in data.cells["q"]]}
        phis.append(sens.sensitivity(sens.percentile_normalized(cells)["q"])[0])
        chss.append(sens.chs(sens.cdf_normalized(cells)["q"])[1])
    assert rep.phi == pytest.approx((5 / 12, *np.percentile(phis, [2.5, 97.5])), rel=1e-12)
    assert rep.chs == pytest.approx((4 / 9, *np.percentile(chss, [2.5, 97.5])), rel=1e-12)
    assert rep.chs_setting == {"alpha": 0.3} and rep.cross_task_setting == {"alpha": 0.1}
    assert rep.seeds == {"A": 3, "B": 3} and rep.swept == ("alpha",)
    values, point, lo, hi = rep.curves["alpha"]
    assert values == ALPHAS and np.allclose(point, [23 / 54, 4 / 9, 7 / 18]) and np.all(lo <= hi)
    same = sens.analyze(_hand({t: [[x] * 3 for x in np.mean(v, 1)] for t, v in HAND.items()}), reps=20)
    assert same.algorithms["q"].phi[1] == same.algorithms["q"].phi[2]  # seeds all alike: every resample the same
    one = sens.analyze(_hand({t: [r[:1] for r in v] for t, v in HAND.items()}), reps=20).algorithms["q"]
    assert np.isnan(one.phi[1]) and np.isnan(one.dimensionality[2])


# ------------------------------------------------------------------ results of every kind

def _continuing(task, alg, rates, alpha=(0.1, 0.5), task_params=None):
    """A continuing result whose run (g, n) has reward rate rates[g][n] (2 log blocks)."""
    r = np.repeat(np.asarray(rates, np.float32)[..., None], 2, axis=-1)
    return ContinuingResult(spec=None, grid={"alpha": np.asarray(alpha, float)}, reward=r, rate_estimate=0 * r,
                            max_abs_w=0 * r, spec_dict={"kind": "continuing", "task": task, "algorithm": alg,
                                                        "steps": 20, "task_params": task_params or {}})


def test_every_kind_scores_by_its_own_orientation():
    cont = {"x": _continuing("access_control", "q", [[1, 2], [3, 4]]),
            "y": _continuing("two_choice", "q", [[5, 6], [7, 8]], alpha=(0.5, 0.1))}
    d = sens.from_results(cont)
    assert not d.negated and d.tasks == ["access_control", "two_choice"] and d.kind == "continuing"
    np.testing.assert_array_equal(d.cells["q"][1], [[7, 8], [5, 6]])  # put in access_control's order of alpha
    # Control: steps per episode are lower-is-better (negated); a task axis makes a task per value.
    lengths = np.array([[[3, 5]] * 2, [[4, 4]] * 2, [[6, 6]] * 2, [[2, 2]] * 2], float)  # (G=4, N=2, E=2)
    ctl = ControlResult(spec=None, grid={"alpha": np.array([0.1, 0.1, 0.5, 0.5]), "slip": np.array([0., .2, 0., .2])},
                        returns=-lengths, lengths=lengths, diverged_step=-np.ones((4, 2), int),
                        spec_dict={"kind": "control", "task": "maze", "algorithm": "q", "task_axes": {"slip": [0, .2]}})
    d = sens.from_results({"m": ctl}, "length")
    assert d.negated and d.tasks == ["maze (slip=0)", "maze (slip=0.2)"] and d.settings["q"] == [{"alpha": 0.1},
                                                                                              {"alpha": 0.5}]
    np.testing.assert_array_equal(d.cells["q"][0], [[-4, -4], [-6, -6]])
    assert sens.from_results({"m": ctl}).negated is False  # returns, the default
    # Prediction: an error's per-seed area, negated; +inf (diverged) scores as its task's worst.
    def pred(env, auc, metrics=("rmsve",)):
        auc, zero = np.asarray(auc, float)[None], np.zeros((1, 2, 2))
        return SweepResult(spec=None, steps=np.arange(2), grid={"alpha": np.array([0.1, 0.2])}, mean=zero,
                           std=zero, sem=zero, alive=np.ones((2, 2)), final=auc,
                           diverged_step=-np.ones((2, 2), int), auc_seed=auc,
                           spec_dict={"env": env, "algorithm": "td", "metrics": list(metrics), "env_params": {}})
    d = sens.from_results({"a": pred("boyan_chain", [[1, 2], [3, np.inf]]), "b": pred("random_walk", [[1, 1], [2, 2]])})
    assert d.negated and d.failed == {"td": 1} and d.metric == "rmsve"
    np.testing.assert_array_equal(d.cells["td"][0], [[-1, -2], [-3, -3]])
    with pytest.raises(ValueError, match="^metric: 'rmsve' was not logged by every run"):  # one metric for all
        sens.from_results({"a": pred("boyan_chain", [[1, 2], [3, 4]]),
                           "b": pred("random_walk", [[1, 1], [2, 2]], ("rmspbe",))})


# ------------------------------------------------------------------ refusals

def _save_study(root, results: dict) -> str:
    for name, r in results.items():
        r.save(str(root / name))
    (root / "study.json").write_text(json.dumps({"sweeps": [{"name": n, "spec": r.spec_dict}
                                                            for n, r in results.items()]}))
    return str(root)


def test_refusals_are_one_line_with_exit_2_and_write_nothing(tmp_path, capsys):
    good = {"x": _continuing("access_control", "q", [[1, 2], [3, 4]]),
            "y": _continuing("two_choice", "q", [[5, 6], [7, 8]])}
    ok = _save_study(tmp_path / "ok", good)
    one = _save_study(tmp_path / "one", {"x": good["x"]})
    differ = _save_study(tmp_path / "differ", {"x": good["x"], "y": _continuing("two_choice", "q", [[5, 6], [7, 8]],
                                                                                  alpha=(0.1, 0.9))})
    twice = _save_study(tmp_path / "twice", {**good, "z": _continuing("two_choice", "q", [[5, 6], [7, 8]])})
    (tmp_path / "file").write_text("")
    out = tmp_path / "out"
    cases = [([one], r"dirs: --sensitivity compares settings across tasks, and every sweep ran on access_control"),
             ([differ], r"dirs: q's hyperparameter grid differs across tasks: alpha is \[0.1, 0.5\] on "
                        r"access_control but \[0.1, 0.9\] on two_choice"),
             ([twice], r"dirs: 'y' and 'z' both ran q on two_choice"),
             ([str(tmp_path / "ok" / "x")], r"dirs: .* is not a study directory \(no study.json\)"),
             ([ok, ok], r"dirs: --sensitivity reads one study directory, got 2"),
             ([ok, "--stat", "iqm"], r"stat: cannot go with --sensitivity"),
             ([ok, "--profile"], r"profile: cannot go with --sensitivity"),
             ([ok, "--labels", "a"], r"labels: cannot go with --sensitivity"),
             ([ok, "--select", "alpha=0.1"], r"select: cannot go with --sensitivity"),
             ([ok, "--reps", "5"], r"reps: expected an integer from 10"),
             ([ok, "--metric", "length"], r"metric: continuing runs report the reward rate over"),
             ([ok, "--out", str(tmp_path / "file")], r"out: --sensitivity writes a directory .*, and .* is a file"),
             ([ok, "--out", str(tmp_path / "fig.png")], r"out: .* is a figure name")]
    for argv, pattern in cases:
        argv = argv if "--out" in argv else argv + ["--out", str(out)]
        assert main(["compare", *argv, "--sensitivity"]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.match("bec-jax: error: " + pattern, err[0]), (argv, err)
        assert not out.exists() and not (tmp_path / "fig.png").exists()
    assert main(["compare", ok]) == 2 and "out: required" in capsys.readouterr().err  # plain compare still needs it
    assert main(["compare", ok, "--sensitivity", "--reps", "10"]) == 0  # the default --out: STUDY/sensitivity
    assert sorted(os.listdir(tmp_path / "ok" / "sensitivity")) == ["sensitivity.csv", "sensitivity.md", "sensitivity.png"]


# ------------------------------------------------------------------ end to end

STUDY = """seeds = 2
steps = 40
log_every = 20
[[sweep]]
name = "td-boyan"
env = "boyan_chain"
algorithm = "td"
alpha = [0.05, 0.2]
[[sweep]]
name = "td-walk"
env = "random_walk"
algorithm = "td"
alpha = [0.05, 0.2]
"""


def test_command_end_to_end(tmp_path, capsys):
    """A tiny prediction study (2 tasks, 2 settings, 2 seeds) through `bec-jax
    compare --sensitivity`: the printed numbers and the CSV's are the module's."""
    (tmp_path / "s.toml").write_text(STUDY)
    assert main(["study", str(tmp_path / "s.toml"), "--out", str(tmp_path / "s")]) == 0
    capsys.readouterr()
    out = tmp_path / "sens"
    assert main(["compare", str(tmp_path / "s"), "--sensitivity", "--out", str(out), "--reps", "50", "--seed", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    data = sens.load(str(tmp_path / "s"))
    assert data.negated and data.tasks == ["boyan_chain", "random_walk"] and data.metric == "rmscbe"
    rep = sens.analyze(data, 50, 3).algorithms["td"]
    row = next(line for line in printed if re.match(r"td +\d", line))
    f = lambda x: f"{x[0]:.4f} [{x[1]:.4f}, {x[2]:.4f}]"  # noqa: E731
    d, tuned = rep.dimensionality, f" ({', '.join(rep.tuned)})" if rep.tuned else ""
    assert row.split() == " ".join([
        "td", f(rep.phi), f(rep.per_task_tuned), f"{int(d[0])} of 1{tuned} [{int(d[1])}, {int(d[2])}]", f(rep.chs),
        sens.setting_text(rep.chs_setting)]).split()
    assert printed[:-1] == sens.lines(sens.analyze(data, 50, 3))  # and the rest as the module words it
    assert printed[0].startswith("td on 2 tasks (boyan_chain, random_walk)") and "negated" in printed[0]
    with open(out / "sensitivity.csv", newline="") as fh:
        (got,) = list(csv.DictReader(fh))
    assert float(got["phi"]) == rep.phi[0] and float(got["CHS score"]) == rep.chs[0]
    assert float(got["phi CI low"]) == rep.phi[1] and float(got["CHS score CI high"]) == rep.chs[2]
    assert got["CHS setting"] == sens.setting_text(rep.chs_setting) and got["negated"] == "True"
    assert sorted(os.listdir(out)) == ["sensitivity.csv", "sensitivity.md", "sensitivity.png"]
