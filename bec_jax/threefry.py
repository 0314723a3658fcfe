"""`jax.random.fold_in` for threefry keys, unrolled so that XLA fuses it.

JAX lowers its threefry hash on the CPU to a rolled loop of five iterations
(compact to compile). Under XLA:CPU's thunk runtime each iteration is a dozen
or more dispatched thunks, so one `fold_in` per step of a per-step loop costs
far more than the arithmetic: in a tabular control step it was most of the
time. `fold_in` here computes the same hash (Salmon et al. 2011, Threefry-2x32
with 20 rounds, as `jax._src.random.threefry2x32`) as plain elementwise integer
arithmetic, which XLA fuses into the step's other work. It returns the same
key as `jax.random.fold_in`, bit for bit (tests/test_threefry.py); keys of any
other implementation go to `jax.random.fold_in`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotl(x: jax.Array, d: int) -> jax.Array:
    return (x << np.uint32(d)) | (x >> np.uint32(32 - d))


def hash2x32(k1: jax.Array, k2: jax.Array, x1: jax.Array, x2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 (20 rounds) of the counter words (x1, x2) under the key
    words (k1, k2), elementwise over broadcast uint32 arrays, unrolled."""
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x = [x1 + ks[0], x2 + ks[1]]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x[0] = x[0] + x[1]
            x[1] = _rotl(x[1], r) ^ x[0]
        x = [x[0] + ks[(i + 1) % 3], x[1] + ks[(i + 2) % 3] + np.uint32(i + 1)]
    return x[0], x[1]


def fold_in(key: jax.Array, data) -> jax.Array:
    """`jax.random.fold_in(key, data)` for a typed threefry key (any batch shape
    of keys, `data` a uint32-convertible scalar or array broadcasting against
    it), as fused arithmetic; other key implementations go to JAX's."""
    if str(jax.random.key_impl(key)) != "threefry2x32":
        return jax.random.fold_in(key, data)
    words = jax.random.key_data(key)
    data = jnp.asarray(data).astype(jnp.uint32)
    y1, y2 = hash2x32(words[..., 0], words[..., 1], jnp.zeros_like(data), data)
    return jax.random.wrap_key_data(jnp.stack([y1, y2], axis=-1), impl=jax.random.key_impl(key))


__all__ = ["fold_in", "hash2x32"]
