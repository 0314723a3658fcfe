"""Hostile and careless input to `--submit slurm` and `bec-jax status` (issue
54, items 1 and 7): every value written into a job script is checked for
newlines and other control characters, quoted as sbatch reads an `#SBATCH`
line (a port of Slurm's own `get_argument` below), and the command run with
bash as the job would; sbatch's prefixes of the options the submission sets
are refused; a damaged or hostile submission record and a huge --parts are
one line, a log's control characters are printed as text (planted chunk
files: tests/test_faults_readers.py, which has the runs). Against a stand-in
sbatch and squeue (tests/test_submit.py's)."""
import os
import re
import shutil
import stat
import subprocess
import time

import jax
import pytest

from bec_jax.cli import commands as cli
from bec_jax.run import slurm

jax.devices()  # one CPU device, before the in-process CLI calls below could make one per core

SWEEP = 'env = "boyan_chain"\nalgorithm = "td"\nhyperparameters = {alpha = [0.01, 0.1]}\nseeds = 2\nsteps = 40\n' \
        'log_every = 10\n'


def _tool(d, name: str, body: str) -> None:
    p = d / name
    p.write_text("#!/bin/bash\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


def _cli(argv, capsys):
    code = cli.main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, [x for x in cap.err.splitlines() if x.strip()]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """An sbatch that records its calls and answers 101, 102, ...; an squeue
    that lists what squeue.txt holds; a scancel that records."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "calls.txt"
    _tool(bin_, "sbatch", f'echo "sbatch $*" >> {calls}\nn=$(grep -c ^sbatch {calls})\necho $((100 + n))\n')
    _tool(bin_, "squeue", f"cat {tmp_path}/squeue.txt 2>/dev/null; exit 0\n")
    _tool(bin_, "scancel", f'echo "scancel $*" >> {calls}\n')
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweep.toml").write_text(SWEEP)
    return tmp_path


def sbatch_arguments(line: str) -> list[str]:
    """The arguments sbatch reads from an `#SBATCH` line: Slurm's
    `get_argument` (src/sbatch/opt.c) in Python. Quotes group, a backslash
    escapes the next character, an unquoted # ends the line."""
    s, i, out = line[len("#SBATCH"):], 0, []
    while True:
        while i < len(s) and s[i].isspace():
            i += 1
        arg, quoted, q, escaped = [], False, "", False
        while i < len(s) and (quoted or not s[i].isspace()):
            c = s[i]
            if escaped:
                escaped = False
            elif c == "\\":
                i += 1
                escaped = True
                continue
            elif quoted and c == q:
                quoted, i = False, i + 1
                continue
            elif not quoted and c in "\"'":
                quoted, q, i = True, c, i + 1
                continue
            elif not quoted and c == "#":
                i = len(s)
                break
            arg.append(c)
            i += 1
        assert not quoted, f"sbatch: unmatched quote in {line!r}"
        if not arg:
            return out
        out.append("".join(arg))


def directives(script: str) -> list[tuple[str, str | None]]:
    """(option, value) of every argument sbatch reads from a script's #SBATCH lines, in order."""
    got = []
    for line in script.splitlines():
        if not line.startswith("#"):
            break  # sbatch stops at the first command
        if line.startswith("#SBATCH"):
            for a in sbatch_arguments(line):
                key, eq, value = a.partition("=")
                got.append((key, value if eq else None))
    return got


def slurm_filename(pattern: str, task: int) -> str:
    """A --output pattern as Slurm expands it for array task `task` (%a, %%)."""
    return re.sub(r"%(.)", lambda m: {"%": "%", "a": str(task)}.get(m.group(1), m.group(0)), pattern)


# ------------------------------------------------------------------ item 1: what goes into the scripts

@pytest.mark.parametrize("out", ["runs/n\n#SBATCH --wrap=touch /tmp/x", "runs/t\tx", "runs/r\rx",
                                 "runs/l\u2028x", "runs/nul\x7f", "runs/back\\slash"])
def test_a_control_character_in_out_is_refused_before_anything(fake, capsys, out):
    code, _, err = _cli(["continuing", "--task", "two_choice", "--algorithm", "q", "--alpha", "0.1,0.3", "--seeds",
                         "2", "--steps", "1000", "--submit", "slurm", "--parts", "2", "--out", out], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"bec-jax: error: out: the directory {out!r} holds a "), err
    assert not (fake / "runs").exists() and not (fake / "calls.txt").exists()


def test_a_control_character_in_any_argument_or_the_directory_is_refused(fake, capsys, monkeypatch):
    (fake / "s\n.toml").write_text(SWEEP)  # a config file whose name holds a newline
    code, _, err = _cli(["run", "--config", "s\n.toml", "--out", "runs/x", "--submit", "slurm", "--parts", "2"],
                        capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("bec-jax: error: arguments: the argument 's\\n.toml'")
    odd = fake / "in\x1bdir"
    odd.mkdir()
    shutil.copy(fake / "sweep.toml", odd)
    monkeypatch.chdir(odd)
    code, _, err = _cli(["run", "--config", "sweep.toml", "--out", "x", "--submit", "slurm", "--parts", "2"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("bec-jax: error: submit: the current directory"), err
    assert not (fake / "calls.txt").exists() and os.listdir(odd) == ["sweep.toml"]
    code, _, err = _cli(["run", "--config", "../sweep.toml", "--out", "x", "--submit", "slurm", "--parts", "2",
                         "--slurm-option", "comment=a\tb"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("bec-jax: error: slurm_option: expected KEY=VALUE")


def test_values_are_quoted_as_sbatch_reads_them_and_the_command_as_bash_runs_it(fake, capsys):
    """An --out with a space, `$`, `%`, quotes and `#`, option values with spaces
    and quotes: sbatch reads back each value whole, Slurm's %a still names each
    part's log, and bash runs the parts' and the assembling command with the
    arguments as given (not split at the space, `$x` not expanded)."""
    out = "runs/a b$x%y'q\"#z"
    options = ["comment=a b \"c\" #d", "job-name=it's mine", "time=00:30:00", "exclusive", "wait-all-nodes=1"]
    argv = ["run", "--config", "sweep.toml", "--out", out, "--submit", "slurm", "--parts", "3"]
    for o in options:
        argv += ["--slurm-option", o]
    code, _, err = _cli(argv, capsys)
    assert code == 0 and err == [], err
    sdir = fake / out / "slurm"
    parts, last = (sdir / "parts.sh").read_text(), (sdir / "assemble.sh").read_text()
    logs = str(fake / out / "slurm")
    mine = [("--comment", 'a b "c" #d'), ("--job-name", "it's mine"), ("--time", "00:30:00"), ("--exclusive", None),
            ("--wait-all-nodes", "1")]
    assert directives(parts) == [("--chdir", str(fake)), ("--array", "1-3"),
                                 ("--output", logs.replace("%", "%%") + "/part-%a.log"), *mine]
    assert directives(last) == [("--chdir", str(fake)), ("--output", logs.replace("%", "%%") + "/assemble.log"),
                                *mine]
    assert slurm_filename(dict(directives(parts))["--output"], 2) == f"{logs}/part-2.log"
    # The scripts' commands under bash, with a stand-in python that writes the arguments it gets.
    fake_py = fake / "py"
    _tool(fake, "py", 'printf "%s\\0" "$@" > "$ARGS"\n')
    part_text, last_text = slurm.scripts(out, argv[:5], ["run", "--out", out, "--resume"], 3,
                                         [slurm.parse_option(o) for o in options], python=str(fake_py))
    for text, want in ((part_text, argv[1:5] + ["--chunks", "2/3"]), (last_text, ["--out", out, "--resume"])):
        (fake / "job.sh").write_text(text)
        env = {**os.environ, "ARGS": str(fake / "args"), "SLURM_ARRAY_TASK_ID": "2", "x": "EXPANDED"}
        subprocess.run(["bash", str(fake / "job.sh")], env=env, check=True, timeout=30)
        got = (fake / "args").read_bytes().decode().split("\0")[:-1]
        assert got == ["-m", "bec_jax", "run", *want], got


@pytest.mark.parametrize("option, means", [
    ("outp=/elsewhere", "outp abbreviates output"), ("dep=afterany:1", "dep abbreviates dependency"),
    ("o=x", "o abbreviates output"), ("arr=1-9", "arr abbreviates array"), ("ch=/tmp", "ch abbreviates chdir"),
    ("workdir=/tmp", "workdir is set by"), ("e=err.log", "e abbreviates error"), ("in=/dev/zero", "in abbreviates"),
    ("wait", "wait changes what sbatch itself does"), ("test-o", "test-o abbreviates test-only"),
    ("help", "help changes what sbatch"), ("wra=ls", "wra abbreviates wrap"), ("pars", "pars abbreviates parsable"),
])
def test_sbatchs_prefixes_of_the_submissions_options_are_refused(fake, capsys, option, means):
    code, _, err = _cli(["run", "--config", "sweep.toml", "--out", "runs/x", "--submit", "slurm", "--parts", "2",
                         "--slurm-option", option], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"bec-jax: error: slurm_option: {means}"), err
    assert not (fake / "runs").exists() and not (fake / "calls.txt").exists()


# ------------------------------------------------------------------ item 7: status

@pytest.mark.parametrize("record, why", [
    ('{"parts": "three", "array_job": "101", "assemble_job": "102"}', "parts: expected an integer from 1 to"),
    ('{"parts": [1, 2], "array_job": "101", "assemble_job": "102"}', "parts: expected an integer"),
    ('{"parts": -5, "array_job": "101", "assemble_job": "102"}', "got -5"),
    ('{"parts": 1e12, "array_job": "101", "assemble_job": "102"}', "got 1000000000000.0"),
    ('{"parts": 1000000000000, "array_job": "101", "assemble_job": "102"}', "got 1000000000000)"),
    ('{"parts": 2, "array_job": ["101"], "assemble_job": "102"}', "array_job: expected a Slurm job id"),
    ('{"parts": 2, "array_job": "101", "assemble_job": "102", "again": [1]}', "again: expected"),
    ('{"parts": 2, "array_job": "1', "JSONDecodeError"),
    ("[]", "not a JSON object"),
])
def test_a_damaged_submission_record_is_one_line(fake, capsys, record, why):
    sdir = fake / "runs/x/slurm"
    sdir.mkdir(parents=True)
    (sdir / "submission.json").write_text(record)
    t0 = time.monotonic()
    code, out, err = _cli(["status", "runs/x"], capsys)
    assert time.monotonic() - t0 < 10
    path = os.path.join("runs/x", "slurm", "submission.json")
    assert code == 2 and out == "" and len(err) == 1, err
    assert err[0].startswith(f"bec-jax: error: dir: {path!r} is damaged (") and why in err[0], err
    assert err[0].endswith("give --parts N to see the chunks alone")
    assert (sdir / "submission.json").read_text() == record  # left as it was


def test_a_logs_control_characters_are_printed_as_text(fake, capsys):
    sdir = fake / "runs/x/slurm"
    sdir.mkdir(parents=True)
    (sdir / "submission.json").write_text('{"parts": 1, "array_job": "101", "assemble_job": "102"}')
    (sdir / "part-1.log").write_bytes(b"x" * 20000 + b"\nbec-jax: error: \x1b]0;owned\x07\x1b[2J gone\n")
    code, out, err = _cli(["status", "runs/x"], capsys)
    assert code == 0 and err == [], err
    assert "part 1: failed: bec-jax: error: \\x1b]0;owned\\x07\\x1b[2J gone" in out.splitlines(), out
    assert "\x1b" not in out and "\x07" not in out


def test_too_many_parts_are_refused_at_once_and_the_most_are_counted_quickly(fake, capsys):
    (fake / "runs/x/slurm").mkdir(parents=True)
    for argv in (["status", "runs/x", "--parts", "100000000"],
                 ["run", "--config", "sweep.toml", "--out", "runs/y", "--submit", "slurm", "--parts", "100001"]):
        code, _, err = _cli(argv, capsys)
        assert code == 2 and err == [f"bec-jax: error: parts: expected an integer from 1 to {slurm.MAX_PARTS} (the "
                                     f"parts of a Slurm job array), got {int(argv[-1])}"], err
    t0 = time.monotonic()
    code, out, _ = _cli(["status", "runs/x", "--parts", str(slurm.MAX_PARTS)], capsys)
    assert code == 0 and time.monotonic() - t0 < 20
    lines = out.splitlines()
    assert len(lines) == 2 + slurm.MAX_PARTS + 1 and lines[-1] == "assembling: not submitted"
    assert lines[2] == "part 1: missing" and lines[-2] == f"part {slurm.MAX_PARTS}: missing"
