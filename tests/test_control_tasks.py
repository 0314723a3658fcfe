"""Control tasks and the tile coder: hand-worked transitions of the grids, the
tile coder against hand-worked cases and an independent NumPy transcription of
the authors' scheme, MountainCar and Acrobot against gymnax, NumPy and
Gymnasium, and every task under jit, vmap and scan."""
import ast
import sys
from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax.control import tasks, tiles
from bec_jax.control.spec import ControlSpec

KEY = jax.random.PRNGKey(0)


def _compiled(env):
    return {
        "reset": jax.jit(env.reset),
        "step": jax.jit(env.step),
        "active": jax.jit(env.active),
        "vreset": jax.jit(jax.vmap(env.reset)),
        "vstep": jax.jit(jax.vmap(env.step)),
        "vactive": jax.jit(jax.vmap(env.active)),
    }


@pytest.fixture(scope="module")
def cliff():
    env = tasks.make("cliff_walking")
    return env, _compiled(env)


@pytest.fixture(scope="module")
def maze():
    env = tasks.make("maze")
    return env, _compiled(env)


@pytest.fixture(scope="module")
def mountain_car():
    pytest.importorskip("gymnax")
    env = tasks.make("mountain_car")
    return env, _compiled(env)


@pytest.fixture(scope="module")
def acrobot():
    pytest.importorskip("gymnax")
    env = tasks.make("acrobot")
    return env, _compiled(env)


def _step(fns, s, a):
    ns, r, t = fns["step"](KEY, jnp.int32(s), jnp.int32(a))
    return int(ns), float(r), bool(t)


# ------------------------------------------------------------- CliffWalking

UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3


def test_cliff_walking_hand_worked(cliff):
    env, f = cliff
    assert (env.num_actions, env.num_features, env.num_active) == (4, 192, 1)
    assert (env.gamma, env.max_episode_steps) == (0.99, 1000)
    assert int(f["reset"](KEY)) == 36
    assert _step(f, 36, UP) == (24, -1.0, False)
    assert _step(f, 36, RIGHT) == (36, -100.0, False)  # into the cliff: back at the start
    assert _step(f, 36, LEFT) == (36, -1.0, False)  # off the grid: stays
    assert _step(f, 36, DOWN) == (36, -1.0, False)
    assert _step(f, 35, DOWN) == (47, -1.0, True)  # the goal
    assert _step(f, 24, LEFT) == (24, -1.0, False)
    assert _step(f, 0, UP) == (0, -1.0, False)
    assert _step(f, 11, RIGHT) == (11, -1.0, False)
    assert _step(f, 25, DOWN) == (36, -100.0, False)  # row 2 col 1 down: cliff
    assert _step(f, 34, DOWN) == (36, -100.0, False)  # col 10 down: cliff
    assert _step(f, 46 - 12, RIGHT) == (35, -1.0, False)
    for s in (0, 17, 36, 47):
        np.testing.assert_array_equal(np.asarray(f["active"](jnp.int32(s))), [[a * 48 + s] for a in range(4)])


def test_cliff_walking_equals_gymnasium_tables():
    gym_cliff = pytest.importorskip("gymnasium.envs.toy_text.cliffwalking")
    genv = gym_cliff.CliffWalkingEnv()
    nxt, rew, term = tasks.cliff_walking_tables()
    for s in range(48):
        for a in range(4):
            ((prob, ns, r, t),) = genv.P[s][a]
            assert prob == 1.0
            assert (nxt[s, a], rew[s, a], term[s, a]) == (ns, r, t), (s, a)


# --------------------------------------------------------------------- Maze

M_UP, M_DOWN, M_LEFT, M_RIGHT = 0, 1, 2, 3


def test_maze_map_and_hand_worked_moves(maze):
    env, f = maze
    grid = np.asarray(tasks.MAZE_MAP)
    assert grid.shape == (13, 13)
    assert grid[0, 0] == 2 and grid[12, 12] == 3
    assert int((grid == 1).sum()) == 32
    assert (env.num_actions, env.num_features, env.num_active) == (4, 676, 1)
    assert int(f["reset"](KEY)) == 0
    assert _step(f, 0, M_UP) == (0, -1.0, False)  # edge
    assert _step(f, 0, M_LEFT) == (0, -1.0, False)  # edge
    assert _step(f, 0, M_RIGHT) == (1, -1.0, False)
    assert _step(f, 0, M_DOWN) == (13, -1.0, False)
    assert _step(f, 1, M_RIGHT) == (1, -1.0, False)  # (0, 2) is a wall
    assert _step(f, 15, M_UP) == (15, -1.0, False)  # (1, 2) up: wall at (0, 2)
    assert _step(f, 15, M_RIGHT) == (15, -1.0, False)  # (1, 3) is a wall
    assert _step(f, 15, M_DOWN) == (28, -1.0, False)
    assert _step(f, 166, M_LEFT) == (166, -1.0, False)  # (12, 9) is a wall
    assert _step(f, 166, M_RIGHT) == (167, -1.0, False)
    assert _step(f, 167, M_RIGHT) == (168, 0.0, True)  # into the goal
    assert _step(f, 155, M_DOWN) == (168, 0.0, True)
    assert _step(f, 168 - 13, M_RIGHT) == (155, -1.0, False)  # (11, 12) right: edge
    np.testing.assert_array_equal(np.asarray(f["active"](jnp.int32(100))), [[a * 169 + 100] for a in range(4)])


def test_maze_shortest_path_under_the_task_dynamics(maze):
    # Breadth-first search over the task's own step function: every free cell
    # is reachable and the goal is 26 steps from the start.
    _, f = maze
    states = jnp.arange(169, dtype=jnp.int32)
    table = np.stack([np.asarray(jax.vmap(lambda s, a=a: f["step"](KEY, s, jnp.int32(a))[0])(states))
                      for a in range(4)], axis=1)
    dist = {0: 0}
    q = deque([0])
    while q:
        s = q.popleft()
        for ns in table[s]:
            if int(ns) not in dist:
                dist[int(ns)] = dist[s] + 1
                q.append(int(ns))
    assert dist[168] == 26
    assert len(dist) == 169 - 32


# --------------------------------------------------------------- tile coder

def test_tile_coder_hand_worked_1d():
    # [0, 1], 4 tiles of width 0.25, 3 tilings offset by k * 0.25 / 3, k = -1, 0, 1:
    # edges (1/6, 5/12, 2/3), (1/4, 1/2, 3/4), (1/3, 7/12, 5/6).
    f = jax.jit(lambda x: tiles.tile_indices(x, [0.0], [1.0], 4, 3))
    cases = {0.3: [1, 5, 8], -5.0: [0, 4, 8], 0.9: [3, 7, 11], 0.5: [2, 6, 9], 7.0: [3, 7, 11],
             0.25: [1, 5, 8], 0.1: [0, 4, 8]}
    for x, expect in cases.items():
        np.testing.assert_array_equal(np.asarray(f(jnp.array([x], jnp.float32))), expect, err_msg=str(x))
    assert tiles.num_tiles(4, 1, 3) == 12
    np.testing.assert_array_equal(tiles.tiling_offsets(5), [-2, -1, 0, 1, 2])


def test_tile_coder_hand_worked_2d():
    # low (0, -1), high (2, 1), bins (2, 4), 2 tilings (k = 0, 1), offset units
    # (0.5, 0.25): tiling 0 edges [1] x [-0.5, 0, 0.5], tiling 1 [1.5] x [-0.25, 0.25, 0.75];
    # index = t * 8 + c0 * 4 + c1.
    f = jax.jit(lambda x: tiles.tile_indices(x, [0.0, -1.0], [2.0, 1.0], (2, 4), 2))
    assert tiles.num_tiles((2, 4), 2, 2) == 16
    for x, expect in {(1.2, 0.3): [6, 10], (1.7, -0.9): [4, 12], (0.1, 0.9): [3, 11],
                      (1.0, 0.0): [6, 9]}.items():
        np.testing.assert_array_equal(np.asarray(f(jnp.array(x, jnp.float32))), expect, err_msg=str(x))


# An independent NumPy transcription of the authors' TileCoder_action with the
# tilings of their main.py files (float64 edges from float32 bounds, as NumPy
# 1.24 computes them), numbering codewords in the order they are first met.
class AuthorsTileCoder:
    def __init__(self, low, high, bins, unit, num_tilings=5):
        self.grids = []
        for t in range(num_tilings):
            k = t - num_tilings // 2
            shift = (k * unit).astype(np.float64)
            self.grids.append([np.linspace(np.float64(lo), np.float64(hi), b + 1)[1:-1] + s
                               for lo, hi, b, s in zip(low, high, bins, shift)])
        self.codebook = {}

    def codewords(self, x):
        return [(t,) + tuple(int(np.digitize(np.float64(v), g)) for v, g in zip(x, grid))
                for t, grid in enumerate(self.grids)]

    def features(self, x, action):
        out = []
        for cw in self.codewords(x):
            out.append(self.codebook.setdefault(cw + (action,), len(self.codebook)))
        return out


MC_LOW, MC_HIGH = np.array([-1.2, -0.07], np.float32), np.array([0.6, 0.07], np.float32)
AC_HIGH = np.array([1.0, 1.0, 1.0, 1.0, 4 * np.pi, 9 * np.pi], np.float32)


def _tile_cases():
    mc_unit = (MC_HIGH - MC_LOW) / np.float32(5 * 20)  # float32, Mountain_Car/main.py
    ac_unit = np.float64((2 * AC_HIGH) / np.float32(5)) / 5.0  # float64, Acrobot/main.py
    return {"mountain_car": (MC_LOW, MC_HIGH, (20, 20), mc_unit),
            "acrobot": (-AC_HIGH, AC_HIGH, (5,) * 6, ac_unit)}


def _samples(ref, low, high, rng, n=400):
    d = low.shape[0]
    span = high - low
    xs = [rng.uniform(low - 0.1 * span, high + 0.1 * span, size=(n, d)).astype(np.float32)]
    near = rng.uniform(low, high, size=(n, d)).astype(np.float32)
    for j in range(n):  # one coordinate on or next to an edge
        i = rng.integers(d)
        e = np.float32(rng.choice(ref.grids[rng.integers(len(ref.grids))][i]))
        near[j, i] = [e, np.nextafter(e, np.float32(np.inf)), np.nextafter(e, np.float32(-np.inf))][j % 3]
    xs.append(near)
    return np.concatenate(xs)


@pytest.mark.parametrize("task", ["mountain_car", "acrobot"])
def test_tile_coder_equals_the_authors_scheme(task):
    low, high, bins, unit = _tile_cases()[task]
    ref = AuthorsTileCoder(low, high, bins, unit)
    rng = np.random.default_rng(1)
    xs = _samples(ref, low, high, rng)
    offset_unit = None if task == "mountain_car" else unit  # mountain_car's is the default rule
    f = jax.jit(jax.vmap(lambda x: tiles.tile_indices(x, low, high, bins, 5, offset_unit=offset_unit)))
    ours = np.asarray(f(jnp.asarray(xs)))
    per_tiling = int(np.prod(bins))
    per_action = tiles.num_tiles(bins, len(bins), 5)
    assert per_action == 5 * per_tiling
    # Same codewords: our index is the row-major flattening of (tiling, coordinates).
    expect = np.array([[cw[0] * per_tiling + np.ravel_multi_index(cw[1:], bins) for cw in ref.codewords(x)]
                       for x in xs])
    np.testing.assert_array_equal(ours, expect)
    # The authors' first-met numbering is a one-to-one relabelling of ours (with actions).
    theirs_to_ours, ours_to_theirs = {}, {}
    for x, idx in zip(xs, ours):
        for a in range(3):
            for theirs, mine in zip(ref.features(x, a), idx + a * per_action):
                assert theirs_to_ours.setdefault(theirs, int(mine)) == mine
                assert ours_to_theirs.setdefault(int(mine), theirs) == theirs
    assert len(ref.codebook) <= 3 * per_action  # their `features` (6000 / 234375) never overflows


@pytest.mark.parametrize("task", ["mountain_car", "acrobot"])
def test_task_tilings_are_the_authors(task):
    # The tasks' tilings (bounds, bins, offsets) give the authors' edges bit for bit.
    low, high, bins, unit = _tile_cases()[task]
    ref = AuthorsTileCoder(low, high, bins, unit)
    t_low, t_high, t_bins, t_unit = tasks.tiling(task)
    assert t_bins == bins
    np.testing.assert_array_equal(t_low, low)
    np.testing.assert_array_equal(t_high, high)
    edges = tiles.tiling_edges(t_low, t_high, t_bins, 5, t_unit)
    for t in range(5):
        for i in range(len(bins)):
            np.testing.assert_array_equal(edges[t][i], ref.grids[t][i], err_msg=f"tiling {t} dim {i}")


def test_tile_coder_jit_vmap_loop_agree_and_in_range():
    low, high, bins, unit = _tile_cases()["acrobot"]
    xs = np.random.default_rng(2).uniform(1.2 * low, 1.2 * high, size=(64, 6)).astype(np.float32)
    fn = lambda x: tiles.tile_indices(x, low, high, bins, 5, offset_unit=unit)
    loop = np.stack([np.asarray(fn(jnp.asarray(x))) for x in xs[:8]])
    jitted = np.stack([np.asarray(jax.jit(fn)(jnp.asarray(x))) for x in xs[:8]])
    vmapped = np.asarray(jax.jit(jax.vmap(fn))(jnp.asarray(xs)))
    np.testing.assert_array_equal(loop, jitted)
    np.testing.assert_array_equal(loop, vmapped[:8])
    assert vmapped.dtype == np.int32 and vmapped.shape == (64, 5)
    per_tiling = 5**6
    t = np.arange(5)
    assert np.all(vmapped >= t * per_tiling) and np.all(vmapped < (t + 1) * per_tiling)
    assert np.all(vmapped < tiles.num_tiles(5, 6, 5))


def test_tile_coder_odd_inputs():
    f = jax.jit(lambda x: tiles.tile_indices(x, [0.0], [1.0], 4, 3))
    np.testing.assert_array_equal(np.asarray(f(jnp.array([np.inf], jnp.float32))), [3, 7, 11])
    np.testing.assert_array_equal(np.asarray(f(jnp.array([-np.inf], jnp.float32))), [0, 4, 8])
    np.testing.assert_array_equal(np.asarray(f(jnp.array([np.nan], jnp.float32))), [3, 7, 11])  # np.digitize
    minus_nan = np.copysign(np.float32(np.nan), np.float32(-1))
    assert np.signbit(minus_nan) and np.digitize(minus_nan, [0.5]) == 1
    np.testing.assert_array_equal(np.asarray(f(jnp.array([minus_nan], jnp.float32))), [3, 7, 11])
    # A subnormal just below an edge at 0 stays below it (XLA would flush it to 0).
    g = jax.jit(lambda x: tiles.tile_indices(x, [-1.0], [1.0], 2, 1))
    tiny = np.nextafter(np.float32(0), np.float32(-1))
    assert int(g(jnp.array([tiny]))[0]) == int(np.digitize(np.float64(tiny), [0.0])) == 0
    assert int(g(jnp.array([-0.0], jnp.float32))[0]) == 1
    with pytest.raises(ValueError, match="bins"):
        tiles.tile_indices(jnp.zeros(2), [0.0, 0.0], [1.0, 1.0], (2, 2, 2), 1)
    with pytest.raises(ValueError, match="num_tilings"):
        tiles.num_tiles(4, 1, 0)
    with pytest.raises(ValueError, match="low, high"):
        tiles.tile_indices(jnp.zeros(1), [1.0], [0.0], 4, 1)


# ------------------------------------------------------------ MountainCar

def _ulp_equal(ours, theirs):
    np.testing.assert_array_max_ulp(np.asarray(ours, np.float32), np.asarray(theirs, np.float32), maxulp=2)


def _gymnasium_mountain_car(pos, vel, action):
    """Gymnasium's MountainCar-v0 step, transcribed (float64 state)."""
    vel = vel + (action - 1) * 0.001 + np.cos(3 * pos) * (-0.0025)
    vel = np.clip(vel, -0.07, 0.07)
    pos = np.clip(pos + vel, -1.2, 0.6)
    if pos == -1.2 and vel < 0:
        vel = 0.0
    return pos, vel, -1.0, bool(pos >= 0.5 and vel >= 0.0)


MC_STATES = [(-0.5, 0.0), (-1.19, -0.02), (-1.2, -0.07), (0.49, 0.02), (0.499, 0.0005), (0.3, 0.069),
             (-0.9, 0.03), (0.59, 0.07), (0.45, -0.01)]


def _mc_state(env_module_state, pos, vel, time=0):
    return env_module_state(position=jnp.float32(pos), velocity=jnp.float32(vel), time=jnp.int32(time))


def test_mountain_car_equals_gymnax_numpy_and_gymnasium(mountain_car):
    gymnax = pytest.importorskip("gymnax")
    from gymnax.environments.classic_control.mountain_car import EnvState
    env, f = mountain_car
    assert (env.num_actions, env.num_features, env.num_active, env.max_episode_steps) == (3, 6000, 5, 1000)
    genv, gparams = gymnax.make("MountainCar-v0")
    gstep = jax.jit(lambda st, a: genv.step_env(KEY, st, a, gparams))
    try:
        import gymnasium
        gym_env = gymnasium.make("MountainCar-v0").unwrapped
        gym_env.reset(seed=0)
    except ImportError:
        gym_env = None
    terminals = 0
    for pos, vel in MC_STATES:
        s = _mc_state(EnvState, pos, vel, time=5)
        for a in range(3):
            ns, r, t = f["step"](KEY, s, jnp.int32(a))
            _, gs, gr, gdone, _ = gstep(s, jnp.int32(a))
            # Equal up to float32 rounding of differently fused programs (bit-equal on CPU).
            _ulp_equal([ns.position, ns.velocity], [gs.position, gs.velocity])
            assert float(r) == float(gr) == -1.0 and bool(t) == bool(gdone)
            assert int(ns.time) == 6
            p32, v32 = np.float32(pos), np.float32(vel)
            ep, ev, er, et = _gymnasium_mountain_car(np.float64(p32), np.float64(v32), a)
            np.testing.assert_allclose([float(ns.position), float(ns.velocity)], [ep, ev], atol=2e-7)
            assert bool(t) == et and float(r) == er
            terminals += et
            if gym_env is not None:
                gym_env.state = np.array([p32, v32], dtype=np.float64)
                obs, gr2, term2, trunc2, _ = gym_env.step(a)
                np.testing.assert_allclose(obs, [float(ns.position), float(ns.velocity)], atol=2e-7)
                assert (gr2, term2, trunc2) == (-1.0, bool(t), False)
    assert terminals >= 3  # the goal is reached from some of these states


def test_mountain_car_zero_velocity_at_the_goal_is_terminal(mountain_car):
    from gymnax.environments.classic_control.mountain_car import EnvState
    env, _ = mountain_car
    pos = jnp.float32(0.55)
    # With action 1 the new velocity is vel - cos(3 pos) * 0.0025: zero for this vel.
    # Op by op (not jitted: XLA may fuse the product into a fused multiply-add).
    vel = jnp.cos(3 * pos) * 0.0025
    ns, r, t = env.step(KEY, _mc_state(EnvState, pos, vel), jnp.int32(1))
    if float(ns.velocity) != 0.0:
        pytest.skip("this backend does not cancel the velocity exactly")
    assert float(ns.position) >= 0.5 and bool(t) and float(r) == -1.0
    ns, r, t = env.step(KEY, _mc_state(EnvState, pos, vel), jnp.int32(0))
    assert float(ns.velocity) < 0 and not bool(t)


def test_mountain_car_no_time_limit_and_features(mountain_car):
    from gymnax.environments.classic_control.mountain_car import EnvState
    _, f = mountain_car
    s = _mc_state(EnvState, -0.5, 0.01, time=10**6)  # far past gymnax's 200 steps
    ns, r, t = f["step"](KEY, s, jnp.int32(2))
    assert float(r) == -1.0 and not bool(t) and abs(float(ns.position) - (-0.5 + float(ns.velocity))) < 1e-6
    assert int(ns.time) == 10**6 + 1
    act = np.asarray(f["active"](s))
    expect = np.asarray(tiles.tile_indices(jnp.array([-0.5, 0.01], jnp.float32), MC_LOW, MC_HIGH, 20, 5))
    np.testing.assert_array_equal(act, expect[None, :] + 2000 * np.arange(3)[:, None])
    s0 = f["reset"](jax.random.PRNGKey(3))
    assert -0.6 <= float(s0.position) <= -0.4 and float(s0.velocity) == 0.0 and int(s0.time) == 0


# ----------------------------------------------------------------- Acrobot

def test_acrobot_equals_gymnax_and_gymnasium(acrobot):
    gymnax = pytest.importorskip("gymnax")
    from gymnax.environments.classic_control.acrobot import EnvState
    env, f = acrobot
    assert (env.num_actions, env.num_features, env.num_active, env.max_episode_steps) == (3, 234375, 5, 500)
    genv, gparams = gymnax.make("Acrobot-v1")
    gstep = jax.jit(lambda st, a: genv.step_env(KEY, st, a, gparams))
    try:
        import gymnasium
        gym_env = gymnasium.make("Acrobot-v1").unwrapped
        gym_env.reset(seed=0)
    except ImportError:
        gym_env = None
    rng = np.random.default_rng(4)
    states = [rng.uniform([-np.pi, -np.pi, -4, -9], [np.pi, np.pi, 4, 9]) for _ in range(6)]
    states += [np.array([np.pi - 0.1, 0.05, 0.5, 0.5]), np.array([0.0, 0.0, 0.0, 0.0]),
               np.array([2.8, 0.3, 2.0, 1.0])]
    # Tip heights just above and just below 1 after the step (-2 cos(theta1) with theta2 = 0).
    states += [np.array([th, 0.0, 0.0, 0.0]) for th in (2.14, 2.15, 2.16, 2.17, 2.2)]
    heights = []
    terminals = 0
    for st in states:
        s = EnvState(joint_angle1=jnp.float32(st[0]), joint_angle2=jnp.float32(st[1]),
                     velocity_1=jnp.float32(st[2]), velocity_2=jnp.float32(st[3]), time=jnp.int32(499))
        for a in range(3):
            ns, r, t = f["step"](KEY, s, jnp.int32(a))
            _, gs, gr, gdone, _ = gstep(s, jnp.int32(a))
            fields = ("joint_angle1", "joint_angle2", "velocity_1", "velocity_2")
            _ulp_equal([getattr(ns, k) for k in fields], [getattr(gs, k) for k in fields])
            assert bool(t) == bool(gdone) and float(r) == float(gr) == (0.0 if bool(t) else -1.0)
            assert int(ns.time) == 500  # gymnax's 500-step limit did not reset it
            th1, th2 = float(ns.joint_angle1), float(ns.joint_angle2)
            height = -np.cos(th1) - np.cos(th1 + th2)
            heights.append(height)
            if abs(height - 1.0) > 1e-5:
                assert bool(t) == (height > 1.0)
            terminals += bool(t)
            if gym_env is not None:
                gym_env.state = np.array(st, dtype=np.float32).astype(np.float64)
                obs, gr2, term2, trunc2, _ = gym_env.step(a)
                th1, th2 = float(ns.joint_angle1), float(ns.joint_angle2)
                ours = [np.cos(th1), np.sin(th1), np.cos(th2), np.sin(th2), float(ns.velocity_1),
                        float(ns.velocity_2)]
                np.testing.assert_allclose(obs, ours, atol=2e-4, rtol=1e-4)
                assert (gr2, term2, trunc2) == (float(r), bool(t), False)
    assert terminals >= 2
    heights = np.array(heights)
    assert np.any((heights > 1.0) & (heights < 1.005)) and np.any((heights < 1.0) & (heights > 0.995))


def test_acrobot_features_use_the_six_dim_observation(acrobot):
    from gymnax.environments.classic_control.acrobot import EnvState
    _, f = acrobot
    s = EnvState(joint_angle1=jnp.float32(0.3), joint_angle2=jnp.float32(-1.0), velocity_1=jnp.float32(2.0),
                 velocity_2=jnp.float32(-5.0), time=jnp.int32(0))
    obs = jnp.stack([jnp.cos(s.joint_angle1), jnp.sin(s.joint_angle1), jnp.cos(s.joint_angle2),
                     jnp.sin(s.joint_angle2), s.velocity_1, s.velocity_2])
    low, high, bins, unit = _tile_cases()["acrobot"]
    ref = AuthorsTileCoder(low, high, bins, unit)
    expect = [cw[0] * 5**6 + np.ravel_multi_index(cw[1:], bins) for cw in ref.codewords(np.asarray(obs))]
    np.testing.assert_array_equal(np.asarray(f["active"](s)), np.asarray(expect)[None, :]
                                  + 78125 * np.arange(3)[:, None])


# ------------------------------------------------- all tasks: jit, vmap, scan

@pytest.mark.parametrize("fixture", ["cliff", "maze", "mountain_car", "acrobot"])
def test_jit_vmap_shapes_and_scan(fixture, request):
    env, f = request.getfixturevalue(fixture)
    keys = jax.random.split(KEY, 3)
    s = f["vreset"](keys)
    ns, r, t = f["vstep"](keys, s, jnp.array([0, 1, 2], jnp.int32))
    act = f["vactive"](ns)
    assert r.shape == (3,) and r.dtype == jnp.float32
    assert t.shape == (3,) and t.dtype == jnp.bool_
    assert act.shape == (3, env.num_actions, env.num_active) and act.dtype == jnp.int32
    assert np.all(np.asarray(act) >= 0) and np.all(np.asarray(act) < env.num_features)
    assert jax.tree.structure(ns) == jax.tree.structure(s)
    for a, b in zip(jax.tree.leaves(s), jax.tree.leaves(ns)):
        assert a.dtype == b.dtype and a.shape == b.shape
    # The state's pytree types are stable: a scan carries it through steps.
    def body(state, key):
        nxt, rew, term = env.step(key, state, jnp.int32(1))
        return nxt, (rew, term, env.active(nxt))
    final, (rews, terms, acts) = jax.jit(lambda k: jax.lax.scan(body, env.reset(k), jax.random.split(k, 5)))(KEY)
    assert rews.shape == (5,) and acts.shape == (5, env.num_actions, env.num_active)
    assert terms.dtype == jnp.bool_ and jax.tree.structure(final) == jax.tree.structure(s)
    assert env.num_features == env.num_actions * (env.num_features // env.num_actions)


# ---------------------------------------------------------------- registry

def test_registry_and_errors(monkeypatch):
    assert tasks.names() == ["acrobot", "cliff_walking", "maze", "mountain_car"]
    with pytest.raises(ValueError, match="task: unknown control task 'pong'"):
        tasks.make("pong")
    with pytest.raises(ValueError, match="bins: not a parameter of cliff_walking"):
        tasks.make("cliff_walking", bins=3)
    with pytest.raises(ValueError, match="gamma"):
        tasks.make("maze", gamma=1.5)
    with pytest.raises(ValueError, match="max_episode_steps"):
        tasks.make("maze", max_episode_steps=0)
    env = tasks.make("maze", gamma=0.9, max_episode_steps=50)
    assert (env.gamma, env.max_episode_steps, env.params) == (0.9, 50, {"gamma": 0.9, "max_episode_steps": 50})
    rebuilt = tasks.make(env.name, **env.params)
    assert (rebuilt.gamma, rebuilt.max_episode_steps) == (0.9, 50)
    # Without gymnax the tile-coded tasks say how to get it.
    monkeypatch.setitem(sys.modules, "gymnax", None)
    with pytest.raises(ImportError, match=r'mountain_car needs gymnax: pip install -e "\.\[control\]"'):
        tasks.make("mountain_car")
    with pytest.raises(ImportError, match="acrobot needs gymnax"):
        tasks.make("acrobot")
    # A spec names the field: the command line's one line, not a traceback.
    with pytest.raises(ValueError, match=r'^task: mountain_car needs gymnax: pip install -e "\.\[control\]"$'):
        ControlSpec(task="mountain_car", algorithm="q", hyperparameters={"alpha": 0.1})



def test_tasks_register_where_defined_and_users_register_theirs():
    # Every public factory of the module that builds a ControlEnv is registered
    # by its decorator under its own name, with no list to edit.
    tree = ast.parse(open(tasks.__file__).read())
    decorated = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                 and any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "register" for d in n.decorator_list)}
    assert decorated == set(tasks.names()) and all(tasks.TASKS[n] is getattr(tasks, n) for n in decorated)

    def small_maze(*, gamma=0.5):
        return tasks.maze(gamma=gamma, max_episode_steps=20)

    try:
        assert tasks.register("small_maze_test", small_maze) is small_maze
        assert "small_maze_test" in tasks.names()
        env = tasks.make("small_maze_test")
        assert (env.gamma, env.max_episode_steps) == (0.5, 20)
        with pytest.raises(ValueError, match="'maze' is already registered"):
            tasks.register("maze", small_maze)
        with pytest.raises(ValueError, match="without ':'"):
            tasks.register("a:b", small_maze)
        deco = tasks.register("small_maze_test2")(small_maze)  # the decorator form
        assert deco is small_maze and tasks.TASKS["small_maze_test2"] is small_maze
    finally:
        tasks.TASKS.pop("small_maze_test", None)
        tasks.TASKS.pop("small_maze_test2", None)
    assert tasks.names() == ["acrobot", "cliff_walking", "maze", "mountain_car"]


def test_a_task_of_ones_own_module_by_reference(tmp_path, monkeypatch):
    from bec_jax.control import sweep
    from bec_jax.control.spec import ControlSpec
    (tmp_path / "my_tasks_test.py").write_text(
        "from bec_jax.control import tasks\n"
        "def short_cliff(*, gamma=1.0, max_episode_steps=30):\n"
        "    return tasks.cliff_walking(gamma=gamma, max_episode_steps=max_episode_steps)\n"
        "NOT_ONE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = tasks.make("my_tasks_test:short_cliff", gamma=0.9)
    assert (env.gamma, env.max_episode_steps) == (0.9, 30) and "my_tasks_test:short_cliff" not in tasks.names()
    with pytest.raises(ValueError, match="bins: not a parameter of my_tasks_test:short_cliff"):
        tasks.make("my_tasks_test:short_cliff", bins=3)
    with pytest.raises(ValueError, match="task: 'my_tasks_test:NOT_ONE' is a int, not a task factory"):
        ControlSpec(task="my_tasks_test:NOT_ONE", algorithm="q", hyperparameters={"alpha": [0.1]})
    # It runs as the registered task with the same parameters does, bit for bit.
    kw = dict(algorithm="q", hyperparameters={"alpha": [0.1]}, seeds=2, episodes=4)
    a = sweep.run(ControlSpec(task="my_tasks_test:short_cliff", **kw), progress=False)
    b = sweep.run(ControlSpec(task="cliff_walking", task_params={"gamma": 1.0, "max_episode_steps": 30}, **kw),
                  progress=False)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.returns, b.returns)


def test_tiled_task_parameters():
    pytest.importorskip("gymnax")
    env = tasks.make("mountain_car", num_tilings=3, bins=(10, 8))
    assert (env.num_features, env.num_active) == (3 * 3 * 80, 3)
    assert env.params == {"gamma": 0.99, "max_episode_steps": 1000, "num_tilings": 3, "bins": [10, 8]}
    with pytest.raises(ValueError, match="num_tilings"):
        tasks.make("acrobot", num_tilings=0)
    with pytest.raises(ValueError, match="bins"):
        tasks.make("acrobot", bins=(5, 5))
    with pytest.raises(ValueError, match="bins"):
        tasks.make("mountain_car", bins=0)


# ---------------------------------------------------------------- any gymnax environment

def _rollout(env, steps, epsilon, cap=None):
    """One run of `steps` loop steps on `env` with a learner that only records
    each transition's discount: (discount, done, t after the step, the gymnax
    state before the step and after it, before any reset) per step, and the
    episode log."""
    from bec_jax.control import loop
    cap = cap or env.max_episode_steps
    beh = loop.Behaviour(epsilon)
    zeros = jnp.zeros(env.num_features)

    def one(c, t):
        ls, log = c
        key = jax.random.fold_in(KEY, t)
        disc, ls2, log, done = loop.advance(env, lambda _, tr: tr.discount, lambda _: zeros, beh, cap, env.gamma,
                                            jnp.float32(0), ls, log, key)
        return (loop.reset_done(env, ls2, done, key), log), (disc, done, ls2.t, ls.env.env, ls2.env.env)

    @jax.jit
    def run():
        c0 = (loop.loop_init(env, KEY), loop.log_init(8))
        return jax.lax.scan(one, c0, jnp.arange(steps))

    (_, log), out = run()
    return out, log


def test_gymnax_time_limit_is_a_truncation_that_bootstraps():
    """MountainCar-v0's 200-step time limit: gymnax's own `step` reports it as
    truncated; the task learns that transition with gamma, ends the episode
    there (the loop's cap is the limit) and starts the next one."""
    gymnax = pytest.importorskip("gymnax")
    env = tasks.make("gymnax:MountainCar-v0", features="tiles", num_tilings=2, bins=4)
    assert env.max_episode_steps == 200 and env.params["max_episode_steps"] == 200
    (disc, done, t, gstate, _), log = _rollout(env, 205, epsilon=1.0)
    disc, done, t = np.asarray(disc), np.asarray(done), np.asarray(t)
    # A random policy does not reach the goal in 200 steps: no true termination.
    np.testing.assert_array_equal(disc, np.float32(0.99))
    assert np.flatnonzero(done).tolist() == [199] and t[199] == 200
    assert np.asarray(log.lengths)[0] == 200 and np.asarray(log.returns)[0] == -200
    # The transition out of step 199's state is, for gymnax itself, the time limit.
    g_env, g_params = gymnax.make("MountainCar-v0")
    before = jax.tree.map(lambda x: x[199], gstate)
    _, _, _, terminated, truncated, _ = g_env.step(KEY, before, 0, g_params)
    assert bool(truncated) and not bool(terminated)
    assert t[200] == 1  # a new episode


def test_gymnax_true_termination_is_terminal():
    """CartPole-v1 under a random policy: every episode ends by termination
    (the pole falls) long before the 500-step limit, with discount 0 on that
    transition and gymnax's `is_terminated` true after it."""
    gymnax = pytest.importorskip("gymnax")
    env = tasks.make("gymnax:CartPole-v1", features="fourier", order=1, low=-3, high=3)
    assert env.max_episode_steps == 500 and env.num_features == 2 * 16
    (disc, done, t, _, after), log = _rollout(env, 120, epsilon=1.0)
    disc, done = np.asarray(disc), np.asarray(done)
    ends = np.flatnonzero(done)
    assert len(ends) >= 3
    np.testing.assert_array_equal(disc[ends], 0.0)
    np.testing.assert_array_equal(np.delete(disc, ends), np.float32(0.99))
    lengths = np.asarray(log.lengths)[:len(ends)]
    np.testing.assert_array_equal(lengths, np.diff(np.concatenate([[-1], ends])))
    # Terminal exactly where gymnax's own termination condition holds.
    g_env, g_params = gymnax.make("CartPole-v1")
    term = jax.vmap(lambda s: g_env.is_terminated(s, g_params))(after)
    np.testing.assert_array_equal(np.asarray(term), done)


def test_gymnax_task_parameters_and_errors():
    pytest.importorskip("gymnax")
    env = tasks.make("gymnax:MountainCar-v0", features="rbf", centers=3, max_episode_steps=50, gamma=0.9)
    assert (env.num_actions, env.num_features, env.num_active, env.max_episode_steps, env.gamma) == (
        3, 27, 27, 50, 0.9)
    rebuilt = tasks.make(env.name, **env.params)
    assert rebuilt.params == env.params and rebuilt.num_features == 27
    s = env.reset(KEY)
    f = np.asarray(env.features(s))
    assert f.shape == (3, 27) and f.dtype == np.float32
    assert np.all(f[0, 9:] == 0) and np.all(f[1, :9] == 0) and np.all(f[1, 18:] == 0)
    np.testing.assert_array_equal(f[0, :9], f[2, 18:])
    for kw, msg in [
        ({}, "^low: the observation space is unbounded in dimension\\(s\\) 1, 3"),
        ({"features": "nope", "low": -1, "high": 1}, "^features: unknown feature map 'nope'"),
        ({"features": "fourier", "bins": 3, "low": -1, "high": 1}, "^bins: not a parameter of features 'fourier'"),
        ({"features": "fourier", "order": -1, "low": -1, "high": 1}, "^order: an integer >= 0"),
        ({"features": "tiles", "low": "1 2", "high": 3}, "^low: a number or 4 numbers"),
        ({"features": "tiles", "low": 1, "high": 1}, "^high: must exceed low"),
        ({"features": "fourier", "order": 40, "low": -1, "high": 1}, "^order: 41\\^4"),
        ({"features": "rbf", "sigma": 0, "low": -1, "high": 1}, "^sigma: a number > 0"),
        ({"features": "tiles", "low": -1, "high": 1, "max_episode_steps": 0}, "^max_episode_steps"),
    ]:
        with pytest.raises(ValueError, match=msg):
            tasks.make("gymnax:CartPole-v1", **kw)
    with pytest.raises(ValueError, match="^task: unknown gymnax environment 'Nope'; known: CartPole-v1"):
        tasks.factory("gymnax:Nope")
    with pytest.raises(ValueError, match="^task: gymnax:Pendulum-v1 has a continuous action space"):
        tasks.make("gymnax:Pendulum-v1")


def test_the_worked_gridworld_runs_from_the_command_line(tmp_path, monkeypatch):
    """examples/gridworld.py, as its docstring runs it from the repository root
    (examples.gridworld is found in the current directory; the README's
    quickstart runs it through the installed script, tests/test_control_features):
    every greedy run learns the 6-step shortest path of a 4x4 grid."""
    import json
    import os

    from bec_jax.cli.commands import main
    from bec_jax.control.results import ControlResult
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "grid"
    assert main(["control", "--task", "examples.gridworld:make_gridworld", "--task-param", "size=4",
                 "--algorithm", "cq", "--alpha", "0.5", "--beta", "0.01", "--episodes", "30", "--seeds", "2",
                 "--epsilon", "0", "--out", str(out)]) == 0
    r = ControlResult.load(str(out))
    # Greedy from zero weights with -1 rewards is optimistic: the early episodes
    # explore, the last ones take the shortest path.
    assert r.lengths.shape == (1, 2, 30) and np.all(r.lengths[..., -5:] == 6) and np.all(r.lengths >= 6)
    assert r.lengths[..., 0].min() > 6
    assert json.load(open(out / "meta.json"))["spec"]["task_params"] == {"size": 4}
