"""The grid of a control sweep, episodic or continuing: its columns and
points (`GridColumns`, a spec's), its groups by task axis (`task_groups`, a
sweep's plan) and a result's views by grid point (`GridResult`). Written once
for both fronts (`control.spec` and `control.continuing.spec`, their sweeps and
results).

A spec holds `hyperparameters`, {column: values} in grid order (the
learner's, then the loop's, then the task axes), `task_axes` (their names)
and `task_combinations()` (each combination of the task axes' values).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from collections.abc import Callable

import numpy as np

from bec_jax.engine.plan import Group, split
from bec_jax.files import (
    CURVES_FILE,
    GRID_PREFIX,
    META_FILE,
    SUMMARY_CSV,
    SUMMARY_FILE,
    atomic_write,
    csv_text,
    write_json,
)


class GridColumns:
    """A control spec's grid: the cartesian product of its columns'
    values, the first column varying slowest."""

    @property
    def names(self) -> tuple:
        """The grid's columns: the learner's hyperparameters (declared order),
        then the loop's settings that are columns, then the task axes."""
        return tuple(self.hyperparameters)

    def grid_points(self) -> list[dict]:
        """Every grid point as {name: value}, the first column varying slowest."""
        names = self.names
        return [dict(zip(names, vals)) for vals in itertools.product(*(self.hyperparameters[n] for n in names))]

    @property
    def num_points(self) -> int:
        return math.prod(len(v) for v in self.hyperparameters.values())

    def grid_arrays(self) -> dict[str, np.ndarray]:
        """The grid's columns as float64 arrays (num_points,)."""
        pts = self.grid_points()
        return {n: np.asarray([p[n] for p in pts], np.float64) for n in self.names}


def spec_table(cls, d, declared: Callable[[str], tuple], what: str) -> dict:
    """The keyword arguments of the spec class `cls` from its table `d`
    (`to_dict`'s, or a TOML file's): `kind` dropped; each hyperparameter the
    algorithm declares (`declared(algorithm)`, its names) that is given at the
    top level (`alpha = [...]`) moved into `hyperparameters`; any other unknown
    field refused, naming it (`what`: "control sweep", "continuing sweep");
    task and algorithm required. One-line `ValueError`s naming the field."""
    if not isinstance(d, dict):
        raise ValueError(f"spec: expected a table, got {d!r}")
    d = {k: v for k, v in d.items() if k != "kind"}
    known = {f.name for f in dataclasses.fields(cls)}
    hyper = [k for k in d if k not in known]
    if hyper and "algorithm" in d:
        names = declared(d["algorithm"])
        hp = d.get("hyperparameters", {})
        if not isinstance(hp, dict):
            raise ValueError(f"hyperparameters: expected a table name -> values, got {hp!r}")
        hp = dict(hp)
        for k in (k for k in hyper if k in names):
            if k in hp:
                raise ValueError(f"{k}: given twice (at the top level and in hyperparameters)")
            hp[k] = d.pop(k)
        d["hyperparameters"] = hp
    for k in d:
        if k not in known:
            raise ValueError(f"{k}: unknown field of a {what}; known: {', '.join(sorted(known))} "
                             "and the algorithm's hyperparameters")
    for k in ("task", "algorithm"):
        if k not in d:
            raise ValueError(f"{k}: required")
    d.setdefault("hyperparameters", {})
    return d


def task_groups(spec, chunk: int, by_task: bool = True) -> tuple[list, list]:
    """(groups, chunks) as the engine takes them (`engine.plan`), in chunks of
    at most `chunk` points: one group of every point, or with `by_task` and
    task axes one group per combination of their values, each its own task and
    program (`Group.static` holds the values)."""
    if not spec.task_axes or not by_task:
        G = spec.num_points
        groups = [Group(np.arange(G), [], np.zeros(G, np.int32), ())]
        return groups, split(groups, chunk)
    names = list(spec.task_axes)
    points = spec.grid_points()
    groups = []
    for combo in spec.task_combinations():
        idx = np.array([i for i, p in enumerate(points) if all(p[n] == combo[n] for n in names)])
        groups.append(Group(idx, [], np.zeros(len(idx), np.int32), tuple(sorted(combo.items()))))
    return groups, split(groups, chunk)


class GridResult:
    """A control result's views by grid point. The dataclass holding it gives
    `spec`, `spec_dict`, `grid` ({column: (G,)}) and `RUNS`, the name of its
    (G, N, ...) array of every run."""

    RUNS = ""

    def __post_init__(self):
        if self.spec_dict is None and self.spec is not None:
            self.spec_dict = self.spec.to_dict()

    @property
    def task(self) -> str:
        return self.spec_dict["task"]

    @property
    def algorithm(self) -> str:
        return self.spec_dict["algorithm"]

    @property
    def num_points(self) -> int:
        return getattr(self, self.RUNS).shape[0]

    @property
    def seeds(self) -> int:
        return getattr(self, self.RUNS).shape[1]

    def point(self, i: int) -> dict:
        """{column: value} of grid point i."""
        return {n: float(v[i]) for n, v in self.grid.items()}

    def save(self, out_dir: str) -> None:
        """Writes curves.npz (`arrays()`), summary.json and summary.csv
        (`summary()`) and meta.json (spec, versions, machine, timings), each
        atomically."""
        os.makedirs(out_dir, exist_ok=True)
        atomic_write(os.path.join(out_dir, CURVES_FILE), lambda f: np.savez(f, **self.arrays()), binary=True)
        recs = self.summary()
        write_json(os.path.join(out_dir, SUMMARY_FILE), recs)
        atomic_write(os.path.join(out_dir, SUMMARY_CSV), lambda f: f.write(csv_text(recs)))
        write_json(os.path.join(out_dir, META_FILE), dict(self.meta, spec=self.spec_dict, grid_columns=list(self.grid)))

    @staticmethod
    def read_meta(out_dir: str, spec_cls) -> tuple:
        """(spec or None, spec_dict, meta, grid columns) of a result `save` wrote:
        the spec None where it cannot be built here (a user's task or learner
        that is not importable)."""
        with open(os.path.join(out_dir, META_FILE)) as f:
            meta = json.load(f)
        spec_dict = meta.pop("spec")
        columns = meta.pop("grid_columns")
        try:
            spec = spec_cls.from_dict(spec_dict)
        except (ValueError, ImportError):
            spec = None
        return spec, spec_dict, meta, columns

    @staticmethod
    def read_grid(z, columns) -> dict:
        """{column: (G,)} from the arrays of a curves.npz."""
        return {n: z[GRID_PREFIX + n] for n in columns}

    def select(self, **values) -> np.ndarray:
        """(G,) True where every given grid column equals the given value."""
        mask = np.ones(self.num_points, bool)
        for n, v in values.items():
            if n not in self.grid:
                raise ValueError(f"{n}: not a grid column; columns: {', '.join(self.grid)}")
            col = np.asarray(self.grid[n])
            if col.dtype.kind not in "fiu":  # a column of names (a task parameter such as features)
                mask &= col == v
            elif isinstance(v, bool) or not isinstance(v, (int, float, np.number)):
                raise ValueError(f"{n}: expected a number, got {v!r}")
            else:
                mask &= np.isclose(col, v)
        return mask


__all__ = ["GridColumns", "GridResult", "spec_table", "task_groups"]
