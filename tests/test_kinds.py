"""The table of run kinds (`bec_jax.run.kinds`): each kind's spec, result,
front and figures; lookups by spec, saved dict and result directory, with
one-line errors; and the 0.3 paths of what moved here."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bec_jax.control import sweep as control_sweep
from bec_jax.control.results import ControlResult
from bec_jax.control.spec import ControlSpec
from bec_jax.prediction import sweep
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import SweepSpec
from bec_jax.run import kinds, rundir

PREDICTION = SweepSpec(env="two_state", algorithm="td", alpha=(0.1, 0.2), seeds=2, steps=10, log_every=5)
CONTROL = ControlSpec(task="cliff_walking", algorithm="q", hyperparameters={"alpha": [0.1]}, seeds=2, episodes=3)


def test_each_kind_is_one_entry():
    assert list(kinds.KINDS) == ["prediction", "control", "continuing"]
    p, c = kinds.KINDS["prediction"], kinds.KINDS["control"]
    assert (p.spec, p.result, p.front, p.saved) == (SweepSpec, SweepResult, sweep, None)
    assert (c.spec, c.result, c.front, c.saved) == (ControlSpec, ControlResult, control_sweep, "control")
    for k in kinds.KINDS.values():
        assert k.spec.KIND == k.result.KIND == k.front.KIND == k.name


def test_lookups_by_spec_and_saved_dict():
    assert kinds.of_spec(PREDICTION).name == "prediction" and kinds.of_spec(CONTROL).name == "control"
    # Saved files stay as they were: a prediction spec's dict names no kind.
    assert "kind" not in PREDICTION.to_dict() and CONTROL.to_dict()["kind"] == "control"
    assert kinds.of_dict(PREDICTION.to_dict()).name == "prediction"
    assert rundir.spec_from_dict(CONTROL.to_dict()) == CONTROL
    assert rundir.spec_from_dict(PREDICTION.to_dict()) == PREDICTION


def test_unknown_kinds_are_one_line_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"^kind: unknown kind 'nope'; known: prediction, control, continuing$"):
        kinds.get("nope")
    with pytest.raises(ValueError, match=r"^kind: unknown kind of sweep 'nope'; known: 'control', 'continuing' \(or none: a "
                                         r"prediction sweep\)$"):
        kinds.of_dict({"kind": "nope"})
    with pytest.raises(ValueError, match="^dirs: .* holds no finished run"):
        kinds.of_dir(str(tmp_path))
    (tmp_path / "curves.npz").write_bytes(b"")
    (tmp_path / "meta.json").write_text(json.dumps({"spec": {"kind": "nope"}}))
    with pytest.raises(ValueError, match="^dirs: .* holds a run of an unknown kind 'nope'; known: 'control'"):
        kinds.load_result(str(tmp_path))


def test_load_result_reads_either_kind(tmp_path):
    for spec in (PREDICTION, CONTROL):
        out = str(tmp_path / spec.KIND)
        kinds.of_spec(spec).front.run(spec, progress=False).save(out)
        r = kinds.load_result(out)
        assert type(r) is kinds.of_spec(spec).result and kinds.of_dir(out).name == spec.KIND


@pytest.mark.parametrize("code, check", [
    ("from bec_jax.prediction import results; from bec_jax.run import kinds; "
     "print(results.load_result is kinds.load_result)", "True"),
    ("from bec_jax.run import runner, rundir; print(runner.ChunkStore is rundir.ChunkStore, "
     "runner.RunError is rundir.RunError)", "True True"),
])
def test_the_old_paths_warn_once_and_find_the_new_names(code, check):
    r = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", code], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == check.split()
    assert r.stderr.count("has moved to bec_jax.") == len(check.split())
