"""`make_mdp` validation and the derived quantities of a hand-made 3-state MDP."""
import numpy as np
import pytest

from bec_jax import mdp as mdp_lib
from bec_jax.mdp import make_mdp

# ----------------------------------------------------------------- a hand-made MDP
#
# 3 states, 2 actions.
#   state 0: a0 -> 1;            a1 -> 0 or 2 (1/2 each)
#   state 1: a0 -> 2;            a1 -> 0
#   state 2: a0 -> 0;            a1 -> 1 or 2 (1/2 each)
# mu = [[1/2, 1/2], [1/4, 3/4], [1, 0]],  pi = [[1, 0], [1/2, 1/2], [1, 0]]
# R(s, a, s') = s + 10 a + 100 s'.
P3 = np.zeros((3, 2, 3))
P3[0, 0, 1] = 1.0
P3[0, 1, [0, 2]] = 0.5
P3[1, 0, 2] = 1.0
P3[1, 1, 0] = 1.0
P3[2, 0, 0] = 1.0
P3[2, 1, [1, 2]] = 0.5
MU3 = np.array([[0.5, 0.5], [0.25, 0.75], [1.0, 0.0]])
PI3 = np.array([[1.0, 0.0], [0.5, 0.5], [1.0, 0.0]])
_s, _a, _t = np.meshgrid(np.arange(3), np.arange(2), np.arange(3), indexing="ij")
R3 = (_s + 10 * _a + 100 * _t).astype(float)
PHI3 = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])


def good_kwargs(**overrides):
    kw = dict(pi=PI3, mu=MU3, P=P3, R=R3, phi=PHI3, gamma=0.9)
    kw.update(overrides)
    return kw


@pytest.fixture(scope="module")
def m3():
    return make_mdp(**good_kwargs())


def test_p_mu_by_hand(m3):
    expected = np.array([
        [0.25, 0.5, 0.25],   # 1/2 [0,1,0] + 1/2 [1/2,0,1/2]
        [0.75, 0.0, 0.25],   # 1/4 [0,0,1] + 3/4 [1,0,0]
        [1.0, 0.0, 0.0],
    ])
    np.testing.assert_allclose(mdp_lib.P_mu(m3), expected, rtol=0, atol=1e-15)


def test_p_pi_by_hand(m3):
    expected = np.array([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5], [1.0, 0.0, 0.0]])
    np.testing.assert_allclose(mdp_lib.P_pi(m3), expected, rtol=0, atol=1e-15)


def test_rewards_by_hand(m3):
    # r_pi(0) = R(0,0,1) = 100; r_pi(1) = (R(1,0,2) + R(1,1,0)) / 2 = (201 + 11) / 2
    np.testing.assert_allclose(mdp_lib.r_pi(m3), [100.0, 106.0, 2.0], rtol=1e-14)
    # r_mu(0) = 1/2 * 100 + 1/2 * (10 + 210) / 2; r_mu(1) = 1/4 * 201 + 3/4 * 11
    np.testing.assert_allclose(mdp_lib.r_mu(m3), [105.0, 58.5, 2.0], rtol=1e-14)


def test_d_mu_by_hand(m3):
    # d1 = d0 / 2, d2 = (d0 + d1) / 4  =>  d = (8, 4, 3) / 15
    d = mdp_lib.d_mu(m3)
    np.testing.assert_allclose(d, np.array([8.0, 4.0, 3.0]) / 15.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(d @ mdp_lib.P_mu(m3), d, rtol=0, atol=1e-12)
    assert d.sum() == pytest.approx(1.0, abs=1e-14)
    # The default start distribution is d_mu.
    np.testing.assert_allclose(m3.start, d, rtol=0, atol=1e-12)


def test_rho_by_hand(m3):
    expected = np.array([[2.0, 0.0], [2.0, 2.0 / 3.0], [1.0, 0.0]])  # 0 where mu = 0
    np.testing.assert_allclose(mdp_lib.rho(m3), expected, rtol=1e-14)


def test_stored_fields_and_defaults(m3):
    assert (m3.num_states, m3.num_actions, m3.num_features) == (3, 2, 2)
    assert float(m3.gamma) == 0.9
    np.testing.assert_array_equal(m3.theta0, np.zeros(2))
    np.testing.assert_array_equal(m3.R, R3)
    assert not mdp_lib.is_on_policy(m3)
    assert mdp_lib.is_on_policy(make_mdp(**good_kwargs(pi=MU3)))


def test_reward_of_shape_s_a_broadcasts_over_next_state():
    r_sa = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    m = make_mdp(**good_kwargs(R=r_sa))
    assert m.R.shape == (3, 2, 3)
    np.testing.assert_array_equal(m.R, np.repeat(r_sa[:, :, None], 3, axis=2))
    # r_pi = sum_a pi(a|s) R(s, a)
    np.testing.assert_allclose(mdp_lib.r_pi(m), [1.0, 3.5, 5.0], rtol=1e-14)


def test_explicit_start_and_theta0_are_kept():
    m = make_mdp(**good_kwargs(start=[0.0, 1.0, 0.0], theta0=[3.0, -1.0]))
    np.testing.assert_array_equal(m.start, [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(m.theta0, [3.0, -1.0])


def test_periodic_unichain_is_accepted():
    # Deterministic 2-cycle: periodic but with a unique stationary distribution.
    P = np.zeros((2, 1, 2))
    P[0, 0, 1] = P[1, 0, 0] = 1.0
    m = make_mdp(pi=np.ones((2, 1)), mu=np.ones((2, 1)), P=P, R=np.zeros((2, 1)),
                 phi=np.eye(2), gamma=0.5)
    np.testing.assert_allclose(mdp_lib.d_mu(m), [0.5, 0.5], atol=1e-12)


# ------------------------------------------------------------------- validation

def _with(arr, idx, value):
    arr = np.array(arr, dtype=float)
    arr[idx] = value
    return arr


_P_not_stochastic = _with(P3, (1, 1, 0), 0.9)           # row (1, 1) sums to 0.9
_P_negative = _with(_with(P3, (0, 0, 1), 1.5), (0, 0, 0), -0.5)  # sums to 1, has -0.5
_two_closed_classes = np.zeros((3, 2, 3))
_two_closed_classes[0, :, 0] = 1.0                          # 0 absorbing
_two_closed_classes[1, :, 2] = 1.0                          # 1 <-> 2 closed
_two_closed_classes[2, :, 1] = 1.0

BAD_INPUTS = [
    # (field named in the message, overrides)
    ("pi", dict(pi=_with(_with(PI3, (1, 0), -0.5), (1, 1), 1.5))),   # negative probability
    ("mu", dict(mu=_with(_with(MU3, (0, 0), 1.25), (0, 1), -0.25))),  # negative probability
    ("P", dict(P=_P_negative)),                                        # negative probability
    ("start", dict(start=[1.5, -0.5, 0.0])),                           # negative probability
    ("pi", dict(pi=_with(PI3, (1, 1), 0.4))),                          # row sums to 0.9
    ("mu", dict(mu=_with(MU3, (2, 1), 0.1))),                          # row sums to 1.1
    ("P", dict(P=_P_not_stochastic)),                                  # row sums to 0.9
    ("start", dict(start=[0.5, 0.25, 0.0])),                           # sums to 0.75
    ("pi", dict(pi=np.full((3, 3), 1.0 / 3.0))),                       # 3 actions vs P's 2
    ("pi", dict(pi=np.full((2, 2), 0.5))),                             # 2 states vs P's 3
    ("mu", dict(mu=np.full((3, 3), 1.0 / 3.0))),
    ("phi", dict(phi=np.ones((4, 2)))),                                # 4 rows vs 3 states
    ("phi", dict(phi=np.ones((3, 0)))),                                # no features
    ("phi", dict(phi=np.ones(3))),                                     # not a matrix
    ("theta0", dict(theta0=np.zeros(3))),                              # 3 weights vs 2 features
    ("start", dict(start=np.full(4, 0.25))),                           # 4 vs 3 states
    ("R", dict(R=np.zeros((3, 2, 4)))),
    ("R", dict(R=np.zeros((3, 3)))),
    ("R", dict(R=np.zeros(3))),
    ("P", dict(P=np.full((3, 2, 4), 0.25))),                           # not (S, A, S)
    ("gamma", dict(gamma=1.0)),
    ("gamma", dict(gamma=-0.1)),
    ("gamma", dict(gamma=float("nan"))),
    ("gamma", dict(gamma="abc")),
    ("gamma", dict(gamma="0.9")),                                      # a numeric string too
    ("gamma", dict(gamma=None)),
    ("phi", dict(phi=_with(PHI3, (2, 1), np.nan))),
    ("phi", dict(phi=_with(PHI3, (0, 0), np.inf))),
    ("R", dict(R=_with(R3, (1, 0, 2), np.inf))),
    ("R", dict(R=_with(R3, (0, 1, 1), np.nan))),
    ("P", dict(P=_with(P3, (0, 0, 0), np.nan))),
    ("theta0", dict(theta0=[0.0, np.inf])),
    # coverage: pi(a1|s2) = 1/2 but mu(a1|s2) = 0
    ("mu", dict(pi=np.array([[1.0, 0.0], [0.5, 0.5], [0.5, 0.5]]))),
    # behaviour chain with two closed classes ({0} and {1, 2})
    ("mu", dict(P=_two_closed_classes)),
]


@pytest.mark.parametrize("field,overrides", BAD_INPUTS,
                         ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_INPUTS)])
def test_bad_input_raises_value_error_naming_the_field(field, overrides):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        make_mdp(**good_kwargs(**overrides))


def test_non_unichain_message_says_so():
    with pytest.raises(ValueError, match=r"^mu: .*2 closed classes.*unichain"):
        make_mdp(**good_kwargs(P=_two_closed_classes))


def test_coverage_message_points_at_the_state_and_action():
    with pytest.raises(ValueError, match=r"^mu: coverage violated at state 2, action 1"):
        make_mdp(**good_kwargs(pi=np.array([[1.0, 0.0], [0.5, 0.5], [0.5, 0.5]])))


def test_hand_typed_fractions_within_tolerance_are_accepted():
    # 1/7 typed to 7 digits: rows sum to 1 within 1e-6.
    mu = np.tile([0.8571429, 0.1428571], (3, 1))
    m = make_mdp(**good_kwargs(mu=mu, pi=mu))
    assert mdp_lib.is_on_policy(m)


def test_stationary_distribution_raises_for_identity():
    with pytest.raises(ValueError, match="unichain"):
        mdp_lib.stationary_distribution(np.eye(3))
