"""The continuing program's fast paths give the bits of the plain ones:
Access-Control's uniforms as scalar hashes are `jax.random.uniform`'s, and
runs in batches (`lax.map`) are the runs in one vmap."""
import jax
import numpy as np
import pytest

from bec_jax import threefry
from bec_jax.control.continuing import program, tabular
from bec_jax.control.continuing.spec import ContinuingSpec


@pytest.mark.parametrize("count", [1, 2, 11, 12])
@pytest.mark.parametrize("fused", [False, True])
def test_uniforms_are_jax_random_uniforms(count, fused):
    keys = jax.random.split(jax.random.key(7), 64)
    if fused:
        keys = threefry.fused(keys)
    got = jax.jit(jax.vmap(lambda k: tabular.uniforms(k, count)))(keys)
    want = jax.jit(jax.vmap(lambda k: jax.random.uniform(k, (count,))))(keys)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # bit for bit
    assert np.asarray(got).std() > 0.2  # not a constant that matches by accident


def test_batch_runs_divides_where_it_can():
    assert program.batch_runs(100, 1600) == 100
    assert program.batch_runs(3200, 1600) == 1600
    assert program.batch_runs(84000, 1600) == 1500  # a divisor in [800, 1600]: no remainder program
    assert program.batch_runs(1601, 1600) == 1600   # a prime: the target, with a remainder


@pytest.mark.parametrize("task", ["access_control", "two_choice"])
def test_runs_in_batches_equal_one_batch(task, monkeypatch):
    spec = ContinuingSpec(task=task, algorithm="q_vrc", hyperparameters={"alpha": [0.1, 0.5], "eta": [0.0, 1.0]},
                          epsilon=0.1, gamma=[0.9, 1.0], seeds=5, steps=200, log_every=10)
    grid = program.grid_inputs(spec, np.arange(spec.num_points))
    seed = np.uint32(spec.seed)
    whole = jax.device_get(jax.jit(lambda s, g: program.runs(spec, s, g))(seed, grid))
    assert spec.num_points * spec.seeds == 40
    monkeypatch.setattr(program, "BATCH_RUNS", 7)  # 40 runs: no divisor in [3.5, 7], so a remainder too
    batched = jax.device_get(jax.jit(lambda s, g: program.runs(spec, s, g))(seed, grid))
    assert set(whole) == set(batched)
    for k in whole:
        np.testing.assert_array_equal(batched[k], whole[k], err_msg=k)
    assert np.abs(whole["reward_sum"]).sum() > 0
