"""Issue 46 items 3-4 on the continuing front: cgq as a continuing learner (cq at
zeta = 0, bit for bit, on a tile-coded task) and task parameters as grid axes
(one program per combination, each point equal to its own sweep, bit for bit;
a sequence-valued parameter's list stays a value; the CLI form)."""
import contextlib
import io

import jax
import numpy as np
import pytest

from bec_jax.cli.commands import main
from bec_jax.control.continuing import learners, program, sweep
from bec_jax.control.continuing.results import ContinuingResult
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.engine import tuning

# The engine's light compile options (the loop emitters at -O1; a continuing sweep's programs get them on a
# CPU) for the programs jitted here: the same bits under any form, and no test here is about the form.
LIGHT = tuning.CPU_LIGHT_OPTIONS if jax.default_backend() == "cpu" else None


def test_cgq_at_zeta_zero_is_cq_on_tile_coded_catch():
    # A spec takes zeta > 0 (a step size), so zeta = 0 goes in as the program's traced column.
    assert learners.get("cgq") is learners.control.CGQ and learners.rate_field("cgq") == "omega"
    kw = dict(task="catch", seeds=2, steps=300, task_params={"num_tilings": 4})
    cgq = ContinuingSpec(algorithm="cgq", hyperparameters={"alpha": 0.05, "beta": 0.01, "zeta": 0.1}, **kw)
    cq = ContinuingSpec(algorithm="cq", hyperparameters={"alpha": 0.05, "beta": 0.01}, **kw)
    grid = program.grid_inputs(cgq, np.arange(1))
    grid["zeta"] = np.zeros_like(grid["zeta"])
    got = jax.jit(lambda g: program.runs(cgq, 0, g), compiler_options=LIGHT)(grid)
    want = jax.jit(lambda g: program.runs(cq, 0, g), compiler_options=LIGHT)(program.grid_inputs(cq, np.arange(1)))
    for name in ("reward_sum", "rate_estimate", "max_abs_w"):
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)
    ran = sweep.run(cgq, progress=False)  # and a sweep of cgq runs
    assert np.isfinite(ran.max_abs_w).all() and np.isfinite(ran.rate_estimate).all()


KW = dict(task="access_control", algorithm="q", hyperparameters={"alpha": [0.1, 0.2]}, seeds=2, steps=200)
# 2 servers (a scalar parameter that is not an axis): Access-Control's step hashes 3 uniforms, not the
# default 10 servers' 11, to compile; the list of priorities stays a value.
AXIS = {"free_probability": [0.04, 0.06], "priorities": [1, 2, 4, 8], "num_servers": 2}


@pytest.fixture(scope="module")
def both():
    """The sweep over the task axis (its two programs, which the CLI's run of the same spec reuses)."""
    return sweep.run(ContinuingSpec(task_params=AXIS, **KW), progress=False)


def test_a_task_axis_equals_separate_sweeps_bit_for_bit(both):
    spec = ContinuingSpec(task_params=AXIS, **KW)
    assert spec.task_axes == ("free_probability",) and spec.names[-1] == "free_probability"
    assert spec.num_points == 4 and spec.make_task().params["priorities"] == [1, 2, 4, 8]
    groups, _ = sweep.plan(spec, 100)
    assert [g.static for g in groups] == [(("free_probability", 0.04),), (("free_probability", 0.06),)]
    assert ContinuingSpec.from_dict(spec.to_dict()) == spec
    assert both.spec == spec
    rows = both.summary()
    for fp in (0.04, 0.06):
        one = sweep.run(ContinuingSpec(task_params={**AXIS, "free_probability": fp}, **KW), progress=False)
        m = both.grid["free_probability"] == fp
        for name in ("reward", "rate_estimate", "max_abs_w", "q_table"):
            np.testing.assert_array_equal(getattr(both, name)[m], getattr(one, name))
        mine = [r for r in rows if r["free_probability"] == fp]
        assert [r["optimal_gain"] for r in mine] == [r["optimal_gain"] for r in one.summary()]
    assert rows[0]["optimal_gain"] != rows[-1]["optimal_gain"]


@pytest.mark.parametrize("params,field", [
    ({"free_probability": ["a"]}, "task_params.free_probability"),
    ({"free_probability": []}, "task_params.free_probability"),
])
def test_bad_task_axis_names_the_field(params, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        ContinuingSpec(task_params=params, **KW)


def test_cli_task_param_values_are_an_axis_for_scalar_parameters(both, tmp_path):
    """The command line's form of `both`'s spec gives its sweep, bit for bit."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["continuing", "--task", "access_control", "--algorithm", "q", "--alpha", "0.1,0.2", "--seeds", "2",
                   "--steps", "200", "--task-param", "free_probability=0.04,0.06", "--task-param",
                   "priorities=1,2,4,8", "--task-param", "num_servers=2", "--out", str(tmp_path / "r")])
    assert rc == 0, out.getvalue()
    res = ContinuingResult.load(str(tmp_path / "r"))
    assert list(res.grid)[-1] == "free_probability"
    np.testing.assert_array_equal(res.grid["free_probability"], [0.04, 0.06, 0.04, 0.06])  # alpha, then the task
    assert res.spec.task_params["priorities"] == [1, 2, 4, 8]
    assert [r["free_probability"] for r in res.summary()] == [0.04, 0.06, 0.04, 0.06]
    assert res.spec == both.spec
    for name in ("reward", "rate_estimate", "max_abs_w", "q_table"):
        np.testing.assert_array_equal(getattr(res, name), getattr(both, name))


def test_an_axis_that_changes_the_tasks_size_is_refused():
    with pytest.raises(ValueError, match=r"^task_params.num_servers: every value must give a task of the same size"):
        ContinuingSpec(task="access_control", task_params={"num_servers": [2, 3]}, algorithm="q_vrc",
                       hyperparameters={"alpha": 0.1, "eta": 1.0}, seeds=2, steps=100, log_every=10)
