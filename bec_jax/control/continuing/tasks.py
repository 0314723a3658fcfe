"""The continuing tasks by name: `make`, `names`, `register`, `factory`.

As episodic control's registry (`bec_jax.control.tasks`): a task is made by a
factory whose keyword parameters are the task's parameters (`--task-param
NAME=VALUE`) and which returns a `ContinuingEnv`
(`bec_jax.control.continuing.env`); `ContinuingEnv.params` holds the resolved
parameters, so `make(env.name, **env.params)` rebuilds it. A
`package.module:function` reference names a user's own factory without
registering it. A continuing task has no discount: gamma is the learner's (the
run spec's), so `make` refuses a `gamma` parameter with that reason.

Built in (`bec_jax.control.continuing.tabular`, each with an exact model):

  two_choice      Naik et al. (2024)'s 9-state TwoChoice
  river_swim      RiverSwim (Strehl and Littman 2008), as Naik et al. use it
  access_control  csuite's Access-Control (Sutton and Barto Example 10.2):
                  num_servers, priorities, free_probability
"""
from __future__ import annotations

import inspect
from collections.abc import Callable

from bec_jax.algorithms import lookup_callable, register_callable
from bec_jax.control.continuing import csuite, puckworld, tabular
from bec_jax.control.continuing.env import ContinuingEnv
from bec_jax.control.continuing.tasks_check import check_task

# name -> factory (keyword parameters -> ContinuingEnv).
TASKS: dict[str, Callable[..., ContinuingEnv]] = {}


def register(name: str, factory: Callable[..., ContinuingEnv] | None = None, *, replace: bool = False):
    """Registers `factory` (keyword parameters -> `ContinuingEnv`) under `name`
    and returns it; without `factory`, a decorator that does
    (`@register("my_task")`). A name that is taken is an error (`replace=True`
    overrides). As `bec_jax.control.tasks.register`."""
    if factory is None:
        return lambda f: register(name, f, replace=replace)
    return register_callable(TASKS, name, factory, "task", replace=replace)


def names() -> list[str]:
    """The registered continuing task names, sorted."""
    return sorted(TASKS)


def factory(ref: str) -> Callable[..., ContinuingEnv]:
    """The factory `ref` names: a registered name or a `package.module:function`
    reference (imported, not registered); `ValueError` naming `task` lists the
    known names (`bec_jax.algorithms.lookup_callable`)."""
    return lookup_callable(ref, TASKS, "task", "continuing task", "task factory",
                           f"{', '.join(names())} (or package.module:function for your own)")


def make(name: str, **params) -> ContinuingEnv:
    """The continuing task `name` (registered, or `package.module:function`)
    with its parameters; a one-line `ValueError` naming the field for an
    unknown task or parameter or a bad value (as `bec_jax.control.tasks.make`),
    or naming the task for one that breaks the contract
    (`continuing.tasks_check.check_task`)."""
    make_env = factory(name)
    sig = inspect.signature(make_env).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in sig.values()):  # else the factory checks its own
        allowed = list(sig)
        for key in params:
            if key == "gamma" and key not in allowed:
                raise ValueError("gamma: not a task parameter; a continuing task has no discount, gamma is the "
                                 "learner's (the run spec's)")
            if key not in allowed:
                raise ValueError(f"{key}: not a parameter of {name}; allowed: {', '.join(allowed) or 'none'}")
    try:
        env = make_env(**params)
    except (ValueError, ImportError):  # already one line naming its field
        raise
    except Exception as e:  # any other error of a user's factory: one line, not a traceback
        raise ValueError(f"task: {name} failed: {type(e).__name__}: {e}") from None
    return check_task(env, name, make_env, params)  # the contract, on sample states for a user's task: one line


# The built-in tasks (`bec_jax.control.continuing.tabular`).
register("two_choice", tabular.two_choice)
register("river_swim", tabular.river_swim)
register("access_control", tabular.access_control)

# csuite's tasks (bec_jax.control.continuing.csuite)
register("catch", csuite.catch)
register("windy_catch", csuite.windy_catch)
register("dancing_catch", csuite.dancing_catch)
register("pendulum", csuite.pendulum)
register("taxi", csuite.taxi)
# end of csuite's tasks

# Naik et al.'s PuckWorld, from their csuite fork (bec_jax.control.continuing.puckworld)
register("puckworld", puckworld.puckworld)


__all__ = ["TASKS", "factory", "make", "names", "register"]
