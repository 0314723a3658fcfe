"""Centered TDC (CTDC) with linear features, for off-policy learning.

The paper's eqs. (thetavmtdc), (uvmtdc) and (omegavmtdc):
    theta <- theta + alpha [(delta - omega) phi - gamma phi' (phi^T u)]
    u     <- u + zeta [delta - omega - phi^T u] phi
    omega <- omega + beta (delta - omega)
The paper states them for sub-sampled transitions that already follow the target
policy. With behaviour data, the authors' public code multiplies all three
updates by rho; that is the default here (`rho_on_omega=True`). With
`rho_on_omega=False` the omega update is the paper's literal eq. (omegavmtdc),
without rho, so omega tracks the behaviour's mean TD error (meant for the i.i.d.
setting; off-policy it changes the fixpoint, see `bec_jax.analysis`).
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp

from bec_jax.algorithms.base import StepSize, check_inputs, resolve, td_error, vdot, zero_count
from bec_jax.transition import Transition


class CTDCState(NamedTuple):
    """theta, u: (k,) weights and auxiliary weights; omega: () estimate of
    E[delta]; count: updates so far."""

    theta: jax.Array
    u: jax.Array
    omega: jax.Array
    count: jax.Array


def init(theta0: jax.Array, omega0: float = 0.0) -> CTDCState:
    """Starts CTDC at `theta0` with u = 0 and omega = `omega0`."""
    theta0 = jnp.asarray(theta0)
    return CTDCState(theta=theta0, u=jnp.zeros_like(theta0),
                     omega=jnp.asarray(omega0, theta0.dtype), count=zero_count())


def update(
    state: CTDCState,
    tr: Transition,
    alpha: StepSize,
    beta: StepSize,
    zeta: StepSize,
    rho_on_omega: bool = True,
) -> CTDCState:
    """One CTDC step (eqs. thetavmtdc, uvmtdc, omegavmtdc), all from the current state."""
    check_inputs(state.theta, tr)
    a = resolve(alpha, state.count)
    b = resolve(beta, state.count)
    z = resolve(zeta, state.count)
    err = td_error(state.theta, tr) - state.omega
    phi_u = vdot(tr.phi, state.u)
    theta = state.theta + (a * tr.rho) * (err * tr.phi - (tr.discount * phi_u) * tr.phi_next)
    u = state.u + (z * tr.rho * (err - phi_u)) * tr.phi
    omega = state.omega + b * (tr.rho if rho_on_omega else 1.0) * err
    return CTDCState(theta=theta, u=u, omega=omega, count=state.count + 1)
