"""The kernel's form (`engine.tuning.KernelForm`) and the algorithms' opt-in to
shared scalars (`Algorithm.shares_scalars`): the engine traces an update under
`algorithms.sharing` only where the form shares and the algorithm declares it,
with the same bits either way."""
import numpy as np

from bec_jax import algorithms
from bec_jax.algorithms import ctdc
from bec_jax.engine import tuning
from bec_jax.prediction import sweep
from bec_jax.prediction.spec import SweepSpec


def test_every_built_in_algorithm_declares_its_shared_scalars():
    # Each built-in update computes its TD error (and dot products) with td_error / vdot.
    for name in algorithms.names():
        assert algorithms.get(name).shares_scalars, name


def _user_ctdc(name, shares):
    def update(state, tr, alpha, beta, zeta):  # a user's update reusing the library's
        return ctdc.update(state, tr, alpha, beta, zeta)
    return algorithms.Algorithm(name=name, init=ctdc.init, update=update, shares_scalars=shares,
                                hyperparameters=algorithms.get("ctdc").hyperparameters)


def test_sharing_only_for_an_algorithm_that_opts_in(cpu_backend):
    """In a form that shares (a CPU, the fusion emitters), an undeclared user
    algorithm is traced as written (only the revert's conditional, in each of
    the two paired blocks), a declared one under `sharing` (a conditional per
    TD error and dot product); the results are the same bits, and the two are
    different cache entries."""
    dev = cpu_backend  # the forms of XLA:CPU, on a GPU machine too
    algs = [_user_ctdc("form_test_ctdc_plain", False), _user_ctdc("form_test_ctdc_shared", True)]
    out, conds = [], []
    try:
        for alg in algs:
            algorithms.register(alg)
            spec = SweepSpec(env="boyan_chain", algorithm=alg.name, alpha=(0.05, 2.0), beta=(0.1,), zeta=(0.5,),
                             seeds=5, steps=60, log_every=10, divergence_bound=10.0)  # 6 blocks: no odd one
            groups, chunks = sweep.plan(spec, 2)
            form = tuning.choose_form(spec, dev, groups[0], tuning.CPU_COMPILER_OPTIONS, front=sweep)
            assert form.share and form.paired
            prog = sweep.make_program(spec, groups[0], 2, dev, form=form)
            grid = sweep.chunk_grid(spec, groups[0], chunks[0])
            conds.append(prog.fn.lower(np.uint32(0), grid).as_text().count("stablehlo.case"))
            out.append(sweep.run(spec, devices=dev, progress=False, compiler_options=tuning.CPU_COMPILER_OPTIONS))
    finally:
        for alg in algs:
            algorithms._REGISTRY.pop(alg.name, None)
    assert conds[0] == 2 and conds[1] >= conds[0] + 8, conds
    for k in ("mean", "std", "sem", "alive", "final", "auc_seed", "diverged_step"):
        np.testing.assert_array_equal(getattr(out[0], k), getattr(out[1], k), err_msg=k)
    assert (out[0].diverged_step >= 0).any()
