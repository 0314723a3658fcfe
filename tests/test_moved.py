"""The 0.3 import paths keep working for one release (`bec_jax.moved`): each
old path is the new module itself, and says once where it went."""
from __future__ import annotations

import subprocess
import sys

import pytest

from bec_jax import moved


def _python(code: str) -> subprocess.CompletedProcess:
    # A fresh interpreter: the warning is once per process, and the old name must
    # not already be bound by an earlier import.
    return subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, timeout=120)


def test_every_old_path_is_its_new_module_and_warns_once():
    code = (
        "import importlib, warnings\n"
        "from bec_jax import moved\n"
        "for old, new in moved.MOVED.items():\n"
        "    if old == 'bec_jax.analysis':\n"
        "        continue\n"
        "    with warnings.catch_warnings(record=True) as w:\n"
        "        warnings.simplefilter('always')\n"
        "        a = importlib.import_module(old)\n"
        "        b = importlib.import_module(old)\n"
        "    assert a is importlib.import_module(new), old\n"
        "    said = [str(x.message) for x in w if issubclass(x.category, DeprecationWarning)]\n"
        "    assert said == [f'{old} has moved to {new}; the old path goes in the next minor release'], (old, said)\n"
        "print(len(moved.MOVED))\n")
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == len(moved.MOVED) >= 20


@pytest.mark.parametrize("code, check", [
    # the README's and the docs' forms of 0.3
    ("from bec_jax.spec import SweepSpec; from bec_jax.prediction.spec import SweepSpec as S; print(SweepSpec is S)",
     "True"),
    ("from bec_jax import sweep; import bec_jax.prediction.sweep as s; print(sweep is s)", "True"),
    ("import bec_jax.runner as r; import bec_jax.run.runner as s; print(r is s)", "True"),
    ("from bec_jax.cli import main; from bec_jax.cli.commands import main as m; print(main is m)", "True"),
    # analysis also re-exported the fixpoints and the metrics: its old path still finds them
    ("from bec_jax import analysis; from bec_jax.theory import metrics, fixpoints, expected_updates as e; "
     "print(analysis.rmspbe is metrics.rmspbe, analysis.fixpoint_set is fixpoints.fixpoint_set, "
     "analysis.expected_update is e.expected_update)", "True True True"),
    ("from bec_jax import analysis; from bec_jax.theory import mean_square as ms; "
     "print(analysis.mean_square is ms.mean_square)", "True"),
])
def test_documented_old_forms(code, check):
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == check.split()
    assert "has moved to bec_jax." in r.stderr


def test_python_m_bec_jax_cli_still_runs_the_command_line():
    r = subprocess.run([sys.executable, "-m", "bec_jax.cli", "--version"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("bec-jax ")


def test_an_unknown_name_is_still_an_attribute_error():
    import bec_jax
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = bec_jax.nothing_here
    with pytest.raises(ModuleNotFoundError):
        __import__("bec_jax.nothing_here")
    assert "bec_jax.nothing_here" not in moved.MOVED
