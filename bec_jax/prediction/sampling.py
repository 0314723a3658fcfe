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
    """Precomputed lookup tables of one model, or of E models of equal shape
    stacked as one block-diagonal chain (a pytree; W = max support size).

    With E models, state id e * S + s is state s of model e: each model's
    trajectory stays in its own block, so one set of tables (and one code path)
    samples any of them.

    Attributes:
      phi: (E*S, k) features.
      cdf: (E*S, W) cumulative probabilities of the (a, s') outcomes of each state.
      next_state: (E*S, W) int32 next state (global id) of each outcome.
      reward: (E*S, W) reward of each outcome.
      rho: (E*S, W) importance ratio of each outcome's action.
      discount: (E*S, W) discount gamma(s, a, s') of each outcome.
      state_cdf: (E, S) cumulative d_mu of each model, for i.i.d. sampling of s.
      start_cdf: (E, S) cumulative start distribution of each model.
    """

    phi: jax.Array
    cdf: jax.Array
    next_state: jax.Array
    reward: jax.Array
    rho: jax.Array
    discount: jax.Array
    state_cdf: jax.Array
    start_cdf: jax.Array

    @property
    def num_states(self) -> int:
        """States per model, S."""
        return int(self.start_cdf.shape[-1])


def _cdf(p: np.ndarray) -> np.ndarray:
    """Cumulative table for inverse-CDF with `sum(u >= cdf)`: entries from the last
    positive-probability one on are set above 1."""
    c = np.cumsum(p) / p.sum()
    last = int(np.nonzero(p > 0)[0][-1])
    c[last:] = _NEVER
    return c


def _supports(env: mdp_lib.FiniteMDP) -> list[np.ndarray]:
    joint = env.mu[:, :, None] * env.P  # (S, A, S): mu(a|s) P(s'|s,a)
    return [np.flatnonzero(joint[s].reshape(-1) > 0) for s in range(env.num_states)]


def build_tables(env, dtype=jnp.float32, as_numpy: bool = False) -> SamplerTables:
    """Builds the sampler tables of `env`, a `FiniteMDP` or a sequence of E
    models with equal numbers of states and features (host-side, float64, then
    cast to `dtype`). `as_numpy` keeps them NumPy arrays (to be baked into a
    jitted program as constants, with nothing compiled to place them)."""
    models = [env] if isinstance(env, mdp_lib.FiniteMDP) else list(env)
    S, k = models[0].num_states, models[0].num_features
    for i, m in enumerate(models):
        if (m.num_states, m.num_features) != (S, k):
            raise ValueError(f"env: models stacked in one sampler need equal shapes; model {i} has "
                             f"{m.num_states} states and {m.num_features} features, model 0 {S} and {k}")
    supports = [_supports(m) for m in models]
    W = max(len(idx) for sup in supports for idx in sup)
    E = len(models)
    cdf = np.full((E * S, W), _NEVER)
    nxt = np.zeros((E * S, W), np.int32)
    rew = np.zeros((E * S, W))
    rh = np.zeros((E * S, W))
    disc = np.zeros((E * S, W))
    for e, (m, sup) in enumerate(zip(models, supports)):
        joint = m.mu[:, :, None] * m.P
        rho = mdp_lib.rho(m)
        gam = mdp_lib.discounts(m)
        for s, idx in enumerate(sup):
            a, s2 = np.divmod(idx, S)
            n, row = len(idx), e * S + s
            cdf[row, :n] = _cdf(joint[s].reshape(-1)[idx])
            nxt[row, :n] = e * S + s2
            rew[row, :n] = m.R[s, a, s2]
            rh[row, :n] = rho[s, a]
            disc[row, :n] = gam[s, a, s2]
    dt = np.dtype(dtype)
    tables = SamplerTables(
        phi=np.concatenate([m.phi for m in models]).astype(dt),
        cdf=cdf.astype(dt),
        next_state=nxt,
        reward=rew.astype(dt),
        rho=rh.astype(dt),
        discount=disc.astype(dt),
        state_cdf=np.stack([_cdf(mdp_lib.d_mu(m)) for m in models]).astype(dt),
        start_cdf=np.stack([_cdf(m.start) for m in models]).astype(dt),
    )
    return tables if as_numpy else SamplerTables(*(jnp.asarray(x) for x in tables))


def _inverse_cdf(cdf: jax.Array, u: jax.Array) -> jax.Array:
    return jnp.sum(u >= cdf, dtype=jnp.int32)


def init_state_from_uniform(tables: SamplerTables, u: jax.Array, env: int | jax.Array = 0) -> jax.Array:
    """The first state of a trajectory of model `env`, drawn from its start distribution."""
    return env * tables.num_states + _inverse_cdf(tables.start_cdf[env], u)


def init_state(tables: SamplerTables, key: jax.Array, env: int | jax.Array = 0) -> jax.Array:
    """The first state of a trajectory (an int32 scalar), s_0 ~ start of model `env`."""
    return init_state_from_uniform(tables, jax.random.uniform(key, dtype=tables.cdf.dtype), env)


def _transition_from(tables: SamplerTables, s: jax.Array, u: jax.Array):
    j = _inverse_cdf(tables.cdf[s], u)
    s_next = tables.next_state[s, j]
    tr = Transition(
        phi=tables.phi[s],
        reward=tables.reward[s, j],
        discount=tables.discount[s, j],
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

    `state` only says which model (its block) to sample; it is returned as the
    sampled s' (kept for a common signature).
    """
    S = tables.num_states
    env = state // S
    s = env * S + _inverse_cdf(tables.state_cdf[env], u[0])
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
      init: key -> sampler state (model 0; `init_state(tables, key, e)` for model e).
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


def make_sampler(env, kind: str = "markov", dtype=jnp.float32) -> Sampler:
    """Binds a sampler of kind "markov" or "iid" to `env` (a `FiniteMDP`, or a
    sequence of equal-shape models; see `build_tables`)."""
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
