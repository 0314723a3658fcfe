"""Degenerate models, tasks and numbers a user can write: each is refused before
any work with one line naming the field (exit status 2, nothing written), or,
where the quantity is well defined, given its documented value. And the disk
pre-check's estimate is an upper bound of what a run writes."""
import os

import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax import envs
from bec_jax.cli import commands as cli
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.control.tasks import ControlEnv
from bec_jax.mdp import make_mdp
from bec_jax.prediction import sizes as prediction_sizes
from bec_jax.prediction.spec import SweepSpec
from bec_jax.run import rundir
from bec_jax.theory import metrics

RUN = ["--algorithm", "ctd", "--alpha", "0.1", "--beta", "0.1", "--steps", "10", "--log-every", "10",
       "--seeds", "2"]


def _cli(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


def _refused(argv, out, capsys, starts: str, says: str) -> None:
    """Exit status 2, one line on stderr naming the field, no traceback, no --out."""
    code, err = _cli([*argv, "--out", str(out)], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"bec-jax: error: {starts}") and says in err[0], err
    assert "Traceback" not in err[0] and not out.exists()


def _mdp_file(tmp_path, name="m.npz", **changes) -> str:
    """The 2-state chain's model with some fields changed, saved as an .npz MDP file."""
    fields = {k: np.asarray(v) for k, v in envs.make("two_state")._asdict().items()}
    fields.update(changes)
    path = str(tmp_path / name)
    np.savez(path, **fields)
    return path


# ------------------------------------------------------------------ prediction models

@pytest.mark.parametrize("metric", ["rmspcbe", "rmscbe"])
def test_features_of_rank_0_are_refused(tmp_path, capsys, metric):
    path = _mdp_file(tmp_path, phi=np.zeros((2, 1)))
    _refused(["run", "--env", path, *RUN, "--metrics", metric], tmp_path / "out", capsys,
             f"env: {path!r}: phi:", "the features are all zero (rank 0)")


def test_rewards_beyond_float32_are_refused_and_run_in_float64(tmp_path, capsys):
    path = _mdp_file(tmp_path, R=np.full(envs.make("two_state").R.shape, 1e300))
    _refused(["run", "--env", path, *RUN], tmp_path / "out", capsys,
             f"env: {path!r}: R:", "1e+300 is beyond float32's range (max 3.4e+38)")
    SweepSpec(env=path, algorithm="ctd", alpha=0.1, beta=0.1, dtype="float64")  # within float64's range


@pytest.mark.parametrize("field,value", [("P", np.nan), ("R", np.inf), ("phi", np.nan), ("gamma", np.nan),
                                         ("theta0", 1e39)])
def test_non_finite_or_out_of_range_model_entries_are_refused(tmp_path, capsys, field, value):
    arr = np.array(np.asarray(envs.make("two_state")._asdict()[field]), np.float64)
    arr.flat[0] = value
    path = _mdp_file(tmp_path, **{field: arr})
    _refused(["run", "--env", path, *RUN], tmp_path / "out", capsys, f"env: {path!r}: {field}:", "")


@pytest.mark.parametrize("flag,value", [("--alpha", "1e39"), ("--beta", "3.5e38")])
def test_hyperparameters_beyond_float32_are_refused(tmp_path, capsys, flag, value):
    argv = ["run", "--env", "two_state", "--algorithm", "ctd", "--alpha", "0.1", "--beta", "0.1",
            "--steps", "10", "--log-every", "10", "--seeds", "2"]
    argv[argv.index(flag) + 1] = f"0.1,{value}"
    _refused(argv, tmp_path / "out", capsys, f"{flag[2:]}: {float(value):g} is beyond float32's range", "")
    SweepSpec(env="two_state", algorithm="ctd", alpha=float(value) if flag == "--alpha" else 0.1,
              beta=float(value) if flag == "--beta" else 0.1, dtype="float64")


def test_rank_deficient_features_are_legal_and_an_empty_projection_is_0():
    # A zero column: legal (the projected metrics use a pseudo-inverse).
    env = envs.make("two_state")
    zcol = make_mdp(**{**env._asdict(), "phi": np.hstack([env.phi, np.zeros((2, 1))]), "theta0": np.zeros(2)})
    assert np.isfinite(metrics.rmspcbe(zcol, np.ones(2)))
    # Features zero on every state the behaviour visits (d_mu = (1, 0)): C = 0 and the
    # projected metrics' maps have no rows; their value is 0, as documented.
    P = np.zeros((2, 1, 2))
    P[:, 0, 0] = 1.0
    transient = make_mdp(pi=np.ones((2, 1)), mu=np.ones((2, 1)), P=P, R=np.ones((2, 1, 2)),
                         phi=np.array([[0.0], [1.0]]), gamma=0.9, start=np.array([0.0, 1.0]))
    for name in ("rmspcbe", "rmspbe", "rmspbe_emphatic", "rmspcbe_emphatic"):
        m = metrics.metric(transient, name)
        assert m.R.shape == (0, 1)
        np.testing.assert_array_equal(metrics.metric_values([m], jnp.ones((2, 3, 1))), np.zeros((1, 2, 3)))


# ------------------------------------------------------------------ control tasks

def _task(num_features, num_active, rows, kind=jnp.int32):
    def reset(key):
        return jnp.int32(0)

    def step(key, s, a):
        return s, jnp.float32(-1.0), s > 5

    return ControlEnv(name="fault", num_actions=2, num_features=num_features, num_active=num_active, gamma=0.9,
                      max_episode_steps=10, params={}, reset=reset, step=step,
                      features=lambda s: jnp.zeros((2, rows), kind))


def zero_features():
    """A sparse task with no features (the gather in `control.transition` failed)."""
    return _task(0, 1, 1)


def dense_zero_features():
    """A dense task with empty feature vectors."""
    return _task(0, 0, 0, jnp.float32)


def wrong_width():
    """A task whose features are wider than it declares."""
    return _task(8, 1, 3)


CONTROL = ["--algorithm", "cq", "--alpha", "0.1", "--beta", "0.1", "--episodes", "2", "--seeds", "1"]


@pytest.mark.parametrize("task,says", [("zero_features", "num_features must be an integer >= 1, got 0"),
                                       ("dense_zero_features", "num_features must be an integer >= 1, got 0"),
                                       ("wrong_width", "features gives int32[2, 3]; expected (2, 1)")])
def test_control_tasks_without_features_or_of_the_wrong_shape_are_refused(tmp_path, capsys, task, says):
    _refused(["control", "--task", f"test_faults_models:{task}", *CONTROL], tmp_path / "out", capsys,
             f"task: test_faults_models:{task}:", says)


@pytest.mark.parametrize("flag,value,field", [("--alpha", "1e39", "alpha"), ("--reward-shift", "1e39", "reward_shift"),
                                              ("--divergence-bound", "1e39", "divergence_bound")])
def test_control_numbers_beyond_float32_are_refused(tmp_path, capsys, flag, value, field):
    argv = ["control", "--task", "maze", *CONTROL]
    argv = argv[:argv.index(flag)] + argv[argv.index(flag) + 2:] if flag in argv else argv
    _refused([*argv, flag, value], tmp_path / "out", capsys, f"{field}: 1e+39 is beyond float32's range", "")


def test_continuing_numbers_beyond_float32_are_refused():
    for field, kw in (("alpha", {"hyperparameters": {"alpha": [0.1, 1e39]}}), ("reward_offset", {"reward_offset": 1e39}),
                      ("q0", {"q0": -1e39})):
        kw.setdefault("hyperparameters", {"alpha": 0.1})
        with pytest.raises(ValueError, match=rf"^{field}: -?1e\+39 is beyond float32's range"):
            ContinuingSpec(task="access_control", algorithm="q", **kw)
    ContinuingSpec(task="access_control", algorithm="q", hyperparameters={"alpha": 0.1}, reward_offset=1e39,
                   dtype="float64")


# ------------------------------------------------------------------ the disk pre-check

def _tree_bytes(path: str) -> int:
    """Apparent bytes of a directory tree, its directories included (as `du -sb`)."""
    total = os.stat(path).st_size
    for root, dirs, names in os.walk(path):
        total += sum(os.stat(os.path.join(root, n)).st_size for n in dirs + names)
    return total


@pytest.mark.parametrize("argv,chunk,spec", [
    (["--alpha", "0.01,0.02,0.05,0.1,0.2,0.3,0.5,0.7", "--steps", "5000", "--log-every", "10", "--seeds", "10"], 2,
     dict(alpha=(0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7), steps=5000, log_every=10, seeds=10)),
    (["--alpha", "0.05,0.1,0.2", "--env-param", "gamma=0.5,0.9", "--metrics", "rmscbe,rmspbe,rmsve", "--steps",
      "2000", "--log-every", "10", "--seeds", "50"], None,
     dict(alpha=(0.05, 0.1, 0.2), env_params={"gamma": (0.5, 0.9)}, metrics=("rmscbe", "rmspbe", "rmsve"),
          steps=2000, log_every=10, seeds=50)),
])
def test_the_disk_estimate_bounds_what_the_run_writes(tmp_path, capsys, monkeypatch, argv, chunk, spec):
    # The directory is fullest just before the chunk store is removed: its chunks
    # beside the written results (counted with everything the run ends with).
    seen = {"chunks": 0}
    remove = rundir.ChunkStore.remove

    def measured_remove(self):
        if os.path.isdir(self.dir):
            seen["chunks"] = max(seen["chunks"], _tree_bytes(self.dir))
        return remove(self)

    monkeypatch.setattr(rundir.ChunkStore, "remove", measured_remove)
    out = tmp_path / "d"
    extra = ["--chunk-size", str(chunk)] if chunk else []
    assert cli.main(["run", "--env", "two_state", "--algorithm", "td", *argv, *extra, "--out", str(out)]) == 0
    capsys.readouterr()
    assert seen["chunks"] > 0
    peak = seen["chunks"] + _tree_bytes(str(out))
    plan = prediction_sizes.plan_memory(SweepSpec(env="two_state", algorithm="td", **spec), chunk_size=chunk,
                                        out=str(tmp_path))
    assert peak <= plan.disk_bytes <= 3 * peak, (peak, plan.disk_bytes)
