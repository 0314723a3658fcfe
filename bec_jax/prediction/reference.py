"""The idea in one place: a prediction sweep as one jitted program.

A reference to read, not the way to run sweeps. `make_sweep(spec)` does the
Python-side setup and returns `sweep(seed)`, one
`jit(vmap_grid(vmap_seeds(scan_time(sample, then update))))`, in the style of
purejaxrl's `make_train(config) -> train(rng)`. It composes the library's own
pieces -- the sampler (`prediction.sampling`), the algorithm's `init` and
`update`, the metrics (`theory.metrics`) -- on the engine's random streams
(`engine.streams`), so it computes the mean curves `prediction.sweep.run`
reports, to float32 rounding (tests/test_reference.py). Everything else the
engine does is left out: the plan, grid and seed chunks, time segments,
divergence freezing, meshes, and the performance forms.

One difference of form, not of numbers: here every grid point replays its
seeds' streams, where the engine samples each seed's transition once per step
and broadcasts it to the grid points. A seed's stream depends on its key alone,
so every grid point sees the same transitions either way (common random numbers).

    mean = make_sweep(spec)(np.uint32(spec.seed))  # (M, G, L): SweepResult.mean
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from bec_jax.engine.streams import block_uniforms, per_seed_keys
from bec_jax.prediction import sampling
from bec_jax.schedules import robbins_monro
from bec_jax.theory import metrics


def make_sweep(spec) -> Callable[[jax.Array], jax.Array]:
    """`sweep(seed) -> (M, G, L)`: each metric's mean over seeds at each grid point
    and log point of `spec` (a `SweepSpec` of one program: one model, one value of
    each static hyperparameter; no run may diverge)."""
    dtype, model, alg, sched = jnp.dtype(spec.dtype), spec.mdp(), spec.algorithm_def, spec.schedule
    columns, first = spec.grid_arrays(), spec.grid_points()[0]
    if spec.env_param_names or any(len(set(columns[h.name])) > 1 for h in alg.hyperparameters if h.static):
        raise ValueError("reference: one model and one value of each static hyperparameter only")
    tables = sampling.build_tables(model, dtype)
    step_fn = {"markov": sampling.markov_step_from_uniforms, "iid": sampling.iid_step_from_uniforms}[spec.sampler]
    nu, K, L = sampling.NUM_UNIFORMS[spec.sampler], spec.log_every, spec.steps // spec.log_every
    mets = [metrics.metric(model, name).astype(dtype) for name in spec.metrics]
    theta0 = jnp.asarray(model.theta0, dtype)
    grid = {h.name: jnp.asarray(columns[h.name], dtype) for h in alg.hyperparameters if not h.static}
    static = {h.name: first[h.name] for h in alg.hyperparameters if h.static}

    def update(state, tr, hp):
        """One update of one run; a Robbins-Monro step size is evaluated at the
        count the update reads, before it increments it (`schedules.robbins_monro`)."""
        if sched.kind == "robbins_monro":
            count = getattr(state, alg.counter)
            hp = {n: robbins_monro(v, sched.t0, sched.exponent(n))(count) if alg.hyperparameter(n).step_size
                  else v for n, v in hp.items()}
        return alg.apply(state, tr, {**static, **hp})

    def log(state):
        """(M,) the metrics ||R theta + h|| of the state's weights."""
        return jnp.stack([metrics.evaluate(m, getattr(state, alg.weights)) for m in mets])

    def run(hp, key):
        """One run, one grid point's `hp` on one seed's `key`: its (L + 1, M) curve."""
        init_key, stream_key = jax.random.split(key)
        s0 = sampling.init_state_from_uniform(tables, jax.random.uniform(init_key, dtype=dtype))

        def step(carry, u):  # sample a transition, then update
            state, s = carry
            tr, s = step_fn(tables, u, s)
            return (update(state, tr, hp), s), None

        def block(carry, j):  # K steps on block j's uniforms, then log
            carry, _ = jax.lax.scan(step, carry, block_uniforms(stream_key, j, K, nu, dtype))
            return carry, log(carry[0])

        state0 = alg.init(theta0)
        _, curve = jax.lax.scan(block, (state0, s0), jnp.arange(L))
        return jnp.concatenate([log(state0)[None], curve])

    @jax.jit
    def sweep(seed):
        """The mean curves of the seeds spec.seed_offset .. + spec.seeds - 1 of `seed`."""
        keys = per_seed_keys(seed, spec.seeds, spec.seed_offset)
        curves = jax.vmap(jax.vmap(run, in_axes=(None, 0)), in_axes=(0, None))(grid, keys)  # (G, N, L + 1, M)
        return jnp.moveaxis(curves.mean(axis=1), -1, 0)

    return sweep
