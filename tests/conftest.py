"""Test-wide settings: every test runs with JAX's implicit rank promotion
disabled, and with a compilation cache of its own session (BEC_JAX_CACHE_DIR,
unless the caller set one, as .ci/run does): the tests that count compiled
programs must not find them in the user's cache from an earlier run."""
import os
import tempfile

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
os.environ.setdefault("BEC_JAX_CACHE_DIR", tempfile.mkdtemp(prefix="bec-jax-test-cache-"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long opt-in test; run with BEC_JAX_SLOW=1 python -m pytest -m slow")
