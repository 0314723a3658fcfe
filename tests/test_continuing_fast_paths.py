"""The continuing program's fast paths give the bits of the plain ones:
Access-Control's uniforms as scalar hashes are `jax.random.uniform`'s, and
runs in batches (`lax.map`) are the runs in one vmap."""
import jax
import numpy as np
import pytest

from bec_jax import threefry
from bec_jax.control.continuing import program, tabular
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.engine import tuning

# The engine's light compile options (the loop emitters at -O1; a continuing sweep's programs get them on a
# CPU): a program's bits are the same under any form, and these tests are not about the form.
LIGHT = tuning.CPU_LIGHT_OPTIONS if jax.default_backend() == "cpu" else None
# Odd and even counts, and Access-Control's own (its default 10 servers draw 11 uniforms a step).
COUNTS = (1, 2, 11, 12)


@pytest.mark.parametrize("fused", [False, True])
def test_uniforms_are_jax_random_uniforms(fused):
    """`tabular.uniforms` is `jax.random.uniform` bit for bit, for each count
    of COUNTS (one program for every count, JAX's draws in another)."""
    keys = jax.random.split(jax.random.key(7), 64)
    if fused:
        keys = threefry.fused(keys)
    got = jax.jit(lambda ks: [jax.vmap(lambda k: tabular.uniforms(k, n))(ks) for n in COUNTS],
                  compiler_options=LIGHT)(keys)
    want = jax.jit(lambda ks: [jax.vmap(lambda k: jax.random.uniform(k, (n,)))(ks) for n in COUNTS],
                   compiler_options=LIGHT)(keys)
    for n, g, w in zip(COUNTS, got, want):
        assert np.asarray(g).shape == (64, n)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=str(n))  # bit for bit
        assert np.asarray(g).std() > 0.2  # not a constant that matches by accident


def test_batch_runs_divides_where_it_can():
    assert program.batch_runs(100, 1600) == 100
    assert program.batch_runs(3200, 1600) == 1600
    assert program.batch_runs(84000, 1600) == 1500  # a divisor in [800, 1600]: no remainder program
    assert program.batch_runs(1601, 1600) == 1600   # a prime: the target, with a remainder


# Access-Control (its uniforms as scalar hashes) with 2 servers: the same step as the default 10's, with
# 3 hashes to compile, not 11.
@pytest.mark.parametrize("task,params", [("access_control", {"num_servers": 2}), ("two_choice", {})],
                         ids=["access_control", "two_choice"])
def test_runs_in_batches_equal_one_batch(task, params, monkeypatch):
    spec = ContinuingSpec(task=task, task_params=params, algorithm="q_vrc",
                          hyperparameters={"alpha": [0.1, 0.5], "eta": [0.0, 1.0]}, epsilon=0.1, gamma=[0.9, 1.0],
                          seeds=5, steps=200, log_every=10)
    grid = program.grid_inputs(spec, np.arange(spec.num_points))
    seed = np.uint32(spec.seed)
    whole = jax.device_get(jax.jit(lambda s, g: program.runs(spec, s, g), compiler_options=LIGHT)(seed, grid))
    assert spec.num_points * spec.seeds == 40
    monkeypatch.setattr(program, "BATCH_RUNS", 7)  # 40 runs: no divisor in [3.5, 7], so a remainder too
    batched = jax.device_get(jax.jit(lambda s, g: program.runs(spec, s, g), compiler_options=LIGHT)(seed, grid))
    assert set(whole) == set(batched)
    for k in whole:
        np.testing.assert_array_equal(batched[k], whole[k], err_msg=k)
    assert np.abs(whole["reward_sum"]).sum() > 0
