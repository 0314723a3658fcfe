"""The agent-environment loop of control, for one run (callers vmap).

In prediction the behaviour policy is fixed and the sampler needs nothing from
the learner; in control the behaviour is epsilon-greedy on the learner's current
action values. One step of one run:

    q     = Q(s, .)                     from the learner's weights
    a     = epsilon-greedy(q)           ties to the lowest action (np.argmax)
    s', r, terminal = task.step(s, a)
    learner <- update(learner, (phi(s, a), r, gamma (1 - terminal), phi(s', .)))
    episode ends on termination or after `max_episode_steps` (a truncation: its
        last transition is learned as non-terminal); then s' <- task.reset()

phi is `task.features`, sparse indices or dense vectors
(`bec_jax.control.transition`); the loop passes them on without looking.

Every finished episode's return and length go into fixed-size buffers inside
the program (no host round-trips): `EpisodeLog`. Curves by episode read the
buffers; curves by step place each episode at the cumulative sum of the lengths.

The randomness of step t of a run comes from fold_in(stream_key, t) only (JAX's
fold_in, computed as fused arithmetic by `bec_jax.threefry`), so a
run's trajectory depends on its seed and its own hyperparameters, never on the
other runs of a batch.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from bec_jax import threefry
from bec_jax.control.transition import ControlTransition, q_values


class Behaviour(NamedTuple):
    """Epsilon-greedy exploration: epsilon_k = max(epsilon * decay^k, epsilon_min)
    after k finished episodes. decay = 1 (the default of a sweep) keeps epsilon
    constant; the authors' schedule is epsilon 0.01, decay 0.9992, min 1e-4.
    The fields may be arrays (one value per run, a sweep's grid axes); then
    `log_decay`, log(decay) taken in float64 on the host, replaces `decay`."""

    epsilon: Any = 0.1
    decay: Any = 1.0
    epsilon_min: Any = 0.0
    log_decay: Any = None

    def at(self, episodes: jax.Array) -> jax.Array:
        """Epsilon after `episodes` finished episodes."""
        eps = jnp.asarray(self.epsilon, jnp.float32)
        log_decay = self.log_decay
        if log_decay is None and self.decay != 1.0:
            # exp(k log decay) with log decay taken in float64: float32 powers of
            # 0.9992 would be off by 4e-5 (relative) after 3000 episodes.
            log_decay = jnp.float32(math.log(self.decay))
        if log_decay is not None:
            eps = eps * jnp.exp(episodes.astype(jnp.float32) * jnp.asarray(log_decay, jnp.float32))
        return jnp.maximum(eps, jnp.asarray(self.epsilon_min, jnp.float32))


def epsilon_greedy(u: jax.Array, q: jax.Array, epsilon: jax.Array) -> jax.Array:
    """The action for Q(s, .) = q (A,) from two uniforms u (2,): with probability
    epsilon uniform over all A actions (the greedy one included), else argmax q
    (the lowest index among ties)."""
    A = q.shape[-1]
    explore = u[0] < epsilon
    random_action = jnp.minimum((u[1] * A).astype(jnp.int32), A - 1)
    return jnp.where(explore, random_action, jnp.argmax(q).astype(jnp.int32))


class LoopState(NamedTuple):
    """The environment side of one run.

    Attributes:
      env: the task's state. active: its state-action features, every action
        ((A, m) indices or (A, d) vectors, `task.features(env)`).
      t: steps of the current episode so far. ret: its return so far.
      episodes: finished episodes.
    """

    env: Any
    active: jax.Array
    t: jax.Array
    ret: jax.Array
    episodes: jax.Array


class EpisodeLog(NamedTuple):
    """Returns and lengths of the first E finished episodes of a run (entries
    after the last finished one: return 0, length 0)."""

    returns: jax.Array
    lengths: jax.Array


def loop_init(task, key: jax.Array, dtype=jnp.float32) -> LoopState:
    """The first state of a run: a reset of `task` with `key`."""
    env = task.reset(key)
    return LoopState(env=env, active=task.features(env), t=jnp.zeros((), jnp.int32),
                     ret=jnp.zeros((), dtype), episodes=jnp.zeros((), jnp.int32))


def log_init(episodes: int, dtype=jnp.float32) -> EpisodeLog:
    """Empty buffers for `episodes` episodes."""
    return EpisodeLog(returns=jnp.zeros((episodes,), dtype), lengths=jnp.zeros((episodes,), jnp.int32))


def uniforms(key: jax.Array) -> jax.Array:
    """(2,) float32 uniforms in [0, 1) from the two 32-bit words of `key`'s data
    (their top 24 bits: exact in float32). A step's key is already a fresh
    output of the generator (fold_in(stream key, t)), so its words are random
    bits; drawing them with `jax.random.uniform` would hash once more, and the
    hashes were most of the cost of a tabular step."""
    words = jax.random.key_data(key).reshape(-1)[:2]
    return (words >> 8).astype(jnp.float32) * jnp.float32(2.0 ** -24)


def act(learner_weights: jax.Array, ls: LoopState, key: jax.Array, behaviour: Behaviour) -> jax.Array:
    """The behaviour's action in the current state (the uniforms are `key`'s words, `uniforms`)."""
    u = uniforms(key)
    return epsilon_greedy(u, q_values(learner_weights, ls.active), behaviour.at(ls.episodes))


def advance(task, update: Callable, weights: Callable, behaviour: Behaviour, max_episode_steps: int,
            gamma: float, learner, ls: LoopState, log: EpisodeLog, key: jax.Array, reward_shift: float = 0.0):
    """The first part of `step`: act, step the task, update the learner and log
    a finished episode. The learner sees r - `reward_shift` (a constant shift,
    the control experiment for centering); returns are logged unshifted.
    Returns (learner, loop state at s' (not yet reset), log, done)."""
    # The action's uniforms are the step key's own words; the task's key is
    # derived from it (and dropped by XLA where the task ignores it).
    a = act(weights(learner), ls, key, behaviour)
    env_next, reward, terminal = task.step(threefry.fold_in(key, 1), ls.env, a)
    next_active = task.features(env_next)
    dtype = ls.ret.dtype
    g = jnp.asarray(gamma, dtype)
    reward = reward.astype(dtype)
    tr = ControlTransition(active=ls.active[a], reward=reward - reward_shift if reward_shift else reward,
                           discount=jnp.where(terminal, jnp.zeros((), dtype), g), gamma=g,
                           next_active=next_active)
    learner = update(learner, tr)
    t = ls.t + 1
    ret = ls.ret + reward
    done = terminal | (t >= max_episode_steps)
    E = log.returns.shape[0]
    slot = jnp.where(done, ls.episodes, E)  # E: out of range, dropped
    log = EpisodeLog(returns=log.returns.at[slot].set(ret, mode="drop"),
                     lengths=log.lengths.at[slot].set(t, mode="drop"))
    ls = LoopState(env=env_next, active=next_active, t=t, ret=ret, episodes=ls.episodes)
    return learner, ls, log, done


def reset_done(task, ls: LoopState, done: jax.Array, key: jax.Array) -> LoopState:
    """The second part of `step`: where the episode is done, a fresh reset (its
    key fold_in(step key, 2)) and the counters back to 0."""
    env_reset = task.reset(threefry.fold_in(key, 2))
    env = jax.tree_util.tree_map(lambda r, n: jnp.where(done, r, n), env_reset, ls.env)
    active = jnp.where(done, task.features(env_reset), ls.active)
    return LoopState(env=env, active=active, t=jnp.where(done, 0, ls.t),
                     ret=jnp.where(done, jnp.zeros((), ls.ret.dtype), ls.ret),
                     episodes=ls.episodes + done.astype(jnp.int32))


def step(task, update: Callable, weights: Callable, behaviour: Behaviour, max_episode_steps: int,
         gamma: float, learner, ls: LoopState, log: EpisodeLog, key: jax.Array, reward_shift: float = 0.0):
    """One step of one run: act, step the task, update the learner, log and
    reset at an episode's end (`advance`, then `reset_done`). `update(learner,
    transition) -> learner` has the hyperparameters bound; `weights(learner)`
    gives its weight vector.

    Returns (learner, loop state, log)."""
    learner, ls, log, done = advance(task, update, weights, behaviour, max_episode_steps, gamma, learner, ls,
                                     log, key, reward_shift)
    return learner, reset_done(task, ls, done, key), log
