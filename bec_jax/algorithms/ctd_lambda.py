"""Centered TD(lambda) with linear features and accumulating eligibility traces.

Bellman error centering (the paper's eqs. omegawithrho, thetawithrho) combined
with the off-policy accumulating trace of Sutton & Barto (2018, 2nd ed.,
Section 12.9), z_t = rho_t (gamma_t lambda z_{t-1} + phi_t):

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
omegawithrho, thetawithrho; eqs. omega, theta when rho = 1). The paper lists
"extending Bellman error centering to the lambda returns" as future work: this is
that natural extension, not one of its analysed algorithms, and no convergence
claim comes with it. Traces need consecutive transitions of one trajectory (the
"markov" sampler); with i.i.d. transitions they carry no meaning.

lambda is a static argument, not a step size: the sweep grid varies alpha and
beta only. `REGISTRY["ctd_lambda"]` uses `DEFAULT_LAMBDA`; `make(lam)` returns an
`Algorithm` for another value.
"""
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from bec_jax.algorithms.base import (Algorithm, StepSize, check_inputs, resolve, td_error,
                                     zero_count)
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
           lam: float = DEFAULT_LAMBDA) -> CTDLambdaState:
    """One centered TD(lambda) step (module docstring; lam = 0 is CTD, eqs.
    omegawithrho, thetawithrho). Both updates use the current theta and omega."""
    check_inputs(state.theta, tr)
    chex.assert_equal_shape([state.theta, state.e])
    a, b = resolve(alpha, state.count), resolve(beta, state.count)
    err = td_error(state.theta, tr) - state.omega
    z = tr.rho * (state.e + tr.phi)
    return CTDLambdaState(
        theta=state.theta + (a * err) * z,
        e=(tr.discount * lam) * z,
        omega=state.omega + b * (tr.rho * err),
        count=state.count + 1,
    )


def make(lam: float = DEFAULT_LAMBDA) -> Algorithm:
    """The `Algorithm` descriptor of centered TD(lambda) with a fixed `lam` in [0, 1].

    Register it under a name of your choice to sweep it, e.g.
    `algorithms.REGISTRY["ctd_lambda_0.9"] = ctd_lambda.make(0.9)`.
    """
    lam = float(lam)
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam: expected a trace decay in [0, 1], got {lam}")
    name = "ctd_lambda" if lam == DEFAULT_LAMBDA else f"ctd_lambda_{lam:g}"
    return Algorithm(name, init, lambda s, tr, h: update(s, tr, h.alpha, h.beta, lam),
                     ("alpha", "beta"), ("theta", "e", "omega"),
                     f"omegawithrho, thetawithrho with an accumulating trace, lambda = {lam:g}")
