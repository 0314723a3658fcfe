"""JAX's threefry keys, computed as arithmetic that XLA fuses.

JAX lowers its threefry hash on the CPU to a rolled loop of five iterations
(compact to compile). Under XLA:CPU's thunk runtime each iteration is a dozen
or more dispatched thunks, so one `fold_in` per step of a per-step loop costs
far more than the arithmetic: in a tabular control step it was most of the
time. `fold_in` here computes the same hash (Salmon et al. 2011, Threefry-2x32
with 20 rounds, as `jax._src.random.threefry2x32`) as plain elementwise integer
arithmetic, which XLA fuses into the step's other work. It returns the same
key as `jax.random.fold_in`, bit for bit (tests/test_threefry.py); keys of any
other implementation go to `jax.random.fold_in`.

`IMPL` is the whole PRNG, threefry2x32 in JAX's default (partitionable) mode
computed the same way: keys wrapped with it (`fused`) give the bits, splits
and fold-ins of threefry keys bit for bit, through every `jax.random`
function, including those a task's own code calls (gymnax draws a uniform in
every Acrobot step, for its torque noise).
"""
from __future__ import annotations

import jax
import jax.extend.random
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


def _counts(shape) -> tuple[jax.Array, jax.Array]:
    """JAX's `iota_2x32_shape`: a uint64 iota over `shape` as (high, low) words."""
    n = int(np.prod(shape, dtype=np.int64))
    if n >= 2**32:
        raise ValueError(f"shape: at most 2**32 - 1 random words per call, got {n}")
    lo = jax.lax.iota(jnp.uint32, max(n, 1))[:n].reshape(shape)
    return jnp.zeros(shape, jnp.uint32), lo


def _split(key: jax.Array, shape) -> jax.Array:
    hi, lo = _counts(tuple(shape))
    y1, y2 = hash2x32(key[0], key[1], hi, lo)
    return jnp.stack([y1, y2], axis=-1)


def _random_bits(key: jax.Array, bit_width: int, shape) -> jax.Array:
    hi, lo = _counts(tuple(shape))
    b1, b2 = hash2x32(key[0], key[1], hi, lo)
    if bit_width == 64:
        return (b1.astype(jnp.uint64) << np.uint64(32)) | b2.astype(jnp.uint64)
    bits = b1 ^ b2
    return bits if bit_width == 32 else bits.astype({8: jnp.uint8, 16: jnp.uint16}[bit_width])


def _fold_in(key: jax.Array, data) -> jax.Array:
    data = jnp.asarray(data).astype(jnp.uint32)
    y1, y2 = hash2x32(key[0], key[1], jnp.zeros_like(data), data)
    return jnp.stack([y1, y2])


IMPL = jax.extend.random.define_prng_impl(
    key_shape=(2,), seed=jax.extend.random.threefry_prng_impl.seed, split=_split, random_bits=_random_bits,
    fold_in=_fold_in, name="threefry2x32_fused", tag="frf")


def fused(key: jax.Array) -> jax.Array:
    """The threefry key `key` (any batch shape) as a key of `IMPL`: the same
    random numbers through every `jax.random` function, as fused arithmetic."""
    return jax.random.wrap_key_data(jax.random.key_data(key), impl=IMPL)


__all__ = ["IMPL", "fold_in", "fused", "hash2x32"]
