"""No program the project compiles holds a batched LAPACK call (issue 28, item 2).

jaxlib 0.10.x on CPU splits a LAPACK custom call whose operand has a batch axis
(QR, Cholesky, eigh, ... under `vmap`) over XLA's CPU thread pool and waits for
the pieces on a thread of that same pool; when every pool thread waits so, the
process deadlocks, about once in 100-400 program starts on two cores (jax-ml/jax
#36927, #39292; fixed upstream after 0.11.0). A hang that rare shows in no test
run, so these tests read the programs instead: each is lowered (not compiled,
not run) and its text searched for a `lapack_*` custom call with an operand of
rank above 2. The checker itself is tested on programs that do hold one.

The hang is jaxlib's CPU LAPACK: every program here is lowered for JAX's CPU
backend (the `cpu_backend` fixture, `jax.devices("cpu")`), on a GPU machine too,
where the default backend would lower them to cuSOLVER calls instead."""
import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax import algorithms
from bec_jax.control import algorithms as control_algorithms
from bec_jax.control import sweep as control_sweep
from bec_jax.control import tasks as control_tasks
from bec_jax.control.spec import ControlSpec
from bec_jax.engine import tuning
from bec_jax.prediction import sweep
from bec_jax.prediction.spec import SweepSpec

pytestmark = pytest.mark.usefixtures("cpu_backend")

# StableHLO: `stablehlo.custom_call @lapack_sgeqrf_ffi(%0) {...} : (tensor<4x8x8xf32>) -> ...`;
# HLO: `custom-call(...), custom_call_target="lapack_sgeqrf_ffi", operand_layout_constraints={f32[4,8,8]{1,2,0}}`.
_LAPACK = re.compile(r'custom_call @lapack_|custom_call_target="lapack_')
_TARGET = re.compile(r'lapack_\w+')
_STABLEHLO_OPERANDS = re.compile(r'\}\s*:\s*\(([^)]*)\)\s*->')
_TENSOR = re.compile(r'tensor<([^>]*)>')
_HLO_OPERANDS = re.compile(r'operand_layout_constraints=\{(.*?)\}, ')
_HLO_SHAPE = re.compile(r'\w+\[([\d,]*)\]')
_BATCH_DIMS = re.compile(r'num_batch_dims\s*=\s*"(\d+)"')


def _operand_ranks(line: str) -> list[int] | None:
    """The ranks of a custom call's operands, from its StableHLO type or its HLO
    layout constraints; None where the line has neither."""
    m = _STABLEHLO_OPERANDS.search(line)
    if m:
        return [len(t.split("x")) - 1 for t in _TENSOR.findall(m.group(1))]
    m = _HLO_OPERANDS.search(line)
    if m:
        return [len(s.split(",")) if s else 0 for s in _HLO_SHAPE.findall(m.group(1))]
    return None


def batched_lapack_calls(text: str) -> list[str]:
    """The LAPACK custom calls of a StableHLO or HLO module `text` that work on a
    batch: an operand of rank above 2, or `num_batch_dims` above 0. A LAPACK call
    whose operands cannot be read counts as batched, so that a change in the text's
    format fails the tests instead of passing them."""
    found = []
    for line in text.splitlines():
        if not _LAPACK.search(line):
            continue
        ranks = _operand_ranks(line)
        batch_dims = [int(b) for b in _BATCH_DIMS.findall(line)]
        if ranks is None or max(ranks, default=0) > 2 or any(batch_dims):
            found.append(f"{_TARGET.search(line).group(0)} operand ranks {ranks} num_batch_dims {batch_dims}")
    return found


def lapack_targets(text: str) -> list[str]:
    """Every LAPACK custom call target named in `text`, batched or not."""
    return [_TARGET.search(line).group(0) for line in text.splitlines() if _LAPACK.search(line)]


# ------------------------------------------------------ the checker, controls

@pytest.mark.parametrize("op", [jnp.linalg.qr, jnp.linalg.cholesky, jnp.linalg.eigh])
def test_checker_finds_a_batched_call(op):
    """The positive control: a vmapped QR, Cholesky or eigh is the batched call
    that deadlocks; the checker finds it in the StableHLO, the HLO and the
    compiled module."""
    x = jnp.broadcast_to(jnp.eye(8, dtype=jnp.float32), (4, 8, 8))
    lowered = jax.jit(jax.vmap(op)).lower(x)
    for text in (lowered.as_text(), lowered.as_text(dialect="hlo"), lowered.compile().as_text()):
        assert batched_lapack_calls(text), text


def test_checker_passes_unbatched_calls_and_sequential_vmap():
    """The negative control: one matrix's QR, and a vmap of it through
    `sequential_vmap` (the fix), hold LAPACK calls, none of them batched."""
    x = jnp.broadcast_to(jnp.eye(8, dtype=jnp.float32), (4, 8, 8))
    qr = jax.custom_batching.sequential_vmap(lambda a: jnp.linalg.qr(a))
    for lowered in (jax.jit(jnp.linalg.qr).lower(x[0]), jax.jit(jax.vmap(qr)).lower(x)):
        for text in (lowered.as_text(), lowered.as_text(dialect="hlo")):
            assert "lapack_sgeqrf_ffi" in lapack_targets(text)
            assert batched_lapack_calls(text) == []


# ----------------------------------------------------------- the experiments

PPO_TASKS = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0")


@pytest.fixture(scope="module")
def ppo():
    """`bec_jax.experiments.ppo` (it needs gymnax)."""
    pytest.importorskip("gymnax")
    from bec_jax.experiments import ppo
    return ppo


@pytest.mark.parametrize("task", PPO_TASKS)
def test_ppo_program(ppo, task):
    """PPO's whole program, vmapped over variants and seeds, for each task it
    supports: the orthogonal initializer's QRs are in it, one matrix at a time."""
    assert set(PPO_TASKS) == set(ppo.TASKS)
    cfg = dataclasses.replace(ppo.small_config(), tasks=(task,))
    train = ppo.make_train(cfg, task, num_updates=1)
    text = train.lower(jax.random.key(0), *ppo.variant_arrays(cfg, ppo.VARIANTS, 0.5)).as_text()
    assert "lapack_sgeqrf_ffi" in lapack_targets(text)
    assert batched_lapack_calls(text) == []


def test_ppo_initial_weights_are_the_per_key_initializer(ppo):
    """Vmapped over 16 seeds, PPO's initial weights are bit for bit the plain
    `jax.nn.initializers.orthogonal` applied to one key at a time (the same
    computation on the same machine), and so are the whole networks' (of one
    hidden layer: a hidden and an output layer each, in four draws where two
    hidden layers take six). Every program compiled with the engine's light
    XLA:CPU options (about half the compile of its random draws; both sides alike)."""
    jit = functools.partial(jax.jit, compiler_options=tuning.CPU_LIGHT_OPTIONS)
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(16))
    scale = np.sqrt(2.0)
    got = jit(jax.vmap(lambda k: ppo.orthogonal(k, (64, 64), scale)))(keys)
    plain = jit(lambda k: jax.nn.initializers.orthogonal(scale)(k, (64, 64), jnp.float32))
    np.testing.assert_array_equal(got, jnp.stack([plain(k) for k in keys]))
    net = lambda k: ppo.init_params(k, 4, 2, (64,))
    one = jit(net)
    init = jit(jax.vmap(net))(keys)
    one_by_one = [one(k) for k in keys]
    for i, leaf in enumerate(jax.tree.leaves(init)):
        np.testing.assert_array_equal(leaf, np.stack([jax.tree.leaves(p)[i] for p in one_by_one]))


def test_actor_critic_program():
    """The actor-critic experiment's whole program (LeCun-normal init: no LAPACK)."""
    pytest.importorskip("gymnax")
    from bec_jax.experiments import actor_critic

    train = actor_critic.make_train(actor_critic.small_config())
    f = jnp.asarray([0.0, 0.1, 0.0], jnp.float32)
    assert batched_lapack_calls(train.lower(jax.random.key(0), f, f, f).as_text()) == []


def test_neural_agent_program():
    """The neural agent's whole program (vmap over learning rates, methods, seeds)."""
    from bec_jax.experiments import neural_agent

    train = neural_agent.make_train(neural_agent.small_config())
    assert batched_lapack_calls(train.lower(jax.random.key(0)).as_text()) == []


# ------------------------------------------------------------ the sweep engines

def _required(alg) -> dict:
    """0.1 for each hyperparameter of `alg` that has no default."""
    return {h.name: 0.1 for h in alg.hyperparameters if h.default is None}


@pytest.mark.parametrize("name", algorithms.names())
def test_prediction_sweep_program(name):
    """A prediction sweep's program for every registered algorithm."""
    spec = SweepSpec(env="boyan_chain", algorithm=name, hyperparameters=_required(algorithms.get(name)),
                     seeds=2, steps=20, log_every=10)
    groups, chunks = sweep.plan(spec, spec.num_points)
    prog = sweep.make_program(spec, groups[0], spec.num_points, devices=jax.devices("cpu")[:1])
    text = prog.fn.lower(np.uint32(0), sweep.chunk_grid(spec, groups[0], chunks[0])).as_text()
    assert batched_lapack_calls(text) == []


@pytest.mark.parametrize("task", control_tasks.names())
def test_control_program(task):
    """A control sweep's program on every registered task."""
    spec = ControlSpec(task=task, algorithm="cgq", hyperparameters=_required(control_algorithms.get("cgq")),
                       seeds=2, episodes=2)
    groups, chunks = control_sweep.plan(spec, spec.num_points)
    prog = control_sweep.make_program(spec, groups[0], spec.num_points, devices=jax.devices("cpu")[:1])
    grid = control_sweep.chunk_grid(spec, groups[0], chunks[0])
    assert batched_lapack_calls(prog.fn.lower(np.uint32(0), grid).as_text()) == []
