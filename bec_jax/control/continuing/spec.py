"""The continuing control sweep specification: one continuing task, one
learner, a grid of its hyperparameters and of the loop's settings (epsilon,
gamma, the reward offset, the initial action values), seeds and steps,
validated before any work starts.

Every rule lives here, so the command line, run files, studies and Python
callers get the same checks and the same one-line `ValueError` naming the field.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import math
from typing import ClassVar

from bec_jax.control.continuing import deep, learners, tasks
from bec_jax.control.continuing.env import observation
from bec_jax.control.grid import GridColumns, spec_table
from bec_jax.mdp import check_value_range
from bec_jax.prediction.fields import MAX_INT32, SEED_LIMIT, as_tuple, is_int, is_real

KIND = "continuing"
DTYPES = ("float32", "float64")
# The loop's settings, each a value or a grid axis (a list): after the
# learner's hyperparameters, always columns of the grid, in this order.
LOOP_AXES = ("epsilon", "gamma", "reward_offset", "q0")
# Log blocks of a run must be a multiple of this, so that its last 10% and
# last 50% (`ContinuingResult.reward_rate`) are whole blocks.
BLOCK_MULTIPLE = 10
DEFAULT_BLOCKS = 100  # log blocks of a run when log_every is not given (where steps allow)


def is_task_axis(task: str, name: str, value) -> bool:
    """Whether task parameter `name` = `value` is a grid axis: `value` is a list
    or tuple and the factory of `task` does not declare a list or tuple
    default for `name` (a sequence-valued parameter keeps a list as its value)."""
    if not isinstance(value, (list, tuple)):
        return False
    declared = inspect.signature(tasks.factory(task)).parameters.get(name)
    return declared is None or not isinstance(declared.default, (list, tuple))


def _check_loop_value(name: str, v) -> float:
    """One value of a loop axis, checked: epsilon and gamma in [0, 1], the
    offset and q0 finite."""
    if name in ("epsilon", "gamma"):
        if not is_real(v) or not 0.0 <= float(v) <= 1.0:
            what = "a probability" if name == "epsilon" else "a discount; 1 only for centered or average-reward learners"
            raise ValueError(f"{name}: must be a number in [0, 1] ({what}), got {v!r}")
    elif not is_real(v) or not math.isfinite(float(v)):
        raise ValueError(f"{name}: must be a finite number, got {v!r}")
    return float(v)


@dataclasses.dataclass(frozen=True)
class ContinuingSpec(GridColumns):
    """What a continuing control sweep runs.

    Attributes:
      task: a registered continuing task (`continuing.tasks.names()`) or a
        factory of the user's own as package.module:function. task_params:
        its parameters, {name: value or list of values}. A list of numbers is
        a grid axis (as episodic control's untraced `task_axes`,
        `bec_jax.control.spec`): one task, and one program, per combination
        of the axes' values, the axes being grid columns after the loop axes.
        The rule (`is_task_axis`): a list is one value, not an axis, where the
        factory's declared default of that parameter is a list or tuple
        (Access-Control's priorities, csuite's per-dimension bins); so only
        scalar-valued parameters can be axes, and a sequence-valued one
        cannot.
      algorithm: a continuing learner (`continuing.learners.names()`).
      hyperparameters: {name: value or list of values} of the learner; the
        grid is the cartesian product in the learner's declared order, then
        the loop axes (`LOOP_AXES`), the first column varying slowest. The
        loop's settings may be given here too.
      epsilon: epsilon-greedy exploration (ties broken uniformly at random);
        a value or a list (a grid axis).
      gamma: the learner's discount (a grid axis allowed); average-reward
        learners ignore it.
      reward_offset: a constant added to every reward the learner sees (the
        reported reward rate is the task's own); a grid axis allowed.
      q0: the initial action values (every weight q0 / m for m active
        features; 0 for a task with dense features); a grid axis allowed.
      seeds: runs per grid point. seed: the base seed; seed i's stream is
        fold_in(key(seed), seed_offset + i), whatever the number of seeds.
      steps: steps of every run. log_every: steps per log block; steps must be
        a multiple of it and steps / log_every a multiple of 10 (the last
        10% and 50% of a run are whole blocks). Default: steps / 100, or
        steps / 10 where 100 does not divide steps.
      dtype: "float32" or "float64" (the learner's arithmetic).
      learner_params: a network learner's static settings (`continuing.deep.
        SETTINGS`: hidden or layers, activation, buffer, batch, update_period,
        sync_period, optimizer), each program's shape; resolved against the
        task on construction (`continuing.deep.resolve_settings`: the defaults
        filled in), so the spec records every setting. Linear learners take none.
      search: None (every point runs all its steps), or a successive-halving
        search of the grid (`engine.search`): {"method": "halving", "rate":
        eta (default 3), "rungs": R (default: as many as the grid and the
        steps allow, at most 4), "min_steps": the first rung's least steps (default one
        log block)}; every point of the grid in one call. Not with task axes.
    """

    KIND: ClassVar[str] = KIND  # which kind of run this is (`bec_jax.run.kinds`)
    task: str
    algorithm: str
    hyperparameters: dict = dataclasses.field(default_factory=dict)
    task_params: dict = dataclasses.field(default_factory=dict)
    epsilon: float | tuple = 0.1
    gamma: float | tuple = 0.99
    reward_offset: float | tuple = 0.0
    q0: float | tuple = 0.0
    seeds: int = 10
    steps: int = 10_000
    log_every: int | None = None
    seed: int = 0
    seed_offset: int = 0
    dtype: str = "float32"
    learner_params: dict = dataclasses.field(default_factory=dict)
    search: dict | None = None

    def __post_init__(self):  # noqa: C901  (a validator: one check a field)
        if not isinstance(self.task, str):
            raise ValueError(f"task: unknown task {self.task!r}; known: {', '.join(tasks.names())}")
        tasks.factory(self.task)  # a registered name or package.module:function (ValueError naming task)
        if not isinstance(self.task_params, dict):
            raise ValueError(f"task_params: expected a table of parameters, got {self.task_params!r}")
        object.__setattr__(self, "hyperparameters", self._grid_axes())
        axes = self._task_axes()
        self.hyperparameters.update(axes)
        object.__setattr__(self, "_axes", tuple(axes))
        for name, lo in (("seeds", 1), ("steps", 1), ("seed_offset", 0)):
            v = getattr(self, name)
            if not is_int(v) or not lo <= v <= MAX_INT32:
                raise ValueError(f"{name}: must be an integer in [{lo}, 2**31 - 1], got {v!r}")
        if not is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed: must be an integer in [0, 2**32), got {self.seed!r}")
        if self.seed_offset + self.seeds > MAX_INT32:
            raise ValueError(f"seed_offset: seed_offset + seeds must stay below 2**31, got {self.seed_offset}")
        self._check_blocks()
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name, values in self.hyperparameters.items():  # beyond the dtype's range: inf in the program
            for v in values:
                if is_real(v):
                    check_value_range(name, v, self.dtype)
        try:
            built = [self.make_task(params) for params in self.task_combinations()]
        except ImportError as e:  # an optional extra the task needs: one line, not a traceback
            raise ValueError(f"task: {e}") from None
        shapes = {(t.num_actions, t.num_features, t.num_active, t.num_states, t.observation_size) for t in built}
        if len(shapes) > 1:  # one program's arrays, and the results' Q tables, share one shape
            axes = ", ".join(f"task_params.{n}" for n in self.task_axes)
            raise ValueError(f"{axes}: every value must give a task of the same size (actions, features, "
                             "states, observations); run the sizes as separate sweeps")
        if self.search is not None:
            self._check_search()
        if deep.is_deep(self.algorithm_def):
            self._check_network(built[0])
        elif self.learner_params:
            raise ValueError(f"learner_params: {self.algorithm} is a linear learner and takes none; the network "
                             f"learners ({', '.join(d.name for d in deep.LEARNERS)}) do")
        elif any(t.num_active == 0 for t in built) and any(v != 0 for v in self.hyperparameters["q0"]):
            raise ValueError(f"q0: {self.task} has dense features, whose weights start at 0; give q0 = 0")

    def _check_search(self) -> None:
        """The search's fields, normalized in place (defaults filled in), and its
        schedule built once: a one-line `ValueError` naming the field where the
        grid or the steps do not allow it."""
        from bec_jax.engine import search

        s = self.search
        if not isinstance(s, dict):
            raise ValueError(f"search: a table of the search's settings, got {s!r}")
        unknown = set(s) - {"method", "rate", "rungs", "min_steps"}
        if unknown:
            raise ValueError(f"search.{sorted(unknown)[0]}: not a setting of a search; known: method, rate, rungs, "
                             "min_steps")
        if s.get("method", "halving") not in search.METHODS:
            raise ValueError(f"search: one of {', '.join(search.METHODS)}, got {s.get('method')!r}")
        if self.task_axes:
            raise ValueError(f"search: not with task axes ({', '.join(self.task_axes)}): each value is its own "
                             "program; search each value's grid as its own sweep")
        min_steps = s.get("min_steps")
        if min_steps is not None and (not is_int(min_steps) or not 1 <= min_steps <= self.steps):
            raise ValueError(f"min_steps: an integer in [1, steps = {self.steps}], got {min_steps!r}")
        norm = {"method": "halving", "rate": s.get("rate", search.DEFAULT_RATE), "rungs": s.get("rungs"),
                "min_steps": min_steps}
        object.__setattr__(self, "search", norm)
        self.search_schedule()

    def search_unit(self) -> int:
        """The log blocks a search advances at once: 1, or for a network
        learner the blocks of lcm(block steps, update period) steps (whole
        update periods)."""
        if not deep.is_deep(self.algorithm_def):
            return 1
        K = self.block_steps
        P = deep.resolve_settings(self.make_task(), self.learner_params, observation(self.make_task())[0],
                                  self.algorithm_def.unbiased).update_period
        return math.lcm(K, P) // K

    def search_schedule(self):
        """The search's rungs (`engine.search.schedule`), their ends whole
        `search_unit`s."""
        from bec_jax.engine import search

        s = self.search
        unit = self.search_unit()
        if self.num_blocks % unit:
            raise ValueError(f"log_every: a search of a network learner needs steps / log_every ({self.num_blocks}) "
                             f"to be a multiple of {unit} (its blocks in whole update periods)")
        min_blocks = 1 if s["min_steps"] is None else -(-s["min_steps"] // self.block_steps)
        return search.schedule(self.num_points, self.num_blocks, unit, s["rate"], s["rungs"], min_blocks)

    def _check_network(self, task) -> None:
        """A network learner's settings against the task and the run's steps
        (`learner_params` resolved in place: every setting recorded)."""
        if not isinstance(self.learner_params, dict):
            raise ValueError(f"learner_params: expected a table of settings, got {self.learner_params!r}")
        obs = observation(task)
        if obs is None:
            raise ValueError(f"task: {self.task} gives no observation (observe) for a network learner; "
                             "use a linear learner, or give the task an observe function")
        st = deep.resolve_settings(task, self.learner_params, obs[0], self.algorithm_def.unbiased)
        object.__setattr__(self, "learner_params", st.as_params())
        P = st.update_period
        if self.steps % P:
            raise ValueError(f"steps: a multiple of learner_params.update_period ({P}): a run is whole update "
                             f"periods; got {self.steps}")
        if self.block_steps < P:
            raise ValueError(f"log_every: at least learner_params.update_period ({P}) steps, so every log block "
                             f"holds an update; got {self.block_steps}")
        if any(v != 0 for v in self.hyperparameters["q0"]):
            raise ValueError(f"q0: a network's initial values are its initialisation's; {self.algorithm} "
                             "takes q0 = 0 only")

    @functools.cached_property
    def settings(self) -> deep.Settings:
        """A network learner's resolved `continuing.deep.Settings` (ValueError for a linear learner)."""
        task = self.make_task()
        obs = observation(task)
        if not deep.is_deep(self.algorithm_def) or obs is None:
            raise ValueError(f"learner_params: {self.algorithm} is not a network learner")
        return deep.resolve_settings(task, self.learner_params, obs[0], self.algorithm_def.unbiased)

    def _task_axes(self) -> dict:
        """{name: values} of the task parameters that are grid axes (`is_task_axis`), checked."""
        out = {}
        for name, values in self.task_params.items():
            if not is_task_axis(self.task, name, values):
                continue
            field = f"task_params.{name}"
            if name in self.hyperparameters:
                raise ValueError(f"{field}: {name!r} is already a grid column (the learner's or the loop's)")
            if not values:
                raise ValueError(f"{field}: expected at least one value")
            for v in values:
                if isinstance(v, bool) or not is_real(v):
                    raise ValueError(f"{field}: a grid axis takes numbers, got {v!r}")
            out[name] = tuple(values)
        return out

    @property
    def task_axes(self) -> tuple:
        """The task parameters that are grid axes (the last grid columns)."""
        return self._axes

    def task_combinations(self) -> list[dict]:
        """Each combination of the task axes' values ({} without task axes), in grid order."""
        names = self.task_axes
        return [dict(zip(names, vals)) for vals in itertools.product(*(self.hyperparameters[n] for n in names))]

    def _grid_axes(self) -> dict:
        """{column: values}: the learner's hyperparameters (declared order, each
        checked by its declaration), then the loop axes; the loop fields keep
        their values as tuples."""
        alg = learners.get(self.algorithm)  # ValueError naming algorithm
        if not isinstance(self.hyperparameters, dict):
            raise ValueError(f"hyperparameters: expected a table name -> values, got {self.hyperparameters!r}")
        for name in self.hyperparameters:
            if name not in LOOP_AXES:
                alg.hyperparameter(name)  # ValueError naming it
        hp = {}
        for h in alg.hyperparameters:
            if h.name in self.hyperparameters:
                values = as_tuple(h.name, self.hyperparameters[h.name])
            elif h.default is not None:
                values = (h.default,)
            else:
                raise ValueError(f"{h.name}: {alg.name} needs {h.name} ({h.doc}); give one or more values")
            if not values:
                raise ValueError(f"{h.name}: expected at least one value")
            hp[h.name] = tuple(h.check(v, h.name) for v in values)
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in LOOP_AXES:
            field = getattr(self, name)
            if name in self.hyperparameters:
                if field != defaults[name]:
                    raise ValueError(f"{name}: given twice (as a field and in hyperparameters)")
                field = self.hyperparameters[name]
            values = as_tuple(name, field)
            if not values:
                raise ValueError(f"{name}: expected at least one value")
            hp[name] = tuple(_check_loop_value(name, v) for v in values)
            object.__setattr__(self, name, hp[name][0] if len(hp[name]) == 1 else hp[name])
        return hp

    def _check_blocks(self) -> None:
        """steps and log_every: whole log blocks, a multiple of `BLOCK_MULTIPLE` of them."""
        if self.log_every is None:
            if self.steps % BLOCK_MULTIPLE:
                raise ValueError(f"steps: must be a multiple of {BLOCK_MULTIPLE} (the run is logged in "
                                 f"a multiple of {BLOCK_MULTIPLE} blocks), got {self.steps}")
            return
        if not is_int(self.log_every) or not 1 <= self.log_every <= self.steps:
            raise ValueError(f"log_every: must be an integer in [1, steps = {self.steps}], got {self.log_every!r}")
        if self.steps % self.log_every:
            raise ValueError(f"steps: must be a multiple of log_every ({self.log_every}), got {self.steps}")
        if (self.steps // self.log_every) % BLOCK_MULTIPLE:
            raise ValueError(f"log_every: steps / log_every must be a multiple of {BLOCK_MULTIPLE} (the last 10% "
                             f"and 50% of a run are whole log blocks); {self.steps} / {self.log_every} = "
                             f"{self.steps // self.log_every} blocks")

    # --------------------------------------------------------------- derived

    @property
    def block_steps(self) -> int:
        """Steps per log block (K): `log_every`, or by default steps / 100
        (steps / 10 where 100 does not divide steps)."""
        if self.log_every is not None:
            return self.log_every
        blocks = DEFAULT_BLOCKS if self.steps % DEFAULT_BLOCKS == 0 else BLOCK_MULTIPLE
        return self.steps // blocks

    @property
    def num_blocks(self) -> int:
        """Log blocks of a run (L)."""
        return self.steps // self.block_steps

    @property
    def algorithm_def(self):
        """The learner's `Algorithm` descriptor."""
        return learners.get(self.algorithm)

    @property
    def algorithm_names(self) -> tuple:
        """The grid's columns that are the learner's hyperparameters (declared order)."""
        return self.algorithm_def.names

    @functools.cached_property
    def _tasks(self) -> dict:
        return {}

    def make_task(self, combination: dict | None = None):
        """The `ContinuingEnv` of `task` with `task_params`, the task axes at
        `combination` (default: each axis's first value); built once per
        combination."""
        combo = {n: self.hyperparameters[n][0] for n in self.task_axes}
        combo.update(combination or {})
        key = tuple(sorted(combo.items()))
        if key not in self._tasks:
            self._tasks[key] = tasks.make(self.task, **{**self.task_params, **combo})
        return self._tasks[key]

    def for_task(self, combination: dict) -> ContinuingSpec:
        """This spec with the task axes fixed at `combination` (no task axes
        left): the spec of one group's program (`sweep.make_program`)."""
        if not combination:
            return self
        return self.replace(task_params={**self.task_params, **combination})

    def loop_values(self, name: str) -> tuple:
        """The values of a loop setting (epsilon, gamma, reward_offset, q0)."""
        return self.hyperparameters[name]

    def program_sources(self) -> list:
        """The task's factory, for the executable caches' keys (`engine.tuning.memo_key`)."""
        factory = tasks.factory(self.task)
        return [factory.func if isinstance(factory, functools.partial) else factory]

    def program_shape(self, d: dict) -> dict:
        """`to_dict()`'s `d` less what a program takes as input (the loop
        axes' values are grid columns, traced; `engine.tuning.spec_shape`).
        The task axes' values stay in task_params: each combination is its
        own program."""
        return {k: v for k, v in d.items() if k not in LOOP_AXES}

    # --------------------------------------------------------------- (de)serialisation

    def to_dict(self) -> dict:
        """A JSON-ready dict; `from_dict` rebuilds the same spec."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["task_params"] = dict(self.task_params)
        d["learner_params"] = dict(self.learner_params)
        d["search"] = None if self.search is None else dict(self.search)
        d["hyperparameters"] = {k: list(v) for k, v in self.hyperparameters.items()
                                if k not in LOOP_AXES and k not in self.task_axes}
        for name in LOOP_AXES:
            values = self.hyperparameters[name]
            d[name] = values[0] if len(values) == 1 else list(values)
        d["kind"] = KIND
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ContinuingSpec:
        """The spec of `to_dict` (or a TOML table): the fields above, and each of
        the learner's hyperparameters in `hyperparameters` or as a top-level
        key (`alpha = [...]`); unknown fields are an error."""
        return cls(**spec_table(cls, d, lambda a: learners.get(a).names, "continuing sweep"))

    def replace(self, **changes) -> ContinuingSpec:
        """A copy with `changes` (validated again)."""
        d = self.to_dict()
        d.pop("kind")
        d.update(changes)
        return ContinuingSpec.from_dict(d)
