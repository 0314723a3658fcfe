"""Tabular continuing tasks with exact models: Naik et al.'s TwoChoice and
RiverSwim, and csuite's Access-Control.

Each factory returns a `ContinuingEnv` (`bec_jax.control.continuing.env`) with
`num_states`, `state_index` and `model`. The env_state is the int32 state index
s itself (`state_index` is the identity); features are one-hot, (A, 1) int32
indices `a * S + s`. `model()` gives (P (S, A, S), R (S, A)) in float64, R the
expected immediate reward of (s, a); `step` samples exactly that model (the
tests compare its frequencies with P and its policy averages with the exact
gain of `bec_jax.control.continuing.exact`).

  two_choice      Naik, Wan, Tomar and Sutton, *Reward Centering* (RLC 2024,
                  arXiv 2405.09999), after Mahadevan (1996), as their code
                  defines it (abhisheknaik96/continuing-rl-exps,
                  `environments/two_choice.py`, commit de89d49): 9 states, start
                  0, the only choice at state 0. Action 0 goes 0 -> 1 with
                  reward +1, then 1 -> 2 -> 3 -> 4 -> 0; action 1 goes 0 -> 5,
                  then 5 -> 6 -> 7 -> 8 -> 0 with reward +2 on 8 -> 0. Both
                  actions do the same everywhere but state 0. Reward rates 0.2
                  (action 0 at state 0) and 0.4 (action 1, optimal).
  river_swim      Strehl and Littman (2008) in the form of the same code
                  (`environments/riverswim.py`, commit de89d49): 6 states, start
                  0; action 0 ("left") goes to s - 1 (s0 stays, reward 5e-4);
                  action 1 ("right") from s0 stays 0.7 / moves right 0.3, from
                  s1..s4 goes left 0.1 / stays 0.6 / right 0.3, from s5 goes
                  left 0.7 / stays 0.3 with reward 1 on staying only (so
                  R(s5, right) = 0.3 in expectation). The reward is a function of
                  (s, a, s'), sampled with s'.
  access_control  Sutton and Barto (2018) Example 10.2 as csuite defines it
                  (github.com/google-deepmind/csuite,
                  `csuite/environments/access_control.py`, commit b74faed): N
                  servers, priorities drawn uniformly, state (busy, k) with index
                  busy * K + k for the k-th priority (S = (N + 1) K); starts with
                  0 busy and a uniformly drawn priority. Within a step: accept (1)
                  with a free server gives reward = the priority and busy += 1,
                  otherwise reward 0 (accepting with every server busy is a
                  reject); then the next priority is drawn uniformly; then each
                  busy server (counted after the acceptance) frees with
                  probability p: one binomial draw, written here as a sum of
                  Bernoulli draws over the N server slots.

Sampling is exact up to float32: the uniforms are multiples of 2^-23, and
P's cumulative rows and Access-Control's p are rounded to float32, so each
probability is off by at most ~1e-7 (far below any test's resolution).
"""
from __future__ import annotations

import numbers
from math import comb

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax import threefry
from bec_jax.control.continuing.env import ContinuingEnv, check_model, positive_int, probability

# The key implementations whose `jax.random.uniform` bits `uniforms` computes
# itself: bec_jax's fused threefry (`threefry.IMPL`), and JAX's threefry in its
# partitionable mode (JAX's default), which draws the same bits.
_FUSED = str(threefry.IMPL)


def uniforms(key: jax.Array, count: int) -> jax.Array:
    """`jax.random.uniform(key, (count,), float32)`, bit for bit, for one
    threefry key: word i is the hash of the counter (0, i), its two halves
    XORed (JAX's partitionable threefry), its top 23 bits the mantissa of a
    float in [1, 2), minus 1. Written as `count` separate hashes of scalars
    rather than one hash of a (count,) counter: under vmap each is then an
    elementwise chain over the batch of runs, which XLA:CPU vectorises along
    the runs; the (runs, count) form with its short minor axis ran the
    Access-Control step about 3x slower (benchmarks/README.md,
    "Continuing control"). Keys of other implementations (or JAX's threefry
    outside its partitionable mode) go to `jax.random.uniform`."""
    impl = str(jax.random.key_impl(key))
    if not (impl == _FUSED or (impl == "threefry2x32" and jax.config.jax_threefry_partitionable)):
        return jax.random.uniform(key, (count,), jnp.float32)
    words = jax.random.key_data(key)
    one = jnp.uint32(0x3F800000)  # the bits of 1.0f: exponent 0, mantissa from the hash
    out = []
    for i in range(count):
        hi, lo = threefry.hash2x32(words[0], words[1], jnp.uint32(0), jnp.uint32(i))
        mantissa = (hi ^ lo) >> jnp.uint32(32 - 23)
        out.append(jax.lax.bitcast_convert_type(mantissa | one, jnp.float32) - jnp.float32(1.0))
    return jnp.stack(out)


def one_hot_features(num_states: int, num_actions: int):
    """The one-hot features of a tabular task: s -> (A, 1) int32 indices
    a * S + s (`bec_jax.control.transition`'s sparse binary convention)."""
    offsets = jnp.arange(num_actions, dtype=jnp.int32)[:, None] * num_states

    def features(state):
        """(A, 1) indices a * S + s of the state index s."""
        return offsets + jnp.asarray(state, jnp.int32)

    return features


def identity_index(state):
    """The state index of a tabular task's env_state, which is the index itself."""
    return jnp.asarray(state, jnp.int32)


def table_env(name: str, P, R3, start: int, params: dict) -> ContinuingEnv:
    """A tabular task from a transition table P (S, A, S) and a reward table
    R3 (S, A, S) of r(s, a, s'), as Naik et al.'s `FeaturesEnv.step` samples
    them (s' ~ P[s, a], then r = R3[s, a, s']). `step` draws s' by inverse CDF
    on float32 cumulative rows with one uniform per step (DESIGN.md's
    performance notes); the model's R is the expectation sum_s' P R3."""
    P = np.asarray(P, np.float64)
    R3 = np.asarray(R3, np.float64)
    num_states, num_actions = P.shape[:2]
    expected = (P * R3).sum(-1)
    check_model(P, expected, num_states, num_actions)
    cum = np.cumsum(P, axis=-1)
    # The last entry is +inf so that rounding in the float32 sums can never
    # push a draw past the last state.
    cum[..., -1] = np.inf
    cum_j = jnp.asarray(cum, jnp.float32)
    r3_j = jnp.asarray(R3, jnp.float32)

    def reset(key):
        """The start state (key unused: the start is fixed)."""
        del key
        return jnp.asarray(start, jnp.int32)

    def step(key, state, action):
        """s' by inverse CDF on P[s, a] with one uniform; r = R3[s, a, s']."""
        state = jnp.asarray(state, jnp.int32)
        action = jnp.asarray(action, jnp.int32)
        u = jax.random.uniform(key, (), jnp.float32)
        nxt = jnp.sum(cum_j[state, action] <= u).astype(jnp.int32)
        return nxt, r3_j[state, action, nxt]

    def model():
        """(P, R) float64, R the expected reward of (s, a)."""
        return P.copy(), expected.copy()

    return ContinuingEnv(name=name, num_actions=num_actions, num_features=num_states * num_actions, num_active=1,
                         params=params, reset=reset, step=step, features=one_hot_features(num_states, num_actions),
                         num_states=num_states, state_index=identity_index, model=model)


def two_choice() -> ContinuingEnv:
    """Naik et al. (2024)'s TwoChoice MDP, 9 states (module docstring;
    `environments/two_choice.py` of abhisheknaik96/continuing-rl-exps)."""
    num_states = 9
    P = np.zeros((num_states, 2, num_states))
    R3 = np.zeros((num_states, 2, num_states))
    # Both loops are chains s -> s + 1 closed back to 0; the two actions differ
    # only at state 0, where action 1 enters the second loop at 5.
    for s in range(num_states):
        nxt = 0 if s in (4, 8) else s + 1
        P[s, :, nxt] = 1.0
    P[0, 1, 1], P[0, 1, 5] = 0.0, 1.0
    R3[0, 0, 1] = 1.0
    R3[8, :, 0] = 2.0
    return table_env("two_choice", P, R3, 0, {})


def river_swim() -> ContinuingEnv:
    """RiverSwim (Strehl and Littman 2008) as Naik et al. (2024) define it, 6
    states (module docstring; `environments/riverswim.py` of
    abhisheknaik96/continuing-rl-exps)."""
    num_states = 6
    last = num_states - 1
    P = np.zeros((num_states, 2, num_states))
    R3 = np.zeros((num_states, 2, num_states))
    for s in range(num_states):
        P[s, 0, max(s - 1, 0)] = 1.0  # left is deterministic; s0 stays
        if s == 0:
            P[s, 1, s], P[s, 1, s + 1] = 0.7, 0.3
        elif s == last:
            P[s, 1, s - 1], P[s, 1, s] = 0.7, 0.3
        else:
            P[s, 1, s - 1], P[s, 1, s], P[s, 1, s + 1] = 0.1, 0.6, 0.3
    R3[0, 0, 0] = 5e-4
    R3[last, 1, last] = 1.0  # only the stay at the far bank pays
    return table_env("river_swim", P, R3, 0, {})


def _priorities(priorities) -> tuple[float, ...]:
    """The priorities as a tuple of distinct finite floats (at least one)."""
    if isinstance(priorities, (str, bytes)) or not hasattr(priorities, "__iter__"):
        raise ValueError(f"priorities: a list of distinct numbers, got {priorities!r}")
    values = list(priorities)
    ok = values and all(isinstance(v, numbers.Real) and not isinstance(v, bool) and np.isfinite(v) for v in values)
    if not ok or len(set(float(v) for v in values)) != len(values):
        raise ValueError(f"priorities: a non-empty list of distinct finite numbers, got {priorities!r}")
    return tuple(float(v) for v in values)


def access_control_model(num_servers: int, priorities: tuple[float, ...], free_probability: float):
    """Access-Control's exact (P, R), float64 (module docstring): after the
    acceptance b busy servers remain, the number freed is Binomial(b, p) and the
    next priority is uniform and independent of it."""
    n, k = num_servers, len(priorities)
    S = (n + 1) * k
    P = np.zeros((S, 2, S))
    R = np.zeros((S, 2))
    for busy in range(n + 1):
        for i, prio in enumerate(priorities):
            s = busy * k + i
            for a in (0, 1):
                accepted = a == 1 and busy < n
                R[s, a] = prio if accepted else 0.0
                b = busy + accepted
                for freed in range(b + 1):
                    mass = comb(b, freed) * free_probability**freed * (1 - free_probability) ** (b - freed)
                    P[s, a, (b - freed) * k:(b - freed + 1) * k] += mass / k
    return P, R


def access_control(num_servers=10, priorities=(1, 2, 4, 8), free_probability=0.06) -> ContinuingEnv:
    """csuite's Access-Control (Sutton and Barto Example 10.2; module docstring,
    `csuite/environments/access_control.py`). Actions 0 reject, 1 accept; the
    env_state is the index busy * K + k."""
    n = positive_int("num_servers", num_servers)
    prios = _priorities(priorities)
    p = probability("free_probability", free_probability)
    k = len(prios)
    num_states = (n + 1) * k
    prio_j = jnp.asarray(prios, jnp.float32)
    slots = jnp.arange(n, dtype=jnp.int32)

    def reset(key):
        """0 busy servers and a uniformly drawn priority (csuite's `start`)."""
        return jax.random.randint(key, (), 0, k, dtype=jnp.int32)

    def step(key, state, action):
        """Accept or reject, draw the next priority, then free each busy server
        with probability p (csuite's `step`, in that order)."""
        state = jnp.asarray(state, jnp.int32)
        busy, i = state // k, state % k
        accepted = (jnp.asarray(action, jnp.int32) == 1) & (busy < n)
        reward = jnp.where(accepted, prio_j[i], jnp.float32(0.0))
        busy = busy + accepted.astype(jnp.int32)
        # One bulk draw of N + 1 uniforms (DESIGN.md's performance notes),
        # `uniforms`: the first picks the next priority, floor(u K); the others
        # are Bernoulli(p) draws on the first `busy` of N slots, whose sum is
        # Binomial(busy, p).
        u = uniforms(key, n + 1)
        nxt_i = jnp.minimum((u[0] * k).astype(jnp.int32), k - 1)
        freed = jnp.sum((u[1:] < p) & (slots < busy)).astype(jnp.int32)
        return (busy - freed) * k + nxt_i, reward

    def model():
        """(P, R) float64 (`access_control_model`)."""
        return access_control_model(n, prios, p)

    params = {"num_servers": n, "priorities": list(prios), "free_probability": p}
    return ContinuingEnv(name="access_control", num_actions=2, num_features=2 * num_states, num_active=1,
                         params=params, reset=reset, step=step, features=one_hot_features(num_states, 2),
                         num_states=num_states, state_index=identity_index, model=model)


__all__ = ["access_control", "access_control_model", "identity_index", "one_hot_features", "river_swim",
           "table_env", "two_choice", "uniforms"]
