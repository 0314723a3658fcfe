"""`--confirm-seeds N` on every front (`bec_jax.run.confirm`): after an
episodic control sweep, a continuing sweep and a study of both, the chosen
point runs again on N fresh seeds. Checked against direct runs of that point
with `seed_offset` = the selection's seeds (bit for bit: the same program on
the same machine), the seed streams (a longer run's first seeds are the
selection's, its last the confirmation's), hand-computed Student-t intervals,
the printed line, the choice ignoring NaN points (a search's points stopped
early), the submission's assembling job, and bad input (one line naming
confirm_seeds, exit 2, nothing written). Tiny sizes: the sweeps of
test_control_study.py and test_continuing_cli.py, whose programs a worker may
hold already; the direct runs reuse the confirmations' programs."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shlex
import stat

import numpy as np
import pytest
from scipy import stats

from bec_jax.cli.commands import main
from bec_jax.control import sweep as control_sweep
from bec_jax.control.continuing import sweep as continuing_sweep
from bec_jax.control.continuing.results import ContinuingResult
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.control.results import ControlResult
from bec_jax.control.spec import ControlSpec
from bec_jax.prediction.results import SweepResult
from bec_jax.run import confirm

CTL = ["control", "--algorithm", "q", "--alpha", "0.1,0.5", "--task", "cliff_walking", "--episodes", "20",
       "--seeds", "2", "--epsilon", "0.1"]
CONT = ["continuing", "--task", "two_choice", "--algorithm", "q_vrc", "--alpha", "0.1,0.3", "--eta", "1",
        "--gamma", "1", "--seeds", "4", "--steps", "2000"]
STUDY = """
[[sweep]]
name = "q"
kind = "control"
task = "cliff_walking"
algorithm = "q"
alpha = [0.1, 0.5]
episodes = 20
seeds = 2
epsilon = 0.1

[[sweep]]
name = "vrc"
kind = "continuing"
task = "two_choice"
algorithm = "q_vrc"
alpha = [0.1, 0.3]
eta = 1
gamma = 1
seeds = 4
steps = 2000
"""
NUM = r"(-?[\d.e+-]+)"
# "<label> X [LO, HI]" in a line of `confirm.confirm_line`.
QUOTE = NUM + r" \[" + NUM + ", " + NUM + r"\]"


def run_main(argv) -> tuple[int, str]:
    """(exit status, stdout) of `bec-jax ARGV` in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    return rc, out.getvalue()


def t_ci(values) -> list[float]:
    """scipy's 95% Student-t interval of the mean of per-seed values."""
    v = np.asarray(values, float)
    return list(stats.t.interval(0.95, len(v) - 1, loc=v.mean(), scale=stats.sem(v)))


def confirm_lines(stdout: str) -> list[str]:
    return [x.strip() for x in stdout.splitlines() if x.strip().startswith("confirmed")]


@pytest.fixture(scope="module")
def ctl(tmp_path_factory):
    out = tmp_path_factory.mktemp("confirm") / "ctl"
    rc, stdout = run_main(CTL + ["--out", str(out), "--confirm-seeds", "3"])
    assert rc == 0, stdout
    return out, stdout


@pytest.fixture(scope="module")
def cont(tmp_path_factory):
    out = tmp_path_factory.mktemp("confirm") / "cont"
    rc, stdout = run_main(CONT + ["--out", str(out), "--confirm-seeds", "3"])
    assert rc == 0, stdout
    return out, stdout


# ------------------------------------------------------------------ episodic control

def test_control_confirmation_is_a_direct_run_of_the_best_point_on_fresh_seeds(ctl):
    out, stdout = ctl
    sel = ControlResult.load(str(out))
    again = ControlResult.load(str(out / "confirm"))
    rep = json.load(open(out / "confirm.json"))
    # The best by mean return per episode, recomputed from the saved arrays.
    b = int(np.argmax(sel.returns.astype(float).mean(-1).mean(-1)))
    assert sel.valid.all() and rep["point"] == {"alpha": [0.1, 0.5][b]} and rep["metric"] == "return"
    assert (rep["kind"], rep["higher_is_better"], rep["run"]) == ("control", True, "confirm")
    # The direct run of that point on streams 2-4 is the confirmation, bit for bit.
    spec = ControlSpec(task="cliff_walking", algorithm="q", hyperparameters={"alpha": [0.1, 0.5][b]}, seeds=3,
                       episodes=20, epsilon=0.1, seed_offset=2)
    assert again.spec_dict == spec.to_dict() and again.spec_dict["seed_offset"] == 2
    direct = control_sweep.run(spec)
    for k in ("returns", "lengths", "diverged_step"):
        np.testing.assert_array_equal(getattr(again, k), getattr(direct, k), err_msg=k)
    # Disjoint streams: a run of five seeds from stream 0 has the selection's two first, the confirmation's last.
    five = control_sweep.run(ControlSpec.from_dict({**spec.to_dict(), "seeds": 5, "seed_offset": 0}))
    np.testing.assert_array_equal(five.returns[0, :2], sel.returns[b])
    np.testing.assert_array_equal(five.returns[0, 2:], direct.returns[0])
    assert not np.array_equal(direct.returns[0, :2], sel.returns[b])
    assert rep["selection"]["seed_streams"] == [0, 1] and rep["confirmation"]["seed_streams"] == [2, 4]
    # confirm.json's numbers are the direct run's summary and hand-computed intervals over its seeds.
    c, s, rec = rep["confirmation"], rep["selection"], direct.summary()[0]
    per_seed = direct.returns[0].astype(float).mean(-1)
    assert c["seeds"] == 3 and c["score"] == pytest.approx(per_seed.mean(), rel=1e-12)
    assert c["score_ci95"] == pytest.approx(t_ci(per_seed), rel=1e-9)
    assert c["auc_return"] == rec["auc_return"] and c["auc_return_ci95"] == [rec["auc_return_ci_low"],
                                                                            rec["auc_return_ci_high"]]
    last = direct.returns[0, :, -2:].astype(float).mean(-1)  # the last 10% of 20 episodes
    assert c["final_return"] == pytest.approx(last.mean()) and c["final_return_ci95"] == pytest.approx(t_ci(last))
    assert c["auc_length"] == pytest.approx(direct.lengths[0].mean())
    assert s["auc_return"] == sel.summary()[b]["auc_return"] and s["seeds"] == 2
    # The printed line quotes the fresh numbers as the result, the selection's as selection only.
    line, = confirm_lines(stdout)
    m = re.fullmatch(rf"confirmed on 3 fresh seeds \(streams 2-4\): alpha={[0.1, 0.5][b]:g}: return per episode "
                     rf"{QUOTE}, last 10% of episodes {QUOTE}; selection runs \(streams 0-1, selection only\): "
                     rf"return per episode {QUOTE}, last 10% of episodes {QUOTE}; 95% intervals; wrote "
                     rf"{re.escape(str(out))}/confirm.json, {re.escape(str(out))}/confirm/", line)
    assert m, line
    want = [c["auc_return"], *c["auc_return_ci95"], c["final_return"], *c["final_return_ci95"],
            s["auc_return"], *s["auc_return_ci95"], s["final_return"], *s["final_return_ci95"]]
    assert [float(x) for x in m.groups()] == [float(f"{v:.4g}") for v in want]


def test_control_seed_offset_is_checked_and_left_out_of_the_dict_at_zero():
    spec = ControlSpec(task="cliff_walking", algorithm="q", hyperparameters={"alpha": 0.1}, seeds=2, episodes=2)
    assert "seed_offset" not in spec.to_dict()  # the saved specs and programs of earlier sweeps are unchanged
    for bad in (-1, 0.5, 2**31 - 2):
        with pytest.raises(ValueError, match=r"^seed_offset: "):
            dataclasses.replace(spec, seed_offset=bad)


# ------------------------------------------------------------------ continuing control

def test_continuing_confirmation_is_a_direct_run_of_the_best_point_on_fresh_seeds(cont):
    out, stdout = cont
    sel = ContinuingResult.load(str(out))
    again = ContinuingResult.load(str(out / "confirm"))
    rep = json.load(open(out / "confirm.json"))
    b = int(np.argmax(sel.reward.astype(float).mean(-1).mean(-1)))  # the highest reward rate over the run
    assert rep["point"] == sel.point(b) and rep["metric"] == "all" and rep["kind"] == "continuing"
    spec = ContinuingSpec(task="two_choice", algorithm="q_vrc", hyperparameters={"alpha": [0.1, 0.3][b], "eta": 1},
                          gamma=1.0, seeds=3, steps=2000, seed_offset=4)
    direct = continuing_sweep.run(spec)
    for k in ("reward", "rate_estimate", "max_abs_w", "q_table"):
        np.testing.assert_array_equal(getattr(again, k), getattr(direct, k), err_msg=k)
    assert again.spec_dict["seed_offset"] == 4 and again.seeds == 3
    assert rep["selection"]["seed_streams"] == [0, 3] and rep["confirmation"]["seed_streams"] == [4, 6]
    c, s = rep["confirmation"], rep["selection"]
    whole = direct.reward[0].astype(float).mean(-1)
    last10 = direct.reward[0, :, -10:].astype(float).mean(-1)  # 100 log blocks
    assert c["reward_rate_all"] == pytest.approx(whole.mean(), rel=1e-12) == c["score"]
    assert c["reward_rate_all_ci95"] == pytest.approx(t_ci(whole), rel=1e-9)
    assert c["reward_rate_last10"] == pytest.approx(last10.mean(), rel=1e-12)
    assert c["reward_rate_last10_ci95"] == pytest.approx(t_ci(last10), rel=1e-9)
    rec = direct.summary()[0]
    assert c["optimal_gain"] == rec["optimal_gain"] and c["gap_last10"] == rec["gap_last10"]
    assert s["reward_rate_all"] == sel.summary()[b]["reward_rate_all"]
    line, = confirm_lines(stdout)
    m = re.fullmatch(r"confirmed on 3 fresh seeds \(streams 4-6\): (.*): reward rate over the whole run "
                     rf"{QUOTE}, last 10% {QUOTE}; selection runs \(streams 0-3, selection only\): reward rate "
                     rf"over the whole run {QUOTE}, last 10% {QUOTE}; 95% intervals; wrote .*/confirm.json, "
                     r".*/confirm/", line)
    assert m and m.group(1).startswith(f"alpha={[0.1, 0.3][b]:g}, eta=1"), line
    want = [c["reward_rate_all"], *c["reward_rate_all_ci95"], c["reward_rate_last10"], *c["reward_rate_last10_ci95"],
            s["reward_rate_all"], *s["reward_rate_all_ci95"], s["reward_rate_last10"], *s["reward_rate_last10_ci95"]]
    assert [float(x) for x in m.groups()[1:]] == [float(f"{v:.4g}") for v in want]


# ------------------------------------------------------------------ a study

def test_a_study_confirms_each_sweeps_best_as_its_own_command_does(ctl, cont, tmp_path):
    (tmp_path / "s.toml").write_text(STUDY)
    rc, stdout = run_main(["study", str(tmp_path / "s.toml"), "--out", str(tmp_path / "st"), "--confirm-seeds", "3"])
    assert rc == 0, stdout
    lines = confirm_lines(stdout)
    assert len(lines) == 2 and lines[0].startswith("confirmed on 3 fresh seeds (streams 2-4): alpha=")
    assert lines[1].startswith("confirmed on 3 fresh seeds (streams 4-6): alpha=")
    for name, (out, _) in (("q", ctl), ("vrc", cont)):
        mine, theirs = json.load(open(tmp_path / "st" / name / "confirm.json")), json.load(open(out / "confirm.json"))
        assert mine == theirs, name
        a, b = np.load(tmp_path / "st" / name / "confirm" / "curves.npz"), np.load(out / "confirm" / "curves.npz")
        for k in b.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{name}/{k}")


# ------------------------------------------------------------------ the choice skips NaN points

def test_the_choice_ignores_points_whose_score_is_nan(ctl, cont):
    sel = ControlResult.load(str(ctl[0]))
    b = confirm.choices(sel)[0][1]
    stopped = dataclasses.replace(sel, returns=sel.returns.astype(float))
    stopped.returns[b, :, 10:] = np.nan  # a search's point stopped early: NaN after its last rung
    assert confirm.choices(stopped, "return") == [({}, 1 - b)]
    r = ContinuingResult.load(str(cont[0]))
    b = confirm.choices(r, "all")[0][1]
    r.reward[b, :, 50:] = np.nan
    assert confirm.choices(r, "all") == [({}, 1 - b)]
    # A prediction sweep's lowest area: np.argmin alone would return the NaN point.
    G, L = 3, 4
    mean = np.array([[[np.nan] * L, [0.5] * L, [0.9] * L]])
    pred = SweepResult(spec=None, steps=np.arange(L), grid={"alpha": np.array([0.1, 0.2, 0.3])}, mean=mean,
                       std=np.zeros_like(mean), sem=np.zeros_like(mean), alive=np.full((G, L), 2),
                       final=np.ones((1, G, 2)), diverged_step=np.full((G, 2), -1),
                       spec_dict={"env": "e", "algorithm": "td", "metrics": ["rmsve"]})
    assert pred.best_index() == 1 and confirm.choices(pred) == [({}, 1)]


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("argv,start", [
    (["--confirm-seeds", "0"], "confirm_seeds: at least 2 seeds (for an interval), got 0"),
    (["--confirm-seeds", "1"], "confirm_seeds: at least 2 seeds (for an interval), got 1"),
    (["--confirm-seeds", "2147483646"], "confirm_seeds: 2147483646 fresh seeds after streams 0-1 pass the last stream"),
    (["--confirm-seeds", "x"], "confirm_seeds: expected an integer"),
    (["--chunks", "1/2", "--confirm-seeds", "3"], "confirm_seeds: a part computes chunks only"),
])
@pytest.mark.parametrize("command", ["control", "continuing", "study"])
def test_bad_confirm_seeds_is_one_line_and_nothing_is_written(command, argv, start, tmp_path, capsys):
    (tmp_path / "s.toml").write_text(STUDY)
    base = {"control": CTL, "continuing": CONT, "study": ["study", str(tmp_path / "s.toml")]}[command]
    if command == "continuing":
        start = start.replace("streams 0-1", "streams 0-3")
    if command == "study" and "fresh seeds after" in start:
        start = "confirm_seeds: sweep 'q': 2147483646 fresh seeds after streams 0-1 pass the last stream"
    if command == "study" and "--chunks" in argv:
        start = "chunks: a part only computes its share of the chunks"
    out = tmp_path / "out"
    assert main(base + ["--out", str(out)] + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bec-jax: error: {start}"), err
    assert not out.exists()


def test_confirm_refuses_too_few_seeds_and_the_stream_limit_in_python(ctl):
    r = ControlResult.load(str(ctl[0]))
    for seeds, msg in ((1, "at least 2 seeds"), (True, "at least 2 seeds"), (2**31 - 2, "pass the last stream")):
        with pytest.raises(ValueError, match=rf"^confirm_seeds: .*{msg}"):
            confirm.confirm(r, "unused", seeds)
    assert not os.path.exists("unused")


# ------------------------------------------------------------------ a submission

def test_a_control_submission_confirms_in_its_assembling_job(tmp_path, monkeypatch, capsys):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "calls.txt"
    for name, body in (("sbatch", f'echo "sbatch $*" >> {calls}\necho $((100 + $(grep -c ^sbatch {calls})))'),
                       ("squeue", "exit 0")):  # stand-ins that record what they are given
        tool = bin_ / name
        tool.write_text(f"#!/bin/bash\n{body}\n")
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    assert main(CTL + ["--out", "bad", "--confirm-seeds", "2147483646", "--submit", "slurm", "--parts", "2"]) == 2
    assert "confirm_seeds: 2147483646 fresh seeds" in capsys.readouterr().err and not os.path.exists("bad")
    assert main(CTL + ["--out", "x", "--confirm-seeds", "4", "--submit", "slurm", "--parts", "2"]) == 0
    parts = (tmp_path / "x/slurm/parts.sh").read_text().splitlines()[-1]
    assert "--confirm-seeds" not in parts and "--chunks" in parts
    last = shlex.split((tmp_path / "x/slurm/assemble.sh").read_text().splitlines()[-1])
    assert last[3:] == ["bec_jax", "control", "--out", "x", "--resume", "--confirm-seeds", "4"]
