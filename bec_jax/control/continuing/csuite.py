"""csuite's continuing tasks in JAX: Catch, Windy Catch, Dancing Catch, Pendulum, Taxi.

Written from the definitions in DeepMind's csuite (github.com/google-deepmind/
csuite, commit b74faed74685dc852d43c2022150c4186c244929, Apache-2.0), files
`csuite/environments/catch.py`, `windy_catch.py`, `dancing_catch.py`,
`pendulum.py` and `taxi.py`; not a copy of its code. There are no episodes:
`reset` once, then `step` forever (`bec_jax.control.continuing.env`). Each
factory's keyword parameters are csuite's, with its defaults. Access-Control
is in `bec_jax.control.continuing.tabular`.

Catch: one step, in csuite's order,

  1. the paddle (bottom row) moves by action - 1 (left, stay, right), clipped
     at the walls;
  2. every ball falls one row (Windy Catch: and moves one column with the wind,
     wrapping around, before landing);
  3. a ball that reaches the paddle's row gives +1 if it is in the paddle's
     column, else -1, and is removed;
  4. a new ball appears in row 0, in a uniform column, with probability
     `spawn_probability`;
  5. Windy Catch: every `change_every` steps the wind is redrawn uniformly from
     (none, left, right); Dancing Catch: every `swap_every` steps two uniformly
     drawn entries of the observation's permutation are swapped.

The run starts with the paddle in column `columns // 2` and one ball in row 0
of a uniform column (the wind: none; the permutation: the identity). csuite's
class docstring says a ball is always added when one lands; its code does not,
and we follow the code.

State: at most one ball enters per step and all fall together, so each row
holds at most one ball, and a ball never stays in the paddle's row. The balls
are a fixed-shape array `balls` (rows - 1,) int32: the column of the ball in
row i, or -1 for none.

Catch's features (`features=`), one block of weights per action
(`features.per_action`):

  tiles   (default for Catch and Windy Catch) Naik et al.'s choice for Catch
          (Reward Centering, RLC 2024: 16 tilings of 3 x 3 x 3): tile coding
          (`bec_jax.control.tiles`) of (paddle column, column and row of the
          lowest ball), the ball a linear learner must catch next. With no
          ball on the board the ball is put one row above the top, in the
          paddle's column. Windy Catch keeps one tile coder per wind direction,
          since the wind decides where the ball lands.
  onehot  an exact one-hot of the same (paddle, lowest ball) abstraction (and
          the wind): one active index, a table over cols * (cols * (rows - 1) +
          1) cells per action (x 3 with wind).
  board   csuite's own observation, the binary board (rows * cols), dense:
          Windy Catch adds its three wind bits, Dancing Catch permutes it (the
          point of that task, so it is Dancing Catch's only kind).

Pendulum (`pendulum`): deterministic swing-up with three torques and csuite's
sparse reward, tile-coded (cos, sin, velocity); `pendulum(**NAIK_PENDULUM)` is
Naik et al.'s variant (friction 0.3, torques x 2, a dense reward). Taxi
(`taxi`): tabular, with its exact model (`taxi_model`).
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax.control import tiles
from bec_jax.control.continuing.env import ContinuingEnv, finite_number, positive_int, probability
from bec_jax.control.features import per_action

CSUITE_COMMIT = "b74faed74685dc852d43c2022150c4186c244929"
NUM_ACTIONS = 3  # left, stay, right
FEATURE_KINDS = ("tiles", "onehot", "board")


class CatchState(NamedTuple):
    """Catch's state: `paddle` () int32 column; `balls` (rows - 1,) int32, the
    column of the ball in row i (0 at the top) or -1."""

    paddle: jax.Array
    balls: jax.Array


class WindyState(NamedTuple):
    """Windy Catch's state: the board, `wind` () int32 (0 none, 1 left, 2 right,
    csuite's order) and `clock` () int32 steps since the wind last changed."""

    board: CatchState
    wind: jax.Array
    clock: jax.Array


class DancingState(NamedTuple):
    """Dancing Catch's state: the board, `perm` (rows * cols,) int32 (the
    observation is board.ravel()[perm]) and `clock` () int32 steps since the
    last swap."""

    board: CatchState
    perm: jax.Array
    clock: jax.Array


def _sizes(rows, columns, spawn_probability) -> tuple[int, int, float]:
    # One row is the paddle's: with one row balls would never land; with one
    # column there is nothing to learn (and no tile coding of a point).
    for field, value in (("rows", rows), ("columns", columns)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 2:
            raise ValueError(f"{field}: an integer >= 2, got {value!r}")
    return int(rows), int(columns), probability("spawn_probability", spawn_probability)


def _kind(features: str, allowed=FEATURE_KINDS) -> str:
    if features not in allowed:
        raise ValueError(f"features: one of {', '.join(allowed)}, got {features!r}")
    return features


def _reset_board(key, rows: int, columns: int) -> CatchState:
    balls = jnp.full((rows - 1,), -1, jnp.int32).at[0].set(jax.random.randint(key, (), 0, columns, jnp.int32))
    return CatchState(paddle=jnp.int32(columns // 2), balls=balls)


def fall(key, board: CatchState, action, columns: int, spawn_probability: float, wind_delta=0):
    """One Catch step of `board` (module docstring, steps 1-4; csuite's
    `catch.py` `Catch.step`, `windy_catch.py` for `wind_delta` in {-1, 0, 1}):
    (next board, reward float32 ())."""
    paddle = jnp.clip(board.paddle + jnp.asarray(action, jnp.int32) - 1, 0, columns - 1).astype(jnp.int32)
    moved = jnp.where(board.balls >= 0, (board.balls + wind_delta) % columns, -1)
    landing = moved[-1]  # the ball that reached the paddle's row
    reward = jnp.where(landing < 0, 0.0, jnp.where(landing == paddle, 1.0, -1.0)).astype(jnp.float32)
    k_spawn, k_col = jax.random.split(key)
    spawn = jax.random.uniform(k_spawn) < spawn_probability
    new = jnp.where(spawn, jax.random.randint(k_col, (), 0, columns, jnp.int32), -1)
    balls = jnp.concatenate([new[None], moved[:-1]]).astype(jnp.int32)
    return CatchState(paddle=paddle, balls=balls), reward


def lowest_ball(board: CatchState) -> tuple[jax.Array, jax.Array]:
    """(column, row) of the lowest ball, the next to land; (paddle, -1) when
    the board has no ball (csuite's `catch.py`: the oldest ball lands first)."""
    has = board.balls >= 0
    n = board.balls.shape[0]
    row = jnp.where(jnp.any(has), n - 1 - jnp.argmax(has[::-1]), -1).astype(jnp.int32)
    col = jnp.where(row >= 0, board.balls[jnp.maximum(row, 0)], board.paddle).astype(jnp.int32)
    return col, row


def binary_board(board: CatchState, rows: int, columns: int) -> jax.Array:
    """csuite's observation: (rows * columns,) float32, 1 where the paddle or a
    ball is (row-major; csuite's `catch.py` `_get_observation`)."""
    grid = jnp.zeros((rows, columns), jnp.float32).at[rows - 1, board.paddle].set(1.0)
    r = jnp.arange(rows - 1)
    # A missing ball (-1) is written out of bounds and dropped.
    cols = jnp.where(board.balls >= 0, board.balls, columns)
    return grid.at[r, cols].set(1.0, mode="drop").reshape(-1)


def _abstract_features(kind: str, rows: int, columns: int, num_tilings: int, bins, blocks: int):
    """(k per block, fn(board, block) -> (m,) int32) for the tiles / onehot
    encoding of (paddle, lowest ball); `block` selects a copy (the wind)."""
    if kind == "onehot":
        cells = columns * (rows - 1) + 1  # ball cells, and "no ball"

        def onehot(board, block):
            col, row = lowest_ball(board)
            ball = jnp.where(row >= 0, row * columns + col, cells - 1)
            return ((block * columns + board.paddle) * cells + ball)[None].astype(jnp.int32)

        return blocks * columns * cells, onehot
    t = positive_int("num_tilings", num_tilings)
    b = tiles.bins_tuple(bins, 3)
    low = np.array([0, 0, -1], np.float32)
    high = np.array([columns - 1, columns - 1, rows - 2], np.float32)
    k = tiles.num_tiles(b, 3, t)

    def tiled(board, block):
        col, row = lowest_ball(board)
        x = jnp.stack([board.paddle, col, row]).astype(jnp.float32)
        return block * k + tiles.tile_indices(x, low, high, b, t)

    return blocks * k, tiled


def _catch_env(name, params, reset, step, features_fn, k, num_active, observe, size) -> ContinuingEnv:
    return ContinuingEnv(name=name, num_actions=NUM_ACTIONS, num_features=NUM_ACTIONS * k, num_active=num_active,
                         params=params, reset=reset, step=step, features=per_action(features_fn, k, NUM_ACTIONS),
                         observe=observe, observation_size=size)


def catch(*, rows: int = 10, columns: int = 5, spawn_probability: float = 0.1, features: str = "tiles",
          num_tilings: int = 16, bins=(3, 3, 3)) -> ContinuingEnv:
    """csuite's continuing Catch (`csuite/environments/catch.py` at commit
    b74faed; module docstring): 3 actions, rewards +1 / -1 / 0. `features`:
    tiles (`num_tilings` tilings of `bins` per dimension), onehot or board."""
    rows, columns, p = _sizes(rows, columns, spawn_probability)
    kind = _kind(features)
    params = {"rows": rows, "columns": columns, "spawn_probability": p, "features": kind,
              "num_tilings": num_tilings, "bins": bins}

    def reset(key):
        return _reset_board(key, rows, columns)

    def step(key, state, action):
        return fall(key, state, action, columns, p)

    def board(s):
        return binary_board(s, rows, columns)

    n = rows * columns
    if kind == "board":
        return _catch_env("catch", params, reset, step, board, n, 0, board, n)
    k, fn = _abstract_features(kind, rows, columns, num_tilings, bins, 1)
    params["bins"] = list(tiles.bins_tuple(bins, 3))
    return _catch_env("catch", params, reset, step, lambda s: fn(s, 0), k,
                      1 if kind == "onehot" else int(num_tilings), board, n)


# csuite's windy_catch.py `_WIND_DELTA`: none, left, right.
WIND_DELTA = (0, -1, 1)


def windy_catch(*, rows: int = 10, columns: int = 5, spawn_probability: float = 0.1, change_every: int = 100_000,
                features: str = "tiles", num_tilings: int = 16, bins=(3, 3, 3)) -> ContinuingEnv:
    """csuite's Windy Catch (`csuite/environments/windy_catch.py` at commit
    b74faed; module docstring): Catch whose balls drift one column per step
    (wrapping) with a wind redrawn every `change_every` steps; the wind is
    observed. `features` as in `catch`, each kind with the wind."""
    rows, columns, p = _sizes(rows, columns, spawn_probability)
    change_every = positive_int("change_every", change_every)
    kind = _kind(features)
    params = {"rows": rows, "columns": columns, "spawn_probability": p, "change_every": change_every,
              "features": kind, "num_tilings": num_tilings, "bins": bins}
    deltas = jnp.asarray(WIND_DELTA, jnp.int32)

    def reset(key):
        return WindyState(board=_reset_board(key, rows, columns), wind=jnp.int32(0), clock=jnp.int32(0))

    def step(key, state, action):
        k_fall, k_wind = jax.random.split(key)
        board, reward = fall(k_fall, state.board, action, columns, p, deltas[state.wind])
        clock = state.clock + 1
        change = clock >= change_every
        wind = jnp.where(change, jax.random.randint(k_wind, (), 0, 3, jnp.int32), state.wind)
        return WindyState(board=board, wind=wind, clock=jnp.where(change, 0, clock).astype(jnp.int32)), reward

    def observe(s):
        return jnp.concatenate([binary_board(s.board, rows, columns), jax.nn.one_hot(s.wind, 3)])

    n = rows * columns + 3
    if kind == "board":
        return _catch_env("windy_catch", params, reset, step, observe, n, 0, observe, n)
    k, fn = _abstract_features(kind, rows, columns, num_tilings, bins, 3)
    params["bins"] = list(tiles.bins_tuple(bins, 3))
    return _catch_env("windy_catch", params, reset, step, lambda s: fn(s.board, s.wind), k,
                      1 if kind == "onehot" else int(num_tilings), observe, n)


def dancing_catch(*, rows: int = 10, columns: int = 5, spawn_probability: float = 0.1, swap_every: int = 10_000,
                  features: str = "board") -> ContinuingEnv:
    """csuite's Dancing Catch (`csuite/environments/dancing_catch.py` at commit
    b74faed; module docstring): Catch's dynamics, observed as the binary board
    under a permutation that swaps two uniformly drawn entries (possibly the
    same) every `swap_every` steps. Features: the permuted board, dense."""
    rows, columns, p = _sizes(rows, columns, spawn_probability)
    swap_every = positive_int("swap_every", swap_every)
    _kind(features, ("board",))
    n = rows * columns
    params = {"rows": rows, "columns": columns, "spawn_probability": p, "swap_every": swap_every,
              "features": "board"}

    def reset(key):
        return DancingState(board=_reset_board(key, rows, columns), perm=jnp.arange(n, dtype=jnp.int32),
                            clock=jnp.int32(0))

    def step(key, state, action):
        k_fall, k_swap = jax.random.split(key)
        board, reward = fall(k_fall, state.board, action, columns, p)
        clock = state.clock + 1
        swap = clock >= swap_every
        i, j = jax.random.randint(k_swap, (2,), 0, n, jnp.int32)
        swapped = state.perm.at[i].set(state.perm[j]).at[j].set(state.perm[i])
        perm = jnp.where(swap, swapped, state.perm)
        return DancingState(board=board, perm=perm, clock=jnp.where(swap, 0, clock).astype(jnp.int32)), reward

    def observe(s):
        return binary_board(s.board, rows, columns)[s.perm]

    return _catch_env("dancing_catch", params, reset, step, observe, n, 0, observe, n)




# ------------------------------------------------------------------- Pendulum

PENDULUM_REWARDS = ("sparse", "dense")

# Naik et al.'s continuing Pendulum (Reward Centering, RLC 2024): their csuite
# fork's `csuite/environments/pendulum.py` (github.com/abhisheknaik96/csuite,
# commit 520e83f) changes Google's defaults to friction 0.3
# (`_FRICTION`), torques -2, 0, +2 (`_TORQUE_MULTIPLIER = 2`) and the dense
# reward -(pi - angle)^2 - 0.1 velocity^2 (`reward_fn=dense_reward`), the
# environment their experiments load (continuing-rl-exps, commit de89d49,
# `experiments.py`: `csuite.load("pendulum", {})`). `pendulum(**NAIK_PENDULUM)`.
NAIK_PENDULUM = {"friction": 0.3, "torque": 2.0, "reward": "dense"}


class PendulumState(NamedTuple):
    """Pendulum's state: `angle` () float32 in [0, 2 pi) (0 hangs down) and
    `velocity` () float32, the angular velocity."""

    angle: jax.Array
    velocity: jax.Array


def pendulum(*, friction: float = 0.1, gravity: float = 9.81, simulation_step_size: float = 0.05,
             act_step_period: int = 4, max_speed: float | None = None, reward_angle: float = 30.0,
             start_angle: float = 0.0, start_velocity: float = 0.0, num_tilings: int = 8, bins=(7, 7, 7),
             velocity_bound: float = 10.0, torque: float = 1.0, reward: str = "sparse") -> ContinuingEnv:
    """csuite's continuing Pendulum with discrete torques
    (`csuite/environments/pendulum.py` at commit b74faed): theta'' = tau - mu
    theta' - g sin(theta), tau = action - 1 in {-1, 0, 1}, `act_step_period`
    semi-implicit Euler steps of `simulation_step_size` per action (velocity
    first, then the angle with the new velocity), the angle wrapped to
    [0, 2 pi), the velocity clipped at `max_speed` (None: csuite's unbounded
    default; inf means the same). Sparse reward: 1 when the new angle is within `reward_angle`
    degrees of upright (pi), else 0. The start state is fixed (csuite's
    `start_from_bottom`: hanging at rest), so the task is deterministic.

    Naik et al.'s variant (`NAIK_PENDULUM`): `torque` multiplies the three
    torques (tau = torque * (action - 1)), and `reward="dense"` gives
    -(pi - angle)^2 - 0.1 velocity^2 for the new angle in [0, 2 pi) and the
    new (clipped) velocity (`reward_angle` then unused); the defaults (1.0,
    "sparse") are csuite's task, unchanged.

    Features: tile coding of (cos, sin, velocity), Naik et al.'s Pendulum
    setting (8 tilings of 7^3), the velocity's box [-velocity_bound,
    velocity_bound] (a full-torque spin settles near torque / friction = 10
    rad/s; faster values fall in the outer tiles). Observation (a network's
    input): (cos, sin, velocity / velocity_bound), Naik et al.'s scaling."""
    mu = finite_number("friction", friction, low=0.0)
    g = finite_number("gravity", gravity)
    dt = finite_number("simulation_step_size", simulation_step_size, low=0.0, strict=True)
    period = positive_int("act_step_period", act_step_period)
    # csuite's default is np.inf; None keeps the resolved parameters JSON-ready.
    if max_speed is not None and not isinstance(max_speed, bool) and max_speed == math.inf:
        max_speed = None
    vmax = math.inf if max_speed is None else finite_number("max_speed", max_speed, low=0.0, strict=True)
    half = finite_number("reward_angle", reward_angle, low=0.0) * math.pi / 180.0
    a0, v0 = finite_number("start_angle", start_angle), finite_number("start_velocity", start_velocity)
    vb = finite_number("velocity_bound", velocity_bound, low=0.0, strict=True)
    t = positive_int("num_tilings", num_tilings)
    b = tiles.bins_tuple(bins, 3)
    multiplier = finite_number("torque", torque)
    if reward not in PENDULUM_REWARDS:
        raise ValueError(f"reward: one of {', '.join(PENDULUM_REWARDS)}, got {reward!r}")
    params = {"friction": mu, "gravity": g, "simulation_step_size": dt, "act_step_period": period,
              "max_speed": max_speed if max_speed is None else vmax, "reward_angle": float(reward_angle),
              "start_angle": a0, "start_velocity": v0, "num_tilings": t, "bins": list(b), "velocity_bound": vb,
              "torque": multiplier, "reward": reward}
    two_pi = np.float32(2 * np.pi)
    low, high = np.array([-1, -1, -vb], np.float32), np.array([1, 1, vb], np.float32)
    k = tiles.num_tiles(b, 3, t)

    def reset(key):
        del key  # csuite's start state is fixed
        return PendulumState(angle=jnp.float32(a0 % (2 * math.pi)), velocity=jnp.float32(v0))

    def step(key, state, action):
        del key  # deterministic dynamics
        tau = (jnp.asarray(action, jnp.float32) - 1.0) * np.float32(multiplier)  # x 1.0 is exact

        def euler(_, av):
            angle, vel = av
            vel = vel + (tau - mu * vel - g * jnp.sin(angle)) * dt
            return angle + vel * dt, vel

        angle, vel = jax.lax.fori_loop(0, period, euler, (state.angle, state.velocity))
        angle = jnp.mod(angle, two_pi)
        vel = jnp.clip(vel, -vmax, vmax)
        if reward == "dense":  # the fork's dense_reward, of the new state
            r = -jnp.square(np.float32(np.pi) - angle) - np.float32(0.1) * jnp.square(vel)
        else:
            r = (np.pi - half < angle) & (angle < np.pi + half)
        next_state = PendulumState(angle=angle.astype(jnp.float32), velocity=vel.astype(jnp.float32))
        return next_state, r.astype(jnp.float32)

    def state_features(s):
        x = jnp.stack([jnp.cos(s.angle), jnp.sin(s.angle), s.velocity]).astype(jnp.float32)
        return tiles.tile_indices(x, low, high, b, t)

    def observe(s):
        # Naik et al.'s network input (continuing-rl-exps `experiments.py`, `process_observation`):
        # csuite's (cos, sin, velocity) with the velocity divided by 10, the default velocity_bound.
        return jnp.stack([jnp.cos(s.angle), jnp.sin(s.angle), s.velocity / np.float32(vb)]).astype(jnp.float32)

    return ContinuingEnv(name="pendulum", num_actions=3, num_features=3 * k, num_active=t, params=params,
                         reset=reset, step=step, features=per_action(state_features, k, 3),
                         observe=observe, observation_size=3)


# ----------------------------------------------------------------------- Taxi

class TaxiState(NamedTuple):
    """Taxi's state, () int32 each: `x`, `y` the taxi's cell ((0, 0) top left),
    `passenger` 0-3 (a coloured square) or 4 (in the taxi), `destination` 0-3."""

    x: jax.Array
    y: jax.Array
    passenger: jax.Array
    destination: jax.Array


# csuite's taxi.py: the (x, y) of Red, Green, Yellow, Blue, and the walls
# between horizontally adjacent cells (west cell, east cell).
TAXI_SQUARES = ((0, 0), (4, 0), (0, 4), (3, 4))
TAXI_WALLS = (((1, 0), (2, 0)), ((1, 1), (2, 1)), ((0, 3), (1, 3)), ((0, 4), (1, 4)), ((2, 3), (3, 3)),
              ((2, 4), (3, 4)))
TAXI_NUM_STATES = 5 * 5 * 5 * 4


def taxi_moves() -> np.ndarray:
    """(5, 5, 4, 2) int32: the (x, y) a move action (north, west, south, east,
    csuite's order) leads to from (x, y): clipped at the border, blocked by
    the walls (csuite's `taxi.py` `Taxi.step`)."""
    out = np.zeros((5, 5, 4, 2), np.int32)
    for x in range(5):
        for y in range(5):
            for a, (dx, dy) in enumerate(((0, -1), (-1, 0), (0, 1), (1, 0))):
                nx, ny = min(max(x + dx, 0), 4), min(max(y + dy, 0), 4)
                if ((min(x, nx), y), (max(x, nx), y)) in TAXI_WALLS:
                    nx = x
                out[x, y, a] = nx, ny
    return out


def taxi_index(x, y, passenger, destination):
    """csuite's observation index of a Taxi state (`taxi.py`'s lookup table):
    ((x * 5 + y) * 5 + passenger) * 4 + destination, in [0, 500)."""
    return ((x * 5 + y) * 5 + passenger) * 4 + destination


def taxi_model() -> tuple[np.ndarray, np.ndarray]:
    """Taxi's exact model from its definition (csuite's `taxi.py`): P (500, 6,
    500), R (500, 6) float64 over `taxi_index`. A successful drop-off (+20)
    draws the next passenger square and destination uniformly (16 outcomes)."""
    moves = taxi_moves()
    P = np.zeros((TAXI_NUM_STATES, 6, TAXI_NUM_STATES))
    R = np.zeros((TAXI_NUM_STATES, 6))
    for x, y, p, d in np.ndindex(5, 5, 5, 4):
        s = taxi_index(x, y, p, d)
        for a in range(4):
            P[s, a, taxi_index(*moves[x, y, a], p, d)] = 1.0
        picked = p < 4 and TAXI_SQUARES[p] == (x, y)
        P[s, 4, taxi_index(x, y, 4 if picked else p, d)] = 1.0
        R[s, 4] = 0.0 if picked else -10.0
        if p == 4 and TAXI_SQUARES[d] == (x, y):
            R[s, 5] = 20.0
            for p2, d2 in np.ndindex(4, 4):
                P[s, 5, taxi_index(x, y, p2, d2)] += 1.0 / 16.0
        else:
            R[s, 5] = -10.0
            P[s, 5, s] = 1.0
    return P, R


def taxi() -> ContinuingEnv:
    """csuite's continuing Taxi (`csuite/environments/taxi.py` at commit
    b74faed; Dietterich's MAXQ gridworld): 5 x 5 cells with walls, 6 actions
    (north, west, south, east, pick up, drop off). Pick-up where the waiting
    passenger is takes them in, else -10; drop-off of the carried passenger at
    the destination gives +20 and a new passenger (square and destination
    uniform, possibly equal), else -10. Starts in a uniform cell with a
    uniform waiting passenger and destination. Tabular: one-hot features of
    the 500 states, `taxi_model` its exact model."""
    moves = jnp.asarray(taxi_moves())
    squares = jnp.asarray(TAXI_SQUARES, jnp.int32)

    def reset(key):
        kx, ky, kp, kd = jax.random.split(key, 4)
        draw = [jax.random.randint(k, (), 0, n, jnp.int32) for k, n in ((kx, 5), (ky, 5), (kp, 4), (kd, 4))]
        return TaxiState(*draw)

    def step(key, s, action):
        a = jnp.asarray(action, jnp.int32)
        nxt = moves[s.x, s.y, jnp.minimum(a, 3)]
        x, y = jnp.where(a < 4, nxt[0], s.x), jnp.where(a < 4, nxt[1], s.y)
        here = jnp.stack([x, y])
        picked = (a == 4) & (s.passenger < 4) & jnp.all(squares[jnp.minimum(s.passenger, 3)] == here)
        dropped = (a == 5) & (s.passenger == 4) & jnp.all(squares[s.destination] == here)
        reward = jnp.where(dropped, 20.0, jnp.where((a >= 4) & ~picked, -10.0, 0.0)).astype(jnp.float32)
        kp, kd = jax.random.split(key)
        passenger = jnp.where(picked, 4, jnp.where(dropped, jax.random.randint(kp, (), 0, 4, jnp.int32), s.passenger))
        dest = jnp.where(dropped, jax.random.randint(kd, (), 0, 4, jnp.int32), s.destination)
        return TaxiState(x=x, y=y, passenger=passenger.astype(jnp.int32), destination=dest.astype(jnp.int32)), reward

    def state_index(s):
        return taxi_index(s.x, s.y, s.passenger, s.destination).astype(jnp.int32)

    return ContinuingEnv(name="taxi", num_actions=6, num_features=6 * TAXI_NUM_STATES, num_active=1, params={},
                         reset=reset, step=step, features=per_action(lambda s: state_index(s)[None],
                                                                     TAXI_NUM_STATES, 6),
                         num_states=TAXI_NUM_STATES, state_index=state_index, model=taxi_model)


__all__ = ["CSUITE_COMMIT", "FEATURE_KINDS", "NAIK_PENDULUM", "PENDULUM_REWARDS", "TAXI_NUM_STATES", "TAXI_SQUARES",
           "TAXI_WALLS", "WIND_DELTA", "CatchState", "DancingState", "PendulumState", "TaxiState", "WindyState",
           "binary_board", "catch", "dancing_catch", "fall", "lowest_ball", "pendulum", "taxi", "taxi_index", "taxi_model", "taxi_moves",
           "windy_catch"]
