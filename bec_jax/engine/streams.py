"""Seed streams: each seed's random stream, as a program draws it.

Seed i of a sweep has the key fold_in(key(seed), seed_offset + i); it splits
into an initial-state key and a stream key, and log block j's uniforms are drawn
from fold_in(stream key, j), all at once. A seed's stream thus depends only on
the base seed and its index, never on the seed count, the chunking or the
devices.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def block_uniforms(stream_key, j, K: int, nu: int, dtype) -> jax.Array:
    """(K, nu) uniforms driving log block j of one seed's stream."""
    return jax.random.uniform(jax.random.fold_in(stream_key, j), (K, nu), dtype)


def per_seed_keys(seed, n: int, offset: int = 0) -> jax.Array:
    """(n,) keys of seeds offset .. offset + n - 1 of base seed `seed` (a uint32
    scalar, traced inside a program)."""
    base = jax.random.key(seed)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(n) + offset)
