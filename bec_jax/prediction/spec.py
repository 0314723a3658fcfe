"""The sweep specification: what to run, validated before any work starts.

A sweep is one environment source and one algorithm, and a grid whose axes are
any hyperparameter the algorithm declares (step sizes, lambda, a user's own) and
any parameter of the environment (gamma, the 2-state chain's a, ...): the
cartesian product of the value lists, or an explicit list of points. Every rule
lives here, so the command line, TOML files and Python callers get the same
checks and the same one-line `ValueError` naming the field.
"""
from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping

import numpy as np

from bec_jax import algorithms, envs
from bec_jax import mdp as mdp_lib
from bec_jax.algorithms.base import Algorithm
from bec_jax.prediction import sampling
from bec_jax.prediction.fields import MAX_INT32, SEED_LIMIT, as_tuple, canonical_name, field_key, is_int, is_real, plain
from bec_jax.schedules import DEFAULT_EXPONENTS, SCHEDULES
from bec_jax.theory import metrics as metrics_lib

DTYPES = ("float32", "float64")

# Largest divergence bound per dtype: a run within it has metrics (sums of squares
# of affine maps of theta) far from overflow.
MAX_BOUND = {"float32": 1e15, "float64": 1e150}


class ScheduleSpec:
    """How step sizes evolve: "constant", or "robbins_monro" with value
    x_t = x * (t0 / (t + t0))^p_x for each step size x (`schedules.robbins_monro`).

    Exponents are given as `p_<step size>` (p_alpha, p_beta, p_zeta, or the name
    of a user algorithm's step size); a step size without one uses
    `schedules.DEFAULT_EXPONENTS` (alpha 1.0, zeta 0.8, beta 0.6, others 1.0).
    """

    __slots__ = ("kind", "t0", "exponents")

    def __init__(self, kind: str = "constant", t0: float = 100.0, exponents: dict | None = None, **p):
        ex = dict(exponents or {})
        for k, v in p.items():
            if not k.startswith("p_"):
                raise ValueError(f"schedule.{k}: unknown field; known: kind, t0, p_<step size>")
            ex[k[2:]] = v
        if not isinstance(kind, str) or kind not in SCHEDULES:
            raise ValueError(f"schedule: unknown schedule {kind!r}; known: {', '.join(SCHEDULES)}")
        t = float(t0) if is_real(t0) else float("nan")
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"schedule.t0: must be a finite number > 0, got {t0!r}")
        for name, v in ex.items():
            if not is_real(v) or not (0 < float(v) <= 1):
                raise ValueError(f"schedule.p_{name}: must be a number in (0, 1], got {v!r}")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "t0", t)
        object.__setattr__(self, "exponents", tuple(sorted((k, float(v)) for k, v in ex.items())))

    def __setattr__(self, name, value):
        raise AttributeError("ScheduleSpec is immutable")

    def exponent(self, name: str) -> float:
        """The Robbins-Monro exponent of step size `name`."""
        return dict(self.exponents).get(name, DEFAULT_EXPONENTS.get(name, 1.0))

    def __getattr__(self, name):  # p_alpha and friends, as attributes
        if name.startswith("p_"):
            return self.exponent(name[2:])
        raise AttributeError(name)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "t0": self.t0, **{f"p_{k}": v for k, v in self.exponents}}

    @classmethod
    def from_dict(cls, d: dict) -> "ScheduleSpec":
        """Builds a schedule from a dict (kind, t0, p_<step size>); unknown keys
        raise `ValueError` naming them."""
        d = dict(d)
        bad = sorted((k for k in d if k not in ("kind", "t0") and not (isinstance(k, str) and k.startswith("p_"))),
                     key=str)
        if bad:
            raise ValueError(f"schedule.{field_key(bad[0])}: unknown field; known: kind, t0, p_<step size>")
        return cls(**d)

    def __reduce__(self):
        return (ScheduleSpec.from_dict, (self.to_dict(),))

    def __eq__(self, other):
        return isinstance(other, ScheduleSpec) and self.to_dict() == other.to_dict()

    def __hash__(self):
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    def __repr__(self):
        return f"ScheduleSpec({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"


# The spec's own fields (everything else in a table is a hyperparameter).
FIELDS = ("env", "algorithm", "hyperparameters", "env_params", "points", "schedule", "seeds", "steps",
          "log_every", "sampler", "metrics", "dtype", "seed", "seed_offset", "divergence_bound", "search")
SEARCH_FIELDS = ("method", "rate", "rungs", "min_steps")


class SweepSpec:
    """A sweep: one environment, one algorithm, a grid over hyperparameters and
    environment parameters. Immutable; validated on construction.

    Args:
      env: a registered name, an .npz/.toml MDP file or package.module:function
        (see `bec_jax.envs`).
      algorithm: a registered name or package.module:attribute (`bec_jax.algorithms`).
      hyperparameters: {name: values} for the algorithm's declared
        hyperparameters; they may also be given as keywords (`alpha=(...)`,
        `lambda_=(...)`). One without a default must be given; one with a
        default that is not given takes its default.
      env_params: {name: values} of the environment's parameters (e.g.
        {"gamma": (0.8, 0.9)}); a lone value is one value.
      points: instead of value lists, an explicit list of grid points, each a
        {name: value} dict of hyperparameters and environment parameters.
      schedule: a `ScheduleSpec` (or a dict, or "robbins_monro").
      seeds, steps, log_every: every grid point runs `seeds` seeds (common random
        numbers) for `steps` steps, and the metrics are logged every `log_every`
        steps and at step 0.
      sampler: "markov" or "iid"; metrics: names from `bec_jax.theory.metrics.metric_names()`;
      dtype: "float32" or "float64"; seed: the base seed;
      seed_offset: seed i of the sweep is stream `seed_offset + i` of the base
        seed (fresh seeds, disjoint from another sweep's, for confirmation runs);
      divergence_bound: a run whose parameters pass it is frozen and flagged.
      search: None (every point runs all its steps), or a successive-halving
        search of the grid (`engine.search`, ranked by the area under the
        first metric's curve so far): {"method": "halving", "rate": eta
        (default 3), "rungs": R (default: as many as the grid and the steps
        allow, at most 4), "min_steps": the first rung's least steps (default one log
        block)}; every point of the grid in one call. Not for a grid whose
        points need several programs (model shapes or static
        hyperparameters that differ). `to_dict` leaves it out when None.

    The grid order: environment parameters vary slowest, then the algorithm's
    hyperparameters in their declared order (the last fastest).
    """

    KIND = "prediction"  # which kind of run this is (`bec_jax.run.kinds`)

    def __init__(self, *, env: str = "boyan_chain", algorithm: str = "ctd", hyperparameters: dict | None = None,
                 env_params: dict | None = None, points=None, schedule=None, seeds: int = 50,
                 steps: int = 1000, log_every: int = 10, sampler: str = "markov", metrics=("rmscbe",),
                 dtype: str = "float32", seed: int = 0, seed_offset: int = 0, divergence_bound: float = 1e6,
                 search: dict | None = None, **grid):
        d = object.__setattr__
        d(self, "search", search)
        d(self, "env", env)
        d(self, "algorithm", algorithm)
        d(self, "seeds", seeds)
        d(self, "steps", steps)
        d(self, "log_every", log_every)
        d(self, "sampler", sampler)
        d(self, "dtype", dtype)
        d(self, "seed", seed)
        d(self, "seed_offset", seed_offset)
        d(self, "divergence_bound", divergence_bound)
        d(self, "metrics", as_tuple("metrics", metrics))
        if schedule is None:
            schedule = ScheduleSpec()
        elif isinstance(schedule, dict):
            schedule = ScheduleSpec.from_dict(schedule)
        elif isinstance(schedule, str):
            schedule = ScheduleSpec(kind=schedule)
        d(self, "schedule", schedule)
        hp = {}
        if hyperparameters is not None:
            if not isinstance(hyperparameters, dict):
                raise ValueError(f"hyperparameters: expected a table of name = [values], got {hyperparameters!r}")
            hp.update({canonical_name(k): v for k, v in hyperparameters.items()})
        for k, v in grid.items():
            name = canonical_name(k)
            if name in hp:
                raise ValueError(f"{name}: given twice (as a keyword and in hyperparameters)")
            hp[name] = v
        if env_params is not None and not isinstance(env_params, dict):
            raise ValueError(f"env_params: expected a table of name = [values], got {env_params!r}")
        d(self, "_raw", (hp, dict(env_params or {}), points))
        self._validate()

    def __setattr__(self, name, value):
        raise AttributeError("SweepSpec is immutable; use replace()")

    # -- validation ------------------------------------------------------------
    def _validate(self) -> None:  # noqa: C901  (a validator: one check a field)
        d = object.__setattr__
        alg = self._check_basic()
        hp_raw, ep_raw, points = self._raw
        for name in hp_raw:
            if not isinstance(name, str):
                raise ValueError(f"{field_key(name)}: unknown field")
            alg.hyperparameter(name)  # ValueError naming an undeclared one
        if not isinstance(self.env, str) or not self.env:
            raise ValueError(f"env: expected an environment name, an .npz/.toml MDP file or "
                             f"package.module:function, got {self.env!r}")
        known_env = envs.parameters(self.env)  # ValueError for an unknown source
        self._check_env_param_names(ep_raw.keys() if points is None else
                                    {canonical_name(k) for p in as_tuple("points", points)
                                     if isinstance(p, dict) for k in p
                                     if canonical_name(k) not in alg.names}, known_env, alg)
        if points is not None:
            if hp_raw or ep_raw:
                raise ValueError("points: give either explicit points or value lists "
                                 "(hyperparameters, env_params), not both")
            pts = self._check_points(as_tuple("points", points), alg, known_env)
            d(self, "points", pts)
            d(self, "hyperparameters", ())
            d(self, "env_params", ())
        else:
            d(self, "points", None)
            hps = []
            for h in alg.hyperparameters:
                if h.name in hp_raw:
                    vals = as_tuple(h.name, hp_raw[h.name])
                    if not vals:
                        raise ValueError(f"{h.name}: the list is empty; give at least one value")
                    vals = tuple(h.check(v, h.name) for v in vals)
                elif h.default is not None:
                    vals = (h.default,)
                else:
                    raise ValueError(f"{h.name}: {alg.name} needs {h.name} ({h.doc}); give at least one value")
                if len(set(vals)) != len(vals):
                    raise ValueError(f"{h.name}: each value at most once, got {list(vals)}")
                hps.append((h.name, vals))
            d(self, "hyperparameters", tuple(hps))
            eps = []
            for name, raw in ep_raw.items():
                vals = as_tuple(f"env_params.{name}", raw)
                if not vals:
                    raise ValueError(f"env_params.{name}: the list is empty; give at least one value")
                try:
                    vals = tuple(plain(v) for v in vals)
                except ValueError as e:
                    raise ValueError(f"env_params.{name}: {e}") from None
                if len(set(vals)) != len(vals):
                    raise ValueError(f"env_params.{name}: each value at most once, got {list(vals)}")
                eps.append((name, vals))
            d(self, "env_params", tuple(eps))
        self._check_schedule(alg)
        d(self, "_alg", alg)
        # Build every distinct model now: a bad parameter value fails before any work.
        models = {}
        for p in self._env_points():
            key = tuple(sorted(p.items()))
            if key not in models:
                models[key] = envs.build(self.env, **p)
        d(self, "_models", models)
        self._check_ranges(alg)
        if self.search is not None:
            self._check_search()

    def _check_search(self) -> None:
        """The search's fields, normalized in place (defaults filled in), and
        its schedule built once: a one-line `ValueError` naming the field
        where the grid or the steps do not allow it."""
        from bec_jax.engine import search

        s = self.search
        if not isinstance(s, Mapping):
            raise ValueError(f"search: a table of the search's settings, got {s!r}")
        unknown = sorted(set(s) - set(SEARCH_FIELDS), key=str)
        if unknown:
            raise ValueError(f"search.{field_key(unknown[0])}: not a setting of a search; known: {', '.join(SEARCH_FIELDS)}")
        if s.get("method", "halving") not in search.METHODS:
            raise ValueError(f"search: one of {', '.join(search.METHODS)}, got {s.get('method')!r}")
        min_steps = s.get("min_steps")
        if min_steps is not None and (not is_int(min_steps) or not 1 <= min_steps <= self.steps):
            raise ValueError(f"min_steps: an integer in [1, steps = {self.steps}], got {min_steps!r}")
        groups = len(set(self.group_keys()))
        if groups > 1:
            raise ValueError(f"search: the grid's points need {groups} programs (their models' sizes or static "
                             "hyperparameters differ) and a search ranks the points of one; search each as its own "
                             "sweep")
        norm = {"method": "halving", "rate": s.get("rate", search.DEFAULT_RATE), "rungs": s.get("rungs"),
                "min_steps": None if min_steps is None else int(min_steps)}
        object.__setattr__(self, "search", norm)
        self.search_schedule()

    def search_unit(self) -> int:
        """The log blocks a search advances at once: 1 (a rung may end at any log block)."""
        return 1

    def search_schedule(self):
        """The search's rungs (`engine.search.schedule`) over the run's
        steps / log_every log blocks (None without a search)."""
        from bec_jax.engine import search

        s = self.search
        if s is None:
            return None
        min_blocks = 1 if s["min_steps"] is None else -(-s["min_steps"] // self.log_every)
        return search.schedule(self.num_points, self.steps // self.log_every, self.search_unit(), s["rate"],
                               s["rungs"], min_blocks)

    def _check_ranges(self, alg: Algorithm) -> None:
        """Every number the run casts to `dtype` (hyperparameters, schedule.t0, the
        models' rewards, features, initial weights) within its range: beyond it, the
        run would start from inf and be reported as diverged."""
        named = [(n, v) for n, vals in self.hyperparameters for v in vals]
        named += [(f"points[{i}].{n}", v) for i, p in enumerate(self.points or ()) for n, v in p if n in alg.names]
        for name, v in named + [("schedule.t0", self.schedule.t0)]:
            if is_real(v):
                mdp_lib.check_value_range(name, v, self.dtype)
        for key, model in self._models.items():
            try:
                mdp_lib.check_range(model, self.dtype)
            except ValueError as e:
                where = f" with {', '.join(f'{k}={v!r}' for k, v in key)}" if key else ""
                raise ValueError(f"env: {self.env!r}{where}: {e}") from None

    def _check_basic(self) -> Algorithm:  # noqa: C901  (a validator: one check a field)
        if not isinstance(self.algorithm, (str, Algorithm)):
            raise ValueError(f"algorithm: expected a name or package.module:attribute, got {self.algorithm!r}")
        alg = algorithms.get(self.algorithm)
        if isinstance(self.algorithm, Algorithm):  # keep a name that a reload can resolve
            if alg.name not in algorithms.names() or algorithms.get(alg.name) is not alg:
                raise ValueError(f"algorithm: {alg.name!r} is not registered; register it "
                                 "(bec_jax.algorithms.register) or pass package.module:attribute")
            object.__setattr__(self, "algorithm", alg.name)
        if not isinstance(self.sampler, str) or self.sampler not in sampling.KINDS:
            raise ValueError(f"sampler: unknown sampler {self.sampler!r}; known: {', '.join(sampling.KINDS)}")
        known = metrics_lib.metric_names()  # the registry now: a user's registered metrics too
        if not self.metrics:
            raise ValueError(f"metrics: give at least one of {', '.join(known)}")
        for m in self.metrics:
            if not isinstance(m, str) or not m:
                raise ValueError(f"metrics: unknown metric {m!r}; known: {', '.join(known)}")
            metrics_lib.metric_def(m, "metrics")  # a registered name or package.module:attribute, imported now
        if len(set(self.metrics)) != len(self.metrics):
            raise ValueError(f"metrics: each metric at most once, got {list(self.metrics)}")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise ValueError(f"dtype: unknown dtype {self.dtype!r}; known: {', '.join(DTYPES)}")
        for name in ("seeds", "steps", "log_every"):
            v = getattr(self, name)
            if not is_int(v) or not 1 <= v <= MAX_INT32:
                raise ValueError(f"{name}: must be an integer in [1, 2**31 - 1], got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.log_every > self.steps:
            raise ValueError(f"log_every: must be at most steps = {self.steps}, got {self.log_every}")
        if self.steps % self.log_every:
            raise ValueError(f"log_every: must divide steps = {self.steps}, got {self.log_every}")
        if not is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed: must be an integer in [0, 2**32), got {self.seed!r}")
        object.__setattr__(self, "seed", int(self.seed))
        if not is_int(self.seed_offset) or self.seed_offset < 0 or self.seed_offset + self.seeds > MAX_INT32:
            raise ValueError(f"seed_offset: must be an integer >= 0 with seed_offset + seeds <= 2**31 - 1, "
                             f"got {self.seed_offset!r}")
        object.__setattr__(self, "seed_offset", int(self.seed_offset))
        b = self.divergence_bound
        if not is_real(b) or not (math.isfinite(b) and b > 0):
            raise ValueError(f"divergence_bound: must be a finite number > 0, got {b!r}")
        if b > MAX_BOUND[self.dtype]:
            raise ValueError(f"divergence_bound: must be at most {MAX_BOUND[self.dtype]:g} in {self.dtype} "
                             f"(so the metrics of a surviving run cannot overflow), got {b!r}")
        object.__setattr__(self, "divergence_bound", float(b))
        if not isinstance(self.schedule, ScheduleSpec):
            raise ValueError(f"schedule: expected a ScheduleSpec (in a config file: a name such as "
                             f"\"robbins_monro\" or a table of kind, t0, p_<step size>), got {self.schedule!r}")
        return alg

    def _check_env_param_names(self, names, known: dict, alg: Algorithm) -> None:
        for n in names:
            if not isinstance(n, str) or n not in known:
                where = f"points: {field_key(n)}" if self._raw[2] is not None else f"env_params.{field_key(n)}"
                extra = f"; {alg.name}'s hyperparameters: {', '.join(alg.names)}" if self._raw[2] is not None else ""
                raise ValueError(f"{where}: {self.env} has no parameter {field_key(n)} "
                                 f"(its parameters: {', '.join(known) or 'none'}){extra}")
            if n in alg.names:
                raise ValueError(f"env_params.{n}: is both a parameter of {self.env} and a hyperparameter "
                                 f"of {alg.name}; rename one")

    def _check_points(self, pts: tuple, alg: Algorithm, known_env: dict) -> tuple:
        if not pts:
            raise ValueError("points: the grid is empty; give at least one point")
        out = []
        for i, p in enumerate(pts):
            if not isinstance(p, dict):
                raise ValueError(f"points[{i}]: expected a table of name = value, got {p!r}")
            p = {canonical_name(k): v for k, v in p.items()}
            row = []
            for h in alg.hyperparameters:
                if h.name in p:
                    row.append((h.name, h.check(p[h.name], f"points[{i}].{h.name}")))
                elif h.default is not None:
                    row.append((h.name, h.default))
                else:
                    raise ValueError(f"points[{i}].{h.name}: {alg.name} needs {h.name}; give a value")
            for k, v in p.items():
                if k in alg.names:
                    continue
                try:
                    row.append((k, plain(v)))
                except ValueError as e:
                    raise ValueError(f"points[{i}].{k}: {e}") from None
            out.append(tuple(row))
        if len(set(out)) != len(out):
            j = next(j for j, r in enumerate(out) if out.index(r) != j)
            raise ValueError(f"points[{j}]: repeats points[{out.index(out[j])}]")
        return tuple(out)

    def _check_schedule(self, alg: Algorithm) -> None:
        s = self.schedule
        if s.kind == "robbins_monro" and alg.step_sizes and alg.counter is None:
            raise ValueError(f"schedule: robbins_monro is evaluated at the update counter, but {alg.name} "
                             "declares none (counter=None)")
        for name, _ in s.exponents:
            if s.kind != "robbins_monro":
                raise ValueError(f"schedule.p_{name}: used only by the robbins_monro schedule, not {s.kind!r}")
            if name not in alg.step_sizes:
                raise ValueError(f"schedule.p_{name}: {alg.name} has no step size {name} "
                                 f"(its step sizes: {', '.join(alg.step_sizes) or 'none'}); remove it")

    # -- the grid --------------------------------------------------------------
    @property
    def algorithm_def(self) -> Algorithm:
        """The `Algorithm` this spec runs."""
        return self._alg

    @property
    def hyperparameter_names(self) -> tuple:
        """The algorithm's hyperparameters, in grid order."""
        return self._alg.names

    @property
    def env_param_names(self) -> tuple:
        """The environment parameters that are grid columns (given by the spec)."""
        if self.points is None:
            return tuple(n for n, _ in self.env_params)
        seen = []
        for p in self.points:
            for k, _ in p:
                if k not in self._alg.names and k not in seen:
                    seen.append(k)
        return tuple(seen)

    @property
    def grid_names(self) -> tuple:
        """Every grid column: environment parameters, then hyperparameters."""
        return self.env_param_names + self.hyperparameter_names

    def grid_points(self) -> list[dict]:
        """The grid as {name: value} dicts (every hyperparameter of the algorithm,
        and the environment parameters the spec gives), in grid order."""
        if self.points is not None:
            return [dict(p) for p in self.points]
        lists = [vals for _, vals in self.env_params] + [vals for _, vals in self.hyperparameters]
        names = self.grid_names
        return [dict(zip(names, combo)) for combo in itertools.product(*lists)]

    def _env_points(self) -> list[dict]:
        names = set(self.env_param_names)
        return [{k: v for k, v in p.items() if k in names} for p in self.grid_points()]

    def mdp(self, env_params: dict | None = None):
        """The validated model of the grid points with these environment
        parameters (default: the first point's)."""
        if env_params is None:
            env_params = self._env_points()[0]
        key = tuple(sorted(env_params.items()))
        if key not in self._models:
            raise ValueError(f"env_params: {env_params} is not a point of this sweep")
        return self._models[key]

    def point_mdps(self) -> list:
        """The model of every grid point (shared objects where points share one)."""
        return [self._models[tuple(sorted(p.items()))] for p in self._env_points()]

    def group_keys(self) -> list[tuple]:
        """Each grid point's program key: its model's states and features and its
        static hyperparameters' values (points of one key share a program,
        `prediction.plan.plan_groups`)."""
        statics = [h.name for h in self.algorithm_def.hyperparameters if h.static]
        return [(m.num_states, m.num_features, tuple((n, p[n]) for n in statics))
                for p, m in zip(self.grid_points(), self.point_mdps())]

    def grid_arrays(self) -> dict[str, np.ndarray]:
        """The grid as one (G,) array per column (float64 for numbers; booleans and
        strings as they are)."""
        cache = self.__dict__.get("_columns")
        if cache is None:
            pts = self.grid_points()
            cache = {}
            for n in self.grid_names:
                vals = [p.get(n) for p in pts]
                if all(isinstance(v, bool) for v in vals):
                    cache[n] = np.array(vals, dtype=bool)
                    continue
                try:
                    cache[n] = np.array(vals, dtype=np.float64)
                except (TypeError, ValueError):
                    cache[n] = np.array([v if isinstance(v, str) else json.dumps(v) for v in vals])
            object.__setattr__(self, "_columns", cache)
        return {n: a.copy() for n, a in cache.items()}

    @property
    def num_points(self) -> int:
        if self.points is not None:
            return len(self.points)
        return int(np.prod([len(v) for _, v in self.env_params + self.hyperparameters], dtype=np.int64))

    @property
    def num_logs(self) -> int:
        """Number of logged points, including step 0."""
        return self.steps // self.log_every + 1

    # -- (de)serialisation -----------------------------------------------------
    def to_dict(self) -> dict:
        """A JSON-ready dict (round-trips through `from_dict`)."""
        return {
            "env": self.env, "algorithm": self.algorithm,
            "hyperparameters": {n: list(v) for n, v in self.hyperparameters} if self.points is None else {},
            "env_params": {n: [list(x) if isinstance(x, tuple) else x for x in v] for n, v in self.env_params},
            "points": None if self.points is None else [dict(p) for p in self.points],
            "schedule": self.schedule.to_dict(), "seeds": self.seeds, "steps": self.steps,
            "log_every": self.log_every, "sampler": self.sampler, "metrics": list(self.metrics),
            "dtype": self.dtype, "seed": self.seed, "seed_offset": self.seed_offset,
            "divergence_bound": self.divergence_bound,
            **({"search": dict(self.search)} if self.search is not None else {}),
        }

    def replace(self, **changes) -> "SweepSpec":
        """A copy with some fields changed (validated again)."""
        d = self.to_dict()
        if any(k in changes for k in ("points",)):
            d["hyperparameters"], d["env_params"] = {}, {}
        if "hyperparameters" in changes or any(canonical_name(k) in self._alg.names for k in changes):
            d["points"] = None
        d.update(changes)
        return SweepSpec.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict) -> "SweepSpec":
        """Builds a spec from a dict (a TOML table): the fields above, and each of
        the algorithm's hyperparameters as a top-level key (`alpha = [...]`).
        Unknown keys raise `ValueError` naming them."""
        if not isinstance(d, dict):
            raise ValueError(f"spec: expected a table of fields, got {type(d).__name__}")
        d = dict(d)
        for k in d:
            if not isinstance(k, str):
                raise ValueError(f"{field_key(k)}: unknown field; known: {', '.join(FIELDS)}")
        alg = algorithms.get(d.get("algorithm", "ctd"))
        extra = {canonical_name(k): d.pop(k) for k in list(d) if k not in FIELDS}
        for k in extra:
            if k not in alg.names:
                raise ValueError(f"{field_key(k)}: unknown field; {alg.name} takes {', '.join(alg.names) or 'no hyperparameters'}"
                                 f"; other fields: {', '.join(FIELDS)}")
        hp = d.pop("hyperparameters", None)
        if hp is not None and not isinstance(hp, Mapping):
            raise ValueError(f"hyperparameters: expected a table of name = value, got {type(hp).__name__}")
        hp = dict(hp or {})
        for k, v in extra.items():
            if k in hp:
                raise ValueError(f"{k}: given twice (at the top level and in hyperparameters)")
            hp[k] = v
        if d.get("points") is not None:
            d["points"] = [dict(p) if isinstance(p, dict) else p for p in as_tuple("points", d["points"])]
        ep = d.get("env_params")
        if ep is None or (isinstance(ep, (Mapping, list, tuple, str)) and not ep):  # nothing given (an array goes on)
            d.pop("env_params", None)
        return cls(hyperparameters=hp or None, **d)

    # -- identity ----------------------------------------------------------------
    def _identity(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def __reduce__(self):  # pickles as its dict; unpickling validates again
        return (SweepSpec.from_dict, (self.to_dict(),))

    def __eq__(self, other):
        return isinstance(other, SweepSpec) and self._identity() == other._identity()

    def __hash__(self):
        return hash(self._identity())

    def __repr__(self):
        return f"SweepSpec({self._identity()})"

    def __getattr__(self, name):
        # spec.alpha and friends: the value list of a hyperparameter or env parameter.
        if name.startswith("_"):
            raise AttributeError(name)
        for n, v in object.__getattribute__(self, "hyperparameters") + object.__getattribute__(self, "env_params"):
            if n == canonical_name(name):
                return v
        raise AttributeError(name)
