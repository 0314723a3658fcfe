"""Successive halving inside one compiled program: `Schedule`, `schedule`,
`halving`. A front hands it the stages of one run (`Stages`) and a score hook;
every front's search is this one.

Successive halving (Jamieson and Talwalkar 2016; the inner loop of Hyperband,
Li et al., JMLR 2018): rung r runs the k_r surviving grid points, every seed
of each, up to step T_r; the front's score of the steps so far (each point's
mean over its seeds) ranks them, and the best ceil(k_r / eta) go on, ties to
the lower grid index. Points whose score is not finite (a diverged run) rank
last: they are out at the first rung they are scored, unless fewer finite
points than the rung's places remain. The last rung runs to the full T.

The whole search is one XLA program, with one copy of the run's step: a loop
over the rungs, in each a loop over batches of `batch` runs (the survivors
first, so rung r runs ceil(k_r N / batch) batches: a rung's cost follows its
points), in each a loop over the rung's units of log blocks. Between rungs the
carried state of every run (the learner, the task's state, the keys) is
reordered on the device, survivors first (`jnp.take` on the run axis), with no
host round trip. A batch's runs beyond the survivors are computed and their
logs dropped. A run's random stream depends on its seed and point only, and
its stages are the whole run's split at unit boundaries, so a survivor's
curves equal the full grid's, bit for bit on the same machine.

Freed runs are not reused (no more seeds for the survivors, no new points):
a survivor's curves then are the full grid's, its seeds the same as every
other point's, and more seeds belong to the confirmation on fresh seeds
(`--confirm-seeds`), not to the selection.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

METHODS = ("halving",)
DEFAULT_RATE = 3
# At most 4 rungs unless asked (--rungs): the first rung then sees at least
# 1/rate^3 of the run (1/27 at rate 3). Early scores mislead where a slow
# starter ends best (Hertel et al.); on Naik et al.'s Access-Control grid a
# first rung of 1/100 of the run chose the full grid's best in no repetition,
# one of 1/25 in 96% (benchmarks/README.md, search_quality.py).
DEFAULT_MAX_RUNGS = 4
_UNITS = "units_run"  # `halving`'s count of each run's advanced blocks, with `Stages.more`


class Stages(NamedTuple):
    """One run of a front in stages, for one run (the search vmaps them):

      start(lane) -> carry                          the run's state before its first step
      advance(carry, lane, j0, n) -> (carry, logs)  log blocks j0 .. j0 + n - 1, j0 traced, n static;
                                                    logs: {name: (n, ...)}
      finish(carry, lane) -> {name: array}          the run's finals (may be {})
      score(logs, valid) -> (points,)               every point's selection score (higher is
                                                    better) from logs {name: (points, seeds, blocks,
                                                    ...)}, of the blocks where `valid` (blocks,) holds

    `lane` is the run's inputs (a pytree: keys, its grid point's columns);
    `batch`: runs vmapped together (the front's choice: the last rung's runs,
    so that later rungs cost what they run, or its whole-run program's batch,
    where a run's bits depend on it); `unit`: the log blocks `advance` takes
    at once (rung ends are whole units). `batched`: start, advance and finish
    take a whole batch of `batch` runs at once (every argument and result with
    a leading axis of `batch` rows, consecutive runs, point-major) and
    vectorise it themselves, where the front's step shares work among runs
    (prediction's transitions, drawn once per seed for every grid point).

    `more`, where a run may end before its last block (an episodic run ends
    with its last episode): more(carry, lane, end) -> bool, whether the run
    needs more of `advance` before block `end`, its rung's end. A rung's batch
    of runs then advances `unit` blocks at a time while any of its running
    runs needs more (a run that needs no more waits in its batch, and the
    front's advance must leave what it reports unchanged by that), j0 counts
    the batch's calls (each run keeps its own clock in its carry), advance's
    logs are dropped, and a run's logs are its finals: `finish` of its carry
    at the end of each rung it ran, {name: (points, seeds, ...)} for `score`.
    """

    start: Callable
    advance: Callable
    finish: Callable
    score: Callable
    batch: int
    unit: int = 1
    batched: bool = False
    more: Callable | None = None


class Schedule(NamedTuple):
    """The rungs of a search: `ends[r]`, the log blocks run by the end of rung
    r (the last is every block), and `points[r]`, the points rung r runs."""

    ends: tuple
    points: tuple

    @property
    def rungs(self) -> int:
        return len(self.ends)

    def run_blocks(self, seeds: int) -> int:
        """Run-blocks the search computes: each rung's points x seeds x its new blocks."""
        starts = (0,) + self.ends[:-1]
        return sum(k * seeds * (e - s) for k, s, e in zip(self.points, starts, self.ends))


def schedule(points: int, blocks: int, unit: int = 1, rate: float = DEFAULT_RATE, rungs: int | None = None,
             min_blocks: int = 1) -> Schedule:
    """The rungs for `points` grid points and runs of `blocks` log blocks,
    rung ends on multiples of `unit` blocks: rung r of R ends at
    blocks / rate^(R - 1 - r) (rounded to a unit, at least `min_blocks`), and
    runs ceil(points / rate^r) points. By default as many rungs as leave the
    last at least `rate` points (where the grid has them: the choice is then
    made on whole runs), at most DEFAULT_MAX_RUNGS, and a first rung of at
    least `min_blocks`. One-line
    `ValueError`s naming the field where the grid or the steps do not allow it."""
    if points < 2:
        raise ValueError("search: a search ranks grid points; this grid has one (give more values of an axis)")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 2:
        raise ValueError(f"halving_rate: a number >= 2 (the fraction 1/rate of points goes on), got {rate!r}")
    units = blocks // unit
    most = max(2, 1 + math.floor(math.log(points / rate, rate) + 1e-9)) if points > rate else 2
    if rungs is None:
        R = min(most, DEFAULT_MAX_RUNGS)
        while R > 2 and _ends(units, R, rate, unit, min_blocks) is None:
            R -= 1
    else:
        if isinstance(rungs, bool) or not isinstance(rungs, int) or rungs < 2:
            raise ValueError(f"rungs: an integer >= 2, got {rungs!r}")
        R = rungs
    ends = _ends(units, R, rate, unit, min_blocks)
    if ends is None:
        raise ValueError(f"rungs: {R} rungs need {R} distinct rung ends of at least {min_blocks} log blocks among the "
                         f"run's {blocks} blocks (in steps of {unit}); give fewer rungs, a smaller --min-steps or "
                         "more steps")
    counts = [points]
    for _ in range(R - 1):
        counts.append(max(1, math.ceil(counts[-1] / rate)))
    if counts[-2] == counts[-1] == 1:
        raise ValueError(f"rungs: {R} rungs leave one point before the last rung ({points} points at rate {rate:g}); "
                         "give fewer rungs")
    return Schedule(ends=tuple(ends), points=tuple(counts))


def _ends(units: int, R: int, rate: float, unit: int, min_blocks: int) -> list | None:
    """Rung ends in blocks, strictly increasing, the first at least `min_blocks`; None if impossible."""
    ends = [max(1, round(units / rate ** (R - 1 - r))) * unit for r in range(R)]
    ends[-1] = units * unit
    ok = all(a < b for a, b in zip(ends, ends[1:])) and ends[0] >= min_blocks
    return ends if ok else None


def _rows(tree, rows):
    return jax.tree_util.tree_map(lambda x: jnp.take(x, rows, axis=0), tree)


def _in_batches(stages: Stages, fn: Callable, B: int, *trees):
    """fn over consecutive batches of B rows of `trees` (leading axis a
    multiple of B), in turn: vmapped per run, or the front's own batch
    (`Stages.batched`)."""
    if not stages.batched:
        return jax.lax.map(lambda t: fn(*t), trees, batch_size=B)
    n = jax.tree_util.tree_leaves(trees)[0].shape[0] // B
    split = jax.tree_util.tree_map(lambda x: x.reshape((n, B) + x.shape[1:]), trees)
    out = jax.lax.map(lambda t: fn(*t), split)
    return jax.tree_util.tree_map(lambda x: x.reshape((n * B,) + x.shape[2:]), out)


def _rank(s, running, order, keep, seeds: int, n_pad: int) -> tuple:
    """(order, out, perm) after a rung scored the points `s`: the points
    survivors first (running, then the score descending, not finite last,
    then the grid index), `out` the running points past the first `keep`, and
    the runs' rows (`order`'s layout: point-major, padding last) in the new
    order."""
    points = s.shape[0]
    key = jnp.where(jnp.isfinite(s), s, -jnp.inf)
    new = jnp.lexsort((jnp.arange(points), -key, ~running)).astype(jnp.int32)
    rank = jnp.zeros((points,), jnp.int32).at[new].set(jnp.arange(points, dtype=jnp.int32))
    where = jnp.zeros((points,), jnp.int32).at[order].set(jnp.arange(points, dtype=jnp.int32))
    perm = (where[new][:, None] * seeds + jnp.arange(seeds)[None, :]).reshape(-1)
    return new, running & (rank >= keep), jnp.concatenate([perm, jnp.arange(points * seeds, n_pad)])


def halving(stages: Stages, lanes, points: int, seeds: int, blocks: int, sched: Schedule) -> dict:
    """The search, traced (call it inside the front's program): `lanes` the
    inputs of every run, a pytree with leading axis points * seeds
    (point-major). Returns {log name: (points, seeds, blocks, ...)} with NaN
    where a point did not run, {final name: (points, seeds, ...)} NaN for the
    points stopped early, "stopped_rung" (points,) int32 (the last rung each
    point ran; rungs - 1 for the survivors) and "rung_scores" (points, rungs)
    (NaN where a point was not scored). With `Stages.more`: {final name:
    (points, seeds, ...)}, each point's finals at the end of the last rung it
    ran, and "units_run" (points, seeds) int32, the blocks each run was
    advanced while its point ran (its batch's calls x unit: the work done)."""
    R, N, u = sched.rungs, seeds, stages.unit
    last = sched.points[-1] * N
    B = max(1, min(stages.batch, points * N))
    n_runs = points * N
    n_pad = -(-n_runs // B) * B
    pad = np.minimum(np.arange(n_pad), n_runs - 1)  # dead runs (copies of the last) fill the last batch
    lanes = _rows(lanes, jnp.asarray(pad))
    carry = _in_batches(stages, stages.start, B, lanes)
    one = B if stages.batched else 1
    until = stages.more is not None
    if until:
        finish = stages.finish if stages.batched else jax.vmap(stages.finish)
        more = stages.more if stages.batched else jax.vmap(stages.more, in_axes=(0, 0, None))
        shapes = jax.eval_shape(finish, _rows(carry, jnp.arange(one)), _rows(lanes, jnp.arange(one)))
        logs = {n: jnp.full((points, N) + s.shape[1:], jnp.nan if jnp.issubdtype(s.dtype, jnp.floating) else 0,
                            s.dtype) for n, s in shapes.items()}
        logs[_UNITS] = jnp.zeros((points, N), jnp.int32)
    else:
        step = (lambda c, x: stages.advance(c, x, 0, u)) if stages.batched else jax.vmap(
            lambda c, x: stages.advance(c, x, 0, u))
        shapes = jax.eval_shape(step, _rows(carry, jnp.arange(one)), _rows(lanes, jnp.arange(one)))[1]
        logs = {n: jnp.full((points, N, blocks) + s.shape[2:], jnp.nan, s.dtype) for n, s in shapes.items()}
    ends_u = jnp.asarray([e // u for e in sched.ends], jnp.int32)
    counts = jnp.asarray(sched.points + (sched.points[-1],), jnp.int32)  # the points of rung r and of the next
    advance = stages.advance if stages.batched else jax.vmap(stages.advance, in_axes=(0, 0, None, None))

    def rung(r, state):
        carry, lanes, logs, order, stopped, scores = state
        k = counts[r]
        u0 = jnp.where(r > 0, ends_u[jnp.maximum(r - 1, 0)], 0)

        def batch(b, st):
            carry, logs = st
            rows = b * B + jnp.arange(B)
            c = jax.tree_util.tree_map(lambda x: jax.lax.dynamic_slice_in_dim(x, b * B, B), carry)
            x = jax.tree_util.tree_map(lambda v: jax.lax.dynamic_slice_in_dim(v, b * B, B), lanes)
            live = rows < k * N
            pts = jnp.where(live, order[jnp.minimum(rows // N, points - 1)], points)  # points: out of range, dropped

            if until:  # the batch's running runs until none needs more; their finals are their logs
                def call(st2):
                    i, c = st2
                    return i + 1, advance(c, x, i * u, u)[0]

                calls, c = jax.lax.while_loop(lambda st2: jnp.any(live & more(st2[1], x, ends_u[r] * u)), call,
                                              (jnp.int32(0), c))
                f = finish(c, x)
                logs = {**{n: logs[n].at[pts, rows % N].set(f[n], mode="drop") for n in f},
                        _UNITS: logs[_UNITS].at[pts, rows % N].add(calls * u, mode="drop")}
            else:
                def unit(j, st2):
                    c, logs = st2
                    c, ys = advance(c, x, j * u, u)
                    cols = j * u + jnp.arange(u)
                    logs = {n: logs[n].at[pts[:, None], (rows % N)[:, None], cols[None, :]].set(ys[n], mode="drop")
                            for n in logs}
                    return c, logs

                c, logs = jax.lax.fori_loop(u0, ends_u[r], unit, (c, logs))
            carry = jax.tree_util.tree_map(lambda v, w: jax.lax.dynamic_update_slice_in_dim(v, w, b * B, 0), carry, c)
            return carry, logs

        carry, logs = jax.lax.fori_loop(0, (k * N + B - 1) // B, batch, (carry, logs))
        running = jnp.zeros((points,), bool).at[order].set(jnp.arange(points) < k)
        s = stages.score({n: v for n, v in logs.items() if n != _UNITS}, jnp.arange(blocks) < ends_u[r] * u)
        s = jnp.where(running, s.astype(jnp.float32), jnp.nan)
        scores = jnp.where((jnp.arange(R) == r)[None, :] & (r < R - 1), s[:, None], scores)
        new, out, perm = _rank(s, running, order, counts[r + 1], N, n_pad)
        stopped = jnp.where(out, r, stopped)
        return _rows(carry, perm), _rows(lanes, perm), logs, new, stopped, scores

    state = (carry, lanes, logs, jnp.arange(points, dtype=jnp.int32), jnp.full((points,), R - 1, jnp.int32),
             jnp.full((points, R), jnp.nan, jnp.float32))
    carry, lanes, logs, order, stopped, scores = jax.lax.fori_loop(0, R, rung, state)
    if until:  # every point's finals are those of its last rung
        out = {n: v for n, v in logs.items() if n != _UNITS}
        return {**out, "units_run": logs[_UNITS], "stopped_rung": stopped, "rung_scores": scores}
    finals = _in_batches(stages, stages.finish, B, carry, lanes)
    out = dict(logs)
    rows = jnp.arange(n_pad)
    pts = jnp.where(rows < last, order[jnp.minimum(rows // N, points - 1)], points)
    for n, f in finals.items():
        nan = jnp.nan if jnp.issubdtype(f.dtype, jnp.floating) else 0
        out[n] = jnp.full((points, N) + f.shape[1:], nan, f.dtype).at[pts, rows % N].set(f, mode="drop")
    out["stopped_rung"] = stopped
    out["rung_scores"] = scores
    return out


def line(meta: dict | None) -> str:
    """A search's line from its result's meta["search"] ("" for None): its
    rate, the rungs' ends and points, and the run-steps it spent against the
    full grid's."""
    if not meta:
        return ""
    spent, full = meta["search_run_steps"], meta["full_run_steps"]
    return (f"successive halving at rate {meta['rate']:g}: {len(meta['rung_points'])} rungs ending at steps "
            f"{', '.join(f'{x:,}' for x in meta['rung_steps'])} with {' -> '.join(map(str, meta['rung_points']))} "
            f"points; {spent:,} run-steps, {spent / full:.3f}x the full grid's {full:,}")


def check_fits(pl, points: int, seeds: int, *, extra: str = "", fewer: str = "seeds or grid points",
               split: bool = False):
    """`pl` (an `engine.memory.Plan`) if a search's one call of every grid
    point fits it; else a one-line `memory.TooLarge` naming memory_budget
    (`split`: the plan had to cut the seeds, which a search cannot)."""
    from bec_jax.engine import memory
    if split or pl.device_bytes > pl.budget:
        raise memory.TooLarge(f"memory_budget: a search runs every grid point's runs in one call: {points} points x "
                              f"{seeds} seeds{extra} need about {memory.human(pl.device_bytes)} of device memory; the "
                              f"budget is {memory.human(pl.budget)}; raise --memory-budget, or use fewer {fewer}")
    return pl


def survivors(stopped_rung: np.ndarray) -> np.ndarray:
    """The grid points that ran every rung, from a search's `stopped_rung`."""
    s = np.asarray(stopped_rung)
    return np.flatnonzero(s == s.max())


__all__ = ["DEFAULT_RATE", "METHODS", "Schedule", "Stages", "check_fits", "halving", "line", "schedule",
           "survivors"]
