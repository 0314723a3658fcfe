"""Hand-computed checks of benchmarks/control_numpy.py, the NumPy re-implementation
of the authors' CliffWalking loop (GameAI-NJUPT/BEC, Cliff_Walking/agent.py)."""
import numpy as np
import pytest

from benchmarks import control_numpy as c

N = c.N_STATES  # 48: Q(s, a) = w[a*48 + s]
KW = {"alpha": 0.1, "beta": 1e-4, "zeta": 0.005, "gamma": 0.99}


def _learner(q25=(-3.0, -1.5, -1.5, -4.0), q24_right=-2.0, psi24_right=0.3):
    """w with Q(24, right) and Q(25, .) set (a tie at 25 between right and down),
    psi(24, right) set."""
    w = [0.0] * (4 * N)
    psi = [0.0] * (4 * N)
    w[1 * N + 24] = q24_right
    for a, q in enumerate(q25):
        w[a * N + 25] = q
    psi[1 * N + 24] = psi24_right
    return w, psi


# ---------------------------------------------------------------- environment

def test_cliff_step_moves_walls_cliff_and_goal():
    assert c.cliff_step(36, 0) == (24, -1.0, False)  # up from the start
    assert c.cliff_step(36, 3) == (36, -1.0, False)  # off the grid: stay
    assert c.cliff_step(36, 2) == (36, -1.0, False)
    assert c.cliff_step(0, 0) == (0, -1.0, False)
    assert c.cliff_step(11, 1) == (11, -1.0, False)
    assert c.cliff_step(36, 1) == (36, -100.0, False)  # into the cliff: back to start, not terminal
    for col in range(1, 11):
        assert c.cliff_step(24 + col, 2) == (36, -100.0, False)
    assert c.cliff_step(35, 2) == (47, -1.0, True)  # the goal is terminal
    assert c.cliff_step(46, 1) == (47, -1.0, True)
    assert c.cliff_step(23, 2) == (35, -1.0, False)


def test_argmax_ties_go_to_the_lowest_action():
    w, _ = _learner()
    assert c._argmax(w, 25) == 1  # right and down tie at -1.5
    assert c._argmax([0.0] * (4 * N), 7) == 0
    for s in range(N):
        q = np.random.default_rng(s).integers(-2, 1, 4).astype(float)
        w = [0.0] * (4 * N)
        for a in range(4):
            w[a * N + s] = q[a]
        assert c._argmax(w, s) == int(np.argmax(q))


# ---------------------------------------------------------------- the updates by hand
# Transition (24, right) -> 25, r = -1. a* = 1 (tie), Q(25, a*) = -1.5, Q(24, right) = -2:
# delta = -1 + 0.99 * -1.5 - (-2) = -0.485; omega = 0.2, so delta - omega = -0.685.

def test_q_update_by_hand():
    w, psi = _learner()
    om = c.update_q(w, psi, 0.2, 24, 1, -1.0, 25, False, **KW)
    assert om == 0.2
    assert w[1 * N + 24] == pytest.approx(-2.0 + 0.1 * -0.485, abs=1e-15)


def test_cq_update_by_hand():
    w, psi = _learner()
    before = list(w)
    om = c.update_cq(w, psi, 0.2, 24, 1, -1.0, 25, False, **KW)
    assert w[1 * N + 24] == pytest.approx(-2.0685, abs=1e-15)  # -2 + 0.1 * -0.685 (old omega)
    assert om == pytest.approx(0.2 + 1e-4 * -0.685, abs=1e-15)  # 0.1999315, after the weights
    assert psi[1 * N + 24] == 0.3  # CQ leaves psi alone
    assert [x for i, x in enumerate(w) if i != 1 * N + 24] == [x for i, x in enumerate(before) if i != 1 * N + 24]


def test_cgq_update_by_hand():
    w, psi = _learner()
    om = c.update_cgq(w, psi, 0.2, 24, 1, -1.0, 25, False, **KW)
    assert w[1 * N + 24] == pytest.approx(-2.0685, abs=1e-15)
    assert w[1 * N + 25] == pytest.approx(-1.5 - 0.1 * 0.3 * 0.99, abs=1e-15)  # -1.5297, on a* = 1
    assert w[2 * N + 25] == -1.5  # the tied action gets no correction
    assert psi[1 * N + 24] == pytest.approx(0.3 + 0.005 * (-0.685 - 0.3), abs=1e-15)  # 0.295075, old p
    assert om == pytest.approx(0.1999315, abs=1e-15)


def test_gq_update_by_hand_and_its_correction_at_the_goal():
    w, psi = _learner()
    om = c.update_gq(w, psi, 0.2, 24, 1, -1.0, 25, False, **KW)
    assert om == 0.2
    assert w[1 * N + 24] == pytest.approx(-2.0 + 0.1 * -0.485, abs=1e-15)
    assert w[1 * N + 25] == pytest.approx(-1.5297, abs=1e-15)
    assert psi[1 * N + 24] == pytest.approx(0.3 + 0.005 * (-0.485 - 0.3), abs=1e-15)
    # Terminal transition (35, down) -> 47: no bootstrap, but the correction still lands
    # on Q(47, argmax) (no (1 - term) factor in the authors' GQ).
    w = [0.0] * (4 * N)
    psi = [0.0] * (4 * N)
    w[2 * N + 35], psi[2 * N + 35] = -0.5, 0.4
    w[3 * N + 47] = 7.0  # would matter if the goal were bootstrapped; it is not
    c.update_gq(w, psi, 0.0, 35, 2, -1.0, 47, True, **KW)
    assert w[2 * N + 35] == pytest.approx(-0.5 + 0.1 * -0.5, abs=1e-15)  # delta = -1 + 0.5
    assert w[3 * N + 47] == pytest.approx(7.0 - 0.1 * 0.4 * 0.99, abs=1e-15)
    assert psi[2 * N + 35] == pytest.approx(0.4 + 0.005 * (-0.5 - 0.4), abs=1e-15)


def test_self_loop_applies_both_weight_updates_to_the_same_weight():
    # (0, up) -> 0 with Q(0, up) the largest: (s', a*) = (s, a).
    w = [0.0] * (4 * N)
    psi = [0.0] * (4 * N)
    w[0], psi[0] = 1.0, 0.5
    c.update_gq(w, psi, 0.0, 0, 0, -1.0, 0, False, **KW)
    delta = -1.0 + 0.99 * 1.0 - 1.0
    assert w[0] == pytest.approx(1.0 + 0.1 * delta - 0.1 * 0.5 * 0.99, abs=1e-15)


# ---------------------------------------------------------------- runs

def test_greedy_q_learning_is_deterministic_and_seed_free():
    # eps0 = 0 alone is not greedy: the floor lifts epsilon to eps_min after episode 1.
    a = c.run("Q", 30, seed=0, eps0=0.0, eps_min=0.0)
    b = c.run("Q", 30, seed=1, eps0=0.0, eps_min=0.0)
    np.testing.assert_array_equal(a["lengths"], b["lengths"])  # no randomness at all
    np.testing.assert_array_equal(a["w"], b["w"])
    # Zero-initialised greedy learning: the first episode goes up first (ties to action 0)
    # and never enters the cliff, so its return is minus its length.
    assert a["returns"][0] == -a["lengths"][0]
    assert a["steps"] == a["lengths"].sum()


def test_runs_are_reproducible_per_seed():
    for alg in c.ALGORITHMS:
        a, b = c.run(alg, 50, seed=3), c.run(alg, 50, seed=3)
        np.testing.assert_array_equal(a["lengths"], b["lengths"])
        np.testing.assert_array_equal(a["w"], b["w"])
    assert not np.array_equal(c.run("Q", 50, seed=3)["lengths"], c.run("Q", 50, seed=4)["lengths"])


def test_episode_cap_and_epsilon_schedule():
    r = c.run("Q", 3, seed=0, max_steps=7)
    assert (r["lengths"] == 7).all()
    assert r["epsilon"] == pytest.approx(0.01 * 0.9992 ** 3)
    r = c.run("CQ", 4, seed=0, eps0=2e-4, eps_decay=0.5, max_steps=50)
    assert r["epsilon"] == 1e-4  # floored


@pytest.mark.parametrize("alg", c.ALGORITHMS)
def test_greedy_path_after_500_episodes_is_the_13_step_optimum(alg):
    r = c.run(alg, 500, seed=0)
    path = c.greedy_path(r["w"])
    assert path[0] == 36 and path[-1] == 47
    assert len(path) - 1 == 13  # up, 11 x right, down
