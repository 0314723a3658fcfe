"""A control algorithm of a user's own, for `--algorithm control_user_algorithm:MY_Q`
(tests/ is on sys.path under pytest): Q-learning written outside bec_jax, with a
step size named `eta`, which no built-in declares, so the command line and TOML
must take the algorithm's declared hyperparameters, not a fixed list."""
from typing import NamedTuple

import jax
import jax.numpy as jnp

from bec_jax.algorithms.base import Algorithm, resolve, step_size, zero_count
from bec_jax.control.algorithms import greedy_td_error


class MyQState(NamedTuple):
    """w: (d,) weights; count: updates so far."""

    w: jax.Array
    count: jax.Array


def init(w0: jax.Array) -> MyQState:
    """Starts at `w0`."""
    return MyQState(w=jnp.asarray(w0), count=zero_count())


def update(state: MyQState, tr, eta) -> MyQState:
    """w[active] += eta delta: the built-in `q` with its step size renamed, so a
    run of it equals a run of `q` with alpha = eta, bit for bit."""
    a = resolve(eta, state.count)
    delta, _ = greedy_td_error(state.w, tr)
    return MyQState(w=state.w.at[tr.active].add(a * delta), count=state.count + 1)


MY_Q = Algorithm(name="my_q", label="my Q", init=init, update=update,
                 hyperparameters=(step_size("eta", "step size of the weights"),),
                 equations="Q-learning (a user's copy)", weights="w", counter="count")
