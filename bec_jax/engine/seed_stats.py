"""Statistics over seeds, bit for bit the same in the program and on the host.

This module is correctness machinery, not arithmetic convenience. A grid
point's mean, std and sem must not depend on the chunk size, the device count,
whether its seeds ran in one call or in seed chunks combined on the host
(`combine_seeds`), or how XLA chose to fuse the program. So every statistic is
written in operations whose rounding is fixed by the seed count alone:

- sums are pairwise halvings in a fixed order (`tree_reduce`), never XLA's
  reduce, whose combining order may depend on the rest of the batch shape;
- a square reaches its sum through a select, so no fused multiply-add can form;
- every division goes through `divide`, so XLA never turns it into a
  multiplication by a reciprocal or merges two divisions into one;
- dead runs are masked with `where`, never multiplied, so their NaN or inf
  cannot leak into the statistics.

Each function takes `xp` (jax.numpy inside the program, numpy on the host); the
host's results are the program's, bit for bit (tests/test_sweep.py,
tests/test_memory.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def tree_reduce(x: jax.Array, op, pad: float, xp=jnp) -> jax.Array:
    """Reduces the last axis by pairwise halving (padded with `pad` to a power of two).

    Only elementwise ops, in an order fixed by the axis length alone: XLA's reduce
    may combine in an order that depends on the rest of the batch shape, which would
    make a grid point's statistics depend on the chunk size in the last bit.

    The padded array is never made: the first halving adds `pad` to the elements
    whose partners it would hold, and joins the two parts: the same operations,
    without a pass that writes the padded array (benchmarks/README.md)."""
    n = x.shape[-1]
    width = 1 << max(0, (n - 1).bit_length())
    if width != n:
        half, r = width // 2, n - width // 2  # r < half: x[r:half] has no partner
        p = xp.asarray(pad, x.dtype)
        if xp is jnp:  # hidden from XLA, which folds x + 0 to x (-0 + 0 is +0, as on the host)
            p = jax.lax.optimization_barrier(p)
        x = xp.concatenate([op(x[..., :r], x[..., half:]), op(x[..., r:half], p)], axis=-1)
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = op(x[..., :half], x[..., half:])
    return x[..., 0]


def divide(a, b, xp=jnp):
    """a / b, one correctly rounded division in the program as on the host.

    The divisor passes through a select on the numerator's own values, so XLA
    never sees a division by a broadcast, a constant or a product it could split:
    it would turn the first two into a multiplication by a reciprocal, and
    (a / b) / c into a / (b * c), which round differently. NaN in `a` stays NaN,
    as it would anyway."""
    return a / xp.where(xp.isnan(a), xp.nan, b)


def mean_std_sem(values, alive, exact_ties: bool = False, xp=jnp, count=None):
    """Mean, std (ddof=0) and sem (ddof=1) over the seed axis (last) among alive runs.

    values: (M, G, N); alive: (G, N); count: alive.sum(-1) if the caller has it
    (the program does: counting again from the (M, G, N) broadcast was a slow
    pass). Returns three (M, G) arrays, NaN where no run is alive. Dead runs are
    masked with `where`, never multiplied, so their values cannot leak NaN or
    inf into the statistics. With `exact_ties` (used at step 0,
    where every seed starts from theta0), a point whose alive seeds all have the
    same value gets that value as its mean and exactly 0 as its spread, whatever
    the rounding of the sum; it costs two more reductions, so the log steps inside
    the scan do without it.

    The host takes a seed-chunked run's statistics with this same function
    (`xp=np`) from the per-seed values, bit for bit as the program does: each
    operation is rounded on its own, in an order fixed by the seed count alone
    (`tree_reduce`); a square reaches the sum through a select, so no fused
    multiply-add can form; and every division goes through `divide`.
    """
    alive = xp.broadcast_to(alive[None], values.shape)
    zero = values.dtype.type(0)
    count = alive.sum(axis=-1) if count is None else xp.broadcast_to(count, alive.shape[:-1])
    n = count.astype(values.dtype)  # (M, G); integer counts are exact
    mean = divide(tree_reduce(xp.where(alive, values, zero), xp.add, 0.0, xp), n, xp)
    if exact_ties:
        lo = tree_reduce(xp.where(alive, values, xp.inf), xp.minimum, xp.inf, xp)
        hi = tree_reduce(xp.where(alive, values, -xp.inf), xp.maximum, -xp.inf, xp)
        mean = xp.where(lo == hi, lo, mean)
    dev = xp.where(alive, values - mean[..., None], zero)
    ss = tree_reduce(xp.where(alive, dev * dev, zero), xp.add, 0.0, xp)
    std = xp.sqrt(divide(ss, n, xp))
    sem = xp.where(n > 1, xp.sqrt(divide(ss, xp.maximum(n - 1, 1) * n, xp)), zero)
    return mean.astype(values.dtype), std.astype(values.dtype), sem.astype(values.dtype)


def alive_count(alive, xp=jnp):
    """(G,) int32: the alive runs of each grid point, alive (G, N). Summed as
    `tree_reduce` sums, elementwise, where XLA:CPU's reduce of a boolean axis
    took a conversion and two passes of their own (integer sums: the same count)."""
    return tree_reduce(alive.astype(xp.int32), xp.add, 0, xp)


def log_point(values, alive, exact_ties: bool = False, xp=jnp, count=None) -> tuple:
    """A log point's report: mean, std and sem over the seeds (`mean_std_sem`) and
    the alive count (int32; `alive_count`, unless the caller has it), counted
    once for both."""
    count = alive_count(alive, xp) if count is None else count
    return (*mean_std_sem(values, alive, exact_ties, xp, count=count), count)


def host_log_point(values: np.ndarray, alive: np.ndarray, exact_ties: bool) -> tuple:
    """`log_point` on the host, for a seed-chunked run (see `mean_std_sem`)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return log_point(values, alive, exact_ties, xp=np)


def combine_seeds(reports: list, N: int, exact_ties: bool) -> tuple:
    """The statistics over all seeds from the seed chunks' per-seed reports
    (values (n, M, G, Ns), alive (n, G, Ns) each), trimmed to the spec's N seeds;
    one log point at a time, so the host holds a few copies of one point's values."""
    n = reports[0][0].shape[0]
    out = [], [], [], []
    for t in range(n):
        vals = np.concatenate([np.asarray(r[0][t]) for r in reports], axis=-1)[..., :N]
        alive = np.concatenate([np.asarray(r[1][t]) for r in reports], axis=-1)[..., :N]
        for lst, x in zip(out, host_log_point(vals, alive, exact_ties)):
            lst.append(x)
    return tuple(np.stack(x) for x in out)


