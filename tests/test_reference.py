"""The reference program (bec_jax/prediction/reference.py) computes the engine's
mean curves: the standard workload at a small size through both."""
from __future__ import annotations

import numpy as np
import pytest

from bec_jax.prediction import sweep
from bec_jax.prediction.reference import make_sweep
from benchmarks._common import standard_spec

# Not bit for bit: the two are different XLA programs (the engine broadcasts a
# seed's transition over the grid, shares scalars, reduces over seeds by pairwise
# halving; the reference replays the stream per grid point and takes `mean`), so
# fusion, fused multiply-adds and the order of the sum over seeds differ. Measured
# here: at most 2.3e-7 relative (2 float32 ulps). RTOL is 40 times that, and still
# tight: a wrong stream (seeds shifted by one) is off by 9e-2, and alpha off by
# 0.1% (far less than a wrong update) by 8.5e-4 (see the test below).
RTOL = 1e-5


def _small(**changes):
    """The standard workload (Boyan chain, CTDC, RMSCBE every 10 steps) on a
    corner of its grid (8 points), with 8 seeds and 300 steps."""
    return standard_spec(smoke=True).replace(seeds=8, steps=300, **changes)


def _rel(a, b):
    return float(np.max(np.abs(a - b) / np.abs(b)))


@pytest.mark.parametrize("changes", [
    {},
    # The other sampler, a schedule and two metrics: the reference's other paths.
    {"sampler": "iid", "schedule": {"kind": "robbins_monro", "t0": 50.0}, "metrics": ("rmscbe", "rmsve")},
], ids=["standard", "iid-robbins-monro"])
def test_reference_computes_the_engines_mean_curves(changes):
    spec = _small(**changes)
    engine = sweep.run(spec, progress=False)
    assert (engine.alive == spec.seeds).all()  # the reference has no divergence freezing
    ref = np.asarray(make_sweep(spec)(np.uint32(spec.seed)))
    assert ref.shape == engine.mean.shape == (len(spec.metrics), spec.num_points, spec.num_logs)
    np.testing.assert_allclose(ref, engine.mean, rtol=RTOL, atol=0)


def test_the_tolerance_catches_a_wrong_stream_or_a_wrong_update():
    spec = _small()
    engine = sweep.run(spec, progress=False).mean
    shifted = np.asarray(make_sweep(spec.replace(seed_offset=1))(np.uint32(spec.seed)))
    assert _rel(shifted, engine) > 100 * RTOL
    hp = spec.to_dict()["hyperparameters"]
    nudged = spec.replace(hyperparameters=dict(hp, alpha=[a * 1.001 for a in hp["alpha"]]))
    assert _rel(np.asarray(make_sweep(nudged)(np.uint32(spec.seed))), engine) > 10 * RTOL
