"""The kernel: the traced pieces of one group's program.

`make_kernel` returns a `Kernel` of four functions to trace -- `setup` (the
context of a seed, a grid chunk and a seed range), `start` (the initial carry
and the step-0 report), `blocks` (a run of log blocks: sample a transition per
seed, update every (seed, grid point) pair, check divergence once per block,
report the metrics over seeds) and `finish` (per-seed finals and areas). The
programs (`bec_jax.prediction.programs`) chain them over the whole time axis or
over segments of it; either way every run does the same arithmetic.
"""
from __future__ import annotations

import contextlib
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax.algorithms.base import sharing
from bec_jax.engine import divergence
from bec_jax.engine.layout import counter_index, seed_major, state_axes
from bec_jax.engine.plan import Group
from bec_jax.engine.seed_stats import alive_count, log_point
from bec_jax.engine.streams import block_uniforms, per_seed_keys
from bec_jax.engine.tuning import KernelForm, choose_form
from bec_jax.prediction import sampling
from bec_jax.prediction.plan import ENV_INDEX, updates
from bec_jax.prediction.spec import SweepSpec
from bec_jax.schedules import robbins_monro
from bec_jax.theory import metrics


class Kernel(NamedTuple):
    """The pieces of one group's program, as functions to trace (see `make_kernel`)."""

    setup: Callable    # (seed, grids, offset, n_seeds) -> context
    start: Callable    # (ctx, per_seed) -> (carry, first)
    blocks: Callable   # (ctx, carry, js, per_seed) -> (carry, ys)
    finish: Callable   # (ctx, carry) -> {"final", "auc_seed", "diverged_step"}
    axes: tuple        # each member's state's vmap axes (None: the unbatched counter)


class _Member(NamedTuple):
    """One algorithm's share of a program: its grid points' states and update."""

    alg: object
    traced: list       # the traced hyperparameters (the grid's columns)
    axes: object       # the state's vmap axes
    check_axes: object  # the axes the divergence check reads (traces left out)
    update: Callable   # (states (N, G, ...), transitions (N, ...) or, per point, (N, G, ...), values) -> states
    share: bool        # update traced under `algorithms.sharing` (form and algorithm both opt in)


def _member(spec: SweepSpec, group: Group, k: int, dtype, tr_axis, form: KernelForm) -> _Member:
    alg = spec.algorithm_def
    schedule = spec.schedule
    static = dict(group.static)
    traced = [h for h in alg.hyperparameters if not h.static]
    template = jax.eval_shape(alg.init, jax.ShapeDtypeStruct((k,), dtype))  # no eager op to compile
    axes = state_axes(template, alg.counter)
    # Traces (a followon trace on Baird, say) may grow large while the weights
    # stay bounded: divergence is judged on the other fields only.
    check_axes = state_axes(template, alg.counter, skip=tuple(alg.traces))
    if not hasattr(template, alg.weights):
        raise ValueError(f"algorithm: {alg.name} declares weights {alg.weights!r}, but its state "
                         f"({type(template).__name__}) has no such field")
    scheduled = schedule.kind == "robbins_monro" and any(h.step_size for h in traced)
    counter_at = counter_index(template, alg.counter)
    if scheduled and counter_at is None:
        raise ValueError(f"schedule: robbins_monro is evaluated at the update counter, but {alg.name} "
                         + ("declares none (counter=None)" if alg.counter is None else
                            f"declares counter {alg.counter!r} and its state ({type(template).__name__}) "
                            "has no such field (one scalar)"))

    def update_one(state, tr, hp_vals):
        hp = dict(static)
        for h in traced:
            v = hp_vals[h.name]
            if h.step_size and scheduled:
                # Resolved here, at the count the update reads before incrementing it,
                # so an update always gets an array: a user's `eta * c` needs no
                # `resolve_step`, and a built-in's own resolve is then a no-op (the
                # same operations on the same values: the same bits).
                count = jax.tree_util.tree_leaves(state)[counter_at]
                v = robbins_monro(v, schedule.t0, schedule.exponent(h.name))(count)
            hp[h.name] = v
        return alg.apply(state, tr, hp)

    # Seeds outside, grid points inside: a seed's transition is the same for all
    # its grid points, so in the (seeds, grid, features) layout it is constant
    # over each seed's whole plane of states, and XLA:CPU's loops read it once
    # (faster, the same bits; benchmarks/README.md).
    update = jax.vmap(jax.vmap(update_one, in_axes=(axes, tr_axis, 0), out_axes=axes),
                      in_axes=(axes, 0, None), out_axes=axes)
    return _Member(alg, traced, axes, check_axes, update, form.share and alg.shares_scalars)


def _split(x: jax.Array, sizes: tuple) -> list:
    """x cut along its first axis into consecutive parts of `sizes` (one part: x itself)."""
    if len(sizes) == 1:
        return [x]
    return jnp.split(x, np.cumsum(sizes)[:-1].tolist())


class Parts(NamedTuple):
    """What a group's program is made of, fixed before tracing (`make_kernel`): the
    explicit context the kernel's functions read besides their arguments."""

    dtype: object
    E: int              # the group's models
    per_model: bool     # several models, each seed's trajectory of each sampled once a step
    tables_np: object   # the sampler tables (NumPy: constants made inside the trace)
    step_fn: Callable   # the sampler's step from uniforms
    nu: int             # uniforms per step
    K: int              # steps per log block
    L: int              # log blocks
    bound: float        # the divergence bound
    theta0: np.ndarray  # (E, k) the models' start weights
    mets: list | None   # one model: its metrics (constants)
    stacked: list | None  # several models: each metric's (R, h) stacked over them, zero-padded
    nonzero: list | None  # several models: each metric's nonzero columns
    members: tuple      # the `_Member`s (one per sweep of a joint program)
    form: KernelForm    # the performance choices (`tuning.choose_form`)


class Context(NamedTuple):
    """What `setup` makes of a (seed, grid chunks, seed range), inside the trace."""

    sizes: tuple       # each member's grid points (their sum: the program's)
    N: int
    tables: object
    hp_vals: list
    init_keys: jax.Array
    stream_keys: jax.Array
    env_idx: object
    mets_g: list


def make_kernel(spec: SweepSpec, group: Group, chunk: int, others: tuple = (), form: KernelForm | None = None, devices=None) -> Kernel:
    """The traced pieces of a group's program: the context of a (seed, grid
    chunk, seed range), the start state, a run of log blocks, and the end.

    Each piece is a top-level function of the `Parts` made here (what the program
    is made of) and the `Context` `setup` makes inside the trace. The whole-run
    program (`programs.make_program`) chains them once over the whole time axis;
    the segmented programs (`programs.make_segment_programs`) call the same pieces over a part of the
    time axis or of the seeds, so every run does the same arithmetic either way.
    With `per_seed` the log blocks report each seed's metric values and alive
    flags instead of the statistics over seeds (a seed-chunked run combines
    them on the host, with the same `mean_std_sem`).

    `others`: (spec, group) pairs of sweeps that differ from `spec` only in
    their algorithm and its hyperparameters, with the same models in the same
    order (see `make_joint_program`). Each such *member* keeps its own states
    and update; the transitions, the metrics, the statistics and the divergence
    bookkeeping are shared, over the members' grid points laid end to end (with
    several models, each point gets its own model's transition, as alone).
    `grids` holds one grid chunk per member.

    `form`: the program's performance choices (`tuning.KernelForm`: paired log
    blocks, shared scalars, the scan's unroll), the same arithmetic bit for bit
    under each; default the form a sweep of `spec` on `devices` (None: JAX's
    default devices) gets, `tuning.choose_form`."""
    if form is None:
        form = choose_form(spec, devices, group, updates=updates(spec))
    dtype = jnp.dtype(spec.dtype)
    models = group.models
    E = len(models)
    tables_np = sampling.build_tables(models, dtype, as_numpy=True)
    step_fn = sampling.markov_step_from_uniforms if spec.sampler == "markov" else sampling.iid_step_from_uniforms
    nu = sampling.NUM_UNIFORMS[spec.sampler]
    K, L = spec.log_every, spec.steps // spec.log_every
    bound = float(spec.divergence_bound)
    theta0 = np.stack([np.asarray(m.theta0, np.float64) for m in models])  # (E, k)
    k = theta0.shape[1]

    if E == 1:
        mets = [metrics.metric(models[0], m) for m in spec.metrics]  # constants, unrolled over nonzeros
        stacked = nonzero = None
    else:
        mets = None
        per_model = [[metrics.metric(m, name) for m in models] for name in spec.metrics]
        # A metric's factor has as many rows as its rank (a projected error of
        # rank-deficient features has fewer): zero rows pad them to one shape,
        # adding exact zeros to the sum of squares. NumPy arrays: constants made
        # inside the trace.
        stacked, nonzero = [], []
        for ms in per_model:
            rows = max(mm.R.shape[0] for mm in ms)
            R = np.stack([np.pad(mm.R, ((0, rows - mm.R.shape[0]), (0, 0))) for mm in ms])
            h = np.stack([np.pad(mm.h, (0, rows - mm.h.shape[0])) for mm in ms])
            stacked.append((R.astype(dtype), h.astype(dtype)))
            nonzero.append(np.any(R != 0, axis=0))

    # With several models, each seed's trajectory of every model is sampled once
    # per step and each grid point gathers its model's transition (`per_model`);
    # only when a chunk holds fewer points than the group has models does every
    # point sample its own (the same transitions either way).
    per_model = 1 < E <= chunk
    tr_axis = None if E == 1 else 0
    members = tuple(_member(s, g, k, dtype, tr_axis, form) for s, g in ((spec, group), *others))
    parts = Parts(dtype=dtype, E=E, per_model=per_model, tables_np=tables_np, step_fn=step_fn, nu=nu, K=K, L=L,
                  bound=bound, theta0=theta0, mets=mets, stacked=stacked,
                  nonzero=nonzero, members=members, form=form)
    return Kernel(partial(_setup, parts), partial(_start, parts), partial(_blocks, parts), partial(_finish, parts),
                  tuple(mb.axes for mb in members))


def _setup(f: Parts, seed, grids, offset, N) -> Context:
    """The context of seeds offset .. offset + N - 1 of base seed `seed` on `grids`
    (one grid chunk per member)."""
    sizes = tuple(g[ENV_INDEX].shape[0] for g in grids)
    keys = per_seed_keys(seed, N, offset)
    # Constants of the program, made inside the trace (nothing compiled to place them).
    tables = sampling.SamplerTables(*(jnp.asarray(x) for x in f.tables_np))
    hp_vals = [{h.name: g[h.name].astype(f.dtype) for h in mb.traced} for mb, g in zip(f.members, grids)]
    init_keys, stream_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
    if f.E == 1:
        env_idx, mets_g = None, f.mets
    else:  # every member's points, laid end to end
        env_idx = grids[0][ENV_INDEX] if len(grids) == 1 else jnp.concatenate([g[ENV_INDEX] for g in grids])
        mets_g = [metrics.Metric(jnp.asarray(R)[env_idx], jnp.asarray(h)[env_idx]) for R, h in f.stacked]
    return Context(sizes, N, tables, hp_vals, init_keys, stream_keys, env_idx, mets_g)


def _metric_values(f: Parts, ctx: Context, states):
    """(M, G, N) metric values of the states (seed-major: (N, G, ...)).

    Taken grid-major, on each weight's column turned (G, N), as before the
    states were seed-major: taken on the seed-major weights directly, a
    final value of one program form (fusion emitters, 8-point chunks) came
    out 1 ulp apart from the others', which the bit-for-bit tests caught.
    Turning the columns rather than the whole (N, G, k) array lets XLA:CPU
    read them in the metric's loop (faster, the same bits)."""
    w = [getattr(st, mb.alg.weights) for mb, st in zip(f.members, states)]
    w = w[0] if len(w) == 1 else jnp.concatenate(w, axis=1)
    return metrics.metric_values(ctx.mets_g, [w[..., i].T for i in range(w.shape[-1])], f.nonzero)


def _report(vals, keep, per_seed, exact_ties=False, count=None):
    """A log point's report: per seed (values, alive), or the statistics over seeds."""
    if per_seed:
        return vals, keep
    return log_point(vals, keep, exact_ties, count=count)


def _start(f: Parts, ctx: Context, per_seed):
    """(carry, the step-0 report): every run at its model's start."""
    N, E, dtype = ctx.N, f.E, f.dtype
    u0 = jax.vmap(lambda key: jax.random.uniform(key, dtype=dtype))(ctx.init_keys)  # (N,)
    states = []
    if E == 1:
        samp = jax.vmap(lambda u: sampling.init_state_from_uniform(ctx.tables, u))(u0)  # (N,)
    else:
        starts = jnp.arange(E, dtype=jnp.int32) if f.per_model else ctx.env_idx
        samp = jax.vmap(lambda e: jax.vmap(lambda u: sampling.init_state_from_uniform(ctx.tables, u, e))(u0))(
            starts)
    for mb, G, idx in zip(f.members, ctx.sizes, _member_points(ctx)):
        if E == 1:
            st0 = mb.alg.init(jnp.asarray(f.theta0[0].astype(dtype)))
        else:
            st0 = jax.vmap(mb.alg.init, out_axes=mb.axes)(jnp.asarray(f.theta0.astype(dtype))[ctx.env_idx[idx]])
        # Batched leaves to (N, G, ...), seed-major (see `_member`): per point
        # (E > 1) or one start for all (E = 1).
        states.append(jax.tree_util.tree_map(
            lambda x, ax: x if ax is None else (jnp.broadcast_to(x[None], (N, G) + x.shape[1:]) if E > 1
                                                else jnp.broadcast_to(x, (N, G) + x.shape)),
            st0, mb.axes))
    states = tuple(states)
    dstep = jnp.full((sum(ctx.sizes), N), -1, jnp.int32)
    alive0 = dstep < 0
    if E == 1:  # one start for all: its metrics once (XLA folds them), broadcast
        vals0 = jnp.concatenate([jnp.broadcast_to(metrics.metric_values(
            ctx.mets_g, getattr(st, mb.alg.weights)[:1, :1], f.nonzero), (len(f.mets), G, N))
            for mb, st, G in zip(f.members, states, ctx.sizes)], axis=1)
    else:
        vals0 = _metric_values(f, ctx, states)
    return (states, samp, dstep, seed_major(vals0)), _report(vals0, alive0, per_seed, exact_ties=True)


def _step(f: Parts, ctx: Context, carry, u):
    """One step of every run: a transition per seed (and model), every update."""
    states, samp = carry
    if f.E == 1:
        tr, samp = jax.vmap(lambda uu, s: f.step_fn(ctx.tables, uu, s))(u, samp)
    else:
        # Transitions seed-major, (N, E or G, ...) as the states; samplers (E or G, N).
        tr, samp = jax.vmap(jax.vmap(lambda uu, s: f.step_fn(ctx.tables, uu, s)), in_axes=(None, 0),
                            out_axes=(1, 0))(u, samp)
        if f.per_model:  # (N, E) -> (N, G): each point its model's transition
            tr = jax.tree_util.tree_map(lambda x: x[:, ctx.env_idx], tr)
    # A uniform of this step: a number XLA cannot fold, as `sharing` needs.
    token = u.reshape(-1)[0] if any(mb.share for mb in f.members) else None
    if f.E == 1 or len(f.members) == 1:
        trs = (tr,) * len(f.members)
    else:  # each member its own points' transitions
        trs = tuple(jax.tree_util.tree_map(lambda x: x[:, idx], tr) for idx in _member_points(ctx))
    states = tuple(_update(mb, st, t, hp, token) for mb, st, t, hp in zip(f.members, states, trs, ctx.hp_vals))
    return (states, samp), None


def _member_points(ctx: Context) -> list[slice]:
    """Each member's points among the program's (laid end to end)."""
    ends = np.cumsum((0,) + tuple(ctx.sizes))
    return [slice(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])]


def _update(mb: _Member, states, tr, hp, token):
    """A member's update of its runs; under `algorithms.sharing(token)` where
    the member shares its scalars (the form's `share` and the algorithm's
    declared `Algorithm.shares_scalars`: the algorithm's contract)."""
    with sharing(token) if mb.share else contextlib.nullcontext():
        return mb.update(states, tr, hp)


def _draw(f: Parts, ctx: Context, j):
    """(K, N, nu): log block j's uniforms, step axis first."""
    return jnp.swapaxes(jax.vmap(lambda kk: block_uniforms(kk, j, f.K, f.nu, f.dtype))(ctx.stream_keys), 0, 1)


def _block(f: Parts, ctx: Context, carry, j, u, per_seed):
    """Log block j: (states, samp, dstep) -> the same, its metric values, its report."""
    states, samp, dstep = carry
    if f.form.paired:
        # The first step reads the block's start state and writes a new one, so
        # the start state stays for the revert without the copy XLA makes of a
        # while loop's input that is read after the loop.
        (new, samp), _ = _step(f, ctx, (states, samp), u[0])
        (new, samp), _ = jax.lax.scan(lambda c, uu: _step(f, ctx, c, uu), (new, samp), u[1:], unroll=f.form.unroll)
    else:
        (new, samp), _ = jax.lax.scan(lambda c, uu: _step(f, ctx, c, uu), (states, samp), u, unroll=f.form.unroll)
    # Divergence is checked once per log block, not per step (a per-step
    # check costs more than the update): a run that left the bound during
    # the block is reverted to its state at the block's start, frozen there,
    # and flagged with the block's last step.
    alive = dstep < 0
    oks = [divergence.run_ok(st, f.bound, mb.check_axes) for mb, st in zip(f.members, new)]  # (N, G) each
    keep = alive & (oks[0] if len(oks) == 1 else jnp.concatenate(oks, axis=1)).T
    count = alive_count(keep)  # the report's, and whether any run is not kept
    # Reverting is a pass over the state, needed only where some run is not
    # kept (diverged now or before: a diverged run stays frozen); in most
    # sweeps most blocks have none. The form's `branches` says whether it is
    # skipped then (a conditional) or done every block (a select: no predicate
    # read back to the host on a GPU); the same bits either way.
    states, dstep = divergence.skippable(
        f.form.branches == "cond", jnp.any(count < ctx.N),
        lambda: (tuple(divergence.revert(kp, nw, st, mb.axes)
                       for mb, nw, st, kp in zip(f.members, new, states, [k.T for k in _split(keep, ctx.sizes)])),
                 divergence.flag(dstep, alive, keep, (j + 1) * f.K)),
        (new, dstep))
    vals = _metric_values(f, ctx, states)
    return (states, samp, dstep), vals, _report(vals, keep, per_seed, count=count)


def _blocks(f: Parts, ctx: Context, carry, js, per_seed):
    """The log blocks `js` in turn: (carry, their reports stacked)."""
    def one(c, j):
        *c, auc_sum = c
        c, vals, y = _block(f, ctx, c, j, _draw(f, ctx, j), per_seed)
        return (*c, auc_sum + seed_major(vals)), y

    if not f.form.paired or js.shape[0] < 2:
        return jax.lax.scan(one, carry, js)

    # Two log blocks an iteration: the state moves between two buffers and is
    # back in the loop's own after the second, where a loop of single blocks
    # copies it back after each. The two blocks' uniforms are drawn together,
    # and their metric values join the areas' sums in one pass, added in turn.
    # The sums are kept seed-major (M, N, G), the layout XLA:CPU computes the
    # metric values in: summed grid-major, the pass read them across the seeds
    # (slower; the same bits: the same additions in the same order).
    def two(c, jj):
        *c, auc_sum = c
        u = jax.vmap(lambda j: _draw(f, ctx, j))(jj)
        c, v0, y0 = _block(f, ctx, c, jj[0], u[0], per_seed)
        c, v1, y1 = _block(f, ctx, c, jj[1], u[1], per_seed)
        return ((*c, auc_sum + seed_major(v0) + seed_major(v1)),
                jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), y0, y1))

    n = js.shape[0] // 2 * 2
    carry, ys = jax.lax.scan(two, carry, js[:n].reshape(-1, 2))
    ys = jax.tree_util.tree_map(lambda a: a.reshape((n,) + a.shape[2:]), ys)
    if n < js.shape[0]:
        carry, y = one(carry, js[n])
        ys = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b[None]]), ys, y)
    return carry, ys


def _finish(f: Parts, ctx: Context, carry):
    """Per-seed finals, areas and divergence steps, the grid axis first."""
    states, _, dstep, auc_sum = carry
    auc_sum = seed_major(auc_sum)  # (M, N, G) -> (M, G, N)
    vals = _metric_values(f, ctx, states)
    alive = jnp.broadcast_to((dstep < 0)[None], vals.shape)
    final = jnp.where(alive, vals, jnp.nan)  # (M, G, N)
    # Each seed's area under its curve: the mean over the logged points.
    auc_seed = jnp.where(alive, auc_sum / (f.L + 1), jnp.nan)
    return {"final": jnp.moveaxis(final, 1, 0), "auc_seed": jnp.moveaxis(auc_seed, 1, 0), "diverged_step": dstep}


