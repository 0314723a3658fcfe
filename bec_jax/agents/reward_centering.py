"""Reward centering for deep Q-learning agents: the centered Q-learning target
and loss, and the reward-rate estimate rbar with its step size, written for one
example or one batch of transitions (rlax-style; callers vmap over agents).

Naik, Wan, Tomar and Sutton, *Reward Centering* (RLC 2024, arXiv 2405.09999),
and the BEC paper's eqs. (9)-(13) [src1, src2, src3, rewardcentering1,
rewardcentering2], on action values with a target network:

    delta = r - rbar + gamma max_a' q_target(s', a') - q(s, a)
    value-based centering:  rbar <- rbar + beta mean(delta)
    simple centering:       rbar <- rbar + beta mean(r - rbar)
    loss = mean((q(s, a) - stop_gradient(r - rbar + gamma max q_target(s')))^2)

over the transitions of a batch, as their deep agents do it (`DeepCDiscAgent.
_update_params` in abhisheknaik96/continuing-rl-exps, `agents/
control_agents_deep.py`, commit de89d49: the MSE loss, rbar moved by beta times
the batch mean). With their unbiased step size (`robust_to_initialization`,
the trick of Sutton & Barto 2018, Exercise 2.7) beta = beta0 / o with
o <- o + beta0 (1 - o) from o = 0 (so the first update has beta = 1), and the
loss's target uses the updated rbar (their target corrected by rbar's change,
old minus new). gamma = 1 with value-based centering is differential
Q-learning (Wan, Naik & Sutton 2021) on a network; rbar held at 0 (beta0 = 0)
is DQN.

An agent's update, for a batch (q_fn any network, `q_target` its target copy):

    q = q_fn(params, obs)                       # (B, A), differentiated
    v_next = q_target(obs_next).max(-1)         # (B,), a constant
    q_sa = q[arange(B), actions]
    delta = centered_q_td_error(q_sa, r, discount, v_next, rate.rbar)
    rate2 = rate_update(rate, delta, beta0, unbiased=True)       # value-based
    loss = centered_q_loss(q_sa, r, discount, v_next, rate2.rbar)

`bec_jax.control.continuing.deep` is this module's user in the library: the
continuing front's network learners.
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp


class RateState(NamedTuple):
    """rbar: () the reward-rate estimate; trace: () the unbiased step size's o
    (0 before the first update; unused with a constant step size); count: ()
    int32 updates so far."""

    rbar: jax.Array
    trace: jax.Array
    count: jax.Array


def rate_init(rbar0: float = 0.0, dtype=jnp.float32) -> RateState:
    """rbar = `rbar0`, o = 0, no updates yet."""
    return RateState(rbar=jnp.asarray(rbar0, dtype), trace=jnp.zeros((), dtype), count=jnp.zeros((), jnp.int32))


def rate_step_size(state: RateState, beta0: jax.Array, *, unbiased: bool) -> tuple[jax.Array, jax.Array]:
    """(beta, o') of this update: beta0 and o unchanged with a constant step
    size; with the unbiased one o' = o + beta0 (1 - o) and beta = beta0 / o'
    (0 where beta0 is 0: o stays 0, no 0 / 0)."""
    beta0 = jnp.asarray(beta0, state.rbar.dtype)
    if not unbiased:
        return beta0, state.trace
    o = state.trace + beta0 * (1 - state.trace)
    return beta0 / jnp.where(o > 0, o, jnp.ones_like(o)), o


def _mean(x: jax.Array, mask: jax.Array | None) -> jax.Array:
    if mask is None:
        return jnp.mean(x)
    mask = jnp.broadcast_to(mask, x.shape)
    n = jnp.maximum(jnp.sum(mask), 1).astype(x.dtype)
    return jnp.sum(jnp.where(mask, x, jnp.zeros_like(x))) / n


def rate_update(state: RateState, signal: jax.Array, beta0: jax.Array, *, unbiased: bool = False,
                mask: jax.Array | None = None) -> RateState:
    """rbar <- rbar + beta mean(signal) over the entries `mask` keeps (all by
    default): `signal` the TD errors delta for value-based centering (eq. (13)
    [rewardcentering2]), the rewards less rbar, r - rbar, for simple centering
    (eq. (11) [src3]). beta from `rate_step_size`."""
    chex.assert_rank(state.rbar, 0)
    beta, o = rate_step_size(state, beta0, unbiased=unbiased)
    return RateState(rbar=state.rbar + beta * _mean(signal, mask), trace=o, count=state.count + 1)


def centered_q_td_error(q_sa: jax.Array, reward: jax.Array, discount: jax.Array, v_next: jax.Array,
                        rbar: jax.Array) -> jax.Array:
    """delta = r - rbar + discount v_next - q(s, a), elementwise, with v_next the
    bootstrap value max_a' q_target(s', a') (a constant: no gradient flows)."""
    return reward - rbar + discount * jax.lax.stop_gradient(v_next) - q_sa


def centered_q_learning(q_tm1: jax.Array, a_tm1: jax.Array, r_t: jax.Array, discount_t: jax.Array,
                        q_t: jax.Array, rbar: jax.Array) -> jax.Array:
    """The centered Q-learning TD error of one transition (rlax's
    `q_learning` with the reward less rbar): q_tm1 (A,) the values at s,
    q_t (A,) the bootstrap (target) network's at s'."""
    chex.assert_rank([q_tm1, a_tm1, r_t, discount_t, q_t, rbar], [1, 0, 0, 0, 1, 0])
    return centered_q_td_error(q_tm1[a_tm1], r_t, discount_t, jnp.max(q_t), rbar)


def centered_q_loss(q_sa: jax.Array, reward: jax.Array, discount: jax.Array, v_next: jax.Array,
                    rbar: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """mean((q(s, a) - stop_gradient(r - rbar + discount v_next))^2) over the
    entries `mask` keeps: Naik et al.'s MSE loss (PyTorch's `MSELoss`, the mean
    over the batch), whose gradient in the network's parameters is the centered
    semi-gradient times -2 / B."""
    target = jax.lax.stop_gradient(reward - rbar + discount * v_next)
    err = q_sa - target
    return _mean(err * err, mask)


__all__ = ["RateState", "centered_q_learning", "centered_q_loss", "centered_q_td_error", "rate_init",
           "rate_step_size", "rate_update"]
