"""Shared pieces of the update functions: step sizes, the TD error, and the
self-description (`Algorithm`, `Hyperparameter`) each algorithm module gives of
itself.

Nothing here (or anywhere in `bec_jax.algorithms`) knows about environments: a
`Transition` carries the feature vectors an update needs.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import keyword
import math
import re
from typing import Any, Callable, NamedTuple, Union

import chex
import jax
import jax.numpy as jnp

from bec_jax.transition import Transition

# A step size: a constant, or an optax schedule (optax.Schedule: count -> value)
# evaluated at the state's update count. Spelled as the Callable it is, so that
# importing bec_jax does not import optax (0.2 s of the command line's start).
StepSize = Union[float, jax.Array, Callable[[Any], Any]]


def resolve(step: StepSize, count: jax.Array) -> jax.Array:
    """The step size to use at update number `count` (calls a schedule); public
    as `algorithms.resolve_step`."""
    return step(count) if callable(step) else step


# Feature vectors up to this length get an unrolled dot product (see `vdot`).
UNROLL_DOT_MAX = 32

_SHARING: contextvars.ContextVar = contextvars.ContextVar("bec_jax_sharing", default=None)


@contextlib.contextmanager
def sharing(token: jax.Array):
    """Updates traced inside compute each TD error and dot product (`td_error`,
    `vdot`, `shared`) once per step, into an array every consumer reads.

    Without it XLA:CPU fuses such a per-example scalar into each of its
    consumers (one loop per updated vector) and recomputes it in each; the
    updated vectors then cannot be written in place, and the while loop copies
    them every step. With it the bare CTDC loop runs much faster on a CPU with
    XLA's default fusion emitters, bit for bit the same (benchmarks/README.md).
    The barrier is a `lax.cond` on `token >= 0` whose two branches compute the
    same value, so any token gives the same results; for the speed-up, `token`
    must be a number XLA cannot fold, traced outside the `vmap` (such as a
    uniform drawn for the step). Use it on a CPU: elsewhere a conditional can
    cost a round trip to the host.

    Who enters it: the sweep engine, around the update of an algorithm that
    declares `Algorithm.shares_scalars`, and only where the program's form
    shares scalars (`engine.tuning.KernelForm.share`); never around any other.
    Your own loop may enter it around your own update."""
    reset = _SHARING.set(token)
    try:
        yield
    finally:
        _SHARING.reset(reset)


def shared(f: Callable[[], jax.Array]) -> jax.Array:
    """f(); inside `sharing`, computed once for all its consumers (an update
    that uses it declares `Algorithm.shares_scalars`).

    f is computed inside the conditional's branch, so its result is written
    where its consumers read it (a value computed outside would be copied in)."""
    token = _SHARING.get()
    if token is None:
        return f()
    # Both branches compute f: the conditional only keeps XLA from fusing f
    # into each consumer (it keeps a conditional whose branches are alike).
    return jax.lax.cond(token >= 0, f, f)


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    k = a.shape[-1]
    if k > UNROLL_DOT_MAX:
        # HIGHEST: a GPU's default f32 matmul is TF32 (about 1e-3 relative error); the
        # CPU computes f32 dots in f32 either way, so its results keep their bits.
        return jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)
    total = a[0] * b[0]
    for i in range(1, k):
        total = total + a[i] * b[i]
    return total


def vdot(a: jax.Array, b: jax.Array) -> jax.Array:
    """a . b for the vectors of one example (`shared` by its consumers).

    For short vectors (k <= UNROLL_DOT_MAX, static) it is an unrolled sum of
    products, which under `vmap` stays a purely elementwise expression that XLA
    fuses into the update's loop. `jnp.dot` (a batched matmul plus transposes) or
    `jnp.sum(a * b)` (a minor-axis reduction) is several times slower on CPU for
    the short feature vectors of linear RL (benchmarks/README.md). The order of
    the additions is part of what an update computes: it is not a choice of the
    program's form (`engine.tuning.KernelForm`).
    """
    return shared(lambda: _dot(a, b))


def td_error(theta: jax.Array, tr: Transition) -> jax.Array:
    """delta = r + gamma theta^T phi' - theta^T phi for one transition (gamma is the
    transition's own discount, 0 where an episode ends; `shared` by its consumers)."""
    return shared(lambda: tr.reward + tr.discount * _dot(theta, tr.phi_next) - _dot(theta, tr.phi))


def check_inputs(theta: jax.Array, tr: Transition) -> None:
    """Shape checks for one example (batch with `vmap`, never with extra axes)."""
    chex.assert_rank([theta, tr.phi, tr.phi_next, tr.reward, tr.discount, tr.rho],
                     [1, 1, 1, 0, 0, 0])
    chex.assert_equal_shape([theta, tr.phi, tr.phi_next])


def zero_count() -> jax.Array:
    return jnp.zeros((), jnp.int32)


# ------------------------------------------------------------ self-description

# Names a hyperparameter may not take: they are the sweep spec's own fields.
RESERVED_NAMES = frozenset({
    "env", "algorithm", "points", "env_params", "hyperparameters", "schedule", "seeds", "steps",
    "log_every", "sampler", "metrics", "dtype", "seed", "divergence_bound", "out", "config",
    "chunk_size", "resume", "overwrite", "env_param", "env_index"})
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def _fmt(v: float) -> str:
    return {math.inf: "inf", -math.inf: "-inf"}.get(v, f"{v:g}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hyperparameter:
    """One hyperparameter an algorithm's `update` takes as a keyword argument.

    Attributes:
      name: the name a sweep uses (`--NAME` on the command line, `NAME = [...]` in
        TOML); letters, digits and underscores.
      doc: one line saying what it is.
      default: the value used when a sweep does not give one (None: required).
      low, high: the allowed range; `low_open` / `high_open` exclude the end.
      step_size: a step size. It must be > 0 and a sweep's Robbins-Monro schedule
        applies to it (the engine passes its value at the update counter; see
        `Algorithm`).
      static: changes the program's structure (a Python value at trace time, not
        an array): each value compiles its own program.
      arg: the keyword `update` takes it as (default `name`; `lambda` is a Python
        keyword, so it is passed as `lambda_`).
    """

    name: str
    doc: str
    default: Any = None
    low: float = 0.0
    high: float = math.inf
    low_open: bool = True
    high_open: bool = False
    step_size: bool = True
    static: bool = False
    arg: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"hyperparameter name: expected letters, digits and underscores "
                             f"starting with a letter, got {self.name!r}")
        if self.name in RESERVED_NAMES:
            raise ValueError(f"hyperparameter name: {self.name!r} is a sweep field; choose another name")
        if self.arg is None:
            object.__setattr__(self, "arg", self.name + "_" if keyword.iskeyword(self.name) else self.name)
        if self.step_size and self.static:
            raise ValueError(f"{self.name}: a step size cannot be static")
        if self.default is not None and not self.static:
            self.check(self.default, self.name)

    @property
    def range_text(self) -> str:
        lo = "(" if self.low_open else "["
        hi = ")" if self.high_open or self.high == math.inf else "]"
        return f"{lo}{_fmt(self.low)}, {_fmt(self.high)}{hi}"

    def check(self, value: Any, where: str | None = None) -> Any:
        """`value` as the update will get it; `ValueError` naming `where` (default
        the hyperparameter's name) if it is outside the allowed range."""
        where = where or self.name
        if self.static:
            if not isinstance(value, (bool, int, float, str)):
                raise ValueError(f"{where}: expected a number, boolean or string, got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) and not _is_np_real(value):
            raise ValueError(f"{where}: expected a number in {self.range_text}, got {value!r}")
        v = float(value)
        ok = math.isfinite(v) and (v > self.low if self.low_open else v >= self.low) and \
            (v < self.high if self.high_open else v <= self.high)
        if not ok:
            raise ValueError(f"{where}: must be {'a step size ' if self.step_size else ''}"
                             f"in {self.range_text}, got {value!r}")
        return v


def _is_np_real(x) -> bool:
    import numpy as np
    return isinstance(x, (np.integer, np.floating)) and not isinstance(x, np.bool_)


def step_size(name: str, doc: str) -> Hyperparameter:
    """A step size: a number > 0, or an optax schedule (see `Hyperparameter`)."""
    return Hyperparameter(name=name, doc=doc)


def parameter(name: str, doc: str, *, default=None, low: float = -math.inf, high: float = math.inf,
              low_open: bool = False, high_open: bool = False, static: bool = False) -> Hyperparameter:
    """A hyperparameter that is not a step size (e.g. a trace decay lambda in [0, 1])."""
    return Hyperparameter(name=name, doc=doc, default=default, low=low, high=high, low_open=low_open,
                          high_open=high_open, step_size=False, static=static)


class ModelStats(NamedTuple):
    """What a trace's stationary expectation may depend on (float64 NumPy arrays,
    given by `bec_jax.theory.expected_updates`; S states, k features).

    Attributes:
      d: (S,) the behaviour's stationary state distribution d_mu.
      P_g: (S, S) the discounted target matrix sum_a pi(a|s) P(s'|s,a) gamma(s,a,s')
        (= sum_a mu rho P gamma: what a rho-weighted, discounted trace propagates by).
      phi: (S, k) features.
    """

    d: Any
    P_g: Any
    phi: Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class Algorithm:
    """An algorithm as it describes itself to the sweep engine and to `analysis`.

    Attributes:
      name: the registry name (`--algorithm NAME`).
      init: `init(theta0) -> state`, a NamedTuple of arrays for one example.
      update: `update(state, transition, **hyperparameters) -> state` for one
        example; each hyperparameter is passed by its `Hyperparameter.arg`. The
        engine resolves a step size's schedule at the counter before calling
        update, so from a sweep every hyperparameter arrives as a number (an
        array). An update called directly (an agent author's own loop) may
        still receive a float or an optax schedule and should call
        `resolve_step(step, state.count)`, as the built-in updates do (a no-op
        on a number).
      hyperparameters: what `update` takes, in grid order (the first varies
        slowest in a cartesian grid).
      equations: the equations implemented, by printed number and LaTeX label,
        e.g. "eqs. (30)-(31) [omegawithrho, thetawithrho] of the paper".
      weights: the state field holding the value weights theta (metrics read it;
        `analysis.slow_ode_matrix` treats it as the slow variable).
      counter: the state field counting updates, or None (then a sweep refuses
        the robbins_monro schedule). A step size's schedule is evaluated at its
        value in the state the update receives, the count before this update
        increments it. Every run of a sweep updates once per step, so the
        engine keeps one copy of it for all runs of a sweep.
      label: the display name in figures and tables (default: name upper-cased).
      traces: {field: expectation} for state fields that are traces (followon or
        eligibility traces): `expectation(stats: ModelStats, hyperparameters)`
        gives, per state s, the field's stationary expectation when a transition
        from s is processed ((S, *field shape)). `analysis.expected_update`
        replaces the trace by it (the update is affine in the other fields given
        the trace, and the trace depends on the past only), so trace methods get
        their exact ODE matrix; traces are left out of the ODE state and of the
        divergence check.
      shares_scalars: the algorithm's opt-in to an optimisation of the sweep
        engine (default False: none). Declare True when `update` computes its
        per-example scalars, the TD error and dot products, through
        `td_error`, `vdot` or `shared` (every built-in does). Where the
        program's form shares scalars (`engine.tuning.KernelForm.share`: on a
        CPU with XLA's fusion emitters) the engine then traces the update
        inside `sharing(token)`, so each such scalar is computed once a step
        into an array its consumers read, instead of being recomputed in each
        of them; the results are the same bit for bit. Undeclared, the update
        is traced as written, and those helpers are plain computations.
      case_of: None, or (host, fixed) where this algorithm is a special case of
        the one registered as `host` (a name): its update is host's, bit for
        bit on the fields they share, with the hyperparameters `fixed`
        ({name: value}) held at those values, its own passed by name, and
        host's other state fields left at their init values. A control program
        may then run its sweeps in one member with host's sweeps or host's other
        cases (`control.program.fusion`): one compiled update for all their runs.
        Every declared case is checked against its host, step by step, in
        tests/test_control_fusion.py.
    """

    name: str
    init: Callable
    update: Callable
    hyperparameters: tuple = ()
    equations: str = ""
    weights: str = "theta"
    counter: str | None = "count"
    label: str | None = None
    traces: dict = dataclasses.field(default_factory=dict)
    shares_scalars: bool = False
    case_of: tuple | None = None

    def __hash__(self):
        case = None if self.case_of is None else (self.case_of[0], tuple(sorted(self.case_of[1].items())))
        return hash((self.name, self.init, self.update, self.hyperparameters, self.weights, self.counter,
                     tuple(sorted(self.traces.items(), key=lambda kv: kv[0])), self.shares_scalars, case))

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or any(c.isspace() for c in self.name):
            raise ValueError(f"algorithm name: expected a non-empty name without spaces, got {self.name!r}")
        if not callable(self.init) or not callable(self.update):
            raise ValueError(f"{self.name}: init and update must be callables")
        hps = tuple(self.hyperparameters)
        for h in hps:
            if not isinstance(h, Hyperparameter):
                raise ValueError(f"{self.name}: hyperparameters must be Hyperparameter instances, got {h!r}")
        names = [h.name for h in hps]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: hyperparameter names must be unique, got {names}")
        object.__setattr__(self, "hyperparameters", hps)
        if not isinstance(self.traces, dict) or not all(callable(v) for v in self.traces.values()):
            raise ValueError(f"{self.name}: traces must map state fields to expectation functions")
        if self.label is None:
            object.__setattr__(self, "label", self.name.upper())
        if self.case_of is not None:
            ok = (isinstance(self.case_of, tuple) and len(self.case_of) == 2 and isinstance(self.case_of[0], str)
                  and isinstance(self.case_of[1], dict)
                  and all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in self.case_of[1].items()))
            if not ok or self.case_of[0] == self.name:
                raise ValueError(f"{self.name}: case_of must be (another algorithm's name, {{hyperparameter: "
                                 f"number}}), got {self.case_of!r}")

    @property
    def names(self) -> tuple:
        """The hyperparameter names, in grid order."""
        return tuple(h.name for h in self.hyperparameters)

    @property
    def step_sizes(self) -> tuple:
        """The names of the step-size hyperparameters."""
        return tuple(h.name for h in self.hyperparameters if h.step_size)

    def hyperparameter(self, name: str) -> Hyperparameter:
        """The declared hyperparameter `name`; `ValueError` naming it otherwise."""
        for h in self.hyperparameters:
            if h.name == name:
                return h
        raise ValueError(f"{name}: {self.name} does not take {name} "
                         f"(it takes {', '.join(self.names) or 'no hyperparameters'})")

    def resolve_hyperparameters(self, given: dict | None, step_size=None,
                                analysis: str | None = None) -> tuple[dict, dict]:
        """(traced, static): a value for every declared hyperparameter, the given
        ones checked (`ValueError` naming an undeclared one), the others their
        defaults. A step size not given is `step_size` (the exact analysis takes
        1: the ODE's time scale), or, with `analysis` naming what needs it, a
        `ValueError` saying so."""
        given = dict(given or {})
        for n in given:
            self.hyperparameter(n)
        traced, static = {}, {}
        for h in self.hyperparameters:
            if h.name in given:
                v = h.check(given[h.name], f"hyperparameters.{h.name}")
            elif h.step_size and analysis is not None:
                raise ValueError(f"hyperparameters.{h.name}: {analysis} needs the step size {h.name} of "
                                 f"{self.name} (a number in {h.range_text})")
            elif h.step_size and step_size is not None:
                v = step_size
            elif h.default is not None:
                v = h.default
            else:
                raise ValueError(f"hyperparameters.{h.name}: {self.name} needs a value for {h.name} "
                                 f"(in {h.range_text}); it has no default")
            (static if h.static else traced)[h.name] = v
        return traced, static

    def defaults(self) -> dict:
        """{name: default} of the hyperparameters that have one."""
        return {h.name: h.default for h in self.hyperparameters if h.default is not None}

    def apply(self, state, transition, hyperparameters: dict):
        """`update(state, transition, **kwargs)` with each hyperparameter passed by
        its keyword (`lambda` as `lambda_`)."""
        kw = {h.arg: hyperparameters[h.name] for h in self.hyperparameters if h.name in hyperparameters}
        return self.update(state, transition, **kw)
