"""`sweep.run_many`: sweeps that differ only in algorithm and step sizes share one
compiled program, and each gets bit for bit what `sweep.run` gives it alone."""
import jax
import numpy as np
import pytest

from bec_jax.engine import memory, tuning
from bec_jax.engine.programs import split_joint
from bec_jax.prediction import sizes as prediction_sizes
from bec_jax.prediction import sweep
from bec_jax.prediction.spec import SweepSpec

FIELDS = ("mean", "std", "sem", "alive", "final", "auc_seed", "diverged_step")
# Baird: alpha = 0.3 diverges (for most seeds), so the divergence revert runs in
# the shared program; 24 seeds, an uneven count for the statistics' reductions.
COMMON = dict(env="baird", seeds=24, steps=120, log_every=20, metrics=("rmscbe", "rmspbe"))
SPECS = [
    SweepSpec(algorithm="td", alpha=(0.3, 0.005, 0.01), **COMMON),
    SweepSpec(algorithm="tdc", alpha=(0.01, 0.3), zeta=(0.05,), **COMMON),
    SweepSpec(algorithm="ctdc", alpha=(0.01, 0.3), beta=(0.1, 0.01), zeta=(0.05,), **COMMON),
    # A state with a trace the divergence check leaves out, and a traced lambda.
    SweepSpec(algorithm="etd", alpha=(0.001, 0.01), **COMMON),
    SweepSpec(algorithm="ctd_lambda", alpha=(0.01,), beta=(0.1,), hyperparameters={"lambda": (0.0, 0.8)},
              **COMMON),
]
# Not shareable with the rest: another environment, and a sweep of two models.
OTHER_ENV = SweepSpec(env="two_state", algorithm="td", alpha=(0.01,), seeds=4, steps=40, log_every=20)
TWO_MODELS = SweepSpec(env="boyan_chain", algorithm="td", alpha=(0.1,), env_params={"gamma": [0.5, 0.9]}, seeds=4,
                       steps=40, log_every=20)


@pytest.fixture(scope="module")
def together():
    tuning.clear_compiled()
    return sweep.run_many(SPECS + [OTHER_ENV])


@pytest.fixture(scope="module")
def alone():
    return [sweep.run(s, progress=False) for s in SPECS]


def test_each_result_is_what_run_gives(together, alone):
    for spec, t, a in zip(SPECS, together, alone):
        assert t.spec == spec
        for k in FIELDS:
            np.testing.assert_array_equal(getattr(t, k), getattr(a, k), err_msg=f"{spec.algorithm} {k}")
    # The check is not vacuous: the diverging points did diverge.
    assert together[0].diverged_fraction[0] > 0.5 and together[0].diverged_fraction[1] == 0.0


def test_one_program_for_the_shareable_sweeps(together):
    # Neither another environment nor a sweep of two models joins. A sweep packed
    # alone runs by `run`, as OTHER_ENV did in `together`; TWO_MODELS is only
    # packed here (`run` of a sweep of two models: the last test).
    assert sweep.shared_programs(SPECS + [OTHER_ENV, TWO_MODELS]) == [[0, 1, 2, 3, 4], [5], [6]]
    names = [s.algorithm for s in SPECS]
    assert [r.meta["shared_program"] for r in together[:5]] == [names] * 5
    # Its compile and run are the first sweep's; the others add none.
    assert together[0].meta["compiled_programs"] == 1 and together[0].meta["compile_time_s"] > 0
    assert all(r.meta["compiled_programs"] == 0 and r.meta["compile_time_s"] == 0.0 for r in together[1:5])
    for r in together[5:]:  # run alone, by `run`
        assert "shared_program" not in r.meta and r.meta["compiled_programs"] == 1
    assert [r.meta["shared_program_index"] for r in together[:5]] == [0, 1, 2, 3, 4]
    assert sweep.cost_note(together[1]) == "in td's program"
    assert sweep.cost_note(together[0]).endswith("(one program for td, tdc, ctdc, etd, ctd_lambda)")
    assert sweep.cost_note(together[5]).startswith("compile ")


def test_the_shared_program_is_reused_for_another_seed(together):
    again = sweep.run_many([s.replace(seed=3) for s in SPECS])
    assert again[0].meta["compiled_programs"] == 0
    fresh = sweep.run(SPECS[2].replace(seed=3), progress=False)
    for k in FIELDS:
        np.testing.assert_array_equal(again[2].__dict__[k], fresh.__dict__[k], err_msg=k)
    assert not np.array_equal(again[2].final, together[2].final)


def test_sweeps_that_do_not_fit_together_run_apart(together, alone, monkeypatch):
    # Five fit one call, a sixth does not and runs alone. The five's program and
    # the sixth's (td's, another seed) are the fixtures': nothing compiles again.
    monkeypatch.setattr(memory, "fits_together", lambda specs, *a, **k: len(specs) <= 5)
    out = sweep.run_many(SPECS + [SPECS[0].replace(seed=7)])
    names = [s.algorithm for s in SPECS]
    assert [r.meta.get("shared_program") for r in out] == [names] * 5 + [None]


def test_fits_together_adds_the_calls():
    a, b = SPECS[0], SPECS[2]
    one = memory.call_bytes(prediction_sizes.sizes(a), a.num_points, a.seeds, a.steps // a.log_every, False)
    two = memory.call_bytes(prediction_sizes.sizes(b), b.num_points, b.seeds, b.steps // b.log_every, False)
    assert prediction_sizes.fits_together([a, b], memory_budget=one + two)
    assert not prediction_sizes.fits_together([a, b], memory_budget=one + two - 1)
    # On a CPU with the default budget, the carried state stays cache-sized.
    big = SweepSpec(env="boyan_chain", algorithm="ctdc", alpha=tuple(np.geomspace(1e-3, 0.1, 40)), beta=(0.1,),
                    zeta=(0.01,), seeds=1000, steps=10, log_every=10)
    assert big.num_points * big.seeds * prediction_sizes.sizes(big).carry > memory.CPU_CACHE_BYTES
    assert not prediction_sizes.fits_together([big, big.replace(algorithm="td", hyperparameters={"alpha": (0.1,)})],
                                              device=jax.devices("cpu")[0])


def test_split_joint_undoes_the_device_layout():
    # Two devices, members of 4 and 2 points: device 0 holds points 0-1 of the
    # first and 0 of the second, device 1 the rest.
    out = {"x": np.array([10, 11, 20, 12, 13, 21]), "y": np.arange(12).reshape(6, 2)}
    a, b = split_joint(out, [4, 2], 2)
    assert a["x"].tolist() == [10, 11, 12, 13] and b["x"].tolist() == [20, 21]
    assert a["y"].tolist() == [[0, 1], [2, 3], [6, 7], [8, 9]] and b["y"].tolist() == [[4, 5], [10, 11]]
    (only,) = split_joint(out, [6], 1)
    assert only["x"].tolist() == out["x"].tolist()


# Sweeps of several models (two discounts of Boyan's chain, the random walk's
# feature sets) share a program too: each point gets its own model's
# transitions there, as alone. TD at alpha 20 diverges. Two sweeps of two log
# blocks (one pair, `KernelForm.paired`): a program of several models compiles
# with the fusion emitters, the costly ones.
MODELS = dict(env="boyan_chain", env_params={"gamma": [0.5, 0.9]}, seeds=6, steps=40, log_every=20,
              metrics=("rmscbe", "rmspbe"))
MULTI = [
    SweepSpec(algorithm="td", alpha=(20.0, 0.1), **MODELS),
    SweepSpec(algorithm="ctd", alpha=(0.1,), beta=(0.1, 0.5), **MODELS),
]
OTHER_MODELS = SweepSpec(algorithm="td", alpha=(0.1,), **{**MODELS, "env_params": {"gamma": [0.9, 0.5]}})


def test_sweeps_of_several_models_share_a_program_and_get_what_run_gives():
    # The models' order differs: OTHER_MODELS does not join (`run_many` runs these
    # packs; a sweep packed alone runs by `run`, as OTHER_ENV does in `together`).
    assert sweep.shared_programs(MULTI + [OTHER_MODELS]) == [[0, 1], [2]]
    out = sweep.run_many(MULTI)
    names = [s.algorithm for s in MULTI]
    assert [r.meta.get("shared_program") for r in out] == [names] * 2
    for spec, t in zip(MULTI, out):
        a = sweep.run(spec, progress=False)
        assert a.meta["compiled_programs"] == 1  # its own program, not the shared one
        for k in FIELDS:
            np.testing.assert_array_equal(getattr(t, k), getattr(a, k), err_msg=f"{spec.algorithm} {k}")
    # Not vacuous: the two models (points 1 and 3, alpha 0.1) give different
    # values, and alpha 20 diverged (the revert ran in the shared program).
    td = out[0]
    assert not np.array_equal(td.final[:, 1], td.final[:, 3])
    assert td.diverged_fraction.tolist() == [1.0, 0.0, 1.0, 0.0]
