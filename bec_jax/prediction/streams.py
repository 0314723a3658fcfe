"""A prediction sweep's seed streams replayed outside its program: each seed's
keys and the transitions it sees, drawn as the program draws them
(`engine.streams`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax.engine.streams import block_uniforms, per_seed_keys
from bec_jax.prediction import sampling
from bec_jax.prediction.spec import SweepSpec


def seed_keys(spec: SweepSpec) -> jax.Array:
    """The per-seed keys: seed i's key is fold_in(key(spec.seed), spec.seed_offset
    + i), so a seed's stream does not depend on how many seeds the sweep has.
    (The sweep program computes the same keys inside itself, from the seed.)"""
    return per_seed_keys(np.uint32(spec.seed), spec.seeds, spec.seed_offset)


def seed_transitions(spec: SweepSpec, seed_index: int = 0, env_params: dict | None = None):
    """The transitions seed `seed_index` of `spec` sees, a `Transition` of (steps,)
    arrays, drawn exactly as the sweep program draws them: for replaying a run
    with the public update functions, or for inspecting its data. `env_params`
    picks the model (default: the first grid point's)."""
    if not 0 <= seed_index < spec.seeds:
        raise ValueError(f"seed_index: must be in [0, {spec.seeds}), got {seed_index!r}")
    dtype = jnp.dtype(spec.dtype)
    tables = sampling.build_tables(spec.mdp(env_params), dtype)
    step_fn = sampling.markov_step_from_uniforms if spec.sampler == "markov" else sampling.iid_step_from_uniforms
    K, L, nu = spec.log_every, spec.steps // spec.log_every, sampling.NUM_UNIFORMS[spec.sampler]

    @jax.jit
    def draw(key):
        init_key, stream_key = jax.random.split(key)
        s0 = sampling.init_state_from_uniform(tables, jax.random.uniform(init_key, dtype=dtype))
        u = jax.vmap(lambda j: block_uniforms(stream_key, j, K, nu, dtype))(jnp.arange(L, dtype=jnp.int32))
        return jax.lax.scan(lambda s, uu: step_fn(tables, uu, s)[::-1], s0, u.reshape(L * K, nu))[1]

    return draw(seed_keys(spec)[seed_index])
