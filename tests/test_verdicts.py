"""Verdicts from the exact analysis plus the curve (bec_jax.theory.verdicts)."""
import math

import numpy as np
import pytest

from bec_jax import envs
from bec_jax.theory import verdicts
from bec_jax.theory.verdicts import Exact, curve_trend, exact, exact_for, verdict

FAST = [-0.05, -0.02, -0.1]


def _matrix(eigs) -> np.ndarray:
    """A real G = V diag(l) V^-1 with a non-orthogonal V (complex pairs as 2x2 blocks)."""
    n = len(eigs)
    B = np.zeros((n, n))
    i = 0
    while i < n:
        lam = complex(eigs[i])
        if lam.imag:
            assert eigs[i + 1] == lam.conjugate()
            B[i:i + 2, i:i + 2] = [[lam.real, lam.imag], [-lam.imag, lam.real]]
            i += 2
        else:
            B[i, i] = lam.real
            i += 1
    rng = np.random.default_rng(1)
    V = np.eye(n) + 0.5 * rng.normal(size=(n, n))
    G = V @ B @ np.linalg.inv(V)
    got = np.linalg.eigvals(G)
    assert all(np.abs(got - lam).min() < 1e-10 for lam in eigs)
    return G


def _flat_curve(n=101):
    """Falls quickly to a level and stays there to within 1% (what the old label called converged)."""
    t = np.arange(n)
    return 0.05 + np.exp(-t / 5.0) * 3.0 + 1e-4 * np.exp(-t / 1e4)


def _plateau_curve(n=101):
    return 0.2 + 0.3 * np.exp(-np.arange(n) / 10.0)


# ------------------------------------------------------------------ exact(G)

def test_slow_decaying_mode_is_stable_but_far_from_converged():
    ex = exact(_matrix(FAST + [-1e-5]))
    want = -math.log(1 - 1e-5)
    assert ex.stable and ex.growth == 0.0 and ex.neutral == 0
    assert ex.slowest == pytest.approx(want, rel=1e-6)
    assert ex.steps_to_tol == pytest.approx(math.log(1000) / want, rel=1e-6)
    assert ex.tol == 1e-3
    # The Baird case the old label got wrong: a 2000-step run that looks flat.
    curve = _flat_curve()
    assert curve_trend(curve, False) == "flat"
    v = verdict(ex, curve, 2000, False)
    assert v.label == "converging (slowly)"
    assert "1.00e-05" in v.reason and str(math.ceil(ex.steps_to_tol)) in v.reason and "2000" in v.reason
    assert "analysis" in v.reason and "run" in v.reason


def test_fast_modes_only_converge_once_the_run_is_long_enough():
    ex = exact(_matrix(FAST))
    assert ex.slowest == pytest.approx(-math.log(1 - 0.02), rel=1e-9)
    n = math.ceil(ex.steps_to_tol)
    assert verdict(ex, _flat_curve(), n, False).label == "converges"
    assert verdict(ex, _flat_curve(), n - 1, False).label == "converging (slowly)"


def test_slowly_growing_mode_is_unstable_even_with_a_decreasing_curve():
    ex = exact(_matrix(FAST + [2e-5]))
    assert not ex.stable
    assert ex.growth == pytest.approx(math.log1p(2e-5), rel=1e-6)
    assert ex.slowest == 0.0 and ex.steps_to_tol == math.inf
    curve = np.linspace(1.0, 0.5, 101)
    assert curve_trend(curve, False) == "decreasing"
    v = verdict(ex, curve, 2000, False)
    assert v.label == "unstable (not yet visible)"
    assert "2.00e-05" in v.reason
    assert str(math.ceil(math.log(1e6) / ex.growth)) in v.reason


def test_plateau_before_divergence():
    ex = exact(_matrix(FAST + [6.5e-5]))
    assert not ex.stable
    curve = _plateau_curve()
    assert curve_trend(curve, False) == "flat"
    assert verdict(ex, curve, 2000, False).label == "unstable (not yet visible)"
    # The same dynamics once the growth shows: the curve blows up past its start.
    blown = np.concatenate([curve, 0.2 * np.exp(np.arange(1, 51) / 5.0)])
    assert curve_trend(blown, False) == "growing"
    assert verdict(ex, blown, 200_000, False).label == "diverges"
    assert verdict(ex, np.append(curve, np.inf), 200_000, False).label == "diverges"
    assert verdict(ex, curve, 200_000, True).label == "diverges"


def test_neutral_mode_is_neither_slow_nor_unstable():
    ex = exact(_matrix(FAST + [0.0]))
    assert ex.stable and ex.neutral == 1 and ex.growth == 0.0
    assert ex.slowest == pytest.approx(-math.log(1 - 0.02), rel=1e-9)
    assert math.isfinite(ex.steps_to_tol)
    # Only neutral modes: nothing to wait for.
    only = exact(np.zeros((3, 3)))
    assert only.stable and only.neutral == 3 and only.steps_to_tol == 0.0
    # A mode just above the neutral tolerance counts as a (very) slow one.
    slow = exact(_matrix(FAST + [-1e-8]))
    assert slow.neutral == 0 and slow.slowest == pytest.approx(1e-8, rel=1e-6)


def test_discrete_rule_large_step_complex_pair():
    # Re(lambda) < 0 (the ODE is stable) but |1 + lambda| > 1: the mean map grows.
    lam = complex(-0.1, 0.6)
    ex = exact(_matrix(FAST + [lam, lam.conjugate()]))
    assert abs(1 + lam) > 1
    assert not ex.stable
    assert ex.growth == pytest.approx(math.log(abs(1 + lam)), rel=1e-9)
    # A real eigenvalue below -2 overshoots and grows; one in (-2, -1) decays.
    assert not exact(_matrix(FAST + [-2.1])).stable
    ok = exact(_matrix(FAST + [-1.5]))
    assert ok.stable and ok.slowest == pytest.approx(-math.log(1 - 0.02), rel=1e-9)
    # For small steps the rate is -Re(lambda) to first order.
    small = complex(-1e-4, 1e-5)
    ex = exact(_matrix([small, small.conjugate()]))
    assert ex.slowest == pytest.approx(1e-4, rel=1e-3)


def test_stable_but_run_diverged():
    ex = exact(_matrix(FAST))
    v = verdict(ex, _plateau_curve(), 2000, True)
    assert v.label == "stable in expectation, run diverged"
    assert verdict(ex, np.append(_plateau_curve(), np.nan), 2000, False).label == v.label


def test_labels_come_from_the_fixed_set():
    for eigs in (FAST, FAST + [-1e-5], FAST + [1e-3]):
        ex = exact(_matrix(eigs))
        for curve in (_flat_curve(), _plateau_curve(), np.linspace(1, 2, 11)):
            for div in (False, True):
                v = verdict(ex, curve, 2000, div)
                assert v.label in verdicts.LABELS and "\n" not in v.reason


def test_exact_refuses_bad_input():
    with pytest.raises(ValueError):
        exact(np.zeros((2, 3)))
    with pytest.raises(ValueError):
        exact(np.array([[np.nan]]))


# ------------------------------------------------------------------ curve_trend

def test_curve_trend():
    assert curve_trend([3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], False) == "flat"
    assert curve_trend([3.0, 2.5, 2.0, 1.5, 1.0], False) == "decreasing"
    assert curve_trend([1.0, 0.5, 0.8, 1.2], False) == "growing"
    assert curve_trend([1.0, 0.5, 0.5], True) == "diverged"
    assert curve_trend([1.0, np.inf], False) == "diverged"
    assert curve_trend([1.0, np.nan, 0.5], False) == "diverged"
    # Within 5% over the last quarter counts as flat, beyond it as decreasing.
    assert curve_trend([2.0] + [1.0] * 5 + [1.04, 1.0, 1.0], False) == "flat"
    assert curve_trend([2.0] + [1.0] * 5 + [1.06, 1.0, 1.0], False) == "decreasing"
    assert curve_trend([0.0, 0.0], False) == "flat"
    with pytest.raises(ValueError):
        curve_trend([], False)


# ------------------------------------------------------------------ the models

def test_baird_ctdc_point_the_old_label_called_converged():
    ex = exact_for(envs.make("baird"), "ctdc", {"alpha": 0.01, "beta": 5e-4, "zeta": 0.05})
    assert ex.stable
    assert 3.5e-5 < ex.slowest < 1.4e-4
    assert ex.neutral >= 1  # more features than states: an affine set of fixpoints
    assert ex.steps_to_tol > 20_000
    # Its curve looked flat over 2000 steps; the verdict is that it is still converging.
    assert verdict(ex, _flat_curve(), 2000, False).label == "converging (slowly)"


@pytest.mark.parametrize("point", [
    (0.01, 0.2, 5e-4),    # the reproduction's chosen 2-state CTDC point (lowest AUC)
    (1e-4, 5e-4, 5e-4), (1e-3, 0.2, 0.05), (5e-3, 0.01, 1e-3), (1e-2, 5e-2, 5e-2)])
def test_two_state_ctdc_is_unstable(point):
    alpha, beta, zeta = point
    ex = exact_for(envs.make("two_state"), "ctdc", {"alpha": alpha, "beta": beta, "zeta": zeta})
    assert not ex.stable and ex.growth > 0
    # Its curve sits at a plateau over 2000 steps: not yet visible, never "converged".
    assert verdict(ex, _plateau_curve(), 2000, False).label == "unstable (not yet visible)"


def test_exact_for_matches_exact_of_expected_update():
    from bec_jax.theory import expected_updates as analysis
    env = envs.make("boyan_chain")
    hp = {"alpha": 0.1}
    G, _ = analysis.expected_update(env, "ctd", {**hp, "beta": 0.1})
    assert exact_for(env, "ctd", {**hp, "beta": 0.1}) == exact(G)
    assert isinstance(exact_for(env, "td", hp), Exact)


# ------------------------------------------------------------------ rates and the mean square

def test_one_sign_convention_for_rates():
    grow, decay = exact(_matrix(FAST + [2e-5])), exact(_matrix(FAST + [-1e-5]))
    assert grow.rate == pytest.approx(math.log1p(2e-5), rel=1e-6) and grow.rate > 0
    assert decay.rate == pytest.approx(math.log1p(-1e-5), rel=1e-6) and decay.rate < 0
    assert decay.steps_to_tol == pytest.approx(math.log(1e-3) / decay.rate, rel=1e-12)
    assert "rate -1.00e-05/step" in verdict(decay, _flat_curve(), 2000, False).reason
    assert "rate +2.00e-05/step" in verdict(grow, np.linspace(1, 0.5, 11), 2000, False).reason


def _scalar_td(alpha, sampler="markov"):
    """TD on test_mean_square's hand-worked scalar case: mean factor 1 - 5 alpha,
    second-moment factor 1 - 10 alpha + 41 alpha^2."""
    from bec_jax import mdp
    R = np.zeros((2, 1, 2))
    R[0] = 1.0
    env = mdp.make_mdp(pi=np.ones((2, 1)), mu=np.ones((2, 1)), P=np.full((2, 1, 2), 0.5), R=R,
                       phi=np.array([[1.0], [3.0]]), gamma=0.0)
    return env, verdicts.exact_for(env, "td", {"alpha": alpha}), verdicts.mean_square_for(
        env, "td", {"alpha": alpha}, sampler)


def test_verdict_names_the_mean_square_failure():
    env, ex, ms = _scalar_td(0.3)
    assert ex.stable and ex.rate == pytest.approx(math.log(0.5), abs=1e-12)
    assert not ms.bounded and ms.label == "mean stable, variance grows" and ms.label in verdicts.STABILITY_LABELS
    v = verdict(ex, np.linspace(1.0, 1e9, 11), 100, True, ms)
    assert v.label == "mean stable, variance grows" and v.label in verdicts.LABELS
    assert f"RMS rate {0.5 * math.log(1.69):+.2e}/step" in v.reason and "markov" in v.reason
    # Without the mean-square analysis the same run is the old puzzle.
    assert verdict(ex, np.linspace(1.0, 1e9, 11), 100, True).label == "stable in expectation, run diverged"
    # Bounded: the verdict is the mean's, and says the second moment is bounded.
    env, ex, ms = _scalar_td(0.1, "iid")
    v = verdict(ex, _flat_curve(), 100, False, ms)
    assert v.label == "converges" and f"RMS rate {0.5 * math.log(0.41):+.2e}/step" in v.reason
    # Diverging in mean: the mean decides, whatever the second moment.
    env, ex, ms = _scalar_td(0.45)
    assert verdict(ex, np.linspace(1, 1e9, 11), 100, True, ms).label == "diverges"


def test_markov_mean_can_fail_where_the_iid_mean_does_not():
    """Baird's CTDC at large steps: E[Gamma] (i.i.d.) is stable, the Markov
    first-moment operator is not; the verdict with the Markov analysis says so."""
    env = envs.make("baird")
    hp = {"alpha": 0.3, "beta": 0.2, "zeta": 0.2}
    ex = exact_for(env, "ctdc", hp)
    ms = verdicts.mean_square_for(env, "ctdc", hp, "markov")
    assert ex.stable and not ms.mean_stable and ms.mean_radius > 1.04
    v = verdict(ex, np.linspace(1, 2, 11), 2000, True, ms)
    assert v.label == "diverges" and "under markov sampling (the i.i.d. mean is stable)" in v.reason
