"""`bec-jax continuing`: the command on TwoChoice end to end (the files it
writes, its summary line against the saved result), `plot`, `compare` and
`list` on continuing runs, the config file, bad input (exit 2, one line naming
the field, nothing written), a task of the user's own as module:function, and
the command lines of docs/continuing.md and the README run as pasted. Tiny
sizes: each run compiles in about half a second."""
from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
import sys

import numpy as np
import pytest
from docs_blocks import code

from bec_jax.cli.commands import main
from bec_jax.control.continuing import learners, tasks
from bec_jax.control.continuing.plotting import setting
from bec_jax.control.continuing.results import ContinuingResult

TINY = ["continuing", "--task", "two_choice", "--algorithm", "q_vrc", "--alpha", "0.1,0.3", "--eta", "1",
        "--gamma", "1", "--seeds", "4", "--steps", "2000"]
LINE = re.compile(r"best by reward rate over the whole run: (.*)  reward rate over the last 10%: (\S+) "
                  r"\[(\S+), (\S+)\] \(95% CI\)(?:; optimal gain (\S+))?$")


def run_main(argv) -> tuple[int, str]:
    """(exit status, stdout) of `bec-jax ARGV` in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    return rc, out.getvalue()


def summary_match(stdout: str) -> re.Match:
    found = [m for m in map(LINE.match, stdout.splitlines()) if m]
    assert len(found) == 1, stdout
    return found[0]


def bec_jax_lines(block: str) -> list[list[str]]:
    """The `bec-jax` command lines of a bash block, continuations joined."""
    return [shlex.split(line)[1:] for line in block.replace("\\\n", " ").splitlines()
            if line.strip().startswith("bec-jax ")]


@pytest.fixture(scope="module")
def tc(tmp_path_factory):
    out = tmp_path_factory.mktemp("continuing") / "tc"
    rc, stdout = run_main(TINY + ["--out", str(out)])
    assert rc == 0, stdout
    return out, stdout


def test_writes_the_run_and_its_summary_line(tc):
    out, stdout = tc
    for name in ("curves.npz", "summary.json", "summary.csv", "meta.json"):
        assert (out / name).stat().st_size > 100, name
    r = ContinuingResult.load(str(out))
    assert r.reward.shape == (2, 4, 100) and r.q_table.shape == (2, 4, 9, 2)
    np.testing.assert_allclose(r.grid["alpha"], [0.1, 0.3])
    meta = json.load(open(out / "meta.json"))
    assert meta["spec"]["kind"] == "continuing" and meta["spec"]["gamma"] == 1.0
    m = summary_match(stdout)
    b = r.best_index("all")
    assert m.group(1) == setting(r, b)
    mean, low, high = (x[b] for x in r.rate_interval("last10"))
    for text, v in zip(m.groups()[1:4], (mean, low, high)):
        assert float(text) == pytest.approx(v, rel=1e-3, abs=1e-4)
    assert float(m.group(5)) == pytest.approx(0.4)
    recs = json.load(open(out / "summary.json"))
    assert recs[b]["reward_rate_last10"] == pytest.approx(mean, rel=1e-9)
    assert recs[b]["optimal_gain"] == pytest.approx(0.4)
    assert "two_choice / q_vrc: 2 grid points x 4 seeds x 2000 steps" in stdout


def test_config_file_gives_the_same_runs(tc, tmp_path):
    out, _ = tc
    cfg = tmp_path / "tc.toml"
    cfg.write_text('task = "two_choice"\nalgorithm = "q_vrc"\nalpha = [0.1, 0.3]\neta = 1\ngamma = 1.0\n'
                   f'seeds = 4\nsteps = 2000\nout = "{tmp_path / "from_toml"}"\n')
    rc, _ = run_main(["continuing", "--config", str(cfg)])
    assert rc == 0
    np.testing.assert_array_equal(ContinuingResult.load(str(tmp_path / "from_toml")).reward,
                                  ContinuingResult.load(str(out)).reward)


def test_plot_and_compare_take_a_continuing_run(tc, tmp_path):
    out, _ = tc
    rc, stdout = run_main(["plot", str(out), "--out", str(tmp_path / "plots"), "--metric", "last10"])
    assert rc == 0, stdout
    for name in ("curves.png", f"sensitivity_{out.name}.png", "table.md", "table.csv"):
        assert (tmp_path / "plots" / name).stat().st_size > 200, name
    assert "0.4" in (tmp_path / "plots" / "table.md").read_text()  # the optimal gain
    shutil.copytree(out, tmp_path / "again")
    rc, _ = run_main(["compare", str(out), str(tmp_path / "again"), "--labels", "a,b", "--out",
                      str(tmp_path / "cmp.png")])
    assert rc == 0 and (tmp_path / "cmp.png").stat().st_size > 1000


def test_list_shows_the_continuing_tasks_and_learners():
    _, text = run_main(["list", "continuing-tasks"])
    for n in tasks.names():
        assert f"\n  {n}(" in text, n
    assert "access_control(num_servers=10, priorities=[1, 2, 4, 8], free_probability=0.06)" in text
    _, text = run_main(["list", "continuing-algorithms"])
    for n in learners.names():
        assert f"\n  {n} (" in text, n
    assert "--eta: ratio of rbar's step size to alpha" in text


@pytest.mark.parametrize("args,field", [
    (["--task", "nope"], "task"),
    (["--task", "two_choice", "--task-param", "nope=3"], "nope"),
    (["--task", "access_control", "--task-param", "num_servers=0"], "num_servers"),
    (["--task-param", "gamma=0.9"], "gamma"),
    (["--gamma", "1.5"], "gamma"),
    (["--log-every", "30"], "steps"),
    (["--steps", "2005"], "steps"),
    (["--algorithm", "sarsa"], "algorithm"),
    (["--beta", "0.1"], "beta"),
    (["--offset", "nan"], "reward_offset"),
    (["--epsilon", "-0.1"], "epsilon"),
    (["--seeds", "0"], "seeds"),
])
def test_bad_input_exits_2_naming_the_field(args, field, tmp_path, capsys):
    given = dict(zip(args[::2], args[1::2]))
    base = dict(zip(TINY[1::2], TINY[2::2]))
    argv = ["continuing"]
    for k, v in {**base, **given}.items():
        argv += [k, v]
    out = tmp_path / "x"
    assert main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bec-jax: error: {field}"), err
    assert not out.exists()


BANDIT = '''
import jax
import jax.numpy as jnp

from bec_jax.control.continuing.env import ContinuingEnv, probability


def bandit(p=0.7):
    """One state, two arms with dense features: arm 0 pays 0.5, arm 1 pays 1 with probability p."""
    p = probability("p", p)

    def step(key, state, action):
        win = jax.random.uniform(key) < p
        return state, jnp.where(action == 1, win.astype(jnp.float32), jnp.float32(0.5))

    return ContinuingEnv(name="bandit", num_actions=2, num_features=2, num_active=0, params={"p": p},
                         reset=lambda key: jnp.int32(0), step=step,
                         features=lambda state: jnp.eye(2, dtype=jnp.float32))
'''


def test_a_task_of_your_own_from_module_function(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_continuing_bandit.py").write_text(BANDIT)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "bandit"
    base = ["continuing", "--task", "my_continuing_bandit:bandit", "--task-param", "p=0.9", "--algorithm", "q_src",
            "--alpha", "0.1", "--eta", "0.5", "--gamma", "0.9", "--offset", "-8,0", "--seeds", "4", "--steps", "1000"]
    rc, stdout = run_main(base + ["--out", str(out)])
    assert rc == 0, stdout
    m = summary_match(stdout)
    assert m.group(5) is None  # no model, no optimal gain
    r = ContinuingResult.load(str(out))
    assert r.optimal_gain is None and r.q_table is None
    np.testing.assert_array_equal(r.grid["reward_offset"], [-8.0, 0.0])
    assert r.reward_rate("last10").mean() > 0.75  # arm 1 (0.9) rather than arm 0 (0.5), offset removed
    assert main(base[:4] + ["p=2"] + base[5:] + ["--out", str(tmp_path / "y")]) == 2
    assert capsys.readouterr().err.strip() == "bec-jax: error: p: a probability in [0, 1], got 2"
    assert not (tmp_path / "y").exists()


def test_guide_own_task_runs_as_pasted(tmp_path, monkeypatch):
    """docs/continuing.md: its commute.py block saved as commute.py, then its
    command lines from that directory."""
    (tmp_path / "commute.py").write_text(code("docs/continuing.md", "python", containing="def commute"))
    lines = bec_jax_lines(code("docs/continuing.md", "bash", containing="commute:commute"))
    assert [a[0] for a in lines] == ["continuing", "plot"]
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("commute", None)
    try:
        for argv in lines:
            rc, stdout = run_main(argv)
            assert rc == 0, (argv, stdout)
    finally:
        sys.modules.pop("commute", None)
    r = ContinuingResult.load(str(tmp_path / "runs" / "commute"))
    assert r.optimal_gain == pytest.approx(0.125)  # (1 - slip) / n, moving beats waiting's 0.1
    assert r.num_points == 2 and r.seeds == 10
    assert (tmp_path / "runs" / "commute" / "plots" / "curves.png").is_file()


def test_readme_continuing_quickstart_runs_as_pasted(tmp_path, monkeypatch):
    lines = bec_jax_lines(code("README.md", "bash", containing="bec-jax continuing"))
    assert [a[0] for a in lines] == ["continuing"]
    monkeypatch.chdir(tmp_path)
    rc, stdout = run_main(lines[0])
    assert rc == 0, stdout
    m = summary_match(stdout)
    assert float(m.group(5)) == pytest.approx(0.4)
    r = ContinuingResult.load(str(tmp_path / "runs" / "tc"))
    assert r.rate_interval("last10")[0].max() > 0.35  # the better loop, 0.4 less exploration's cost
