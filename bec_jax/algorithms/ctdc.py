"""Centered TDC (CTDC) with linear features, for off-policy learning.

The paper's eqs. (32) [thetavmtdc], (33) [uvmtdc] and (34) [omegavmtdc]:
    theta <- theta + alpha [(delta - omega) phi - gamma phi' (phi^T u)]
    u     <- u + zeta [delta - omega - phi^T u] phi
    omega <- omega + beta (delta - omega)
The paper states them for sub-sampled transitions that already follow the target
policy (no rho anywhere). With behaviour data, the authors' public code multiplies
all three updates by rho; that is `ctdc` here (`rho_on_omega=True`).
`ctdc_omega_no_rho` (`rho_on_omega=False`, formerly `ctdc_literal`) puts rho on
theta and u but not on omega, so omega tracks the behaviour's mean TD error: it is
neither the paper's sub-sampled form nor the authors' code, and off-policy it
changes the fixpoint and the stability (on the 2-state example its slow ODE is
stable where `ctdc`'s is not; see `bec_jax.theory.expected_updates`). The paper's sub-sampled
form (rho-free updates on behaviour transitions kept with probability
proportional to rho) has exactly `ctdc`'s expected update (checked in
`bec_jax.experiments.theory.rho_convention`), so `ctdc` is the paper's algorithm
in the mean; the samplers do not offer the rejection step itself.
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
    """One CTDC step (eqs. (32)-(34)), all from the current state."""
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


def update_omega_no_rho(state: CTDCState, tr: Transition, alpha: StepSize, beta: StepSize,
                        zeta: StepSize) -> CTDCState:
    """One CTDC step with rho on theta and u but not on omega."""
    return update(state, tr, alpha, beta, zeta, rho_on_omega=False)


_HYPERPARAMETERS = (step_size("alpha", "step size of theta"),
                    step_size("beta", "step size of omega, the estimate of E[delta]"),
                    step_size("zeta", "step size of the auxiliary weights u"))

ALGORITHM = Algorithm(
    name="ctdc", label="CTDC", init=init, update=update, hyperparameters=_HYPERPARAMETERS,
    shares_scalars=True,
    equations="eqs. (32)-(34) [thetavmtdc, uvmtdc, omegavmtdc], rho on all three (the authors' code)")

OMEGA_NO_RHO = Algorithm(
    name="ctdc_omega_no_rho", label="CTDC (no rho on omega)", init=init, update=update_omega_no_rho,
    shares_scalars=True,
    hyperparameters=_HYPERPARAMETERS,
    equations="eqs. (32)-(34) [thetavmtdc, uvmtdc, omegavmtdc] with rho on theta and u, not on omega "
              "(neither the paper's sub-sampled form nor the authors' code)")
