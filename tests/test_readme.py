"""The README's programs run as pasted."""
import os
import re
import subprocess
import sys
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def section_code(title: str, lang: str = "python") -> str:
    text = open(os.path.join(REPO, "README.md")).read()
    part = text[text.index(f"## {title}"):]
    part = part[:part.index("\n## ", 4)]
    blocks = re.findall(rf"```{lang}\n(.*?)```", part, re.S)
    assert blocks, f"no {lang} block in section {title!r}"
    return blocks[0]


def test_agent_program_runs_as_pasted(tmp_path):
    code = section_code("Use in your own agent")
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
    shown = tomllib.loads(section_code("Studies, statistics, many processes", "toml"))
    with open(os.path.join(REPO, "experiments", "studies", "centering_boyan.toml"), "rb") as f:
        worked = tomllib.load(f)
    sweeps = shown.pop("sweep")
    assert sweeps == worked.pop("sweep")[:len(sweeps)] and len(sweeps) == 2
    assert shown == worked


def test_control_program_runs_as_pasted(tmp_path):
    code = section_code("Control: centered Q-learning and Greedy-GQ")
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
    text = open(os.path.join(REPO, "README.md")).read()
    part = text[text.index("### PPO/A2C with centering"):]
    code = re.findall(r"```python\n(.*?)```", part, re.S)[0]
    (tmp_path / "recipe.py").write_text(code)
    p = subprocess.run([sys.executable, "recipe.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    m = re.search(r"advantages \(8,\), omega (-?[0-9.]+)", p.stdout)
    assert m, p.stdout
    # One update with beta = 0.01 from omega = 0: 0.01 x the mean TD error (rewards -1).
    assert -0.05 < float(m.group(1)) < 0.0
