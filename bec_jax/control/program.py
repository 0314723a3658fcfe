"""The control program: every (grid point, seed) run of one or more control
sweeps of one task as one compiled XLA program.

    program(seed, grids) = jit(shard_map_over_grid(
        while some member has a live run with fewer than `episodes` episodes
              (and steps remain):
            for each member (sweep) with a live run:          # independent
                scan over `block` steps (
                    every (grid point, seed) run: epsilon-greedy act, task step,
                    update, log a finished episode, reset)    # vmap over G N runs
                freeze runs whose state left the bound)))

A member is one sweep: its algorithm, its grid, its learner states; or, in a
small program, the sweeps whose algorithms are cases of one algorithm, run as
that one (`fusion`: Q, CQ and GQ as CGQ with step sizes held at 0). Members
share the task, the seeds and the loop's settings (`run_many` packs sweeps
that do), so the four algorithms of a task and all their settings run in one
program, compiled once. A member whose runs have all finished stops costing
work: its block is skipped (`lax.cond`), and the members' blocks are
independent, so XLA:CPU may run them on different cores.

The loop is `bec_jax.control.loop` (one run), batched here. A run's randomness
is fold_in(its seed's stream key, step), so its episodes do not depend on the
other runs, the members, the chunk size or the device count: the loop may run a
member longer than one of its runs needs, but steps after a run's last logged
episode change nothing it reports but its final learner state.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from bec_jax import threefry
from bec_jax.control import loop
from bec_jax.control.spec import ControlSpec
from bec_jax.control.transition import q_values
from bec_jax.engine import divergence, tuning
from bec_jax.engine.layout import state_axes
from bec_jax.engine.programs import GRID_AXIS, Program
from bec_jax.engine.streams import per_seed_keys


class Member(NamedTuple):
    """One sweep of a program, fixed before tracing."""

    spec: ControlSpec
    alg: object
    axes: object          # the learner state's batch axes (None: shared)
    step_all: Callable    # (carry, step keys (R,), columns (R,)) -> carry, over R = G N flat runs
    task_of: Callable     # a run's columns -> its task (the program's, or built from traced task axes)
    branches: str = "cond"  # its resets' and revert's (`tuning.KernelForm.branches`)


class Shared(NamedTuple):
    """What a program's members share: the task and the loop's sizes."""

    task: object
    dtype: object
    d: int
    seeds: int
    episodes: int
    block: int
    max_blocks: int
    bound: float
    seed_offset: int = 0  # seed i's stream is fold_in(key(seed), seed_offset + i)


def behaviour_columns(spec: ControlSpec, columns: dict) -> loop.Behaviour:
    """The behaviour of a grid point: its grid columns where the loop's
    parameters are axes (epsilon_decay arrives as log(decay), see
    `grid_inputs`), else the spec's values."""
    if "epsilon_decay" in columns:
        return loop.Behaviour(columns.get("epsilon", spec.epsilon), None,
                              columns.get("epsilon_min", spec.epsilon_min), log_decay=columns["epsilon_decay"])
    return loop.Behaviour(columns.get("epsilon", spec.epsilon), spec.epsilon_decay,
                          columns.get("epsilon_min", spec.epsilon_min))


def grid_inputs(spec: ControlSpec, indices: np.ndarray, n_devices: int = 1) -> dict:
    """The program's input for the grid points `indices`: one entry per run
    (point-major: point i's seeds 0..N-1 in order), padded to a multiple of
    `n_devices` runs by repeating the last (computed and dropped): the grid's
    columns in the spec's dtype (epsilon_decay, where it is an axis, as its
    float64 log rounded once to float32, so a decay given as an axis gives the
    bits of the same decay given as a value; traced task axes in
    `ControlSpec.task_axis_dtype`) and `seed_index`, the run's seed."""
    indices = np.asarray(indices)
    N = spec.seeds
    runs = len(indices) * N
    padded = -(-runs // n_devices) * n_devices
    point = np.repeat(indices, N)
    seed_index = np.tile(np.arange(N, dtype=np.int32), len(indices))
    point = np.concatenate([point, np.repeat(point[-1:], padded - runs)])
    seed_index = np.concatenate([seed_index, np.repeat(seed_index[-1:], padded - runs)])
    columns = spec.grid_arrays()
    out = {n: columns[n][point].astype(spec.dtype) for n in spec.names if n not in spec.task_axes}
    if spec.task_axes_traced:  # the task's values, per run (`member`)
        out.update({n: columns[n][point].astype(spec.task_axis_dtype(n)) for n in spec.task_axes})
    if "epsilon_decay" in out:
        out["epsilon_decay"] = np.log(columns["epsilon_decay"][point]).astype(np.float32)
    out[SEED_INDEX] = seed_index
    return out


SEED_INDEX = "seed_index"  # a run's seed, in a program's grid input (`grid_inputs`)
REPORTED = ("omega", "rbar")  # a learner's scalars reported per run as "omega" (`outputs`)


def member(spec: ControlSpec, task, alg=None, branches: str = "cond", shared_counter: bool = True) -> Member:
    """The member of `spec`: its algorithm (or `alg`, an algorithm `spec`'s is a
    case of, run with every one of its hyperparameters as a column: `fusion`),
    its state's batch axes and one step of every (grid point, seed) run with the
    resets of finished episodes (`branches`: as `tuning.KernelForm.branches`).
    With `shared_counter` False the update counter is per run too (a search's
    runs are at different steps: `search_stages`); it holds the same numbers."""
    alg_names = spec.algorithm_names if alg is None else alg.names
    alg = spec.algorithm_def if alg is None else alg
    dtype = jnp.dtype(spec.dtype)
    cap, discount = spec.cap_of(task), spec.discount_of(task)
    template = jax.eval_shape(alg.init, jax.ShapeDtypeStruct((task.num_features,), dtype))
    if not hasattr(template, alg.weights):
        raise ValueError(f"algorithm: {alg.name} declares weights {alg.weights!r}, but its state has no such field")
    axes = state_axes(template, alg.counter if shared_counter else None)
    if spec.task_axes_traced:
        # Every value of the task axes in this one program: each run builds its
        # task from its own columns (sizes, cap and discount are the same for
        # every value: `ControlSpec.task_axes_reason`).
        def task_of(cols):
            return spec.traced_task({n: cols[n] for n in spec.task_axes})
    else:
        def task_of(cols):
            return task

    def run_step(learner, ls, log, key, cols):
        hp = {n: cols[n] for n in alg_names}
        gamma = cols.get("gamma", discount)
        return loop.advance(task_of(cols), lambda st, tr: alg.apply(st, tr, hp), lambda st: getattr(st, alg.weights),
                            behaviour_columns(spec, cols), cap, gamma, learner, ls, log, key, spec.reward_shift)

    # The runs are one flat batch (grid point-major): gathers and scatters with
    # one batch axis compile to simpler and faster loops on the CPU than with two.
    over_runs = jax.vmap(run_step, in_axes=(axes, 0, 0, 0, 0), out_axes=(axes, 0, 0, 0))
    reset_runs = jax.vmap(lambda ls, done, key, cols: loop.reset_done(task_of(cols), ls, done, key))

    # The scalars `outputs` reports (omega, rbar) stop at a run's last logged
    # episode, so they do not depend on how long its member runs on for other
    # runs (`fusion`): a select of one number a run a step.
    reported = tuple(n for n in REPORTED if hasattr(template, n) and getattr(axes, n) == 0)

    def step_all(c, keys_t, cols):
        # Resets (a task's reset and its features) are a masked update,
        # computed only on steps where some run's episode ended where
        # `branches` is "cond" (`loop.step`, with the reset skipped when
        # nothing would use it), else every step.
        learner, ls, log, done = over_runs(*c, keys_t, cols)
        if reported:
            finished = c[1].episodes >= spec.episodes
            learner = learner._replace(**{n: jnp.where(finished, getattr(c[0], n), getattr(learner, n))
                                          for n in reported})
        ls = divergence.skippable(branches == "cond", jnp.any(done), lambda: reset_runs(ls, done, keys_t, cols), ls)
        return learner, ls, log

    return Member(spec, alg, axes, step_all, task_of, branches)


class Fused(NamedTuple):
    """A member of a program (`fusion`): the sweeps it runs, in program order,
    and the algorithm it runs them as (None: the one sweep's own)."""

    sweeps: tuple          # indices into the program's sweeps
    host: object           # the `Algorithm` run, or None
    fixed: tuple           # per sweep: {hyperparameter: value} held for its runs


def cases(alg) -> list[tuple]:
    """[(alg, {}), (host, fixed), (host's host, fixed with its own), ...]: the
    algorithms `alg` is a case of (`Algorithm.case_of`), nearest first, each with
    the hyperparameter values that make it `alg`."""
    from bec_jax.control import algorithms
    out, fixed = [(alg, {})], {}
    while alg.case_of is not None:
        name, held = alg.case_of
        alg = algorithms.get(name)
        if any(a.name == alg.name for a, _ in out):
            raise ValueError(f"algorithm: case_of of {out[0][0].name} runs in a circle through {alg.name}")
        fixed = {**fixed, **held}
        out.append((alg, fixed))
    return out


def fusion(specs: list[ControlSpec], keep_state: bool = False) -> list[Fused]:
    """The members of a program of `specs`: sweeps whose algorithms are cases of
    one algorithm (`Algorithm.case_of`: Q, CQ, GQ and CGQ are all CGQ at some
    step sizes 0) run as one member of that algorithm, the nearest one they
    share, their runs side by side, so the program compiles one update for all
    of them. A case's runs then do its host's work (CGQ's auxiliary weights for
    a Q run); a member's fixed cost per step and its compile, paid once instead
    of per sweep, weigh more (benchmarks/README.md, "One member for the cases of
    an algorithm"). A sweep runs as its own member where it has loop axes other
    sweeps lack, where its hyperparameters and the held ones are not exactly
    the host's, or with `keep_state` (its own learner state is wanted; also
    how `make_program` asks for a member per sweep)."""
    if keep_state or len(specs) == 1:
        return [Fused((i,), None, ({},)) for i in range(len(specs))]
    chains = [cases(s.algorithm_def) for s in specs]
    groups: dict = {}
    for i, ch in enumerate(chains):
        groups.setdefault(ch[-1][0].name, []).append(i)
    out = []
    for idx in groups.values():
        host = None
        if len(idx) > 1:  # the nearest algorithm every chain passes through
            names = [[a.name for a, _ in chains[i]] for i in idx]
            host = next(a for a, _ in chains[idx[0]] if all(a.name in n for n in names))
        fits = []
        for i in idx:
            fixed = next((f for a, f in chains[i] if host is not None and a.name == host.name), None)
            own = set(specs[i].algorithm_names)
            loop_axes = tuple(n for n in specs[i].names if n not in own)
            if fixed is not None and not own & set(fixed) and own | set(fixed) == set(host.names):
                fits.append((i, fixed, loop_axes))
            else:
                out.append(Fused((i,), None, ({},)))
        if fits and all(f[2] == fits[0][2] for f in fits) and len(fits) > 1:
            out.append(Fused(tuple(f[0] for f in fits), host, tuple(f[1] for f in fits)))
        else:
            out += [Fused((f[0],), None, ({},)) for f in fits]
    return sorted(out, key=lambda m: m.sweeps[0])


def fuse_columns(grids: list[dict], fixed: tuple, dtype) -> dict:
    """One member's per-run input from its sweeps' (`grid_inputs`), runs side
    by side in sweep order, a held hyperparameter a column of its value."""
    names = dict.fromkeys(n for g in grids for n in g)  # (`fusion` checked that each is a column or held)
    return {name: jnp.concatenate([g[name] if name in g else jnp.full(g[SEED_INDEX].shape, f[name], dtype)
                                   for g, f in zip(grids, fixed)]) for name in names}


def unfuse(out: dict, grids: list[dict], specs: list[ControlSpec]) -> list[dict]:
    """A member's outputs back per sweep (`fuse_columns`'s order); omega only
    for a sweep whose own algorithm has one."""
    parts, start = [], 0
    for g, spec in zip(grids, specs):
        n = g[SEED_INDEX].shape[0]
        part = {k: v[start:start + n] for k, v in out.items()}
        if "omega" in part and not has_omega(spec):
            del part["omega"]
        parts.append(part)
        start += n
    return parts


def has_omega(spec: ControlSpec) -> bool:
    """Whether the sweep's learner has an omega (or rbar) that `outputs` reports."""
    shapes = jax.eval_shape(spec.algorithm_def.init, jax.ShapeDtypeStruct((1,), jnp.dtype(spec.dtype)))
    return any(hasattr(shapes, n) for n in REPORTED)


def shared(specs: list[ControlSpec], axes: dict | None = None) -> Shared:
    """The `Shared` of sweeps that may run as one program: the first's task (at
    the task-axis values `axes`, where it has task axes) and sizes."""
    spec = specs[0]
    task = spec.make_task(axes)
    K = spec.block_steps
    steps = spec.max_steps if spec.max_steps is not None else spec.episodes * spec.cap_of(task)
    return Shared(task, jnp.dtype(spec.dtype), task.num_features, spec.seeds, spec.episodes, K,
                  -(-steps // K), spec.divergence_bound, spec.seed_offset)


def run_ok(learner, ls, axes, bound: float) -> jax.Array:
    """(R,) True where the run looks bounded (`engine.divergence.run_ok`): its
    scalar state (omega) and the action values of its current state, under every
    weight-like vector of the learner (w, and u where there is one), are finite
    and within the bound. Divergence of linear TD methods shows in the values
    they bootstrap from; an O(A m) check per block keeps the cost independent of
    the number of features (a full scan of 234,375 Acrobot weights per block
    cost more than the steps)."""
    return divergence.run_ok(learner, bound, axes, view=lambda x: jax.vmap(q_values)(x, ls.active), batch=1)


def live(sh: Shared, carry) -> jax.Array:
    """Whether a member's carry has a run that is neither frozen nor finished."""
    _, ls, _, dstep = carry
    return jnp.any((dstep < 0) & (ls.episodes < sh.episodes))


def member_block(sh: Shared, m: Member, cols: dict, run_keys, j, carry):
    """Block j of `sh.block` steps of every run of member `m` (`j` a scalar, or
    (R,) each run's own block: a search's); a run that left
    the bound during the block goes back to the block's start and stays there,
    flagged with the block's last step (with `m.branches` "cond" the select
    over every state runs only when some run needs it). The log is not
    reverted (keeping its block-start copy cost a copy of every run's whole
    log per block): a reverted run's episode count goes back, and `outputs`
    clears the entries past it."""
    K = sh.block
    learner, ls, log, dstep = carry
    per_run = jnp.ndim(j) > 0  # a search's runs each at its own block (`search_stages`)

    def one(c, i):
        keys_t = jax.vmap(jax.random.fold_in, in_axes=(0, 0 if per_run else None))(run_keys, j * K + i)
        return m.step_all(c, keys_t, cols), None

    (nl, nls, nlog), _ = jax.lax.scan(one, (learner, ls, log), jnp.arange(K, dtype=jnp.int32))
    alive = dstep < 0
    keep = alive & run_ok(nl, nls, m.axes, sh.bound)

    def revert():
        return divergence.revert(keep, nl, learner, m.axes), divergence.revert(keep, nls, ls)

    learner, ls = divergence.skippable(m.branches == "cond", jnp.any(keep != alive), revert, (nl, nls))
    return learner, ls, nlog, divergence.flag(dstep, alive, keep, (j + 1) * K)


def init_member(sh: Shared, m: Member, init_keys, seed_index, cols: dict) -> tuple:
    """A member's first carry over its runs (`seed_index`: each run's seed;
    `cols`: its grid columns): every run reset with its seed's key, the
    learner at its algorithm's init from zero weights, empty logs, nothing
    diverged."""
    R = seed_index.shape[0]
    ls = jax.vmap(lambda k, c: loop.loop_init(m.task_of(c), k, sh.dtype))(init_keys[seed_index], cols)
    st0 = m.alg.init(jnp.zeros((sh.d,), sh.dtype))
    learner = jax.tree_util.tree_map(lambda x, a: x if a is None else jnp.broadcast_to(x, (R,) + x.shape),
                                     st0, m.axes)
    log = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (R,) + x.shape), loop.log_init(sh.episodes, sh.dtype))
    return learner, ls, log, jnp.full((R,), -1, jnp.int32)


def outputs(carry, axes, keep_state: bool) -> dict:
    """A member's outputs from its last carry, one entry per run: the logs
    (entries past a run's episode count, which a revert leaves behind,
    cleared), the divergence steps, omega (or rbar) where the learner has one,
    and with `keep_state` the learner states."""
    learner, ls, log, dstep = carry
    logged = jax.lax.broadcasted_iota(jnp.int32, log.lengths.shape, 1) < ls.episodes[:, None]
    out = {"returns": jnp.where(logged, log.returns, 0), "lengths": jnp.where(logged, log.lengths, 0),
           "diverged_step": dstep}
    if keep_state:  # a shared leaf (the update counter) repeated per run, so every output has the run axis
        out["state"] = jax.tree_util.tree_map(
            lambda x, a: x if a is not None else jnp.broadcast_to(x, dstep.shape + x.shape), learner, axes)
    for name in REPORTED:
        if hasattr(learner, name):
            out["omega"] = getattr(learner, name)
    return out


def by_point(out: dict, points: int, seeds: int, axes) -> dict:
    """A member's per-run outputs (padded runs first dropped) as (points, seeds, ...)."""
    shape = lambda x: x[: points * seeds].reshape((points, seeds) + x.shape[1:])
    res = {k: shape(v) for k, v in out.items() if k != "state"}
    if "state" in out:
        res["state"] = jax.tree_util.tree_map(lambda x, a: x[0] if a is None else shape(x), out["state"], axes)
    return res


def runs(sh: Shared, members: list[Member], keep_state: bool, seed, grids: tuple) -> tuple:
    """Every run of every member (grids: one dict of per-run columns per member,
    `grid_inputs`), block by block while some member has a live run (and steps
    remain)."""
    # Keys of the fused threefry (`bec_jax.threefry.IMPL`): the same numbers as
    # threefry keys, drawn as fused arithmetic also inside a task's own code.
    keys = threefry.fused(per_seed_keys(seed, sh.seeds, sh.seed_offset))
    init_keys, stream_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
    cols = [{n: v for n, v in g.items() if n != SEED_INDEX} for g in grids]
    run_keys = [stream_keys[g[SEED_INDEX]] for g in grids]
    carries = tuple(init_member(sh, m, init_keys, g[SEED_INDEX], c) for m, g, c in zip(members, grids, cols))

    def more(state):
        j, cs = state
        return (j < sh.max_blocks) & jnp.any(jnp.stack([live(sh, c) for c in cs]))

    def block(state):
        j, cs = state
        if len(members) == 1:  # one member: live whenever the loop runs
            cs = (member_block(sh, members[0], cols[0], run_keys[0], j, cs[0]),)
        else:
            cs = tuple(jax.lax.cond(live(sh, c), partial(member_block, sh, m, cc, rk, j), lambda c: c, c)
                       for m, cc, rk, c in zip(members, cols, run_keys, cs))
        return j + 1, cs

    _, carries = jax.lax.while_loop(more, block, (jnp.int32(0), carries))
    return tuple(outputs(c, m.axes, keep_state) for c, m in zip(carries, members))



# -- successive halving (`engine.search`) ------------------------------------------
# A search's rungs end at steps of the runs' step budget: rung r runs its
# points' runs up to block ends[r] (a run that has finished its episodes
# stops), the last rung until their ends, as the full grid's loop runs every
# run until it has finished its episodes. Its runs are this module's member
# and block, a batch of runs at a time, each run at its own block (its steps'
# keys are its own), so a survivor's episodes are the full grid's, bit for bit.

def search_lanes(spec: ControlSpec, seed, grid: dict) -> tuple:
    """(G, lanes): every run's inputs for a search, one flat batch of G N runs,
    point-major (`grid_inputs`' order): its seed's initial-state and stream
    keys (`runs`' keys) and its grid columns."""
    N = spec.seeds
    keys = threefry.fused(per_seed_keys(seed, N, spec.seed_offset))
    init_keys, stream_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
    seed_index = grid[SEED_INDEX]
    cols = {n: v for n, v in grid.items() if n != SEED_INDEX}
    return seed_index.shape[0] // N, (init_keys[seed_index], stream_keys[seed_index], cols)


def finished_by(lengths: jax.Array, steps) -> jax.Array:
    """(..., E) True for the episodes a run had finished within its first
    `steps` steps (episodes follow each other: episode k ends at the sum of
    the first k lengths)."""
    return (lengths > 0) & (jnp.cumsum(lengths, axis=-1) <= steps)


def search_score(spec: ControlSpec) -> Callable:
    """The search's score hook (`engine.search.Stages.score`): from every run's
    episodes and divergence {returns, lengths: (points, seeds, E),
    diverged_step: (points, seeds)} and `valid` (blocks,), the blocks run so
    far, each point's mean over its seeds of each run's mean return per
    episode over the episodes it finished within those steps (the search's
    metric "return"), or of its steps per episode negated ("length": fewer is
    better); -inf for a point with a run that finished none, or whose weights
    left the bound within them (`ControlResult.auc` never picks such a point)."""
    metric, K = spec.search["metric"], spec.block_steps

    def fn(logs: dict, valid: jax.Array):
        steps = valid.sum() * K
        by = finished_by(logs["lengths"], steps)
        n = by.sum(-1)
        if metric == "return":
            per_run = jnp.where(by, logs["returns"], 0).sum(-1) / n
        else:
            per_run = -(jnp.where(by, logs["lengths"], 0).sum(-1) / n)
        dstep = logs["diverged_step"]
        bad = ((n == 0) | ((dstep >= 0) & (dstep <= steps))).any(-1)
        return jnp.where(bad, -jnp.inf, per_run.mean(-1))

    return fn


def search_stages(spec: ControlSpec, task, batch: int, branches: str = "cond"):
    """This front's `engine.search.Stages`, batched (each hook takes a batch
    of `batch` runs) and run to a rung's end (`more`): start: `init_member`'s
    carry and each run's block, 0; advance: one block of `member_block`, each
    run at its own block, a run at its step budget (`Shared.max_blocks`) held
    where it is; more: whether a run is before the rung's end block, has not
    finished its episodes and has not diverged; finish: `outputs` (returns,
    lengths, diverged_step, omega); score: `search_score`. The update counter
    is per run (`member`'s shared_counter False)."""
    from bec_jax.engine import search

    sh = shared([spec])
    m = member(spec, task, None, branches, shared_counter=False)

    def start(lanes):
        init_keys, _, cols = lanes
        R = init_keys.shape[0]
        return (*init_member(sh, m, init_keys, jnp.arange(R), cols), jnp.zeros((R,), jnp.int32))

    def advance(carry, lanes, j0, n: int):
        _, stream_keys, cols = lanes
        state, j = tuple(carry[:4]), carry[4]
        for _ in range(n):
            new = member_block(sh, m, cols, stream_keys, j, state)
            stuck = j >= sh.max_blocks  # the full grid's loop ends there: such a run waits, unchanged
            state = divergence.skippable(m.branches == "cond", jnp.any(stuck),
                                         lambda: divergence.revert(~stuck, new, state), new)
            j = j + (~stuck).astype(jnp.int32)
        return (*state, j), {}

    def more(carry, lanes, end):
        _, ls, _, dstep, j = carry
        return (dstep < 0) & (ls.episodes < sh.episodes) & (j < end)

    def finish(carry, lanes):
        return outputs(tuple(carry[:4]), m.axes, False)

    return search.Stages(start=start, advance=advance, finish=finish, score=search_score(spec), batch=batch,
                         batched=True, more=more)


def search_batch(spec: ControlSpec) -> int:
    """Runs a search advances together: the last rung's (its points x seeds),
    so that later rungs cost what they run (a run's bits do not depend on
    its batch; a batch waits for its slowest run)."""
    return spec.search_schedule().points[-1] * spec.seeds


def searched(spec: ControlSpec, seed, grid: dict, task=None, branches: str = "cond") -> dict:
    """The spec's search over every point of the grid (`grid`: `grid_inputs`
    of all of them): `engine.search.halving` on `search_stages`, rungs ending
    at blocks of the step budget. {returns, lengths: (G, N, E),
    diverged_step, omega: (G, N)} as the full grid's program gives them; a
    point stopped early keeps the episodes its runs finished by its last
    rung's end (returns NaN and lengths 0 after them, omega NaN,
    diverged_step -1 unless its run diverged by then); plus "stopped_rung"
    (G,), "rung_scores" (G, rungs) and "units_run" (G, N), the blocks each
    run was advanced while its point ran (the search's work)."""
    from bec_jax.engine import search

    task = task if task is not None else spec.make_task()
    G, lanes = search_lanes(spec, seed, grid)
    sched = spec.search_schedule()
    out = search.halving(search_stages(spec, task, search_batch(spec), branches), lanes, G, spec.seeds,
                         sched.ends[-1], sched)
    stopped = out["stopped_rung"]
    survived = (stopped == sched.rungs - 1)[:, None]
    steps = (jnp.asarray(sched.ends, jnp.int32) * spec.block_steps)[stopped][:, None]  # (G, 1) each point's last
    kept = finished_by(out["lengths"], steps[..., None]) | survived[..., None]
    out["returns"] = jnp.where(kept, out["returns"], jnp.nan)
    out["lengths"] = jnp.where(kept, out["lengths"], 0)
    out["diverged_step"] = jnp.where(survived | (out["diverged_step"] <= steps), out["diverged_step"], -1)
    if "omega" in out:
        out["omega"] = jnp.where(survived, out["omega"], jnp.nan)
    return out


def make_search_program(spec: ControlSpec, group=None, devices=None, branches: str | None = None) -> Program:
    """The program (`engine.programs.Program`) of the spec's search: `fn(seed,
    grid)` with `grid` the `grid_inputs` of every grid point, returning
    `searched`'s outputs; one device, every point in one call."""
    devices = list(devices) if devices is not None else jax.devices()
    branches = branches or tuning.branches_for(devices[0].platform)
    task = spec.make_task()

    def program(seed, grid):  # the name XLA's module gets
        return searched(spec, seed, grid, task, branches)

    return Program(spec=spec, group=group, fn=jax.jit(program), chunk=spec.num_points, mesh=None)


def make_program(specs: list[ControlSpec], sizes: list[int], devices=None, keep_state: bool = False,
                 group=None, fuse: bool = True, branches: str | None = None) -> Program:
    """The program (`engine.programs.Program`) of sweeps that share a task, seeds
    and loop (`sizes`: each one's grid points per call). `fn(seed, grids)` takes
    one dict of per-run inputs (`grid_inputs`) per sweep and returns one dict of
    outputs per sweep, (points, seeds, ...). On several devices the runs are
    split among them (`shard_map` over the run axis: every member's runs, so a
    sweep of one point and many seeds uses every device too). One sweep (one
    size) gives a plain dict in and out; `group`: the record's
    (`engine.plan.Group`); `fuse`:
    the cases of one algorithm as one member (`fusion`), else a member per
    sweep; `branches`: the members' resets and reverts as conditionals or
    selects (`Member.branches`; None: the devices' platform's,
    `tuning.branches_for`)."""
    sh = shared(specs, dict(group.static) if group is not None and group.static else None)
    plan = fusion(specs, keep_state or not fuse)
    devices = list(devices) if devices is not None else jax.devices()
    branches = branches or tuning.branches_for(devices[0].platform)
    members = [member(specs[f.sweeps[0]], sh.task, f.host, branches) for f in plan]
    single = len(specs) == 1

    def per_device(seed, grids):
        fused = [grids[f.sweeps[0]] if f.host is None else
                 fuse_columns([grids[i] for i in f.sweeps], f.fixed, sh.dtype) for f in plan]
        outs, back = runs(sh, members, keep_state, seed, fused), [None] * len(specs)
        for f, o in zip(plan, outs):
            parts = [o] if f.host is None else unfuse(o, [grids[i] for i in f.sweeps], [specs[i] for i in f.sweeps])
            for i, part in zip(f.sweeps, parts):
                back[i] = part
        return tuple(back)

    mesh = None if len(devices) <= 1 else Mesh(np.array(devices), (GRID_AXIS,))
    if mesh is not None:
        axis = PartitionSpec(GRID_AXIS)
        per_device = jax.shard_map(per_device, mesh=mesh, in_specs=(PartitionSpec(), axis), out_specs=axis,
                                   check_vma=False)

    def program(seed, grids):  # the name XLA's module gets
        outs = per_device(seed, (grids,) if single else tuple(grids))
        axes = [members[next(j for j, f in enumerate(plan) if i in f.sweeps)].axes for i in range(len(specs))]
        outs = tuple(by_point(o, n, sh.seeds, a) for o, n, a in zip(outs, sizes, axes))
        return outs[0] if single else outs

    return Program(spec=specs[0], group=group, fn=jax.jit(program), chunk=sum(sizes), mesh=mesh)


__all__ = ["REPORTED", "SEED_INDEX", "Fused", "Member", "Shared", "behaviour_columns", "by_point", "cases",
           "fuse_columns", "fusion", "grid_inputs", "has_omega", "init_member", "live", "make_program",
           "make_search_program", "member", "member_block", "outputs", "run_ok", "runs", "search_batch",
           "finished_by", "search_lanes", "search_score", "search_stages", "searched", "shared", "unfuse"]
