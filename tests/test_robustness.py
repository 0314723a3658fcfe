"""Robustness (issue 6): bad input is refused with one line naming the field, no
file is left half-written, an interrupted run resumes to the same bits, runs are
deterministic, divergence is recorded as +inf (never NaN), and the exact
quantities hold on random valid models.

The full-size divergence run (TD on Baird, 10^6 steps x 1000 seeds: about 70 s on
one CPU device, 50 s on two) is opt-in:
    BEC_JAX_SLOW=1 python -m pytest -m slow tests/test_robustness.py
"""
import json
import os
import re
import shutil
import signal
import subprocess
import time

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings

from bec_jax import algorithms
from bec_jax import mdp as mdp_lib
from bec_jax.cli.commands import main
from bec_jax.engine import divergence
from bec_jax.mdp import make_mdp
from bec_jax.prediction import sampling, sweep
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import ScheduleSpec, SweepSpec
from bec_jax.run.rundir import ChunkStore
from bec_jax.theory import expected_updates as analysis
from bec_jax.theory import fixpoints

BEC_JAX = shutil.which("bec-jax") or "bec-jax"

# Start JAX's backends now, with the default device count: otherwise the in-process
# CLI calls below (`cli.use_all_cpu_cores`) would give the rest of the session one
# device per CPU core, and other modules' tests count chunks for one device.
jax.devices()

# ============================================================ 1. bad input

BASE = {"--env": "two_state", "--algorithm": "ctd", "--alpha": "0.01,0.005", "--beta": "0.1",
        "--steps": "200", "--seeds": "4", "--log-every": "50"}


def argv_with(changes: dict) -> list[str]:
    """`run` arguments: BASE with `changes` applied (value None drops the option;
    a value True adds a flag)."""
    opts = dict(BASE)
    opts.update(changes)
    argv = ["run"]
    for k, v in opts.items():
        if v is None:
            continue
        argv += [k] if v is True else [k, v]
    return argv


# (changes to BASE, the field the one error line must start with)
CLI_CASES = [
    ({"--env": "nope"}, "env"),
    ({"--algorithm": "sarsa"}, "algorithm"),
    ({"--sampler": "mcmc"}, "sampler"),
    ({"--schedule": "cosine"}, "schedule"),
    ({"--metrics": "rmse"}, "metrics"),
    ({"--metrics": ","}, "metrics"),
    ({"--metrics": "rmscbe,rmscbe"}, "metrics"),
    ({"--dtype": "float16"}, "dtype"),
    ({"--alpha": "-0.1"}, "alpha"),
    ({"--alpha": "0"}, "alpha"),
    ({"--alpha": "nan"}, "alpha"),
    ({"--alpha": "inf"}, "alpha"),
    ({"--alpha": "0.1,abc"}, "alpha"),
    ({"--alpha": ","}, "alpha"),
    ({"--beta": "0.1,-1"}, "beta"),
    ({"--zeta": "0.1"}, "zeta"),               # CTD does not use zeta: said, not ignored
    ({"--beta": None}, "beta"),                # CTD uses beta: the grid would be empty
    ({"--algorithm": "td"}, "beta"),           # TD does not use beta
    ({"--alpha": None}, "alpha"),
    ({"--env": None}, "env"),
    ({"--steps": "0"}, "steps"),
    ({"--steps": "-5"}, "steps"),
    ({"--steps": "abc"}, "steps"),
    ({"--steps": "1.5"}, "steps"),
    ({"--steps": "3e9"}, "steps"),
    ({"--steps": ""}, "steps"),
    ({"--seeds": "0"}, "seeds"),
    ({"--seeds": "four"}, "seeds"),
    ({"--log-every": "0"}, "log_every"),
    ({"--log-every": "-10"}, "log_every"),
    ({"--log-every": "1000"}, "log_every"),    # more than steps
    ({"--log-every": "3"}, "log_every"),       # does not divide steps
    ({"--seed": "-1"}, "seed"),
    ({"--seed": "4294967296"}, "seed"),        # 2**32 would alias seed 0
    ({"--seed": "x"}, "seed"),
    ({"--divergence-bound": "0"}, "divergence_bound"),
    ({"--divergence-bound": "nan"}, "divergence_bound"),
    ({"--divergence-bound": "1e30"}, "divergence_bound"),
    ({"--divergence-bound": "big"}, "divergence_bound"),
    ({"--t0": "5"}, "schedule.t0"),            # only used by robbins_monro
    ({"--schedule": "robbins_monro", "--t0": "-1"}, "schedule.t0"),
    ({"--schedule": "robbins_monro", "--t0": "x"}, "schedule.t0"),
    ({"--schedule": "robbins_monro", "--p-alpha": "2"}, "schedule.p_alpha"),
    ({"--schedule": "robbins_monro", "--p-zeta": "0.9"}, "schedule.p_zeta"),  # CTD has no zeta
    ({"--chunk-size": "0"}, "chunk_size"),
    ({"--chunk-size": "two"}, "chunk_size"),
    ({"--stepz": "3"}, "stepz"),
    ({"--resume": True, "--overwrite": True}, "resume"),
    ({"--config": "/nonexistent/sweep.toml", "--env": None, "--algorithm": None, "--alpha": None,
      "--beta": None, "--steps": None, "--seeds": None, "--log-every": None}, "config"),
    ({"--config": "/nonexistent/sweep.toml"}, "env"),  # spec options and --config: refused
]


def run_cli(argv, capsys):
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err.strip().splitlines()


def assert_refused(code, err, field):
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith(f"bec-jax: error: {field}:"), err[0]
    assert "Traceback" not in err[0]


@pytest.mark.parametrize("changes,field", CLI_CASES, ids=[f"{f}-{i}" for i, (_, f) in enumerate(CLI_CASES)])
def test_bad_command_line(changes, field, tmp_path, capsys):
    out = tmp_path / "never"
    code, stdout, err = run_cli(argv_with(changes) + ["--out", str(out)], capsys)
    assert_refused(code, err, field)
    assert stdout == "" and not out.exists()


def test_bad_command_line_structure(tmp_path, capsys):
    for argv, field in ([[], "command"], [["walk"], "command"], [["run", "--steps"], "steps"],
                        [["run", "--env", "two_state", "extra"], "arguments"],
                        [["reproduce", "--quick", "--fast"], "fast"]):
        code, _, err = run_cli(argv, capsys)
        assert_refused(code, err, field)
    # --out missing entirely.
    code, _, err = run_cli(argv_with({}), capsys)
    assert_refused(code, err, "out")
    assert main(["run", "--help"]) == 0
    capsys.readouterr()


def test_bad_output_directories(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    for out in (a_file, a_file / "sub", full, ""):
        code, _, err = run_cli(argv_with({}) + ["--out", str(out)], capsys)
        assert_refused(code, err, "out")
    assert not (a_file / "sub").exists() and os.listdir(full) == ["keep.txt"]
    # --resume on a directory that holds something else.
    code, _, err = run_cli(argv_with({"--resume": True}) + ["--out", str(full)], capsys)
    assert_refused(code, err, "resume")
    # `reproduce` refuses a directory it did not write, and a file.
    for out in (full, a_file):
        code, _, err = run_cli(["reproduce", "--quick", "--out", str(out)], capsys)
        assert_refused(code, err, "out")
    assert os.listdir(full) == ["keep.txt"]


# (TOML text, field)
TOML_CASES = [
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.01]\nlearning_rate = 3\n', "learning_rate"),
    ('env = \n', "config"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.01]\n[alpha2]\nx = 1\n', "alpha2"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.01]\nsteps = "ten"\n', "steps"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.01]\nsteps = true\n', "steps"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.01]\nsteps = 100.0\n', "steps"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.01]\nseeds = [4]\n', "seeds"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = "x"\n', "alpha"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = "0.1"\n', "alpha"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [true]\n', "alpha"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1, "x"]\n', "alpha"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = []\n', "alpha"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [{a = 1}]\n', "alpha"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = 0.1\nbeta = [0.1]\n', "beta"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\nmetrics = 3\n', "metrics"),
    ('env = 3\nalgorithm = "td"\nalpha = [0.1]\n', "env"),
    ('env = ["baird"]\nalgorithm = "td"\nalpha = [0.1]\n', "env"),
    ('env = "two_state"\nalgorithm = {name = "td"}\nalpha = [0.1]\n', "algorithm"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\nsampler = 1\n', "sampler"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\ndtype = "float16"\n', "dtype"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\nseed = -1\n', "seed"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\ndivergence_bound = true\n', "divergence_bound"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\nlog_every = 0\n', "log_every"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\nschedule = 5\n', "schedule"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\nschedule = "cosine"\n', "schedule"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\n[schedule]\nkind = "robbins_monro"\nfoo = 1\n',
     "schedule.foo"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\n[schedule]\nkind = "robbins_monro"\nt0 = "x"\n',
     "schedule.t0"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\n[schedule]\np_alpha = false\n', "schedule.p_alpha"),
    ('env = "two_state"\nalgorithm = "td"\npoints = [[0.1, 0.1]]\n', "points[0]"),
    ('env = "two_state"\nalgorithm = "td"\npoints = []\n', "points"),
    ('env = "two_state"\nalgorithm = "td"\npoints = 3\n', "points[0]"),
    ('env = "two_state"\nalgorithm = "ctdc"\npoints = [{alpha = 0.1, beta = 0.1, zeta = -0.1}]\n',
     "points[0].zeta"),
    ('env = "two_state"\nalgorithm = "ctdc"\npoints = [{alpha = 0.1, beta = 0.1}]\n', "points[0].zeta"),
    ('env = "two_state"\nalgorithm = "ctd"\nalpha = 0.1\nbeta = 0.1\nlambda = [0.5]\n', "lambda"),
    ('env = "two_state"\nalgorithm = "ctd"\nalpha = 0.1\nbeta = 0.1\n[env_params]\nfoo = 1\n',
     "env_params.foo"),
    ('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\nout = 3\n', "out"),
]


@pytest.mark.parametrize("text,field", TOML_CASES, ids=[f"{f}-{i}" for i, (_, f) in enumerate(TOML_CASES)])
def test_bad_config_file(text, field, tmp_path, capsys):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(text)
    out = tmp_path / "never"
    code, stdout, err = run_cli(["run", "--config", str(cfg), "--out", str(out)], capsys)
    assert_refused(code, err, field)
    assert stdout == "" and not out.exists()


def test_config_not_utf8_or_a_directory(tmp_path, capsys):
    cfg = tmp_path / "bin.toml"
    cfg.write_bytes(b"env = \"\xff\xfe\"\n")
    for path in (cfg, tmp_path):
        code, _, err = run_cli(["run", "--config", str(path), "--out", str(tmp_path / "o")], capsys)
        assert_refused(code, err, "config")
    assert not (tmp_path / "o").exists()


def test_console_script_errors_are_one_line(tmp_path):
    """The installed script: argparse-level, spec-level and config errors alike."""
    cfg = tmp_path / "bad.toml"
    cfg.write_text('env = "two_state"\nalgorithm = "td"\nalpha = [0.1]\nsteps = "ten"\n')
    for args, field in ((["run", "--steps", "abc"], "steps"),
                        (["run", "--config", str(cfg), "--out", str(tmp_path / "o")], "steps")):
        p = subprocess.run([BEC_JAX] + args, capture_output=True, text=True)
        assert p.returncode == 2 and p.stdout == ""
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"bec-jax: error: {field}:"), p.stderr
    assert not (tmp_path / "o").exists()


# (keyword arguments, field): the public constructors, directly.
SPEC_CASES = [
    (dict(alpha=(True,), algorithm="td"), "alpha"),
    (dict(alpha=(0.1,), algorithm="td", seeds=True), "seeds"),
    (dict(alpha=(0.1,), algorithm="td", steps=1000.0), "steps"),
    (dict(alpha=(0.1,), algorithm="td", env=["baird"]), "env"),
    (dict(alpha=(0.1,), algorithm={"td": 1}), "algorithm"),
    (dict(alpha=np.array(0.1), algorithm="td"), "alpha"),
    (dict(alpha=(0.1,), algorithm="td", metrics=[["rmscbe"]]), "metrics"),
    (dict(alpha=(0.1,), algorithm="td", schedule={"foo": 1}), "schedule.foo"),
    (dict(alpha=(0.1,), algorithm="td", schedule={1: 1}), "schedule.1"),
    (dict(alpha=(0.1,), algorithm="td", schedule=3), "schedule"),
    (dict(alpha=(0.1,), algorithm="td", schedule="cosine"), "schedule"),
    (dict(alpha=(0.1,), algorithm="td", env_params={"gamma": 1.5}), "env"),
    (dict(alpha=(0.1,), algorithm="td", env_params={"nope": 1}), "env_params.nope"),
    (dict(alpha=(0.1,), algorithm="td", env_params=[1]), "env_params"),
    (dict(alpha=(0.1,), algorithm="td", hyperparameters={"beta": 0.1}), "beta"),
    (dict(alpha=(0.1,), algorithm="td", points=[{"alpha": 0.1}]), "points"),
    (dict(algorithm="td", points=[{"alpha": 0.1}, {"alpha": 0.1}]), "points[1]"),
    (dict(algorithm="td", points=[{"alpha": 0.1, "lambda": 0.2}]), "points: lambda"),
    (dict(points=5, algorithm="td"), "points[0]"),
    (dict(points=[None], algorithm="td"), "points[0]"),
    (dict(alpha=(0.1,), algorithm="td", divergence_bound=True), "divergence_bound"),
    (dict(alpha=(0.1,), algorithm="td", seed=2**40), "seed"),
]


@pytest.mark.parametrize("kw,field", SPEC_CASES)
def test_bad_spec_constructor(kw, field):
    with pytest.raises(ValueError, match="^" + re.escape(field) + ":"):
        SweepSpec(**kw)


def test_bad_schedule_and_from_dict():
    for kw, field in ((dict(kind=3), "schedule"), (dict(t0=True), "schedule.t0"),
                      (dict(p_beta="0.5"), "schedule.p_beta"), (dict(p_zeta=float("nan")), "schedule.p_zeta")):
        with pytest.raises(ValueError, match=rf"^{field}:"):
            ScheduleSpec(**kw)
    for d, field in (({1: 2, "env": "x"}, "1"), ({"schedule": {2: 1}}, "schedule.2"), ([1], "spec")):
        with pytest.raises(ValueError, match=rf"^{field}"):
            SweepSpec.from_dict(d)


def test_valid_specs_normalise_to_plain_floats():
    s = SweepSpec(algorithm="td", alpha=np.array([0.1, 1], np.float32), seeds=np.int64(3))
    assert all(type(v) is float for v in s.alpha)
    json.dumps(s.to_dict(), allow_nan=False)
    assert SweepSpec.from_dict(s.to_dict()) == s


def _mdp_kwargs(**over):
    P = np.zeros((3, 2, 3))
    P[:, 0] = [[0.5, 0.5, 0], [0, 0.5, 0.5], [0.5, 0, 0.5]]
    P[:, 1] = np.eye(3)[[1, 2, 0]]
    kw = dict(pi=np.full((3, 2), 0.5), mu=np.full((3, 2), 0.5), P=P, R=np.zeros((3, 2, 3)),
              phi=np.eye(3)[:, :2], gamma=0.9)
    kw.update(over)
    return kw


MDP_CASES = [
    (dict(P=np.full((3, 2, 3), 0.4)), "P"),                        # rows sum to 1.2
    (dict(pi=np.full((3, 2), 0.4)), "pi"),
    (dict(mu=np.array([[1.5, -0.5]] * 3)), "mu"),
    (dict(pi=np.full((3, 3), 1 / 3)), "pi"),                       # shapes disagree
    (dict(mu=np.full((2, 2), 0.5)), "mu"),
    (dict(P=np.full((3, 2, 4), 0.25)), "P"),
    (dict(R=np.zeros((3, 3))), "R"),
    (dict(phi=np.eye(4)), "phi"),
    (dict(phi=np.zeros((3, 0))), "phi"),
    (dict(theta0=np.zeros(3)), "theta0"),
    (dict(start=np.array([0.5, 0.5])), "start"),
    (dict(start=np.array([0.5, 0.6, 0.0])), "start"),
    (dict(gamma=1.0), "gamma"),
    (dict(gamma=True), "gamma"),
    (dict(gamma="0.9"), "gamma"),
    (dict(gamma=float("nan")), "gamma"),
    (dict(P=np.full((3, 2, 3), np.nan)), "P"),
    (dict(P="abc"), "P"),
    (dict(phi=[[1, 2], [3]]), "phi"),
    (dict(R=np.zeros((3, 2, 3)) * 1j), "R"),
    (dict(mu=np.array([[1.0, 0.0]] * 3)), "mu"),                   # coverage: pi(a1) > 0 = mu(a1)
    (dict(P=np.stack([np.eye(3), np.eye(3)], 1), pi=np.full((3, 2), 0.5)), "mu"),  # not unichain
]


@pytest.mark.parametrize("over,field", MDP_CASES)
def test_bad_custom_mdp(over, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        make_mdp(**_mdp_kwargs(**over))


def test_run_rejects_bad_chunk_sizes_and_float64_without_x64():
    spec = SweepSpec(env="two_state", algorithm="td", alpha=(0.01,), seeds=2, steps=20, log_every=10)
    for c in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="^chunk_size:"):
            sweep.run(spec, chunk_size=c)
    with pytest.raises(ValueError, match="^dtype: float64 needs JAX's 64-bit mode"):
        sweep.run(SweepSpec(env="two_state", algorithm="td", alpha=(0.01,), dtype="float64"))


# ------------------------------------------------- property: validator never crashes

_junk = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.binary(max_size=4), st.just(np.float32(0.1)), st.just(np.int64(7)),
    st.just(np.array(0.5)), st.just(np.array([0.1, 0.2])), st.just(object()), st.just(1j))
_value = st.recursive(_junk, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner, inner),
    st.dictionaries(st.one_of(st.text(max_size=6), st.integers()), inner, max_size=3)), max_leaves=8)
_steps = st.one_of(st.lists(st.floats(1e-4, 1.0), min_size=1, max_size=3), _value)
_FIELD_VALUES = {
    "alpha": _steps, "beta": _steps, "zeta": _steps,
    "env": st.one_of(st.sampled_from(["baird", "two_state", "boyan_chain"]), _value),
    "algorithm": st.one_of(st.sampled_from(algorithms.names()), _value),
    "points": st.one_of(st.none(), st.lists(st.fixed_dictionaries(
        {}, optional={n: st.one_of(st.floats(1e-3, 1), _value) for n in ("alpha", "beta", "zeta", "gamma")}),
        max_size=3), _value),
    "env_params": st.one_of(st.none(), st.dictionaries(st.sampled_from(["gamma", "a", "p_solid", "nope"]),
                                                       st.one_of(st.floats(0, 1), _value), max_size=2), _value),
    "schedule": st.one_of(st.just(ScheduleSpec()), st.sampled_from(["constant", "robbins_monro"]),
                          st.dictionaries(st.sampled_from(["kind", "t0", "p_alpha", "p_beta", "p_zeta", "x"]),
                                          _value, max_size=3), _value),
    "seeds": st.one_of(st.integers(-3, 100), _value), "steps": st.one_of(st.integers(-3, 10**10), _value),
    "log_every": st.one_of(st.integers(-3, 100), _value),
    "sampler": st.one_of(st.sampled_from(["markov", "iid"]), _value),
    "metrics": st.one_of(st.lists(st.sampled_from(["rmscbe", "rmsve", "rmspbe", "nope"]), max_size=3), _value),
    "dtype": st.one_of(st.sampled_from(["float32", "float64"]), _value),
    "seed": st.one_of(st.integers(-3, 2**33), _value),
    "divergence_bound": st.one_of(st.floats(0, 1e20), _value),
}


def _accepts_or_value_error(make):
    try:
        spec = make()
    except ValueError as e:
        msg = str(e)
        assert "\n" not in msg and ": " in msg, msg  # one line, "<field>: ..."
        return None
    # Accepted: a well-formed spec (never run here) that serialises and round-trips.
    d = spec.to_dict()
    json.dumps(d, allow_nan=False)
    assert SweepSpec.from_dict(d) == spec and spec.num_points >= 1
    return spec


@st.composite
def near_valid_specs(draw):
    """A valid spec's fields with up to two of them replaced by arbitrary values."""
    alg = draw(st.sampled_from(["td", "tdc", "ctd", "ctdc", "src"]))
    kw = {"algorithm": alg, "env": draw(st.sampled_from(["baird", "two_state", "boyan_chain"])),
          "steps": 100, "log_every": draw(st.sampled_from([1, 10, 50, 100])), "seeds": draw(st.integers(1, 9)),
          "metrics": draw(st.lists(st.sampled_from(["rmscbe", "rmsve"]), min_size=1, max_size=1))}
    for n in algorithms.get(alg).step_sizes:
        kw[n] = draw(st.lists(st.floats(1e-4, 1.0), min_size=1, max_size=3))
    kw.update(draw(st.dictionaries(st.sampled_from(sorted(_FIELD_VALUES)),
                                   st.deferred(lambda: st.one_of(*_FIELD_VALUES.values())), max_size=2)))
    return kw


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(near_valid_specs(), st.fixed_dictionaries({}, optional=_FIELD_VALUES)))
def test_spec_validator_accepts_or_raises_value_error(kw):
    _accepts_or_value_error(lambda: SweepSpec(**kw))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.dictionaries(st.one_of(st.sampled_from(list(_FIELD_VALUES) + ["out", "chunk"]),
                                           st.text(max_size=5), st.integers()), _value, max_size=6),
                 st.fixed_dictionaries({}, optional=_FIELD_VALUES), _value))
@example({"\n": None})  # found by hypothesis: the key went into the message raw, a line break with it
@example({"env_params": np.array([0.1, 0.2])})  # found by hypothesis: "if not array" raised numpy's error
@example({"hyperparameters": [1, 2]})  # dict() of it raised TypeError
def test_spec_from_dict_accepts_or_raises_value_error(d):
    _accepts_or_value_error(lambda: SweepSpec.from_dict(d))


# ============================================== 3 and 4. interruption, determinism

# 5000 steps: a chunk's call takes long enough for the signal to land between the first chunk and the last
# (20 log points, as at 20000 steps); the run's time is its steps' (small chunks of 100 seeds a device).
# Kolter's two-state model (every point stable, no curve near 0): a process on Boyan's chain took about
# four times the CPU, mostly its summary's exact verdicts (a mean-square analysis per grid point), and
# resuming does not depend on the model.
GRID = ["--env", "kolter", "--algorithm", "ctd", "--alpha", "0.001,0.002,0.005,0.01,0.02,0.05,0.1,0.2",
        "--beta", "0.01,0.02,0.05,0.1,0.2", "--steps", "5000", "--seeds", "100", "--log-every", "250",
        "--metrics", "rmscbe,rmsve"]
NUM_CHUNKS = 20  # 40 points, --chunk-size 1 rounded up to the 2 CPU devices the CLI uses


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory):
    """Subprocess environment: two CPU devices (whatever this machine has) and a
    compilation cache shared by this module's processes only."""
    return dict(os.environ, BEC_JAX_CPU_DEVICES="2",
                BEC_JAX_CACHE_DIR=str(tmp_path_factory.mktemp("xla_cache")))


def bec(args, env, **kw):
    return subprocess.run([BEC_JAX] + args, capture_output=True, text=True, env=env, **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cli_env):
    out = tmp_path_factory.mktemp("ref") / "run"
    p = bec(["run"] + GRID + ["--chunk-size", "1", "--out", str(out)], cli_env)
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(out)) == ["curves.npz", "meta.json", "summary.csv", "summary.json"]  # chunks removed
    assert json.load(open(out / "meta.json"))["num_chunks"] == NUM_CHUNKS
    return out


def assert_same_results(a, b):
    with np.load(a / "curves.npz") as za, np.load(b / "curves.npz") as zb:
        assert sorted(za.files) == sorted(zb.files)
        for k in za.files:
            assert za[k].dtype == zb[k].dtype
            np.testing.assert_array_equal(za[k], zb[k], err_msg=k)  # bit for bit (NaN nowhere)
    assert json.load(open(a / "summary.json")) == json.load(open(b / "summary.json"))


def interrupt(args, env, sig, chunks_dir, timeout=90):
    """Starts `bec-jax` and sends `sig` once its first chunk file exists."""
    proc = subprocess.Popen([BEC_JAX] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    t0 = time.monotonic()
    try:
        while not (chunks_dir.is_dir() and any(n.startswith("chunk_") for n in os.listdir(chunks_dir))):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < timeout, "no chunk was written"
            time.sleep(0.01)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


@pytest.mark.parametrize("sig,code,resume_args", [
    (signal.SIGINT, 130, GRID),  # resume with the spec given again
    (signal.SIGTERM, 143, []),   # resume from the saved spec alone
])
def test_interrupt_then_resume_is_bit_identical(reference, cli_env, tmp_path, capsys, sig, code, resume_args):
    out = tmp_path / "run"
    chunks = out / "chunks"
    rc, stdout, stderr = interrupt(["run"] + GRID + ["--chunk-size", "1", "--out", str(out)], cli_env, sig, chunks)
    assert rc == code, stderr
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"bec-jax: interrupted by {sig.name} after ")
    assert f"bec-jax run --out {out} --resume" in last
    done = sorted(n for n in os.listdir(chunks) if n.startswith("chunk_"))
    assert 1 <= len(done) < NUM_CHUNKS, done
    assert not any(n.startswith(".tmp-") for n in os.listdir(chunks))
    assert not (out / "curves.npz").exists()
    manifest = json.load(open(chunks / "manifest.json"))
    assert manifest["chunk_size"] == 2 and manifest["num_chunks"] == NUM_CHUNKS
    # Resuming refuses a different spec or chunk size before touching anything, and
    # a plain rerun refuses the non-empty directory (checked in-process: faster).
    other = ["2500" if a == "5000" else a for a in GRID]
    for argv, start in ((other + ["--resume"], "steps: differs from the interrupted run"),
                        (GRID + ["--chunk-size", "4", "--resume"], "chunk_size: the interrupted run used"),
                        (GRID, "out: ")):
        code, _, err = run_cli(["run"] + argv + ["--out", str(out)], capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith("bec-jax: error: " + start), err
    assert sorted(n for n in os.listdir(chunks) if n.startswith("chunk_")) == done
    # Resume: the finished chunks are skipped, the result is the uninterrupted one.
    p = bec(["run"] + resume_args + ["--out", str(out), "--resume"], cli_env)
    assert p.returncode == 0, p.stderr
    assert f"({len(done)} of {NUM_CHUNKS} chunks from the interrupted run)" in p.stdout
    assert json.load(open(out / "meta.json"))["resumed_chunks"] == len(done)
    assert not chunks.exists()
    assert_same_results(reference, out)


def test_two_processes_and_chunk_sizes_give_identical_bits(reference, cli_env, tmp_path):
    runs = []
    for name in ("a", "b"):  # default chunk size: the whole grid in one chunk
        out = tmp_path / name
        p = bec(["run"] + GRID + ["--out", str(out)], cli_env)
        assert p.returncode == 0, p.stderr
        assert json.load(open(out / "meta.json"))["num_chunks"] == 1
        runs.append(out)
    assert_same_results(*runs)  # same spec, seed and chunk size, two processes: the same bits
    # The reference ran with small chunks: still the same bits.
    assert_same_results(runs[0], reference)


def test_overwrite_starts_over(tmp_path, capsys):
    out = tmp_path / "o"
    store = ChunkStore(str(out))
    os.makedirs(store.dir)
    (out / "chunks" / "chunk_00007.npz").write_bytes(b"stale")
    argv = ["run", "--env", "two_state", "--algorithm", "td", "--alpha", "0.01", "--steps", "20",
            "--seeds", "2", "--log-every", "10", "--out", str(out)]
    assert main(argv) == 2  # not empty, no --overwrite
    assert main(argv + ["--overwrite"]) == 0
    capsys.readouterr()
    assert sorted(os.listdir(out)) == ["curves.npz", "meta.json", "summary.csv", "summary.json"]


def test_sweep_run_hooks_skip_done_chunks():
    spec = SweepSpec(env="two_state", algorithm="td", alpha=(0.01, 0.02, 0.03), seeds=3, steps=40, log_every=20)
    seen = {}
    full = sweep.run(spec, chunk_size=2, devices=jax.devices()[:1], on_chunk=lambda i, a: seen.setdefault(i, a))
    assert sorted(seen) == [0, 1] and seen[1]["mean"].shape[0] == 1  # padding removed
    part = sweep.run(spec, chunk_size=2, devices=jax.devices()[:1], done_chunks={0: seen[0]})
    assert part.meta["resumed_chunks"] == 1
    np.testing.assert_array_equal(part.mean, full.mean)
    none_left = sweep.run(spec, chunk_size=2, devices=jax.devices()[:1], done_chunks=seen)
    assert none_left.meta["compile_time_s"] == 0 and none_left.meta["updates_per_s"] is None
    np.testing.assert_array_equal(none_left.final, full.final)
    with pytest.raises(ValueError, match="^done_chunks:"):
        sweep.run(spec, chunk_size=1, devices=jax.devices()[:1], done_chunks={0: seen[0]})

    # An exception from on_chunk stops the run after that chunk.
    calls = []

    def stop(i, arrays):
        calls.append(i)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep.run(spec, chunk_size=2, devices=jax.devices()[:1], on_chunk=stop)
    assert calls == [0]
    # A NaN the divergence check did not account for is reported, not saved silently.
    bad = {i: dict(a) for i, a in seen.items()}
    bad[1]["mean"] = np.full_like(bad[1]["mean"], np.nan)
    with pytest.warns(RuntimeWarning, match="did not flag"):
        sweep.run(spec, chunk_size=2, devices=jax.devices()[:1], done_chunks=bad)


def test_reproduce_refuses_foreign_dirs_but_reruns_over_its_own(tmp_path, capsys, monkeypatch):
    from bec_jax.experiments import paper
    calls = []
    monkeypatch.setattr(paper, "reproduce", lambda out_dir, quick: calls.append(out_dir))
    own = tmp_path / "paper"
    own.mkdir()
    (own / "figure1.png").write_bytes(b"old")
    assert main(["reproduce", "--out", str(own)]) == 2
    (own / "meta.json").write_text(json.dumps({"kind": paper.KIND, "complete": False}))
    assert paper.is_reproduce_dir(str(own))
    assert main(["reproduce", "--out", str(own)]) == 0
    assert main(["reproduce", "--out", str(tmp_path / "fresh")]) == 0
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "meta.json").write_text(json.dumps({"spec": {}}))  # a `bec-jax run` output
    assert main(["reproduce", "--out", str(foreign)]) == 2
    assert main(["reproduce", "--out", str(foreign), "--overwrite"]) == 0
    capsys.readouterr()
    assert calls == [str(own), str(tmp_path / "fresh"), str(foreign)]


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    from bec_jax.files import atomic_write
    path = tmp_path / "x.json"
    path.write_text("old")

    def boom(f):
        f.write("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(str(path), boom)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["x.json"]
    atomic_write(str(path), lambda f: f.write("new"))
    mask = os.umask(0)
    os.umask(mask)
    assert path.read_text() == "new" and (os.stat(path).st_mode & 0o777) == 0o666 & ~mask


# ====================================================================== 5. extremes

def check_diverged_run(r: SweepResult, tmp_path):
    """Every seed of the first grid point diverged; statistics hold +inf, never NaN."""
    L = r.spec.steps // r.spec.log_every
    for stat in (r.mean, r.std, r.sem, r.final):
        assert not np.isnan(stat).any()
    assert r.diverged_fraction[0] == 1.0
    ds = r.diverged_step[0]
    assert np.all((ds > 0) & (ds <= r.spec.steps) & (ds % r.spec.log_every == 0))
    assert np.all(r.final[:, 0] == np.inf)
    dead = r.alive[0] == 0
    assert dead[-1] and dead.sum() < L  # all dead by the end, not at the start
    assert np.all(r.mean[:, 0, dead] == np.inf) and np.all(np.isfinite(r.mean[:, 0, ~dead]))
    # The alive counts fall exactly as the recorded divergence steps say.
    np.testing.assert_array_equal(r.alive[0], ((ds[None, :] < 0) | (ds[None, :] > r.steps[:, None])).sum(1))
    rec = r.summary()[0]
    assert rec["final_mean"] is None and rec["final_std"] is None and rec["auc"] is None
    r.save(str(tmp_path))
    json.loads((tmp_path / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    json.loads((tmp_path / "meta.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    back = SweepResult.load(str(tmp_path))
    np.testing.assert_array_equal(back.mean, r.mean)
    return ds


def test_td_on_baird_diverges_with_every_seed_flagged(tmp_path):
    spec = SweepSpec(env="baird", algorithm="td", alpha=(0.3, 0.001), seeds=100, steps=10_000, log_every=10,
                     metrics=("rmscbe", "rmsve"))
    r = sweep.run(spec)
    ds = check_diverged_run(r, tmp_path)
    assert ds.min() < ds.max() <= 1000  # TD at alpha = 0.3 leaves the bound within ~100s of steps
    assert r.diverged_fraction[1] == 0 and np.all(np.isfinite(r.mean[:, 1]))
    # Plots and the paper's table cope with +inf (nothing drawn where every seed diverged).
    from bec_jax.experiments import paper
    paper.save_figure(paper.figure1({"baird": {"td": r}}), str(tmp_path), "fig1")
    paper.save_figure(paper.sensitivity_figure("baird", {"td": r}), str(tmp_path), "sens")
    assert (tmp_path / "fig1.png").stat().st_size > 1000 and (tmp_path / "sens.pdf").stat().st_size > 1000
    assert paper.point_verdict(r, 0).label == "diverges"


@pytest.mark.parametrize("seeds", [100, 1000])
def test_divergence_check_flags_nan_and_inf_runs_in_wide_batches(seeds):
    """XLA:CPU's vectorised max-reduction has dropped NaN (an all-NaN row gave -inf)
    for 1000 seeds, which let NaN runs pass the divergence check; the check must
    flag every run with a NaN, an inf or a value past the bound, whatever the batch."""
    from bec_jax.algorithms.td import TDState
    theta = np.zeros((2, seeds, 8), np.float32)
    theta[0] = np.nan                    # every component NaN
    theta[1, ::3, 5] = np.nan            # one component NaN
    theta[1, 1::3, 7] = np.inf
    theta[1, 2::3, 0] = -2e6             # past the bound
    ok = jax.jit(lambda s: divergence.run_ok(s, 1e6))(TDState(jnp.asarray(theta), jnp.zeros((2, seeds), jnp.int32)))
    assert not np.asarray(ok).any()
    theta[1] = 1e6                       # at the bound: fine
    ok = jax.jit(lambda s: divergence.run_ok(s, 1e6))(TDState(jnp.asarray(theta), jnp.zeros((2, seeds), jnp.int32)))
    np.testing.assert_array_equal(np.asarray(ok), [[False] * seeds, [True] * seeds])


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("BEC_JAX_SLOW"), reason="opt-in (about a minute): set BEC_JAX_SLOW=1")
def test_td_on_baird_full_size(tmp_path):
    spec = SweepSpec(env="baird", algorithm="td", alpha=(0.3,), seeds=1000, steps=1_000_000, log_every=10,
                     metrics=("rmscbe", "rmsve"))
    r = sweep.run(spec)
    ds = check_diverged_run(r, tmp_path)
    print(f"10^6 steps x 1000 seeds: {r.meta['run_time_s']:.1f} s run, {r.meta['compile_time_s']:.1f} s "
          f"compile; diverged at steps {ds.min()}..{ds.max()}")


def test_float64_on_request(tmp_path, capsys):
    out = tmp_path / "f64"
    argv = ["run", "--env", "two_state", "--algorithm", "ctd", "--alpha", "0.01", "--beta", "0.1",
            "--steps", "100", "--seeds", "3", "--log-every", "50", "--dtype", "float64", "--out", str(out)]
    try:
        assert main(argv) == 0
    finally:
        jax.config.update("jax_enable_x64", False)
    capsys.readouterr()
    with np.load(out / "curves.npz") as z:
        for k in ("mean", "std", "sem", "final_rmscbe"):
            assert z[k].dtype == np.float64, k
        assert np.all(np.isfinite(z["mean"]))
    assert SweepResult.load(str(out)).spec.dtype == "float64"


# ============================================================ 6. random valid models

S_MAX, A_MAX = 6, 3
W_MAX = S_MAX * A_MAX


@st.composite
def random_mdps(draw):
    """A random finite MDP: S in 2..6, A in 1..3, sparse transitions kept unichain by
    a cycle, a behaviour policy covering the target, features of full or
    deficient rank (duplicated or constant columns, more features than states)."""
    S = draw(st.integers(2, S_MAX))
    A = draw(st.integers(1, A_MAX))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    P = rng.dirichlet(np.ones(S), size=(S, A)) * (rng.random((S, A, S)) < 0.6)
    P[np.arange(S), :, (np.arange(S) + 1) % S] += 0.05  # a cycle: every state reaches every other
    P /= P.sum(-1, keepdims=True)
    pi = rng.dirichlet(np.ones(A), size=S) * (rng.random((S, A)) < 0.7)
    pi[pi.sum(1) == 0, 0] = 1.0
    pi /= pi.sum(1, keepdims=True)
    mu = rng.dirichlet(np.ones(A), size=S) * (rng.random((S, A)) < 0.5) + (pi > 0) * 0.1
    mu /= mu.sum(1, keepdims=True)
    kind = draw(st.sampled_from(["full", "duplicate", "constant", "wide"]))
    k = draw(st.integers(1, S))
    phi = rng.normal(size=(S, k))
    if kind == "duplicate":
        phi = np.hstack([phi, phi[:, :1] * 2.0])
    elif kind == "constant":
        phi = np.hstack([phi, np.ones((S, 1))])
    elif kind == "wide":
        phi = rng.normal(size=(S, S + 1))
    if draw(st.booleans()):
        gamma = draw(st.floats(0.0, 0.99))
    else:  # episodic: per-transition discounts, some 0 (an episode ends), some 1
        gamma = rng.uniform(0.5, 1.0, (S, A, S)) * (rng.random((S, A, S)) < 0.8)
        gamma[rng.random((S, A, S)) < 0.2] = 1.0
        gamma[:, :, 0] = 0.0  # entering state 0 ends an episode
        Pg = np.einsum("sa,sat,sat->st", pi, P, gamma)
        if np.abs(np.linalg.eigvals(Pg)).max() > 1 - 1e-6:
            gamma *= 0.99
    env = make_mdp(pi=pi, mu=mu, P=P, R=rng.normal(size=(S, A, S)), phi=phi, gamma=gamma)
    return env, kind


_MDP_SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))


@_MDP_SETTINGS
@given(random_mdps())
def test_centered_td_fixpoint_solves_its_equation(model):
    env, kind = model
    A, b = fixpoints.centered_td_matrices(env)
    fs = fixpoints.centered_td_fixpoint_set(env)
    scale = np.linalg.norm(A) * (1 + np.linalg.norm(fs.theta)) + np.linalg.norm(b)
    assert np.linalg.norm(A @ fs.theta - b) <= 1e-9 * scale
    assert fs.residual <= 1e-9 * scale
    if kind in ("duplicate", "wide") or np.linalg.matrix_rank(env.phi) < env.num_features:
        assert not fs.unique  # null(Phi) is in null(A_c)
    if kind == "constant":
        assert not fs.unique  # the constant direction: (D - d d^T) 1 = 0
    rng = np.random.default_rng(0)
    for _ in range(3):
        if fs.unique:
            break
        theta = fs.theta + fs.null_space @ (rng.normal(size=fs.null_space.shape[1]) * 10)
        assert np.linalg.norm(A @ theta - b) <= 1e-9 * (np.linalg.norm(A) * (1 + np.linalg.norm(theta))
                                                         + np.linalg.norm(b))
    np.testing.assert_allclose(A @ fs.null_space, 0, atol=1e-9 * max(1.0, np.linalg.norm(A)))


def padded_tables(env) -> sampling.SamplerTables:
    """The model's sampler tables padded to S_MAX states and W_MAX outcomes (never
    drawn: their cumulative probability is above any uniform), with one-hot
    features so a draw names its state; one jitted function serves every model."""
    t = sampling.build_tables(env, jnp.float32)
    S, W = t.cdf.shape

    def pad(x, shape, value):
        out = np.full(shape, value, np.asarray(x).dtype)
        out[tuple(slice(0, n) for n in np.shape(x))] = np.asarray(x)
        return jnp.asarray(out)

    return sampling.SamplerTables(
        phi=jnp.eye(S_MAX, dtype=jnp.float32), cdf=pad(t.cdf, (S_MAX, W_MAX), 2.0),
        next_state=pad(t.next_state, (S_MAX, W_MAX), 0), reward=pad(t.reward, (S_MAX, W_MAX), 0.0),
        rho=pad(t.rho, (S_MAX, W_MAX), 0.0), discount=pad(t.discount, (S_MAX, W_MAX), 0.0),
        state_cdf=pad(t.state_cdf, (1, S_MAX), 2.0), start_cdf=pad(t.start_cdf, (1, S_MAX), 2.0))


N_DRAWS = 40_000


@jax.jit
def iid_draws(tables, key):
    u = jax.random.uniform(key, (N_DRAWS, 2), jnp.float32)
    tr, s2 = jax.vmap(lambda x: sampling.iid_step_from_uniforms(tables, x, jnp.int32(0)))(u)
    return jnp.argmax(tr.phi, axis=-1), s2


@_MDP_SETTINGS
@given(random_mdps(), st.integers(0, 2**31 - 1))
def test_iid_sampler_frequencies_match_the_model(model, seed):
    env, _ = model
    S = env.num_states
    s, s2 = (np.asarray(x) for x in iid_draws(padded_tables(env), jax.random.key(seed)))
    assert s.max() < S and s2.max() < S
    d = mdp_lib.d_mu(env)
    freq = np.bincount(s, minlength=S) / N_DRAWS
    np.testing.assert_array_less(np.abs(freq - d), 5 * np.sqrt(np.clip(d * (1 - d), 0, None) / N_DRAWS) + 3 / N_DRAWS)
    P = mdp_lib.P_mu(env)
    counts = np.zeros((S, S))
    np.add.at(counts, (s, s2), 1)
    assert np.all(counts[P == 0] == 0), "a zero-probability next state was drawn"
    n = counts.sum(1, keepdims=True)
    seen = n[:, 0] > 0
    cond = counts[seen] / n[seen]
    se = np.sqrt(np.clip(P[seen] * (1 - P[seen]), 0, None) / n[seen])
    np.testing.assert_array_less(np.abs(cond - P[seen]), 5 * se + 3 / n[seen])


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(random_mdps(), st.sampled_from(["td", "tdc", "ctd", "ctdc", "ctdc_omega_no_rho", "src", "vrc"]),
       st.tuples(*[st.floats(0.01, 1.0)] * 3))
def test_generic_expected_update_equals_hand_derived_on_random_mdps(model, alg_name, h):
    """The expected update derived from the update function (analysis) against the
    hand-derived matrices (tests/hand_derived.py), on random models with constant
    and with episodic (per-transition) discounting."""
    from hand_derived import hand_expected_update
    env, _ = model
    alg = algorithms.get(alg_name)
    h = dict(zip(("alpha", "beta", "zeta"), h))
    G, g = analysis.expected_update(env, alg_name, {n: h[n] for n in alg.names})
    G0, g0 = hand_expected_update(env, alg_name, h)
    assert G.shape == G0.shape
    np.testing.assert_allclose(G, G0, rtol=1e-9, atol=1e-11 * (1 + np.abs(G0).max()))
    np.testing.assert_allclose(g, g0, rtol=1e-9, atol=1e-11 * (1 + np.abs(g0).max()))


def test_a_part_is_not_refused_for_another_parts_write_probe(tmp_path):
    """Two `--chunks` parts start at once: one may see the other's brief write
    probe in the shared directory before the chunk store exists (a race CI hit)."""
    from bec_jax.prediction.spec import SweepSpec
    from bec_jax.run import rundir, runner
    out = tmp_path / "run"
    out.mkdir()
    (out / ".bec-jax-write-test-99999").write_text("")
    spec = SweepSpec(env="two_state", algorithm="td", alpha=(0.1, 0.2), seeds=2, steps=20, log_every=10)
    r = runner.run_to_dir(spec, str(out), part=(1, 2), chunk_size=1, devices=jax.devices()[:1], progress=False)
    assert r["part"] == "1/2" and r["chunks_done"] == 1
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("")  # anything else makes the directory someone else's
    with pytest.raises(rundir.RunError, match="holds no chunk store"):
        runner.run_to_dir(spec, str(other), part=(1, 2), chunk_size=1, devices=jax.devices()[:1], progress=False)
