"""Bellman error centering for any differentiable value function.

The linear algorithms of `bec_jax.algorithms` work on feature vectors. This module
gives the same updates for a value function `v(params, x) -> ()` of any form: a
pure-JAX network, a Flax/Haiku/Equinox `apply`, or `theta @ x`. `params` is any
pytree and `x` any observation (raw or featurised); nothing here knows about
environments.

The paper's CTD (eqs. omegawithrho, thetawithrho) for a general v:

    delta  = r + gamma v(params, x') - v(params, x)
    params <- params + alpha rho (delta - omega) grad v(params, x)
    omega  <- omega + beta rho (delta - omega)

Pieces (each written for ONE transition; `batch_*` = vmap over a leading axis and
a mean, as rlax does):

  * `centered_td_loss`: 0.5 rho (stop_gradient(target) - v(x) - omega)^2. Its
    gradient is minus the centered semi-gradient direction, so it goes into any
    optax optimizer unchanged; it returns the TD error for the omega update.
  * `centered_td_direction`: the ascent direction rho (delta - omega) grad v(x),
    for explicit `params + alpha * direction` updates.
  * `OmegaState`, `omega_init`, `omega_update`: omega, the running estimate of
    the mean TD error E_pi[delta] (eq. omegawithrho).
  * `centered_tdc_direction`: the TDC-style gradient correction with auxiliary
    weights h in parameter space (linearised TDC; CTDC, eqs. thetavmtdc, uvmtdc,
    for linear v).
  * `centered_td_lambda_direction`: centered TD(lambda) with accumulating traces
    over the parameter pytree.
  * `to_grads`: an ascent direction in optax's sign convention.

Off-policy, rho = pi(a|s) / mu(a|s) multiplies every update, including omega's
(as the authors' public code does); rho = 1 on-policy. Centering off = omega held
at 0 (pass `omega=0.0`): then these are TD(0), TDC and TD(lambda).

Why no optax `GradientTransformation`: centering acts on the TD error, before the
gradient is formed, and omega is updated from TD errors, not from gradients. A
transformation sees only gradients, so it cannot do either. The loss plus the
`OmegaState` pair composes with any optax optimizer instead.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from bec_jax.algorithms.base import StepSize, resolve

Params = Any  # a pytree of arrays
ValueFn = Callable[[Params, Any], jax.Array]  # v(params, x) -> () value of one observation


# --------------------------------------------------------------------------- omega

class OmegaState(NamedTuple):
    """omega: () running estimate of the mean TD error E_pi[delta]; count: updates
    APPLIED so far (evaluates a step-size schedule; a skipped or fully masked
    batch does not advance it); skipped: batches whose increment was not finite
    (NaN/inf TD errors), left out by `omega_update`. `skipped` defaults to 0, so
    `OmegaState(omega=..., count=...)` still constructs a valid state."""

    omega: jax.Array
    count: jax.Array
    skipped: jax.Array | int = 0


def omega_init(omega0: float = 0.0, dtype=jnp.float32) -> OmegaState:
    """omega = `omega0`, count = 0."""
    return OmegaState(omega=jnp.asarray(omega0, dtype), count=jnp.zeros((), jnp.int32))


def omega_update(state: OmegaState, delta: jax.Array, rho: jax.Array | float,
                 beta: StepSize, *, mask: jax.Array | None = None) -> OmegaState:
    """omega <- omega + beta mean(rho (delta - omega)) (paper eq. omegawithrho; eq.
    omega when rho = 1).

    `delta` is one TD error () or a batch (B,) of them (then the increment is the
    batch mean); `rho` is a scalar or has delta's shape. `beta` is a float or an
    optax schedule of the update count. Pass rho = 1 for the paper's literal eq.
    omegavmtdc (omega then tracks the behaviour's mean TD error).

    mask: optional bool, delta's shape: the mean is over the entries where mask
    is true only (masked-out entries may hold anything, NaN included). An
    all-false mask is a no-op (omega, count and skipped unchanged).

    Guard: if the increment beta * mean(...) is not finite (a NaN/inf TD error
    or rho among the used entries), omega is left unchanged and `skipped` is
    incremented. `count` advances only on applied updates, so a step-size
    schedule sees the same sequence as if the bad batch had never arrived.
    """
    chex.assert_rank(state.omega, 0)
    chex.assert_type(delta, float)
    rho = jnp.broadcast_to(jnp.asarray(rho, delta.dtype), delta.shape)
    omega0 = jnp.asarray(state.omega)
    inc = rho * (delta - omega0)
    if mask is None:
        n = jnp.asarray(inc.size, jnp.int32)
        total = jnp.sum(inc)
    else:
        mask = jnp.broadcast_to(jnp.asarray(mask, bool), delta.shape)
        n = jnp.sum(mask, dtype=jnp.int32)
        total = jnp.sum(jnp.where(mask, inc, jnp.zeros_like(inc)))
    step = total / jnp.maximum(n, 1).astype(inc.dtype)
    b = resolve(beta, state.count)
    increment = b * step
    used = n > 0
    finite = jnp.isfinite(increment) & jnp.isfinite(step)
    apply = used & finite
    omega = jnp.where(apply, omega0 + jnp.where(finite, increment, 0.0), omega0)
    count = jnp.asarray(state.count) + apply.astype(jnp.int32)
    skipped = jnp.asarray(state.skipped, jnp.int32) + (used & ~finite).astype(jnp.int32)
    return OmegaState(omega=omega.astype(omega0.dtype), count=count.astype(
        jnp.asarray(state.count).dtype), skipped=skipped)


# ---------------------------------------------------------------------- helpers

def _check(v: jax.Array, reward, discount, rho, omega) -> None:
    chex.assert_rank([v, reward, discount, rho, omega], 0)
    chex.assert_type([v, reward, discount], float)


def _scalar(x, dtype) -> jax.Array:
    return jnp.asarray(x, dtype)


def tree_vdot(a: Params, b: Params) -> jax.Array:
    """sum over leaves of <a_leaf, b_leaf> (the inner product of two parameter pytrees)."""
    # HIGHEST: not a GPU's default TF32 (algorithms.base._dot); the same bits on the CPU.
    hi = jax.lax.Precision.HIGHEST
    return sum(jnp.vdot(x, y, precision=hi) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def to_grads(direction: Params) -> Params:
    """An ascent direction (the `*_direction` outputs) in optax's sign convention:
    `optimizer.update(to_grads(direction), opt_state, params)` then moves the
    parameters along `direction` (with `optax.sgd(lr)`: params + lr * direction)."""
    return jax.tree.map(jnp.negative, direction)


def td_error(value_fn: ValueFn, params: Params, x, reward: jax.Array, discount: jax.Array,
             x_next) -> jax.Array:
    """delta = r + gamma v(params, x') - v(params, x) for one transition."""
    v = value_fn(params, x)
    return reward + discount * value_fn(params, x_next) - v


# ------------------------------------------------------------------ centered TD(0)

def centered_td_loss(value_fn: ValueFn, params: Params, omega: jax.Array | float, x,
                     reward: jax.Array, discount: jax.Array, x_next,
                     rho: jax.Array | float = 1.0) -> tuple[jax.Array, jax.Array]:
    """0.5 rho (stop_gradient(r + gamma v(x')) - v(x) - omega)^2 and the TD error.

    Its gradient in `params` is -rho (delta - omega) grad v(x): minus the centered
    semi-gradient of eq. thetawithrho (eq. theta when rho = 1), so
    `params - lr * grad` is one CTD step and any optax optimizer applies it. The
    bootstrap target, omega and rho are constants (stop_gradient). Returns
    (loss, delta) with delta the uncentered TD error, for `omega_update`; use
    `jax.grad(..., argnums=1, has_aux=True)`. omega = 0 gives the TD(0) loss.
    Unpacks a `Transition`: `centered_td_loss(v, params, omega, *transition)`.
    """
    v = value_fn(params, x)
    omega, rho = _scalar(omega, v.dtype), _scalar(rho, v.dtype)
    _check(v, reward, discount, rho, omega)
    target = jax.lax.stop_gradient(reward + discount * value_fn(params, x_next))
    delta = target - v
    err = delta - jax.lax.stop_gradient(omega)
    loss = 0.5 * jax.lax.stop_gradient(rho) * err * err
    return loss, jax.lax.stop_gradient(delta)


def centered_td_direction(value_fn: ValueFn, params: Params, omega: jax.Array | float, x,
                          reward: jax.Array, discount: jax.Array, x_next,
                          rho: jax.Array | float = 1.0) -> tuple[Params, jax.Array]:
    """(rho (delta - omega) grad v(params, x), delta): the CTD ascent direction
    (eq. thetawithrho; eq. theta when rho = 1) and the TD error for `omega_update`.
    `params + alpha * direction` is one CTD step; omega = 0 gives TD(0)."""
    v, vjp = jax.vjp(lambda p: value_fn(p, x), params)
    omega, rho = _scalar(omega, v.dtype), _scalar(rho, v.dtype)
    _check(v, reward, discount, rho, omega)
    delta = reward + discount * value_fn(params, x_next) - v
    (direction,) = vjp((rho * (delta - omega)).astype(v.dtype))
    return direction, delta


# ------------------------------------------------------------- centered TDC

class TDCDirections(NamedTuple):
    """params: ascent direction for the value parameters; h: direction for the
    auxiliary weights (same pytree structure); delta: () TD error (or (B,))."""

    params: Params
    h: Params
    delta: jax.Array


def centered_tdc_direction(value_fn: ValueFn, params: Params, h: Params,
                           omega: jax.Array | float, x, reward: jax.Array,
                           discount: jax.Array, x_next,
                           rho: jax.Array | float = 1.0) -> TDCDirections:
    """Centered TDC directions for one transition, with g = grad v(params, x) and
    g' = grad v(params, x'):

        params: rho [(delta - omega) g - gamma g' (g . h)]
        h:      rho (delta - omega - g . h) g

    Apply as params + alpha * params_dir, h + zeta * h_dir, and omega with
    `omega_update(state, delta, rho, beta)`. For linear v (g = phi, g' = phi') this
    is CTDC exactly: eqs. thetavmtdc, uvmtdc, omegavmtdc, with rho on all three
    updates as in `bec_jax.algorithms.ctdc`; omega = 0 gives TDC (Sutton et al.,
    2009). For nonlinear v it is the *linearised* TDC: nonlinear TDC (Maei et al.,
    2009) adds a Hessian-vector term -(delta - omega - g.h) grad^2 v(x) h (and a
    projection), omitted here, so the convergence guarantee does not carry over.
    """
    v, vjp = jax.vjp(lambda p: value_fn(p, x), params)
    v_next, vjp_next = jax.vjp(lambda p: value_fn(p, x_next), params)
    omega, rho = _scalar(omega, v.dtype), _scalar(rho, v.dtype)
    _check(v, reward, discount, rho, omega)
    chex.assert_trees_all_equal_shapes_and_dtypes(params, h)
    (g,) = vjp(jnp.ones_like(v))
    (g_next,) = vjp_next(jnp.ones_like(v_next))
    delta = reward + discount * v_next - v
    err = delta - omega
    g_h = tree_vdot(g, h)
    params_dir = jax.tree.map(lambda a, b: rho * (err * a - (discount * g_h) * b), g, g_next)
    h_dir = jax.tree.map(lambda a: (rho * (err - g_h)) * a, g)
    return TDCDirections(params=params_dir, h=h_dir, delta=delta)


# ------------------------------------------------------- centered TD(lambda)

def trace_init(params: Params) -> Params:
    """A zero eligibility trace shaped like `params`."""
    return jax.tree.map(jnp.zeros_like, params)


def centered_td_lambda_direction(value_fn: ValueFn, params: Params, trace: Params,
                                 omega: jax.Array | float, x, reward: jax.Array,
                                 discount: jax.Array, x_next,
                                 rho: jax.Array | float = 1.0, *,
                                 lam: float) -> tuple[Params, Params, jax.Array]:
    """Centered TD(lambda) for one transition of a trajectory, with the off-policy
    accumulating trace of Sutton & Barto (2018, Section 12.9),
    z = rho (gamma lambda z_prev + grad v(params, x)):

        direction = (delta - omega) z,   next trace = gamma lambda z.

    `trace` is the trace carried from the previous step, already decayed by that
    step's discount and lambda (start from `trace_init(params)`); returns
    (direction, next trace, delta). lam = 0 is the CTD direction exactly (eqs.
    thetawithrho; omega with `omega_update` as in CTD, eq. omegawithrho). The
    general-parameter version of `bec_jax.algorithms.ctd_lambda`.
    """
    v, vjp = jax.vjp(lambda p: value_fn(p, x), params)
    omega, rho = _scalar(omega, v.dtype), _scalar(rho, v.dtype)
    _check(v, reward, discount, rho, omega)
    chex.assert_trees_all_equal_shapes_and_dtypes(params, trace)
    (g,) = vjp(jnp.ones_like(v))
    delta = reward + discount * value_fn(params, x_next) - v
    z = jax.tree.map(lambda e, a: rho * (e + a), trace, g)
    err = delta - omega
    direction = jax.tree.map(lambda a: err * a, z)
    next_trace = jax.tree.map(lambda a: (discount * lam) * a, z)
    return direction, next_trace, delta


# ---------------------------------------------------------------------- batches

def _batch_rho(rho, reward: jax.Array) -> jax.Array:
    chex.assert_rank(reward, 1)
    return jnp.broadcast_to(jnp.asarray(rho, reward.dtype), reward.shape)


def _mean(tree: Params) -> Params:
    return jax.tree.map(lambda a: jnp.mean(a, axis=0), tree)


def batch_centered_td_loss(value_fn: ValueFn, params: Params, omega: jax.Array | float, x,
                           reward: jax.Array, discount: jax.Array, x_next,
                           rho: jax.Array | float = 1.0) -> tuple[jax.Array, jax.Array]:
    """`centered_td_loss` averaged over a batch (leading axis of x, reward, ...):
    (mean loss, (B,) TD errors)."""
    rho = _batch_rho(rho, reward)
    losses, deltas = jax.vmap(
        lambda *tr: centered_td_loss(value_fn, params, omega, *tr))(x, reward, discount, x_next, rho)
    return jnp.mean(losses), deltas


def batch_centered_td_direction(value_fn: ValueFn, params: Params, omega: jax.Array | float,
                                x, reward: jax.Array, discount: jax.Array, x_next,
                                rho: jax.Array | float = 1.0) -> tuple[Params, jax.Array]:
    """`centered_td_direction` averaged over a batch: (mean direction, (B,) TD errors)."""
    rho = _batch_rho(rho, reward)
    dirs, deltas = jax.vmap(
        lambda *tr: centered_td_direction(value_fn, params, omega, *tr))(x, reward, discount, x_next, rho)
    return _mean(dirs), deltas


def batch_centered_tdc_direction(value_fn: ValueFn, params: Params, h: Params,
                                 omega: jax.Array | float, x, reward: jax.Array,
                                 discount: jax.Array, x_next,
                                 rho: jax.Array | float = 1.0) -> TDCDirections:
    """`centered_tdc_direction` averaged over a batch (delta keeps its (B,) axis)."""
    rho = _batch_rho(rho, reward)
    d = jax.vmap(lambda *tr: centered_tdc_direction(value_fn, params, h, omega, *tr))(
        x, reward, discount, x_next, rho)
    return TDCDirections(params=_mean(d.params), h=_mean(d.h), delta=d.delta)


def batch_centered_td_lambda_direction(value_fn: ValueFn, params: Params, traces: Params,
                                       omega: jax.Array | float, x, reward: jax.Array,
                                       discount: jax.Array, x_next,
                                       rho: jax.Array | float = 1.0, *,
                                       lam: float) -> tuple[Params, Params, jax.Array]:
    """`centered_td_lambda_direction` for B parallel trajectories, each with its own
    trace (`traces` has a leading (B,) axis): (mean direction, (B, ...) next
    traces, (B,) TD errors)."""
    rho = _batch_rho(rho, reward)
    dirs, traces, deltas = jax.vmap(
        lambda tr_, *t: centered_td_lambda_direction(value_fn, params, tr_, omega, *t, lam=lam))(
        traces, x, reward, discount, x_next, rho)
    return _mean(dirs), traces, deltas
