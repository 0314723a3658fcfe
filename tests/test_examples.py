"""Each script of examples/ runs, and what it prints and returns is checked against
closed forms or an independent path to the same numbers."""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
SCRIPTS = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py") and f != "gridworld.py")


def _load(name: str):
    """The example module `name`, imported from its file (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"bec_jax_example_{name}", os.path.join(EXAMPLES, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("script", SCRIPTS)
def test_examples_are_short_documented_scripts(script):
    with open(os.path.join(EXAMPLES, script)) as f:
        text = f.read()
    tree = ast.parse(text)
    assert len(text.splitlines()) <= 90, script  # "short": about 80 lines
    assert ast.get_docstring(tree) and f"examples/{script}" in ast.get_docstring(tree)
    assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
    assert 'if __name__ == "__main__":' in text
    assert set(SCRIPTS) == {"centered_ppo_critic.py", "gymnax_control.py", "study_to_pandas.py",
                            "sweep_your_mdp.py"}


def test_sweep_your_mdp(capsys):
    from bec_jax import algorithms, envs
    from bec_jax.theory import expected_updates as analysis
    ex = _load("sweep_your_mdp")
    try:
        out = ex.main()
        printed = capsys.readouterr().out
        env = envs.make("ring")
        # c scales theta's step: the exact expected update at c = 2 is CTD's at alpha = 2.
        G_mine, g_mine = analysis.expected_update(env, ex.SCALED_CTD, {"alpha": 1.0, "beta": 1.0, "c": 2.0})
        G_ctd, g_ctd = analysis.expected_update(env, "ctd", {"alpha": 2.0, "beta": 1.0})
    finally:
        envs.REGISTRY.pop("ring", None)
        algorithms._REGISTRY.pop("scaled_ctd", None)
    np.testing.assert_allclose(G_mine, G_ctd, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g_mine, g_ctd, rtol=1e-12, atol=1e-12)
    mine = {(r["alpha"], r["c"]): r for r in out["scaled_ctd"]}
    ctd = {r["alpha"]: r for r in out["ctd"]}
    td = {r["alpha"]: r for r in out["td"]}
    for a in (0.01, 0.1):
        # c = 1 is CTD: alpha * 1.0 is alpha exactly, and the two ran in one program on the same transitions;
        # a relative 1e-6 allows for XLA fusing the two updates' arithmetic differently.
        assert mine[(a, 1.0)]["final_mean"] == pytest.approx(ctd[a]["final_mean"], rel=1e-6)
        # TD's features have no constant: the reward offset 5 stays in its centered error, CTD's does not.
        assert td[a]["final_mean"] > 10 * ctd[a]["final_mean"]
    big = mine[(0.1, 30.0)]
    assert big["diverged_fraction"] == 1.0 and big["final_mean"] is None and big["exact_verdict"] == "diverges in mean"
    others = [r for k, r in mine.items() if k != (0.1, 30.0)] + out["ctd"] + out["td"]
    assert all(r["diverged_fraction"] == 0.0 and r["exact_verdict"] == "stable in mean square" for r in others)
    assert printed.count("final RMSCBE") == 8 and "diverged 1.00  exact: diverges in mean" in printed


@pytest.mark.long
def test_gymnax_control(capsys):
    pytest.importorskip("gymnax")
    out = _load("gymnax_control").main(episodes=20, seeds=2)
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed] == ["q", "q", "cq", "cq"]
    for name, (result, summary) in out.items():
        ret, length = result.values("return"), result.values("length")
        done = np.isfinite(length)
        assert done.all() and result.diverged_fraction.max() == 0.0
        # CartPole pays +1 a step: every episode's return is its length, between the fewest steps the pole
        # can fall in and the 500-step time limit.
        np.testing.assert_array_equal(ret[done], length[done])
        assert 8 <= length.min() and length.max() <= 500
        for i, rec in enumerate(summary):
            per_seed = np.nanmean(ret[i], axis=-1)
            assert rec["auc_return"] == pytest.approx(per_seed.mean(), rel=1e-6)
            assert f"{rec['auc_return']:7.1f}" in printed[len(summary) * (name == "cq") + i]


@pytest.mark.long
def test_centered_ppo_critic(capsys):
    pytest.importorskip("gymnax")
    beta = 0.1
    m = {k: np.asarray(v, np.float64) for k, v in _load("centered_ppo_critic").main(beta=beta, num_updates=12).items()}
    assert "omega" in capsys.readouterr().out
    # omega moves once per rollout towards the mean uncentered TD error: the recursion, in NumPy.
    omega, want = 0.0, []
    for d in m["mean_td_error"]:
        omega += beta * (d - omega)
        want.append(omega)
    np.testing.assert_allclose(m["omega"], want, rtol=1e-4, atol=1e-6)  # float32 means of 256 errors
    assert m["omega"][-1] > 0.2  # CartPole's reward 1 against a critic that starts near 0
    finished = m["episodes"] > 0
    assert finished.sum() >= 10 and (m["return"][finished] >= 8).all()


@pytest.mark.long
def test_study_to_pandas_as_a_script(tmp_path):
    pytest.importorskip("pandas")
    from bec_jax.prediction.results import SweepResult
    from bec_jax.run import study
    out = str(tmp_path / "study")
    r = subprocess.run([sys.executable, "examples/study_to_pandas.py", out], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # 2 sweeps x 2 grid points x 2 metrics x 11 logged steps (0, 100, ..., 1000).
    assert "88 rows; columns: sweep, env, algorithm, alpha, metric, step, mean" in r.stdout
    frame = study.load_frame(out)
    last = frame[(frame.step == 1000) & (frame.metric == "rmscbe")]
    for sweep in ("td", "ctd"):
        res = SweepResult.load(os.path.join(out, sweep))
        got = last[last.sweep == sweep].sort_values("alpha")["mean"].to_numpy()
        np.testing.assert_array_equal(got, res.final_mean("rmscbe"))  # the frame is the saved curves
        best = res.grid["alpha"][np.argmin(res.final_mean("rmscbe"))]
        assert re.search(rf"^ *{sweep} +{best:g} +{got.min():.4f} ", r.stdout, re.M), r.stdout
