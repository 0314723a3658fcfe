"""A real Slurm: `docs/scale-out.md`'s job array, submitted with `sbatch` to a
one-node cluster on 127.0.0.1 (`.ci/slurm up`, which `.ci/run` starts and
exports as SLURM_CONF), its parts computing the chunks of one sweep, then the
assembling job (`--dependency=afterok`): files bit for bit those of one process.
Skipped, saying why, where no cluster answers."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from xla_env import xla_flags


def _cluster() -> str | None:
    """Why no cluster can be used here, or None when `sinfo` answers."""
    if not shutil.which("sbatch"):
        return "no Slurm here (sbatch not found); .ci/run starts one with `bash .ci/slurm up`"
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF is not set: start a cluster with `bash .ci/slurm up` and export what it prints"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo failed: {e}"
    if out.returncode or not out.stdout.strip():
        return f"the cluster does not answer: {(out.stderr or out.stdout).strip()[:200]}"
    return None


pytestmark = pytest.mark.skipif(_cluster() is not None, reason=str(_cluster()))

SWEEP = textwrap.dedent("""
    env = "boyan_chain"
    algorithm = "ctdc"
    hyperparameters = {alpha = [0.01, 0.05, 0.1, 0.2], beta = [0.1], zeta = [0.01]}
    seeds = 3
    steps = 400
    log_every = 20
""")


def _wait(job: str, timeout: float = 600) -> None:
    """Until Slurm no longer lists `job` (or any task of its array)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i %T"], capture_output=True, text=True)
        if q.returncode == 0 and not q.stdout.strip():
            return
        time.sleep(0.5)
    subprocess.run(["scancel", job])
    pytest.fail(f"job {job} did not finish within {timeout:.0f} s")


def _env() -> dict:
    """The jobs' environment (sbatch passes its own on): one CPU device a part
    (the cluster has two cores), no compilation cache, this venv's bec-jax first."""
    env = dict(xla_flags(devices=1), BEC_JAX_NO_CACHE="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _one_process(toml, out, env) -> None:
    """The sweep of `toml` in one process, chunks of one point, into `out`."""
    ref = subprocess.run([sys.executable, "-m", "bec_jax.cli", "run", "--config", str(toml), "--out", str(out),
                          "--chunk-size", "1"], env=env, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr


def _sbatch(args: list, cwd, env) -> str:
    out = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def test_the_docs_job_array_and_its_assembling_job_equal_one_process(tmp_path):
    (tmp_path / "sweep.toml").write_text(SWEEP)
    env = _env()
    # docs/scale-out.md's job script as written, with 4 parts and chunks of one point
    # (a sweep this small is one chunk by default).
    (tmp_path / "parts.sh").write_text(textwrap.dedent("""\
        #!/bin/bash
        #SBATCH --array=1-4
        #SBATCH --output=part-%a.log
        bec-jax run --config sweep.toml --out runs/big --chunks ${SLURM_ARRAY_TASK_ID}/4 --chunk-size 1
    """))
    (tmp_path / "assemble.sh").write_text(textwrap.dedent("""\
        #!/bin/bash
        #SBATCH --output=assemble.log
        bec-jax run --out runs/big --resume
    """))
    parts = _sbatch(["parts.sh"], tmp_path, env)
    last = _sbatch([f"--dependency=afterok:{parts}", "assemble.sh"], tmp_path, env)
    _wait(last)
    logs = {p.name: p.read_text() for p in tmp_path.glob("*.log")}
    assert sorted(logs) == ["assemble.log", "part-1.log", "part-2.log", "part-3.log", "part-4.log"], logs
    for k in range(1, 5):
        assert f"part {k}/4: done" in logs[f"part-{k}.log"], logs[f"part-{k}.log"]
    assert "wrote runs/big/curves.npz" in logs["assemble.log"], logs["assemble.log"]
    one = tmp_path / "one"
    _one_process(tmp_path / "sweep.toml", one, env)
    big = tmp_path / "runs" / "big"
    with np.load(big / "curves.npz") as a, np.load(one / "curves.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:  # the same program on one machine: bit for bit
            assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k
    assert json.load(open(big / "summary.json")) == json.load(open(one / "summary.json"))
    assert not (big / "chunks").exists()


LONG = textwrap.dedent("""
    env = "boyan_chain"
    algorithm = "ctdc"
    hyperparameters = {alpha = [0.01, 0.02, 0.05, 0.1], beta = [0.1], zeta = [0.05]}
    seeds = 200
    steps = 200000
    log_every = 10000
""")


def test_a_cancelled_part_resumes_when_submitted_again(tmp_path):
    (tmp_path / "sweep.toml").write_text(LONG)
    env = _env()
    (tmp_path / "part.sh").write_text(textwrap.dedent("""\
        #!/bin/bash
        #SBATCH --array=1-1
        #SBATCH --output=part-%A.log
        bec-jax run --config sweep.toml --out runs/big --chunks ${SLURM_ARRAY_TASK_ID}/1 --chunk-size 1
    """))
    first = _sbatch(["part.sh"], tmp_path, env)
    saved = tmp_path / "runs" / "big" / "chunks" / "chunk_00000.npz"
    t0 = time.monotonic()
    while not saved.exists() and time.monotonic() - t0 < 300:
        time.sleep(0.1)
    assert saved.exists(), "the part saved no chunk"
    subprocess.run(["scancel", first], check=True)  # SIGTERM to the job's processes
    _wait(first)
    log = (tmp_path / f"part-{first}.log").read_text()
    assert "interrupted by SIGTERM" in log and "run this part again" in log, log
    done_before = len(list(saved.parent.glob("chunk_*.npz")))
    assert 1 <= done_before < 4, done_before
    again = _sbatch(["part.sh"], tmp_path, env)
    last = _sbatch([f"--dependency=afterok:{again}", "--output=assemble.log", "--wrap",
                    "bec-jax run --out runs/big --resume"], tmp_path, env)
    _wait(last)
    assert "wrote runs/big/curves.npz" in (tmp_path / "assemble.log").read_text()
    one = tmp_path / "one"
    _one_process(tmp_path / "sweep.toml", one, env)
    with np.load(tmp_path / "runs" / "big" / "curves.npz") as a, np.load(one / "curves.npz") as b:
        for k in a.files:
            assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k
