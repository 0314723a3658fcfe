"""The control sweep specification: one task, one algorithm, a grid of its
hyperparameters, seeds and episodes, validated before any work starts.

Every rule lives here, so the command line, TOML files, studies and Python
callers get the same checks and the same one-line `ValueError` naming the field.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import ClassVar

import numpy as np

from bec_jax.control import algorithms, tasks
from bec_jax.control.grid import GridColumns, spec_table
from bec_jax.mdp import check_value_range
from bec_jax.prediction.fields import MAX_INT32, SEED_LIMIT, as_tuple, is_int, is_real

KIND = "control"
DTYPES = ("float32", "float64")
# The loop's parameters that may also be grid axes (a list of values, at the top
# level or in `hyperparameters`): the behaviour's and the discount.
LOOP_AXES = ("epsilon", "epsilon_decay", "epsilon_min", "gamma")
AUTO_BLOCK, MAX_AUTO_BLOCK, BLOCK_WEIGHT_BYTES = 100, 1000, 512  # `ControlSpec.block_steps`
SEARCH_FIELDS = ("method", "rate", "rungs", "min_steps", "metric")  # `ControlSpec.search`'s settings
SEARCH_METRICS = ("return", "length")  # what a search's rungs rank by (`control.results.STATS`)


@dataclasses.dataclass(frozen=True)
class ControlSpec(GridColumns):
    """What a control sweep runs.

    Attributes:
      task: a registered task (`bec_jax.control.tasks.names()`) or a factory of
        the user's own as package.module:function. task_params: its parameters
        (e.g. num_tilings, bins). task_axes: {parameter: [numbers]}, task
        parameters that are grid axes. Where the factory accepts them as
        traced JAX scalars and they leave the task's sizes, cap and discount
        alone, every value runs in one program (`task_axes_traced`);
        otherwise each combination is its own task, run by its own program.
      algorithm: a control algorithm (`bec_jax.control.algorithms.names()`).
      hyperparameters: {name: value or list of values}; the grid is their
        cartesian product in the algorithm's declared order. The loop's
        parameters epsilon, epsilon_decay, epsilon_min and gamma are grid axes
        too when given here (or as a list at the top level); they follow the
        algorithm's, in that order.
      seeds: runs per grid point. seed: the base seed; seed i's stream is
        fold_in(key(seed), seed_offset + i), whatever the number of seeds.
      seed_offset: the first stream's index (default 0): fresh seeds,
        disjoint from another sweep's, for a confirmation run
        (`bec_jax.run.confirm`). Left out of `to_dict` when 0, so the saved
        spec (and the program) of every sweep without it is unchanged.
      episodes: episodes logged per run (the buffers' size). A run goes on until
        every run of its chunk has finished this many (or `max_steps`).
      epsilon, epsilon_decay, epsilon_min: epsilon-greedy behaviour; epsilon
        after k episodes is max(epsilon * decay^k, min). Default constant 0.1;
        the authors use 0.01, 0.9992, 1e-4.
      max_episode_steps: the episode cap (default the task's); the capped last
        transition is learned as non-terminal, as the authors do.
      max_steps: the step budget of a run (default episodes x max_episode_steps).
      gamma: the discount (default the task's).
      block: steps between divergence checks and loop-exit tests; default
        (None) `AUTO_BLOCK` steps, more for long weight vectors (see
        `block_steps`). A run's logged episodes do not depend on it unless it
        diverges (it is frozen at the start of the block it diverged in).
      dtype, divergence_bound: as in prediction sweeps (a run whose weights
        leave [-bound, bound] or stop being finite is frozen and flagged).
      reward_shift: the learner sees r - reward_shift (returns are logged
        unshifted): the constant-shift control for centering, whose omega acts
        on the TD error like a learned shift of the reward.
      search: None (every point runs all its episodes), or a successive-halving
        search of the grid (`engine.search`, `control.program.searched`):
        {"method": "halving", "rate": eta (default 3), "rungs": R (default: as
        many as the grid and the step budget allow, at most 4), "min_steps": the first
        rung's least steps (default one block), "metric": "return" (default)
        or "length", what the rungs rank by: each point's mean return, or
        steps, per episode over the episodes its runs finished so far}. Rung r
        < R - 1 runs its points' runs up to step max_steps / rate^(R - 1 - r)
        (in whole blocks); the last runs the survivors to their ends (their
        episodes, or max_steps), as the full grid does. Every point of the
        grid in one call; not with task axes. Left out of `to_dict` when None,
        as seed_offset at 0.
    """

    KIND: ClassVar[str] = KIND  # which kind of run this is (`bec_jax.run.kinds`)
    task: str
    algorithm: str
    hyperparameters: dict
    seeds: int = 10
    episodes: int = 100
    task_params: dict = dataclasses.field(default_factory=dict)
    task_axes: dict = dataclasses.field(default_factory=dict)
    seed: int = 0
    epsilon: float = 0.1
    epsilon_decay: float = 1.0
    epsilon_min: float = 0.0
    max_episode_steps: int | None = None
    max_steps: int | None = None
    gamma: float | None = None
    block: int | None = None
    dtype: str = "float32"
    divergence_bound: float = 1e6
    reward_shift: float = 0.0
    seed_offset: int = 0
    search: dict | None = None

    def __post_init__(self):  # noqa: C901  (a validator: one check a field)
        if not isinstance(self.task, str):
            raise ValueError(f"task: unknown task {self.task!r}; known: {', '.join(tasks.names())}")
        tasks.factory(self.task)  # a registered name or package.module:function, imported now
        if not isinstance(self.task_params, dict):
            raise ValueError(f"task_params: expected a table of parameters, got {self.task_params!r}")
        alg = algorithms.get(self.algorithm)
        if not isinstance(self.hyperparameters, dict):
            raise ValueError(f"hyperparameters: expected a table name -> values, got {self.hyperparameters!r}")
        hp = {}
        for name in self.hyperparameters:
            if name not in LOOP_AXES:
                alg.hyperparameter(name)  # ValueError naming it
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
        hp.update(self._loop_axes())
        hp.update(self._task_axes(hp))
        object.__setattr__(self, "hyperparameters", hp)
        for name, lo in (("seeds", 1), ("episodes", 1), ("block", 1)):
            v = getattr(self, name)
            if name == "block" and v is None:
                continue
            if not is_int(v) or not lo <= v <= MAX_INT32:
                raise ValueError(f"{name}: must be an integer in [{lo}, 2**31 - 1], got {v!r}")
        if not is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed: must be an integer in [0, 2**32), got {self.seed!r}")
        if not is_int(self.seed_offset) or not 0 <= self.seed_offset <= MAX_INT32 - self.seeds:
            raise ValueError(f"seed_offset: must be an integer >= 0 with seed_offset + seeds <= 2**31 - 1, "
                             f"got {self.seed_offset!r}")
        for name, lo, hi in (("epsilon", 0.0, 1.0), ("epsilon_decay", 0.0, 1.0), ("epsilon_min", 0.0, 1.0)):
            v = getattr(self, name)
            if not is_real(v) or not lo <= float(v) <= hi:
                raise ValueError(f"{name}: must be a number in [{lo:g}, {hi:g}], got {v!r}")
            object.__setattr__(self, name, float(v))
        if 0.0 in self.loop_values("epsilon_decay"):
            raise ValueError("epsilon_decay: must be in (0, 1] (1 keeps epsilon constant), got 0")
        if max(self.loop_values("epsilon_min")) > min(self.loop_values("epsilon")):
            raise ValueError(f"epsilon_min: must not exceed epsilon ({min(self.loop_values('epsilon')):g}), "
                             f"got {max(self.loop_values('epsilon_min')):g}")
        if self.gamma is not None and (not is_real(self.gamma) or not 0 <= float(self.gamma) <= 1):
            raise ValueError(f"gamma: must be a number in [0, 1], got {self.gamma!r}")
        for name in ("max_episode_steps", "max_steps"):
            v = getattr(self, name)
            if v is not None and (not is_int(v) or not 1 <= v <= MAX_INT32):
                raise ValueError(f"{name}: must be an integer in [1, 2**31 - 1], got {v!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        b = self.divergence_bound
        if not is_real(b) or not (0 < float(b) < math.inf):
            raise ValueError(f"divergence_bound: must be a finite number > 0, got {b!r}")
        object.__setattr__(self, "divergence_bound", float(b))
        if not is_real(self.reward_shift) or not math.isfinite(float(self.reward_shift)):
            raise ValueError(f"reward_shift: must be a finite number, got {self.reward_shift!r}")
        object.__setattr__(self, "reward_shift", float(self.reward_shift))
        # A number beyond the dtype's range becomes inf in the program: the run would be "diverged" at step 0.
        named = [(n, v) for n, vals in self.hyperparameters.items() for v in vals]
        for name, v in named + [("divergence_bound", b), ("reward_shift", self.reward_shift)]:
            if is_real(v):
                check_value_range(name, v, self.dtype)
        try:
            for params in self.task_combinations():  # checks task_params and task_axes (ValueError naming the field)
                self.make_task(params)
        except ImportError as e:  # an optional extra the task needs (gymnax): one line, not a traceback
            raise ValueError(f"task: {e}") from None
        if self.total_steps > MAX_INT32:
            raise ValueError(f"max_steps: a run of {self.total_steps} steps exceeds 2**31 - 1; "
                             "give a smaller max_steps or fewer episodes")
        if self.search is not None:
            self._check_search()

    def _check_search(self) -> None:
        """The search's fields, normalized in place (defaults filled in), and its
        schedule built once: a one-line `ValueError` naming the field where the
        grid or the episodes do not allow it."""
        from bec_jax.engine import search

        s = self.search
        if not isinstance(s, dict):
            raise ValueError(f"search: a table of the search's settings, got {s!r}")
        unknown = set(s) - set(SEARCH_FIELDS)
        if unknown:
            raise ValueError(f"search.{sorted(unknown)[0]}: not a setting of a control search; known: "
                             f"{', '.join(SEARCH_FIELDS)}")
        if s.get("method", "halving") not in search.METHODS:
            raise ValueError(f"search: one of {', '.join(search.METHODS)}, got {s.get('method')!r}")
        if self.task_axes:
            raise ValueError(f"search: not with task axes ({', '.join(self.task_axes)}): a task axis is not a "
                             "setting to choose; search each value's grid as its own sweep")
        least = s.get("min_steps")
        if least is not None and (not is_int(least) or not 1 <= least <= self.total_steps):
            raise ValueError(f"min_steps: an integer in [1, max_steps = {self.total_steps}], got {least!r}")
        metric = s.get("metric", "return")
        if metric not in SEARCH_METRICS:
            raise ValueError(f"search.metric: {' or '.join(SEARCH_METRICS)} (what each rung ranks the points by), "
                             f"got {metric!r}")
        norm = {"method": "halving", "rate": s.get("rate", search.DEFAULT_RATE), "rungs": s.get("rungs"),
                "min_steps": least, "metric": metric}
        object.__setattr__(self, "search", norm)
        self.search_schedule()

    def search_schedule(self):
        """The search's rungs (`engine.search.schedule`) in blocks of
        `block_steps` of the step budget (`total_steps`, whole blocks): rung r
        runs its points' runs until block `ends[r]`, the last until their ends."""
        from bec_jax.engine import search

        s = self.search
        K = self.block_steps
        least = 1 if s["min_steps"] is None else -(-s["min_steps"] // K)
        return search.schedule(self.num_points, -(-self.total_steps // K), 1, s["rate"], s["rungs"], least)

    def _task_axes(self, hp: dict) -> dict:
        """{name: values} of the task parameters that are grid axes, checked."""
        if not isinstance(self.task_axes, dict):
            raise ValueError(f"task_axes: expected a table parameter -> values, got {self.task_axes!r}")
        out = {}
        for name, values in self.task_axes.items():
            field = f"task_axes.{name}"
            if name in hp or name in LOOP_AXES:
                raise ValueError(f"{field}: {name!r} is already a grid column (the algorithm's or the loop's)")
            if name in self.task_params:
                raise ValueError(f"{field}: given twice (also in task_params)")
            values = as_tuple(field, values)
            if not values:
                raise ValueError(f"{field}: expected at least one value")
            for v in values:
                if isinstance(v, bool) or not is_real(v):
                    raise ValueError(f"{field}: a grid axis takes numbers, got {v!r}")
            out[name] = tuple(values)
        return out

    def task_combinations(self) -> list[dict]:
        """Each combination of the task axes' values ({} without task axes), in grid order."""
        names = list(self.task_axes)
        return [dict(zip(names, vals)) for vals in itertools.product(*(self.hyperparameters[n] for n in names))]

    def _loop_axes(self) -> dict:
        """{name: values} of the loop's parameters given as grid axes (a list at
        the top level, or in `hyperparameters`), checked; the field then keeps
        its default."""
        out = {}
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in LOOP_AXES:
            field = getattr(self, name)
            if name in self.hyperparameters and field != defaults[name]:
                raise ValueError(f"{name}: given twice (as a value and as a grid axis in hyperparameters)")
            values = self.hyperparameters.get(name, field if isinstance(field, (list, tuple)) else None)
            if values is None:
                continue
            values = as_tuple(name, values)
            if not values:
                raise ValueError(f"{name}: expected at least one value")
            for v in values:
                if not is_real(v) or not 0.0 <= float(v) <= 1.0:
                    raise ValueError(f"{name}: must be a number in [0, 1], got {v!r}")
            out[name] = tuple(float(v) for v in values)
            object.__setattr__(self, name, defaults[name])
        return out

    def loop_values(self, name: str) -> tuple:
        """The values of a loop parameter (epsilon, epsilon_decay, epsilon_min,
        gamma): its grid axis, or its one value."""
        if name in self.hyperparameters:
            return self.hyperparameters[name]
        return (self.discount,) if name == "gamma" else (getattr(self, name),)

    @property
    def algorithm_names(self) -> tuple:
        """The grid's columns that are the algorithm's hyperparameters (declared order)."""
        return tuple(n for n in self.hyperparameters if n not in LOOP_AXES and n not in self.task_axes)

    # --------------------------------------------------------------- derived

    @property
    def algorithm_def(self):
        """The `Algorithm` descriptor."""
        return algorithms.get(self.algorithm)

    @functools.cached_property
    def _tasks(self) -> dict:
        return {}

    def make_task(self, axes: dict | None = None):
        """The `ControlEnv` of `task` with `task_params` and, where `task_axes`
        are given, the values `axes` of them (default the first of each); built
        once per spec and values."""
        axes = dict(axes) if axes is not None else {n: v[0] for n, v in self.task_axes.items()}
        key = tuple(sorted(axes.items()))
        if key not in self._tasks:
            self._tasks[key] = tasks.make(self.task, **self.task_params, **axes)
        return self._tasks[key]

    def traced_task(self, values: dict):
        """The `ControlEnv` of `task` with `task_params` and the task axes at
        `values`, traced JAX scalars inside a program (`task_axes_traced`);
        never cached."""
        return tasks.make(self.task, **self.task_params, **values)

    def task_axis_dtype(self, name: str) -> str:
        """The dtype a task axis's values have inside a program: int32 where
        every value is an integer, else the sweep's dtype."""
        return "int32" if all(is_int(v) for v in self.hyperparameters[name]) else self.dtype

    def program_sources(self) -> list:
        """What of the task's code shapes this sweep's programs, for the disk
        key of `engine.program_cache.file_key`: the task's factory and a
        feature map given as a function or `package.module:function` (None:
        code that key cannot follow), and gymnax's version for a gymnax task."""
        factory = tasks.factory(self.task)
        out = [factory.func if isinstance(factory, functools.partial) else factory]
        features = self.task_params.get("features")
        if callable(features) or (isinstance(features, str) and ":" in features):
            out.append(features if callable(features) else None)
        if self.task.startswith(tasks.GYMNAX):
            import importlib.metadata
            out.append(f"gymnax {importlib.metadata.version('gymnax')}")
        return out

    def program_shape(self, d: dict) -> dict:
        """`to_dict()`'s `d` less what a program takes as input
        (`engine.tuning.spec_shape`): traced task axes keep their names and
        dtypes, not their values, so other values reuse the program."""
        if self.task_axes_traced:
            d = {**d, "task_axes": {n: self.task_axis_dtype(n) for n in self.task_axes}}
        return d

    @property
    def task_axes_traced(self) -> bool:
        """Whether the spec has task axes and they run in one program, as
        columns of the grid (`task_axes_reason` says why not)."""
        return self.task_axes_reason is None

    @functools.cached_property
    def task_axes_reason(self) -> str | None:
        """None where the task axes can be traced: the factory, called with
        the axes as traced scalars (`task_axis_dtype`), gives a task with the
        sizes, cap and discount every value gives, and reset, step and
        features of the same shapes. Else why each value needs its own
        program (no task axes; a factory that validates its values in Python
        or makes shapes from them)."""
        if not self.task_axes:
            return "no task axes"
        import jax
        import jax.numpy as jnp

        envs = [self.make_task(c) for c in self.task_combinations()]

        def sizes(env):
            return (env.num_actions, env.num_features, env.num_active, self.cap_of(env), self.discount_of(env))

        if len({sizes(e) for e in envs}) > 1:
            return "its values change the task's sizes, episode cap or discount"

        def shapes(env, key):
            state = env.reset(key)
            nxt, reward, terminal = env.step(key, state, jnp.int32(0))
            return state, env.features(state), nxt, env.features(nxt), reward, terminal

        def traced(values, key):
            env = self.traced_task(values)
            if any(isinstance(x, jax.Array) for x in sizes(env)) or sizes(env) != sizes(envs[0]):
                raise ValueError("the traced values change the task's sizes, episode cap or discount")
            return shapes(env, key)

        key = jax.random.key(0)
        values = {n: jax.ShapeDtypeStruct((), jnp.dtype(self.task_axis_dtype(n))) for n in self.task_axes}
        try:
            got = jax.eval_shape(traced, values, key)
        except Exception as e:  # whatever a factory does with a tracer it cannot take
            return f"the factory does not take traced values ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
        want = [jax.eval_shape(functools.partial(shapes, env), key) for env in envs]
        if any(jax.tree_util.tree_structure(w) != jax.tree_util.tree_structure(got)
               or jax.tree_util.tree_leaves(w) != jax.tree_util.tree_leaves(got) for w in want):
            return "its values change the shapes of the task's state or features"
        return None

    @property
    def block_steps(self) -> int:
        """Steps per block: `block`, or by default `AUTO_BLOCK`, raised for a task
        whose weight vector is long (about one step per `BLOCK_WEIGHT_BYTES`
        of it, at most `MAX_AUTO_BLOCK`): a block keeps a copy of every run's
        learner for the divergence revert, which for Acrobot's 234,375 weights
        cost more than 100 steps. It depends on the task and dtype only, so
        sweeps sharing a program share it."""
        if self.block is not None:
            return self.block
        features = max(self.make_task(a).num_features for a in self.task_combinations())
        weight_bytes = features * np.dtype(self.dtype).itemsize
        return int(min(MAX_AUTO_BLOCK, max(AUTO_BLOCK, -(-weight_bytes // BLOCK_WEIGHT_BYTES))))

    @property
    def episode_cap(self) -> int:
        """Steps after which an episode is truncated."""
        return self.max_episode_steps if self.max_episode_steps is not None else self.make_task().max_episode_steps

    @property
    def discount(self) -> float:
        """The discount gamma used."""
        return float(self.gamma) if self.gamma is not None else float(self.make_task().gamma)

    @property
    def total_steps(self) -> int:
        """A run's step budget (with task axes, the largest of their tasks')."""
        if self.max_steps is not None:
            return self.max_steps
        return max(self.episodes * self.cap_of(self.make_task(a)) for a in self.task_combinations())

    def cap_of(self, task) -> int:
        """The episode cap of `task` in this sweep: `max_episode_steps` or the task's own."""
        return self.max_episode_steps if self.max_episode_steps is not None else task.max_episode_steps

    def discount_of(self, task) -> float:
        """The discount in this sweep of `task`: `gamma` or the task's own."""
        return float(self.gamma) if self.gamma is not None else float(task.gamma)

    # --------------------------------------------------------------- (de)serialisation

    def to_dict(self) -> dict:
        """A JSON-ready dict; `from_dict` rebuilds the same spec."""
        d = dataclasses.asdict(self)
        d["hyperparameters"] = {k: list(v) for k, v in self.hyperparameters.items() if k not in self.task_axes}
        d["task_axes"] = {k: list(v) for k, v in self.task_axes.items()}
        if not self.seed_offset:  # the dicts saved before the field existed, and their programs' keys
            del d["seed_offset"]
        if self.search is None:  # likewise
            del d["search"]
        else:
            d["search"] = dict(self.search)
        d["kind"] = KIND
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ControlSpec:
        """The spec of `to_dict` (or a TOML table): the fields above, and each of
        the algorithm's hyperparameters in `hyperparameters` or as a top-level
        key (`alpha = [...]`, as a prediction sweep's table takes them); unknown
        fields are an error."""
        return cls(**spec_table(cls, d, lambda a: algorithms.get(a).names, "control sweep"))

    def replace(self, **changes) -> ControlSpec:
        """A copy with `changes` (validated again)."""
        d = self.to_dict()
        d.pop("kind")
        d.update(changes)
        return ControlSpec.from_dict(d)
