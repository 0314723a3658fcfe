"""Continuing tasks a user writes, and models too large or wrong (issue 54,
items 2 to 4 and part of 8): each broken task is refused before anything is
built or written, with one line naming the task, the function and what was
expected (`control.continuing.tasks_check`); NaN rewards that only a run
meets are named as such, with the run; infinite rewards print no numpy
warnings; seeds beyond 2**31 - 1 and a full disk say their limits; a task
axis does not hold every value's program to the end of the run. The factories
below are the user's (`--task test_faults_tasks:NAME`). Runs are tiny."""
import gc
import shutil
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax.cli import commands as cli
from bec_jax.control.continuing import sweep, tabular
from bec_jax.control.continuing.env import ContinuingEnv
from bec_jax.control.continuing.results import ContinuingResult
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.engine import memory, program_cache, tuning

RUN = ["--algorithm", "q", "--alpha", "0.1", "--seeds", "2", "--steps", "100"]


def _cli(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


def _refused(argv, out, capsys, says: str) -> None:
    """Exit status 2, exactly one line on stderr that says `says`, nothing written."""
    code, err = _cli([*argv, "--out", str(out)], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("bec-jax: error: ") and says in err[0], err
    assert not out.exists()


# ------------------------------------------------------------------ the user's tasks

def _two_arms(features=None, step=None, reset=None, num_features=2, num_active=1, **kw):
    """One state, two arms paying 1, with one-hot sparse features: each
    factory below breaks one part of the contract."""
    return ContinuingEnv(name="arms", num_actions=2, num_features=num_features, num_active=num_active, params={},
                         reset=reset or (lambda key: jnp.int32(0)),
                         step=step or (lambda key, s, a: (s, jnp.float32(1.0))),
                         features=features or (lambda s: jnp.array([[0], [1]], jnp.int32)), **kw)


def wide_features():
    return _two_arms(features=lambda s: jnp.zeros((3, 5), jnp.int32))


def index_beyond():
    return _two_arms(features=lambda s: jnp.array([[0], [7]], jnp.int32))


def vector_reward():
    return _two_arms(step=lambda key, s, a: (s, jnp.ones(3, jnp.float32)))


def step_raises():
    def step(key, s, a):
        raise RuntimeError("the task's own bug")
    return _two_arms(step=step)


def state_changes_dtype():
    return _two_arms(step=lambda key, s, a: (jnp.float32(s), jnp.float32(1.0)))


def nan_reward():
    return _two_arms(step=lambda key, s, a: (s, jnp.float32(jnp.nan)))


def observe_too_long():
    return _two_arms(observe=lambda s: jnp.zeros(3, jnp.float32), observation_size=2)


def _table(P, R, state_index=None):
    S, A = R.shape

    def step(key, s, a):
        return s, jnp.float32(0.0)

    return ContinuingEnv(name="table", num_actions=A, num_features=S * A, num_active=1, params={},
                         reset=lambda key: jnp.int32(0), step=step,
                         features=lambda s: jnp.arange(A, dtype=jnp.int32)[:, None] * S + s,
                         num_states=S, state_index=state_index or (lambda s: s), model=lambda: (P, R))


def rows_not_summing():
    return _table(np.full((2, 2, 2), 0.7), np.zeros((2, 2)))


def nan_model_reward():
    return _table(np.full((2, 2, 2), 0.5), np.full((2, 2), np.nan))


def state_index_beyond():
    return _table(np.full((2, 2, 2), 0.5), np.zeros((2, 2)), state_index=lambda s: s + 5)


def big_table():
    """300 states: P is 1.44 MB; its model() must not be called."""
    def model():
        raise AssertionError("model() was called before its size was checked")
    env = _table(np.zeros((1, 2, 1)), np.zeros((1, 2)))
    return env._replace(num_states=300, num_features=600, model=model)


def _late(bad):
    """Rewards of 1 for 20 steps, then `bad`: past the states the checks
    sample (`tasks_check.SAMPLE_STEPS`)."""
    def step(key, s, a):
        return s + 1, jnp.where(s >= 20, jnp.float32(bad), jnp.float32(1.0))
    return _two_arms(step=step)


def late_nan():
    return _late(np.nan)


def late_inf():
    return _late(np.inf)


def arms(pay=1.0):
    """Two arms paying `pay`: a task parameter to make a task axis of."""
    return _two_arms(step=lambda key, s, a: (s, jnp.float32(pay)))._replace(params={"pay": pay})


# ------------------------------------------------------------------ item 3: checked before anything runs

@pytest.mark.parametrize("task,says", [
    ("wide_features", "features gives int32[3, 5]; expected (2, 1) integer indices (num_actions, num_active) or "
                      "(2, 2) float vectors"),
    ("index_beyond", "features gives index 7 at a reset state; expected indices in [0, num_features = 2)"),
    ("vector_reward", "step gives a reward of float32[3]; expected a number of shape ()"),
    ("step_raises", "step(key, state, action) fails: RuntimeError: the task's own bug"),
    ("state_changes_dtype", "step gives a next state of float32[]; expected one like reset's, int32[]"),
    ("nan_reward", "step gives a reward of nan from a reset state; expected a finite number"),
    ("observe_too_long", "observe gives float32[3]; expected float32[2] (observation_size,)"),
    ("state_index_beyond", "state_index gives 5 at a reset state; expected an index in [0, num_states = 2)"),
    # item 4: a wrong model is refused before the run, not after it
    ("rows_not_summing", "model: every P[s, a] must be a probability distribution over next states"),
    ("nan_model_reward", "model: R must be finite"),
])
def test_a_user_task_that_breaks_the_contract_is_one_line_before_anything_runs(tmp_path, capsys, task, says):
    _refused(["continuing", "--task", f"test_faults_tasks:{task}", *RUN], tmp_path / "out", capsys,
             f"task: test_faults_tasks:{task}: {says}")


# ------------------------------------------------------------------ item 2: a model too large to build

def test_a_tabular_model_too_large_is_refused_at_once_with_its_size(tmp_path, capsys, monkeypatch):
    def built(*args):
        raise AssertionError("the model was built")
    monkeypatch.setattr(tabular, "access_control_model", built)
    _refused(["continuing", "--task", "access_control", "--task-param", "num_servers=100000", *RUN],
             tmp_path / "out", capsys,
             "task: access_control: its exact model, P of (400004, 2, 400004) float64, is 2.6 TB")


@pytest.mark.parametrize("task,size", [("taxi", "(500, 6, 500) float64, is 12.0 MB"),
                                       ("test_faults_tasks:big_table", "(300, 2, 300) float64, is 1.4 MB")])
def test_every_tabular_model_is_checked_against_host_memory(tmp_path, capsys, monkeypatch, task, size):
    """A built-in task and a user's, on a host with 2 MB free: refused with the
    model's size before model() is called."""
    monkeypatch.setattr(memory, "host_available", lambda: 2_000_000)
    _refused(["continuing", "--task", task, *RUN], tmp_path / "out", capsys,
             f"task: {task}: its exact model, P of {size} and needs 2 times that (built, then checked and "
             "solved); about 2.0 MB of host memory is available")


# ------------------------------------------------------------------ item 4 and 8: rewards the run meets

@pytest.fixture(scope="module")
def late_runs(tmp_path_factory):
    """Runs of the late NaN and late inf tasks: (exit status, stderr lines,
    RuntimeWarnings) and the directory, each."""
    tmp = tmp_path_factory.mktemp("late")
    out = {}
    for name in ("nan", "inf"):
        d = tmp / name
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            code, err = _cli_raw(["continuing", "--task", f"test_faults_tasks:late_{name}", *RUN, "--out", str(d)])
        out[name] = (code, err, [w for w in seen if issubclass(w.category, RuntimeWarning)], d)
    return out


def _cli_raw(argv):
    """(exit status, stderr lines) of `bec-jax ARGV` in this process, stderr caught by hand."""
    import contextlib
    import io
    err, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
        code = cli.main(argv)
    return code, err.getvalue().strip().splitlines()


def test_nan_rewards_a_run_meets_are_named_with_the_run(late_runs, tmp_path):
    code, err, _, d = late_runs["nan"]

    def says(run):
        return (f"bec-jax: error: reward: the task test_faults_tasks:late_nan gave NaN rewards in {run} (2 of 2 "
                "runs, at every grid point); no setting can be ranked; its step must give finite rewards")

    assert code == 2 and err == [says(d)]
    assert sorted(p.name for p in d.iterdir()) == ["curves.npz", "meta.json", "summary.csv", "summary.json"]
    assert np.isnan(ContinuingResult.load(str(d)).reward[..., -1]).all()  # the run is kept as it ran
    code, err = _cli_raw(["plot", str(d), "--out", str(tmp_path / "plots")])
    assert code == 2 and err == [says(d)]
    shutil.copytree(d, tmp_path / "again")
    code, err = _cli_raw(["compare", str(tmp_path / "again"), str(d), "--out", str(tmp_path / "c.png")])
    assert code == 2 and err == [says(tmp_path / "again")]


def test_infinite_rewards_print_no_numpy_warnings(late_runs, tmp_path):
    code, err, runtime_warnings, d = late_runs["inf"]
    assert code == 0 and err == [] and runtime_warnings == []
    r = ContinuingResult.load(str(d))
    assert np.isinf(r.reward[..., -1]).all()
    mean, low, high = r.rate_interval("last10")
    assert np.isinf(mean).all() and np.isnan(low).all() and np.isnan(high).all()  # no interval about inf
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        code, err = _cli_raw(["plot", str(d), "--out", str(tmp_path / "plots")])
    assert code == 0 and err == [] and not [w for w in seen if issubclass(w.category, RuntimeWarning)]


# ------------------------------------------------------------------ item 8: limits said

@pytest.mark.parametrize("argv", [
    ["run", "--env", "two_state", "--algorithm", "td", "--alpha", "0.1", "--steps", "10", "--log-every", "10"],
    ["control", "--task", "maze", "--algorithm", "cq", "--alpha", "0.1", "--beta", "0.1", "--episodes", "2"],
    ["continuing", "--task", "two_choice", "--algorithm", "q", "--alpha", "0.1", "--steps", "100"],
])
def test_seeds_beyond_the_limit_say_the_limit(tmp_path, capsys, argv):
    _refused([*argv, "--seeds", "1000000000000"], tmp_path / "out", capsys,
             "seeds: must be an integer in [1, 2**31 - 1], got 1000000000000")


def test_the_disk_check_says_how_many_points_a_continuing_run_logs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(memory, "disk_free", lambda path: 1000)
    _refused(["continuing", "--task", "two_choice", *RUN], tmp_path / "out", capsys,
             "on disk (100 log points x 2 seeds x 1 grid points); 1.0 kB is free where")


def test_a_task_axis_does_not_hold_every_values_program(monkeypatch):
    """Each value of a task axis has its own program (about 7 MB of executable
    on a CPU): once a value's chunks are done, the run lets its program go,
    so a 500-value axis does not keep 500 of them to its end."""
    monkeypatch.setattr(tuning, "MAX_EXECUTABLES", 0)  # the process's cache keeps none: the run's hold alone
    made = []
    compile_or_load = program_cache.compile_or_load

    def recorded(*args, **kwargs):
        exe = compile_or_load(*args, **kwargs)
        made.append(weakref.ref(exe))
        return exe

    monkeypatch.setattr(program_cache, "compile_or_load", recorded)
    spec = ContinuingSpec(task="test_faults_tasks:arms", algorithm="q", hyperparameters={"alpha": 0.1},
                          task_params={"pay": [1.0, 2.0]}, seeds=2, steps=10)
    alive = []

    def on_chunk(i, arrays):
        gc.collect()
        alive.append([ref() is not None for ref in made])

    result = sweep.run(spec, devices=jax.devices("cpu")[:1], on_chunk=on_chunk, progress=False)
    assert alive == [[True], [False, True]]
    np.testing.assert_array_equal(result.reward[:, 0, -1], [1.0, 2.0])
