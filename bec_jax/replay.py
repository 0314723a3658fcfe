"""A replay buffer of one continuing stream as fixed-shape arrays written as a
ring: `replay_init`, `replay_add`, `valid`, `sample_slots`, `transitions`.
Written for one run; callers vmap over runs.

A continuing stream has no episode ends, so transition j's next observation is
transition j + 1's observation: each observation is stored once. With capacity
C the ring has M = C + 1 slots; slot j mod M holds transition j's observation,
action and reward, and transition j's next observation is slot (j + 1) mod M.
After c transitions the buffer holds the last n = min(c, C) of them, j in
[c - n, c); the one slot left over, c mod M, holds the newest observation
(the next transition's start), not a transition.

Why not flashbax (InstaDeep's JAX replay library): an update of Naik et al.'s
deep agents is one step over the whole buffer (`_sample_from_buffer` in
abhisheknaik96/continuing-rl-exps draws min(buffer_size, len(buffer))
transitions), which a masked pass over these arrays computes and flashbax's
samplers do not offer; the memory plan counts these arrays' bytes exactly; and
flashbax would bring flax and tensorstore as dependencies for what is a few
lines here. Its flat buffer stores each observation once too.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Replay(NamedTuple):
    """obs: (M, d) observations; actions: (M,) int32; rewards: (M,); count: ()
    int32, the transitions added so far (module docstring: M = capacity + 1)."""

    obs: jax.Array
    actions: jax.Array
    rewards: jax.Array
    count: jax.Array


def replay_init(capacity: int, first_obs: jax.Array, dtype=jnp.float32) -> Replay:
    """An empty buffer of `capacity` transitions whose stream starts at
    `first_obs` (d,)."""
    first_obs = jnp.asarray(first_obs, dtype)
    M = int(capacity) + 1
    obs = jnp.zeros((M,) + first_obs.shape, dtype).at[0].set(first_obs)
    return Replay(obs=obs, actions=jnp.zeros((M,), jnp.int32), rewards=jnp.zeros((M,), dtype),
                  count=jnp.zeros((), jnp.int32))


def capacity(buf: Replay) -> int:
    """C, the transitions the buffer holds at most."""
    return buf.actions.shape[0] - 1


def replay_add(buf: Replay, action: jax.Array, reward: jax.Array, next_obs: jax.Array) -> Replay:
    """The buffer with the transition (last observation, action, reward,
    next_obs) added, the oldest dropped when full."""
    M = buf.actions.shape[0]
    c = buf.count
    slot = c % M
    return Replay(obs=buf.obs.at[(c + 1) % M].set(next_obs.astype(buf.obs.dtype)),
                  actions=buf.actions.at[slot].set(jnp.asarray(action, jnp.int32)),
                  rewards=buf.rewards.at[slot].set(jnp.asarray(reward, buf.rewards.dtype)),
                  count=c + 1)


def size(buf: Replay) -> jax.Array:
    """n = min(count, C), the transitions held."""
    return jnp.minimum(buf.count, capacity(buf))


def valid(buf: Replay) -> jax.Array:
    """(M,) bool: the slots that hold one of the n transitions (every slot but
    the newest observation's once the buffer is full)."""
    M = buf.actions.shape[0]
    k = jnp.arange(M, dtype=jnp.int32)
    return (k < buf.count) & (k != buf.count % M)


def sample_slots(buf: Replay, key: jax.Array, batch: int) -> jax.Array:
    """(batch,) int32 slots of transitions drawn uniformly, with replacement,
    from the n held (as DQN's uniform replay draws; n >= 1)."""
    u = jax.random.uniform(key, (int(batch),))
    n = size(buf)
    back = jnp.minimum((u * n.astype(u.dtype)).astype(jnp.int32), n - 1)
    return (buf.count - 1 - back) % buf.actions.shape[0]


def next_slots(buf: Replay, slots: jax.Array) -> jax.Array:
    """The slots of the next observations of the transitions in `slots`."""
    return (slots + 1) % buf.actions.shape[0]


def transitions(buf: Replay, slots: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(obs, actions, rewards, next_obs) of the transitions in `slots`."""
    return buf.obs[slots], buf.actions[slots], buf.rewards[slots], buf.obs[next_slots(buf, slots)]


def nbytes(capacity_: int, obs_size: int, itemsize: int = 4) -> int:
    """Bytes of a buffer of `capacity_` transitions of `obs_size` observations:
    (C + 1) rows of the observation, an int32 action and a reward."""
    return (int(capacity_) + 1) * (int(obs_size) * itemsize + 4 + itemsize) + 4


__all__ = ["Replay", "capacity", "nbytes", "next_slots", "replay_add", "replay_init", "sample_slots", "size",
           "transitions", "valid"]
