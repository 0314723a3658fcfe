"""Control with linear action values: Q-learning, Greedy-GQ, their centered forms
(Bellman error centering applied to action values) and reward-centered Q-learning,
as pure `init`/`update` pairs on one example (batch them with `jax.vmap`).

Action values are linear, Q(s, a) = w^T phi(s, a). Every update is written once
with the two feature operations of `bec_jax.control.transition`: `q_values`
(w^T phi) and `add` (w + amount phi), which take either kind of features, sparse
binary (integer indices of the features that are 1: the fast path, a gather and
a scatter-add of m entries) or dense (float vectors phi). Scatter-add
accumulates repeated indices, so where the indices of (s, a) and of (s', a*)
overlap (or an index repeats within one set) the sparse result is the dense
linear update theta += alpha [delta phi - gamma (u^T phi) phi'] with phi = sum
of the one-hot vectors of the indices.

Every update reads the state before the update: the greedy next action
a* = argmax_b Q(s', b) (`jnp.argmax`: ties go to the lowest action index, as
`np.argmax` in the authors' code), the TD error
    delta = r + discount Q(s', a*) - Q(s, a)
(`discount` is 0 where s' is terminal) and p = u^T phi(s, a).

No importance ratio appears in any of these methods. They are one-step methods
that condition on the taken action a (the update is to Q(s, a), whatever policy
chose a), and the target policy, greedy in Q, enters only through the
bootstrapped action a* at s' (Greedy-GQ's expectation over pi(.|s') of phi(s', b)
is phi(s', a*) for a greedy pi). The authors' code never applies a ratio either.

Algorithms (module-level `Algorithm`s, registered on import in this order; `register`
adds a user's, `get` also takes `package.module:attribute`):
  q            Watkins' Q-learning with linear action values.
  cq           centered Q-learning: the paper's CTD, eqs. (28)-(29) [omega,
               theta], on action values with the greedy target (the authors' CQ).
  gq           Greedy-GQ (Maei, Szepesvari, Bhatnagar & Sutton 2010), published
               form: the gradient correction uses `discount` (0 at termination).
  cgq          centered Greedy-GQ: the paper's CTDC, eqs. (32)-(34) [thetavmtdc,
               uvmtdc, omegavmtdc], with the greedy target; published form.
  gq_authors   Greedy-GQ as in the authors' code (GameAI-NJUPT/BEC).
  cgq_authors  centered Greedy-GQ as in the authors' code.
  rcq_simple   Q-learning with simple reward centering (Naik, Wan, Tomar & Sutton,
               "Reward Centering", RLC 2024).
  rcq_value    Q-learning with value-based reward centering (same paper).

Special cases (`Algorithm.case_of`), bit for bit: q is cq with beta = 0 (omega
stays 0 and delta - 0 is delta), cq is cgq with zeta = 0 (u stays 0, so the
correction adds -0, which changes no weight), gq is cgq with beta = 0,
gq_authors is cgq_authors with beta = 0, and rcq_value is cq. A program that
runs several of them runs them as one member (`control.program.fusion`).

The authors' forms differ from the published ones in one place only: the
correction w -= alpha gamma p phi(s', a*) uses the task's discount
`tr.gamma` also on terminal transitions (their code has no (1 - term) factor
there), where the published form uses `tr.discount`, which is 0 at termination,
so the correction vanishes (the terminal state has no features). The TD error
uses `tr.discount` in both. On non-terminal transitions the two forms are equal.

Value-based reward centering is exactly CQ: with the centered TD error
delta - rbar, its updates w += alpha (delta - rbar) phi and
rbar += beta (delta - rbar) are CQ's with omega = rbar (the paper's remark that
value-based reward centering is Bellman error centering, eq. (24)
[tdcentering]). `rcq_value` computes them with the same operations as `cq`, so
the two give the same weights and omega/rbar bit for bit.

This module knows nothing of environments: a `ControlTransition` carries the
features an update needs.
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from bec_jax.algorithms import lookup
from bec_jax.algorithms.base import Algorithm, StepSize, resolve, step_size, zero_count
from bec_jax.control.transition import ControlTransition, add, is_sparse, q_values

# ------------------------------------------------------------------ shared pieces

def check_inputs(w: jax.Array, tr: ControlTransition) -> None:
    """Shape checks for one example (batch with `vmap`, never with extra axes):
    w (d,), active (m,) and next_active (A, m) of one kind (integer indices, or
    float vectors with m = d), scalars of rank 0."""
    chex.assert_rank([w, tr.active, tr.next_active, tr.reward, tr.discount, tr.gamma],
                     [1, 1, 2, 0, 0, 0])
    if is_sparse(tr.active):
        chex.assert_type([tr.active, tr.next_active], int)
    else:
        chex.assert_type([tr.active, tr.next_active], float)
        chex.assert_axis_dimension(tr.active, 0, w.shape[0])
    chex.assert_axis_dimension(tr.next_active, 1, tr.active.shape[0])


def greedy_td_error(w: jax.Array, tr: ControlTransition) -> tuple[jax.Array, jax.Array]:
    """(delta, a*) from weights w: a* = argmax_b Q(s', b) (lowest index on ties) and
    delta = r + discount Q(s', a*) - Q(s, a). Q(s', .) is computed once."""
    q_next = q_values(w, tr.next_active)
    a_star = jnp.argmax(q_next)
    delta = tr.reward + tr.discount * q_next[a_star] - q_values(w, tr.active)
    return delta, a_star


def _correct(w: jax.Array, tr: ControlTransition, a_star: jax.Array, amount: jax.Array) -> jax.Array:
    """w - amount phi(s', a*)."""
    return add(w, tr.next_active[a_star], -amount)


_ALPHA = step_size("alpha", "step size of the weights w")
_BETA_OMEGA = step_size("beta", "step size of omega, the estimate of E[delta]")
_BETA_RBAR = step_size("beta", "step size of rbar, the average-reward estimate")
_ZETA = step_size("zeta", "step size of the auxiliary weights u")


# ------------------------------------------------------------------ Q-learning

class QState(NamedTuple):
    """w: (d,) weights; count: updates so far."""

    w: jax.Array
    count: jax.Array


def q_init(w0: jax.Array) -> QState:
    """Starts Q-learning at `w0`."""
    return QState(w=jnp.asarray(w0), count=zero_count())


def q_update(state: QState, tr: ControlTransition, alpha: StepSize) -> QState:
    """One Q-learning step (Watkins 1989, linear): w += alpha delta phi(s, a)."""
    check_inputs(state.w, tr)
    a = resolve(alpha, state.count)
    delta, _ = greedy_td_error(state.w, tr)
    return QState(w=add(state.w, tr.active, a * delta), count=state.count + 1)


# ------------------------------------------------------------------ centered Q-learning

class CQState(NamedTuple):
    """w: (d,) weights; omega: () estimate of E[delta]; count: updates so far."""

    w: jax.Array
    omega: jax.Array
    count: jax.Array


def cq_init(w0: jax.Array) -> CQState:
    """Starts centered Q-learning at `w0` with omega = 0."""
    w0 = jnp.asarray(w0)
    return CQState(w=w0, omega=jnp.zeros((), w0.dtype), count=zero_count())


def cq_update(state: CQState, tr: ControlTransition, alpha: StepSize, beta: StepSize) -> CQState:
    """One centered Q-learning step (the paper's CTD, eqs. (28)-(29) [omega, theta],
    on action values): w += alpha (delta - omega) phi(s, a); omega += beta (delta - omega)."""
    check_inputs(state.w, tr)
    a, b = resolve(alpha, state.count), resolve(beta, state.count)
    delta, _ = greedy_td_error(state.w, tr)
    err = delta - state.omega
    return CQState(w=add(state.w, tr.active, a * err), omega=state.omega + b * err,
                   count=state.count + 1)


# ------------------------------------------------------------------ Greedy-GQ

class GQState(NamedTuple):
    """w: (d,) weights; u: (d,) auxiliary weights; count: updates so far."""

    w: jax.Array
    u: jax.Array
    count: jax.Array


def gq_init(w0: jax.Array) -> GQState:
    """Starts Greedy-GQ at `w0` with u = 0."""
    w0 = jnp.asarray(w0)
    return GQState(w=w0, u=jnp.zeros_like(w0), count=zero_count())


def _gq(state: GQState, tr: ControlTransition, alpha: StepSize, zeta: StepSize,
        correction_discount: jax.Array) -> GQState:
    check_inputs(state.w, tr)
    a, z = resolve(alpha, state.count), resolve(zeta, state.count)
    delta, a_star = greedy_td_error(state.w, tr)
    p = q_values(state.u, tr.active)
    w = _correct(add(state.w, tr.active, a * delta), tr, a_star, a * correction_discount * p)
    return GQState(w=w, u=add(state.u, tr.active, z * (delta - p)), count=state.count + 1)


def gq_update(state: GQState, tr: ControlTransition, alpha: StepSize, zeta: StepSize) -> GQState:
    """One Greedy-GQ step (Maei et al. 2010), published form: w += alpha delta phi(s, a);
    w -= alpha discount p phi(s', a*); u += zeta (delta - p) phi(s, a), with p = u^T phi(s, a). At
    termination discount = 0 and the correction vanishes."""
    return _gq(state, tr, alpha, zeta, tr.discount)


def gq_authors_update(state: GQState, tr: ControlTransition, alpha: StepSize,
                      zeta: StepSize) -> GQState:
    """One Greedy-GQ step as in the authors' code: as `gq_update`, except that the
    correction w -= alpha gamma p phi(s', a*) uses `tr.gamma`, also on terminal
    transitions (no (1 - term) factor)."""
    return _gq(state, tr, alpha, zeta, tr.gamma)


# ------------------------------------------------------------------ centered Greedy-GQ

class CGQState(NamedTuple):
    """w: (d,) weights; u: (d,) auxiliary weights; omega: () estimate of E[delta];
    count: updates so far."""

    w: jax.Array
    u: jax.Array
    omega: jax.Array
    count: jax.Array


def cgq_init(w0: jax.Array) -> CGQState:
    """Starts centered Greedy-GQ at `w0` with u = 0 and omega = 0."""
    w0 = jnp.asarray(w0)
    return CGQState(w=w0, u=jnp.zeros_like(w0), omega=jnp.zeros((), w0.dtype), count=zero_count())


def _cgq(state: CGQState, tr: ControlTransition, alpha: StepSize, beta: StepSize, zeta: StepSize,
         correction_discount: jax.Array) -> CGQState:
    check_inputs(state.w, tr)
    a, b, z = (resolve(alpha, state.count), resolve(beta, state.count), resolve(zeta, state.count))
    delta, a_star = greedy_td_error(state.w, tr)
    err = delta - state.omega
    p = q_values(state.u, tr.active)
    w = _correct(add(state.w, tr.active, a * err), tr, a_star, a * correction_discount * p)
    return CGQState(w=w, u=add(state.u, tr.active, z * (err - p)), omega=state.omega + b * err,
                    count=state.count + 1)


def cgq_update(state: CGQState, tr: ControlTransition, alpha: StepSize, beta: StepSize,
               zeta: StepSize) -> CGQState:
    """One centered Greedy-GQ step (the paper's CTDC, eqs. (32)-(34) [thetavmtdc,
    uvmtdc, omegavmtdc], greedy target), published form: w += alpha
    (delta - omega) phi(s, a); w -= alpha discount p phi(s', a*); u += zeta
    ((delta - omega) - p) phi(s, a); omega += beta (delta - omega). At termination
    discount = 0 and the correction vanishes."""
    return _cgq(state, tr, alpha, beta, zeta, tr.discount)


def cgq_authors_update(state: CGQState, tr: ControlTransition, alpha: StepSize, beta: StepSize,
                       zeta: StepSize) -> CGQState:
    """One centered Greedy-GQ step as in the authors' code: as `cgq_update`, except
    that the correction w -= alpha gamma p phi(s', a*) uses `tr.gamma`, also on
    terminal transitions (no (1 - term) factor)."""
    return _cgq(state, tr, alpha, beta, zeta, tr.gamma)


# ------------------------------------------------------------------ reward-centered Q-learning

class RCQState(NamedTuple):
    """w: (d,) weights; rbar: () average-reward estimate (simple centering) or
    estimate of E[delta] (value-based); count: updates so far."""

    w: jax.Array
    rbar: jax.Array
    count: jax.Array


def rcq_init(w0: jax.Array) -> RCQState:
    """Starts reward-centered Q-learning at `w0` with rbar = 0."""
    w0 = jnp.asarray(w0)
    return RCQState(w=w0, rbar=jnp.zeros((), w0.dtype), count=zero_count())


def rcq_simple_update(state: RCQState, tr: ControlTransition, alpha: StepSize,
                      beta: StepSize) -> RCQState:
    """One Q-learning step with simple reward centering (Naik et al. 2024):
    delta_bar = r - rbar + discount Q(s', a*) - Q(s, a) (computed as delta - rbar);
    w += alpha delta_bar phi(s, a); rbar += beta (r - rbar)."""
    check_inputs(state.w, tr)
    a, b = resolve(alpha, state.count), resolve(beta, state.count)
    delta, _ = greedy_td_error(state.w, tr)
    err = delta - state.rbar
    return RCQState(w=add(state.w, tr.active, a * err), rbar=state.rbar + b * (tr.reward - state.rbar),
                    count=state.count + 1)


def rcq_value_update(state: RCQState, tr: ControlTransition, alpha: StepSize,
                     beta: StepSize) -> RCQState:
    """One Q-learning step with value-based reward centering (Naik et al. 2024):
    delta_bar = delta - rbar; w += alpha delta_bar phi(s, a); rbar += beta delta_bar.
    This is `cq_update` with omega = rbar, operation for operation (bit for bit)."""
    check_inputs(state.w, tr)
    a, b = resolve(alpha, state.count), resolve(beta, state.count)
    delta, _ = greedy_td_error(state.w, tr)
    err = delta - state.rbar
    return RCQState(w=add(state.w, tr.active, a * err), rbar=state.rbar + b * err,
                    count=state.count + 1)


# ------------------------------------------------------------------ descriptors and registry

Q = Algorithm(
    name="q", label="Q", init=q_init, update=q_update, hyperparameters=(_ALPHA,),
    equations="linear Q-learning (Watkins 1989), greedy target a* (no equation in the BEC paper)",
    weights="w", counter="count", case_of=("cq", {"beta": 0.0}))

CQ = Algorithm(
    name="cq", label="CQ", init=cq_init, update=cq_update, hyperparameters=(_ALPHA, _BETA_OMEGA),
    equations="eqs. (28)-(29) [omega, theta] (CTD) on action values with greedy target a* "
              "(the authors' CQ)",
    weights="w", counter="count", case_of=("cgq", {"zeta": 0.0}))

GQ = Algorithm(
    name="gq", label="GQ", init=gq_init, update=gq_update, hyperparameters=(_ALPHA, _ZETA),
    equations="Greedy-GQ of Maei, Szepesvari, Bhatnagar & Sutton (2010), published form: correction "
              "with the transition's discount, 0 at termination (no equation in the BEC paper)",
    weights="w", counter="count", case_of=("cgq", {"beta": 0.0}))

CGQ = Algorithm(
    name="cgq", label="CGQ", init=cgq_init, update=cgq_update,
    hyperparameters=(_ALPHA, _BETA_OMEGA, _ZETA),
    equations="eqs. (32)-(34) [thetavmtdc, uvmtdc, omegavmtdc] (CTDC) on action values with greedy "
              "target a*; correction with the transition's discount, 0 at termination",
    weights="w", counter="count")

GQ_AUTHORS = Algorithm(
    name="gq_authors", label="GQ (authors' code)", init=gq_init, update=gq_authors_update,
    hyperparameters=(_ALPHA, _ZETA),
    equations="Greedy-GQ (Maei et al. 2010) as in the authors' code (GameAI-NJUPT/BEC): correction "
              "with gamma also at termination",
    weights="w", counter="count", case_of=("cgq_authors", {"beta": 0.0}))

CGQ_AUTHORS = Algorithm(
    name="cgq_authors", label="CGQ (authors' code)", init=cgq_init, update=cgq_authors_update,
    hyperparameters=(_ALPHA, _BETA_OMEGA, _ZETA),
    equations="eqs. (32)-(34) [thetavmtdc, uvmtdc, omegavmtdc] on action values as in the authors' "
              "code (GameAI-NJUPT/BEC): correction with gamma also at termination",
    weights="w", counter="count")

RCQ_SIMPLE = Algorithm(
    name="rcq_simple", label="RCQ (simple)", init=rcq_init, update=rcq_simple_update,
    hyperparameters=(_ALPHA, _BETA_RBAR),
    equations="Q-learning with simple reward centering (Naik, Wan, Tomar & Sutton 2024); "
              "eqs. (9)-(11) [src1, src2, src3] on action values with greedy target a*",
    weights="w", counter="count")

RCQ_VALUE = Algorithm(
    name="rcq_value", label="RCQ (value-based)", init=rcq_init, update=rcq_value_update,
    hyperparameters=(_ALPHA, _BETA_RBAR),
    equations="Q-learning with value-based reward centering (Naik et al. 2024); eqs. (12)-(13) "
              "[rewardcentering1, rewardcentering2] on action values, identical to CQ (eq. (24) "
              "[tdcentering])",
    weights="w", counter="count", case_of=("cq", {}))

# name -> Algorithm in registration order: this module's, found by `_discover`,
# then any a user registers.
ALGORITHMS: dict[str, Algorithm] = {}


def register(alg: Algorithm, *, replace: bool = False) -> Algorithm:
    """Adds the control algorithm `alg` under `alg.name` and returns it. A name
    that is already taken is an error (`replace=True` overrides)."""
    if not isinstance(alg, Algorithm):
        raise ValueError(f"algorithm: register expects an Algorithm, got {type(alg).__name__}")
    if alg.name in ALGORITHMS and not replace and ALGORITHMS[alg.name] is not alg:
        raise ValueError(f"algorithm: the control algorithm name {alg.name!r} is already registered; "
                         "choose another name")
    ALGORITHMS[alg.name] = alg
    return alg


def names() -> list[str]:
    """The control algorithm names, in registration order (this module's in definition order)."""
    return list(ALGORITHMS)


def get(ref) -> Algorithm:
    """The control `Algorithm` `ref` names: a registered name, a
    `package.module:attribute` reference (imported, not registered), or an
    `Algorithm` itself; `ValueError` naming `algorithm` and listing the known
    names otherwise."""
    return lookup(ref, ALGORITHMS, "control algorithm")


def _discover() -> None:
    """Registers every module-level `Algorithm` of this module, in definition
    order: adding a control algorithm is defining one here (or registering it)."""
    for value in list(globals().values()):
        if isinstance(value, Algorithm):
            register(value)


_discover()
