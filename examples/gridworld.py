"""A gridworld of one's own as a bec_jax control task: the task contract, worked.

A task is a `ControlEnv` built by a factory whose keyword parameters are the
task's parameters. From the repository root (the current directory is searched
for package.module:function references):

    bec-jax control --task examples.gridworld:make_gridworld --task-param size=4 \
        --algorithm cq --alpha 0.5 --beta 0.01 --episodes 30 --seeds 2 --out runs/grid

A task parameter with several values is a grid axis: `--task-param
slip=0,0.1,0.2` runs every value in one compiled program, because this factory
takes `slip` as a traced JAX scalar (it uses it only in JAX operations, and
checks its range only when it is a number). `size` changes the task's shapes,
so `--task-param size=4,5` compiles one program per value.

or in Python, `tasks.register("gridworld", make_gridworld)` and then
`ControlSpec(task="gridworld", ...)`.

The contract: three pure functions of one example (the engine jits and vmaps
them), sizes, the discount and the episode cap.

  reset(key) -> state                      any pytree of arrays
  step(key, state, action) -> (next_state, reward float32 (), terminal bool ())
  features(state) -> (A, m) int32          indices of the features that are 1 for
                                           (state, b), every action b (sparse), or
                     (A, d) float32        the feature vectors themselves (dense)

`terminal` is true termination only; the loop ends an episode after
`max_episode_steps` steps and learns that last transition as non-terminal.
"""
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax.control.tasks import ControlEnv

MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))  # up, right, down, left


def make_gridworld(*, size=5, slip=0.0, gamma=0.99, max_episode_steps=200) -> ControlEnv:
    """A size x size grid: start at the top-left corner, the goal (terminal) at
    the bottom-right, reward -1 per step, moves off the grid stay put; with
    probability `slip` the move is one of the four at random. One-hot
    features: Q(s, a) = w[a * size**2 + s]."""
    if not isinstance(size, int) or size < 2:
        raise ValueError(f"size: an integer >= 2, got {size!r}")  # one line, naming the field
    # A grid axis's values are checked as numbers first, then traced (no Python test on a tracer).
    if isinstance(slip, numbers.Real) and not 0.0 <= slip <= 1.0:
        raise ValueError(f"slip: a probability in [0, 1], got {slip!r}")
    n, goal = size * size, size * size - 1
    # The dynamics as (n, 4) tables, built once in NumPy; step only looks them up.
    nxt = np.zeros((n, 4), np.int32)
    for s in range(n):
        r, c = divmod(s, size)
        for a, (dr, dc) in enumerate(MOVES):
            nxt[s, a] = min(max(r + dr, 0), size - 1) * size + min(max(c + dc, 0), size - 1)
    nxt = jnp.asarray(nxt)
    offsets = jnp.arange(4, dtype=jnp.int32)[:, None] * n  # action b's block of weights

    def reset(key):
        """The start state (the key is unused: a fixed start)."""
        return jnp.int32(0)

    def step(key, state, action):
        """Move (with probability slip a random move); the goal ends the episode."""
        u = jax.random.uniform(key, (2,))
        action = jnp.where(u[0] < slip, jnp.minimum((u[1] * 4).astype(jnp.int32), 3), action)
        s = nxt[state, action]
        return s, jnp.float32(-1.0), s == goal

    def features(state):
        """(4, 1) indices b * n + state."""
        return offsets + state

    return ControlEnv(name="gridworld", num_actions=4, num_features=4 * n, num_active=1, gamma=gamma,
                      max_episode_steps=max_episode_steps,
                      params={"size": size, "slip": slip, "gamma": gamma, "max_episode_steps": max_episode_steps},
                      reset=reset, step=step, features=features)
