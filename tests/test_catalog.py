"""`bec-jax list` and `bec-jax --version`: read from the registries, so a name
registered before listing is listed, with its parameters and hyperparameters."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

import bec_jax
from bec_jax import algorithms, envs, mdp
from bec_jax.algorithms import td
from bec_jax.cli import catalog
from bec_jax.cli.commands import main
from bec_jax.control import algorithms as control_algorithms
from bec_jax.control import tasks as control_tasks
from bec_jax.theory import metrics


def _list(capsys, *args) -> str:
    assert main(["list", *args]) == 0
    return capsys.readouterr().out


def test_every_registered_name_is_listed(capsys):
    out = _list(capsys)
    lines = out.splitlines()
    for section, names in [("environments", envs.names()), ("algorithms", algorithms.names()),
                           ("metrics", metrics.metric_names()), ("tasks", control_tasks.names()),
                           ("control-algorithms", control_algorithms.names())]:
        assert names, section
        for n in names:
            assert any(line.startswith(f"  {n}(") or line.startswith(f"  {n} ") or line == f"  {n}"
                       for line in lines), (section, n)
    assert "gymnax:ENV_ID" in out and "features=fourier: order=3" in out


def test_hyperparameters_defaults_and_equations_are_listed(capsys):
    out = _list(capsys, "algorithms")
    ctd_lambda = algorithms.get("ctd_lambda")
    assert f"  ctd_lambda ({ctd_lambda.label}): {ctd_lambda.equations}" in out
    assert "      --lambda: trace decay (parameter in [0, 1], default 0.5)" in out
    assert "      --beta: step size of omega" in out
    assert "environments" not in out  # one section only
    env_out = _list(capsys, "environments")
    assert "  two_state(a=0.5, b=0.5, x=0.0, y=0.0, m=1.0, n=2.0, gamma=0.9, theta0=1.0)" in env_out


def test_json_matches_the_descriptors(capsys):
    data = json.loads(_list(capsys, "--json"))
    assert list(data) == list(catalog.SECTIONS)
    by_name = {a["name"]: a for a in data["control-algorithms"]}
    cgq = control_algorithms.get("cgq")
    assert [h["name"] for h in by_name["cgq"]["hyperparameters"]] == list(cgq.names) == ["alpha", "beta", "zeta"]
    assert by_name["cgq"]["equations"] == cgq.equations
    tasks = {t["name"]: t for t in data["tasks"]}
    assert {"name": "max_episode_steps", "required": False, "default": 500} in tasks["acrobot"]["parameters"]
    etd = {a["name"]: a for a in data["algorithms"]}["etd"]
    assert {"name": "interest", "doc": "constant interest i(s)", "default": 1.0, "range": "(0, inf)",
            "step_size": False, "static": False} in etd["hyperparameters"]


def test_a_newly_registered_name_shows_up(capsys):
    def my_chain(gamma=0.7, n_states=3):
        """My chain."""
        return mdp.make_mdp(P=[[[1.0]]], R=[[[0.0]]], mu=[[1.0]], pi=[[1.0]], phi=[[1.0]], gamma=gamma)

    hp = algorithms.parameter("kappa", "my own parameter", default=0.25, low=0.0, high=1.0)
    mine = algorithms.Algorithm(name="my_td_catalog", init=td.init, update=td.update,
                                hyperparameters=(algorithms.step_size("alpha", "a step"), hp),
                                equations="my eq. (1)")
    def my_task(*, size=4, gamma=0.9):
        """My task."""

    q = control_algorithms.get("q")
    my_q = algorithms.Algorithm(name="my_q_catalog", init=q.init, update=q.update, hyperparameters=q.hyperparameters,
                                equations="my control eq.", weights="w")
    envs.register("my_chain_catalog", my_chain)
    algorithms.register(mine)
    metrics.register_metric("my_metric_catalog", lambda env: None, "My metric.")
    control_tasks.register("my_task_catalog", my_task)
    control_algorithms.register(my_q)
    try:
        out = _list(capsys)
        assert "  my_chain_catalog(gamma=0.7, n_states=3)\n      My chain.\n" in out
        assert "  my_td_catalog (MY_TD_CATALOG): my eq. (1)\n" in out
        assert "      --kappa: my own parameter (parameter in [0, 1], default 0.25)\n" in out
        assert "  my_metric_catalog\n      My metric.\n" in out
        assert "  my_task_catalog(size=4, gamma=0.9)\n      My task.\n" in out
        assert "  my_q_catalog (MY_Q_CATALOG): my control eq.\n      --alpha: step size of the weights w" in out
    finally:
        del envs.REGISTRY["my_chain_catalog"]
        del algorithms._REGISTRY["my_td_catalog"]
        del metrics.METRIC_REGISTRY["my_metric_catalog"]
        del control_tasks.TASKS["my_task_catalog"]
        del control_algorithms.ALGORITHMS["my_q_catalog"]
    out = _list(capsys)
    assert "my_td_catalog" not in out and "my_task_catalog" not in out and "my_q_catalog" not in out


def test_a_bad_section_exits_2_with_one_line(capsys):
    assert main(["list", "envs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bec-jax: error: what: unknown list 'envs'; choose one of all, environments, algorithms, "
                   "metrics, tasks, control-algorithms, continuing-tasks, continuing-algorithms"]


def test_defaults_are_json_values():
    assert catalog._value(math.inf) == "inf"
    assert catalog._value((1, 2.5)) == [1, 2.5]
    assert catalog._value(None) is None


def test_version(capsys):
    from importlib import metadata
    assert catalog.version_text() == f"bec-jax {bec_jax.__version__} (jax {metadata.version('jax')})"
    # bec_jax.cli.commands's parser says the same (python -m bec_jax.cli.commands --version, --help lists it).
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == catalog.version_text() + "\n"
    with pytest.raises(SystemExit):
        from bec_jax.cli.commands import build_parser
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out == catalog.version_text() + "\n"


def test_the_console_script_answers_version_without_importing_jax(capsys):
    # The console script is bec_jax.__main__:main (pyproject.toml).
    code = ("import sys; from bec_jax.__main__ import main; rc = main(['--version']); "
            "print(rc, sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [catalog.version_text(), "0 []"]
    r = subprocess.run([sys.executable, "-m", "bec_jax", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == catalog.version_text() + "\n", r.stderr
    # Anything else goes to bec_jax.cli.commands.main.
    from bec_jax.__main__ import main as console_main
    assert console_main(["list", "metrics"]) == 0
    assert capsys.readouterr().out == catalog.command("metrics")
    assert console_main(["list", "nope"]) == 2


def test_run_and_control_help_point_to_list(capsys):
    for cmd in ("run", "control"):
        assert main([cmd, "--help"]) == 0
        assert "`bec-jax list" in " ".join(capsys.readouterr().out.split())
