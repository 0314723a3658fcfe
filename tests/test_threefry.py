"""bec_jax.threefry.fold_in against jax.random.fold_in, bit for bit."""
import jax
import jax.numpy as jnp
import numpy as np

from bec_jax import threefry


def test_fold_in_equals_jax_bit_for_bit():
    keys = jax.random.split(jax.random.key(7), 64)
    data = np.concatenate([np.arange(32), np.random.default_rng(0).integers(0, 2**31 - 1, 32)]).astype(np.int32)
    ours = jax.jit(jax.vmap(threefry.fold_in))(keys, data)
    ref = jax.vmap(jax.random.fold_in)(keys, data)
    np.testing.assert_array_equal(jax.random.key_data(ours), jax.random.key_data(ref))
    # a scalar datum over a batch of keys, inside a scan (the control loop's use)
    step = jax.jit(lambda ks, t: threefry.fold_in(ks, t))
    np.testing.assert_array_equal(jax.random.key_data(step(keys, jnp.int32(12345))),
                                  jax.random.key_data(jax.vmap(lambda k: jax.random.fold_in(k, 12345))(keys)))


def test_hash_changes_with_every_input_word():
    z = jnp.zeros((), jnp.uint32)
    base = threefry.hash2x32(z, z, z, z)
    for i in range(4):
        args = [z] * 4
        args[i] = jnp.ones((), jnp.uint32)
        assert threefry.hash2x32(*args) != base


def test_other_key_implementations_go_to_jax():
    k = jax.random.key(1, impl="rbg")
    np.testing.assert_array_equal(jax.random.key_data(threefry.fold_in(k, 5)),
                                  jax.random.key_data(jax.random.fold_in(k, 5)))


def test_fused_keys_draw_what_threefry_keys_draw():
    """Every jax.random function a task might call, on keys of the fused
    implementation, against the same keys as threefry keys (JAX's default,
    partitionable threefry)."""
    keys = jax.random.split(jax.random.key(3), 8)
    fk = threefry.fused(keys)
    draws = {
        "uniform": lambda k: jax.random.uniform(k, (3, 5)),
        "uniform(-1, 2)": lambda k: jax.random.uniform(k, (), minval=-1.0, maxval=2.0),
        "normal": lambda k: jax.random.normal(k, (7,)),
        "randint": lambda k: jax.random.randint(k, (4,), 0, 10),
        "bits uint8": lambda k: jax.random.bits(k, (3,), jnp.uint8),
        "split": lambda k: jax.random.key_data(jax.random.split(k, 3)),
        "fold_in": lambda k: jax.random.key_data(jax.random.fold_in(k, 77)),
        "choice": lambda k: jax.random.choice(k, 5, (2,), replace=False),
    }
    # All the draws in one program per implementation (one compile each, not one a draw).
    every = jax.jit(jax.vmap(lambda k: {name: f(k) for name, f in draws.items()}))
    fused, plain = every(fk), every(keys)
    for name in draws:
        np.testing.assert_array_equal(np.asarray(fused[name]), np.asarray(plain[name]), err_msg=name)
