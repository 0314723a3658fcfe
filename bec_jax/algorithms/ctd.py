"""Centered TD (CTD) with linear features: Bellman error centering.

On-policy, the paper's eqs. (28) [omega] and (29) [theta]:
    omega <- omega + beta (delta - omega)
    theta <- theta + alpha (delta - omega) phi
Off-policy, eqs. (30) [omegawithrho] and (31) [thetawithrho] multiply both by rho.
omega estimates E[delta], so theta follows the centered TD error delta - E[delta]
and converges (on-policy) to the centered TD fixpoint A^-1 b with
A = Phi^T (D - d d^T)(I - gamma P) Phi, b = Phi^T (D - d d^T) r.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp

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


class CTDState(NamedTuple):
    """theta: (k,) weights; omega: () estimate of E[delta]; count: updates so far."""

    theta: jax.Array
    omega: jax.Array
    count: jax.Array


def init(theta0: jax.Array, omega0: float = 0.0) -> CTDState:
    """Starts CTD at `theta0` with omega = `omega0`."""
    theta0 = jnp.asarray(theta0)
    return CTDState(theta=theta0, omega=jnp.asarray(omega0, theta0.dtype), count=zero_count())


def update(state: CTDState, tr: Transition, alpha: StepSize, beta: StepSize) -> CTDState:
    """One CTD step (eqs. (30)-(31); eqs. (28)-(29) when rho = 1). Both updates use
    the current omega."""
    check_inputs(state.theta, tr)
    a, b = resolve(alpha, state.count), resolve(beta, state.count)
    centered = tr.rho * (td_error(state.theta, tr) - state.omega)
    return CTDState(
        theta=state.theta + (a * centered) * tr.phi,
        omega=state.omega + b * centered,
        count=state.count + 1,
    )


ALGORITHM = Algorithm(
    name="ctd", label="CTD", init=init, update=update,
    shares_scalars=True,
    hyperparameters=(step_size("alpha", "step size of theta"),
                     step_size("beta", "step size of omega, the estimate of E[delta]")),
    equations="eqs. (30)-(31) [omegawithrho, thetawithrho]; on-policy eqs. (28)-(29) [omega, theta]")
