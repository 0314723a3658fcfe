"""The programs of the README and the guides run as pasted."""
import os
import re
import subprocess
import sys
import tomllib

import numpy as np
import pytest
from docs_blocks import REPO
from docs_blocks import code as block


@pytest.mark.long
def test_agent_program_runs_as_pasted(tmp_path):
    code = block("docs/agents.md", "python", section="A centered TD loss for any network")
    assert "my_network_apply" not in code  # complete: nothing left for the reader to define
    (tmp_path / "agent.py").write_text(code)
    p = subprocess.run([sys.executable, "agent.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    m = re.search(r"omega = (-?[0-9.]+), centered value error = ([0-9.]+)", p.stdout)
    assert m, p.stdout
    # Centered TD learns the Boyan chain's values (-27.5 to -24.2) up to their constant.
    assert float(m.group(2)) < 0.1
    # omega estimates E[delta]: (1 - gamma) times the constant the network leaves out.
    assert -3.5 < float(m.group(1)) < -1.5


def test_study_file_shown_is_the_worked_study():
    shown = tomllib.loads(block("docs/sweeps.md", "toml", containing='name = "boyan-td"'))
    with open(os.path.join(REPO, "experiments", "studies", "centering_boyan.toml"), "rb") as f:
        worked = tomllib.load(f)
    sweeps = shown.pop("sweep")
    assert sweeps == worked.pop("sweep")[:len(sweeps)] and len(sweeps) == 2
    assert shown == worked


@pytest.mark.long
def test_control_program_runs_as_pasted(tmp_path):
    code = block("docs/control.md", "python", containing="ControlSpec(")
    code += ("\nrec = r.summary()[b]\n"
             "print(f\"best {r.point(b)} steps {rec['auc_length']:.3f} last {mean[-1]:.2f} valid {int(r.valid.sum())}\")\n")
    (tmp_path / "control.py").write_text(code)
    p = subprocess.run([sys.executable, "control.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    m = re.search(r"best \{'alpha': ([0-9.]+), 'beta': ([0-9.e-]+)\} steps ([0-9.]+) last ([0-9.]+) valid (\d+)",
                  p.stdout)
    assert m, p.stdout
    # Every run finished its 3000 episodes, and the greedy path is 13 steps long.
    assert int(m.group(5)) == 20
    assert 13.0 <= float(m.group(4)) < 14.0 and 13.0 < float(m.group(3)) < 20.0


def test_ppo_recipe_runs_as_pasted(tmp_path):
    recipe = block("README.md", "python", section="Quickstart 3: a centered critic in your PPO")
    assert recipe == block("docs/agents.md", "python", section="PPO/A2C with centering")  # one recipe, shown twice
    (tmp_path / "recipe.py").write_text(recipe)
    p = subprocess.run([sys.executable, "recipe.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    m = re.search(r"advantages \(8,\), omega (-?[0-9.]+)", p.stdout)
    assert m, p.stdout
    # One update with beta = 0.01 from omega = 0: 0.01 x the mean TD error (rewards -1).
    assert -0.05 < float(m.group(1)) < 0.0


def test_quickstart_sweep_runs_as_pasted(tmp_path):
    """The README's first quickstart: three sweeps in one program, each best point
    with its interval and exact verdict. The user's half-step TD is built-in TD at
    alpha = eta / 2, so its exact rate is TD's there (an independent computation)."""
    from bec_jax.theory import verdicts
    program = block("README.md", "python", section="Quickstart 1: sweep your MDP and your TD variant against CTD and TDC")
    (tmp_path / "quickstart.py").write_text(program)
    p = subprocess.run([sys.executable, "quickstart.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = re.findall(r"^(\w+) +(\{.*?\}) +final RMSCBE ([0-9.]+) \[([0-9.]+), ([0-9.]+)\] +exact: (\w+), rate ([-+0-9.e]+)$",
                      p.stdout, re.M)
    assert [r[0] for r in rows] == ["half_td", "ctd", "tdc"], p.stdout
    for name, point, mean, low, high, label, rate in rows:
        assert float(low) < float(mean) < float(high) and label == "stable", (name, mean, low, high, label)
    # The factory alone, from the program's own text (no registration in this process).
    ns = {}
    exec(program[:program.index("envs.register")], ns)
    eta = eval(rows[0][1])["eta"]
    want = verdicts.exact_for(ns["ring"](), "td", {"alpha": eta / 2})
    np.testing.assert_allclose(float(rows[0][6]), want.rate, rtol=0.06)  # printed to 2 digits
