"""The checks every continuing task passes when it is made (`tasks.make`), so
that a task a user writes fails in one line naming the task, the function
and what was expected, before anything is compiled, run or written, never
deep inside a compiled program (`bec_jax.control.continuing.program`). As
episodic control's (`bec_jax.control.tasks_check`, whose helpers these
share); the contract is `bec_jax.control.continuing.env`'s.

Every task: its sizes and functions (`env.check_env`); a tabular task's
exact model by its size, P (S, A, S) in float64 against the host's memory,
before `model()` is called (`check_model_size`): a model too large to build
is refused at once with its size. (A factory that builds its tables itself,
as `tabular.table_env`'s do, has built them by then.)

A task that is not bec_jax's own (`package.module:function`, or registered
from elsewhere), once per factory and parameters in a process:

  traced, so for every state: reset(key) gives a pytree of arrays;
    step(key, state, action) gives (a next state of reset's structure,
    shapes and dtypes, a reward of shape () and a real dtype); features(state)
    gives (A, num_active) integer indices (num_active >= 1) or (A,
    num_features) float vectors (num_active 0); observe(state), where the
    task gives one, (observation_size,) float32; a tabular task's
    state_index(state) an integer ().
  run, on sample states only: `SAMPLE_RESETS` resets, each followed by
    `SAMPLE_STEPS` steps taking every action in turn: that no function
    raises; feature indices in [0, num_features); dense features,
    observations and rewards finite; a tabular task's state index in [0, S),
    its features the one-hot indices a * S + s, and its `model()`
    (`env.check_model`: P's rows distributions, R finite).

Not checked: states the samples do not reach (an index out of range, or a
NaN reward, that only a later state gives shows in the run's results, which
name NaN rewards as such: `ContinuingResult.best_index`); that `step` samples
`model()`; whether the model is unichain. bec_jax's own tasks are held to
the contract by its tests (tests/test_continuing_tasks.py and
test_continuing_csuite.py) and are not traced or run here: tracing
Access-Control's step alone takes about 0.2 s, which every value of a task
axis would pay.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax import threefry
from bec_jax.control.continuing.env import ContinuingEnv, check_env, check_model
from bec_jax.control.tasks_check import features_problem, one_line, shape_of
from bec_jax.engine import memory
from bec_jax.files import human

SAMPLE_RESETS = 2   # sample trajectories (their reset keys differ)
SAMPLE_STEPS = 8    # steps of each, the actions in turn
# Host memory the exact model may take, in copies of P: it is built, then
# checked and solved in float64 (`env.check_model`, `exact.optimal`), and a
# factory may hold it in another dtype first.
MODEL_COPIES = 2
_CHECKED: dict = {}  # (factory, parameters) -> True: a user task checked once per process


def builtin(factory) -> bool:
    """Whether `factory` is bec_jax's own (its tests hold it to the contract)."""
    f = getattr(factory, "func", factory)  # a functools.partial
    module = getattr(f, "__module__", None) or ""
    return module == "bec_jax" or module.startswith("bec_jax.")


def check_model_size(env: ContinuingEnv, where: str) -> None:
    """A one-line `ValueError` when a tabular task's exact model, P (S, A, S)
    float64, needs more than the host memory available (`MODEL_COPIES` of
    it: the model is built, checked and solved in float64), before `model()`
    builds it. Under an address-space limit (`ulimit -v`) the room left
    there counts instead where it is smaller."""
    S, A = env.num_states, env.num_actions
    need = S * A * S * 8
    avail = memory.host_available()
    free = memory.address_space_free()
    if free is not None:
        avail = min(avail, max(free, 0))
    if MODEL_COPIES * need > avail:
        raise ValueError(f"{where}: its exact model, P of ({S}, {A}, {S}) float64, is {human(need)} and needs "
                         f"{MODEL_COPIES} times that (built, then checked and solved); about {human(avail)} of "
                         "host memory is available; give the task fewer states")


def check_task(env, name: str, factory=None, params: dict | None = None) -> ContinuingEnv:
    """`env` if it keeps the continuing task contract (module docstring: what
    is and is not checked); a one-line `ValueError` 'task: NAME: ...' naming
    the function and what was expected otherwise. `factory` made `env` from
    `params`: a user's task is traced and run on sample states once per
    factory and parameters; bec_jax's own only have their model's size
    checked."""
    env = check_env(env)
    where = f"task: {name}"
    if env.tabular:
        check_model_size(env, where)
    if factory is not None and builtin(factory):
        return env
    key = None if factory is None else (factory, repr(sorted((params or {}).items())),
                                         repr(sorted(env.params.items())))
    if key is not None and key in _CHECKED:
        return env
    _check_shapes(env, where)
    _check_samples(env, where)
    if env.tabular:
        _check_model(env, where)
    if key is not None:
        _CHECKED[key] = True
    return env


# ------------------------------------------------------------------ traced

def _keys(n: int) -> jax.Array:
    """`n` keys as the program hands them to a task (`threefry.fused`)."""
    return threefry.fused(jax.random.split(jax.random.key(0), n))


def _describe(tree) -> str:
    """'int32[]' or a pytree of such: shapes and dtypes, short."""
    leaves = jax.tree_util.tree_leaves(tree)
    if len(leaves) == 1 and hasattr(leaves[0], "shape") and jax.tree_util.tree_structure(tree).num_nodes == 1:
        return f"{leaves[0].dtype}{list(leaves[0].shape)}"
    text = str(jax.tree_util.tree_map(lambda x: f"{getattr(x, 'dtype', type(x).__name__)}"
                                      f"{list(getattr(x, 'shape', ()))}", tree))
    return text if len(text) <= 200 else text[:197] + "..."


def _signature(tree):
    return jax.tree_util.tree_structure(tree), [(tuple(x.shape), x.dtype) for x in jax.tree_util.tree_leaves(tree)]


def _check_shapes(env: ContinuingEnv, where: str) -> None:
    """The traced half of the checks (module docstring): shapes and dtypes of
    every function's output, for every state."""
    key = _keys(1)[0]
    state = shape_of(where, "reset(key)", env.reset, key)
    if not all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(state)):
        raise ValueError(f"{where}: reset gives {_describe(state)}; expected a pytree of arrays (the task state)")
    out = shape_of(where, "step(key, state, action)", env.step, key, state, jax.ShapeDtypeStruct((), jnp.int32))
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise ValueError(f"{where}: step gives {_describe(out)}; expected (next_state, reward)")
    nxt, reward = out
    if _signature(nxt) != _signature(state):
        raise ValueError(f"{where}: step gives a next state of {_describe(nxt)}; expected one like reset's, "
                         f"{_describe(state)}")
    r_dtype = getattr(reward, "dtype", None)
    if getattr(reward, "shape", None) != () or not (
            jnp.issubdtype(r_dtype, jnp.integer) or jnp.issubdtype(r_dtype, jnp.floating) or r_dtype == jnp.bool_):
        raise ValueError(f"{where}: step gives a reward of {_describe(reward)}; expected a number of shape () "
                         "(float32)")
    feats = shape_of(where, "features(state)", env.features, state)
    problem = features_problem(feats, env.num_actions, env.num_active, env.num_features)
    if problem:
        raise ValueError(f"{where}: {problem}")
    sparse = jnp.issubdtype(feats.dtype, jnp.integer)
    if sparse and env.num_active < 1:
        raise ValueError(f"{where}: features gives integer indices; expected num_active >= 1 of them per action, "
                         "got num_active = 0 (0 declares dense float features)")
    if not sparse and env.num_active != 0:
        raise ValueError(f"{where}: features gives float vectors (dense); expected num_active = 0 for dense "
                         f"features, got {env.num_active}")
    if env.observe is not None:
        obs = shape_of(where, "observe(state)", env.observe, state)
        if getattr(obs, "shape", None) != (env.observation_size,) or getattr(obs, "dtype", None) != jnp.float32:
            raise ValueError(f"{where}: observe gives {_describe(obs)}; expected float32[{env.observation_size}] "
                             "(observation_size,)")
    if env.tabular:
        _check_tabular_shapes(env, where, state)


def _check_tabular_shapes(env: ContinuingEnv, where: str, state) -> None:
    """A tabular task's state index (an integer ()) and its one-hot features'
    count (num_features = S A)."""
    idx = shape_of(where, "state_index(state)", env.state_index, state)
    if getattr(idx, "shape", None) != () or not jnp.issubdtype(getattr(idx, "dtype", None), jnp.integer):
        raise ValueError(f"{where}: state_index gives {_describe(idx)}; expected an integer of shape ()")
    if env.num_active != 1 or env.num_features != env.num_states * env.num_actions:
        raise ValueError(f"{where}: a tabular task's features are one-hot: expected num_active = 1 and "
                         f"num_features = num_states x num_actions = {env.num_states * env.num_actions}, got "
                         f"{env.num_active} and {env.num_features}")


# ------------------------------------------------------------------ run on sample states

def _call(where: str, call: str, fn, *args):
    """`fn(*args)` run (not traced); a one-line `ValueError` when the user's
    function raises."""
    try:
        return fn(*args)
    except Exception as e:  # the user's functions: any error, one line
        raise ValueError(f"{where}: {call} fails: {one_line(e)}") from None


def _check_samples(env: ContinuingEnv, where: str) -> None:
    """The run half of the checks (module docstring): `SAMPLE_RESETS`
    trajectories of `SAMPLE_STEPS` steps, every function's values checked at
    each state."""
    init_keys = _keys(SAMPLE_RESETS)
    for i in range(SAMPLE_RESETS):
        stream = jax.random.fold_in(init_keys[i], 1)
        state = _call(where, "reset(key)", env.reset, jax.random.fold_in(init_keys[i], 0))
        for t in range(SAMPLE_STEPS + 1):
            at = "at a reset state" if t == 0 else f"at a sample state ({t} steps after a reset)"
            _check_state(env, where, state, at)
            if t == SAMPLE_STEPS:
                break
            key = threefry.fold_in(jax.random.fold_in(stream, t), 1)  # as the program keys a step
            state, reward = _call(where, "step(key, state, action)", env.step, key, state,
                                  jnp.int32(t % env.num_actions))
            r = float(np.asarray(reward))
            if not math.isfinite(r):
                raise ValueError(f"{where}: step gives a reward of {r} {at.replace('at a', 'from a')}; expected a "
                                 "finite number")


def _check_state(env: ContinuingEnv, where: str, state, at: str) -> None:
    """The features, observation and state index of one sample state."""
    feats = np.asarray(_call(where, "features(state)", env.features, state))
    if env.num_active > 0:
        bad = feats[(feats < 0) | (feats >= env.num_features)]
        if bad.size:
            raise ValueError(f"{where}: features gives index {int(bad.flat[0])} {at}; expected indices in "
                             f"[0, num_features = {env.num_features})")
    elif not np.all(np.isfinite(feats)):
        raise ValueError(f"{where}: features gives a value that is not finite {at}; expected finite vectors")
    if env.observe is not None and not np.all(np.isfinite(np.asarray(_call(where, "observe(state)", env.observe,
                                                                          state)))):
        raise ValueError(f"{where}: observe gives a value that is not finite {at}; expected finite observations")
    if env.tabular:
        s = int(np.asarray(_call(where, "state_index(state)", env.state_index, state)))
        if not 0 <= s < env.num_states:
            raise ValueError(f"{where}: state_index gives {s} {at}; expected an index in [0, num_states = "
                             f"{env.num_states})")
        one_hot = np.arange(env.num_actions)[:, None] * env.num_states + s
        if not np.array_equal(feats, one_hot):
            raise ValueError(f"{where}: features gives {feats.ravel().tolist()} {at} (state {s}); expected the "
                             f"one-hot indices a * num_states + s, {one_hot.ravel().tolist()}")


def _check_model(env: ContinuingEnv, where: str) -> None:
    """A tabular task's `model()`: (P, R) as `env.check_model` takes them."""
    out = _call(where, "model()", env.model)  # numpy arrays, or anything `check_model` converts
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise ValueError(f"{where}: model() gives {type(out).__name__}; expected (P, R)")
    try:
        check_model(*out, env.num_states, env.num_actions)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {one_line(e) if isinstance(e, TypeError) else e}") from None


__all__ = ["MODEL_COPIES", "SAMPLE_RESETS", "SAMPLE_STEPS", "builtin", "check_model_size", "check_task"]
