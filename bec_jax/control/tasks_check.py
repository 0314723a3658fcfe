"""The checks every episodic control task passes when it is made (`tasks.make`):
its sizes, discount, cap and functions, and the shape of its features, so a
task a user writes fails in one line naming the field, never deep inside a
compiled program (`bec_jax.control.transition`).

`one_line`, `shape_of` and `features_problem` are shared with the continuing
tasks' checks (`bec_jax.control.continuing.tasks_check`).
"""
from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

_SIZES = ("num_actions", "num_features", "num_active", "max_episode_steps")


def _traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def _check_sizes(env, where: str) -> None:
    for field in _SIZES:
        v = getattr(env, field)
        if _traced(v):  # a task axis traced inside a program: the spec compares the sizes itself
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            why = "; with no features a linear learner would learn nothing" if field in _SIZES[1:3] else ""
            raise ValueError(f"{where}: {field} must be an integer >= 1, got {v!r}{why}")
    g = env.gamma
    if not _traced(g) and (isinstance(g, bool) or not isinstance(g, numbers.Real) or not 0.0 <= float(g) <= 1.0):
        raise ValueError(f"{where}: gamma must be a number in [0, 1], got {g!r}")
    for field in ("reset", "step", "features"):
        if not callable(getattr(env, field)):
            raise ValueError(f"{where}: {field} must be callable")


def one_line(e: BaseException) -> str:
    """'RuntimeError: boom': a user function's error as one short line (its
    type and the first line of its message)."""
    first = (str(e).splitlines() or [""])[0][:200]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def shape_of(where: str, call: str, fn, *args):
    """`jax.eval_shape(fn, *args)`: the shapes a task's function gives,
    traced, not run; a one-line `ValueError` '{where}: {call} fails: ...'
    when the user's function raises."""
    try:
        return jax.eval_shape(fn, *args)
    except Exception as e:  # the user's functions: any error, one line
        raise ValueError(f"{where}: {call} fails: {one_line(e)}") from None


def features_problem(out, num_actions: int, num_active: int, num_features: int) -> str | None:
    """What is wrong with features of shape and dtype `out` (a
    `jax.ShapeDtypeStruct`), or None: (A, num_active) integer indices or
    (A, num_features) float vectors, as the task declares."""
    shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    sparse = dtype is not None and jnp.issubdtype(dtype, jnp.integer)
    dense = dtype is not None and jnp.issubdtype(dtype, jnp.floating)
    want = (num_actions, num_active if sparse else num_features)
    if (sparse or dense) and tuple(shape) == want:
        return None
    got = f"{dtype}{list(shape)}" if shape is not None and dtype is not None else f"a {type(out).__name__}"
    return (f"features gives {got}; expected ({num_actions}, {num_active}) integer indices "
            f"(num_actions, num_active) or ({num_actions}, {num_features}) float vectors (num_actions, "
            "num_features)")


def _check_features(env, where: str) -> None:
    """The features of a reset state: (A, num_active) integer indices or
    (A, num_features) float vectors, as the task declares."""
    out = shape_of(where, "features(reset(key))", lambda key: env.features(env.reset(key)), jax.random.key(0))
    problem = features_problem(out, env.num_actions, env.num_active, env.num_features)
    if problem:
        raise ValueError(f"{where}: {problem}")


def check_task(env, name: str):
    """`env` (a `ControlEnv`) if its sizes are integers >= 1 (zero features are
    refused: Q would be 0 everywhere), gamma is in [0, 1], its functions are
    callable and its features have the declared shape; a one-line `ValueError`
    naming `task` and the field otherwise. Sizes or a discount that are traced
    (task axes inside a program) are left to the spec, and so is the shape."""
    where = f"task: {name}"
    _check_sizes(env, where)
    traced = any(_traced(x) for x in jax.tree_util.tree_leaves(env.params)) or any(
        _traced(getattr(env, f)) for f in _SIZES + ("gamma",))
    if not traced:
        _check_features(env, where)
    return env
