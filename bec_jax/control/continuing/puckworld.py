"""PuckWorld, as Naik et al. ran it, in JAX: a puck pushed towards a goal that moves.

Written from the definition in Naik's fork of csuite (github.com/abhisheknaik96/
csuite, commit 520e83fdb7b62ab322c3aa791caf76dba872d9fa), files
`csuite/environments/puckworld.py` (the code) and
`docs/environments/puckworld.md` (its description); not a copy of its code.
The tile coding is that of Naik et al.'s linear PuckWorld runs
(github.com/abhisheknaik96/continuing-rl-exps, commit
de89d496bd90a5e078bd96d69ec4971b8bfc8877, `config_files/puckworld/*.json`,
`utils/tilecoder.py`, `agents/base_agents.py`), in our own tile coder. There
are no episodes: `reset` once, then `step` forever
(`bec_jax.control.continuing.env`).

The arena is 5 x 5, (0, 0) its top left corner, y growing downwards. Four
actions push the puck with an acceleration of 0.1 (the fork's `Action`):

  0 north (0, -0.1)   1 west (-0.1, 0)   2 south (0, +0.1)   3 east (+0.1, 0)

One step, in the code's order:

  1. `act_step_period` (4) Euler sub-steps of `simulation_step_size` (0.05),
     each per axis: v += (a - friction v) dt, then x += v dt (the new v);
  2. the walls, once, after the sub-steps, per axis: below `puck_radius`
     (0.5) the velocity is multiplied by -0.5 and the position set to
     puck_radius; above 5 - puck_radius likewise, at 5 - puck_radius;
  3. the step counter advances, and every `goal_update_interval` (300) steps
     by it the goal is redrawn uniformly in [0, 5)^2;
  4. reward: minus the distance from the puck to the goal (the goal after
     step 3), in [-5 sqrt 2, 0].

The run starts with the puck and the goal uniform in [0, 5)^2 (the puck's
start ignores its radius, as the code's `start` does; the first step's walls
put it inside) and the velocity 0.

Friction: the code's default `_FRICTION` is 0.5, the description says mu =
0.1. We default to the code's 0.5: it is what `csuite.load("puckworld", {})`
builds, so what Naik et al.'s runs used (continuing-rl-exps `experiments.py`),
and their tile coder's velocity box [-0.2, 0.2] is acceleration / friction =
0.1 / 0.5. `friction=0.1` gives the description's task.

The velocity is never clipped (the code's "ToDo: can clip velocity here"):
from rest the Euler steps keep |v| <= acceleration / friction, the terminal
velocity (when friction dt <= 1), and the walls only shrink it. The code's
observation spec's `max_velocity` (acceleration / friction where friction >
0.1, else 5) bounds only its `set_state` check, never the dynamics.

Observation (a network's input, `observe`): the code's 6 floats, float32,
(puck x, y, velocity x, y, goal x, y), as Naik et al.'s networks read them
(`experiments.py`'s `process_observation` passes PuckWorld's through).

Features (linear learners): tile coding (`bec_jax.control.tiles`) of that
6-vector on the box [0, 5]^2 x [-velocity_bound, velocity_bound]^2 x [0, 5]^2,
`num_tilings` tilings of `bins` tiles per dimension, one block of weights per
action (`features.per_action`). Naik et al.'s configs tile the same box
(`limits_per_dim` [[0, 5], [0, 5], [-0.2, 0.2], [-0.2, 0.2], [0, 5], [0, 5]])
with 32 tilings of `tiling_dims` 3 per dimension and give `num_weights`
524,292: their tile coder (from AmiiThinks' rltoolkit) does not wrap, so it
keeps tiling_dims + 1 = 4 tiles per dimension in every tiling (its offsets,
Parks and Militzer's asymmetric (2 i + 1) t / T of a tile in dimension i,
move each tiling by up to a tile): 32 * 4^6 = 131,072 tiles; `base_agents.py`
adds one always-active bias feature for a linear learner, 131,073 per action,
x 4 actions = 524,292 weights; it also divides alpha by the 32 tilings. Ours
are the same 32 tilings of 3 per dimension on the same box in our tile coder
(offsets of a 1/T tile, the outer tiles absorbing them, so 3^6 = 729 tiles a
tiling), no bias feature and alpha not divided (pass alpha / 32 for theirs):
32 * 729 = 23,328 per action, 93,312 weights (365 KiB of float32 a run).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax.control import tiles
from bec_jax.control.continuing.env import ContinuingEnv, finite_number, positive_int
from bec_jax.control.features import per_action

FORK_COMMIT = "520e83fdb7b62ab322c3aa791caf76dba872d9fa"        # abhisheknaik96/csuite
EXPERIMENTS_COMMIT = "de89d496bd90a5e078bd96d69ec4971b8bfc8877"  # abhisheknaik96/continuing-rl-exps
NUM_ACTIONS = 4  # north, west, south, east
SIZE = 5.0       # the arena's width and height (the code's _WIDTH, _HEIGHT)
ACCELERATION = 0.1
# (x, y) acceleration of each action, the code's Action.acceleration_x / _y: y grows downwards.
ACCELERATIONS = ((0.0, -ACCELERATION), (-ACCELERATION, 0.0), (0.0, ACCELERATION), (ACCELERATION, 0.0))
OBSERVATION_SIZE = 6
WALL_BOUNCE = -0.5  # the velocity's factor at a wall
MIN_REWARD = -SIZE * math.sqrt(2.0)  # the reward is in [MIN_REWARD, 0]: puck and goal are in [0, 5]^2


class PuckState(NamedTuple):
    """PuckWorld's state: `position`, `velocity` and `goal` (2,) float32 each,
    (x, y) with (0, 0) the top left; `counter` () int32, the steps taken modulo
    `goal_update_interval` (the code's step counter, whose multiples redraw
    the goal)."""

    position: jax.Array
    velocity: jax.Array
    goal: jax.Array
    counter: jax.Array


def puckworld(*, friction: float = 0.5, goal_update_interval: int = 300, puck_radius: float = 0.5,
              simulation_step_size: float = 0.05, act_step_period: int = 4, num_tilings: int = 32,
              bins=(3, 3, 3, 3, 3, 3), velocity_bound: float = 0.2) -> ContinuingEnv:
    """Naik et al.'s continuing PuckWorld (their csuite fork's
    `csuite/environments/puckworld.py` at commit 520e83f; module docstring):
    4 actions, reward minus the puck's distance to a goal redrawn every
    `goal_update_interval` steps. The dynamics' parameters are the code's,
    with its defaults (friction 0.5, the code's, where its docs say 0.1).
    Features: `num_tilings` tilings of `bins` (per dimension) of the 6
    observations, the velocities' box [-velocity_bound, velocity_bound]
    (Naik et al.'s: 32 tilings of 3^6, velocities in [-0.2, 0.2])."""
    mu = finite_number("friction", friction, low=0.0)
    interval = positive_int("goal_update_interval", goal_update_interval)
    radius = finite_number("puck_radius", puck_radius, low=0.0)
    if radius > SIZE / 2:
        raise ValueError(f"puck_radius: at most {SIZE / 2:g}, half the {SIZE:g} x {SIZE:g} arena, got {puck_radius!r}")
    dt = finite_number("simulation_step_size", simulation_step_size, low=0.0, strict=True)
    period = positive_int("act_step_period", act_step_period)
    t = positive_int("num_tilings", num_tilings)
    b = tiles.bins_tuple(bins, OBSERVATION_SIZE)
    vb = finite_number("velocity_bound", velocity_bound, low=0.0, strict=True)
    params = {"friction": mu, "goal_update_interval": interval, "puck_radius": radius,
              "simulation_step_size": dt, "act_step_period": period, "num_tilings": t, "bins": list(b),
              "velocity_bound": vb}
    accelerations = jnp.asarray(ACCELERATIONS, jnp.float32)
    f32 = np.float32
    mu32, dt32, low_wall, high_wall = f32(mu), f32(dt), f32(radius), f32(SIZE - radius)
    low = np.array([0, 0, -vb, -vb, 0, 0], np.float32)
    high = np.array([SIZE, SIZE, vb, vb, SIZE, SIZE], np.float32)
    k = tiles.num_tiles(b, OBSERVATION_SIZE, t)

    def draw(key):
        return jax.random.uniform(key, (2,), jnp.float32) * f32(SIZE)

    def reset(key):
        k_puck, k_goal = jax.random.split(key)
        return PuckState(position=draw(k_puck), velocity=jnp.zeros((2,), jnp.float32), goal=draw(k_goal),
                         counter=jnp.int32(0))

    def step(key, state, action):
        acc = accelerations[jnp.asarray(action, jnp.int32)]

        def euler(_, pv):
            pos, vel = pv
            vel = vel + (acc - mu32 * vel) * dt32
            return pos + vel * dt32, vel

        pos, vel = jax.lax.fori_loop(0, period, euler, (state.position, state.velocity))
        below = pos < low_wall
        vel, pos = jnp.where(below, vel * f32(WALL_BOUNCE), vel), jnp.where(below, low_wall, pos)
        above = pos > high_wall
        vel, pos = jnp.where(above, vel * f32(WALL_BOUNCE), vel), jnp.where(above, high_wall, pos)
        counter = (state.counter + 1) % interval
        goal = jnp.where(counter == 0, draw(key), state.goal)
        d = pos - goal
        reward = -jnp.sqrt(jnp.sum(d * d))
        nxt = PuckState(position=pos.astype(jnp.float32), velocity=vel.astype(jnp.float32),
                        goal=goal.astype(jnp.float32), counter=counter.astype(jnp.int32))
        return nxt, reward.astype(jnp.float32)

    def observe(s):
        return jnp.concatenate([s.position, s.velocity, s.goal]).astype(jnp.float32)

    def state_features(s):
        return tiles.tile_indices(observe(s), low, high, b, t)

    return ContinuingEnv(name="puckworld", num_actions=NUM_ACTIONS, num_features=NUM_ACTIONS * k, num_active=t,
                         params=params, reset=reset, step=step, features=per_action(state_features, k, NUM_ACTIONS),
                         observe=observe, observation_size=OBSERVATION_SIZE)


__all__ = ["ACCELERATIONS", "EXPERIMENTS_COMMIT", "FORK_COMMIT", "MIN_REWARD", "NUM_ACTIONS", "OBSERVATION_SIZE",
           "SIZE", "PuckState", "puckworld"]
