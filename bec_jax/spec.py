"""The sweep specification: what to run, validated before any work starts.

A `SweepSpec` is a frozen dataclass registered as a pytree: the step-size lists
are leaves (what a sweep varies), everything else is static metadata.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from bec_jax import algorithms, envs, sampling
from bec_jax.analysis import METRICS
from bec_jax.schedules import SCHEDULES

STEP_NAMES = ("alpha", "beta", "zeta")
DTYPES = ("float32", "float64")


def _static(default=dataclasses.MISSING, **kw):
    return field(default=default, metadata=dict(static=True), **kw)


# Step counters and diverged steps are int32 inside the program; seeds key a
# 32-bit PRNG (in JAX's default 32-bit mode key(2**32) equals key(0)).
MAX_INT32 = 2**31 - 1
SEED_LIMIT = 2**32
# Largest divergence bound per dtype: a run within it has metrics (sums of squares
# of affine maps of theta) far from overflow.
MAX_BOUND = {"float32": 1e15, "float64": 1e150}


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_real(x) -> bool:
    """A real number: int or float (numpy's too), never bool or a string."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _check_step(name: str, value: Any) -> float:
    if not _is_real(value):
        raise ValueError(f"{name}: step sizes must be numbers, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name}: step sizes must be finite and > 0, got {value!r}")
    return v


def _key(k: Any) -> str:
    """A dict key as an error message names it: plain if it looks like a field name."""
    return k if isinstance(k, str) and k.isidentifier() else repr(k)


def _as_tuple(name: str, value: Any) -> tuple:
    """A list field as a tuple (a lone value becomes a 1-tuple); ValueError if it cannot be one."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        return (value,)
    try:
        return tuple(value)
    except Exception:  # e.g. a 0-d numpy array, an object whose iteration fails
        raise ValueError(f"{name}: expected a list, got {value!r}") from None


@dataclass(frozen=True)
class ScheduleSpec:
    """How step sizes evolve: "constant", or "robbins_monro" with value
    x_t = x * (t0 / (t + t0))^p_x for each step size x (see `schedules.robbins_monro`)."""

    kind: str = "constant"
    t0: float = 100.0
    p_alpha: float = 1.0
    p_beta: float = 0.6
    p_zeta: float = 0.8

    def __post_init__(self):
        if not isinstance(self.kind, str) or self.kind not in SCHEDULES:
            raise ValueError(f"schedule: unknown schedule {self.kind!r}; known: {', '.join(SCHEDULES)}")
        t0 = float(self.t0) if _is_real(self.t0) else float("nan")
        if not (math.isfinite(t0) and t0 > 0):
            raise ValueError(f"schedule.t0: must be a finite number > 0, got {self.t0!r}")
        for name in ("p_alpha", "p_beta", "p_zeta"):
            p = getattr(self, name)
            if not _is_real(p) or not (0 < float(p) <= 1):
                raise ValueError(f"schedule.{name}: must be a number in (0, 1], got {p!r}")
        for name in ("t0", "p_alpha", "p_beta", "p_zeta"):  # numpy scalars would not serialise
            object.__setattr__(self, name, float(getattr(self, name)))

    @classmethod
    def from_dict(cls, d: dict) -> "ScheduleSpec":
        """Builds a schedule from a dict; unknown keys raise `ValueError` naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        bad = sorted((k for k in d if k not in known), key=str)
        if bad:
            raise ValueError(f"schedule.{_key(bad[0])}: unknown field; known: {', '.join(sorted(known))}")
        return cls(**d)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SweepSpec:
    """A step-size sweep: one environment, one algorithm, a grid of step sizes.

    The grid is the cartesian product of `alpha`, `beta` and `zeta` (give only
    the step sizes the algorithm uses), or an explicit list `points` of
    (alpha, beta, zeta) triples (None where unused). Every grid point runs the
    same `seeds` seeds (common random numbers) for `steps` steps, and the
    metrics are logged every `log_every` steps (and at step 0).
    """

    alpha: tuple = ()
    beta: tuple = ()
    zeta: tuple = ()
    env: str = _static("boyan_chain")
    algorithm: str = _static("ctd")
    points: tuple | None = _static(None)
    schedule: ScheduleSpec = _static(ScheduleSpec())
    seeds: int = _static(50)
    steps: int = _static(1000)
    log_every: int = _static(10)
    sampler: str = _static("markov")
    metrics: tuple = _static(("rmscbe",))
    dtype: str = _static("float32")
    seed: int = _static(0)
    divergence_bound: float = _static(1e6)

    def __post_init__(self):
        # Normalise lists to tuples so specs hash, compare and serialise alike.
        # Any bad value, of any type, is a ValueError naming the field.
        for name in ("alpha", "beta", "zeta", "metrics"):
            object.__setattr__(self, name, _as_tuple(name, getattr(self, name)))
        if self.points is not None:
            pts = _as_tuple("points", self.points)
            object.__setattr__(self, "points", tuple(_as_tuple(f"points[{i}]", p) for i, p in enumerate(pts)))
        if isinstance(self.schedule, dict):
            object.__setattr__(self, "schedule", ScheduleSpec.from_dict(self.schedule))
        self.validate()
        # Valid numbers become Python ints and floats (numpy scalars would not serialise).
        for name in STEP_NAMES:
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        for name in ("seeds", "steps", "log_every", "seed"):
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "divergence_bound", float(self.divergence_bound))
        if self.points is not None:
            object.__setattr__(self, "points", tuple(tuple(None if v is None else float(v) for v in p)
                                                     for p in self.points))

    # -- validation ------------------------------------------------------------
    def validate(self) -> None:
        """Raises `ValueError` naming the first bad field, its value and what is allowed."""
        if not isinstance(self.env, str) or self.env not in envs.REGISTRY:
            raise ValueError(f"env: unknown environment {self.env!r}; known: {', '.join(envs.names())}")
        if not isinstance(self.algorithm, str) or self.algorithm not in algorithms.REGISTRY:
            raise ValueError(f"algorithm: unknown algorithm {self.algorithm!r}; "
                             f"known: {', '.join(algorithms.names())}")
        if not isinstance(self.sampler, str) or self.sampler not in sampling.KINDS:
            raise ValueError(f"sampler: unknown sampler {self.sampler!r}; known: {', '.join(sampling.KINDS)}")
        if not self.metrics:
            raise ValueError(f"metrics: give at least one of {', '.join(METRICS)}")
        for m in self.metrics:
            if not isinstance(m, str) or m not in METRICS:
                raise ValueError(f"metrics: unknown metric {m!r}; known: {', '.join(METRICS)}")
        if len(set(self.metrics)) != len(self.metrics):
            raise ValueError(f"metrics: each metric at most once, got {list(self.metrics)}")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise ValueError(f"dtype: unknown dtype {self.dtype!r}; known: {', '.join(DTYPES)}")
        for name in ("seeds", "steps", "log_every"):
            v = getattr(self, name)
            if not _is_int(v) or v <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
            if v > MAX_INT32:
                raise ValueError(f"{name}: must be at most 2**31 - 1 = {MAX_INT32}, got {v!r}")
        if self.log_every > self.steps:
            raise ValueError(f"log_every: must be at most steps = {self.steps}, got {self.log_every}")
        if self.steps % self.log_every:
            raise ValueError(f"log_every: must divide steps = {self.steps}, got {self.log_every}")
        if not _is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed: must be an integer in [0, 2**32), got {self.seed!r}")
        b = self.divergence_bound
        if not _is_real(b) or not (math.isfinite(b) and b > 0):
            raise ValueError(f"divergence_bound: must be a finite number > 0, got {b!r}")
        if b > MAX_BOUND[self.dtype]:
            raise ValueError(f"divergence_bound: must be at most {MAX_BOUND[self.dtype]:g} in {self.dtype} "
                             f"(so the metrics of a surviving run cannot overflow), got {b!r}")
        if not isinstance(self.schedule, ScheduleSpec):
            raise ValueError(f"schedule: expected a ScheduleSpec (in a config file: a name such as "
                             f"\"robbins_monro\" or a table of kind, t0, p_alpha, p_beta, p_zeta), "
                             f"got {self.schedule!r}")
        self._check_grid()

    def _check_grid(self) -> None:
        used = algorithms.get(self.algorithm).step_sizes
        if self.points is not None:
            if any(getattr(self, n) for n in STEP_NAMES):
                raise ValueError("points: give either explicit points or alpha/beta/zeta lists, not both")
            if not self.points:
                raise ValueError("points: the grid is empty; give at least one point")
            for i, p in enumerate(self.points):
                if len(p) != 3:
                    raise ValueError(f"points[{i}]: expected (alpha, beta, zeta) with None for unused, got {p!r}")
                for n, v in zip(STEP_NAMES, p):
                    if n in used:
                        if v is None:
                            raise ValueError(f"points[{i}].{n}: {self.algorithm} uses {n}; give a value")
                        _check_step(f"points[{i}].{n}", v)
                    elif v is not None:
                        raise ValueError(f"points[{i}].{n}: {self.algorithm} does not use {n} "
                                         f"(it uses {', '.join(used)}); use None")
            return
        for n in STEP_NAMES:
            values = getattr(self, n)
            if n in used and not values:
                raise ValueError(f"{n}: {self.algorithm} uses {n}; give at least one value (the grid is empty)")
            if n not in used and values:
                raise ValueError(f"{n}: {self.algorithm} does not use {n} (it uses {', '.join(used)}); remove it")
            for v in values:
                _check_step(n, v)

    # -- the grid --------------------------------------------------------------
    @property
    def step_size_names(self) -> tuple:
        """The step sizes the algorithm uses, in alpha, beta, zeta order."""
        return algorithms.get(self.algorithm).step_sizes

    def grid_points(self) -> list[tuple]:
        """The grid as (alpha, beta, zeta) triples, None where unused, in a fixed
        order (alpha slowest, zeta fastest for products)."""
        if self.points is not None:
            return [tuple(None if v is None else float(v) for v in p) for p in self.points]
        lists = [[float(v) for v in getattr(self, n)] or [None] for n in STEP_NAMES]
        return list(itertools.product(*lists))

    def grid_arrays(self) -> dict[str, np.ndarray]:
        """The grid as float64 arrays of shape (G,) per step size, NaN where unused."""
        pts = self.grid_points()
        return {n: np.array([np.nan if p[i] is None else p[i] for p in pts]) for i, n in enumerate(STEP_NAMES)}

    @property
    def num_points(self) -> int:
        return len(self.grid_points())

    @property
    def num_logs(self) -> int:
        """Number of logged points, including step 0."""
        return self.steps // self.log_every + 1

    # -- (de)serialisation -----------------------------------------------------
    def to_dict(self) -> dict:
        """A JSON-ready dict (round-trips through `from_dict`)."""
        d = dataclasses.asdict(self)
        d["points"] = None if self.points is None else [list(p) for p in self.points]
        for n in ("alpha", "beta", "zeta", "metrics"):
            d[n] = list(d[n])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SweepSpec":
        """Builds a spec from a dict; unknown keys raise `ValueError` naming them."""
        if not isinstance(d, dict):
            raise ValueError(f"spec: expected a table of fields, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted((k for k in d if k not in known), key=str)
        if unknown:
            raise ValueError(f"{_key(unknown[0])}: unknown field; known: {', '.join(sorted(known))}")
        d = dict(d)
        sched = d.get("schedule")
        if isinstance(sched, dict):
            d["schedule"] = ScheduleSpec.from_dict(sched)
        elif isinstance(sched, str):
            d["schedule"] = ScheduleSpec(kind=sched)
        return cls(**d)
