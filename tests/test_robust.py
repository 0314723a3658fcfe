"""rliable's robust statistics (`bec_jax.run.robust`, `bec-jax compare --stat
/ --profile`, `bec-jax plot --stat`): every number against rliable's own
functions called directly on score matrices built here from the saved arrays
(the same bootstrap draws: NumPy's global state seeded alike), the orientation
and normalization by hand, the per-seed views (`kinds.Scores`) against the
results' arrays, and the one-line refusals. Small control and prediction
studies are made once per module."""
from __future__ import annotations

import csv
import re
import sys

import numpy as np
import pytest

from bec_jax.cli.commands import main
from bec_jax.run import kinds, robust, study

pytest.importorskip("rliable")
from rliable import library, metrics  # noqa: E402

REPS = 100
CONTROL = """kind = "control"
episodes = 20
seeds = 6
epsilon = 0.1
[[sweep]]
name = "q-cliff"
task = "cliff_walking"
algorithm = "q"
alpha = [0.1, 0.5]
[[sweep]]
name = "cq-cliff"
task = "cliff_walking"
algorithm = "cq"
alpha = [0.1, 0.5]
beta = [0.01]
[[sweep]]
name = "q-maze"
task = "maze"
algorithm = "q"
alpha = [0.1, 0.5]
[[sweep]]
name = "cq-maze"
task = "maze"
algorithm = "cq"
alpha = [0.1, 0.5]
beta = [0.01]
"""
PREDICTION = """seeds = 5
steps = 200
log_every = 20
[[sweep]]
name = "td-boyan"
env = "boyan_chain"
algorithm = "td"
alpha = [0.05, 0.2]
[[sweep]]
name = "ctd-boyan"
env = "boyan_chain"
algorithm = "ctd"
alpha = [0.05, 0.2]
beta = [0.1]
[[sweep]]
name = "td-walk"
env = "random_walk"
algorithm = "td"
alpha = [0.05, 0.2]
[[sweep]]
name = "ctd-walk"
env = "random_walk"
algorithm = "ctd"
alpha = [0.05, 0.2]
beta = [0.1]
"""


def _study(tmp_path_factory, text: str, name: str):
    d = tmp_path_factory.mktemp(name)
    (d / "s.toml").write_text(text)
    assert main(["study", str(d / "s.toml"), "--out", str(d / "s")]) == 0
    return d / "s"


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    return _study(tmp_path_factory, CONTROL, "control")


@pytest.fixture(scope="module")
def prediction(tmp_path_factory):
    return _study(tmp_path_factory, PREDICTION, "prediction")


def _results(d) -> dict:
    return {k: kinds.load_result(p) for k, p in study.sweep_dirs(str(d)).items()}


def _direct(score_dict: dict, func, seed: int = 0):
    """rliable's own `get_interval_estimates`, NumPy's global state seeded as bec_jax seeds it."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        return library.get_interval_estimates(score_dict, func, reps=REPS, confidence_interval_size=0.95)
    finally:
        np.random.set_state(state)


def _run(argv, capsys) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------ the per-seed views


def test_scores_views_are_the_results_arrays(control, prediction, tmp_path):
    for key, r in _results(control).items():
        s = kinds.of_result(r).scores
        i = s.chosen({key: r}, "return", None)[key]
        assert i == r.best_index("return")
        np.testing.assert_array_equal(s.seed_scores(r, i, "return"), r.returns[i].astype(np.float64).mean(-1))
        x, v = s.seed_curves(r, i, "return")
        np.testing.assert_array_equal(x, np.arange(1, r.episodes + 1))
        np.testing.assert_array_equal(v, r.returns[i].astype(np.float64))
        assert s.higher_is_better("return") and not s.higher_is_better("length")
        assert s.task_of(r) == r.task and set(s.mean_curves(r, i)) == {"return", "length"}
    for key, r in _results(prediction).items():
        s = kinds.of_result(r).scores
        i = s.chosen({key: r}, None, {"alpha": 0.2})[key]
        assert r.point(i)["alpha"] == 0.2
        np.testing.assert_array_equal(s.seed_scores(r, i, None), r.auc_seed[0, i])
        assert s.seed_curves(r, i, None) is None and not s.higher_is_better(None) and s.task_of(r) == r.env
        np.testing.assert_array_equal(s.mean_curves(r, i)["rmscbe"][1], r.mean[0, i])
    out = tmp_path / "c"
    assert main(["continuing", "--task", "two_choice", "--algorithm", "q_vrc", "--alpha", "0.1,0.3", "--eta", "1",
                 "--seeds", "3", "--steps", "1000", "--out", str(out)]) == 0
    r = kinds.load_result(str(out))
    s = kinds.of_result(r).scores
    i = s.chosen({"c": r}, "all", None)["c"]
    assert i == r.best_index("all")
    np.testing.assert_array_equal(s.seed_scores(r, i, "all"), r.reward[i].astype(np.float64).mean(-1))
    x, v = s.seed_curves(r, i, "all")
    np.testing.assert_array_equal(v, r.reward[i])
    assert x[-1] == 1000
    assert s.higher_is_better("all")


# ------------------------------------------------------------------ one run at a time


@pytest.mark.parametrize("stat", ["iqm", "mean", "median"])
def test_compare_stat_is_rliables_interval_of_each_runs_seeds(control, capsys, tmp_path, stat):
    rs = _results(control)
    scores = {k: r.returns[r.best_index("return")].astype(np.float64).mean(-1)[:, None] for k, r in rs.items()}
    func = {"iqm": lambda s: np.array([metrics.aggregate_iqm(s)]),
            "mean": lambda s: np.array([metrics.aggregate_mean(s)]),
            "median": lambda s: np.array([np.median(s)])}[stat]  # over one run's seeds: their median
    point, ci = _direct(scores, func)
    got = robust.interval_estimates(scores, stat, REPS, 0, over="seeds")
    for k in scores:  # the same computation, the same draws: equal
        assert got[k] == (point[k][0], ci[k][0, 0], ci[k][1, 0])
    if stat == "median":
        assert all(got[k][0] == np.median(scores[k]) for k in scores)
    np.random.seed(123)  # the caller's own state, drawn from: not the one the bootstrap seeds
    np.random.random(7)
    before = np.random.get_state()
    rc, out, _ = _run(["compare", str(control), "--out", str(tmp_path / "f.png"), "--stat", stat, "--reps",
                       str(REPS)], capsys)
    after = np.random.get_state()  # the caller's random state is left alone: its key, position and gauss cache
    assert rc == 0 and after[0] == before[0] and np.array_equal(after[1], before[1]) and after[2:] == before[2:]
    name = robust.stat_name(stat)
    for k in scores:
        m = re.search(rf"^{k}: {name} of each seed's area under its curve \(return\) = (\S+) \[(\S+), (\S+)\] "
                      r"\(95% stratified bootstrap CI, 6 seeds\)$", out, re.M)
        assert m, out
        np.testing.assert_allclose([float(v) for v in m.groups()], got[k], rtol=1e-5)  # printed to 6 digits
    assert (tmp_path / "f.png").stat().st_size > 5000


def test_curves_are_rliables_statistic_at_each_point(control):
    rs = {k: r for k, r in _results(control).items() if k.startswith("q-")}
    got = robust.curve_estimates(rs, "iqm", None, None, REPS, 3, points=7)
    for k, r in rs.items():
        x, point, lo, hi = got[k]
        at = np.unique(np.linspace(0, r.episodes - 1, 7).round().astype(int))
        np.testing.assert_array_equal(x, at + 1)
        cube = r.returns[r.best_index("return")].astype(np.float64)[:, None, at]
        p, ci = _direct({k: cube}, lambda s: np.array([metrics.aggregate_iqm(s[..., j]) for j in range(len(at))]), 3)
        # The same draws; each point's trimmed mean taken along an axis rather
        # than of a flattened copy: equal up to the order of a few additions.
        np.testing.assert_allclose(point, p[k], rtol=1e-12)
        np.testing.assert_allclose(np.stack([lo, hi]), ci[k], rtol=1e-12)
        assert (lo <= point).all() and (point <= hi).all()


def test_plot_stat_writes_rliables_numbers(prediction, capsys):
    rc, out, _ = _run(["plot", str(prediction), "--stat", "iqm", "--reps", str(REPS), "--seed", "7"], capsys)
    assert rc == 0 and "robust.png" in out and "robust.md" in out
    rs = _results(prediction)
    scores = {k: r.auc_seed[0, r.best_index()][:, None].astype(np.float64) for k, r in rs.items()}
    point, ci = _direct(scores, lambda s: np.array([metrics.aggregate_iqm(s)]), 7)
    with open(prediction / "plots" / "robust.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == list(scores)
    for r in rows:
        k = r["run"]
        assert (float(r["IQM"]), float(r["IQM CI low"]), float(r["IQM CI high"])) == \
            (point[k][0], ci[k][0, 0], ci[k][1, 0])
        assert r["seeds"] == "5" and r["score"] == "each seed's area under its curve (rmscbe)"


# ------------------------------------------------------------------ across tasks


def test_profile_orients_normalizes_and_is_rliables(prediction, capsys, tmp_path):
    rs = _results(prediction)
    table = robust.by_algorithm(rs)
    assert table.negated and table.tasks == ["boyan_chain", "random_walk"] and list(table.scores) == ["td", "ctd"]
    raw = {a: np.stack([rs[f"{a}-{t}"].auc_seed[0, rs[f"{a}-{t}"].best_index()] for t in ("boyan", "walk")],
                       1).astype(np.float64)
           for a in ("td", "ctd")}
    for a in raw:
        np.testing.assert_array_equal(table.raw[a], raw[a])
    pooled = -np.concatenate([raw["td"], raw["ctd"]])  # errors: negated, then min-max per task
    lo, hi = pooled.min(0), pooled.max(0)
    for a in raw:
        np.testing.assert_allclose(table.scores[a], (-raw[a] - lo) / (hi - lo), rtol=0, atol=1e-15)
    both = np.concatenate(list(table.scores.values()))
    assert np.allclose(both.min(0), 0) and np.allclose(both.max(0), 1)
    taus = np.linspace(0, 1, robust.PROFILE_TAUS)
    p, ci = _direct(table.scores, lambda s: library.score_distributions(s, taus), 0)
    _, prof = robust.profiles(table.scores, REPS, 0)
    for a in raw:
        np.testing.assert_array_equal(prof[a][0], p[a])
        np.testing.assert_array_equal(np.stack(prof[a][1:]), ci[a])
    p, ci = _direct({"td,ctd": (table.scores["td"], table.scores["ctd"])},
                    lambda x, y: np.array([metrics.probability_of_improvement(x, y)]), 0)
    poi = robust.improvement(table.scores, REPS, 0)
    assert poi[("td", "ctd")] == (p["td,ctd"][0], ci["td,ctd"][0, 0], ci["td,ctd"][1, 0])
    rc, out, _ = _run(["compare", str(prediction), "--out", str(tmp_path / "p.png"), "--profile", "--reps",
                       str(REPS)], capsys)
    assert rc == 0, out
    m = re.search(r"^td vs ctd: P\(td > ctd\) = (\S+) \[(\S+), (\S+)\] \(95% stratified bootstrap CI, 2 tasks x 5 and "
                  r"5 runs\)$", out, re.M)
    assert m and np.allclose([float(v) for v in m.groups()], poi[("td", "ctd")], atol=5e-5), out
    agg = robust.interval_estimates(table.scores, "iqm", REPS, 0)
    m = re.search(r"^ctd: IQM of normalized scores = (\S+) \[(\S+), (\S+)\]", out, re.M)
    assert m and np.allclose([float(v) for v in m.groups()], agg["ctd"], atol=5e-5), out
    assert "lower is better here: scores negated, so higher is better" in out and (tmp_path / "p.png").stat().st_size > 10000


def test_normalize_by_hand():
    raw = {"a": np.array([[1.0, 10.0], [3.0, 10.0]]), "b": np.array([[2.0, 10.0], [5.0, 10.0]])}
    up = robust.normalize(raw, negate=False)
    np.testing.assert_array_equal(up["a"], [[0.0, 1.0], [0.5, 1.0]])  # a task where all tie: 1
    np.testing.assert_array_equal(up["b"], [[0.25, 1.0], [1.0, 1.0]])
    down = robust.normalize(raw, negate=True)
    np.testing.assert_array_equal(down["a"], [[1.0, 1.0], [0.5, 1.0]])


# ------------------------------------------------------------------ refusals


def test_refusals_are_one_line(control, prediction, capsys, tmp_path, monkeypatch):
    png = str(tmp_path / "x.png")
    one = study.sweep_dirs(str(control))
    cases = [
        (["compare", str(control), "--out", png, "--stat", "trimmed"], "stat: invalid choice"),
        (["compare", one["q-cliff"], one["q-maze"], "--out", png, "--profile"], "dirs: a profile compares algorithms"),
        (["compare", one["q-cliff"], one["q-maze"], one["cq-cliff"], "--out", png, "--profile"],
         "dirs: cq has no run on maze"),
        (["compare", str(control), "--out", png, "--profile", "--labels", "a,b,c,d"], "labels: --profile"),
        (["compare", str(control), "--out", png, "--stat", "iqm", "--reps", "5"],
         "reps: expected an integer from 10 to 100000 (bootstrap resamples), got 5"),
        (["compare", str(control), "--out", png, "--stat", "iqm", "--reps", "1000000000"],
         "reps: expected an integer from 10 to 100000 (bootstrap resamples), got 1000000000"),
        (["compare", str(control), str(prediction), "--out", png, "--stat", "iqm"], "dirs: "),
    ]
    for argv, msg in cases:
        rc, _, err = _run(argv, capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and msg in err, (argv, err)
    # A chosen setting with diverged seeds: no score to bootstrap.
    r = tmp_path / "b"
    assert main(["run", "--env", "baird", "--algorithm", "td", "--alpha", "0.01,0.5", "--steps", "300", "--seeds", "3",
                 "--log-every", "50", "--out", str(r)]) == 0
    capsys.readouterr()
    rc, _, err = _run(["compare", str(r), "--out", png, "--stat", "iqm", "--select", "alpha=0.5"], capsys)
    assert rc == 2 and "dirs: 3 of 3 seeds of 'b' diverged or did not finish" in err, err
    # Unequal seeds on an algorithm's two tasks: td's 3 seeds on baird (that run, at
    # its best setting, which did not diverge) and its 5 on boyan_chain (the study's).
    pred = study.sweep_dirs(str(prediction))
    rc, _, err = _run(["compare", pred["td-boyan"], str(r), pred["ctd-boyan"], "--out", png, "--profile"], capsys)
    assert rc == 2 and "dirs: td's runs have 3 and 5 seeds on different tasks" in err, err
    # Without rliable: the install that brings it, and nothing written.
    monkeypatch.setitem(sys.modules, "rliable.library", None)
    rc, _, err = _run(["compare", str(control), "--out", png, "--stat", "iqm"], capsys)
    assert rc == 2 and err.strip() == "bec-jax: error: stat: robust statistics need rliable: pip install " \
                                      "'bec_jax[stats]'", err
    rc, _, err = _run(["plot", str(control), "--stat", "iqm", "--out", str(tmp_path / "pl")], capsys)
    assert rc == 2 and "pip install 'bec_jax[stats]'" in err and not (tmp_path / "pl").exists()
    assert not (tmp_path / "x.png").exists()


@pytest.mark.long
def test_the_guides_commands_run_as_pasted(tmp_path):
    """docs/statistics.md's two command blocks, on this module's control study
    saved as study.toml: the files they name, and the pair the profile prints."""
    import os
    import subprocess

    from docs_blocks import blocks
    mine = [b.code for b in blocks("docs/statistics.md") if b.mark and "test_the_guides_commands" in b.mark]
    assert len(mine) == 2
    (tmp_path / "study.toml").write_text(CONTROL)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
           "BEC_JAX_CPU_DEVICES": "1", "BEC_JAX_NO_CACHE": "1"}
    p = subprocess.run(["bash", "-ec", "\n".join(mine)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert re.search(r"^q-cliff: IQM of each seed's area under its curve \(return\) = ", p.stdout, re.M), p.stdout
    assert re.search(r"^q vs cq: P\(q > cq\) = 0\.\d+ \[", p.stdout, re.M), p.stdout
    for f in ("iqm.png", "profile.png", "runs/ctl/plots/robust.md", "runs/ctl/plots/robust.csv"):
        assert (tmp_path / f).stat().st_size > 100, f


def test_one_seed_gives_no_interval(tmp_path, capsys):
    """A run of one seed: its statistic is its seed's score, and it has no
    interval (the bootstrap's resamples are all that seed): said as much, not
    printed as a zero-width 95% interval; robust.csv leaves the bounds empty."""
    d = tmp_path / "one"
    assert main(["continuing", "--task", "two_choice", "--algorithm", "q", "--alpha", "0.1,0.3", "--seeds", "1",
                 "--steps", "1000", "--out", str(d)]) == 0
    capsys.readouterr()
    rc, out, err = _run(["compare", str(d), "--out", str(tmp_path / "f.png"), "--stat", "iqm"], capsys)
    score = kinds.load_result(str(d)).rate_interval("all")[0]
    m = re.fullmatch(r"one: IQM of each seed's area under its curve \(all\) = (\S+) \(1 seed: no confidence "
                     r"interval; run more seeds for one\)\nwrote .*\n", out)
    assert rc == 0 and m and err == "", (out, err)
    assert float(m.group(1)) == pytest.approx(float(np.max(score)), rel=1e-5)
    scores = robust.run_scores({"one": kinds.load_result(str(d))})  # plot --stat's robust.md and .csv rows
    (row,) = robust.rows(robust.interval_estimates({"one": scores["one"][:, None]}, "iqm", over="seeds"), "iqm",
                         {"one": 1}, "score")
    assert row["IQM"] == pytest.approx(float(m.group(1)), rel=1e-5) and row["IQM CI low"] is row["IQM CI high"] is None
