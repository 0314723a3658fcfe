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


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_step(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: step sizes must be numbers, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name}: step sizes must be finite and > 0, got {value!r}")
    return v


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
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule: unknown schedule {self.kind!r}; known: {', '.join(SCHEDULES)}")
        t0 = float(self.t0) if isinstance(self.t0, (int, float)) else float("nan")
        if not (math.isfinite(t0) and t0 > 0):
            raise ValueError(f"schedule.t0: must be a finite number > 0, got {self.t0!r}")
        for name in ("p_alpha", "p_beta", "p_zeta"):
            p = getattr(self, name)
            if not isinstance(p, (int, float)) or not (0 < float(p) <= 1):
                raise ValueError(f"schedule.{name}: must be a number in (0, 1], got {p!r}")


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
        for name in ("alpha", "beta", "zeta", "metrics"):
            v = getattr(self, name)
            if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
                v = (v,)
            object.__setattr__(self, name, tuple(v))
        if self.points is not None:
            object.__setattr__(self, "points", tuple(tuple(p) for p in self.points))
        if isinstance(self.schedule, dict):
            object.__setattr__(self, "schedule", ScheduleSpec(**self.schedule))
        self.validate()

    # -- validation ------------------------------------------------------------
    def validate(self) -> None:
        """Raises `ValueError` naming the first bad field, its value and what is allowed."""
        if self.env not in envs.REGISTRY:
            raise ValueError(f"env: unknown environment {self.env!r}; known: {', '.join(envs.names())}")
        if self.algorithm not in algorithms.REGISTRY:
            raise ValueError(f"algorithm: unknown algorithm {self.algorithm!r}; "
                             f"known: {', '.join(algorithms.names())}")
        if self.sampler not in sampling.KINDS:
            raise ValueError(f"sampler: unknown sampler {self.sampler!r}; known: {', '.join(sampling.KINDS)}")
        if not self.metrics:
            raise ValueError(f"metrics: give at least one of {', '.join(METRICS)}")
        for m in self.metrics:
            if m not in METRICS:
                raise ValueError(f"metrics: unknown metric {m!r}; known: {', '.join(METRICS)}")
        if len(set(self.metrics)) != len(self.metrics):
            raise ValueError(f"metrics: each metric at most once, got {list(self.metrics)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: unknown dtype {self.dtype!r}; known: {', '.join(DTYPES)}")
        for name in ("seeds", "steps", "log_every"):
            v = getattr(self, name)
            if not _is_int(v) or v <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
        if self.log_every > self.steps:
            raise ValueError(f"log_every: must be at most steps = {self.steps}, got {self.log_every}")
        if self.steps % self.log_every:
            raise ValueError(f"log_every: must divide steps = {self.steps}, got {self.log_every}")
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed: must be a non-negative integer, got {self.seed!r}")
        b = self.divergence_bound
        if not isinstance(b, (int, float)) or not (math.isfinite(b) and b > 0):
            raise ValueError(f"divergence_bound: must be a finite number > 0, got {b!r}")
        if not isinstance(self.schedule, ScheduleSpec):
            raise ValueError(f"schedule: expected a ScheduleSpec, got {self.schedule!r}")
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
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown field; known: {', '.join(sorted(known))}")
        d = dict(d)
        sched = d.get("schedule")
        if isinstance(sched, dict):
            sk = {f.name for f in dataclasses.fields(ScheduleSpec)}
            bad = sorted(set(sched) - sk)
            if bad:
                raise ValueError(f"schedule.{bad[0]}: unknown field; known: {', '.join(sorted(sk))}")
            d["schedule"] = ScheduleSpec(**sched)
        elif isinstance(sched, str):
            d["schedule"] = ScheduleSpec(kind=sched)
        return cls(**d)
