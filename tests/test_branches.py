"""Branches on the runs' data inside the scanned bodies (issue 45, item 5).

On XLA:GPU a `lax.cond` whose predicate is computed on the device reads it back
to the host each time round: in a scanned body, every block or every step. So a
program's form off the CPU (`tuning.KernelForm.branches`, "select") does the
work of such a branch every time and keeps what is needed with a select: the
prediction kernel's revert of diverged runs, a control step's resets and a
control block's revert. On the CPU the conditionals were measured to pay and
stay ("cond"). Here: the programs in the GPU form, lowered for CUDA, hold no
conditional at all (the simplest sound form of "none in a loop"), a seeded
fault is caught by the same check, and the two forms give the same bits, with
runs that diverge (frozen at their block's start: checked on each seed's values
block by block).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from bec_jax.control import program as control_program
from bec_jax.control import sweep as control_sweep
from bec_jax.control.spec import ControlSpec
from bec_jax.engine import tuning
from bec_jax.prediction import kernel, sweep
from bec_jax.prediction.spec import SweepSpec

ONE = jax.devices()[:1]
# alpha 2: 2 of the 7 seeds diverge (tests/test_memory.py's small_spec)
DIVERGING = SweepSpec(env="boyan_chain", algorithm="ctdc",
                      hyperparameters={"alpha": [0.05, 0.2, 2.0], "beta": [0.1], "zeta": [0.5]},
                      steps=120, seeds=7, log_every=10, divergence_bound=10.0)
# alpha 50 diverges (tests/test_control_sweep.py)
CONTROL = ControlSpec(task="cliff_walking", algorithm="q", hyperparameters={"alpha": [0.5, 50.0]}, seeds=2,
                      episodes=20, epsilon=0.1, block=10, divergence_bound=1e4)
PRED_ARRAYS = ("mean", "std", "sem", "alive", "final", "auc_seed", "diverged_step")


class _Device:
    """A device of another platform, as `tuning.choose_form` reads one."""

    def __init__(self, platform):
        self.platform = platform


def conditionals(text: str) -> list[str]:
    """The conditionals (`stablehlo.case` / `stablehlo.if`) in a module's text."""
    return [ln.strip()[:120] for ln in text.splitlines() if "stablehlo.case" in ln or "stablehlo.if" in ln]


def lower_cuda(fn, *args) -> str:
    """The StableHLO text of the jitted `fn` on `args`, exported for CUDA."""
    return export.export(fn, platforms=("cuda",))(*args).mlir_module()


def gpu_form(spec) -> tuning.KernelForm:
    """The form `tuning.choose_form` gives `spec` on a GPU."""
    return tuning.choose_form(spec, [_Device("gpu")])


@pytest.fixture(autouse=True)
def _float32_programs():
    """x64 off, as a float32 spec runs (another file's test may have left it on)."""
    with jax.enable_x64(False):
        yield


def test_forms():
    """Conditionals and paired blocks where they were measured to pay (the CPU;
    pairing with the fusion emitters only); elsewhere selects and single blocks."""
    assert tuning.branches_for("cpu") == "cond" and tuning.branches_for("gpu") == "select"
    cpu = tuning.choose_form(DIVERGING, ONE)
    assert cpu.branches == "cond" and cpu.emitters == "loop" and not cpu.paired
    fast = tuning.choose_form(DIVERGING, ONE, compiler_options=tuning.CPU_COMPILER_OPTIONS)
    assert fast.branches == "cond" and fast.paired and fast.share
    gpu = gpu_form(DIVERGING)
    assert gpu.branches == "select" and not gpu.paired and not gpu.share and gpu.compiler_options is None
    # the user's options on a GPU: still no pairing (never measured there)
    assert not tuning.choose_form(DIVERGING, [_Device("gpu")], compiler_options=tuning.CPU_COMPILER_OPTIONS).paired


def test_prediction_program_on_a_gpu_has_no_conditional():
    """The prediction program in its GPU form: the revert a select."""
    groups, chunks = sweep.plan(DIVERGING, DIVERGING.num_points)
    grid = sweep.chunk_grid(DIVERGING, groups[0], chunks[0])
    prog = sweep.make_program(DIVERGING, groups[0], DIVERGING.num_points, devices=ONE, form=gpu_form(DIVERGING))
    text = lower_cuda(prog.fn, np.uint32(0), grid)
    assert "stablehlo.while" in text and conditionals(text) == []
    # the CPU's form keeps the revert's conditional: the check sees it
    cpu = sweep.make_program(DIVERGING, groups[0], DIVERGING.num_points, devices=ONE,
                             form=tuning.choose_form(DIVERGING, ONE))
    assert len(conditionals(cpu.fn.lower(np.uint32(0), grid).as_text())) == 1


def test_control_program_on_a_gpu_has_no_conditional():
    """A control program with selects: the steps' resets and the blocks' revert."""
    groups, chunks = control_sweep.plan(CONTROL, CONTROL.num_points)
    grid = control_sweep.chunk_grid(CONTROL, groups[0], chunks[0])
    prog = control_program.make_program([CONTROL], [CONTROL.num_points], ONE, branches="select")
    text = lower_cuda(prog.fn, np.uint32(0), grid)
    assert "stablehlo.while" in text and conditionals(text) == []
    # on the CPU (the devices' platform): the resets' and the revert's conditionals
    cpu = control_program.make_program([CONTROL], [CONTROL.num_points], ONE)
    assert len(conditionals(cpu.fn.lower(np.uint32(0), grid).as_text())) == 2


def test_a_conditional_in_a_scan_is_caught():
    """Seeded fault: a scan whose body branches on its carry."""
    def body(c, x):
        return jax.lax.cond(jnp.any(c > 1.0), lambda: c * 0.5, lambda: c + x), None

    text = lower_cuda(jax.jit(lambda c, xs: jax.lax.scan(body, c, xs)[0]), jnp.ones(3), jnp.ones((5, 3)))
    assert len(conditionals(text)) == 1


def _select(monkeypatch):
    """The selects' form on this CPU: `tuning.branches_for` as off the CPU."""
    tuning.clear_compiled()
    monkeypatch.setattr(tuning, "branches_for", lambda platform: "select")


@pytest.mark.parametrize("options", [None, tuning.CPU_COMPILER_OPTIONS], ids=["light", "paired"])
def test_prediction_selects_give_the_same_bits(monkeypatch, options):
    """The selects' form gives the conditionals' bits, in the plain and the paired form."""
    cond = sweep.run(DIVERGING, progress=False, devices=ONE, compiler_options=options)
    _select(monkeypatch)
    sel = sweep.run(DIVERGING, progress=False, devices=ONE, compiler_options=options)
    tuning.clear_compiled()
    assert (cond.diverged_step > 0).sum() == 2  # 2 of 7 seeds, at alpha 2
    for k in PRED_ARRAYS:
        np.testing.assert_array_equal(getattr(sel, k), getattr(cond, k), err_msg=k)


def _per_seed_values(form):
    """Each seed's metric values, alive flags after every block, and divergence steps."""
    spec = DIVERGING
    groups, chunks = sweep.plan(spec, spec.num_points)
    grid = sweep.chunk_grid(spec, groups[0], chunks[0])
    kern = kernel.make_kernel(spec, groups[0], spec.num_points, form=form, devices=ONE)
    L = spec.steps // spec.log_every

    # Both forms compiled with the XLA options the CPU's form gives this sweep
    # (a light compile there, none elsewhere): the forms differ in their branches only.
    @functools.partial(jax.jit, compiler_options=tuning.choose_form(spec, ONE).compiler_options)
    def run(seed, grid):
        ctx = kern.setup(seed, (grid,), 0, spec.seeds)
        carry, (v0, _) = kern.start(ctx, True)
        carry, (vals, alive) = kern.blocks(ctx, carry, jnp.arange(L, dtype=jnp.int32), True)
        return jnp.concatenate([v0[None], vals]), alive, kern.finish(ctx, carry)["diverged_step"]

    return [np.asarray(a) for a in run(np.uint32(spec.seed), grid)], spec.log_every


def test_a_diverged_run_is_frozen_at_its_block_start():
    """In either form a run flagged at the end of block b keeps, from then on, the
    values it had at b's start; the two forms agree bit for bit."""
    (vals, alive, dstep), K = _per_seed_values(gpu_form(DIVERGING))  # (L+1, M, G, N), (L, ...), (G, N)
    cond, _ = _per_seed_values(tuning.choose_form(DIVERGING, ONE))
    for a, b in zip((vals, alive, dstep), cond):
        np.testing.assert_array_equal(a, b)
    assert (dstep > 0).sum() == 2
    for g, n in zip(*np.nonzero(dstep > 0)):
        b = dstep[g, n] // K - 1  # the block that flagged it
        assert alive[:b, g, n].all() and not alive[b:, g, n].any()
        frozen = vals[b, :, g, n]  # its values at block b's start
        assert np.isfinite(frozen).all()
        np.testing.assert_array_equal(vals[b:, :, g, n], np.broadcast_to(frozen, vals[b:, :, g, n].shape))


def test_control_selects_give_the_same_bits(monkeypatch):
    """The selects' form gives the conditionals' bits, with a diverging point."""
    cond = control_sweep.run(CONTROL, progress=False, devices=ONE)
    _select(monkeypatch)
    sel = control_sweep.run(CONTROL, progress=False, devices=ONE)
    tuning.clear_compiled()
    assert (cond.diverged_step[1] > 0).all() and (cond.diverged_step[0] == -1).all()
    for k in ("returns", "lengths", "diverged_step", "omega"):
        a, b = getattr(sel, k), getattr(cond, k)
        if a is None or b is None:
            assert a is b, k
        else:
            np.testing.assert_array_equal(a, b, err_msg=k)
