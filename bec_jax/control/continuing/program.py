"""The continuing control program: every (grid point, seed) run of a
continuing sweep for its T steps as one compiled XLA program.

    program(seed, grid) = jit(over the grid's devices(
        over the chunk's G N runs (grid point-major), vmap over batches of
        at most BATCH_RUNS of them, in turn (lax.map), of
            scan over L log blocks (
                scan over K steps (
                    epsilon-greedy act on Q(features(s)), ties broken at random,
                    s', r = task.step(s, a),
                    update the learner on (phi(s, a), r + offset, gamma, phi(s', .)))
                log the block's summed reward, the learner's reward-rate
                estimate and max |w|))))

No run ever finishes early (a continuing task has no episodes), so there is
no loop to wait on: every run does exactly T steps. The hyperparameters and
the loop's settings (epsilon, gamma, reward offset, initial values) are
traced columns of the grid input, so the whole grid is one program.

Randomness, per run: seed i's key is fold_in(key(seed), seed_offset + i)
(`engine.streams.per_seed_keys`), split into an initial-state key and a
stream key; step t's key is fold_in(stream key, t): the action's two uniforms
are its words (`control.loop.uniforms`) and the task's key is fold_in(step
key, 1). A run's trajectory thus depends on its seed and its own grid point
only, never on the grid, the chunking or the devices.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax import networks, replay, threefry
from bec_jax.control.continuing import deep, learners
from bec_jax.control.continuing.env import observation
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.control.loop import uniforms
from bec_jax.control.transition import ControlTransition, q_values
from bec_jax.engine.programs import Program, grid_mesh, jit_over_grid
from bec_jax.engine.streams import per_seed_keys

# The learner state fields read as its reward-rate estimate where the learner
# registry names none (a user's learner): reward centering's rbar, CQ's omega.
RATE_FIELDS = ("rbar", "omega")
OUTPUTS = ("reward_sum", "rate_estimate", "max_abs_w")  # (G, N, L) each; tabular tasks add "q_table"
# Runs a device steps together (`batch_runs`). XLA:CPU runs a step of the batch
# as a few dozen kernels, each over the whole batch; past a few thousand runs
# the batch's arrays and weights no longer stay in the core's cache between
# them. On Access-Control's full grid (84,000 runs, one device) a run-step took
# 80 ns of CPU in one batch of all, 49 ns in batches of 1,600, 56 ns of 800
# (benchmarks/README.md, "Continuing control").
BATCH_RUNS = 1600
# Network learners' runs a step vectorises over at once on a CPU (`deep_batch`):
# XLA:CPU runs a product batched over runs (each run its own weights) as a loop
# of single-threaded products, while one run's product uses every core. A run
# whose update passes at least CPU_SOLO_ROWS rows runs alone (its products
# unbatched, in turn with the others: measured in benchmarks/README.md); smaller
# updates are batched CPU_LANE_ROWS / rows runs at a time. Elsewhere (a GPU,
# whose batched products are one kernel) every run of a call at once.
CPU_SOLO_ROWS = 1024
CPU_LANE_ROWS = 4096
DEEP_BATCH_RUNS = 1_000_000


def epsilon_greedy(u: jax.Array, q: jax.Array, epsilon) -> jax.Array:
    """The action for Q(s, .) = q (A,) from two uniforms u (2,): with
    probability epsilon uniform over all A actions, else a greedy action,
    uniformly among ties (Naik et al.'s agents break ties at random; a fixed
    lowest-index rule would bias tabular runs whose values start equal).
    Values that are not finite make every action a tie."""
    A = q.shape[-1]
    best = q == jnp.max(q)
    best = jnp.where(jnp.any(best), best, True)  # NaN values: no maximum, so all tie
    n = best.sum()
    k = jnp.minimum((u[1] * n).astype(jnp.int32), n - 1)
    greedy = jnp.argmax(jnp.cumsum(best) > k).astype(jnp.int32)  # the k-th tied action
    random_action = jnp.minimum((u[1] * A).astype(jnp.int32), A - 1)
    return jnp.where(u[0] < epsilon, random_action, greedy)


def initial_weights(task, q0, dtype) -> jax.Array:
    """The weight vector whose action values are all q0: q0 / m on every
    weight of a task with m active (sparse) features; zeros for dense ones
    (the spec refuses q0 != 0 there)."""
    if task.num_active > 0:
        return jnp.full((task.num_features,), q0 / task.num_active, dtype)
    return jnp.zeros((task.num_features,), dtype)


def rate_field(alg, template) -> str | None:
    """The field of a learner state holding its reward-rate estimate
    (`learners.rate_field`; for a learner not registered there the first of
    `RATE_FIELDS` its state has), or None."""
    if alg.name in learners.names() and learners.get(alg.name) is alg:
        return learners.rate_field(alg)
    return next((n for n in RATE_FIELDS if hasattr(template, n)), None)


def linear_stages(spec: ContinuingSpec, task=None) -> tuple:
    """(start, advance, finish) of one run of a linear learner, its lane
    `(init_key, stream_key, cols)` (the grid point's columns, scalars):
    start -> carry (learner, task state, features); advance(carry, lane, j0,
    n) runs log blocks j0 .. j0 + n - 1 (K steps each) and logs per block the
    sum of the task's rewards (the offset not included; summed in order, and
    divided by K on the host, `sweep.assemble`: XLA may turn a division by a
    constant into a multiplication, which rounds otherwise), the learner's
    reward-rate estimate at the block's end (NaN if it has none) and the
    largest |w| then; finish -> a tabular task's final Q table (S, A). A
    step's randomness comes from its global step t (module docstring), so the
    stages of a run compute what `make_run` does, split anywhere."""
    task = task if task is not None else spec.make_task()
    alg = spec.algorithm_def
    dtype = jnp.dtype(spec.dtype)
    K = spec.block_steps
    template = jax.eval_shape(alg.init, jax.ShapeDtypeStruct((task.num_features,), dtype))
    if not hasattr(template, alg.weights):
        raise ValueError(f"algorithm: {alg.name} declares weights {alg.weights!r}, but its state has no such field")
    rate = rate_field(alg, template)
    S, A = task.num_states, task.num_actions

    def start(lane):
        init_key, _, cols = lane
        env = task.reset(init_key)
        return alg.init(initial_weights(task, cols["q0"], dtype)), env, task.features(env)

    def advance(carry, lane, j0: int, n: int):
        _, stream_key, cols = lane
        hp = {n_: cols[n_] for n_ in alg.names}
        g = jnp.asarray(cols["gamma"], dtype)
        offset = jnp.asarray(cols["reward_offset"], dtype)

        def step(c, t):
            learner, env, active, total = c
            key = jax.random.fold_in(stream_key, t)
            w = getattr(learner, alg.weights)
            a = epsilon_greedy(uniforms(key), q_values(w, active), cols["epsilon"])
            env, r = task.step(threefry.fold_in(key, 1), env, a)
            nxt = task.features(env)
            r = jnp.asarray(r, dtype)
            tr = ControlTransition(active=active[a], reward=r + offset, discount=g, gamma=g, next_active=nxt)
            return (alg.apply(learner, tr, hp), env, nxt, total + r), None

        def block(c, j):
            learner, env, active = c
            ts = j * K + jnp.arange(K, dtype=jnp.uint32)
            (learner, env, active, total), _ = jax.lax.scan(step, (learner, env, active, jnp.zeros((), dtype)), ts)
            w = getattr(learner, alg.weights)
            est = getattr(learner, rate).astype(dtype) if rate is not None else jnp.full((), jnp.nan, dtype)
            return (learner, env, active), (total, est, jnp.max(jnp.abs(w)))

        carry, (reward, est, big) = jax.lax.scan(block, carry, j0 + jnp.arange(n, dtype=jnp.uint32))
        return carry, {"reward_sum": reward, "rate_estimate": est, "max_abs_w": big}

    def finish(carry, lane):
        if S == 0:
            return {}
        # tabular: one-hot feature a * S + s (`continuing.tabular`), so Q[s, a] = w[a S + s]
        return {"q_table": getattr(carry[0], alg.weights).reshape(A, S).T}

    return start, advance, finish


def deep_stages(spec: ContinuingSpec, task=None) -> tuple:
    """(start, advance, finish) of one run of a network learner
    (`continuing.deep`), as `linear_stages`: advance runs its blocks as a scan
    over their update periods (P = update_period steps), each an inner scan
    of P steps (act on q(s, .), step the task, add the transition to the
    replay ring) and then one update, so no step branches on the clock; j0 K
    and n K must be whole periods. The logs are the linear learners', per
    block of K steps: the block's summed reward (each step adds its reward to
    its block's slot, so a block need not hold whole periods), rbar after the
    block's last update (NaN for dqn) and the largest |weight| of the network
    then (NaN once it diverged).

    Randomness: the task's reset and the actions as a linear learner's
    (step t's key fold_in(stream key, t)); the network from fold_in(init key,
    1); update u's batch from fold_in(fold_in(init key, 2), u). A run thus
    depends on its seed and grid point only."""
    task = task if task is not None else spec.make_task()
    alg, st = spec.algorithm_def, spec.settings
    dtype = jnp.dtype(spec.dtype)
    K, P = spec.block_steps, st.update_period
    _, observe = observation(task)

    def start(lane):
        init_key, _, cols = lane
        env = task.reset(init_key)
        obs = observe(env).astype(dtype)
        return deep.init(jax.random.fold_in(init_key, 1), st, obs, jnp.asarray(cols["alpha"], dtype), dtype), env, obs

    def advance(carry, lane, j0: int, n: int):
        init_key, stream_key, cols = lane
        if (n * K) % P or (isinstance(j0, int) and (j0 * K) % P):
            raise ValueError(f"stages: log blocks {j0}..{j0} + {n} are not whole update periods of {P} steps")
        g = jnp.asarray(cols["gamma"], dtype)
        offset = jnp.asarray(cols["reward_offset"], dtype)
        alpha = jnp.asarray(cols["alpha"], dtype)
        eta = jnp.asarray(cols["eta"], dtype) if "eta" in cols else jnp.zeros((), dtype)
        update_key = jax.random.fold_in(init_key, 2)
        logs = (jnp.zeros((n,), dtype), jnp.full((n,), jnp.nan, dtype), jnp.full((n,), jnp.nan, dtype))
        base = jnp.asarray(j0 * K, jnp.uint32)

        def step(c, t):
            learner, env, obs, reward = c
            key = jax.random.fold_in(stream_key, t)
            a = epsilon_greedy(uniforms(key), deep.q_values(st, learner.params, obs), cols["epsilon"])
            env, r = task.step(threefry.fold_in(key, 1), env, a)
            nxt = observe(env).astype(dtype)
            r = jnp.asarray(r, dtype)
            learner = learner._replace(replay=replay.replay_add(learner.replay, a, r + offset, nxt))
            return (learner, env, nxt, reward.at[(t - base) // K].add(r)), None

        def period(c, u):
            learner, env, obs, (reward, est, big) = c
            ts = u * P + jnp.arange(P, dtype=jnp.uint32)
            (learner, env, obs, reward), _ = jax.lax.scan(step, (learner, env, obs, reward), ts)
            learner = deep.update(alg, st, learner, jax.random.fold_in(update_key, u), alpha, eta, g,
                                  deep.synced(st, u + 1))  # the clock's, not a run's: a branch, not a select
            block = ((u + 1) * P - 1 - base) // K
            rbar = learner.rate.rbar if alg.centering is not None else jnp.full((), jnp.nan, dtype)
            est = est.at[block].set(rbar.astype(dtype))
            big = big.at[block].set(networks.max_abs(learner.params).astype(dtype))
            return (learner, env, obs, (reward, est, big)), None

        u0 = jnp.asarray(j0 * K // P, jnp.uint32)
        (learner, env, obs, (reward, est, big)), _ = jax.lax.scan(
            period, (*carry, logs), u0 + jnp.arange(n * K // P, dtype=jnp.uint32))
        return (learner, env, obs), {"reward_sum": reward, "rate_estimate": est, "max_abs_w": big}

    def finish(carry, lane):
        return {}

    return start, advance, finish


def stages(spec: ContinuingSpec, task=None) -> tuple:
    """(start, advance, finish) of one run of the spec's learner
    (`linear_stages` or `deep_stages`)."""
    return (deep_stages if deep.is_deep(spec.algorithm_def) else linear_stages)(spec, task)


def make_run(spec: ContinuingSpec, task=None):
    """run(init_key, stream_key, cols) -> {output: array} of one run: its
    stages (`stages`) over all L log blocks, (L,) logs each and a tabular
    task's final Q table (S, A)."""
    start, advance, finish = stages(spec, task)
    L = spec.num_blocks

    def run(init_key, stream_key, cols):
        lane = (init_key, stream_key, cols)
        carry, out = advance(start(lane), lane, 0, L)
        return {**out, **finish(carry, lane)}

    return run


def grid_inputs(spec: ContinuingSpec, indices: np.ndarray) -> dict:
    """The program's input for the grid points `indices`: each grid column
    (`ContinuingSpec.names`) as a (chunk,) array in the spec's dtype."""
    columns = spec.grid_arrays()
    return {n: columns[n][np.asarray(indices)].astype(spec.dtype) for n in spec.names}


def batch_runs(total: int, target: int | None = None) -> int:
    """Runs a step of the program vectorises over at once: all `total` runs
    where they are at most `target` (default `BATCH_RUNS`), else a divisor of
    `total` in [target / 2, target] (so `lax.map` needs no second program for
    a remainder), else `target`."""
    target = BATCH_RUNS if target is None else target
    if total <= target:
        return total
    for n in range(-(-total // target), 2 * (-(-total // target)) + 1):
        if total % n == 0:
            return total // n
    return target


def deep_batch(spec: ContinuingSpec, platform: str = "cpu") -> int | None:
    """Runs of a network learner a step vectorises over at once on `platform`
    (None: a linear learner, `BATCH_RUNS`): on a CPU 1 for an update of
    `CPU_SOLO_ROWS` rows or more, else `CPU_LANE_ROWS` // rows; elsewhere
    `DEEP_BATCH_RUNS` (all)."""
    if not deep.is_deep(spec.algorithm_def):
        return None
    if platform != "cpu":
        return DEEP_BATCH_RUNS
    rows = spec.settings.rows
    return 1 if rows >= CPU_SOLO_ROWS else max(1, CPU_LANE_ROWS // rows)


def lanes(spec: ContinuingSpec, seed, grid: dict) -> tuple:
    """(G, lanes): every run's inputs `(init_key, stream_key, cols)`, one flat
    batch of G N runs, grid point-major (gathers and scatters with one batch
    axis compile to simpler loops on the CPU than with two, as in
    `control.program`)."""
    N = spec.seeds
    G = next(iter(grid.values())).shape[0]
    keys = threefry.fused(per_seed_keys(seed, N, spec.seed_offset))
    init_keys, stream_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
    seed_index = jnp.tile(jnp.arange(N), G)
    cols = {n: jnp.repeat(v, N) for n, v in grid.items()}
    return G, (init_keys[seed_index], stream_keys[seed_index], cols)


def runs(spec: ContinuingSpec, seed, grid: dict, task=None, platform: str = "cpu") -> dict:
    """Every run of the grid points in `grid` (a dict of (G,) columns) for the
    spec's seeds: {output: (G, N, ...)} (`lanes`)."""
    N = spec.seeds
    G, xs = lanes(spec, seed, grid)
    if deep.is_deep(spec.algorithm_def):
        # A network learner's whole runs are a search of one rung (`engine.search.halving`): the loops a
        # search runs, so that a search's survivors keep the bits of the full grid's runs (XLA:CPU may round
        # a network's reductions over its batch otherwise in another loop structure).
        from bec_jax.engine import search
        st = search_stages(spec, task, batch_runs(G * N, deep_batch(spec, platform)))
        out = search.halving(st, xs, G, N, spec.num_blocks, search.Schedule(ends=(spec.num_blocks,), points=(G,)))
        return {k: v for k, v in out.items() if k not in ("stopped_rung", "rung_scores")}
    run = make_run(spec, task)
    batch = batch_runs(G * N, deep_batch(spec, platform))
    if batch >= G * N:
        out = jax.vmap(run)(*xs)
    else:  # the runs in turn, `batch` at a time (a scan over vmapped batches; each run's bits are the same)
        out = jax.lax.map(lambda x: run(*x), xs, batch_size=batch)
    return {k: v.reshape((G, N) + v.shape[1:]) for k, v in out.items()}


def score(spec: ContinuingSpec):
    """The search's score hook (`engine.search.Stages.score`): each point's
    reward rate over the log blocks run so far (`valid`), the mean over its
    seeds; -inf for a point with a run whose weights stopped being finite
    (diverged)."""

    K = spec.block_steps

    def fn(logs: dict, valid: jax.Array):
        rate = jnp.where(valid, logs["reward_sum"], 0).sum(-1) / (valid.sum() * K)
        bad = ~jnp.where(valid, jnp.isfinite(logs["max_abs_w"]), True).all(axis=(1, 2))
        return jnp.where(bad, -jnp.inf, rate.mean(-1))

    return fn


def search_stages(spec: ContinuingSpec, task, batch: int):
    """This front's `engine.search.Stages`: its runs' stages (`stages`), its
    score (`score`), `batch` runs at a time, in the spec's `search_unit`s."""
    from bec_jax.engine import search

    start, advance, finish = stages(spec, task)
    return search.Stages(start=start, advance=advance, finish=finish, score=score(spec), batch=batch,
                         unit=spec.search_unit())


def searched(spec: ContinuingSpec, seed, grid: dict, task=None, platform: str = "cpu") -> dict:
    """The spec's search over the grid points of `grid` (every point of the
    grid, in one call): `engine.search.halving` on this front's stages and
    score; {output: (G, N, ...)} as `runs`, NaN where a point stopped, plus
    "stopped_rung" (G,) and "rung_scores" (G, rungs)."""
    from bec_jax.engine import search

    N = spec.seeds
    G, xs = lanes(spec, seed, grid)
    batch = batch_runs(G * N, deep_batch(spec, platform))
    sched = spec.search_schedule()
    if not deep.is_deep(spec.algorithm_def):
        # A linear run's bits do not depend on its batch (tests/test_continuing_sweep.py): a batch of the
        # last rung's runs, so that later rungs cost what they run. A network learner's runs keep the
        # whole-run program's batch (`runs`: a one-rung search of it), whose bits its survivors keep.
        batch = min(batch, sched.points[-1] * N)
    return search.halving(search_stages(spec, task, batch), xs, G, N, spec.num_blocks, sched)


def make_program(spec: ContinuingSpec, group=None, chunk: int = 1, devices=None) -> Program:
    """The program (`engine.programs.Program`) for chunks of `chunk` grid
    points: `fn(seed, grid)` with `grid` from `grid_inputs`, returning
    {output: (chunk, N, ...)} (`runs`, or a search's `searched`); on several
    devices the chunk's points are split among them
    (`engine.programs.jit_over_grid`)."""
    task = spec.make_task()
    mesh = grid_mesh(devices, chunk)
    platform = (list(devices) if devices is not None else jax.devices())[0].platform

    def program(seed, grid):  # the name XLA's module gets
        return (searched if spec.search else runs)(spec, seed, grid, task, platform)

    return Program(spec=spec, group=group, fn=jit_over_grid(program, mesh), chunk=chunk, mesh=mesh)


__all__ = ["BATCH_RUNS", "CPU_LANE_ROWS", "CPU_SOLO_ROWS", "DEEP_BATCH_RUNS", "OUTPUTS", "RATE_FIELDS", "batch_runs", "deep_batch", "epsilon_greedy",
           "deep_stages", "grid_inputs", "initial_weights", "lanes", "score", "search_stages", "searched", "linear_stages", "make_program", "make_run", "rate_field", "runs",
           "stages"]
