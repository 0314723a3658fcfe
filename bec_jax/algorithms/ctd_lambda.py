"""Centered TD(lambda) with linear features and accumulating eligibility traces.

Bellman error centering (the paper's eqs. (30) [omegawithrho] and (31)
[thetawithrho]) combined with the off-policy accumulating trace of Sutton &
Barto (2018, 2nd ed., Section 12.9), z_t = rho_t (gamma_t lambda z_{t-1} + phi_t):

    delta_t = r + gamma theta^T phi' - theta^T phi
    z_t     = rho_t (gamma_t lambda z_{t-1} + phi_t)
    theta  <- theta + alpha (delta_t - omega) z_t
    omega  <- omega + beta rho_t (delta_t - omega)

gamma_t is the discount of the *previous* transition (the one into S_t), so a
transition with discount 0 (a terminal one) cuts the trace after its own update.
To keep that with one transition at a time, the state stores the trace already
decayed for the next step, `e = gamma lambda z_t`. omega is updated exactly as in
CTD (no trace): it estimates the mean TD error E_pi[delta], and theta follows the
centered TD error delta - omega through the trace.

With lambda = 0, z_t = rho_t phi_t and the update is off-policy CTD (eqs.
(30)-(31); eqs. (28)-(29) when rho = 1). The paper lists "extending Bellman error
centering to the lambda returns" as future work: this is that natural extension,
not one of its analysed algorithms, and no convergence claim comes with it.
Traces need consecutive transitions of one trajectory (the "markov" sampler);
with i.i.d. transitions they carry no meaning. Given the trace the update is
affine in (theta, omega), and the trace depends on the past only, so the
descriptor declares the trace's stationary expectation (`trace_expectation`) and
`analysis.expected_update` gives the exact ODE matrix: for theta it is off-policy
TD(lambda)'s A_lambda = Phi^T D (I - lambda P_g)^-1 (I - P_g) Phi, centered by
omega.

lambda is a hyperparameter like the step sizes: a sweep can vary it
(`--lambda 0,0.5,0.9`); its default is `DEFAULT_LAMBDA`.
"""
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from bec_jax.algorithms.base import (
    Algorithm,
    ModelStats,
    StepSize,
    check_inputs,
    parameter,
    resolve,
    step_size,
    td_error,
    zero_count,
)
from bec_jax.transition import Transition

DEFAULT_LAMBDA = 0.5


class CTDLambdaState(NamedTuple):
    """theta: (k,) weights; e: (k,) eligibility trace already decayed for the next
    step (gamma lambda z_t); omega: () estimate of E[delta]; count: updates so far."""

    theta: jax.Array
    e: jax.Array
    omega: jax.Array
    count: jax.Array


def init(theta0: jax.Array, omega0: float = 0.0) -> CTDLambdaState:
    """Starts centered TD(lambda) at `theta0` with a zero trace and omega = `omega0`."""
    theta0 = jnp.asarray(theta0)
    return CTDLambdaState(theta=theta0, e=jnp.zeros_like(theta0),
                          omega=jnp.asarray(omega0, theta0.dtype), count=zero_count())


def update(state: CTDLambdaState, tr: Transition, alpha: StepSize, beta: StepSize,
           lambda_: float = DEFAULT_LAMBDA) -> CTDLambdaState:
    """One centered TD(lambda) step (module docstring; lambda_ = 0 is CTD, eqs.
    (30)-(31)). Both updates use the current theta and omega."""
    check_inputs(state.theta, tr)
    chex.assert_equal_shape([state.theta, state.e])
    a, b = resolve(alpha, state.count), resolve(beta, state.count)
    err = td_error(state.theta, tr) - state.omega
    z = tr.rho * (state.e + tr.phi)
    return CTDLambdaState(
        theta=state.theta + (a * err) * z,
        e=(tr.discount * lambda_) * z,
        omega=state.omega + b * (tr.rho * err),
        count=state.count + 1,
    )


def trace_expectation(stats: ModelStats, hyperparameters: dict):
    """E[e_t | S_t = s] for the stored trace e_t = gamma_t lambda z_{t-1}: with
    Y(s) = d(s) E[e_t | S_t = s], Y = lambda P_g^T (Y + D Phi), so
    Y = (I - lambda P_g^T)^-1 lambda P_g^T D Phi. Returns (S, k)."""
    import numpy as np
    lam = float(hyperparameters.get("lambda", DEFAULT_LAMBDA))
    d, P_g, phi = (np.asarray(x, np.float64) for x in stats)
    S = len(d)
    Y = np.linalg.solve(np.eye(S) - lam * P_g.T, lam * P_g.T @ (d[:, None] * phi))
    return Y / d[:, None]


ALGORITHM = Algorithm(
    name="ctd_lambda", label="CTD(\u03bb)", init=init, update=update,
    shares_scalars=True,
    hyperparameters=(step_size("alpha", "step size of theta"),
                     step_size("beta", "step size of omega, the estimate of E[delta]"),
                     parameter("lambda", "trace decay", default=DEFAULT_LAMBDA, low=0.0, high=1.0)),
    equations="eqs. (30)-(31) [omegawithrho, thetawithrho] with an accumulating trace "
              "(Sutton & Barto 2018, Section 12.9); lambda = 0 is CTD",
    traces={"e": trace_expectation})
