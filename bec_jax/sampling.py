"""Pure transition samplers: (key or uniforms, state) -> (transition, state).

Two settings:
  * `markov`: one trajectory under the behaviour policy mu, emitting rho = pi/mu;
  * `iid`: sub-sampled transitions s ~ d_mu, a ~ mu(.|s), s' ~ P(.|s, a), the
    setting the paper states for CTDC.

Sampling is on the hot path of a sweep, so each draw is an inverse-CDF lookup in a
precomputed table with one uniform: for each state s, the joint outcomes (a, s') of
positive probability are listed once (the row's *support*), with their cumulative
probabilities, next state, reward and rho. A draw is then a comparison against a
row of at most `max support` entries and three gathers; `jax.random.categorical`
is several times slower here.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax import mdp as mdp_lib
from bec_jax.transition import Transition

# Above any uniform in [0, 1): marks the last outcome of a row and the padding, so
# rounding of cumulative sums in float32 can never select a zero-probability entry.
_NEVER = 2.0

KINDS = ("markov", "iid")


class SamplerTables(NamedTuple):
    """Precomputed lookup tables of a model (a pytree; W = max support size).

    Attributes:
      phi: (S, k) features.
      cdf: (S, W) cumulative probabilities of the (a, s') outcomes of each state.
      next_state: (S, W) int32 next state of each outcome.
      reward: (S, W) reward of each outcome.
      rho: (S, W) importance ratio of each outcome's action.
      state_cdf: (S,) cumulative d_mu, for i.i.d. sampling of s.
      start_cdf: (S,) cumulative start distribution.
      discount: () gamma.
    """

    phi: jax.Array
    cdf: jax.Array
    next_state: jax.Array
    reward: jax.Array
    rho: jax.Array
    state_cdf: jax.Array
    start_cdf: jax.Array
    discount: jax.Array


def _cdf(p: np.ndarray) -> np.ndarray:
    """Cumulative table for inverse-CDF with `sum(u >= cdf)`: entries from the last
    positive-probability one on are set above 1."""
    c = np.cumsum(p) / p.sum()
    last = int(np.nonzero(p > 0)[0][-1])
    c[last:] = _NEVER
    return c


def build_tables(env: mdp_lib.FiniteMDP, dtype=jnp.float32) -> SamplerTables:
    """Builds the sampler tables of `env` (host-side, float64, then cast to `dtype`)."""
    S = env.num_states
    joint = env.mu[:, :, None] * env.P  # (S, A, S): mu(a|s) P(s'|s,a)
    rho = mdp_lib.rho(env)
    supports = [np.flatnonzero(joint[s].reshape(-1) > 0) for s in range(S)]
    W = max(len(idx) for idx in supports)
    cdf = np.full((S, W), _NEVER)
    nxt = np.zeros((S, W), np.int32)
    rew = np.zeros((S, W))
    rh = np.zeros((S, W))
    for s, idx in enumerate(supports):
        a, s2 = np.divmod(idx, S)
        n = len(idx)
        cdf[s, :n] = _cdf(joint[s].reshape(-1)[idx])
        nxt[s, :n] = s2
        rew[s, :n] = env.R[s, a, s2]
        rh[s, :n] = rho[s, a]
    return SamplerTables(
        phi=jnp.asarray(env.phi, dtype),
        cdf=jnp.asarray(cdf, dtype),
        next_state=jnp.asarray(nxt),
        reward=jnp.asarray(rew, dtype),
        rho=jnp.asarray(rh, dtype),
        state_cdf=jnp.asarray(_cdf(mdp_lib.d_mu(env)), dtype),
        start_cdf=jnp.asarray(_cdf(env.start), dtype),
        discount=jnp.asarray(env.gamma, dtype),
    )


def _inverse_cdf(cdf: jax.Array, u: jax.Array) -> jax.Array:
    return jnp.sum(u >= cdf, dtype=jnp.int32)


def init_state_from_uniform(tables: SamplerTables, u: jax.Array) -> jax.Array:
    """The first state of a trajectory, drawn from the start distribution."""
    return _inverse_cdf(tables.start_cdf, u)


def init_state(tables: SamplerTables, key: jax.Array) -> jax.Array:
    """The first state of a trajectory (an int32 scalar), s_0 ~ start."""
    return init_state_from_uniform(tables, jax.random.uniform(key, dtype=tables.cdf.dtype))


def _transition_from(tables: SamplerTables, s: jax.Array, u: jax.Array):
    j = _inverse_cdf(tables.cdf[s], u)
    s_next = tables.next_state[s, j]
    tr = Transition(
        phi=tables.phi[s],
        reward=tables.reward[s, j],
        discount=tables.discount,
        phi_next=tables.phi[s_next],
        rho=tables.rho[s, j],
    )
    return tr, s_next


def markov_step_from_uniforms(tables: SamplerTables, u: jax.Array, state: jax.Array):
    """One step of the behaviour trajectory from state `state`, given uniforms u of
    shape (1,): one uniform picks the pair (a, s').

    Returns (transition, next state).
    """
    return _transition_from(tables, state, u[0])


def iid_step_from_uniforms(tables: SamplerTables, u: jax.Array, state: jax.Array):
    """An i.i.d. transition s ~ d_mu, (a, s') ~ mu P, given uniforms u of shape (2,).

    `state` is ignored and returned as the sampled s' (kept for a common signature).
    """
    del state
    s = _inverse_cdf(tables.state_cdf, u[0])
    return _transition_from(tables, s, u[1])


# Uniforms consumed per step by each sampler.
NUM_UNIFORMS = {"markov": 1, "iid": 2}


def markov_step(tables: SamplerTables, key: jax.Array, state: jax.Array):
    """One step of the behaviour trajectory: (key, state) -> (transition, state)."""
    u = jax.random.uniform(key, (NUM_UNIFORMS["markov"],), dtype=tables.cdf.dtype)
    return markov_step_from_uniforms(tables, u, state)


def iid_step(tables: SamplerTables, key: jax.Array, state: jax.Array):
    """One i.i.d. transition: (key, state) -> (transition, state)."""
    u = jax.random.uniform(key, (NUM_UNIFORMS["iid"],), dtype=tables.cdf.dtype)
    return iid_step_from_uniforms(tables, u, state)


class Sampler(NamedTuple):
    """A sampler bound to one model's tables.

    Attributes:
      tables: the `SamplerTables`.
      init: key -> sampler state.
      step: (key, state) -> (transition, state).
      step_from_uniforms: (u of shape (num_uniforms,), state) -> (transition, state);
        lets a caller draw uniforms in bulk.
      num_uniforms: uniforms per step.
    """

    tables: SamplerTables
    init: Callable
    step: Callable
    step_from_uniforms: Callable
    num_uniforms: int


def make_sampler(env: mdp_lib.FiniteMDP, kind: str = "markov", dtype=jnp.float32) -> Sampler:
    """Binds a sampler of kind "markov" or "iid" to `env`."""
    if kind not in KINDS:
        raise ValueError(f"sampler: unknown sampler {kind!r}; known: {', '.join(KINDS)}")
    tables = build_tables(env, dtype)
    from_u = markov_step_from_uniforms if kind == "markov" else iid_step_from_uniforms
    by_key = markov_step if kind == "markov" else iid_step
    return Sampler(
        tables=tables,
        init=lambda key: init_state(tables, key),
        step=lambda key, state: by_key(tables, key, state),
        step_from_uniforms=lambda u, state: from_u(tables, u, state),
        num_uniforms=NUM_UNIFORMS[kind],
    )
