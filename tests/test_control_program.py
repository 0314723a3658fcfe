"""The control program: several sweeps of one task in one program (`run_many`)
give what each gives alone, bit for bit; a sweep whose runs have all finished
stops stepping; the loop's parameters (epsilon, its decay and floor, gamma) as
grid axes give each point what the same values give as plain settings."""
import numpy as np
import pytest

from bec_jax.cli import args as cli_args
from bec_jax.cli import commands as cli
from bec_jax.control import program, sweep
from bec_jax.control.spec import ControlSpec
from bec_jax.engine import tuning

BASE = dict(task="cliff_walking", seeds=2, episodes=25, max_steps=4000, block=50, epsilon=0.05,
            epsilon_decay=0.99, epsilon_min=1e-3)
SWEEPS = [ControlSpec(algorithm="q", hyperparameters={"alpha": [0.5, 0.2]}, **BASE),
          ControlSpec(algorithm="cgq", hyperparameters={"alpha": [0.1], "beta": [1e-3], "zeta": [0.01]}, **BASE)]


@pytest.fixture(scope="module")
def joint():
    return sweep.run_many(SWEEPS)


def _same(a, b):
    for k in ("returns", "lengths", "diverged_step"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
    if a.omega is not None or b.omega is not None:
        np.testing.assert_array_equal(a.omega, b.omega)


def test_sweeps_of_one_task_share_one_program(joint):
    assert sweep.shared_programs(SWEEPS) == [[0, 1]]
    assert joint[0].meta["shared_program"] == ["q", "cgq"] and joint[1].meta["shared_program_index"] == 1
    assert joint[0].meta["compiled_programs"] == 1 and joint[1].meta["compiled_programs"] == 0
    # another task, or other seeds, cannot share
    other = ControlSpec(algorithm="q", hyperparameters={"alpha": [0.5]}, **{**BASE, "seeds": 3})
    assert sweep.shared_programs(SWEEPS + [other]) == [[0, 1], [2]]


def test_shared_program_gives_each_sweep_its_own_runs_bit_for_bit(joint):
    for spec, r in zip(SWEEPS, joint):
        _same(r, sweep.run(spec, progress=False))
    assert (joint[0].lengths > 0).all() and joint[0].lengths[:, :, -1].min() < 100  # it learned something


def test_a_finished_sweep_stops_stepping():
    """Q at alpha 0.5 finishes its 25 episodes long before CGQ: its update
    counter (shared by its runs: the steps its member ran) stops there."""
    sizes = [s.num_points for s in SWEEPS]
    prog = program.make_program(SWEEPS, sizes, keep_state=True)
    grids = tuple(program.grid_inputs(s, np.arange(s.num_points)) for s in SWEEPS)
    # compiled with the XLA options the engine gives these sweeps (a light compile on the CPU)
    options = tuning.choose_form(SWEEPS[0], front=sweep).compiler_options
    outs = prog.fn.lower(np.uint32(0), grids).compile(compiler_options=options)(np.uint32(0), grids)
    steps = [int(o["state"].count) for o in outs]
    need = [int(o["lengths"].sum(-1).max()) for o in outs]  # the slowest run of each
    for s, n in zip(steps, need):
        assert n <= s < n + BASE["block"]  # stepped to the end of the block its last run finished in
    assert steps[0] < steps[1]


def test_loop_parameters_as_grid_axes_equal_plain_settings():
    loop = {k: v for k, v in BASE.items() if k not in ("epsilon", "epsilon_decay")}
    axes = ControlSpec(algorithm="q", hyperparameters={"alpha": [0.5], "epsilon": [0.05, 0.2],
                                                       "epsilon_decay": [1.0, 0.99], "gamma": [0.9, 0.99]}, **loop)
    assert axes.names == ("alpha", "epsilon", "epsilon_decay", "gamma") and axes.num_points == 8
    r = sweep.run(axes, progress=False)
    # The first plain sweep is SWEEPS[0] (gamma: cliff_walking's 0.99), whose
    # program test_shared_program_gives_each_sweep_its_own_runs_bit_for_bit compiled.
    for point, plain in (({"epsilon": 0.05, "epsilon_decay": 0.99, "gamma": 0.99}, SWEEPS[0]),
                         ({"epsilon": 0.2, "epsilon_decay": 1.0, "gamma": 0.9},
                          ControlSpec(algorithm="q", hyperparameters={"alpha": [0.5]}, epsilon=0.2, epsilon_decay=1.0,
                                      gamma=0.9, **loop))):
        assert plain.hyperparameters["alpha"][0] == 0.5 and plain.discount == point["gamma"]
        i = next(i for i in range(8) if all(r.point(i)[k] == v for k, v in point.items()))
        plain = sweep.run(plain, progress=False)
        for k in ("returns", "lengths"):
            np.testing.assert_array_equal(getattr(r, k)[i], getattr(plain, k)[0])


@pytest.mark.parametrize("change, field", [
    ({"epsilon": 0.3, "hyperparameters": {"alpha": [0.1], "epsilon": [0.1, 0.2]}}, "epsilon"),
    ({"hyperparameters": {"alpha": [0.1], "gamma": [0.9, 1.5]}}, "gamma"),
    ({"epsilon": [0.05, 0.1], "epsilon_min": 0.08}, "epsilon_min"),
    ({"epsilon_decay": [0.0, 0.9]}, "epsilon_decay"),
])
def test_bad_loop_axes_are_refused_naming_the_field(change, field):
    kw = dict(task="cliff_walking", algorithm="q", hyperparameters={"alpha": [0.1]})
    kw.update(change)
    with pytest.raises(ValueError, match=f"^{field}:"):
        ControlSpec(**kw)


def test_loop_axes_from_the_command_line_and_a_table():
    args = cli.build_parser().parse_args(["control", "--task", "cliff_walking", "--algorithm", "q", "--alpha", "0.1",
                                          "--epsilon", "0.05,0.1", "--gamma", "0.9"])
    spec = cli_args.control_spec_from_args(args)
    assert spec.hyperparameters["epsilon"] == (0.05, 0.1) and spec.gamma == 0.9 and "gamma" not in spec.names
    again = ControlSpec.from_dict(spec.to_dict())
    assert again == spec and again.num_points == 2
    table = ControlSpec.from_dict({"task": "cliff_walking", "algorithm": "q", "alpha": [0.1], "gamma": [0.9, 0.99]})
    assert table.names == ("alpha", "gamma") and table.loop_values("gamma") == (0.9, 0.99)


def test_task_parameters_as_grid_axes_run_a_program_each():
    """A task parameter with several values is a grid axis: each value is its own
    task and program, and its points are what the task given that value alone gives."""
    kw = dict(task="cliff_walking", algorithm="q", hyperparameters={"alpha": [0.5]}, seeds=2, episodes=20,
              max_steps=3000, epsilon=0.1)
    spec = ControlSpec(task_axes={"max_episode_steps": [40, 1000]}, **kw)
    assert spec.names == ("alpha", "max_episode_steps") and spec.num_points == 2
    groups, _ = sweep.plan(spec, spec.num_points)
    assert [g.static for g in groups] == [(("max_episode_steps", 40),), (("max_episode_steps", 1000),)]
    assert "episode cap" in spec.task_axes_reason
    r = sweep.run(spec, progress=False)
    assert r.meta["compiled_programs"] == 2 and r.meta["task_axes"].startswith("a program per value")
    for i, cap in enumerate((40, 1000)):
        assert r.point(i)["max_episode_steps"] == cap
        alone = sweep.run(ControlSpec(task_params={"max_episode_steps": cap}, **kw), progress=False)
        for k in ("returns", "lengths", "diverged_step"):
            np.testing.assert_array_equal(getattr(r, k)[i], getattr(alone, k)[0])
    assert r.lengths[0].max() <= 40 < r.lengths[1].max()  # the cap bit where it was 40
    again = ControlSpec.from_dict(spec.to_dict())
    assert again == spec
    args = cli.build_parser().parse_args(["control", "--task", "cliff_walking", "--algorithm", "q", "--alpha", "0.5",
                                          "--task-param", "max_episode_steps=40,1000"])
    assert cli_args.control_spec_from_args(args).task_axes == {"max_episode_steps": [40, 1000]}


GRID = "examples.gridworld:make_gridworld"  # found from the repository root (`_repo_root`)


@pytest.fixture
def _repo_root(monkeypatch):
    import os
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_traced_task_axes_run_every_value_in_one_program(_repo_root):
    """A task parameter the factory takes as a traced scalar (the gridworld's
    slip) is a grid column of one program: each point gives what the task with
    that value alone gives (slip enters only a float32 comparison, so the same
    bits), and other values of it reuse the program."""
    kw = dict(task=GRID, algorithm="cq", hyperparameters={"alpha": [0.5], "beta": [0.01]}, seeds=3, episodes=8,
              task_params={"size": 3}, epsilon=0.1)
    spec = ControlSpec(task_axes={"slip": [0.0, 0.3, 1]}, **kw)
    assert spec.task_axes_traced and spec.task_axis_dtype("slip") == "float32"
    assert [g.static for g in sweep.plan(spec, spec.num_points)[0]] == [()]
    r = sweep.run(spec, progress=False)
    assert r.meta["compiled_programs"] == 1 and r.meta["task_axes"] == "one program (traced)"
    alone = [sweep.run(ControlSpec(**{**kw, "task_params": {"size": 3, "slip": slip}}), progress=False)
             for slip in (0.0, 0.3, 1.0)]
    for i, slip in enumerate((0.0, 0.3, 1.0)):
        assert r.point(i)["slip"] == slip
        for k in ("returns", "lengths", "diverged_step"):  # not omega: a run steps on until its chunk is done
            np.testing.assert_array_equal(getattr(r, k)[i], getattr(alone[i], k)[0])
    assert r.lengths[2].mean() > r.lengths[0].mean()  # a random walk (slip 1) takes longer than learning
    # a task axis is not a setting to pick: figures, tables and the summary line take the best at each value
    parts = r.by_task_value()
    assert [v for v, _ in parts] == [{"slip": 0.0}, {"slip": 0.3}, {"slip": 1.0}]
    for i, (_, part) in enumerate(parts):
        assert part.num_points == 1 and part.point(0) == r.point(i)
        np.testing.assert_array_equal(part.lengths[0], r.lengths[i])
    from bec_jax.control import plotting
    rows = plotting.summary_rows({"g": r}, "length")
    assert [(row["sweep"], row["setting"]) for row in rows] == [
        (f"g (slip={v:g})", f"alpha=0.5, beta=0.01, slip={v:g}") for v in (0.0, 0.3, 1.0)]
    assert ControlSpec(**kw).task_axes == {} and alone[0].spec.task_axes == {} and len(alone[0].by_task_value()) == 1
    other = sweep.run(ControlSpec(task_axes={"slip": [0.1, 0.2, 0.5]}, **kw), progress=False)
    assert other.meta["compiled_programs"] == 0  # the same program, other values
    assert not np.array_equal(other.lengths, r.lengths)


def test_task_axes_that_cannot_be_traced_say_why(_repo_root):
    """A value that changes the task's shapes, or a factory that tests its
    value in Python, gets a program per value, and the reason."""
    kw = dict(task=GRID, algorithm="q", hyperparameters={"alpha": [0.5]}, seeds=2, episodes=3)
    spec = ControlSpec(task_axes={"size": [3, 4]}, **kw)
    assert not spec.task_axes_traced and "sizes" in spec.task_axes_reason
    assert len(sweep.plan(spec, spec.num_points)[0]) == 2
    from bec_jax.control import tasks
    from examples.gridworld import make_gridworld

    def strict(*, slip=0.0):
        if not 0 <= slip <= 1:  # a Python test of a traced value fails
            raise ValueError(f"slip: a probability, got {slip}")
        return make_gridworld(size=3, slip=slip)

    tasks.register("strict_grid_test", strict)
    try:
        spec = ControlSpec(**{**kw, "task": "strict_grid_test", "task_axes": {"slip": [0.0, 0.5]}})
        assert spec.task_axes_reason.startswith("the factory does not take traced values")
        assert len(sweep.plan(spec, spec.num_points)[0]) == 2
    finally:
        tasks.TASKS.pop("strict_grid_test", None)


@pytest.mark.parametrize("axes, params, match", [
    ({"max_episode_steps": ["a", "b"]}, {}, "^task_axes.max_episode_steps: a grid axis takes numbers"),
    ({"max_episode_steps": [40, 50]}, {"max_episode_steps": 30}, "^task_axes.max_episode_steps: given twice"),
    ({"alpha": [0.1, 0.2]}, {}, "^task_axes.alpha: 'alpha' is already a grid column"),
    ({"size": [3, 4]}, {}, "^size: not a parameter of cliff_walking"),
])
def test_bad_task_axes_are_refused_naming_the_field(axes, params, match):
    with pytest.raises(ValueError, match=match):
        ControlSpec(task="cliff_walking", algorithm="q", hyperparameters={"alpha": [0.1]}, task_axes=axes,
                    task_params=params)
