"""Test-wide settings: every test runs with JAX's implicit rank promotion disabled."""
import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
