"""The continuing task contract: `ContinuingEnv`, and the checks every task shares.

A continuing task has no episodes (issue 46; csuite's `Environment`:
`start()` once, then `step(action) -> (observation, reward)` forever,
github.com/google-deepmind/csuite `csuite/environments/base.py`). Here a task is
a `ContinuingEnv` of sizes, resolved parameters and pure functions of one
example; callers jit and vmap:

  reset(key) -> env_state                     a pytree of arrays, once per run
  step(key, env_state, action) -> (next_env_state, reward float32 ())
  features(env_state) -> (A, m) int32         indices of the features that are 1
                                              for (s, b), every action b (sparse)
                      or (A, d) float32       the vectors phi(s, b) (dense)

Features follow episodic control (`bec_jax.control.transition`): Q(s, a) is
the sum of the weights at the active indices (sparse) or w . phi(s, a) (dense),
over one weight vector of `num_features` entries covering all actions.

A task has no discount: the learner's gamma is the run spec's, never the
task's, since in a continuing problem the discount is a solution method's
parameter, not part of the problem (Sutton and Barto 2018, Sec. 10.4; Naik et
al. 2024, arXiv 2405.09999, sweep gamma as a learner's setting).

A tabular task also gives `num_states`, `state_index` and `model`; its features
are one-hot, (A, 1) int32 indices `a * num_states + s`.

A network learner (`bec_jax.control.continuing.deep`) reads the task's raw
observation instead of its features:

  observe(env_state) -> (observation_size,) float32

A task that gives `observe` declares `observation_size`; a tabular task without
one is observed as the one-hot vector of its state (`observation`).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class ContinuingEnv(NamedTuple):
    """A continuing task (module docstring).

    Attributes:
      name: the registry name.
      num_actions: A.
      num_features: the weight vector's length (all actions).
      num_active: m, the features per (s, a) when sparse; 0 when dense.
      params: the resolved parameters: `make(name, **params)` rebuilds the task.
      reset: key -> env_state (a pytree of arrays), called once per run.
      step: (key, env_state, action) -> (next_env_state, reward float32 ()).
      features: env_state -> (A, m) int32 indices or (A, d) float32 vectors.
      num_states: tabular tasks: the number of states S (0: not tabular).
      state_index: tabular: env_state -> int32 () in [0, S).
      model: tabular: () -> (P (S, A, S) float64, R (S, A) float64), R the
        expected immediate reward of (s, a).
      observe: env_state -> (observation_size,) float32, the observation a
        network learner reads (None: the task has none; a tabular task is then
        observed as the one-hot vector of its state, `observation`).
      observation_size: the length of `observe`'s vector (0 without one).
    """

    name: str
    num_actions: int
    num_features: int
    num_active: int
    params: dict
    reset: Callable
    step: Callable
    features: Callable
    num_states: int = 0
    state_index: Callable | None = None
    model: Callable | None = None
    observe: Callable | None = None
    observation_size: int = 0

    @property
    def tabular(self) -> bool:
        """Whether the task has an exact model (`model`, `state_index`, `num_states`)."""
        return self.num_states > 0 and self.model is not None and self.state_index is not None


def observation(env: ContinuingEnv) -> tuple[int, Callable] | None:
    """(size, fn) of the observation a network learner reads: the task's own
    `observe`, or for a tabular task without one the one-hot vector of its
    state (S,) float32; None for a task that has neither."""
    if env.observe is not None:
        return env.observation_size, env.observe
    if env.tabular:
        S = env.num_states
        return S, lambda s: jax.nn.one_hot(env.state_index(s), S, dtype=jnp.float32)
    return None


# --------------------------------------------------------------- shared checks

def positive_int(field: str, value) -> int:
    """`value` as an int >= 1; one-line `ValueError` naming `field` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{field}: an integer >= 1, got {value!r}")
    return int(value)


def finite_number(field: str, value, *, low: float = -math.inf, strict: bool = False) -> float:
    """`value` as a finite float >= `low` (> `low` with `strict`); one-line
    `ValueError` naming `field` otherwise."""
    bad = isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
    if bad or value < low or (strict and value == low):
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise ValueError(f"{field}: a finite number{'' if low == -math.inf else ' ' + bound}, got {value!r}")
    return float(value)


def probability(field: str, value, *, open_low: bool = False) -> float:
    """`value` as a float in [0, 1] ((0, 1] with `open_low`); one-line
    `ValueError` naming `field` otherwise."""
    bad = isinstance(value, bool) or not isinstance(value, numbers.Real)
    if bad or not (0.0 < float(value) <= 1.0 if open_low else 0.0 <= float(value) <= 1.0):
        raise ValueError(f"{field}: a probability in {'(0, 1]' if open_low else '[0, 1]'}, got {value!r}")
    return float(value)


def check_gamma(gamma) -> float:
    """The learner's discount as a float in [0, 1]. A continuing task has no
    discount of its own (module docstring), so this checks the run spec's gamma:
    1 is allowed (the average-reward learners, and Naik et al.'s grids reach 1)."""
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gamma: the learner's discount, a number in [0, 1], got {gamma!r}")
    return float(gamma)


def check_model(P, R, num_states: int, num_actions: int) -> tuple[np.ndarray, np.ndarray]:
    """(P, R) as float64 arrays, checked: P (S, A, S) non-negative with rows
    summing to 1, R (S, A) finite. `ValueError` naming `model` otherwise."""
    P = np.asarray(P, np.float64)
    R = np.asarray(R, np.float64)
    s, a = num_states, num_actions
    if P.shape != (s, a, s) or R.shape != (s, a):
        raise ValueError(f"model: P must be ({s}, {a}, {s}) and R ({s}, {a}), got {P.shape} and {R.shape}")
    if not np.all(np.isfinite(P)) or P.min() < 0 or not np.allclose(P.sum(-1), 1.0, atol=1e-12):
        raise ValueError("model: every P[s, a] must be a probability distribution over next states")
    if not np.all(np.isfinite(R)):
        raise ValueError("model: R must be finite")
    return P, R


def check_env(env) -> ContinuingEnv:
    """`env` if it keeps the contract's sizes and functions (module docstring);
    a one-line `ValueError` naming `task` otherwise. Tabular tasks' models are
    checked too (`check_model`)."""
    if not isinstance(env, ContinuingEnv):
        raise ValueError(f"task: a factory must return a ContinuingEnv, got a {type(env).__name__}")
    for field in ("num_actions", "num_features"):
        positive_int(f"task: {env.name}'s {field}", getattr(env, field))
    for field in ("num_active", "num_states", "observation_size"):
        value = getattr(env, field)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"task: {env.name}'s {field} must be an integer >= 0, got {value!r}")
    for field in ("reset", "step", "features"):
        if not callable(getattr(env, field)):
            raise ValueError(f"task: {env.name}'s {field} must be callable")
    tabular_fields = (env.num_states > 0, env.state_index is not None, env.model is not None)
    if any(tabular_fields) and not all(tabular_fields):
        raise ValueError(f"task: {env.name} must give all of num_states, state_index and model, or none")
    if (env.observe is not None) != (env.observation_size > 0):
        raise ValueError(f"task: {env.name} must give both observe and observation_size (> 0), or neither")
    if env.observe is not None and not callable(env.observe):
        raise ValueError(f"task: {env.name}'s observe must be callable")
    if not isinstance(env.params, dict):
        raise ValueError(f"task: {env.name}'s params must be a dict, got a {type(env.params).__name__}")
    return env


__all__ = ["ContinuingEnv", "check_env", "check_gamma", "check_model", "finite_number", "observation", "positive_int",
           "probability"]
