"""The engine interface: each kind names its front (`run.kinds`), both fronts implement the
protocol, the runner, the study runner and the CLI never ask a spec its type,
and control plans its chunks with the calibrated memory plan."""
import inspect
import os
import re

import pytest

import bec_jax
from bec_jax.control import sweep as control_sweep
from bec_jax.control.spec import ControlSpec
from bec_jax.engine import execute, memory, protocol
from bec_jax.prediction import sweep
from bec_jax.prediction.spec import SweepSpec
from bec_jax.run import kinds

LIB = os.path.dirname(os.path.abspath(bec_jax.__file__))

PREDICTION = SweepSpec(env="two_state", algorithm="td", alpha=(0.1, 0.2, 0.3), seeds=2, steps=10, log_every=5)
CONTROL = ControlSpec(task="cliff_walking", algorithm="q", hyperparameters={"alpha": [0.1, 0.2, 0.3]}, seeds=2,
                      episodes=3)


def _members():
    return [n for n, v in vars(protocol.Engine).items() if not n.startswith("_") and callable(v)] + \
        list(protocol.Engine.__annotations__)


def test_each_kind_names_its_front():
    assert kinds.of_spec(PREDICTION).front is sweep
    assert kinds.of_spec(CONTROL).front is control_sweep


@pytest.mark.parametrize("front", [sweep, control_sweep], ids=["prediction", "control"])
def test_both_fronts_implement_the_protocol(front):
    names = _members()
    assert {"plan_memory", "plan", "make_program", "chunk_grid", "assemble", "run", "KIND", "SEGMENTS"} <= set(names)
    missing = [n for n in names if not hasattr(front, n)]
    assert not missing, missing
    for n in names:
        if callable(getattr(protocol.Engine, n, None)):
            want = [p for p in inspect.signature(getattr(protocol.Engine, n)).parameters if p != "self"]
            have = inspect.signature(getattr(front, n)).parameters
            required = [p for p in want if p not in ("kwargs",)]
            assert all(p in have or "kwargs" in have for p in required), (front.__name__, n, required, list(have))
    assert front.run_chunks is execute.run_chunks  # the chunk loop is the engine's, with the spec's front


@pytest.mark.parametrize("module", ["run/runner.py", "run/rundir.py", "run/study.py", "run/figures.py",
                                    "cli/commands.py"])
def test_the_runner_study_and_cli_never_ask_a_spec_its_type(module):
    text = open(os.path.join(LIB, module)).read()
    assert not re.search(r"isinstance\([^)]*Spec\)", text), module
    assert 'kind == "control"' not in text and "== CONTROL_KIND" not in text
    assert not re.search(r"\bspec\.engine\b", text), module  # the front is the table's (`run.kinds`)


def test_control_plans_with_the_memory_plan():
    pl = control_sweep.plan_memory(CONTROL, 1)
    assert isinstance(pl, memory.Plan) and pl.grid == CONTROL.num_points and not pl.segmented
    assert control_sweep.plan_chunk(CONTROL) == CONTROL.num_points
    one = memory.call_bytes(control_sweep.sizes(CONTROL), 1, CONTROL.seeds, 1, False)
    assert control_sweep.plan_chunk(CONTROL, memory_budget=one) == 1  # one point per call fits
    assert control_sweep.plan_chunk(CONTROL, memory_budget=2 * one + 32) == 2
    with pytest.raises(memory.TooLarge, match="memory_budget"):
        control_sweep.plan_memory(CONTROL, 1, memory_budget=one // 2)  # a point's seeds never split
    assert control_sweep.plan_chunk(CONTROL, 3, 2) == 4  # a given size, rounded up to the devices


def test_control_runs_by_a_given_plan():
    pl = control_sweep.plan_memory(CONTROL, 1, chunk_size=2)
    r = control_sweep.run(CONTROL, memory_plan=pl, devices=__import__("jax").devices()[:1], progress=False)
    assert r.meta["chunk_size"] == 2 and r.meta["num_chunks"] == 2
    whole = control_sweep.run(CONTROL, devices=__import__("jax").devices()[:1], progress=False)
    for k in ("returns", "lengths", "diverged_step"):
        assert (getattr(r, k) == getattr(whole, k)).all()


def test_gather_and_check_dtype_are_shared():
    assert sweep.gather is protocol.gather
    spec = PREDICTION.replace(dtype="float64")
    import jax
    if not jax.config.jax_enable_x64:
        for front in (sweep, control_sweep):
            s = spec if front is sweep else ControlSpec.from_dict({**CONTROL.to_dict(), "dtype": "float64"})
            with pytest.raises(ValueError, match="64-bit mode"):
                front.run(s)


@pytest.mark.parametrize("task,alg,hp,seeds,episodes", [
    ("cliff_walking", "cgq", {"alpha": [0.1, 0.2], "beta": [0.01], "zeta": [0.1]}, 32, 50),
    ("mountain_car", "cq", {"alpha": [0.1], "beta": [0.01]}, 16, 20),
])
def test_control_estimate_bounds_xla_buffer_assignment(task, alg, hp, seeds, episodes):
    """Control's size terms are calibrated as the prediction sweep's are
    (tests/test_memory.py): the estimate of a call is never below what XLA
    allocates for the program (arguments + outputs + temporaries), and at most
    3 times it."""
    import jax
    import numpy as np

    from bec_jax.engine import tuning
    spec = ControlSpec(task=task, algorithm=alg, hyperparameters=hp, seeds=seeds, episodes=episodes)
    G = spec.num_points
    groups, chunks = control_sweep.plan(spec, G)
    devices = jax.devices()[:1]
    # Compiled as the engine compiles it: with its form's options (on a CPU the light compile).
    form = tuning.choose_form(spec, devices, groups[0], front=control_sweep)
    prog = control_sweep.make_program(spec, groups[0], G, devices, form=form)
    lowered = prog.fn.lower(np.uint32(0), control_sweep.chunk_grid(spec, groups[0], chunks[0]))
    m = lowered.compile(form.compiler_options).memory_analysis()
    xla = m.temp_size_in_bytes + m.output_size_in_bytes + m.argument_size_in_bytes
    est = memory.call_bytes(control_sweep.sizes(spec), G, seeds, 1, False)
    assert 1.0 <= est / xla <= 3.0, (est, xla)
