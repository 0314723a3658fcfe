"""A user's update under the robbins_monro schedule: the engine resolves each
step size's schedule at the update counter, so the README's own pattern
(`td.update(state, tr, eta * c)`) gets numbers, never a schedule to multiply."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from docs_blocks import code

from bec_jax import algorithms, envs
from bec_jax.cli import commands as cli
from bec_jax.prediction import streams, sweep
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import SweepSpec
from bec_jax.theory import expected_updates as analysis
from bec_jax.theory import metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T0 = 100.0  # the CLI's default t0; eta's exponent defaults to 1 (it is not alpha, beta or zeta)
SIZES = dict(steps=1000, seeds=2, log_every=100)


@pytest.fixture
def mine(tmp_path, monkeypatch):
    """The `mine.py` of docs/your-algorithm.md, as printed there, importable as `mine`."""
    (tmp_path / "mine.py").write_text(code("docs/your-algorithm.md", "python", containing="# mine.py\n"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mine", raising=False)
    import mine as mod
    yield mod
    sys.modules.pop("mine", None)


def _spec(**kw):
    return SweepSpec(env="baird", algorithm="mine:SCALED_TD", eta=(0.001, 0.01), c=(1.0, 2.0),
                     schedule={"kind": "robbins_monro", "t0": T0}, **SIZES, **kw)


def numpy_td(spec: SweepSpec, seed: int, step0: float) -> np.ndarray:
    """theta after TD(0) in float64 NumPy with step size step0 * (t0 / (t + t0)) at
    update t = 0, 1, ..., on the sweep's own transitions of seed `seed`."""
    tr = jax.tree.map(np.asarray, streams.seed_transitions(spec, seed))
    theta = np.asarray(envs.make("baird").theta0, np.float64)
    for t in range(spec.steps):
        a = step0 * (T0 / (t + T0))
        delta = tr.reward[t] + tr.discount[t] * (theta @ tr.phi_next[t]) - theta @ tr.phi[t]
        theta = theta + a * tr.rho[t] * delta * tr.phi[t].astype(np.float64)
    return theta


def test_readme_scaled_td_under_robbins_monro_matches_numpy(mine):
    spec = _spec()
    r = sweep.run(spec, progress=False)
    assert list(r.grid) == ["eta", "c"] and (r.alive[:, -1] == spec.seeds).all()
    env = envs.make("baird")
    for g in range(len(r.grid["eta"])):
        step0 = float(r.grid["eta"][g]) * float(r.grid["c"][g])
        for n in range(spec.seeds):
            want = metrics.rmscbe(env, numpy_td(spec, n, step0))
            # The sweep runs in float32 (step size, TD error, theta, metric), the loop
            # in float64: they agree to float32 rounding grown over 1000 steps (seen:
            # at most 1.3e-6 relative). The schedule evaluated one count late is off
            # by 2.4e-4 to 4.5e-3 here, a constant step size by far more.
            np.testing.assert_allclose(r.final[0, g, n], want, rtol=3e-5)
    # The schedule really decays: a constant step size gives other numbers.
    const = sweep.run(SweepSpec(env="baird", algorithm="mine:SCALED_TD", eta=(0.001, 0.01), c=(1.0, 2.0),
                                **SIZES), progress=False)
    assert not np.allclose(const.final, r.final, rtol=1e-2)


def test_readme_scaled_td_equals_builtin_td_under_robbins_monro(mine):
    r = sweep.run(_spec(), progress=False)
    td = sweep.run(SweepSpec(env="baird", algorithm="td", alpha=(0.001, 0.002, 0.01, 0.02),
                             schedule={"kind": "robbins_monro", "t0": T0, "p_alpha": 1.0}, **SIZES), progress=False)
    # eta * c is the built-in's alpha exactly (c = 1, or c = 2: a doubling), and the
    # schedule's factor commutes with it exactly, but it is another program, whose
    # multiply-adds XLA may contract differently: equal to rounding.
    for g in range(len(r.grid["eta"])):
        j = int(np.flatnonzero(td.grid["alpha"] == r.grid["eta"][g] * r.grid["c"][g])[0])
        np.testing.assert_allclose(r.final[:, g], td.final[:, j], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(r.mean[:, g], td.mean[:, j], rtol=1e-5, atol=1e-7)


def test_readme_command_with_robbins_monro(mine, capsys):
    code = cli.main(["run", "--env", "baird", "--algorithm", "mine:SCALED_TD", "--eta", "0.001,0.01",
                     "--c", "1,2", "--schedule", "robbins_monro", "--steps", "1000", "--seeds", "2",
                     "--out", "runs/x"])
    assert code == 0, capsys.readouterr().err
    r = SweepResult.load("runs/x")
    assert r.spec.schedule.kind == "robbins_monro" and np.isfinite(r.final).all()


def test_a_direct_call_still_takes_a_schedule(mine):
    """Outside the engine an update may be handed an optax schedule: the built-in
    resolves it at state.count (`algorithms.resolve_step`)."""
    from bec_jax.schedules import robbins_monro
    env = envs.make("baird")
    st = algorithms.td.init(jnp.asarray(env.theta0, jnp.float32))
    tr = jax.tree.map(lambda x: x[0], streams.seed_transitions(_spec(), 0))
    sched = robbins_monro(jnp.float32(0.01), T0, 1.0)
    got = algorithms.td.update(st._replace(count=jnp.int32(7)), tr, sched)
    want = algorithms.td.update(st._replace(count=jnp.int32(7)), tr, algorithms.resolve_step(sched, 7))
    np.testing.assert_array_equal(got.theta, want.theta)


def test_robbins_monro_needs_a_counter(mine):
    alg = algorithms.Algorithm(name="no_counter_td", init=mine.td.init, update=mine.update,
                               hyperparameters=mine.SCALED_TD.hyperparameters, counter=None)
    mine.NO_COUNTER = alg  # a module attribute: a spec names an unregistered algorithm so
    with pytest.raises(ValueError, match="schedule: robbins_monro is evaluated at the update counter, "
                                         "but no_counter_td declares none"):
        SweepSpec(env="baird", algorithm="mine:NO_COUNTER", eta=0.01, schedule="robbins_monro", **SIZES)
    SweepSpec(env="baird", algorithm="mine:NO_COUNTER", eta=0.01, **SIZES)  # a constant step size needs none
    # A declared counter the state does not have is named when the program is made.
    from typing import NamedTuple

    class Bare(NamedTuple):
        theta: jax.Array

    bare = algorithms.Algorithm(
        name="bare_td", init=lambda theta0: Bare(jnp.asarray(theta0)),
        update=lambda s, tr, eta: Bare(s.theta + eta * tr.rho * algorithms.td_error(s.theta, tr) * tr.phi),
        hyperparameters=(algorithms.step_size("eta", "step size"),))
    mine.BARE = bare
    with pytest.raises(ValueError, match="declares counter 'count' and its state \\(Bare\\) has no such field"):
        sweep.run(SweepSpec(env="baird", algorithm="mine:BARE", eta=0.01, schedule="robbins_monro", **SIZES),
                  progress=False)
    assert np.isfinite(sweep.run(SweepSpec(env="baird", algorithm="mine:BARE", eta=0.01, **SIZES),
                                 progress=False).final).all()


def test_docs_registration_and_analysis_of_mine(mine, monkeypatch):
    """docs/your-algorithm.md's second block: registering mine.SCALED_TD and its
    expected update, G = -2 A at eta = 1, c = 2, i.e. twice built-in TD's at alpha = 1."""
    monkeypatch.setattr(algorithms, "_REGISTRY", dict(algorithms._REGISTRY))  # the name leaves with the test
    ns = {}
    exec(code("docs/your-algorithm.md", "python", containing="algorithms.register(mine.SCALED_TD)"), ns)
    G_td, g_td = analysis.expected_update(envs.make("two_state"), "td", {"alpha": 1.0})
    np.testing.assert_allclose(ns["G"], 2.0 * G_td, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ns["g"], 2.0 * g_td, rtol=1e-12, atol=1e-12)
    assert algorithms.get("scaled_td") is mine.SCALED_TD


def test_docs_command_runs(mine, capsys):
    """docs/your-algorithm.md's command, as printed (from the directory holding mine.py)."""
    import shlex
    line = code("docs/your-algorithm.md", "bash", containing="mine:SCALED_TD").strip()
    argv = shlex.split(line)
    assert argv[0] == "bec-jax"
    assert cli.main(argv[1:]) == 0, capsys.readouterr().err
    r = SweepResult.load("runs/scaled")
    assert list(r.grid["eta"]) == [0.001, 0.001, 0.01, 0.01] and list(r.grid["c"]) == [1.0, 2.0, 1.0, 2.0]
    assert np.isfinite(r.final).all() and r.final.shape[-1] == 50
