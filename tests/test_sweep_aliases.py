"""The names `bec_jax.prediction.sweep` re-exported up to 0.4 and the docs
showed as `sweep.X`: each is read where it lives now, with one warning."""
import warnings

import pytest

from bec_jax import moved
from bec_jax.engine import tuning
from bec_jax.prediction import streams, sweep
from bec_jax.prediction.spec import SweepSpec


@pytest.mark.parametrize("name", sorted(sweep.MOVED))
def test_an_old_name_is_its_new_home_and_warns_once(name, monkeypatch):
    monkeypatch.setattr(moved, "_warned", set())
    with pytest.warns(DeprecationWarning, match=name):
        got = getattr(sweep, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        getattr(sweep, name)  # once only
    if name != "choose_form":
        module, attr = sweep.MOVED[name]
        assert got is getattr(__import__(module, fromlist=[attr]), attr)


def test_the_old_choose_form_weighs_a_prediction_sweep():
    big = SweepSpec(env="two_state", algorithm="td", alpha=(0.1,), seeds=1000, steps=10**6)
    with pytest.warns(DeprecationWarning):
        old = sweep.choose_form
    assert old(big, None) == tuning.choose_form(big, None, front=sweep)


def test_no_other_name_is_found():
    with pytest.raises(AttributeError, match="no_such_name"):
        sweep.no_such_name  # noqa: B018
    assert "seed_transitions" not in vars(sweep) and streams.seed_transitions
