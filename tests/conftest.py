"""Test-wide settings: every test runs with JAX's implicit rank promotion
disabled, and with a compilation cache of its own session (BEC_JAX_CACHE_DIR,
unless the caller set one, as .ci/run does): the tests that count compiled
programs must not find them in the user's cache from an earlier run.

The suite runs on pytest-xdist's workers (`-n auto --maxprocesses 4` in
pyproject.toml): on 2 cores it is mostly one thread of tracing and XLA
compiling at a time, so two workers use the second core. Each worker compiles
into a cache directory of its own, so a worker runs its tests in collection
order against a cache that holds only what its own earlier tests put there, as
a one-process run would: the tests that count compilations see the same thing
either way. A file's tests run on one worker (`--dist loadfile`): many share a
fixture (a reproduction run once for many checks) or compiled programs, which
a worker keeps in memory. Sent test by test instead, the suite took longer."""
import os
import shutil
import tempfile

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
# The process that made the cache directory removes it when the session ends
# (the workers inherit it through the environment and use subdirectories).
_MADE = None
if "BEC_JAX_CACHE_DIR" not in os.environ:
    _MADE = os.environ["BEC_JAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="bec-jax-test-cache-")
if _WORKER:
    os.environ["BEC_JAX_CACHE_DIR"] = os.path.join(os.environ["BEC_JAX_CACHE_DIR"], _WORKER)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long opt-in test; run with BEC_JAX_SLOW=1 python -m pytest -m slow")


def pytest_unconfigure(config):
    if _MADE is not None:
        shutil.rmtree(_MADE, ignore_errors=True)
