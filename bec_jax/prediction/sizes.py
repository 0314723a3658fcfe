"""A prediction sweep's memory terms: the `engine.memory.Sizes` of a
`SweepSpec`, which the engine's memory plan (`engine.memory.plan`) weighs.

Per run: the learner state (the batched leaves of the algorithm's init,
`STATE_COPIES` live copies in the scan), the sampler state, the divergence
step, the area sums and the metrics' values; per seed: a log block's uniforms
(`UNIFORM_COPIES` live copies) and keys; per log point: the statistics over
seeds (or, in a seed chunk, each seed's values); as finals, each seed's final
metrics, areas and divergence step. See the model in `engine.memory`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax.engine import memory
from bec_jax.engine.layout import state_axes
from bec_jax.prediction import sampling
from bec_jax.prediction.spec import SweepSpec

STATE_COPIES = 6                # live copies of the learner state in the scan
UNIFORM_COPIES = 8              # live copies of a log block's uniforms (two blocks drawn at once, see kernel)
SEARCH_LOG_COPIES = 2           # copies of a search's per-run logs (the logs, the statistics' pass over them)


def sizes(spec: SweepSpec) -> memory.Sizes:
    """The sizes of a prediction `SweepSpec`: the state's from the algorithm's init."""
    item = jnp.dtype(spec.dtype).itemsize
    k = spec.mdp().num_features
    shapes = jax.eval_shape(spec.algorithm_def.init, jax.ShapeDtypeStruct((k,), jnp.dtype(spec.dtype)))
    # The update counter (axis None) is one copy for every run.
    axes = jax.tree_util.tree_leaves(state_axes(shapes, spec.algorithm_def.counter), is_leaf=lambda a: a is None)
    state = sum(int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
                for leaf, ax in zip(jax.tree_util.tree_leaves(shapes), axes) if ax is not None)
    M = len(spec.metrics)
    nu = sampling.NUM_UNIFORMS[spec.sampler]
    # A search (`programs.searched`) logs every run's values and alive flag per block (M + 1 numbers) and
    # takes the statistics from them after its rungs: their array and a working copy.
    search_logs = 0 if spec.search is None else SEARCH_LOG_COPIES * (spec.steps // spec.log_every) * (M + 1) * item
    return memory.Sizes(item=item, metrics=M, state=state,
                        per_run=STATE_COPIES * state + 8 + 5 * M * item + search_logs,
                        per_seed=UNIFORM_COPIES * spec.log_every * nu * item + 32,
                        report_stats=3 * M * item + 4, report_seed=M * item + 1,
                        finals=2 * M * item + 4, carry=state + 8 + M * item,
                        log_points=spec.num_logs, block_steps=spec.log_every)


def plan_memory(spec: SweepSpec, n_devices: int = 1, **kwargs) -> memory.Plan:
    """The memory plan of `spec` (`engine.memory.plan` with these sizes; kwargs as its)."""
    return memory.plan(spec, n_devices, sz=sizes(spec), **kwargs)


def log_bytes(spec: SweepSpec) -> int:
    """Bytes of the logged arrays of the whole sweep (`engine.memory.log_bytes`)."""
    return memory.log_bytes(spec, sizes(spec))


def fits_together(specs: list, n_devices: int = 1, *, memory_budget: int | None = None, device=None) -> bool:
    """Whether sweeps that each run in one call fit in one call together
    (`engine.memory.fits_together` with these sizes)."""
    return memory.fits_together(specs, n_devices, sizes=sizes, memory_budget=memory_budget, device=device)
