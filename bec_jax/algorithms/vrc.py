"""Value-based reward centering (VRC, Naik et al. 2024) with linear features.

The paper's eqs. (12)-(13) [rewardcentering1, rewardcentering2]:
    delta_bar = delta - rbar
    theta <- theta + alpha rho delta_bar phi
    rbar  <- rbar + beta rho delta_bar
The paper's point (Section 3.1, eq. (24) [tdcentering]): this is Bellman error
centering, the same recursion as off-policy CTD with omega = rbar.
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


class VRCState(NamedTuple):
    """theta: (k,) weights; rbar: () estimate of E[delta]; count: updates so far."""

    theta: jax.Array
    rbar: jax.Array
    count: jax.Array


def init(theta0: jax.Array, rbar0: float = 0.0) -> VRCState:
    """Starts VRC at `theta0` with rbar = `rbar0`."""
    theta0 = jnp.asarray(theta0)
    return VRCState(theta=theta0, rbar=jnp.asarray(rbar0, theta0.dtype), count=zero_count())


def update(state: VRCState, tr: Transition, alpha: StepSize, beta: StepSize) -> VRCState:
    """One VRC step (eqs. (12)-(13))."""
    check_inputs(state.theta, tr)
    a, b = resolve(alpha, state.count), resolve(beta, state.count)
    delta_bar = tr.rho * (td_error(state.theta, tr) - state.rbar)
    return VRCState(
        theta=state.theta + (a * delta_bar) * tr.phi,
        rbar=state.rbar + b * delta_bar,
        count=state.count + 1,
    )


ALGORITHM = Algorithm(
    name="vrc", label="VRC", init=init, update=update,
    shares_scalars=True,
    hyperparameters=(step_size("alpha", "step size of theta"),
                     step_size("beta", "step size of rbar, the estimate of E[delta]")),
    equations="eqs. (12)-(13) [rewardcentering1, rewardcentering2] (Naik et al. 2024)")
