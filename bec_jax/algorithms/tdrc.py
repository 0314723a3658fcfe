"""TDRC (Ghiassian et al. 2020): TD with regularized corrections, linear, off-policy.

"Gradient temporal-difference learning with regularized corrections" (ICML 2020),
as its code writes it (rlai-lab/Regularized-GradientTD,
experiments/prediction/agents/TDRC.py):
    delta = r + gamma theta^T phi' - theta^T phi,   delta_hat = h^T phi
    theta <- theta + alpha rho (delta phi - gamma delta_hat phi')
    h     <- h + eta alpha [(rho delta - delta_hat) phi - reg h]
with the paper's beta = `reg` (1 in the paper) and eta = 1. reg = 0 is TDC as
that code runs it (rho on delta only inside h's update; `tdc` here puts rho on
the whole update, the BEC authors' choice: the expected updates are the same,
the variances differ). theta converges to the TD fixpoint where TD does and
stays stable on Baird's counterexample.
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


class TDRCState(NamedTuple):
    """theta: (k,) weights; h: (k,) auxiliary weights; count: updates so far."""

    theta: jax.Array
    h: jax.Array
    count: jax.Array


def init(theta0: jax.Array) -> TDRCState:
    """Starts TDRC at `theta0` with h = 0."""
    theta0 = jnp.asarray(theta0)
    return TDRCState(theta=theta0, h=jnp.zeros_like(theta0), count=zero_count())


def update(state: TDRCState, tr: Transition, alpha: StepSize, eta: float = 1.0,
           reg: float = 1.0) -> TDRCState:
    """One TDRC step (Ghiassian et al. 2020), h's step size eta * alpha."""
    check_inputs(state.theta, tr)
    a = resolve(alpha, state.count)
    delta = td_error(state.theta, tr)
    dh = vdot(state.h, tr.phi)
    theta = state.theta + (a * tr.rho) * (delta * tr.phi - (tr.discount * dh) * tr.phi_next)
    h = state.h + (eta * a) * ((tr.rho * delta - dh) * tr.phi - reg * state.h)
    return TDRCState(theta=theta, h=h, count=state.count + 1)


ALGORITHM = Algorithm(
    name="tdrc", label="TDRC", init=init, update=update,
    shares_scalars=True,
    hyperparameters=(step_size("alpha", "step size of theta"),
                     parameter("eta", "h's step size is eta * alpha", default=1.0, low=0.0, low_open=True),
                     parameter("reg", "the regularisation beta of h (0: TDC as Ghiassian et al.'s code)",
                               default=1.0, low=0.0)),
    equations="TDRC of Ghiassian et al. (2020) (no equation in the BEC paper), as in its code")
