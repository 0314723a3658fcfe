"""Every public table and curve that reports a confidence interval or a
standard error, pinned against scipy computed here from the same raw per-seed
values: `SweepResult.to_frame` (ci_low, ci_high, sem), `SweepResult.ci` and
the summary's intervals, `load_frame` of a saved run, `ControlResult.curve`,
`curve_by_step`, `ci`, `summary` and `to_frame`, and `stats.t_interval` (what
the experiments' tables call).

All of them go through `bec_jax.stats`; these tests are what would catch a
wrong formula there (degrees of freedom n instead of n - 1, a standard error
without its division by sqrt(n)): each expected value is scipy's
`t.interval(level, n - 1, loc=mean, scale=sem)` with `scipy.stats.sem`, never
the library's own arithmetic. Hand-made results keep the file fast; one tiny
sweep (a second of compiling) checks the program's logged sem end to end.
"""
import numpy as np
import pytest
from scipy import stats as sps

from bec_jax import stats
from bec_jax.control.results import ControlResult
from bec_jax.engine import seed_stats
from bec_jax.prediction import sweep
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import SweepSpec
from bec_jax.run.study import load_frame

RTOL = 1e-12  # float64 throughout, except the sweep's float32 logs


def scipy_interval(sample, level=0.95):
    """(low, high) from scipy over a 1-D sample's finite values; NaN for fewer than two."""
    v = np.asarray(sample, float)
    v = v[np.isfinite(v)]
    if v.size < 2:
        return np.nan, np.nan
    return sps.t.interval(level, v.size - 1, loc=v.mean(), scale=sps.sem(v))


@pytest.fixture
def needs_pandas():
    """to_frame needs pandas (in the test extra; an optional extra for users)."""
    pytest.importorskip("pandas")


# ------------------------------------------------------------------ prediction

M, G, N, L = 2, 5, 6, 4


@pytest.fixture(scope="module")
def prediction():
    """(result, raw): a hand-made SweepResult whose mean/std/sem are the
    programs' own statistics (`seed_stats.mean_std_sem`, on the host) of raw
    per-seed curves raw (M, G, N, L), +inf from a seed's divergence on: point 0
    keeps all 6 seeds, point 1 keeps 3 from step 2, point 2 one, point 3 none
    from step 1, point 4 loses seeds one step at a time."""
    rng = np.random.default_rng(7)
    raw = rng.gamma(2.0, 1.0, (M, G, N, L))
    dead_from = np.full((G, N), L)
    dead_from[1, 3:] = 2
    dead_from[2, 1:] = 0
    dead_from[3, :] = 1
    dead_from[4] = [0, 1, 2, 3, 4, 4]
    alive = np.arange(L)[None, None] < dead_from[..., None]  # (G, N, L)
    raw = np.where(alive[None], raw, np.inf)
    logs = [seed_stats.host_log_point(raw[..., t], alive[..., t], False) for t in range(L)]
    mean, std, sem = (np.stack([lg[k] for lg in logs], -1) for k in range(3))
    r = SweepResult(spec=None, steps=np.arange(L) * 10, grid={"alpha": np.linspace(0.1, 0.5, G)},
                    mean=mean, std=std, sem=sem, alive=alive.sum(1), final=raw[..., -1],
                    diverged_step=np.where(dead_from < L, dead_from * 10, -1),
                    spec_dict={"metrics": ["a", "b"], "env": "e", "algorithm": "td", "seeds": N},
                    auc_seed=np.where(alive[..., -1][None], raw.mean(-1), np.inf))
    return r, raw


def test_sweep_frame_interval_and_sem_are_scipys(prediction, needs_pandas):
    r, raw = prediction
    f = r.to_frame()
    k = 0
    for m in range(M):
        for g in range(G):
            for t in range(L):
                sample = raw[m, g, :, t][np.isfinite(raw[m, g, :, t])]
                assert f["alive"][k] == sample.size
                np.testing.assert_allclose([f["ci_low"][k], f["ci_high"][k]], scipy_interval(sample), rtol=RTOL)
                if sample.size > 1:
                    np.testing.assert_allclose(f["sem"][k], sps.sem(sample), rtol=RTOL)
                k += 1
    assert k == len(f["ci_low"])


@pytest.mark.parametrize("level", [0.95, 0.8])
def test_sweep_ci_and_summary_are_scipys(prediction, level):
    r, raw = prediction
    for m, name in enumerate(r.metrics):
        for stat, per_seed in (("final", r.final[m]), ("auc", r.auc_seed[m])):
            lo, hi = r.ci(stat, name, level)
            want = np.array([scipy_interval(v, level) for v in per_seed])
            np.testing.assert_allclose(np.stack([lo, hi], 1), want, rtol=RTOL)
    for rec, v, a in zip(r.summary("b"), r.final[1], r.auc_seed[1]):
        want = scipy_interval(v)
        got = [rec["final_ci_low"], rec["final_ci_high"]]
        if np.isnan(want[0]):
            assert got == [None, None]
        else:
            np.testing.assert_allclose(got, want, rtol=RTOL)
        if rec["auc_ci_low"] is not None:
            np.testing.assert_allclose([rec["auc_ci_low"], rec["auc_ci_high"]], scipy_interval(a), rtol=RTOL)


def test_a_sweeps_logged_interval_is_scipys_over_its_final_values(tmp_path, needs_pandas):
    """End to end: the program's float32 sem at the last logged step, as
    `to_frame` and `load_frame` of the saved run report it, against scipy over
    the per-seed final values."""
    r = sweep.run(SweepSpec(env="two_state", algorithm="td", alpha=(0.1, 0.5), seeds=5, steps=20, log_every=10),
                  progress=False)
    r.save(str(tmp_path))
    Lr = len(r.steps)
    for f in (r.to_frame(), load_frame(str(tmp_path))):
        for g in range(r.num_points):
            row = g * Lr + Lr - 1
            sample = r.final[0, g].astype(np.float64)
            np.testing.assert_allclose(f["sem"][row], sps.sem(sample), rtol=1e-5)
            np.testing.assert_allclose([f["ci_low"][row], f["ci_high"][row]], scipy_interval(sample), rtol=1e-5)


# ------------------------------------------------------------------ control

E = 9


@pytest.fixture(scope="module")
def control():
    """A hand-made ControlResult: point 0 has 5 valid runs, point 1 three
    (two diverged), point 2 one, point 3 none, point 4 four (one ran out of
    steps before its last episode)."""
    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 30, (G, 5, E))
    returns = rng.normal(size=(G, 5, E)) * 5
    ds = np.full((G, 5), -1)
    ds[1, 3:] = 7
    ds[2, 1:] = 3
    ds[3] = 2
    lengths[4, 0, 6:] = 0
    return ControlResult(spec=None, grid={"alpha": np.linspace(0.1, 0.5, G)}, returns=returns, lengths=lengths,
                         diverged_step=ds, omega=rng.random((G, 5)), spec_dict={"task": "t", "algorithm": "q"})


def _valid_runs(c, i):
    """Indices of point i's runs that neither diverged nor stopped early, by hand."""
    return [n for n in range(c.seeds) if c.diverged_step[i, n] < 0 and (c.lengths[i, n] > 0).all()]


def _raw(c, stat):
    return (c.lengths if stat == "length" else c.returns).astype(float)


@pytest.mark.parametrize("level", [0.95, 0.8])
@pytest.mark.parametrize("stat", ["length", "return"])
def test_control_curve_band_is_scipys(control, stat, level):
    c = control
    for i in range(G):
        runs = _raw(c, stat)[i, _valid_runs(c, i)]  # (n, E)
        x, mean, lo, hi = c.curve(i, stat, level)
        np.testing.assert_array_equal(x, np.arange(1, E + 1))
        want = np.array([scipy_interval(runs[:, e], level) for e in range(E)])
        np.testing.assert_allclose(np.stack([lo, hi], 1), want, rtol=RTOL)


@pytest.mark.parametrize("level", [0.95, 0.8])
@pytest.mark.parametrize("stat", ["length", "return"])
def test_control_curve_by_step_band_is_scipys(control, stat, level):
    """At each step x, each valid run's statistic of the episode in progress
    there (found here by walking its episodes), then scipy's interval."""
    c = control
    for i in range(G):
        ok = _valid_runs(c, i)
        x, mean, lo, hi = c.curve_by_step(i, stat, 17, level)
        if not ok:
            assert np.isnan([mean, lo, hi]).all()
            continue
        assert x[0] == 1 and x[-1] == min(c.lengths[i, n].sum() for n in ok)
        ys = []
        for n in ok:
            ends = np.cumsum(c.lengths[i, n])
            ys.append([_raw(c, stat)[i, n, next(e for e in range(E) if ends[e] >= s)] for s in x])
        ys = np.array(ys)
        np.testing.assert_allclose(mean, ys.mean(0), rtol=RTOL)
        want = np.array([scipy_interval(ys[:, j], level) for j in range(len(x))])
        np.testing.assert_allclose(np.stack([lo, hi], 1), want, rtol=RTOL)


def test_control_ci_and_summary_are_scipys(control):
    c = control
    k = max(1, round(E * 0.1))
    recs = c.summary()
    for i, rec in enumerate(recs):
        ok = _valid_runs(c, i)
        for stat in ("length", "return"):
            runs = _raw(c, stat)[i, ok]
            for kind, per_run in (("auc", runs.mean(1)), ("final", runs[:, -k:].mean(1))):
                want = scipy_interval(per_run)
                got = [rec[f"{kind}_{stat}_ci_low"], rec[f"{kind}_{stat}_ci_high"]]
                if np.isnan(want[0]):
                    assert got == [None, None]
                else:
                    np.testing.assert_allclose(got, want, rtol=RTOL)
    per_seed = np.where(c.valid, c.values("return").mean(-1), np.nan)
    lo, hi = c.ci(per_seed, 0.9)
    want = np.array([scipy_interval(v, 0.9) for v in per_seed])
    np.testing.assert_allclose(np.stack([lo, hi], 1), want, rtol=RTOL)


def test_control_frame_interval_is_scipys(control, needs_pandas):
    c = control
    f = c.to_frame()
    k = 0
    for stat in ("length", "return"):
        for i in range(G):
            runs = _raw(c, stat)[i, _valid_runs(c, i)]
            for e in range(E):
                assert f["episode"][k] == e + 1 and f["n"][k] == len(runs)
                np.testing.assert_allclose([f["ci_low"][k], f["ci_high"][k]], scipy_interval(runs[:, e]),
                                           rtol=RTOL)
                k += 1
    assert k == len(f["ci_low"])


# ------------------------------------------------------------------ stats itself

@pytest.mark.parametrize("n", [0, 1, 2, 3, 10])
@pytest.mark.parametrize("level", [0.95, 0.5])
def test_t_interval_and_half_widths_are_scipys(n, level):
    """`t_interval` (the experiments' tables), and the vectorised half-widths
    over arrays of sample sizes, NaN below two."""
    v = np.random.default_rng(n).normal(size=n)
    m, lo, hi = stats.t_interval(v, level)
    np.testing.assert_allclose([lo, hi], scipy_interval(v, level), rtol=RTOL)
    assert np.isnan(m) if n == 0 else m == v.mean()
    ns = np.array([0, 1, 2, 3, 10])
    sd = np.linspace(0.5, 2.0, 5)
    q = sps.t.ppf(0.5 + level / 2, np.maximum(ns - 1, 1))
    want = np.where(ns >= 2, q * sd / np.sqrt(ns.clip(1)), np.nan)
    np.testing.assert_allclose(stats.t_half_width(sd, ns, level), want, rtol=RTOL)
    np.testing.assert_allclose(stats.t_half_width_from_se(sd / np.sqrt(ns.clip(1)), ns, level), want, rtol=RTOL)
    np.testing.assert_allclose(stats.t_quantile(ns - 1, level), np.where(ns >= 2, q, np.nan), rtol=RTOL)
