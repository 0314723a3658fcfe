"""TDC (Sutton et al., 2009) with linear features: TD with gradient correction.

The paper's eqs. (32) [thetavmtdc] and (33) [uvmtdc] with omega = 0:
    theta <- theta + alpha rho [delta phi - gamma phi' (phi^T u)]
    u     <- u + zeta rho [delta - phi^T u] phi
The factor rho on both updates follows the authors' public code; on-policy rho = 1.
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
    vdot,
    zero_count,
)
from bec_jax.transition import Transition


class TDCState(NamedTuple):
    """theta: (k,) weights; u: (k,) auxiliary weights; count: updates so far."""

    theta: jax.Array
    u: jax.Array
    count: jax.Array


def init(theta0: jax.Array) -> TDCState:
    """Starts TDC at `theta0` with u = 0."""
    theta0 = jnp.asarray(theta0)
    return TDCState(theta=theta0, u=jnp.zeros_like(theta0), count=zero_count())


def update(state: TDCState, tr: Transition, alpha: StepSize, zeta: StepSize) -> TDCState:
    """One TDC step (eqs. (32)-(33) with omega = 0), rho on both updates."""
    check_inputs(state.theta, tr)
    a, z = resolve(alpha, state.count), resolve(zeta, state.count)
    delta = td_error(state.theta, tr)
    phi_u = vdot(tr.phi, state.u)
    theta = state.theta + (a * tr.rho) * (delta * tr.phi - (tr.discount * phi_u) * tr.phi_next)
    u = state.u + (z * tr.rho * (delta - phi_u)) * tr.phi
    return TDCState(theta=theta, u=u, count=state.count + 1)


ALGORITHM = Algorithm(
    name="tdc", label="TDC", init=init, update=update,
    shares_scalars=True,
    hyperparameters=(step_size("alpha", "step size of theta"),
                     step_size("zeta", "step size of the auxiliary weights u")),
    equations="eqs. (32)-(33) [thetavmtdc, uvmtdc] with omega = 0 (Sutton et al. 2009), rho on both")
