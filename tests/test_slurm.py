"""A real Slurm: `docs/scale-out.md`'s job arrays, `srun` and `--submit slurm`,
on a one-node cluster on 127.0.0.1 (`.ci/slurm up`, which `.ci/run` starts and
exports as SLURM_CONF). Every run's files are bit for bit those of one process
(the same program on one machine). Skipped, saying why, where no cluster answers."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from docs_blocks import code
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

PAGE = "docs/scale-out.md"
# 64 grid points: chunks of 16 make the 4 chunks that 4 parts share.
SWEEP = textwrap.dedent("""
    env = "boyan_chain"
    algorithm = "ctdc"
    hyperparameters = {alpha = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4], beta = [0.05, 0.1], zeta = [0.01, 0.02, 0.05, 0.1]}
    seeds = 3
    steps = 400
    log_every = 20
""")
STUDY = textwrap.dedent("""
    seeds = 3
    steps = 400
    log_every = 20

    [[sweep]]
    name = "td"
    env = "boyan_chain"
    algorithm = "td"
    alpha = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4]

    [[sweep]]
    name = "ctd"
    env = "boyan_chain"
    algorithm = "ctd"
    alpha = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4]
    beta = [0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5]
""")


def _env() -> dict:
    """The jobs' environment (sbatch passes its own on): one CPU device a part
    (the cluster has two cores), no compilation cache, this venv's bec-jax first."""
    env = dict(xla_flags(devices=1), BEC_JAX_NO_CACHE="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _bec_jax(argv: list, cwd, env=None, timeout: float = 300) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "bec_jax.cli", *argv], cwd=cwd, env=env or _env(),
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """One process's files: the sweep and the study, chunks of 16 as the docs give."""
    d = tmp_path_factory.mktemp("one")
    (d / "sweep.toml").write_text(SWEEP)
    (d / "study.toml").write_text(STUDY)
    _bec_jax(["run", "--config", "sweep.toml", "--out", "sweep", "--chunk-size", "16"], d)
    _bec_jax(["study", "study.toml", "--out", "study", "--chunk-size", "16"], d)
    return d


def _same_files(a, b) -> None:
    """The run directories `a` and `b` hold the same results bit for bit."""
    with np.load(a / "curves.npz") as x, np.load(b / "curves.npz") as y:
        assert sorted(x.files) == sorted(y.files)
        for k in x.files:
            assert np.array_equal(x[k], y[k], equal_nan=x[k].dtype.kind == "f"), (a, k)
    assert json.load(open(a / "summary.json")) == json.load(open(b / "summary.json"))
    assert not (a / "chunks").exists()


def _same_study(a, b) -> None:
    for name in ("td", "ctd"):
        _same_files(a / name, b / name)


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


def _bash(block: str, cwd, env) -> str:
    p = subprocess.run(["bash", "-ec", block], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


@pytest.mark.parametrize("what", ["sweep", "study"])
def test_the_docs_job_array_and_its_assembling_job_equal_one_process(tmp_path, one, what):
    """docs/scale-out.md's job script and its submission as written (the
    study's script with the assembling command the page gives)."""
    (tmp_path / "sweep.toml").write_text(SWEEP)
    (tmp_path / "study.toml").write_text(STUDY)
    env = _env()
    script = code(PAGE, "bash", containing="#SBATCH --output=part-%a.log\nbec-jax " + ("run" if what == "sweep"
                                                                                     else "study"))
    assert "#SBATCH --array=1-4" in script and "--chunks ${SLURM_ARRAY_TASK_ID}/4" in script
    (tmp_path / "parts.sh").write_text(script)
    submit = code(PAGE, "bash", containing="ARRAY=$(sbatch --parsable parts.sh)")
    if what == "study":
        assert "`bec-jax study --out runs/study --resume`" in open(PAGE).read()
        submit = submit.replace("bec-jax run --out runs/big --resume", "bec-jax study --out runs/study --resume")
    last = _bash(submit, tmp_path, env).split()[-1].split(";")[0]
    _wait(last)
    logs = {p.name: p.read_text() for p in tmp_path.glob("*.log")}
    assert sorted(logs) == ["assemble.log", "part-1.log", "part-2.log", "part-3.log", "part-4.log"], logs
    for k in range(1, 5):
        assert f"part {k}/4: " in logs[f"part-{k}.log"], logs[f"part-{k}.log"]
    if what == "sweep":
        assert "wrote runs/big/curves.npz" in logs["assemble.log"], logs["assemble.log"]
        _same_files(tmp_path / "runs" / "big", one / "sweep")
    else:
        assert "wrote runs/study/study.json" in logs["assemble.log"], logs["assemble.log"]
        _same_study(tmp_path / "runs" / "study", one / "study")


def test_srun_with_distributed_auto_equals_one_process(tmp_path, one):
    """docs/scale-out.md's `srun -n 2 ... --distributed auto`: two processes of
    one device each, joined by jax.distributed, write one process's files."""
    (tmp_path / "sweep.toml").write_text(SWEEP)
    block = code(PAGE, "bash", containing="srun -n 2")
    out = _bash(block.strip() + " --chunk-size 16", tmp_path, _env())  # the reference's chunks
    assert out.count("wrote runs/x/curves.npz") == 1, out  # process 0 reports, process 1 is quiet
    _same_files(tmp_path / "runs" / "x", one / "sweep")


def _status(d, cwd) -> dict:
    return json.loads(_bec_jax(["status", d, "--json"], cwd).stdout)


def test_submit_and_status_on_a_cluster(tmp_path, one):
    """docs/scale-out.md's `--submit slurm` lines as written, then `bec-jax
    status` until both are assembled."""
    (tmp_path / "sweep.toml").write_text(SWEEP)
    (tmp_path / "study.toml").write_text(STUDY)
    block = code(PAGE, "bash", containing="--submit slurm")
    out = _bash(block, tmp_path, _env())
    jobs = re.findall(r"submitted 2 parts as job array (\d+) and the assembling job (\d+)", out)
    assert len(jobs) == 2, out
    assert "runs/big: a sweep submitted in 2 parts" in out and "follow them: bec-jax status runs/big" in out, out
    states = re.findall(r"^part (\d): (\w+)", out, re.M)
    assert [k for k, _ in states] == ["1", "2"], out
    assert {s for _, s in states} <= {"pending", "running", "done"}, out
    for d, (_, last) in zip(("runs/big", "runs/study"), jobs):
        _wait(last)
        st = _status(d, tmp_path)
        assert st["assembling"] == "done" and [p["state"] for p in st["parts"]] == ["done"] * 2, st
        assert st["record"]["assemble_job"] == last
    text = _bec_jax(["status", "runs/study"], tmp_path).stdout
    assert "a study of 2 sweeps submitted in 2 parts" in text and "finished: every sweep's results" in text, text
    _same_files(tmp_path / "runs" / "big", one / "sweep")
    _same_study(tmp_path / "runs" / "study", one / "study")
    script = (tmp_path / "runs" / "big" / "slurm" / "parts.sh").read_text()
    assert "#SBATCH --time=01:00:00" in script and "--submit" not in script.split("#SBATCH")[-1], script


LONG = textwrap.dedent("""
    env = "boyan_chain"
    algorithm = "ctdc"
    hyperparameters = {alpha = [0.01, 0.02, 0.05, 0.1], beta = [0.1], zeta = [0.05]}
    seeds = 200
    steps = 200000
    log_every = 10000
""")


def test_a_cancelled_submission_finishes_when_submitted_again(tmp_path):
    """A submission cancelled after its first chunk: `bec-jax status` says the
    parts failed and how to finish, which docs/scale-out.md shows; a second
    submission is refused while the first runs; the one `status` gives finishes
    the run, bit for bit one process's."""
    (tmp_path / "long.toml").write_text(LONG)
    argv = ["run", "--config", "long.toml", "--out", "runs/big", "--chunk-size", "1", "--submit", "slurm",
            "--parts", "2"]
    _bec_jax(argv, tmp_path)
    again = subprocess.run([sys.executable, "-m", "bec_jax.cli", *argv], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "still has 2 parts pending or running" in again.stderr, again.stderr
    rec = json.load(open(tmp_path / "runs" / "big" / "slurm" / "submission.json"))
    saved = tmp_path / "runs" / "big" / "chunks" / "chunk_00000.npz"
    t0 = time.monotonic()
    while not any(saved.parent.glob("chunk_*.npz")) and time.monotonic() - t0 < 300:
        time.sleep(0.1)
    subprocess.run(["scancel", rec["array_job"]], check=True)  # SIGTERM to the parts' processes
    _wait(rec["array_job"])
    text = _bec_jax(["status", "runs/big"], tmp_path).stdout
    lines = text.splitlines()
    assert lines[0] == f"runs/big: a sweep submitted in 2 parts (job array {rec['array_job']}, assembling job " \
                       f"{rec['assemble_job']})", text
    failed = [x for x in lines if re.match(r"part \d: failed \(\d of 2 chunks\): ", x)]
    assert failed and all("interrupted by SIGTERM" in x or "CANCELLED" in x for x in failed), text
    assert any(x.startswith("assembling: pending: a part failed") or x.startswith("assembling: not run")
               for x in lines), text
    page = open(PAGE).read()  # the page shows these very lines
    assert "part 1: failed (1 of 2 chunks): bec-jax: interrupted by SIGTERM" in page
    assert "assembling: pending: a part failed, so it never runs (resubmit, see below)" in page
    finish = [x for x in lines if x.startswith("to finish: bec-jax ")]
    assert len(finish) == 1, text
    cmd = finish[0][len("to finish: bec-jax "):].split("   (")[0].split()
    assert cmd == argv, cmd
    _bec_jax(cmd, tmp_path)
    rec2 = json.load(open(tmp_path / "runs" / "big" / "slurm" / "submission.json"))
    assert rec2["array_job"] != rec["array_job"]
    q = subprocess.run(["squeue", "-h", "-j", rec["assemble_job"]], capture_output=True, text=True)
    assert not q.stdout.strip(), q.stdout  # the earlier assembling job is cancelled
    _wait(rec2["assemble_job"])
    assert _status("runs/big", tmp_path)["assembling"] == "done"
    ref = tmp_path / "one"
    _bec_jax(["run", "--config", "long.toml", "--out", str(ref), "--chunk-size", "1"], tmp_path)
    _same_files(tmp_path / "runs" / "big", ref)
