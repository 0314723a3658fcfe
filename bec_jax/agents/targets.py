"""Bellman error centering on value *targets*, in rlax's conventions.

`bec_jax.agents.value_learning` centers the TD error of a parametric value function. This
module gives the same centering for the sequence targets that rlax-style agents
build from a trajectory: the TD error, lambda-returns, GAE and V-trace. Every
function works on ONE trajectory, time-major, with rlax's argument names and
order (`r_t`, `discount_t`, `v_t` are the reward, discount and value at the
step after `v_tm1`); batch it with `jax.vmap`, as with rlax.

The paper's centered TD (eq. omegawithrho, eq. (30); eq. thetawithrho, eq. (31);
on-policy eqs. omega (28) and theta (29)) uses the centered TD error

    delta_c = r + gamma v(s') - v(s) - omega,
    omega  <- omega + beta rho (delta - omega),   delta = delta_c + omega.

Centering the TD error by omega is the same as replacing the reward r by r - omega,
so each function here EQUALS its rlax counterpart applied to the reward r - omega
(the identity holds for every input as long as `terminal_t` is not used, and it
holds for the gradients too, because rlax's `stop_target_gradients` is applied
to the same expression):

  * `centered_td_learning`  = rlax.td_learning(v_tm1, r_t - omega, discount_t, v_t)
  * `centered_lambda_returns` = rlax.lambda_returns(r_t - omega, discount_t, v_t, lambda_)
  * `centered_truncated_generalized_advantage_estimation(...).advantages`
        = rlax.truncated_generalized_advantage_estimation(r_t - omega, discount_t,
                                                          lambda_, values)
  * `centered_vtrace_td_error_and_advantage`
        = rlax.vtrace_td_error_and_advantage(v_tm1, v_t, r_t - omega, discount_t,
                                             rho_tm1, ...)
    (fields errors, pg_advantage, q_estimate, as rlax's `VTraceOutput`).

omega itself is learned from the UNcentered TD errors delta (eq. omegawithrho):
`centered_truncated_generalized_advantage_estimation` returns them as
`td_errors`, and `bec_jax.agents.value_learning.omega_update(state, td_errors, rho, beta)`
applies the update (omega's target is their mean).

Episodes and true termination (`terminal_t`, `gamma`)
-----------------------------------------------------
In rlax a termination is a step with discount 0: the target there is just r.
For the centered reward r - omega that is a problem. In an episodic task the
centered values solve v_c(s) = E[r - omega + discount v_c(s')] with discount 0 at
the termination, so

    v_c(s) = v(s) - omega (1 - gamma^N(s)) / (1 - gamma)

where N(s) is the number of steps from s to termination (for a fixed-length
path; in expectation over N otherwise). This is NOT v shifted by a constant:
omega acts as a per-step cost (or, for omega < 0, a per-step bonus) that depends
on how long the episode still lasts, so it changes the ordering of states and of
actions, i.e. which policy is optimal. Example (gamma = 0.9, reward -1 per step,
omega = -1.5): terminating now is worth -1, a three-step path -2.71, but their
centered returns are 0.5 and 1.355, so the longer path looks better.

With `terminal_t` (true termination, not truncation: a time-limit cut should keep
bootstrapping from v(s') with the ordinary discount) the functions bootstrap a
termination from the value of an absorbing state that keeps paying the centered
reward 0 - omega forever, -omega/(1 - gamma), with discount `gamma`: where
terminal_t is true the centered target is

    r - omega + gamma (-omega / (1 - gamma)) = r - omega / (1 - gamma),

and the lambda-return / GAE recursions are cut there (no mixing with the next
episode in the same trajectory). Then, for ANY fixed omega, the centered Bellman
equation is solved exactly by

    v_c(s) = v(s) - omega / (1 - gamma)    for every state s,

a constant shift (check: r - omega + gamma (v(s') - omega/(1-gamma))
= r + gamma v(s') - omega/(1-gamma), and at a termination r - omega/(1-gamma)).
So the ordering of states and actions, and the optimal policy, are unchanged,
advantages are unchanged (`centered_truncated_generalized_advantage_estimation`
with values v - omega/(1-gamma) returns exactly the uncentered GAE), and
lambda-returns are shifted by exactly -omega/(1-gamma). This needs every
non-terminal discount to equal `gamma` (a constant discount); with per-step
discounts the shift is not constant. `tests/test_centered_values.py` checks both
closed forms on a 3-state chain.

Only jax, jax.numpy and chex are imported (rlax is not a dependency; the tests
compare against it).
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

__all__ = [
    "CenteredGAEOutput",
    "CenteredInputError",
    "CenteredVTraceOutput",
    "centered_lambda_returns",
    "centered_td_learning",
    "centered_truncated_generalized_advantage_estimation",
    "centered_vtrace_td_error_and_advantage",
]


class CenteredInputError(ValueError, AssertionError):
    """A bad argument (rank, dtype or shape), with the argument named. A ValueError,
    and also an AssertionError so that code catching chex/rlax failures still does."""


class CenteredGAEOutput(NamedTuple):
    """advantages: (T,) GAE of the centered reward r - omega; td_errors: (T,) the
    UNcentered TD errors delta_t, the input of omega's update (eq. omegawithrho)."""

    advantages: jax.Array
    td_errors: jax.Array


class CenteredVTraceOutput(NamedTuple):
    """The fields of rlax's `VTraceOutput`, computed for the reward r - omega."""

    errors: jax.Array
    pg_advantage: jax.Array
    q_estimate: jax.Array


# ----------------------------------------------------------------- checks

def _check(fn: str, ranks: dict, types: dict | None = None, same_shape=()) -> None:
    """chex checks, one argument at a time, re-raised naming the argument."""
    for name, (x, rank) in ranks.items():
        try:
            chex.assert_rank(x, rank)
        except AssertionError as e:
            shape = getattr(x, "shape", ())
            raise CenteredInputError(
                f"{fn}: argument `{name}` must have rank {rank}, got shape {tuple(shape)} "
                f"({e})") from None
    for name, (x, kind) in (types or {}).items():
        try:
            chex.assert_type(x, kind)
        except AssertionError as e:
            raise CenteredInputError(
                f"{fn}: argument `{name}` must be of type {kind.__name__}, got "
                f"{getattr(x, 'dtype', type(x).__name__)} ({e})") from None
    if same_shape:
        first_name, first = same_shape[0]
        for name, x in same_shape[1:]:
            try:
                chex.assert_equal_shape([first, x])
            except AssertionError:
                raise CenteredInputError(
                    f"{fn}: argument `{name}` has shape {tuple(jnp.shape(x))} but "
                    f"`{first_name}` has shape {tuple(jnp.shape(first))}") from None


def _lambda(lambda_, dtype) -> jax.Array:
    """lambda_ as an array: a Python number in the rewards' dtype, an array as given."""
    return jnp.asarray(lambda_, dtype) if isinstance(lambda_, (int, float)) else jnp.asarray(lambda_)


def _omega(fn: str, omega, dtype) -> jax.Array:
    omega = jnp.asarray(omega)
    _check(fn, {"omega": (omega, 0)})
    if not jnp.issubdtype(omega.dtype, jnp.floating) and not jnp.issubdtype(
            omega.dtype, jnp.integer):
        raise CenteredInputError(f"{fn}: argument `omega` must be a real scalar, got {omega.dtype}")
    return omega.astype(dtype)


def _terminal(fn: str, terminal_t, gamma, like: jax.Array):
    """(terminal mask as bool, gamma as `like.dtype`) with checks; terminal_t has
    like's shape."""
    if gamma is None:
        raise CenteredInputError(f"{fn}: `terminal_t` needs `gamma` (the constant discount "
                                 "that the -omega/(1-gamma) bootstrap assumes)")
    terminal_t = jnp.asarray(terminal_t)
    gamma = jnp.asarray(gamma)
    _check(fn, {"terminal_t": (terminal_t, like.ndim), "gamma": (gamma, 0)},
           same_shape=(("r_t", like), ("terminal_t", terminal_t)))
    try:
        g = float(gamma)
    except (TypeError, jax.errors.ConcretizationTypeError):
        g = None  # traced: not checkable here
    if g is not None and not 0.0 <= g < 1.0:
        raise CenteredInputError(f"{fn}: argument `gamma` must be in [0, 1), got {g}")
    return terminal_t.astype(bool), gamma.astype(like.dtype)


def _episodic(r_t, discount_t, v_t, omega, terminal_t, gamma):
    """Where terminal_t: discount -> gamma, bootstrap value -> -omega/(1-gamma).
    Returns (discount, bootstrap value)."""
    v_term = -omega / (1.0 - gamma)
    return (jnp.where(terminal_t, gamma, discount_t),
            jnp.where(terminal_t, v_term, v_t))


# --------------------------------------------------------------- TD error

def centered_td_learning(v_tm1, r_t, discount_t, v_t, omega,
                         stop_target_gradients: bool = True, *,
                         terminal_t=None, gamma=None) -> jax.Array:
    """The centered TD error r_t + discount_t v_t - v_tm1 - omega of one transition
    (paper eq. thetawithrho, eq. (31): the factor (delta_t - omega_t); all inputs
    scalars, as in rlax.td_learning).

    Equals `rlax.td_learning(v_tm1, r_t - omega, discount_t, v_t,
    stop_target_gradients)`: the target r_t - omega + discount_t v_t is the
    stop-gradient part (omega included), so gradients agree with rlax too. The
    uncentered TD error for omega's update (eq. omegawithrho) is this plus omega.

    terminal_t (bool scalar), gamma: where terminal_t, bootstrap from
    -omega/(1-gamma) with discount gamma instead of from v_t with discount_t,
    so the target is r_t - omega/(1-gamma) (see the module docstring: the
    centered values are then v - omega/(1-gamma) exactly).
    """
    fn = "centered_td_learning"
    v_tm1, r_t, discount_t, v_t = (jnp.asarray(x) for x in (v_tm1, r_t, discount_t, v_t))
    _check(fn, {"v_tm1": (v_tm1, 0), "r_t": (r_t, 0), "discount_t": (discount_t, 0),
                "v_t": (v_t, 0)},
           {"v_tm1": (v_tm1, float), "r_t": (r_t, float), "discount_t": (discount_t, float),
            "v_t": (v_t, float)})
    omega = _omega(fn, omega, r_t.dtype)
    if terminal_t is not None:
        terminal_t, gamma = _terminal(fn, terminal_t, gamma, r_t)
        discount_t, v_t = _episodic(r_t, discount_t, v_t, omega, terminal_t, gamma)
    target = r_t - omega + discount_t * v_t
    target = jax.lax.select(stop_target_gradients, jax.lax.stop_gradient(target), target)
    return target - v_tm1


# ---------------------------------------------------------- lambda returns

def centered_lambda_returns(r_t, discount_t, v_t, omega, lambda_=1.0,
                            stop_target_gradients: bool = False, *,
                            terminal_t=None, gamma=None) -> jax.Array:
    """lambda-returns of the centered reward r - omega (targets for centered
    TD(lambda), eqs. thetawithrho/omegawithrho, eqs. (30)-(31), with multi-step
    targets): G_t = r_t - omega + discount_t [(1 - lambda_t) v_t + lambda_t G_{t+1}],
    G_{T-1} bootstrapping from v_t[-1]. Arrays (T,); lambda_ scalar or (T,).

    Equals `rlax.lambda_returns(r_t - omega, discount_t, v_t, lambda_,
    stop_target_gradients)`.

    terminal_t (bool (T,)), gamma: where terminal_t, G_t = r_t - omega/(1-gamma)
    (bootstrap -omega/(1-gamma) with discount gamma, lambda cut to 0 so the next
    episode's returns do not leak in). Equivalently rlax.lambda_returns of
    r_t - omega with discount gamma, value -omega/(1-gamma) and lambda 0 at the
    terminal steps. With constant non-terminal discount gamma and values
    v - omega/(1-gamma), the result is the uncentered lambda-return minus
    omega/(1-gamma) exactly.
    """
    fn = "centered_lambda_returns"
    r_t, discount_t, v_t = (jnp.asarray(x) for x in (r_t, discount_t, v_t))
    lambda_ = _lambda(lambda_, r_t.dtype)
    _check(fn, {"r_t": (r_t, 1), "discount_t": (discount_t, 1), "v_t": (v_t, 1),
                "lambda_": (lambda_, {0, 1})},
           {"r_t": (r_t, float), "discount_t": (discount_t, float), "v_t": (v_t, float),
            "lambda_": (lambda_, float)},
           same_shape=(("r_t", r_t), ("discount_t", discount_t), ("v_t", v_t)))
    if lambda_.ndim == 1:
        _check(fn, {}, same_shape=(("r_t", r_t), ("lambda_", lambda_)))
    omega = _omega(fn, omega, r_t.dtype)
    lambda_ = jnp.ones_like(discount_t) * lambda_
    if terminal_t is not None:
        terminal_t, gamma = _terminal(fn, terminal_t, gamma, r_t)
        discount_t, v_t = _episodic(r_t, discount_t, v_t, omega, terminal_t, gamma)
        lambda_ = jnp.where(terminal_t, 0.0, lambda_).astype(discount_t.dtype)

    def body(acc, xs):
        r, d, v, lam = xs
        acc = r + d * ((1.0 - lam) * v + lam * acc)
        return acc, acc

    _, returns = jax.lax.scan(body, v_t[-1], (r_t - omega, discount_t, v_t, lambda_),
                              reverse=True)
    return jax.lax.select(stop_target_gradients, jax.lax.stop_gradient(returns), returns)


# -------------------------------------------------------------------- GAE

def centered_truncated_generalized_advantage_estimation(
        r_t, discount_t, lambda_, values, omega, stop_target_gradients: bool = False, *,
        terminal_t=None, gamma=None) -> CenteredGAEOutput:
    """GAE of the centered reward, and the uncentered TD errors omega learns from.

    r_t, discount_t: (T,); values: (T+1,) (values[t] = v(s_t), the last one the
    bootstrap), as in rlax; lambda_ scalar or (T,). With
    delta_t = r_t + discount_t values[t+1] - values[t] (the `td_errors`),

        advantages_t = (delta_t - omega) + discount_t lambda_t advantages_{t+1}

    i.e. the centered TD errors of eq. thetawithrho (eq. (31)) accumulated as in
    GAE. `advantages` equals `rlax.truncated_generalized_advantage_estimation(
    r_t - omega, discount_t, lambda_, values)`; it is also the GAE of
    td_errors - omega. `td_errors` are the UNcentered delta_t: pass them to
    `bec_jax.agents.value_learning.omega_update` (eq. omegawithrho, eq. (30); omega's update
    target is their mean). stop_target_gradients stops gradients through the
    advantages (as rlax), not through td_errors.

    terminal_t (bool (T,)), gamma: where terminal_t, values[t+1] is replaced by
    -omega/(1-gamma), discount_t by gamma, and the trace is cut (lambda 0). The
    td_errors then use the same bootstrap, so that td_errors - omega is still
    the centered TD error the advantages accumulate. With constant non-terminal
    discount gamma and values v - omega/(1-gamma), the advantages equal the
    uncentered GAE of v exactly.
    """
    fn = "centered_truncated_generalized_advantage_estimation"
    r_t, discount_t, values = (jnp.asarray(x) for x in (r_t, discount_t, values))
    lambda_ = _lambda(lambda_, r_t.dtype)
    _check(fn, {"r_t": (r_t, 1), "discount_t": (discount_t, 1), "values": (values, 1),
                "lambda_": (lambda_, {0, 1})},
           {"r_t": (r_t, float), "discount_t": (discount_t, float),
            "values": (values, float), "lambda_": (lambda_, float)},
           same_shape=(("r_t", r_t), ("discount_t", discount_t)))
    if values.shape[0] != r_t.shape[0] + 1:
        raise CenteredInputError(f"{fn}: argument `values` must have T+1 = {r_t.shape[0] + 1} "
                                 f"entries (r_t has T = {r_t.shape[0]}), got {values.shape[0]}")
    if lambda_.ndim == 1:
        _check(fn, {}, same_shape=(("r_t", r_t), ("lambda_", lambda_)))
    omega = _omega(fn, omega, r_t.dtype)
    lambda_ = jnp.ones_like(discount_t) * lambda_
    v_next = values[1:]
    if terminal_t is not None:
        terminal_t, gamma = _terminal(fn, terminal_t, gamma, r_t)
        discount_t, v_next = _episodic(r_t, discount_t, v_next, omega, terminal_t, gamma)
        lambda_ = jnp.where(terminal_t, 0.0, lambda_).astype(discount_t.dtype)
    td_errors = r_t + discount_t * v_next - values[:-1]

    def body(acc, xs):
        d, disc, lam = xs
        acc = d + disc * lam * acc
        return acc, acc

    _, adv = jax.lax.scan(body, jnp.zeros((), td_errors.dtype),
                          (td_errors - omega, discount_t, lambda_), reverse=True)
    adv = jax.lax.select(stop_target_gradients, jax.lax.stop_gradient(adv), adv)
    return CenteredGAEOutput(advantages=adv, td_errors=td_errors)


# ----------------------------------------------------------------- V-trace

def centered_vtrace_td_error_and_advantage(
        v_tm1, v_t, r_t, discount_t, rho_tm1, omega, lambda_=1.0,
        clip_rho_threshold: float = 1.0, clip_pg_rho_threshold: float = 1.0,
        stop_target_gradients: bool = True, sample_mask=None) -> CenteredVTraceOutput:
    """V-trace errors, policy-gradient advantages and Q estimates for the centered
    reward r - omega (off-policy centered TD, eqs. omegawithrho/thetawithrho,
    eqs. (30)-(31), with V-trace's clipped ratios instead of the plain rho).

    Equals `rlax.vtrace_td_error_and_advantage(v_tm1, v_t, r_t - omega,
    discount_t, rho_tm1, lambda_, clip_rho_threshold, clip_pg_rho_threshold,
    stop_target_gradients, sample_mask)` field by field (errors, pg_advantage,
    q_estimate). All arrays (T,); lambda_ scalar or (T,); sample_mask bool (T,).
    No `terminal_t` option: pass discount 0 at terminations (rlax's convention)
    and see the module docstring for what that does to the centered values.
    The uncentered one-step TD errors for omega's update are
    r_t + discount_t v_t - v_tm1 (weighted by rho_tm1 in `omega_update`).
    """
    fn = "centered_vtrace_td_error_and_advantage"
    v_tm1, v_t, r_t, discount_t, rho_tm1 = (
        jnp.asarray(x) for x in (v_tm1, v_t, r_t, discount_t, rho_tm1))
    lambda_ = _lambda(lambda_, r_t.dtype)
    if sample_mask is None:
        sample_mask = jnp.ones_like(rho_tm1, dtype=bool)
    sample_mask = jnp.asarray(sample_mask)
    arrays = {"v_tm1": v_tm1, "v_t": v_t, "r_t": r_t, "discount_t": discount_t,
              "rho_tm1": rho_tm1}
    _check(fn, {**{k: (x, 1) for k, x in arrays.items()}, "lambda_": (lambda_, {0, 1}),
                "sample_mask": (sample_mask, 1)},
           {**{k: (x, float) for k, x in arrays.items()}, "lambda_": (lambda_, float),
            "sample_mask": (sample_mask, bool)},
           same_shape=tuple(arrays.items()) + (("sample_mask", sample_mask),))
    omega = _omega(fn, omega, r_t.dtype)
    lambda_ = jnp.ones_like(discount_t) * lambda_
    rc_t = r_t - omega

    c_tm1 = jnp.minimum(1.0, rho_tm1) * lambda_
    clipped_rhos_tm1 = jnp.minimum(clip_rho_threshold, rho_tm1)
    td = clipped_rhos_tm1 * (rc_t + discount_t * v_t - v_tm1)
    learn = sample_mask.astype(td.dtype)

    def body(acc, xs):
        d, disc, m, c = xs
        acc = m * (d + disc * c * acc) + (1.0 - m) * acc
        return acc, acc

    _, errors = jax.lax.scan(body, jnp.zeros((), td.dtype), (td, discount_t, learn, c_tm1),
                             reverse=True)
    errors = jax.lax.select(stop_target_gradients,
                            jax.lax.stop_gradient(errors + v_tm1) - v_tm1, errors)
    targets_tm1 = errors + v_tm1
    q_bootstrap = jnp.concatenate(
        [lambda_[:-1] * targets_tm1[1:] + (1 - lambda_[:-1]) * v_tm1[1:], v_t[-1:]], axis=0)
    q_estimate = rc_t + discount_t * q_bootstrap
    pg_advantage = jnp.minimum(clip_pg_rho_threshold, rho_tm1) * (q_estimate - v_tm1)
    return CenteredVTraceOutput(errors=errors, pg_advantage=pg_advantage,
                                q_estimate=q_estimate)
