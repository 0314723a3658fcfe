"""GTD2 (Sutton et al. 2009) with linear features, off-policy.

"Fast gradient-descent methods for temporal-difference learning with linear
function approximation" (ICML 2009), the GTD2 update, as the code of Ghiassian
et al. (2020, rlai-lab/Regularized-GradientTD, experiments/prediction/agents/GTD2.py)
writes it, with h's step size eta * alpha:
    delta = r + gamma theta^T phi' - theta^T phi,   delta_hat = h^T phi
    theta <- theta + alpha rho delta_hat (phi - gamma phi')
    h     <- h + eta alpha (rho delta - delta_hat) phi
rho multiplies theta's whole update but only delta inside h's. theta converges
to the TD fixpoint A theta = b (the minimum of the MSPBE), h to C^-1 (b - A theta).
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp

from bec_jax.algorithms.base import (
    Algorithm,
    StepSize,
    check_inputs,
    parameter,
    resolve,
    step_size,
    td_error,
    vdot,
    zero_count,
)
from bec_jax.transition import Transition


class GTD2State(NamedTuple):
    """theta: (k,) weights; h: (k,) auxiliary weights; count: updates so far."""

    theta: jax.Array
    h: jax.Array
    count: jax.Array


def init(theta0: jax.Array) -> GTD2State:
    """Starts GTD2 at `theta0` with h = 0."""
    theta0 = jnp.asarray(theta0)
    return GTD2State(theta=theta0, h=jnp.zeros_like(theta0), count=zero_count())


def update(state: GTD2State, tr: Transition, alpha: StepSize, eta: float = 1.0) -> GTD2State:
    """One GTD2 step (Sutton et al. 2009), h's step size eta * alpha."""
    check_inputs(state.theta, tr)
    a = resolve(alpha, state.count)
    delta = td_error(state.theta, tr)
    dh = vdot(state.h, tr.phi)
    theta = state.theta + (a * tr.rho * dh) * (tr.phi - tr.discount * tr.phi_next)
    h = state.h + (eta * a * (tr.rho * delta - dh)) * tr.phi
    return GTD2State(theta=theta, h=h, count=state.count + 1)


ALGORITHM = Algorithm(
    name="gtd2", label="GTD2", init=init, update=update,
    shares_scalars=True,
    hyperparameters=(step_size("alpha", "step size of theta"),
                     parameter("eta", "h's step size is eta * alpha", default=1.0, low=0.0, low_open=True)),
    equations="GTD2 of Sutton et al. (2009) (no equation in the BEC paper), as in Ghiassian et al. (2020)'s code")
