"""Emphatic TD(0) (Sutton, Mahmood & White 2016) and centered emphatic TD, linear.

Off-policy emphatic TD(lambda) with lambda = 0 ("An emphatic approach to the
problem of off-policy temporal-difference learning", JMLR 2016, Section 5):
    F_t   = rho_{t-1} gamma_t F_{t-1} + i(S_t)         (followon trace, F_{-1} = 0)
    M_t   = F_t                                         (emphasis, lambda = 0)
    theta <- theta + alpha rho_t M_t delta_t phi_t
with a constant interest i(s) = `interest`. gamma_t is the discount of the
transition into S_t, so an episode's end (gamma 0) resets the trace. The state
stores f = rho_t gamma_{t+1} F_t, the part of F_{t+1} known after step t.

Centered emphatic TD (`cetd`, new here: the paper's future work 3) centers the
TD error as CTD does (eqs. (30)-(31) [omegawithrho, thetawithrho]), with the
emphasis on both updates:
    theta <- theta + alpha rho_t M_t (delta_t - omega) phi_t
    omega <- omega + beta  rho_t M_t (delta_t - omega)
Derivation: ETD's expected update is Phi^T M (r + P_g Phi theta - Phi theta), the
TD update under the emphatic weighting m = (I - P_g^T)^-1 (d_mu * i) instead of
d_mu (M = diag(m)). Centering with respect to that same weighting,
C_m x = x - (m^T x / 1^T m) 1, gives omega* = m^T delta_bar / 1^T m, which is
exactly the fixpoint of the emphasized omega update, and the fixpoint
Phi^T M C_m (r + P_g Phi theta - Phi theta) = 0: the centered TD fixpoint of the
paper (eq. (27) [centeredTDfixpoint]) with M in place of D. Its expected-update
matrix comes from `analysis.expected_update` (the followon trace replaced by its
stationary expectation; `followon_expectation`). Unlike ETD's
Phi^T M (I - P_g) Phi, which is positive definite, the centered matrix
Phi^T (M - m m^T / 1^T m)(I - P_g) Phi need not be: where it is stable is an
empirical question the prediction suite answers.
"""
from typing import NamedTuple

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


class ETDState(NamedTuple):
    """theta: (k,) weights; f: () rho_t gamma_{t+1} F_t, the followon trace's
    carried part; count: updates so far."""

    theta: jax.Array
    f: jax.Array
    count: jax.Array


class CETDState(NamedTuple):
    """theta: (k,) weights; f: () the followon trace's carried part; omega: ()
    emphatic-weighted estimate of E[delta]; count: updates so far."""

    theta: jax.Array
    f: jax.Array
    omega: jax.Array
    count: jax.Array


def init(theta0: jax.Array) -> ETDState:
    """Starts ETD at `theta0` with F_{-1} = 0."""
    theta0 = jnp.asarray(theta0)
    return ETDState(theta=theta0, f=jnp.zeros((), theta0.dtype), count=zero_count())


def update(state: ETDState, tr: Transition, alpha: StepSize, interest: float = 1.0) -> ETDState:
    """One emphatic TD(0) step (Sutton, Mahmood & White 2016, lambda = 0)."""
    check_inputs(state.theta, tr)
    a = resolve(alpha, state.count)
    F = state.f + interest
    theta = state.theta + (a * tr.rho * F * td_error(state.theta, tr)) * tr.phi
    return ETDState(theta=theta, f=tr.rho * tr.discount * F, count=state.count + 1)


def init_centered(theta0: jax.Array, omega0: float = 0.0) -> CETDState:
    """Starts centered ETD at `theta0` with F_{-1} = 0 and omega = `omega0`."""
    theta0 = jnp.asarray(theta0)
    return CETDState(theta=theta0, f=jnp.zeros((), theta0.dtype), omega=jnp.asarray(omega0, theta0.dtype),
                     count=zero_count())


def update_centered(state: CETDState, tr: Transition, alpha: StepSize, beta: StepSize,
                    interest: float = 1.0) -> CETDState:
    """One centered emphatic TD(0) step (module docstring). Both updates use the
    current omega."""
    check_inputs(state.theta, tr)
    a, b = resolve(alpha, state.count), resolve(beta, state.count)
    F = state.f + interest
    centered = tr.rho * F * (td_error(state.theta, tr) - state.omega)
    return CETDState(theta=state.theta + (a * centered) * tr.phi, f=tr.rho * tr.discount * F,
                     omega=state.omega + b * centered, count=state.count + 1)


def emphatic_weighting(stats: ModelStats, interest: float = 1.0):
    """m = (I - P_g^T)^-1 (d_mu * i): the emphatic weighting, m(s) = d(s) E[F_t | S_t = s]."""
    import numpy as np
    d, P_g = np.asarray(stats.d, np.float64), np.asarray(stats.P_g, np.float64)
    return np.linalg.solve(np.eye(len(d)) - P_g.T, d * interest)


def followon_expectation(stats: ModelStats, hyperparameters: dict):
    """E[f | S_t = s] for the stored f = rho_{t-1} gamma_t F_{t-1}: m(s)/d(s) - i."""
    interest = float(hyperparameters.get("interest", 1.0))
    return emphatic_weighting(stats, interest) / stats.d - interest


_INTEREST = parameter("interest", "constant interest i(s)", default=1.0, low=0.0, low_open=True)

ALGORITHM = Algorithm(
    name="etd", label="ETD", init=init, update=update,
    shares_scalars=True,
    hyperparameters=(step_size("alpha", "step size of theta"), _INTEREST),
    equations="off-policy emphatic TD(0) of Sutton, Mahmood & White (2016) (no equation in the BEC paper)",
    traces={"f": followon_expectation})

CENTERED = Algorithm(
    name="cetd", label="CETD", init=init_centered, update=update_centered,
    shares_scalars=True,
    hyperparameters=(step_size("alpha", "step size of theta"),
                     step_size("beta", "step size of omega, the emphatic-weighted estimate of E[delta]"),
                     _INTEREST),
    equations="eqs. (30)-(31) [omegawithrho, thetawithrho] with ETD's emphasis on both updates (new; "
              "centered fixpoint eq. (27) [centeredTDfixpoint] under the emphatic weighting)",
    traces={"f": followon_expectation})
