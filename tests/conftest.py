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
a worker keeps in memory. Sent test by test instead, the suite took longer.

On a GPU machine the suite runs on JAX's default device, the GPU. Markers:
`gpu` (given here to the files in GPU_FILES: the engine, control and agents
tests meant for the default device; `pytest -m gpu` runs them) and `cpu_only`
(a test about the CPU backend that cannot run on the CPU there: it skips, with
its reason, when the default backend is not the CPU). Tests about XLA:CPU that
can run on the CPU anywhere take the `cpu_backend` fixture instead, or pass
`jax.devices("cpu")`; a subprocess of fake CPU devices (xla_env.xla_flags) runs
with JAX_PLATFORMS=cpu. The workers and the tests' subprocesses share one GPU:
none allocates 75% of its memory up front (XLA_PYTHON_CLIENT_PREALLOCATE=false
unless the caller set it)."""
import os
import shutil
import tempfile

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")
# Set before any backend starts (importing JAX starts none); the subprocesses inherit it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# One OpenBLAS thread a process, unless the caller set it: the workers (one a core)
# and the tests' subprocesses share the cores, and OpenBLAS's threads spin while
# they wait for one another: the exact verdicts' eigenvalues (NumPy's LAPACK) took
# 20x the CPU with 2 threads a worker on 2 busy cores. The workers and subprocesses
# inherit it before they import NumPy (a `-n 0` run's process has loaded it already).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# The engine, control and agents tests that run on the default device (a GPU where
# there is one): `pytest -m gpu`.
GPU_FILES = frozenset({
    "test_reference.py", "test_sweep.py", "test_run_many.py", "test_memory.py", "test_control_program.py",
    "test_control_sweep.py", "test_threefry.py", "test_ppo.py", "test_actor_critic.py", "test_centered_values.py",
})
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
# The process that made the cache directory removes it when the session ends
# (the workers inherit it through the environment and use subdirectories).
_MADE = None
if "BEC_JAX_CACHE_DIR" not in os.environ:
    _MADE = os.environ["BEC_JAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="bec-jax-test-cache-")
if _WORKER:
    os.environ["BEC_JAX_CACHE_DIR"] = os.path.join(os.environ["BEC_JAX_CACHE_DIR"], _WORKER)


def default_backend() -> str:
    """JAX's default backend ('cpu', 'gpu', 'tpu'); starts the backends."""
    return jax.default_backend()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long opt-in test; run with BEC_JAX_SLOW=1 python -m pytest -m slow")
    config.addinivalue_line("markers", "long: an end-to-end check of many seconds (a benchmark script, another "
                                       "paper's reproduction, a guide's commands) that CI runs once, outside the "
                                       "README's `pytest` and the AVX2 pass: BEC_JAX_LONG=1 python -m pytest -m long")
    config.addinivalue_line("markers", "gpu: an engine, control or agents test that runs on the default device "
                                       "(a GPU where there is one); given to the files in conftest.GPU_FILES")
    config.addinivalue_line("markers", "cpu_only(reason): a test about JAX's CPU backend; skipped, with the reason, "
                                       "where the default backend is not the CPU")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the markers
def pytest_collection_modifyitems(config, items):
    """Marks `gpu` the tests of GPU_FILES that are not `cpu_only`."""
    for item in items:
        if item.path.name in GPU_FILES and item.get_closest_marker("cpu_only") is None:
            item.add_marker(pytest.mark.gpu)


@pytest.hookimpl(tryfirst=True)  # before the fixtures of a skipped long test are set up
def pytest_runtest_setup(item):
    """Skips a `cpu_only` test, with its reason, where JAX's default backend is
    not the CPU; a `long` one unless BEC_JAX_LONG=1 (.ci/run runs them once)."""
    if item.get_closest_marker("long") is not None and not os.environ.get("BEC_JAX_LONG"):
        pytest.skip("long: run once by CI (BEC_JAX_LONG=1 python -m pytest -m long)")
    mark = item.get_closest_marker("cpu_only")
    if mark is not None:
        backend = default_backend()
        if backend != "cpu":
            why = mark.kwargs.get("reason") or (mark.args[0] if mark.args else "a test about the CPU backend")
            pytest.skip(f"cpu_only: {why} (JAX's default backend here is {backend})")


@pytest.fixture
def cpu_backend():
    """JAX's first CPU device as the default device while the test runs (its
    arrays and jitted programs go there), whatever the machine's default backend:
    for the tests about XLA:CPU that can run on the CPU anywhere. Yields
    `jax.devices("cpu")[:1]`, the `devices` to pass a sweep."""
    cpu = jax.devices("cpu")[:1]
    with jax.default_device(cpu[0]):
        yield cpu


def pytest_unconfigure(config):
    if _MADE is not None:
        shutil.rmtree(_MADE, ignore_errors=True)
