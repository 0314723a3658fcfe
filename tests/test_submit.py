"""`--submit slurm` and `bec-jax status` without a cluster: the job scripts
and the command lines they run, against a stand-in `sbatch` and `squeue` that
record what they are given; the one-line refusals; the parts' states from the
chunk files alone. tests/test_slurm.py runs the same on a real Slurm."""
import json
import os
import shlex
import stat

import numpy as np
import pytest

from bec_jax.cli import cluster
from bec_jax.cli import commands as cli
from bec_jax.run import slurm

SWEEP = 'env = "boyan_chain"\nalgorithm = "td"\nhyperparameters = {alpha = [0.01, 0.1]}\nseeds = 2\nsteps = 40\n' \
        'log_every = 10\n'


def _tool(d, name: str, body: str) -> None:
    p = d / name
    p.write_text("#!/bin/bash\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """A PATH whose `sbatch` appends its arguments to calls.txt and answers job
    ids 101, 102, ...; whose `squeue` lists what squeue.txt holds; `scancel` records."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "calls.txt"
    _tool(bin_, "sbatch", f'echo "sbatch $*" >> {calls}\nn=$(grep -c ^sbatch {calls})\necho $((100 + n))\n')
    _tool(bin_, "squeue", f'cat {tmp_path}/squeue.txt 2>/dev/null; exit 0\n')
    _tool(bin_, "scancel", f'echo "scancel $*" >> {calls}\n')
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweep.toml").write_text(SWEEP)
    return tmp_path


def _calls(d) -> list[list[str]]:
    return [shlex.split(x) for x in (d / "calls.txt").read_text().splitlines()]


def test_a_submission_writes_the_scripts_and_submits_them_in_order(fake_slurm, capsys):
    d = fake_slurm
    rc = cli.main(["run", "--config", "sweep.toml", "--out", "runs/x", "--confirm-seeds", "5", "--submit", "slurm",
                   "--parts=3", "--slurm-option", "time=00:30:00", "--slurm-option", "exclusive"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "submitted 3 parts as job array 101 and the assembling job 102" in out
    assert "follow them: bec-jax status runs/x" in out
    calls = _calls(d)
    sdir = os.path.abspath("runs/x/slurm")
    assert calls == [["sbatch", "--parsable", f"{sdir}/parts.sh"],
                     ["sbatch", "--parsable", "--dependency=afterok:101", f"{sdir}/assemble.sh"]]
    parts = (d / "runs/x/slurm/parts.sh").read_text().splitlines()
    assert parts[:2] == ["#!/bin/bash", f"#SBATCH --chdir={d}"]
    assert {"#SBATCH --array=1-3", f"#SBATCH --output={sdir}/part-%a.log", "#SBATCH --time=00:30:00",
            "#SBATCH --exclusive", "#SBATCH --job-name=bec-jax-x"} <= set(parts)
    # The command as given, less the submission's options and the confirmation (the assembling job's).
    assert shlex.split(parts[-1].replace("${SLURM_ARRAY_TASK_ID}", "K")) == [
        "exec", __import__("sys").executable, "-m", "bec_jax", "run", "--config", "sweep.toml", "--out", "runs/x",
        "--chunks", "K/3"]
    last = (d / "runs/x/slurm/assemble.sh").read_text().splitlines()
    assert f"#SBATCH --output={sdir}/assemble.log" in last and "#SBATCH --time=00:30:00" in last
    assert shlex.split(last[-1])[3:] == ["bec_jax", "run", "--out", "runs/x", "--resume", "--confirm-seeds", "5"]
    rec = json.load(open(d / "runs/x/slurm/submission.json"))
    assert (rec["parts"], rec["array_job"], rec["assemble_job"], rec["kind"]) == (3, "101", "102", "run")
    assert rec["again"] == ["run", "--config", "sweep.toml", "--out", "runs/x", "--confirm-seeds", "5", "--submit",
                            "slurm", "--parts=3", "--slurm-option", "time=00:30:00", "--slurm-option", "exclusive"]


def test_a_finished_study_is_done(tmp_path):
    (tmp_path / "study.json").write_text(json.dumps({"sweeps": [{"name": "a"}, {"name": "b"}]}))
    for n in ("a", "b"):
        (tmp_path / n).mkdir()
        np.savez(tmp_path / n / "curves.npz", x=np.zeros(1))  # files that read (status checks they do)
        (tmp_path / n / "meta.json").write_text('{"spec": {}}')
    st = slurm.status(str(tmp_path), parts=2)
    assert [p.state for p in st.parts] == ["done", "done"] and st.assembling == "done"
    assert "a study of 2 sweeps" in slurm.status_text(st)


@pytest.mark.parametrize("argv, message", [
    (["--submit", "slurm"], "parts: --submit slurm needs --parts N"),
    (["--submit", "slurm", "--parts", "2", "--chunks", "1/2"], "chunks: --submit runs the parts"),
    (["--submit", "slurm", "--parts", "2", "--overwrite"], "overwrite: --submit runs the parts"),
    (["--submit", "slurm", "--parts", "0"], "parts: "),
    (["--submit", "pbs", "--parts", "2"], "submit: "),
    (["--submit", "slurm", "--parts", "2", "--slurm-option", "array=1-9"], "slurm_option: array is set by the "
                                                                           "submission itself"),
    (["--submit", "slurm", "--parts", "2", "--slurm-option", "time="], "slurm_option: expected KEY=VALUE"),
])
def test_bad_submissions_are_one_line(fake_slurm, capsys, argv, message):
    rc = cli.main(["run", "--config", "sweep.toml", "--out", "runs/x", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (fake_slurm / "calls.txt").exists()  # nothing submitted


def test_a_directory_of_something_else_and_no_slurm(fake_slurm, capsys, monkeypatch):
    d = fake_slurm
    (d / "runs/x").mkdir(parents=True)
    (d / "runs/x/notes.txt").write_text("mine")
    assert cli.main(["run", "--config", "sweep.toml", "--out", "runs/x", "--submit", "slurm", "--parts", "2"]) == 2
    assert "out: 'runs/x' is not empty and holds no chunk store" in capsys.readouterr().err
    assert (d / "runs/x/notes.txt").read_text() == "mine" and not (d / "runs/x/slurm").exists()
    assert cli.main(["status", "runs/x"]) == 2
    assert "dir: 'runs/x' holds no run, study or submission" in capsys.readouterr().err
    monkeypatch.setenv("PATH", "/nonexistent")
    assert cli.main(["run", "--config", "sweep.toml", "--out", "runs/y", "--submit", "slurm", "--parts", "2"]) == 2
    assert "submit: sbatch not found" in capsys.readouterr().err and not (d / "runs/y").exists()


def test_part_argv_drops_the_submissions_options_in_both_forms():
    argv = ["study", "s.toml", "--out", "o", "--submit=slurm", "--parts", "4", "--slurm-option=time=1:00:00",
            "--confirm-seeds", "9", "--chunk-size", "2"]
    assert cluster.part_argv(argv) == ["study", "s.toml", "--out", "o", "--chunk-size", "2"]
    assert slurm.parse_option("--gres=gpu:1") == ("gres", "gpu:1") and slurm.parse_option("exclusive") == \
        ("exclusive", None)


@pytest.mark.parametrize("argv", [
    ["control", "--task", "cliff_walking", "--algorithm", "cgq", "--alpha", "0.1,0.3", "--beta", "0.001",
     "--zeta", "0.005", "--episodes", "4", "--seeds", "2"],
    ["continuing", "--task", "two_choice", "--algorithm", "q_vrc", "--alpha", "0.1,0.3", "--eta", "1", "--offset",
     "-8,0", "--seeds", "2", "--steps", "2000"],
])
def test_control_and_continuing_submit_their_own_command(fake_slurm, capsys, argv):
    d = fake_slurm
    assert cli.main([*argv, "--out", "runs/c", "--submit", "slurm", "--parts", "2"]) == 0
    part = shlex.split((d / "runs/c/slurm/parts.sh").read_text().splitlines()[-1])
    # A list of negative numbers travels joined to its option (--offset=-8,0), as the parser reads it.
    given = " ".join(argv).replace("--offset -8,0", "--offset=-8,0").split()
    assert part[3:] == ["bec_jax", *given, "--out", "runs/c", "--chunks", "${SLURM_ARRAY_TASK_ID}/2"]
    last = shlex.split((d / "runs/c/slurm/assemble.sh").read_text().splitlines()[-1])
    assert last[3:] == ["bec_jax", argv[0], "--out", "runs/c", "--resume"]
    # A bad setting is refused before anything is submitted.
    bad = [a if a != "cliff_walking" and a != "two_choice" else "nope" for a in argv]
    assert cli.main([*bad, "--out", "runs/d", "--submit", "slurm", "--parts", "2"]) == 2
    assert "task" in capsys.readouterr().err and not (d / "runs/d").exists()
    assert len(_calls(d)) == 2
