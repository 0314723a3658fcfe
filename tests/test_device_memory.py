"""Memory and processes on one device (issue 45): the default budget of a call
comes from the device's own memory statistics (a fake GPU's here), not a fixed
2 GiB; segments scale with the device; processes that only draw never open
the GPU; parts that may share one do not preallocate it."""
import os
import subprocess
import sys

import jax
import pytest
from xla_env import xla_flags

from bec_jax.engine import memory
from bec_jax.prediction import sweep
from bec_jax.prediction.spec import SweepSpec

GB = 10**9


class FakeGPU:
    """A device that reports its allocator's statistics, as a GPU does."""

    platform = "gpu"
    device_kind = "NVIDIA H100 80GB HBM3 (fake)"
    id = 0
    process_index = 0

    def __init__(self, limit: int, in_use: int):
        self.limit, self.in_use = limit, in_use

    def memory_stats(self) -> dict:
        return {"bytes_limit": self.limit, "bytes_in_use": self.in_use}


def test_the_default_budget_is_the_devices_own_memory():
    h100 = FakeGPU(80 * GB, 2 * GB)
    assert memory.device_free(h100) == 78 * GB
    assert memory.default_budget(h100) == int(78 * GB * memory.DEVICE_FRACTION)  # 58.5 GB, not 2 GiB
    small = FakeGPU(16 * GB, 12 * GB)
    assert memory.default_budget(small) == int(4 * GB * memory.DEVICE_FRACTION)  # what is free, not the card's size
    cpu = jax.devices("cpu")[0]
    assert memory.device_free(cpu) is None
    assert memory.default_budget(cpu) <= memory.DEFAULT_BUDGET


def test_segments_scale_with_the_device():
    assert memory.segment_updates(jax.devices("cpu")[0]) == memory.SEGMENT_UPDATES
    assert memory.segment_updates(FakeGPU(80 * GB, 0)) == memory.SEGMENT_UPDATES * memory.DEVICE_SEGMENT_SCALE


def test_a_sweep_that_needs_seed_chunks_on_a_cpu_runs_in_one_call_on_a_large_device():
    spec = SweepSpec(env="boyan_chain", algorithm="ctdc", hyperparameters={"alpha": [0.1], "beta": [0.1],
                                                                           "zeta": [0.5]},
                     seeds=20_000_000, steps=100, log_every=10)
    cpu = sweep.plan_memory(spec, 1, device=jax.devices("cpu")[0], host_budget=10**15)
    gpu = sweep.plan_memory(spec, 1, device=FakeGPU(80 * GB, 0), host_budget=10**15)
    assert cpu.budget <= memory.DEFAULT_BUDGET and cpu.seeds < spec.seeds      # seed chunks within 2 GiB
    assert gpu.budget == int(80 * GB * memory.DEVICE_FRACTION) and gpu.seeds == spec.seeds  # every seed at once


def test_figure_workers_never_open_a_gpu():
    from bec_jax.experiments import reproduction
    with reproduction.figure_workers("bec_jax.experiments.reproduction") as pool:
        assert pool.submit(os.getenv, "JAX_PLATFORMS").result(timeout=120) == "cpu"


def test_parts_that_may_share_a_gpu_do_not_preallocate_it(tmp_path):
    code = ("import os, sys\nfrom bec_jax.cli import commands\n"
            "rc = commands.main(sys.argv[1:])\nprint(rc, os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'))")
    env = dict(xla_flags(devices=1), BEC_JAX_NO_CACHE="1")
    env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    run = ["run", "--env", "boyan_chain", "--algorithm", "td", "--alpha", "0.1,0.2", "--seeds", "2", "--steps", "40",
           "--log-every", "10", "--chunk-size", "1", "--out", str(tmp_path / "parts")]
    part = subprocess.run([sys.executable, "-c", code, *run, "--chunks", "1/2"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert part.stdout.split()[-2:] == ["0", "false"], part.stderr
    whole = subprocess.run([sys.executable, "-c", code, *run[:-1], str(tmp_path / "whole")], env=env,
                           capture_output=True, text=True, timeout=300)
    assert whole.stdout.split()[-1] == "None", whole.stderr  # a single process keeps JAX's default



def test_device_gpu_without_one_is_one_line_and_the_first_line_names_the_device(tmp_path):
    env = dict(xla_flags(devices=1), BEC_JAX_NO_CACHE="1")
    run = [sys.executable, "-m", "bec_jax.cli", "run", "--env", "boyan_chain", "--algorithm", "td", "--alpha", "0.1",
           "--seeds", "2", "--steps", "40", "--log-every", "10"]
    if any(d.platform != "cpu" for d in jax.devices()):
        pytest.skip("a GPU is here: --device gpu runs")
    gpu = subprocess.run(run + ["--out", str(tmp_path / "gpu"), "--device", "gpu"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert gpu.returncode == 2 and gpu.stderr.count("\n") == 1, gpu.stderr
    assert gpu.stderr.startswith("bec-jax: error: device: no GPU for --device gpu") and "[cuda]" in gpu.stderr
    assert not (tmp_path / "gpu").exists()
    cpu = subprocess.run(run + ["--out", str(tmp_path / "cpu"), "--device", "cpu"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert cpu.returncode == 0, cpu.stderr
    assert "40 steps on cpu x1 in " in cpu.stdout.splitlines()[0]
