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


def make_run(spec: ContinuingSpec, task=None):
    """run(init_key, stream_key, cols) -> {output: array} of one run: its grid
    point's columns `cols` (scalars), its T steps in L blocks of K; per block
    (L,) the sum of the task's rewards (the offset not included; summed in
    order, and divided by K on the host, `sweep.assemble`: XLA may turn a
    division by a constant into a multiplication, which rounds otherwise), the learner's
    reward-rate estimate at the block's end (NaN if it has none) and the
    largest |w| then; for a tabular task also the final Q table (S, A)."""
    task = task if task is not None else spec.make_task()
    alg = spec.algorithm_def
    dtype = jnp.dtype(spec.dtype)
    K, L = spec.block_steps, spec.num_blocks
    template = jax.eval_shape(alg.init, jax.ShapeDtypeStruct((task.num_features,), dtype))
    if not hasattr(template, alg.weights):
        raise ValueError(f"algorithm: {alg.name} declares weights {alg.weights!r}, but its state has no such field")
    rate = rate_field(alg, template)
    S, A = task.num_states, task.num_actions

    def run(init_key, stream_key, cols):
        hp = {n: cols[n] for n in alg.names}
        g = jnp.asarray(cols["gamma"], dtype)
        offset = jnp.asarray(cols["reward_offset"], dtype)
        env = task.reset(init_key)
        learner = alg.init(initial_weights(task, cols["q0"], dtype))

        def step(carry, t):
            learner, env, active, total = carry
            key = jax.random.fold_in(stream_key, t)
            w = getattr(learner, alg.weights)
            a = epsilon_greedy(uniforms(key), q_values(w, active), cols["epsilon"])
            env, r = task.step(threefry.fold_in(key, 1), env, a)
            nxt = task.features(env)
            r = jnp.asarray(r, dtype)
            tr = ControlTransition(active=active[a], reward=r + offset, discount=g, gamma=g, next_active=nxt)
            return (alg.apply(learner, tr, hp), env, nxt, total + r), None

        def block(carry, j):
            learner, env, active = carry
            ts = j * K + jnp.arange(K, dtype=jnp.uint32)
            (learner, env, active, total), _ = jax.lax.scan(step, (learner, env, active, jnp.zeros((), dtype)), ts)
            w = getattr(learner, alg.weights)
            est = getattr(learner, rate).astype(dtype) if rate is not None else jnp.full((), jnp.nan, dtype)
            return (learner, env, active), (total, est, jnp.max(jnp.abs(w)))

        (learner, _, _), (reward, est, big) = jax.lax.scan(
            block, (learner, env, task.features(env)), jnp.arange(L, dtype=jnp.uint32))
        out = {"reward_sum": reward, "rate_estimate": est, "max_abs_w": big}
        if S > 0:  # tabular: one-hot feature a * S + s (`continuing.tabular`), so Q[s, a] = w[a S + s]
            out["q_table"] = getattr(learner, alg.weights).reshape(A, S).T
        return out

    return run


def make_deep_run(spec: ContinuingSpec, task=None):
    """run(init_key, stream_key, cols) -> {output: array} of one run of a
    network learner (`continuing.deep`): its T steps as a scan over the T /
    P update periods (P = update_period), each an inner scan of P steps
    (act on q(s, .), step the task, add the transition to the replay ring)
    and then one update, so no step branches on the clock. The logs are
    `make_run`'s, per block of K steps: the block's summed reward (each step
    adds its reward to its block's slot, so a block need not hold whole
    periods), rbar after the block's last update (NaN for dqn) and the
    largest |weight| of the network then (NaN once it diverged).

    Randomness: the task's reset and the actions as `make_run` draws them
    (step t's key fold_in(stream key, t)); the network from fold_in(init key,
    1); update u's batch from fold_in(fold_in(init key, 2), u). A run thus
    depends on its seed and grid point only."""
    task = task if task is not None else spec.make_task()
    alg, st = spec.algorithm_def, spec.settings
    dtype = jnp.dtype(spec.dtype)
    K, L, P = spec.block_steps, spec.num_blocks, st.update_period
    U = spec.steps // P
    _, observe = observation(task)

    def run(init_key, stream_key, cols):
        g = jnp.asarray(cols["gamma"], dtype)
        offset = jnp.asarray(cols["reward_offset"], dtype)
        alpha = jnp.asarray(cols["alpha"], dtype)
        eta = jnp.asarray(cols["eta"], dtype) if "eta" in cols else jnp.zeros((), dtype)
        env = task.reset(init_key)
        obs = observe(env).astype(dtype)
        learner = deep.init(jax.random.fold_in(init_key, 1), st, obs, alpha, dtype)
        update_key = jax.random.fold_in(init_key, 2)
        logs = (jnp.zeros((L,), dtype), jnp.full((L,), jnp.nan, dtype), jnp.full((L,), jnp.nan, dtype))

        def step(carry, t):
            learner, env, obs, reward = carry
            key = jax.random.fold_in(stream_key, t)
            a = epsilon_greedy(uniforms(key), deep.q_values(st, learner.params, obs), cols["epsilon"])
            env, r = task.step(threefry.fold_in(key, 1), env, a)
            nxt = observe(env).astype(dtype)
            r = jnp.asarray(r, dtype)
            learner = learner._replace(replay=replay.replay_add(learner.replay, a, r + offset, nxt))
            return (learner, env, nxt, reward.at[t // K].add(r)), None

        def period(carry, u):
            learner, env, obs, (reward, est, big) = carry
            ts = u * P + jnp.arange(P, dtype=jnp.uint32)
            (learner, env, obs, reward), _ = jax.lax.scan(step, (learner, env, obs, reward), ts)
            learner = deep.update(alg, st, learner, jax.random.fold_in(update_key, u), alpha, eta, g)
            block = ((u + 1) * P - 1) // K
            rbar = learner.rate.rbar if alg.centering is not None else jnp.full((), jnp.nan, dtype)
            est = est.at[block].set(rbar.astype(dtype))
            big = big.at[block].set(networks.max_abs(learner.params).astype(dtype))
            return (learner, env, obs, (reward, est, big)), None

        (_, _, _, (reward, est, big)), _ = jax.lax.scan(
            period, (learner, env, obs, logs), jnp.arange(U, dtype=jnp.uint32))
        return {"reward_sum": reward, "rate_estimate": est, "max_abs_w": big}

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


def runs(spec: ContinuingSpec, seed, grid: dict, task=None, platform: str = "cpu") -> dict:
    """Every run of the grid points in `grid` (a dict of (G,) columns) for the
    spec's seeds: {output: (G, N, ...)}. The runs are one flat batch, grid
    point-major (gathers and scatters with one batch axis compile to simpler
    loops on the CPU than with two, as in `control.program`)."""
    N = spec.seeds
    G = next(iter(grid.values())).shape[0]
    keys = threefry.fused(per_seed_keys(seed, N, spec.seed_offset))
    init_keys, stream_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
    seed_index = jnp.tile(jnp.arange(N), G)
    cols = {n: jnp.repeat(v, N) for n, v in grid.items()}
    run = (make_deep_run if deep.is_deep(spec.algorithm_def) else make_run)(spec, task)
    xs = (init_keys[seed_index], stream_keys[seed_index], cols)
    batch = batch_runs(G * N, deep_batch(spec, platform))
    if batch >= G * N:
        out = jax.vmap(run)(*xs)
    else:  # the runs in turn, `batch` at a time (a scan over vmapped batches; each run's bits are the same)
        out = jax.lax.map(lambda x: run(*x), xs, batch_size=batch)
    return {k: v.reshape((G, N) + v.shape[1:]) for k, v in out.items()}


def make_program(spec: ContinuingSpec, group=None, chunk: int = 1, devices=None) -> Program:
    """The program (`engine.programs.Program`) for chunks of `chunk` grid
    points: `fn(seed, grid)` with `grid` from `grid_inputs`, returning
    {output: (chunk, N, ...)} (`runs`); on several devices the chunk's points
    are split among them (`engine.programs.jit_over_grid`)."""
    task = spec.make_task()
    mesh = grid_mesh(devices, chunk)
    platform = (list(devices) if devices is not None else jax.devices())[0].platform

    def program(seed, grid):  # the name XLA's module gets
        return runs(spec, seed, grid, task, platform)

    return Program(spec=spec, group=group, fn=jit_over_grid(program, mesh), chunk=chunk, mesh=mesh)


__all__ = ["BATCH_RUNS", "CPU_LANE_ROWS", "CPU_SOLO_ROWS", "DEEP_BATCH_RUNS", "OUTPUTS", "RATE_FIELDS", "batch_runs", "deep_batch", "epsilon_greedy",
           "grid_inputs", "initial_weights", "make_deep_run", "make_program", "make_run", "rate_field", "runs"]
