"""Test-wide settings: every test runs with JAX's implicit rank promotion disabled."""
import jax

jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long opt-in test; run with BEC_JAX_SLOW=1 python -m pytest -m slow")
