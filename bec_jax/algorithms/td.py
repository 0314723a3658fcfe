"""TD(0) with linear features, on- and off-policy.

Implements the paper's eq. (7) [td(0)theta], theta <- theta + alpha delta phi,
and its off-policy form eq. (8), theta <- theta + alpha rho delta phi (rho = 1
on-policy).
"""
from typing import NamedTuple

import jax

from bec_jax.algorithms.base import (
    Algorithm,
    StepSize,
    check_inputs,
    resolve,
    step_size,
    td_error,
    zero_count,
)
from bec_jax.transition import Transition


class TDState(NamedTuple):
    """theta: (k,) weights; count: number of updates so far."""

    theta: jax.Array
    count: jax.Array


def init(theta0: jax.Array) -> TDState:
    """Starts TD(0) at weights `theta0`."""
    return TDState(theta=jax.numpy.asarray(theta0), count=zero_count())


def update(state: TDState, tr: Transition, alpha: StepSize) -> TDState:
    """One off-policy TD(0) step: theta += alpha rho delta phi (paper eqs. (7)-(8))."""
    check_inputs(state.theta, tr)
    a = resolve(alpha, state.count)
    delta = td_error(state.theta, tr)
    return TDState(theta=state.theta + (a * tr.rho * delta) * tr.phi, count=state.count + 1)


ALGORITHM = Algorithm(
    name="td", label="TD", init=init, update=update,
    shares_scalars=True,
    hyperparameters=(step_size("alpha", "step size of theta"),),
    equations="eq. (7) [td(0)theta]; off-policy eq. (8), with rho on theta")
