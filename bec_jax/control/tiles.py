"""A JAX tile coder: the grid tilings of the paper authors' control code.

The scheme is that of `TileCoder_action` in GameAI-NJUPT/BEC (commit 4d55a79,
`Mountain_Car/tilecoding_action.py`, identical in `Acrobot/`), with the tilings
its `main.py` files build:

  * a sample x in D dimensions with bounds [low, high] and `bins[i]` tiles in
    dimension i; tile width w_i = (high_i - low_i) / bins[i];
  * `num_tilings` = T grids. Tiling t (t = 0 .. T-1) has the bins[i] - 1 interior
    edges of the uniform grid, `np.linspace(low_i, high_i, bins[i] + 1)[1:-1]`,
    shifted by k_t * u_i, with k_t = t - (T - 1) // 2 (k = -2, -1, 0, 1, 2 for
    T = 5, in that order) and the offset unit u_i = w_i / T (a fifth of a tile
    for the authors' five tilings);
  * the coordinate of x in dimension i is `np.digitize(x_i, edges)`: the number of
    edges <= x_i, in 0 .. bins[i] - 1. Nothing is clipped explicitly: a value
    below the first edge (also below `low`) is in tile 0, one at or above the
    last edge (also above `high`) in the last tile, so the outer tiles of a
    shifted tiling are wider or narrower than w_i;
  * the tile of tiling t is the codeword (t, c_0, ..., c_{D-1}).

Layout (ours): tiling t's tile is the integer
    t * prod(bins) + ravel_multi_index((c_0, ..., c_{D-1}), bins)
(row-major: the first dimension is the most significant), in
[0, `num_tiles(bins, D, T)`) = [0, T * prod(bins)). A task puts action b's
copy at b * num_tiles + that index.

The authors number codewords (t, c_0, ..., c_{D-1}, action) in the order a run
first meets them (a dict `codebook`; past `features` entries it would fall back
to `hash(codeword) % features`). Their `features` is exactly the number of
codewords (MountainCar 5 * 20 * 20 * 3 = 6000, Acrobot 5 * 5**6 * 3 = 234375),
so the fallback never fires and their numbering is a one-to-one relabelling of
ours: the same partition of (x, action) into active features, with weights that
start at zero, gives the same learning up to that (run-dependent) permutation.
Absolute index values cannot agree: theirs depend on the visiting order.

Floating point, as their pinned NumPy 1.24.3 computes it: the bounds are the
float32 arrays of Gymnasium's observation space; `np.linspace` of two float32
scalars returns float64 under NumPy 1.x (under NumPy 2's NEP 50 it would be
float32), so the edges are float64: linspace(low, high) + the offset, where the
offset is computed in the bounds' dtype by default
(`(high - low) / (T * bins)`, float32 in Mountain_Car/main.py) or passed as
`offset_unit` (Acrobot/main.py's `((high - low) / 5) / bins` is float64). A
float32 sample is compared with float64 edges; we compare it with each edge
rounded up to float32, which gives the same answer for every float32 sample
(x >= e iff x >= the least float32 >= e). A float64 sample (x64 mode) is
compared with the float64 edges. Comparisons are made on integer keys of the
bit patterns, so subnormal samples (which XLA flushes to zero in float
arithmetic) are placed as NumPy places them. A NaN coordinate is in the last
tile, as in `np.digitize`.

All array work is in `tile_indices`; `low`, `high`, `bins`, `num_tilings` and
`offset_unit` are static (NumPy values known at trace time), `x` may be traced.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def bins_tuple(bins, dims: int) -> tuple[int, ...]:
    """`bins` (an int, or one int per dimension) as a tuple of `dims` ints >= 1."""
    if isinstance(bins, (int, np.integer)) and not isinstance(bins, bool):
        out = (int(bins),) * dims
    else:
        try:
            out = tuple(int(b) for b in bins)
        except TypeError:
            raise ValueError(f"bins: an integer or one integer per dimension, got {bins!r}") from None
        if any(isinstance(b, bool) or int(b) != b for b in bins):
            raise ValueError(f"bins: integers, got {bins!r}")
        if len(out) != dims:
            raise ValueError(f"bins: one per dimension ({dims}), got {len(out)}: {bins!r}")
    if any(b < 1 for b in out):
        raise ValueError(f"bins: integers >= 1, got {bins!r}")
    return out


def _check_tilings(num_tilings) -> int:
    if isinstance(num_tilings, bool) or not isinstance(num_tilings, (int, np.integer)) or num_tilings < 1:
        raise ValueError(f"num_tilings: an integer >= 1, got {num_tilings!r}")
    return int(num_tilings)


def num_tiles(bins, dims: int, num_tilings: int) -> int:
    """Tiles per action: num_tilings * prod(bins) (bins an int, or one per dimension)."""
    return _check_tilings(num_tilings) * math.prod(bins_tuple(bins, int(dims)))


def tiling_offsets(num_tilings: int) -> np.ndarray:
    """The multipliers k_t = t - (T - 1) // 2 of the offset unit, t = 0 .. T-1
    (-2, -1, 0, 1, 2 for T = 5, the authors' order)."""
    t = _check_tilings(num_tilings)
    return np.arange(t) - (t - 1) // 2


def tiling_edges(low, high, bins, num_tilings: int, offset_unit=None) -> list[list[np.ndarray]]:
    """The float64 interior edges of every tiling and dimension, `[t][i]` an array
    of bins[i] - 1 increasing values, computed as the authors' NumPy 1.24 code
    does (see the module docstring). `offset_unit` (D,) overrides the default
    `(high - low) / (num_tilings * bins)` in the bounds' dtype."""
    low = np.atleast_1d(np.asarray(low))
    high = np.atleast_1d(np.asarray(high))
    if low.ndim != 1 or low.shape != high.shape:
        raise ValueError(f"low, high: two 1-D arrays of one length, got shapes {low.shape} and {high.shape}")
    if not np.all(np.isfinite(low)) or not np.all(np.isfinite(high)) or not np.all(high > low):
        raise ValueError(f"low, high: finite bounds with high > low, got {low!r} and {high!r}")
    dims = low.shape[0]
    b = bins_tuple(bins, dims)
    t = _check_tilings(num_tilings)
    if offset_unit is None:
        span = high - low
        unit = span / np.asarray([t * bi for bi in b], dtype=span.dtype)
    else:
        unit = np.atleast_1d(np.asarray(offset_unit))
        if unit.shape != (dims,) or not np.all(np.isfinite(unit)):
            raise ValueError(f"offset_unit: {dims} finite numbers, got {offset_unit!r}")
    out = []
    for k in tiling_offsets(t):
        # k * unit in the unit's dtype (the authors' `-2 * offset_pos`), then
        # added to the float64 grid.
        shift = (int(k) * unit).astype(np.float64) if k != 0 else np.zeros(dims)
        out.append([np.linspace(np.float64(low[i]), np.float64(high[i]), b[i] + 1)[1:-1] + shift[i]
                    for i in range(dims)])
    return out


def _order_keys(bits, int_type, np_mod):
    """Integers ordered as the floats whose bit patterns (signed) are `bits`:
    -0.0 maps to +0.0's key, negatives below positives."""
    smallest = np_mod.iinfo(int_type).min
    flip = np_mod.iinfo(int_type).max
    bits = np_mod.where(bits == smallest, 0, bits)
    return np_mod.where(bits < 0, bits ^ flip, bits)


def _tables(low, high, bins, num_tilings, offset_unit):
    """Padded edge tables (T, D, max(bins) - 1) as order keys of the float64
    edges and of the edges rounded up to float32, with the bins tuple."""
    edges = tiling_edges(low, high, bins, num_tilings, offset_unit)
    dims = len(edges[0])
    b = bins_tuple(bins, dims)
    width = max(max(b) - 1, 1)
    e64 = np.full((len(edges), dims, width), np.inf)
    for t, per_dim in enumerate(edges):
        for i, e in enumerate(per_dim):
            e64[t, i, :e.shape[0]] = e
    e32 = e64.astype(np.float32)
    e32 = np.where(e32.astype(np.float64) < e64, np.nextafter(e32, np.float32(np.inf)), e32).astype(np.float32)
    k64 = _order_keys(e64.view(np.int64), np.int64, np)
    k32 = _order_keys(e32.view(np.int32), np.int32, np)
    return k64, k32, b


def tile_indices(x, low, high, bins, num_tilings: int, *, offset_unit=None) -> jax.Array:
    """The active tile of each tiling for a sample x (D,): (num_tilings,) int32,
    tiling t's entry in [t * prod(bins), (t + 1) * prod(bins)) (layout in the
    module docstring). `low`, `high` (D,), `bins` (int or (D,)), `num_tilings`
    and `offset_unit` are static; x may be traced, jitted and vmapped."""
    k64, k32, b = _tables(low, high, bins, num_tilings, offset_unit)
    x = jnp.asarray(x)
    if x.shape != (k64.shape[1],):
        raise ValueError(f"x: a sample of shape ({k64.shape[1]},), got {x.shape}")
    # Compare integer order keys of the bit patterns, not floats: XLA flushes
    # subnormal floats to zero, NumPy does not.
    if x.dtype == jnp.float64:
        keys = _order_keys(jax.lax.bitcast_convert_type(x, jnp.int64), np.int64, jnp)
        edges = jnp.asarray(k64)
    else:
        x = x.astype(jnp.float32)
        keys = _order_keys(jax.lax.bitcast_convert_type(x, jnp.int32), np.int32, jnp)
        edges = jnp.asarray(k32)
    last = jnp.asarray(np.asarray(b, dtype=np.int32) - 1)
    counts = jnp.sum(edges <= keys[None, :, None], axis=-1, dtype=jnp.int32)  # (T, D)
    # Padding edges are +inf: only x = +inf counts them; NaN is in the last tile.
    counts = jnp.where(jnp.isnan(x)[None, :], last[None, :], jnp.minimum(counts, last[None, :]))
    strides = np.ones(len(b), dtype=np.int64)
    for i in range(len(b) - 2, -1, -1):
        strides[i] = strides[i + 1] * b[i + 1]
    per_tiling = math.prod(b)
    flat = jnp.sum(counts * jnp.asarray(strides.astype(np.int32))[None, :], axis=-1, dtype=jnp.int32)
    return (jnp.arange(k64.shape[0], dtype=jnp.int32) * np.int32(per_tiling) + flat).astype(jnp.int32)


__all__ = ["num_tiles", "tile_indices", "tiling_edges", "tiling_offsets"]
