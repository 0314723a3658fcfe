"""Every program the library compiles, lowered for CUDA on a CPU-only machine
and read (issue 45, item 1).

A GPU runs a program differently from the CPU in ways no CPU test sees: its
default f32 matmul is TF32 (about 1e-3 relative error, on recent NVIDIA
cards), a host callback in a loop costs a round trip to the host each time
round, float64 runs at a fraction of float32's speed, and a batched solver call
is another kernel. `jax.export` lowers a program for CUDA without a GPU (the
lowering needs no device; jaxlib's CPU wheel holds the CUDA lowering rules), and
the StableHLO text says all four. Each program is lowered as the library
builds it (no program holds a progress callback), in the form the engine
picks off the CPU (`GPU_FORM`), and its text must hold:

  * no host callback anywhere (the simplest sound form of "none in a loop");
  * no float64 type (every spec here is float32: the spec does not ask for it);
  * every `stablehlo.dot_general` / `stablehlo.dot` at HIGHEST precision for
    both operands. No dot is exempt: the library's dots are all an algorithm's
    inner product (`algorithms.base._dot` above `UNROLL_DOT_MAX` features,
    `agents.value_learning.tree_vdot`), a dense Q (`control.transition.q_values`),
    a dense feature map (`control.features.fourier`) or an agent's network
    (experiments/ppo.py, experiments/actor_critic.py), each given
    `precision=HIGHEST` where it is written. The global flag
    (`jax_default_matmul_precision`) would print the same text and leak into the
    user's program, so every lowering here first checks that it is unset;
  * no batched LAPACK / cuSOLVER call (as tests/test_no_batched_lapack.py reads
    the CPU programs).

A host callback cannot be lowered for CUDA at all on a CPU-only jaxlib (its
lowering asks for the platform's runtime client), so a program holding one
fails `lower_cuda` before the check reads it; the seeded faults read the CPU
lowering instead. Not lowered here: experiments/neural_agent.py (a study
script, its network's dots at JAX's default precision). Each check is shown to
fail on a seeded fault (the last section)."""
from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from bec_jax import algorithms
from bec_jax.control import algorithms as control_algorithms
from bec_jax.control import sweep as control_sweep
from bec_jax.control import tasks as control_tasks
from bec_jax.control.continuing import deep
from bec_jax.control.continuing import learners as continuing_learners
from bec_jax.control.continuing import sweep as continuing_sweep
from bec_jax.control.continuing import tasks as continuing_tasks
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.control.spec import ControlSpec
from bec_jax.engine import tuning
from bec_jax.prediction import programs as prediction_programs
from bec_jax.prediction import sweep
from bec_jax.prediction.spec import SweepSpec

# ------------------------------------------------------------------ the checks

# `stablehlo.custom_call @xla_ffi_python_gpu_callback(...)` (CPU: ..._cpu_callback; older jaxlibs
# xla_python_*_callback); in HLO `custom_call_target="..."`. Send/recv/in- and outfeed move data to the host too.
_CALLBACK = re.compile(r'custom_call @(\w*callback\w*)|custom_call_target="(\w*callback\w*)"')
_HOST_TRANSFER = re.compile(r'stablehlo\.(send|recv|infeed|outfeed)\b')
# A float64 element type: `tensor<f64>`, `tensor<3x4xf64>`, `complex<f64>`.
_F64 = re.compile(r'[<x](?:complex<)?f64>')
# `stablehlo.dot_general %a, %b, ..., precision = [HIGHEST, HIGHEST] : (...)`; the generic
# form writes `precision_config = [#stablehlo<precision HIGHEST>, ...]`.
_DOT = re.compile(r'stablehlo\.dot(?:_general)?\b')
_PRECISION = re.compile(r'precision(?:_config)?\s*=\s*\[([^\]]*)\]')
# CPU LAPACK (`lapack_sgeqrf_ffi`) and the GPUs' solvers (`cusolver_getrf_ffi`, `hipsolver_...`, cuBLAS's
# batched getrf); the operand types follow the attributes: `{...} : (tensor<4x8x8xf32>) -> ...`.
_SOLVER = re.compile(r'custom_call @((?:lapack|cusolver|hipsolver|cublas|hipblas)_\w+)')
_OPERANDS = re.compile(r'\}\s*:\s*\(([^)]*)\)\s*->')
_TENSOR = re.compile(r'tensor<([^>]*)>')
_BATCH_DIMS = re.compile(r'num_batch_dims\s*=\s*"(\d+)"')


def host_callbacks(text: str) -> list[str]:
    """The host callbacks and host transfers anywhere in the module `text`."""
    found = [a or b for a, b in _CALLBACK.findall(text)]
    return found + [m.group(0) for m in _HOST_TRANSFER.finditer(text)]


def f64_types(text: str) -> list[str]:
    """Every float64 element type written in the module `text`."""
    return _F64.findall(text)


def imprecise_dots(text: str) -> list[str]:
    """The dots of the module `text` whose precision is not HIGHEST for both
    operands (a dot with no precision attribute at all is DEFAULT: TF32 on a GPU)."""
    bad = []
    for line in text.splitlines():
        if not _DOT.search(line):
            continue
        m = _PRECISION.search(line)
        entries = [e.strip() for e in m.group(1).split(",")] if m else []
        if len(entries) != 2 or not all(e.endswith("HIGHEST") or e.endswith("HIGHEST>") for e in entries):
            bad.append(line.strip()[:200])
    return bad


def dot_count(text: str) -> int:
    """How many dots the module `text` holds."""
    return sum(1 for line in text.splitlines() if _DOT.search(line))


def solver_calls(text: str) -> list[tuple[str, list[int], list[int]]]:
    """(target, operand ranks, num_batch_dims) of each LAPACK / GPU solver call;
    ranks None where the operand types cannot be read."""
    out = []
    for line in text.splitlines():
        m = _SOLVER.search(line)
        if m:
            ops = _OPERANDS.search(line)
            ranks = [len(t.split("x")) - 1 for t in _TENSOR.findall(ops.group(1))] if ops else None
            out.append((m.group(1), ranks, [int(b) for b in _BATCH_DIMS.findall(line)]))
    return out


def batched_solver_calls(text: str) -> list[str]:
    """The solver calls of `text` that work on a batch: an operand of rank above 2
    or `num_batch_dims` above 0; one whose operands cannot be read counts as
    batched (a change of the text's format fails the tests, never passes them)."""
    return [f"{t} ranks {r} num_batch_dims {b}" for t, r, b in solver_calls(text)
            if r is None or max(r, default=0) > 2 or any(b)]


def problems(text: str, x64: bool = False) -> dict:
    """Every check's findings on the module `text` (empty lists: it passes);
    `x64`: the spec asks for float64."""
    return {"host callbacks": host_callbacks(text), "float64": [] if x64 else f64_types(text)[:5],
            "dots not at HIGHEST": imprecise_dots(text)[:5], "batched solver calls": batched_solver_calls(text)}


def assert_portable(text: str, x64: bool = False) -> None:
    """Every check passes on `text`."""
    found = {k: v for k, v in problems(text, x64).items() if v}
    assert not found, found


def lower_cuda(fn, *args) -> str:
    """The StableHLO text of the jitted `fn` on `args` (arrays or shape structs),
    exported for CUDA. The global matmul precision must be unset: it would print
    HIGHEST for a dot that does not ask for it."""
    assert jax.config.jax_default_matmul_precision is None
    return export.export(fn, platforms=("cuda",))(*args).mlir_module()


# The form `tuning.choose_form` gives a group on a GPU (no options, fusion, no shared scalars).
GPU_FORM = tuning.KernelForm(platform="gpu", emitters="fusion", paired=False, share=False, unroll=tuning.UNROLL,
                             xla_options=(), branches="select")
ONE = jax.devices()[:1]
# 40 > UNROLL_DOT_MAX features. 5 states: a metric's product is unrolled over its map's rows (as many as the
# states at most, `theory.metrics`), which at 50 states made the text and its lowering 2-3 times as long.
DENSE_ENV = {"env": "random_mdp", "env_params": {"states": 5, "features": 40}}


def _required(alg) -> dict:
    """0.1 for each hyperparameter of `alg` that has no default."""
    return {h.name: 0.1 for h in alg.hyperparameters if h.default is None}


def _prediction_spec(name: str, **env) -> SweepSpec:
    env = env or {"env": "boyan_chain"}
    return SweepSpec(algorithm=name, hyperparameters=_required(algorithms.get(name)), seeds=4, steps=20,
                     log_every=10, **env)


@pytest.fixture(autouse=True)
def _float32_programs():
    """Each program here is lowered with x64 off, as a float32 spec runs (the
    command line turns x64 on for a float64 spec, for the rest of its process:
    a test of another file on this worker may have left it on)."""
    with jax.enable_x64(False):
        yield


def test_the_library_sets_no_global_precision():
    """Importing the library and the agents leaves JAX's matmul precision as the
    user has it (here: JAX's default, unset)."""
    pytest.importorskip("gymnax")
    from bec_jax.experiments import actor_critic, ppo  # noqa: F401

    assert jax.config.jax_default_matmul_precision is None


# ------------------------------------------------------------- prediction

@pytest.mark.parametrize("name", algorithms.names())
def test_prediction_program(name):
    """A prediction sweep's whole program, for every registered algorithm (Boyan's
    chain: 4 features, the unrolled dot products, no dot in the text)."""
    spec = _prediction_spec(name)
    groups, chunks = sweep.plan(spec, spec.num_points)
    prog = sweep.make_program(spec, groups[0], spec.num_points, devices=ONE, form=GPU_FORM)
    assert_portable(lower_cuda(prog.fn, np.uint32(0), sweep.chunk_grid(spec, groups[0], chunks[0])))


@pytest.mark.parametrize("name", ["tdc", "tdrc", "etd"])  # td, ctdc, gtd2: in the joint program
def test_prediction_program_with_dense_features(name):
    """With 40 features (above `UNROLL_DOT_MAX`) the inner products are dots: all at HIGHEST."""
    spec = _prediction_spec(name, **DENSE_ENV)
    groups, chunks = sweep.plan(spec, spec.num_points)
    prog = sweep.make_program(spec, groups[0], spec.num_points, devices=ONE, form=GPU_FORM)
    text = lower_cuda(prog.fn, np.uint32(0), sweep.chunk_grid(spec, groups[0], chunks[0]))
    assert dot_count(text) > 0
    assert_portable(text)


def test_prediction_segment_programs():
    """A segmented run's start / advance / finish programs, for a seed chunk."""
    spec = _prediction_spec("ctdc", **DENSE_ENV)
    groups, chunks = sweep.plan(spec, spec.num_points)
    grid = sweep.chunk_grid(spec, groups[0], chunks[0])
    sp = prediction_programs.make_segment_programs(spec, groups[0], spec.num_points, 2, 1, ONE, form=GPU_FORM)
    seed, offset = np.uint32(0), np.int32(0)
    carry = jax.eval_shape(sp.start, seed, grid, offset)[0]
    texts = [lower_cuda(sp.start, seed, grid, offset), lower_cuda(sp.advance, seed, grid, offset, carry, offset),
             lower_cuda(sp.finish, seed, grid, offset, carry)]
    assert dot_count(texts[1]) > 0
    for text in texts:
        assert_portable(text)


def test_prediction_search_program():
    """A prediction search (engine.search, prediction.programs.searched) as one
    program, with dense features: the rungs' loops over batches, the ranking (a
    sort) and the survivors' gathers add no callback, no float64 and no dot
    below HIGHEST."""
    spec = SweepSpec(algorithm="ctdc", hyperparameters={"alpha": [0.01 * (k + 1) for k in range(9)], "beta": [0.1],
                     "zeta": [0.1]}, seeds=2, steps=100, log_every=10, search={"rate": 3}, **DENSE_ENV)
    assert spec.search_schedule().points == (9, 3)
    groups, chunks = sweep.plan(spec, spec.num_points)
    prog = sweep.make_program(spec, groups[0], spec.num_points, devices=ONE, form=GPU_FORM)
    text = lower_cuda(prog.fn, np.uint32(0), sweep.chunk_grid(spec, groups[0], chunks[0]))
    assert "sort" in text  # the ranking is in the program, not on the host
    assert dot_count(text) > 0
    assert_portable(text)


def test_prediction_joint_program():
    """One program for three sweeps that `run_many` packs together."""
    specs = [_prediction_spec(name, **DENSE_ENV) for name in ("td", "ctdc", "gtd2")]
    assert sweep.shared_programs(specs, ONE) == [[0, 1, 2]]
    members, grids = [], []
    for spec in specs:
        groups, chunks = sweep.plan(spec, spec.num_points)
        members.append((spec, groups[0], spec.num_points))
        grids.append(sweep.chunk_grid(spec, groups[0], chunks[0]))
    prog = prediction_programs.make_joint_program(members, ONE, form=GPU_FORM)
    text = lower_cuda(prog.fn, np.uint32(0), tuple(grids))
    assert dot_count(text) > 0
    assert_portable(text)


# ---------------------------------------------------------------- control

# CartPole's velocities are unbounded: the Fourier basis needs a box.
FOURIER = {"task": "gymnax:CartPole-v1", "task_params": {"features": "fourier", "order": 2, "low": [-2.4, -3.0, -0.21, -3.5],
                                                         "high": [2.4, 3.0, 0.21, 3.5]}}


def _control_text(spec: ControlSpec) -> str:
    groups, chunks = control_sweep.plan(spec, spec.num_points)
    prog = control_sweep.make_program(spec, groups[0], spec.num_points, devices=ONE, form=GPU_FORM)
    return lower_cuda(prog.fn, np.uint32(0), control_sweep.chunk_grid(spec, groups[0], chunks[0]))


@pytest.mark.parametrize("task", control_tasks.names())
def test_control_program(task):
    """A control sweep's program on every registered task (tile-coded or one-hot:
    sparse features, no dot)."""
    spec = ControlSpec(task=task, algorithm="cgq", hyperparameters=_required(control_algorithms.get("cgq")),
                       seeds=2, episodes=2)
    assert_portable(_control_text(spec))


@pytest.mark.parametrize("name", [n for n in control_algorithms.names() if n not in ("q", "cgq")])  # in the joint program
def test_control_program_with_fourier_features(name):
    """Every control algorithm on a Fourier basis: the feature map and Q are dots."""
    spec = ControlSpec(algorithm=name, hyperparameters=_required(control_algorithms.get(name)), seeds=2, episodes=2,
                       **FOURIER)
    text = _control_text(spec)
    assert dot_count(text) > 0
    assert_portable(text)


def test_control_joint_program():
    """One program for two control sweeps of one task (`control.sweep.joint_program`)."""
    specs = [ControlSpec(algorithm=name, hyperparameters=_required(control_algorithms.get(name)), seeds=2,
                         episodes=2, **FOURIER) for name in ("q", "cgq")]
    assert control_sweep.shared_programs(specs, ONE) == [[0, 1]]
    groups, chunks = control_sweep.joint_chunks(specs, [None, None], ONE)
    sizes = [len(c.indices) for c in chunks]
    prog = control_sweep.joint_program(specs, groups, sizes, ONE, GPU_FORM)
    grids = tuple(control_sweep.joint_grid(s, g, c, 1) for s, g, c in zip(specs, groups, chunks))
    text = lower_cuda(prog.fn, np.uint32(0), grids)
    assert dot_count(text) > 0
    assert_portable(text)


def test_control_search_program():
    """An episodic control search (engine.search, control.program.searched) as
    one program, on a Fourier basis: the rungs' loops, each batch's loop until
    its runs reach the rung's end, the ranking (a sort) and the survivors'
    gathers add no callback, no float64 and no dot below HIGHEST."""
    hyper = {**_required(control_algorithms.get("cgq")), "alpha": [0.01 * (k + 1) for k in range(9)]}
    spec = ControlSpec(algorithm="cgq", hyperparameters=hyper, seeds=2, episodes=2, search={"rate": 3}, **FOURIER)
    assert spec.search_schedule().points == (9, 3)
    text = _control_text(spec)
    assert "sort" in text  # the ranking is in the program, not on the host
    assert dot_count(text) > 0
    assert_portable(text)


# ------------------------------------------------------------- continuing

def _continuing_text(spec: ContinuingSpec) -> str:
    groups, chunks = continuing_sweep.plan(spec, spec.num_points)
    prog = continuing_sweep.make_program(spec, groups[0], spec.num_points, devices=ONE)
    return lower_cuda(prog.fn, np.uint32(0), continuing_sweep.chunk_grid(spec, groups[0], chunks[0]))


def _continuing_spec(task: str, name: str, **task_params) -> ContinuingSpec:
    return ContinuingSpec(task=task, task_params=task_params, algorithm=name, seeds=2, steps=100, log_every=10,
                          hyperparameters=_required(continuing_learners.get(name)))


@pytest.mark.parametrize("task", continuing_tasks.names())
def test_continuing_program(task):
    """A continuing sweep's program on every registered task."""
    # Access-Control with 2 servers: its step's hashes are one a server (and one), each traced and lowered.
    params = {"num_servers": 2} if task == "access_control" else {}
    assert_portable(_continuing_text(_continuing_spec(task, "q_vrc", **params)))


# rvi_q: sparse only; q_vrc: in the search program (test_continuing_search_program), on the same features.
@pytest.mark.parametrize("name", [n for n in continuing_learners.names()
                                  if n not in ("rvi_q", "q_vrc") and not deep.is_deep(continuing_learners.get(n))])
def test_continuing_program_with_dense_features(name):
    """Every continuing learner that takes dense features, on Catch's board: Q is a dot."""
    text = _continuing_text(_continuing_spec("catch", name, features="board"))
    assert dot_count(text) > 0
    assert_portable(text)


# Two in the suite (the uncentered learner full-batch, their CDQN sampled), every pair with the long checks.
@pytest.mark.parametrize("name,batch", [
    pytest.param(d.name, b, marks=() if (d.name, b) in (("dqn", "full"), ("cdqn_unbiased", 4)) else pytest.mark.long)
    for d in deep.LEARNERS for b in ("full", 4)])
def test_continuing_network_learner_program(name, batch):
    """Every network learner's program (continuing.deep), full-batch and
    sampled: its network's products (the acting, the update's passes and
    their gradients) are dots at HIGHEST, no TF32 anywhere."""
    spec = ContinuingSpec(task="catch", task_params={"features": "board"}, algorithm=name, seeds=2, steps=100,
                          log_every=10, hyperparameters=_required(continuing_learners.get(name)),
                          learner_params={"hidden": [8], "buffer": 16, "batch": batch, "update_period": 5,
                                          "sync_period": 10})
    text = _continuing_text(spec)
    assert dot_count(text) >= 6  # act, target pass, network pass, and its two weight gradients per layer at least
    assert_portable(text)


@pytest.mark.parametrize("name", ["q_vrc", "cdqn"])
def test_continuing_search_program(name):
    """A successive-halving search (engine.search) as one program, for a linear
    and a network learner: the rungs' loops, the ranking (a sort) and the
    survivors' gathers add no callback, no float64 and no dot below HIGHEST."""
    params = {"hidden": [8], "buffer": 16, "batch": 4, "update_period": 5, "sync_period": 10} if name == "cdqn" else {}
    hyper = _required(continuing_learners.get(name))
    hyper["alpha"] = [0.01 * (k + 1) for k in range(9)]
    spec = ContinuingSpec(task="catch", task_params={"features": "board"}, algorithm=name, seeds=2, steps=100,
                          log_every=10, hyperparameters=hyper, learner_params=params, search={"rate": 3})
    assert spec.search_schedule().points[0] == 9 and len(spec.search_schedule().points) >= 2
    text = _continuing_text(spec)
    assert "sort" in text  # the ranking is in the program, not on the host
    assert dot_count(text) > 0  # Catch's board: Q is a dot (q_vrc's dense case is this one)
    assert_portable(text)


# ------------------------------------------------------------------ agents

@pytest.fixture(scope="module")
def ppo():
    """`bec_jax.experiments.ppo` (it needs gymnax)."""
    pytest.importorskip("gymnax")
    from bec_jax.experiments import ppo
    return ppo


@pytest.mark.parametrize("task", ["CartPole-v1", pytest.param("Acrobot-v1", marks=pytest.mark.long),
                                  pytest.param("MountainCar-v0", marks=pytest.mark.long)])
def test_ppo_program(ppo, task):
    """PPO's whole program (vmapped over variants and seeds): its network's dots
    (and their gradients' transposes) at HIGHEST, its initializer's QRs one
    matrix at a time."""
    assert task in ppo.TASKS
    cfg = dataclasses.replace(ppo.small_config(), tasks=(task,))
    train = ppo.make_train(cfg, task, num_updates=1)
    text = lower_cuda(train, jax.random.key(0), *ppo.variant_arrays(cfg, ppo.VARIANTS, 0.5))
    assert dot_count(text) > 0 and "cusolver_geqrf_ffi" in [t for t, _, _ in solver_calls(text)]
    assert_portable(text)


def test_actor_critic_program():
    """The actor-critic experiment's whole program."""
    pytest.importorskip("gymnax")
    from bec_jax.experiments import actor_critic

    train = actor_critic.make_train(actor_critic.small_config())
    f = jnp.asarray([0.0, 0.1, 0.0], jnp.float32)
    text = lower_cuda(train, jax.random.key(0), f, f, f)
    assert dot_count(text) > 0
    assert_portable(text)


def test_value_learning_tdc_direction():
    """`agents.value_learning`'s TDC correction (its `tree_vdot`) for a value
    function whose own dot is at HIGHEST: every dot of the text is."""
    from bec_jax.agents import value_learning

    def v(params, x):
        return jnp.tanh(jnp.matmul(x, params["w"], precision=jax.lax.Precision.HIGHEST)).sum()

    def direction(params, h, x, x2):
        return value_learning.centered_tdc_direction(v, params, h, 0.0, x, jnp.float32(1.0), jnp.float32(0.9), x2)

    params = {"w": jnp.ones((3, 2), jnp.float32)}
    x = jnp.ones((3,), jnp.float32)
    text = lower_cuda(jax.jit(direction), params, params, x, x)
    assert dot_count(text) > 0
    assert_portable(text)


# --------------------------------------------------- the checks, seeded faults

S = jax.ShapeDtypeStruct
VEC, MAT = S((4,), jnp.float32), S((4, 4), jnp.float32)


def _scan(step):
    """A jitted (x (4,), w (4, 4)) -> x after 3 steps of `step(x, w)` in a `lax.scan`."""
    return jax.jit(lambda x, w: jax.lax.scan(lambda c, _: (step(c, w), None), x, None, length=3)[0])


def test_callback_check_finds_a_callback_in_a_loop():
    """A `jax.debug.callback` in a scan's body: the check finds it in the CPU
    lowering (StableHLO and HLO); the CUDA lowering refuses it outright on this
    jaxlib (a host callback needs the platform's runtime client to lower), so
    a program with one fails `lower_cuda` as well as the check."""
    def step(c, w):
        jax.debug.callback(lambda v: None, c)
        return c + 1.0

    fn = _scan(step)
    lowered = fn.lower(VEC, MAT)
    for text in (lowered.as_text(), lowered.as_text(dialect="hlo")):
        assert host_callbacks(text), text
    with pytest.raises(ValueError):
        lower_cuda(fn, VEC, MAT)
    assert host_callbacks(_scan(lambda c, w: c + 1.0).lower(VEC, MAT).as_text()) == []


@pytest.mark.filterwarnings("ignore:Explicitly requested dtype float64")
def test_f64_check_finds_float64():
    """A float64 constant under x64 is found (and allowed where the spec asks
    for float64); without x64 the same function has none."""
    fn = jax.jit(lambda x: x * jnp.float64(2.0))
    with jax.enable_x64(True):
        text = lower_cuda(fn, VEC)
    assert f64_types(text) and problems(text)["float64"] and not problems(text, x64=True)["float64"]
    assert f64_types(lower_cuda(fn, VEC)) == []


@pytest.mark.parametrize("dot, bad", [
    (lambda c, w: jnp.dot(c, w), True),
    (lambda c, w: jnp.einsum("i,ij->j", c, w), True),
    (lambda c, w: c @ w, True),
    (lambda c, w: jnp.dot(c, w, precision=jax.lax.Precision.HIGH), True),
    (lambda c, w: jnp.dot(c, w, precision=(jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT)), True),
    (lambda c, w: jnp.dot(c, w, precision=jax.lax.Precision.HIGHEST), False),
    (lambda c, w: jnp.einsum("i,ij->j", c, w, precision=jax.lax.Precision.HIGHEST), False),
], ids=["dot", "einsum", "matmul", "high", "half", "highest", "einsum_highest"])
def test_precision_check_finds_dots_not_at_highest(dot, bad):
    """A dot in a scan's body at the default (TF32 on a GPU) or any precision
    below HIGHEST for either operand is found; one at HIGHEST is not."""
    text = lower_cuda(_scan(dot), VEC, MAT)
    assert dot_count(text) == 1
    assert bool(imprecise_dots(text)) is bad


def test_precision_check_finds_the_library_dot_without_highest(monkeypatch):
    """The fix undone (`algorithms.base._dot` as it was, a default-precision
    `jnp.dot` above `UNROLL_DOT_MAX` features): the dense prediction program fails."""
    from bec_jax.algorithms import base

    def unfixed(a, b):
        if a.shape[-1] > base.UNROLL_DOT_MAX:
            return jnp.dot(a, b)
        return sum(a[i] * b[i] for i in range(1, a.shape[-1])) + a[0] * b[0]

    monkeypatch.setattr(base, "_dot", unfixed)
    spec = _prediction_spec("tdc", **DENSE_ENV)
    groups, chunks = sweep.plan(spec, spec.num_points)
    prog = sweep.make_program(spec, groups[0], spec.num_points, devices=ONE, form=GPU_FORM)
    assert imprecise_dots(lower_cuda(prog.fn, np.uint32(0), sweep.chunk_grid(spec, groups[0], chunks[0])))


def test_a_global_precision_flag_is_refused():
    """The global flag prints HIGHEST on a dot that does not ask for it (and the
    user's program would inherit it): `lower_cuda` refuses to lower under it."""
    with jax.default_matmul_precision("highest"):
        text = export.export(_scan(lambda c, w: c @ w), platforms=("cuda",))(VEC, MAT).mlir_module()
        assert imprecise_dots(text) == []  # what the text alone cannot tell apart
        with pytest.raises(AssertionError):
            lower_cuda(_scan(lambda c, w: c @ w), VEC, MAT)


@pytest.mark.parametrize("op", [lambda a: jnp.linalg.solve(a, a[:, :1]), lambda a: jnp.linalg.qr(a),
                                lambda a: jnp.linalg.cholesky(a)], ids=["solve", "qr", "cholesky"])
def test_solver_check_finds_a_batched_call(op):
    """A vmapped solve, QR or Cholesky lowers for CUDA to a cuSOLVER call with a
    batch dimension: found. The same op on one matrix, and a vmap of it through
    `sequential_vmap`, hold solver calls none of which is batched."""
    many = S((3, 4, 4), jnp.float32)
    text = lower_cuda(jax.jit(jax.vmap(op)), many)
    assert batched_solver_calls(text), text
    for fn, arg in ((jax.jit(op), MAT), (jax.jit(jax.vmap(jax.custom_batching.sequential_vmap(op))), many)):
        text = lower_cuda(fn, arg)
        assert solver_calls(text) and batched_solver_calls(text) == []
