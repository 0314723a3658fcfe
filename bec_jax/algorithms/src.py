"""Simple reward centering (SRC, Naik et al. 2024) with linear features.

The paper's eqs. (9)-(11) [src1, src2, src3], with V(s) = theta^T phi(s):
    delta_bar = r - rbar + gamma V(s') - V(s)
    theta <- theta + alpha rho delta_bar phi
    rbar  <- rbar + beta (r - rbar)
The rbar update has no rho, as in Naik et al.: off-policy it tracks the
behaviour's average reward, the bias that value-based centering (VRC) removes.
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


class SRCState(NamedTuple):
    """theta: (k,) weights; rbar: () average-reward estimate; count: updates so far."""

    theta: jax.Array
    rbar: jax.Array
    count: jax.Array


def init(theta0: jax.Array, rbar0: float = 0.0) -> SRCState:
    """Starts SRC at `theta0` with rbar = `rbar0`."""
    theta0 = jnp.asarray(theta0)
    return SRCState(theta=theta0, rbar=jnp.asarray(rbar0, theta0.dtype), count=zero_count())


def update(state: SRCState, tr: Transition, alpha: StepSize, beta: StepSize) -> SRCState:
    """One SRC step (eqs. (9)-(11))."""
    check_inputs(state.theta, tr)
    a, b = resolve(alpha, state.count), resolve(beta, state.count)
    delta_bar = td_error(state.theta, tr) - state.rbar
    return SRCState(
        theta=state.theta + (a * tr.rho * delta_bar) * tr.phi,
        rbar=state.rbar + b * (tr.reward - state.rbar),
        count=state.count + 1,
    )


ALGORITHM = Algorithm(
    name="src", label="SRC", init=init, update=update,
    shares_scalars=True,
    hyperparameters=(step_size("alpha", "step size of theta"),
                     step_size("beta", "step size of rbar, the average-reward estimate")),
    equations="eqs. (9)-(11) [src1, src2, src3] (Naik et al. 2024), rho on theta only")
