"""Step-size schedules with optax's `Schedule` signature (count -> value).

A sweep's Robbins-Monro schedule is built here from each grid value. The
engine resolves a step size's schedule at the counter (the state field an
`Algorithm` declares as `counter`, read before the update increments it) before
calling update, so an update run by a sweep receives arrays: `eta * c` works.
An update called directly (an agent author's own loop) may still receive a
float or an optax schedule and should call `algorithms.resolve_step(step,
state.count)`, as every built-in update does (a no-op on a number).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp

if TYPE_CHECKING:  # optax is imported where a schedule of its own is built: 0.2 s of start-up otherwise
    import optax

SCHEDULES = ("constant", "robbins_monro")

# Robbins-Monro exponents by step-size name when a sweep gives none: alpha
# slowest, then zeta, then beta, the order p_alpha > p_zeta > p_beta that gives
# alpha = o(zeta), zeta = o(beta) as the paper's theorems assume. Any other step
# size defaults to 1.
DEFAULT_EXPONENTS = {"alpha": 1.0, "zeta": 0.8, "beta": 0.6}


def robbins_monro(init_value, t0: float, p: float) -> optax.Schedule:
    """The Robbins-Monro schedule c / (t + t0)^p with c = init_value * t0^p.

    Parametrised by its value at t = 0, so a sweep's grid values stay the initial
    step sizes: value(t) = init_value * (t0 / (t + t0))^p. For p in (1/2, 1] the
    sum diverges and the sum of squares converges, as the paper's theorems
    require; choosing p_alpha > p_zeta > p_beta gives alpha = o(zeta), zeta = o(beta).
    """
    def schedule(count):
        return init_value * jnp.power(t0 / (count + t0), p)

    return schedule


def constant(value: float) -> optax.Schedule:
    """A constant schedule (same as passing the float)."""
    import optax
    return optax.constant_schedule(value)
