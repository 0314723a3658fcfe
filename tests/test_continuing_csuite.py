"""csuite's Catch, Windy Catch, Dancing Catch, Pendulum and Taxi in JAX
(`bec_jax.control.continuing.csuite`): hand-checked single steps, features,
bad parameters, Taxi's model against its step, and the average reward of fixed
policies against statistics recorded from csuite's own implementation."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax.control.continuing import csuite, tasks
from bec_jax.control.continuing.csuite import CatchState, PendulumState, TaxiState, WindyState
from bec_jax.engine import tuning

KEY = jax.random.PRNGKey(0)
# The engine's light compile (the loop emitters at -O1) for the small programs here: under half the
# compile time of XLA's default, and no test here is about the compile options.
LIGHT = tuning.CPU_LIGHT_OPTIONS if jax.default_backend() == "cpu" else None
jit = functools.partial(jax.jit, compiler_options=LIGHT)
# For the one large program (`_all_rewards`), LLVM's -O1 alone (the light compile's optimisation level):
# a fifth less compile time than XLA's default, where the loop emitters take longer on it.
O1 = {"xla_backend_optimization_level": 1} if jax.default_backend() == "cpu" else None

# Recorded from csuite's own code (github.com/google-deepmind/csuite, commit
# b74faed74685dc852d43c2022150c4186c244929), run once with its environments
# (dm-env installed, csuite's source on the path; its package __init__ skipped,
# as it imports gym for its wrapper only): `python /tmp/csuite_ref.py 200 5000`,
# 200 runs of 5,000 steps from `start()`, run i with env seed i and policy
# numpy seed i (np.random.default_rng(i): u = random(5000), a = integers(A,
# 5000)). Mean reward over the 10^6 steps, its standard error over the 200 run
# means, and the rates of +1 / -1 (Catch) or -10 / +20 (Taxi). Policies:
#   uniform  action a_t uniform;
#   track    if u_t < 0.5 a_t uniform, else move toward the column of the
#            oldest ball (csuite's balls[0], the lowest), stay if none;
#   pump     if u_t < 0.5 a_t uniform, else torque +1 if velocity >= 0 else -1.
# (name, task parameters, policy): (mean, se, rates {reward: rate})
CSUITE_RUNS, CSUITE_STEPS = 200, 5000
CSUITE_STATS = {
    ("catch", (), "uniform"): (-0.060375, 0.000331, {1.0: 0.019980, -1.0: 0.080355}),
    ("catch", (), "track"): (0.016939, 0.000304, {1.0: 0.058637, -1.0: 0.041698}),
    ("windy_catch", (("change_every", 100),), "track"): (-0.039628, 0.000495, {1.0: 0.030336, -1.0: 0.069964}),
    ("dancing_catch", (("swap_every", 100),), "track"): (0.017507, 0.000287, {1.0: 0.058884, -1.0: 0.041377}),
    ("pendulum", (), "pump"): (0.237560, 0.000825, {1.0: 0.237560}),
    ("pendulum", (), "uniform"): (0.0, 0.0, {1.0: 0.0}),
    ("taxi", (), "uniform"): (-3.273750, 0.004674, {-10.0: 0.330003, 20.0: 0.001314}),
}

# The JAX side: SEEDS runs of CSUITE_STEPS steps (the same design, fewer runs),
# compared within TOL combined standard errors.
SEEDS, TOL = 32, 5.0


def _board(state):
    return state.board if isinstance(state, tuple) and hasattr(state, "board") else state


def uniform(key, state, num_actions):
    return jax.random.randint(jax.random.split(key)[1], (), 0, num_actions)


def track(key, state, num_actions):
    ku, ka = jax.random.split(key)
    board = _board(state)
    col, row = csuite.lowest_ball(board)
    toward = jnp.where(row >= 0, 1 + jnp.sign(col - board.paddle), 1)
    return jnp.where(jax.random.uniform(ku) < 0.5, jax.random.randint(ka, (), 0, num_actions), toward)


def pump(key, state, num_actions):
    ku, ka = jax.random.split(key)
    push = jnp.where(state.velocity >= 0, 2, 0)
    return jnp.where(jax.random.uniform(ku) < 0.5, jax.random.randint(ka, (), 0, num_actions), push)


POLICIES = {"uniform": uniform, "track": track, "pump": pump}


def _rewards(env, policy, key, seeds, steps):
    """(seeds, steps) rewards of `policy` from `reset` (features are traced
    under jit, vmap and scan by the other tests)."""

    def one(key):
        k0, k = jax.random.split(key)

        def body(s, key):
            kp, ks = jax.random.split(key)
            return env.step(ks, s, policy(kp, s, env.num_actions))

        return jax.lax.scan(body, env.reset(k0), jax.random.split(k, steps))[1]

    return jax.vmap(one)(jax.random.split(key, seeds))


@functools.cache
def _all_rewards() -> dict:
    """Every CSUITE_STATS configuration's rewards, in one compiled program (one
    compilation is half the time of seven)."""

    def run_all(key):
        return [_rewards(tasks.make(name, **dict(params)), POLICIES[policy], key, SEEDS, CSUITE_STEPS)
                for name, params, policy in CSUITE_STATS]

    out = jax.jit(run_all, compiler_options=O1)(KEY)
    return {cfg: np.asarray(r, np.float64) for cfg, r in zip(CSUITE_STATS, out)}


@pytest.mark.parametrize("name, params, policy", list(CSUITE_STATS))
def test_average_reward_matches_csuite(name, params, policy):
    mean, se, rates = CSUITE_STATS[(name, params, policy)]
    r = _all_rewards()[(name, params, policy)]
    run_means = r.mean(1)
    se_jax = run_means.std(ddof=1) / math.sqrt(SEEDS)
    assert abs(run_means.mean() - mean) <= TOL * math.hypot(se, se_jax) + 1e-12, (run_means.mean(), se_jax)
    for value, rate in rates.items():
        per_run = (r == value).mean(1)
        # csuite's rate has 200 runs to our SEEDS: its SE is ours scaled by sqrt(SEEDS / 200).
        se_rate = per_run.std(ddof=1) / math.sqrt(SEEDS) * math.sqrt(1 + SEEDS / CSUITE_RUNS)
        assert abs(per_run.mean() - rate) <= TOL * se_rate + 1e-12, (value, per_run.mean(), rate)


def _catch_state(paddle, balls, rows=10):
    b = np.full(rows - 1, -1, np.int32)
    for row, col in balls.items():
        b[row] = col
    return CatchState(paddle=jnp.int32(paddle), balls=jnp.asarray(b))


def test_catch_steps_by_hand():
    env = csuite.catch(spawn_probability=0.0)
    step = jit(env.step)
    # The paddle moves by action - 1 and is clipped at the walls.
    for paddle, action, moved in ((2, 0, 1), (2, 2, 3), (2, 1, 2), (0, 0, 0), (4, 2, 4)):
        s, r = step(KEY, _catch_state(paddle, {}), action)
        assert int(s.paddle) == moved and float(r) == 0.0
    # Balls fall one row; the one reaching the paddle's row lands and is removed.
    s, r = step(KEY, _catch_state(2, {3: 4, 8: 1}), 2)  # paddle -> 3, ball in column 1 lands: -1
    assert float(r) == -1.0 and np.asarray(s.balls).tolist() == [-1, -1, -1, -1, 4, -1, -1, -1, -1]
    s, r = step(KEY, _catch_state(2, {8: 1}), 0)  # paddle -> 1 under the ball: +1
    assert float(r) == 1.0 and np.all(np.asarray(s.balls) == -1)
    # A new ball appears in row 0 with probability spawn_probability.
    s, _ = jit(csuite.catch(spawn_probability=1.0).step)(KEY, _catch_state(2, {}), 1)
    assert 0 <= int(s.balls[0]) < 5 and np.all(np.asarray(s.balls[1:]) == -1)
    s0 = jit(env.reset)(KEY)
    assert int(s0.paddle) == 2 and 0 <= int(s0.balls[0]) < 5 and np.all(np.asarray(s0.balls[1:]) == -1)


def test_catch_features():
    s = _catch_state(1, {2: 3, 6: 0})
    col, row = csuite.lowest_ball(s)
    assert (int(col), int(row)) == (0, 6)
    assert tuple(int(v) for v in csuite.lowest_ball(_catch_state(4, {}))) == (4, -1)
    onehot = csuite.catch(features="onehot")
    onehot = onehot._replace(features=jit(onehot.features))
    cells = 5 * 9 + 1
    # (paddle 1) * cells + (row 6 * 5 + column 0), then one block per action.
    assert np.asarray(onehot.features(s)).ravel().tolist() == [1 * cells + 30 + a * 5 * cells for a in range(3)]
    tiled = csuite.catch()
    f = np.asarray(jit(tiled.features)(s))
    k = tiled.num_features // 3
    assert f.shape == (3, 16) and tiled.num_active == 16 and k == 16 * 27
    assert np.all(f // k == np.arange(3)[:, None]) and np.all(np.diff(f[0] % k // 27) == 1)
    board = np.asarray(jit(csuite.catch(features="board").features)(s))
    grid = board[1, 50:100].reshape(10, 5)
    assert board.shape == (3, 150) and grid[9, 1] == grid[2, 3] == grid[6, 0] == 1 and grid.sum() == 3
    assert board[0, 50:].sum() == 0


def test_windy_catch_wind_and_clock():
    env = csuite.windy_catch(spawn_probability=0.0, change_every=3)
    step = jit(env.step)
    # Right wind (2): the landing ball moves from column 4 to column 0 (wrapping).
    s = WindyState(board=_catch_state(0, {8: 4}), wind=jnp.int32(2), clock=jnp.int32(0))
    s, r = step(KEY, s, 1)
    assert float(r) == 1.0 and int(s.clock) == 1
    s = WindyState(board=_catch_state(2, {4: 0}), wind=jnp.int32(1), clock=jnp.int32(2))
    s, _ = step(KEY, s, 1)
    assert int(s.board.balls[5]) == 4 and int(s.clock) == 0  # left wind wraps; the clock restarts
    f = np.asarray(jit(env.features)(s))
    assert f.shape == (3, 16) and f.max() < env.num_features
    obs = np.asarray(jit(csuite.windy_catch(features="board").features)(s))
    assert obs.shape == (3, 3 * 53) and obs[0, 50:53].tolist() == np.eye(3)[int(s.wind)].tolist()


def test_dancing_catch_permutation():
    env = csuite.dancing_catch(swap_every=2)
    s = jit(env.reset)(KEY)
    assert np.asarray(s.perm).tolist() == list(range(50))

    def body(s, key):
        s, _ = env.step(key, s, 1)
        return s, (s.perm, csuite.binary_board(s.board, 10, 5), env.features(s))

    s, (perms, plain, feats) = jit(lambda s: jax.lax.scan(body, s, jax.random.split(KEY, 40)))(s)
    perms, plain, feats = np.asarray(perms), np.asarray(plain), np.asarray(feats)
    assert np.all(np.sort(perms, axis=1) == np.arange(50))
    assert np.array_equal(feats[:, 2, 100:], np.take_along_axis(plain, perms, axis=1))
    # Swaps only every second step (two entries at most), and the clock restarts.
    assert np.array_equal(perms[0], np.arange(50)) and np.sum(perms[1] != perms[0]) in (0, 2)
    assert int(s.clock) == 0 and not np.array_equal(perms[-1], np.arange(50))


def test_pendulum_steps_by_hand():
    env = csuite.pendulum()
    step = jit(env.step)
    s = jit(env.reset)(KEY)
    # csuite's integration (float64, by hand): 4 Euler steps of 0.05 s, velocity first.
    angle, vel = 0.0, 0.0
    for action in (2, 2, 0, 1, 2):
        for _ in range(4):
            vel += ((action - 1) - 0.1 * vel - 9.81 * math.sin(angle)) * 0.05
            angle += vel * 0.05
        angle %= 2 * math.pi
        s, r = step(KEY, s, action)
        assert abs(float(s.angle) - angle) < 1e-5 and abs(float(s.velocity) - vel) < 1e-5 and float(r) == 0.0
    # Upright at rest: reward 1 (within 30 degrees of pi); outside: 0.
    for angle, reward in ((math.pi, 1.0), (math.pi + 0.6, 0.0), (math.pi - 0.4, 1.0)):
        _, r = step(KEY, PendulumState(angle=jnp.float32(angle), velocity=jnp.float32(0.0)), 1)
        assert float(r) == reward
    s, _ = jit(csuite.pendulum(max_speed=1.0).step)(KEY, PendulumState(jnp.float32(1.0), jnp.float32(5.0)), 2)
    assert float(s.velocity) == 1.0
    f = np.asarray(jit(env.features)(s))
    assert f.shape == (3, 8) and env.num_features == 3 * 8 * 343 and f.max() < env.num_features


def test_taxi_steps_and_model():
    env = csuite.taxi()
    step = jit(env.step)

    def taxi_state(x, y, p, d):
        return TaxiState(*(jnp.int32(v) for v in (x, y, p, d)))

    s, r = step(KEY, taxi_state(1, 0, 0, 1), 3)  # east from (1, 0): a wall
    assert (int(s.x), int(s.y), float(r)) == (1, 0, 0.0)
    s, r = step(KEY, taxi_state(0, 0, 0, 1), 4)  # pick up at Red
    assert (int(s.passenger), float(r)) == (4, 0.0)
    s, r = step(KEY, taxi_state(4, 0, 4, 1), 5)  # drop off at Green
    assert float(r) == 20.0 and int(s.passenger) < 4
    _, r = step(KEY, taxi_state(2, 2, 4, 1), 5)
    assert float(r) == -10.0
    # Every (state, action): the step's reward is R's and its next state in P's support.
    P, R = csuite.taxi_model()
    n = csuite.TAXI_NUM_STATES
    idx = np.repeat(np.arange(n), 6)
    acts = np.tile(np.arange(6), n)
    states = TaxiState(*(jnp.asarray(v, jnp.int32) for v in np.unravel_index(idx, (5, 5, 5, 4))))

    @jit
    def check(key, states, acts):
        nxt, r = jax.vmap(env.step)(jax.random.split(key, idx.size), states, acts)
        return jax.vmap(env.state_index)(states), jax.vmap(env.state_index)(nxt), r

    here, j, r = (np.asarray(v) for v in check(KEY, states, jnp.asarray(acts)))
    assert np.array_equal(here, idx) and np.all(P[idx, acts, j] > 0) and np.allclose(r, R[idx, acts])
    # The uniform policy's exact gain (stationary mu: mu (I - P) = 0, sum mu = 1)
    # agrees with csuite's recorded statistic.
    Pp, Rp = P.mean(1), R.mean(1)
    A = np.vstack([(np.eye(n) - Pp).T, np.ones(n)])
    mu = np.linalg.lstsq(A, np.r_[np.zeros(n), 1.0], rcond=None)[0]
    mean, se, _ = CSUITE_STATS[("taxi", (), "uniform")]
    assert abs(mu @ Rp - mean) <= TOL * se


@pytest.mark.parametrize("name, params, field", [
    ("catch", {"rows": 1}, "rows"), ("catch", {"columns": 1.5}, "columns"),
    ("catch", {"spawn_probability": 1.5}, "spawn_probability"), ("catch", {"features": "pixels"}, "features"),
    ("catch", {"num_tilings": 0}, "num_tilings"), ("windy_catch", {"change_every": 0}, "change_every"),
    ("dancing_catch", {"features": "tiles"}, "features"), ("dancing_catch", {"swap_every": -1}, "swap_every"),
    ("pendulum", {"simulation_step_size": 0.0}, "simulation_step_size"), ("pendulum", {"friction": -1}, "friction"),
    ("pendulum", {"max_speed": math.nan}, "max_speed"), ("taxi", {"rows": 5}, "rows"),
])
def test_bad_parameters_name_the_field(name, params, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        tasks.make(name, **params)


def test_registry_rebuilds_every_task():
    for name in ("catch", "windy_catch", "dancing_catch", "pendulum", "taxi"):
        env = tasks.make(name)
        assert env.name == name and tasks.make(name, **env.params).params == env.params
    assert tasks.make("taxi").tabular and not tasks.make("catch").tabular
    assert tasks.make("pendulum", max_speed=math.inf).params["max_speed"] is None
