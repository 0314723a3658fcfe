"""Control runs in studies, `bec-jax compare` and `bec-jax plot`, and a user's
own control algorithm (`--algorithm package.module:attribute`) from the command
line and TOML, checked by reading the files the commands write and recomputing
their numbers from the saved arrays."""
import csv
import json
import os

import numpy as np
import pytest
from scipy import stats

from bec_jax.cli.commands import main
from bec_jax.control.results import ControlResult

# Tiny: cliff_walking, 20 episodes, 2 seeds (about a second each, compile included).
BASE = ["--task", "cliff_walking", "--episodes", "20", "--seeds", "2", "--epsilon", "0.1"]
Q = ["control", "--algorithm", "q", "--alpha", "0.1,0.5"] + BASE
CQ = ["control", "--algorithm", "cq", "--alpha", "0.5", "--beta", "0.0001,0.01"] + BASE
TD = ["run", "--env", "two_state", "--algorithm", "td", "--alpha", "0.1,0.2", "--steps", "20", "--log-every",
      "5", "--seeds", "2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name, argv in (("q", Q), ("cq", CQ), ("td", TD)):
        assert main(argv + ["--out", str(root / name)]) == 0
    return root


def _ci(values):
    """(mean, low, high) of per-seed values: scipy's Student-t interval (of
    zero width where the seeds agree: scipy's is NaN there)."""
    v = np.asarray(values, float)
    if v.std() == 0:
        return v.mean(), v.mean(), v.mean()
    lo, hi = stats.t.interval(0.95, len(v) - 1, loc=v.mean(), scale=stats.sem(v))
    return v.mean(), lo, hi


def _best(z, stat):
    """The best grid point recomputed from curves.npz: the highest mean return
    (or the fewest steps) per episode, over points whose every run is valid."""
    v = z["returns" if stat == "return" else "lengths"].astype(float)
    auc = v.mean(-1).mean(-1)
    return int(np.argmax(auc) if stat == "return" else np.argmin(auc))


def _smooth(y, w=2):  # `smoothing_window` of a 20-episode run
    c = np.cumsum(np.insert(y, 0, 0.0))
    n = np.arange(1, len(y) + 1)
    lo = np.maximum(n - w, 0)
    return (c[n] - c[lo]) / (n - lo)


# ------------------------------------------------------------------ compare

def test_compare_draws_each_runs_best_return_curve(runs, tmp_path, capsys):
    out = tmp_path / "cmp.png"
    assert main(["compare", str(runs / "q"), str(runs / "cq"), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from bec_jax.run import figures
    fig = figures.compare_figure({"q": ControlResult.load(str(runs / "q")),
                                  "cq": ControlResult.load(str(runs / "cq"))})
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    assert [ln.get_label().split(" (")[0] for ln in lines] == ["q", "cq"]
    for ln, name in zip(lines, ("q", "cq")):
        z = np.load(runs / name / "curves.npz")
        b = _best(z, "return")
        np.testing.assert_allclose(ln.get_ydata(), _smooth(z["returns"][b].mean(0)), rtol=1e-9)
        assert f"α={z['grid_alpha'][b]:g}" in ln.get_label()
    assert "return per episode" in ax.get_ylabel()


def test_compare_steps_per_episode_with_labels_and_select(runs, tmp_path):
    from bec_jax.run import figures
    r = ControlResult.load(str(runs / "cq"))
    fig = figures.compare_figure({"mine": r}, metric="length", select={"beta": 0.01})
    ln, = [ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")]
    z = np.load(runs / "cq" / "curves.npz")
    i = int(np.flatnonzero(np.isclose(z["grid_beta"], 0.01))[0])
    np.testing.assert_allclose(ln.get_ydata(), _smooth(z["lengths"][i].mean(0)), rtol=1e-9)
    assert main(["compare", str(runs / "q"), str(runs / "cq"), "--labels", "Q,CQ", "--metric", "length",
                 "--out", str(tmp_path / "c.png")]) == 0


@pytest.mark.parametrize("argv,field", [
    (["q", "td"], "dirs"),
    (["q", "--metric", "rmsve"], "metric"),
    (["q", "--select", "alpha=0.3"], "select"),
])
def test_compare_refuses_with_one_line(runs, tmp_path, capsys, argv, field):
    out = tmp_path / "x.png"
    dirs = [str(runs / a) if a in ("q", "cq", "td") else a for a in argv]
    assert main(["compare", *dirs, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bec-jax: error: {field}: "), err
    assert not out.exists()


# ------------------------------------------------------------------ plot's table

def test_plot_writes_the_control_table_with_t_intervals(runs, tmp_path):
    out = tmp_path / "plots"
    assert main(["plot", str(runs / "q"), str(runs / "cq"), "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "table.csv")))
    assert [r["sweep"] for r in rows] == ["q", "cq"]
    md = (out / "table.md").read_text()
    for row in rows:
        z = np.load(runs / row["sweep"] / "curves.npz")
        b = _best(z, "return")
        assert row["task"] == "cliff_walking" and int(row["seeds"]) == 2 and row["best_by"] == "return"
        assert row["setting"] == ", ".join(f"{k[5:]}={z[k][b]:g}" for k in z.files if k.startswith("grid_"))
        for stat, arr in (("return", z["returns"].astype(float)), ("length", z["lengths"].astype(float))):
            for kind, per_seed in (("auc", arr[b].mean(-1)), ("final", arr[b][:, -2:].mean(-1))):
                mean, lo, hi = _ci(per_seed)
                name = f"{kind}_{stat}"
                assert float(row[name]) == pytest.approx(mean, rel=1e-9), name
                assert float(row[f"{name}_ci_low"]) == pytest.approx(lo, rel=1e-9), name
                assert float(row[f"{name}_ci_high"]) == pytest.approx(hi, rel=1e-9), name
        assert f"| {row['sweep']} |" in md and f"{float(row['auc_return']):.4g}" in md
    for f in ("curves.png", "sensitivity.png"):
        assert (out / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_metric_length_chooses_by_steps(runs, tmp_path):
    out = tmp_path / "plots"
    assert main(["plot", str(runs / "q"), "--metric", "length", "--out", str(out)]) == 0
    row, = csv.DictReader(open(out / "table.csv"))
    z = np.load(runs / "q" / "curves.npz")
    b = _best(z, "length")
    assert row["best_by"] == "length" and row["setting"] == f"alpha={z['grid_alpha'][b]:g}"


# ------------------------------------------------------------------ studies

STUDY = """
seeds = 2            # every sweep's
episodes = 20        # the control sweeps'
steps = 20           # the prediction sweeps'
log_every = 5

[[sweep]]
name = "td"
env = "two_state"
algorithm = "td"
alpha = [0.1, 0.2]

[[sweep]]
name = "q"
kind = "control"
task = "cliff_walking"
algorithm = "q"
epsilon = 0.1
alpha = [0.1, 0.5]

[[sweep]]
name = "cq"
kind = "control"
task = "cliff_walking"
algorithm = "cq"
epsilon = 0.1
alpha = 0.5
beta = [0.0001, 0.01]
"""


@pytest.fixture(scope="module")
def mixed_study(runs, tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    (root / "s.toml").write_text(STUDY)
    assert main(["study", str(root / "s.toml"), "--out", str(root / "out")]) == 0
    return root


def test_a_study_runs_control_and_prediction_sweeps(runs, mixed_study):
    out = mixed_study / "out"
    st = json.load(open(out / "study.json"))
    assert st["status"] == {"td": "done", "q": "done", "cq": "done"}
    assert st["sweeps"][1]["spec"]["kind"] == "control" and "kind" not in st["sweeps"][0]["spec"]
    for name in ("q", "cq", "td"):  # each sweep is what its own command writes, bit for bit
        a, b = np.load(out / name / "curves.npz"), np.load(runs / name / "curves.npz")
        assert a.files == b.files
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{name}/{k}")


def test_a_study_resumes_without_running_a_finished_control_sweep(mixed_study, capsys):
    out = mixed_study / "out"
    before = (out / "q" / "curves.npz").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["study", str(mixed_study / "s.toml"), "--out", str(out), "--resume"]) == 0
    text = capsys.readouterr().out
    assert "q: finished earlier, not run again" in text and "cq: finished earlier" in text
    assert (out / "q" / "curves.npz").stat().st_mtime_ns == before


def test_plot_and_frame_of_a_mixed_study(mixed_study):
    out = mixed_study / "out"
    assert main(["plot", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "plots" / "table.csv")))
    assert [r["sweep"] for r in rows] == ["td", "q", "cq"]
    md = (out / "plots" / "table.md").read_text()
    assert md.count("| sweep |") == 2  # one table per kind: their columns differ
    from bec_jax.run.study import load_frame
    df = load_frame(str(out))
    assert set(df["sweep"]) == {"td", "q", "cq"}
    q = df[(df.sweep == "q") & (df.stat == "return")]
    z = np.load(out / "q" / "curves.npz")
    assert len(q) == 2 * 20
    np.testing.assert_allclose(q["mean"].to_numpy().reshape(2, 20), z["returns"].mean(1), rtol=1e-12)
    lo = q["ci_low"].to_numpy().reshape(2, 20)[1, 3]
    assert lo == pytest.approx(_ci(z["returns"][1, :, 3])[1], rel=1e-9)


def test_a_mixed_study_in_two_parts_assembles_to_the_same_files(mixed_study, tmp_path):
    out = tmp_path / "parts"
    for part in ("1/2", "2/2"):
        assert main(["study", str(mixed_study / "s.toml"), "--out", str(out), "--chunks", part]) == 0
    assert main(["study", "--out", str(out), "--resume"]) == 0  # the study saved in --out, no file
    for name in ("td", "q", "cq"):
        a, b = np.load(out / name / "curves.npz"), np.load(mixed_study / "out" / name / "curves.npz")
        for k in b.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{name}/{k}")


def test_confirm_seeds_past_the_last_stream_are_refused_before_any_work(mixed_study, tmp_path, capsys):
    out = tmp_path / "c"  # every kind confirms (tests/test_confirm.py); the first sweep names the limit
    assert main(["study", str(mixed_study / "s.toml"), "--out", str(out), "--confirm-seeds", "2147483646"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bec-jax: error: confirm_seeds: sweep 'td': "), err
    assert not out.exists()


@pytest.mark.parametrize("change,field", [
    (("episodes = 20", "episdoes = 20"), "episdoes"),           # a shared key no sweep takes
    (('kind = "control"\ntask', 'kind = "contrl"\ntask'), "sweep[1] (q): kind"),
    (("alpha = [0.1, 0.5]", "alpha = [0.1, -0.5]"), "sweep[1] (q): alpha"),
    (("beta = [0.0001, 0.01]", "gamma_typo = 1"), "sweep[2] (cq): gamma_typo"),
])
def test_a_bad_control_sweep_is_refused_before_any_work(tmp_path, capsys, change, field):
    (tmp_path / "s.toml").write_text(STUDY.replace(*change, 1))
    assert main(["study", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bec-jax: error: {field}"), err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ a user's own algorithm

def test_a_users_algorithm_from_the_command_line_and_toml(runs, tmp_path):
    """tests/control_user_algorithm.py's MY_Q is `q` with its step size named eta."""
    ref = np.load(runs / "q" / "curves.npz")
    cli = tmp_path / "cli"
    assert main(["control", "--algorithm", "control_user_algorithm:MY_Q", "--eta", "0.1,0.5", *BASE,
                 "--out", str(cli)]) == 0
    (tmp_path / "c.toml").write_text('task = "cliff_walking"\nalgorithm = "control_user_algorithm:MY_Q"\n'
                                     'episodes = 20\nseeds = 2\nepsilon = 0.1\neta = [0.1, 0.5]\n')
    toml = tmp_path / "toml"
    assert main(["control", "--config", str(tmp_path / "c.toml"), "--out", str(toml)]) == 0
    for out in (cli, toml):
        z = np.load(out / "curves.npz")
        np.testing.assert_array_equal(z["grid_eta"], ref["grid_alpha"])
        for k in ("returns", "lengths", "diverged_step"):
            np.testing.assert_array_equal(z[k], ref[k], err_msg=k)
        assert json.load(open(out / "meta.json"))["spec"]["algorithm"] == "control_user_algorithm:MY_Q"


@pytest.mark.parametrize("argv,field", [
    (["--algorithm", "q", "--eta", "0.1"], "eta"),
    (["--algorithm", "control_user_algorithm:MY_Q", "--alpha", "0.1"], "alpha"),
    (["--algorithm", "control_user_algorithm:MY_Q"], "eta"),
    (["--algorithm", "control_user_algorithm:NOPE", "--eta", "0.1"], "algorithm"),
    (["--algorithm", "control_user_algorithm:MY_Q", "--eta", "0.1,x"], "eta"),
])
def test_a_users_algorithm_bad_input_is_one_line(tmp_path, capsys, argv, field):
    out = tmp_path / "x"
    assert main(["control", *argv, *BASE, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bec-jax: error: {field}"), err
    assert not out.exists()


def test_the_readmes_mixed_study_is_valid():
    """The study with a control sweep of docs/sweeps.md: each shared default goes
    to the sweeps whose kind takes it."""
    import tomllib

    from docs_blocks import code

    from bec_jax.run import study
    block = code("docs/sweeps.md", "toml", containing='kind = "control"')
    st = study.from_dict(tomllib.loads(block))
    (n1, td), (n2, cq) = st.sweeps
    assert (n1, n2) == ("boyan-ctd", "cliff-cq")
    assert td.steps == 2000 and td.seeds == 10 and "episodes" not in td.to_dict()
    assert cq.episodes == 300 and cq.seeds == 10 and cq.hyperparameters == {"alpha": (0.1, 0.5), "beta": (1e-4, 1e-3)}


def test_the_worked_control_study_is_valid():
    """experiments/studies/centering_cliff.toml: every sweep a control sweep
    (a shared kind), the shared grid and behaviour in each."""
    from bec_jax.run import study
    path = os.path.join(os.path.dirname(__file__), os.pardir, "experiments", "studies", "centering_cliff.toml")
    st = study.load(path)
    assert st.names == ["cliff-q", "cliff-cq", "cliff-gq", "cliff-cgq"]
    for _, spec in st.sweeps:
        d = spec.to_dict()
        assert d["kind"] == "control" and d["task"] == "cliff_walking" and d["episodes"] == 1000
        assert d["epsilon_decay"] == 0.9992 and spec.hyperparameters["alpha"] == (0.05, 0.2, 1.0)
    assert [s.num_points for _, s in st.sweeps] == [3, 6, 9, 18]
