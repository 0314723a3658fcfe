"""Control tasks as pure environments: one example each; callers jit and vmap.

The task contract. A task is a `ControlEnv`: sizes, the discount, the loop's
episode cap, its parameters and three pure functions of one example,

  reset(key) -> env_state                      (a pytree of arrays)
  step(key, env_state, action) -> (next_env_state, reward float32 (), terminal bool ())
  features(env_state) -> (A, m) int32          indices of the features that are 1
                                               for (s, b), every action b (sparse)
                      or (A, d) float32        the vectors phi(s, b) (dense)

`step` never resets and `terminal` means true termination only (the goal); the
time limit is the loop's: it ends an episode after `max_episode_steps` steps and
learns that last transition as non-terminal (it bootstraps with gamma), as the
authors' code does. Linear action values are Q(s, b) = w^T phi(s, b) over a
weight vector of `num_features` entries covering all actions
(`bec_jax.control.transition`). A task is made by a factory whose keyword
parameters are the task's parameters (`--task-param NAME=VALUE`);
`examples/gridworld.py` is a worked one (`--task
examples.gridworld:make_gridworld` from the repository root).

Any gymnax environment with discrete actions is a task by name,
`gymnax:ENV_ID` (e.g. `gymnax:CartPole-v1`; `gymnax_task`), its features a
feature map (`bec_jax.control.features`: tiles, fourier, rbf or one's own)
given by the task parameter `features` with that map's parameters, on the box
`low`, `high` (default: the observation space's bounds). Its time limit is the
loop's cap, so truncation is never learned as termination.

Tasks (the paper authors' code: GameAI-NJUPT/BEC, commit 4d55a79), gamma 0.99:

  cliff_walking  Gymnasium's CliffWalking-v0 (Sutton & Barto Example 6.6), as
                 `Cliff_Walking/main.py` uses it: a 4x12 grid, state
                 row * 12 + col, start 36 (row 3, col 0), goal 47 terminal;
                 actions 0 up, 1 right, 2 down, 3 left; a move off the grid
                 stays; reward -1 per step; a step into the cliff (row 3, cols
                 1..10) gives -100 and puts the agent back at 36 without ending
                 the episode. One-hot features, Q(s, a) = w[a * 48 + s]: 192
                 features, 1 active. The authors end an episode at termination,
                 Gymnasium truncation (none is registered) or 1000 steps.
  maze           the authors' 13x13 map (`Maze/main.py`, copied in `MAZE_MAP`;
                 dynamics `Maze/maze_env.py`): 1 wall, 2 start (0, 0), 3 goal
                 (12, 12); state row * 13 + col; actions 0 up, 1 down, 2 left,
                 3 right; a move into a wall or off the grid stays; reward 0 for
                 the step into the goal (terminal), -1 for every other step.
                 One-hot, Q(s, a) = w[a * 169 + s]: 676 features, 1 active;
                 episodes capped at 1000 steps (`Maze/agent.py`).
  mountain_car   gymnax's MountainCar-v0 (Gymnasium's equations): the authors
                 use `env.unwrapped` (no 200-step limit) and cap episodes at
                 1000 steps. Terminal when position >= 0.5 and velocity >= 0;
                 reward -1 per step. Tile coding (`tiles`) of the observation
                 (position, velocity) in Gymnasium's bounds [-1.2, 0.6] x
                 [-0.07, 0.07]: `num_tilings` 5, `bins` 20 per dimension, offset
                 unit (high - low) / (num_tilings * bins) in float32
                 (`Mountain_Car/main.py`): 3 * 5 * 400 = 6000 features, 5 active.
  acrobot        gymnax's Acrobot-v1 (the book dynamics, one RK4 step of 0.2 s,
                 as Gymnasium): terminal when -cos(t1) - cos(t1 + t2) > 1;
                 reward -1 per step, 0 on the terminating step. The authors keep
                 Gymnasium's 500-step TimeLimit and end the episode on
                 `truncated`, learning that transition as non-terminal: cap 500.
                 Tile coding of the 6-dim observation (cos t1, sin t1, cos t2,
                 sin t2, dt1, dt2) in Gymnasium's bounds ([-1, 1] four times,
                 +-4 pi, +-9 pi): `num_tilings` 5, `bins` 5 per dimension, offset
                 unit ((high - low) / num_tilings) / bins in float64
                 (`Acrobot/main.py`): 3 * 5 * 5**6 = 234375 features, 5 active.

The tile-coded tasks' state is gymnax's `EnvState` (float32 physics, an int32
step counter that only gymnax's own time limit would read; that limit is raised
out of reach). Gymnasium integrates in float64 and returns float32
observations, so trajectories agree with it to float32 rounding, not bit for
bit. Action b's tiles are at b * (tiles per action) + the tile index.

`make(name, **params)` builds a task; `names()` lists the registered ones;
`register(name, factory)` (or `@register(name)` on the factory) adds one, as
this module's own tasks do; `package.module:function` names a factory without
registering it. Every task takes
`gamma` and `max_episode_steps`; the tile-coded ones also `num_tilings` and
`bins` (an integer, or one per observation dimension). `ControlEnv.params`
holds the resolved parameters, so `make(env.name, **env.params)` rebuilds it.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax.algorithms import lookup_callable, register_callable
from bec_jax.control import features as feature_maps
from bec_jax.control import tiles
from bec_jax.control.tasks_check import check_task

GAMMA = 0.99
GYMNAX = "gymnax:"  # the prefix of `gymnax:ENV_ID` task names
# gymnax's own time limit for the authors' tile-coded tasks, raised so that it
# never fires (the loop truncates at the authors' cap). gymnax >= 1.0 applies it
# only in `step`, which no task calls, and these tasks read their own termination
# condition, so it is a guard; `gymnax_task` keeps an environment's own limit,
# which its observations may read, and makes it the loop's cap.
_NO_TIME_LIMIT = 2**31 - 1

# The authors' map, copied from GameAI-NJUPT/BEC Maze/main.py at commit
# 4d55a79afa733095e527924c21edf2689ea5c45d: 0 free, 1 wall, 2 start, 3 goal.
MAZE_MAP = (
    (2, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1),
    (0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    (0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0),
    (0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1),
    (0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0),
    (0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1),
    (1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0),
    (0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0),
    (0, 0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0),
    (0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0),
    (0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 1, 0),
    (0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0),
    (0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 3),
)
MAZE_START = (0, 0)
MAZE_GOAL = (12, 12)

CLIFF_SHAPE = (4, 12)
CLIFF_START = 36
CLIFF_GOAL = 47


@dataclasses.dataclass(frozen=True, eq=False)
class ControlEnv:
    """A control task: sizes, discount, the loop's episode cap, its parameters
    and three pure functions of one example (see the module docstring).
    Compared and hashed by identity.

    Attributes:
      name: the registry name.
      num_actions: A.
      num_features: d, the length of the weight vector (all actions).
      num_active: the width of a feature row: m active indices per (s, a)
        (sparse binary features), or d (dense features).
      gamma: the discount.
      max_episode_steps: the loop ends an episode after this many steps; the
        capped last transition is learned as non-terminal.
      params: the resolved parameters of `make` (JSON-ready).
      reset: key -> env_state.
      step: (key, env_state, action) -> (next_env_state, reward, terminal).
      features: env_state -> the features of (s, b) for every action b:
        (A, m) int32 weight indices (sparse binary) or (A, d) float vectors
        (dense); `bec_jax.control.transition` says how Q is formed from them.
    """

    name: str
    num_actions: int
    num_features: int
    num_active: int
    gamma: float
    max_episode_steps: int
    params: dict
    reset: Callable[[jax.Array], Any]
    step: Callable[[jax.Array, Any, jax.Array], tuple[Any, jax.Array, jax.Array]]
    features: Callable[[Any], jax.Array]

    @property
    def active(self) -> Callable[[Any], jax.Array]:
        """`features` under its earlier name (the active indices of sparse features)."""
        return self.features


# ------------------------------------------------------------------ registry

# name -> factory (keyword parameters -> ControlEnv): this module's tasks register
# themselves where they are defined (`@register("name")`), a user's with `register`.
TASKS: dict[str, Callable[..., ControlEnv]] = {}


def register(name: str, factory: Callable[..., ControlEnv] | None = None, *, replace: bool = False):
    """Registers `factory` (keyword parameters -> `ControlEnv`) under `name` and
    returns it; without `factory`, a decorator that does (`@register("maze")`).
    A name that is taken is an error (`replace=True` overrides)."""
    if factory is None:
        return lambda f: register(name, f, replace=replace)
    return register_callable(TASKS, name, factory, "task", replace=replace)


def names() -> list[str]:
    """The task names, sorted."""
    return sorted(TASKS)


def factory(ref: str) -> Callable[..., ControlEnv]:
    """The factory `ref` names: a registered name, `gymnax:ENV_ID` (any gymnax
    environment with discrete actions, `gymnax_task`), or a
    `package.module:function` reference (imported, not registered); `ValueError`
    naming `task` lists the known names."""
    if isinstance(ref, str) and ref not in TASKS and ref.startswith(GYMNAX):
        env_id = ref[len(GYMNAX):]
        _gymnax_env_id(env_id)
        return functools.partial(gymnax_task, env_id)
    return lookup_callable(ref, TASKS, "task", "control task", "task factory",
                           f"{', '.join(names())} (or gymnax:ENV_ID, or package.module:function for your own)")


# ----------------------------------------------------------------- validation

def _gamma(gamma) -> float:
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gamma: a number in [0, 1], got {gamma!r}")
    return float(gamma)


def _positive_int(field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{field}: an integer >= 1, got {value!r}")
    return int(value)


# ---------------------------------------------------------------- grid tasks

def _tabular_env(name, next_state, reward, terminal, start, gamma, max_episode_steps, params) -> ControlEnv:
    """A deterministic tabular task from (N, A) tables; one-hot features
    Q(s, a) = w[a * N + s]. The env_state is the int32 state index."""
    n, a = next_state.shape
    next_state = jnp.asarray(next_state, jnp.int32)
    reward = jnp.asarray(reward, jnp.float32)
    terminal = jnp.asarray(terminal, bool)
    offsets = jnp.arange(a, dtype=jnp.int32)[:, None] * n

    def reset(key):
        """The start state (key unused)."""
        del key
        return jnp.asarray(start, jnp.int32)

    def step(key, state, action):
        """(next state, reward, terminal) of the deterministic tables (key unused)."""
        del key
        state = jnp.asarray(state, jnp.int32)
        action = jnp.asarray(action, jnp.int32)
        return next_state[state, action], reward[state, action], terminal[state, action]

    def active(state):
        """(A, 1) indices b * N + s."""
        return offsets + jnp.asarray(state, jnp.int32)

    return ControlEnv(name=name, num_actions=a, num_features=n * a, num_active=1, gamma=gamma,
                      max_episode_steps=max_episode_steps, params=params, reset=reset, step=step,
                      features=active)


def cliff_walking_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CliffWalking's (48, 4) next-state, reward and terminal tables (module docstring)."""
    rows, cols = CLIFF_SHAPE
    moves = ((-1, 0), (0, 1), (1, 0), (0, -1))  # up, right, down, left
    nxt = np.zeros((rows * cols, 4), np.int32)
    rew = np.zeros((rows * cols, 4), np.float32)
    term = np.zeros((rows * cols, 4), bool)
    for s in range(rows * cols):
        r, c = divmod(s, cols)
        for a, (dr, dc) in enumerate(moves):
            nr = min(max(r + dr, 0), rows - 1)
            nc = min(max(c + dc, 0), cols - 1)
            if nr == rows - 1 and 1 <= nc <= cols - 2:  # the cliff
                nxt[s, a], rew[s, a], term[s, a] = CLIFF_START, -100.0, False
            else:
                ns = nr * cols + nc
                nxt[s, a], rew[s, a], term[s, a] = ns, -1.0, ns == CLIFF_GOAL
    return nxt, rew, term


def maze_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The authors' Maze as (169, 4) next-state, reward and terminal tables, as
    `Maze/maze_env.py` computes them (module docstring)."""
    grid = np.asarray(MAZE_MAP)
    h, w = grid.shape
    moves = ((-1, 0), (1, 0), (0, -1), (0, 1))  # up, down, left, right
    nxt = np.zeros((h * w, 4), np.int32)
    rew = np.zeros((h * w, 4), np.float32)
    term = np.zeros((h * w, 4), bool)
    for s in range(h * w):
        r, c = divmod(s, w)
        for a, (dr, dc) in enumerate(moves):
            nr, nc = r + dr, c + dc
            if not (0 <= nr < h and 0 <= nc < w) or grid[nr, nc] == 1:
                nr, nc = r, c
            goal = grid[nr, nc] == 3
            nxt[s, a], rew[s, a], term[s, a] = nr * w + nc, 0.0 if goal else -1.0, goal
    return nxt, rew, term


@register("cliff_walking")
def cliff_walking(*, gamma=GAMMA, max_episode_steps=1000) -> ControlEnv:
    """Gymnasium's CliffWalking-v0 with one-hot features (module docstring)."""
    gamma, cap = _gamma(gamma), _positive_int("max_episode_steps", max_episode_steps)
    nxt, rew, term = cliff_walking_tables()
    return _tabular_env("cliff_walking", nxt, rew, term, CLIFF_START, gamma, cap,
                        {"gamma": gamma, "max_episode_steps": cap})


@register("maze")
def maze(*, gamma=GAMMA, max_episode_steps=1000) -> ControlEnv:
    """The authors' 13x13 Maze with one-hot features (module docstring)."""
    gamma, cap = _gamma(gamma), _positive_int("max_episode_steps", max_episode_steps)
    nxt, rew, term = maze_tables()
    start = MAZE_START[0] * len(MAZE_MAP[0]) + MAZE_START[1]
    return _tabular_env("maze", nxt, rew, term, start, gamma, cap,
                        {"gamma": gamma, "max_episode_steps": cap})


# ----------------------------------------------------------- gymnax tasks

def _import_gymnax(task: str):
    try:
        import gymnax
    except ImportError as e:
        raise ImportError(f'{task} needs gymnax: pip install -e ".[control]"') from e
    return gymnax


def _canonical(state):
    """The gymnax state with int32 integer and float32 float leaves, so that the
    pytree's types do not change between reset and step (scan carries)."""
    return jax.tree.map(_canonical_leaf, state)


def _tiled_env(name, gymnax_id, terminated, observe, low, high, bins, num_tilings, offset_unit, gamma,
               max_episode_steps, params) -> ControlEnv:
    """A gymnax task with tile-coded features; `terminated(env_params, state)`
    is the true termination condition, `observe(state)` the observation."""
    gymnax = _import_gymnax(name)
    env, env_params = gymnax.make(gymnax_id)
    env_params = env_params.replace(max_steps_in_episode=_NO_TIME_LIMIT)
    num_actions = int(env.num_actions)
    per_action = tiles.num_tiles(bins, low.shape[0], num_tilings)
    offsets = jnp.arange(num_actions, dtype=jnp.int32)[:, None] * per_action

    def reset(key):
        """gymnax's `reset_env`: a fresh state."""
        _, state = env.reset_env(key, env_params)
        return _canonical(state)

    def step(key, state, action):
        """gymnax's `step_env` (no auto reset, no time limit); terminal is the
        true termination condition of the next state."""
        _, next_state, reward, _, _ = env.step_env(key, state, jnp.asarray(action, jnp.int32), env_params)
        next_state = _canonical(next_state)
        return next_state, jnp.asarray(reward, jnp.float32), jnp.asarray(terminated(env_params, next_state), bool)

    def active(state):
        """(A, num_tilings) indices b * tiles_per_action + tile."""
        idx = tiles.tile_indices(observe(state), low, high, bins, num_tilings, offset_unit=offset_unit)
        return offsets + idx[None, :]

    return ControlEnv(name=name, num_actions=num_actions, num_features=num_actions * per_action,
                      num_active=num_tilings, gamma=gamma, max_episode_steps=max_episode_steps, params=params,
                      reset=reset, step=step, features=active)


def tiling(name: str, num_tilings=5, bins=None) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], Any]:
    """The tile coding of a tile-coded task as its authors build it: (low, high,
    bins, offset_unit) for `tiles.tile_indices`. Bounds are Gymnasium's float32
    observation bounds; `bins` defaults to 20 (mountain_car) or 5 (acrobot) per
    dimension; offset_unit is None for mountain_car (`tiles`' default rule,
    Mountain_Car/main.py's float32 `(high - low) / (5 * n_bins)`) and
    Acrobot/main.py's `((high - low) / 5) / bins` (float32, then float64) for acrobot."""
    t = _positive_int("num_tilings", num_tilings)
    if name == "mountain_car":
        low = np.array([-1.2, -0.07], dtype=np.float32)
        high = np.array([0.6, 0.07], dtype=np.float32)
        b = _bins(20 if bins is None else bins, 2)
        return low, high, b, None
    if name == "acrobot":
        high = np.array([1.0, 1.0, 1.0, 1.0, 4 * np.pi, 9 * np.pi], dtype=np.float32)
        low = -high
        b = _bins(5 if bins is None else bins, 6)
        unit = ((high - low) / np.float32(t)).astype(np.float64) / np.asarray(b, dtype=np.float64)
        return low, high, b, unit
    raise ValueError(f"task: {name!r} is not tile-coded; tile-coded: acrobot, mountain_car")


def _bins(bins, dims):
    try:
        return tiles.bins_tuple(bins, dims)
    except ValueError as e:
        raise ValueError(f"{e} (an integer >= 1 or {dims} of them)") from None


@register("mountain_car")
def mountain_car(*, gamma=GAMMA, max_episode_steps=1000, num_tilings=5, bins=20) -> ControlEnv:
    """gymnax MountainCar-v0, tile-coded as Mountain_Car/main.py (module docstring)."""
    gamma, cap = _gamma(gamma), _positive_int("max_episode_steps", max_episode_steps)
    low, high, b, unit = tiling("mountain_car", num_tilings, bins)
    t = int(num_tilings)

    def terminated(p, s):
        return (s.position >= p.goal_position) & (s.velocity >= p.goal_velocity)

    def observe(s):
        return jnp.stack([s.position, s.velocity])

    return _tiled_env("mountain_car", "MountainCar-v0", terminated, observe, low, high, b, t, unit, gamma, cap,
                      {"gamma": gamma, "max_episode_steps": cap, "num_tilings": t, "bins": list(b)})


@register("acrobot")
def acrobot(*, gamma=GAMMA, max_episode_steps=500, num_tilings=5, bins=5) -> ControlEnv:
    """gymnax Acrobot-v1, tile-coded as Acrobot/main.py (module docstring)."""
    gamma, cap = _gamma(gamma), _positive_int("max_episode_steps", max_episode_steps)
    low, high, b, unit = tiling("acrobot", num_tilings, bins)
    t = int(num_tilings)

    def terminated(p, s):
        return -jnp.cos(s.joint_angle1) - jnp.cos(s.joint_angle2 + s.joint_angle1) > 1.0

    def observe(s):
        return jnp.stack([jnp.cos(s.joint_angle1), jnp.sin(s.joint_angle1), jnp.cos(s.joint_angle2),
                          jnp.sin(s.joint_angle2), s.velocity_1, s.velocity_2])

    return _tiled_env("acrobot", "Acrobot-v1", terminated, observe, low, high, b, t, unit, gamma, cap,
                      {"gamma": gamma, "max_episode_steps": cap, "num_tilings": t, "bins": list(b)})


# ------------------------------------------------------------- any gymnax environment

class GymnaxState(NamedTuple):
    """The state of a `gymnax_task`: gymnax's own state and the observation it
    last gave (flattened, float32), which the features read."""

    env: Any
    obs: jax.Array


def _canonical_leaf(x):
    """int32 integers, float32 floats, booleans as they are: the scan's carry
    keeps its types between reset and step."""
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_:
        return x
    return x.astype(jnp.int32 if jnp.issubdtype(x.dtype, jnp.integer) else jnp.float32)


def _gymnax_env_id(env_id: str) -> str:
    """`env_id` if gymnax registers it; `ValueError` naming `task` (with the
    install line where gymnax is missing) otherwise."""
    try:
        gymnax = _import_gymnax(GYMNAX + env_id)
    except ImportError as e:
        raise ValueError(f"task: {e}") from None
    if env_id not in gymnax.registered_envs:
        raise ValueError(f"task: unknown gymnax environment {env_id!r}; known: {', '.join(gymnax.registered_envs)}")
    return env_id


def _box(env, env_params, low, high) -> tuple[int, np.ndarray, np.ndarray]:
    """(D, low, high): the flattened observation's size and the box a feature
    map covers, `low`/`high` where given, else the observation space's bounds."""
    obs0, _ = jax.eval_shape(env.reset_env, jax.random.key(0), env_params)
    dims = int(np.prod(obs0.shape))
    obs_space = env.observation_space(env_params)
    space_low = np.broadcast_to(np.asarray(getattr(obs_space, "low", -np.inf), np.float64), obs0.shape).ravel()
    space_high = np.broadcast_to(np.asarray(getattr(obs_space, "high", np.inf), np.float64), obs0.shape).ravel()
    lo = space_low if low is None else feature_maps.vector("low", low, dims)
    hi = space_high if high is None else feature_maps.vector("high", high, dims)
    return dims, lo, hi


def _gymnax_params(env_params, params: dict, name: str) -> tuple:
    """(the environment's parameters with `params`' fields of them replaced, those fields, the rest: the map's)."""
    fields = {f.name for f in dataclasses.fields(env_params)}
    own = {k: v for k, v in params.items() if k in fields}
    if "max_steps_in_episode" in own:
        raise ValueError("max_steps_in_episode: the time limit is the loop's episode cap; give max_episode_steps")
    for k, v in own.items():
        if not isinstance(v, jax.Array) and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            raise ValueError(f"{k}: a number (a parameter of {name}'s dynamics), got {v!r}")
    return (env_params.replace(**own) if own else env_params), own, {k: v for k, v in params.items() if k not in fields}


def gymnax_task(env_id: str, *, features="tiles", gamma=GAMMA, max_episode_steps=None, low=None, high=None,
                **params) -> ControlEnv:
    """Any gymnax environment with discrete actions as a task (`--task
    gymnax:ENV_ID`), its features given by a feature map (`control.features`).

    Args:
      env_id: a gymnax id, e.g. "CartPole-v1".
      features: the feature map's kind ("tiles", "fourier", "rbf") or a
        builder of one's own as package.module:function.
      gamma: the discount.
      max_episode_steps: the episode cap, by default the environment's own time
        limit (`max_steps_in_episode`).
      low, high: the box the feature map covers: a number (every dimension),
        one per observation dimension, or a string of them separated by spaces;
        by default the observation space's bounds, which must then be finite.
      **params: the environment's own parameters, fields of its gymnax
        `EnvParams` (CartPole's `gravity`, `masspole`, ...: replaced as given,
        so derived fields such as CartPole's `total_mass` are not recomputed;
        the time limit is `max_episode_steps`); any other name is the feature
        map's (num_tilings and bins, order, centers and sigma). Environment
        parameters may be traced values, so a grid axis of them runs in one
        program (`ControlSpec.task_axes_traced`); the feature map's box comes
        from the environment's default parameters.

    Termination and truncation are kept apart. gymnax (>= 1.0) reports a step's
    true termination from `step_env` and applies its time limit only in `step`
    (`is_truncated`), so the task steps with `step_env` under the environment's
    own parameters (observations that read the limit are unchanged) and
    `terminal` is that termination alone. The time limit becomes the loop's
    episode cap: an episode that reaches it is truncated, and its last
    transition bootstraps with gamma like any non-terminal one (never learned
    as terminal). The observation is flattened to (D,) float32.
    """
    gymnax = _import_gymnax(GYMNAX + env_id)
    name = GYMNAX + _gymnax_env_id(env_id)
    env, env_params = gymnax.make(env_id)
    if not hasattr(env, "is_truncated"):  # gymnax < 1.0 folds the time limit into step_env's done
        raise ValueError(f'task: {name} needs gymnax >= 1.0 (pip install -e ".[control]")')
    space = env.action_space(env_params)
    if not hasattr(space, "n"):
        raise ValueError(f"task: {name} has a continuous action space ({type(space).__name__}); control needs a "
                         "finite set of actions")
    num_actions = int(space.n)
    gamma = _gamma(gamma)
    limit = getattr(env_params, "max_steps_in_episode", None)
    if max_episode_steps is None:
        if limit is None:
            raise ValueError(f"max_episode_steps: {name} has no time limit of its own; give one")
        max_episode_steps = int(limit)
    cap = _positive_int("max_episode_steps", max_episode_steps)

    with jax.ensure_compile_time_eval():  # concrete even when the task is built inside a trace (task axes)
        dims, lo, hi = _box(env, env_params, low, high)
    run_params, own, feature_params = _gymnax_params(env_params, params, name)
    if not isinstance(features, str):
        raise ValueError(f"features: a feature map's kind or package.module:function, got {features!r}")
    with jax.ensure_compile_time_eval():
        fm = feature_maps.make(features, lo, hi, num_actions, **feature_params)
        width, _ = feature_maps.check(fm, dims, num_actions, features)

    def observe(obs):
        return jnp.asarray(obs).reshape(-1).astype(jnp.float32)

    def reset(key):
        """gymnax's `reset_env`: a fresh state and its observation."""
        obs, state = env.reset_env(key, run_params)
        return GymnaxState(jax.tree.map(_canonical_leaf, state), observe(obs))

    def step(key, state, action):
        """gymnax's `step_env` (no auto reset); terminal is its termination,
        without the time limit (the loop's cap)."""
        obs, nxt, reward, terminated, _ = env.step_env(key, state.env, jnp.asarray(action, jnp.int32), run_params)
        return (GymnaxState(jax.tree.map(_canonical_leaf, nxt), observe(obs)), jnp.asarray(reward, jnp.float32),
                jnp.asarray(terminated, bool))

    def task_features(state):
        """The feature map of the observation."""
        return fm.fn(state.obs)

    params = {"features": features, "gamma": gamma, "max_episode_steps": cap,
              "low": [float(v) for v in lo], "high": [float(v) for v in hi], **fm.params, **own}
    return ControlEnv(name=name, num_actions=num_actions, num_features=fm.num_features, num_active=width,
                      gamma=gamma, max_episode_steps=cap, params=params, reset=reset, step=step,
                      features=task_features)


# ------------------------------------------------------------------ making a task

def make(name: str, **params) -> ControlEnv:
    """The task `name` (registered, or `package.module:function`) with its
    parameters; `ValueError` naming the field for an unknown task or parameter
    or a bad value."""
    make_env = factory(name)
    sig = inspect.signature(make_env).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in sig.values()):  # else the factory checks its own
        allowed = list(sig)
        for key in params:
            if key not in allowed:
                raise ValueError(f"{key}: not a parameter of {name}; allowed: {', '.join(allowed)}")
    try:
        env = make_env(**params)
    except (ValueError, ImportError):  # already one line naming its field; a missing extra (the spec's)
        raise
    except Exception as e:  # any other error of a user's factory: one line, not a traceback
        raise ValueError(f"task: {name} failed: {type(e).__name__}: {e}") from None
    if not isinstance(env, ControlEnv):
        raise ValueError(f"task: {name!r} returned a {type(env).__name__}, not a ControlEnv")
    return check_task(env, name)  # sizes, discount and the features' shape: one line, not a traceback


__all__ = ["GYMNAX", "MAZE_MAP", "TASKS", "ControlEnv", "GymnaxState", "acrobot", "cliff_walking",
           "cliff_walking_tables", "factory", "gymnax_task", "make", "maze", "maze_tables", "mountain_car", "names",
           "register", "tiling"]
