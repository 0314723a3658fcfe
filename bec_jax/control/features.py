"""Feature maps of control: an observation's features for every action.

A feature map is a `FeatureMap`: the weight vector's length d and one pure
function of one observation (callers jit and vmap),

  fn(obs (D,) float32) -> (A, m) int32   indices of the features that are 1
                                         (sparse binary: tile coding), or
                          (A, d) float32 vectors phi(obs, b) (dense),

the two kinds `bec_jax.control.transition` computes Q with. A map of state
features x(obs) (k,) gives Q(s, b) its own block of k weights per action,
d = A k (`per_action`): indices b k + i (sparse), or phi(obs, b) = x(obs) in
block b and 0 elsewhere (dense).

Built-in kinds (`make(kind, low, high, num_actions, **params)`), each on the box
[low, high] of the observation (`low`, `high` (D,) finite):

  tiles    grid tile coding (`bec_jax.control.tiles`, the paper authors'
           scheme): `num_tilings` tilings of `bins` tiles per dimension (an
           integer, or one per dimension), offset by fractions of a tile.
           Sparse, num_tilings active per action; d = A num_tilings prod(bins).
           Values outside the box fall in the outer tiles. As in the authors'
           code, alpha is not divided by num_tilings: choose it accordingly.
  fourier  the Fourier cosine basis of Konidaris, Osentoski & Thomas (2011):
           x_c(obs) = cos(pi c . u) for every c in {0 .. order}^D, with u the
           observation scaled to [0, 1]^D (clipped at the box). Dense,
           k = (order + 1)^D per action.
  rbf      Gaussian radial basis functions on a grid of `centers` points per
           dimension of [0, 1]^D: x_i(obs) = exp(-|u - c_i|^2 / (2 sigma^2)),
           sigma (in the scaled units) by default one grid spacing. Dense,
           k = centers^D per action.

`package.module:function` names a builder of one's own with the same signature,
`(low, high, num_actions, **params) -> FeatureMap` (its bounds as given: they
may be infinite where a task's observation space is unbounded).
"""
from __future__ import annotations

import inspect
import itertools
import math
import numbers
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax.algorithms import lookup_callable
from bec_jax.control import tiles

# A state-feature basis larger than this per action is almost surely a mistake
# (order 10 in 6 dimensions is 1.8 M features): refuse it with a message.
MAX_BASIS = 1 << 20


class FeatureMap(NamedTuple):
    """An observation's features for every action (module docstring).

    Attributes:
      num_features: d, the length of the weight vector (all actions).
      fn: obs (D,) -> (A, m) int32 indices or (A, d) float32 vectors.
      params: the resolved parameters (JSON-ready), so `make(kind, ..., **params)`
        rebuilds the map.
    """

    num_features: int
    fn: Callable[[jax.Array], jax.Array]
    params: dict


def vector(field: str, value, dims: int) -> np.ndarray:
    """`value` as a float64 array (dims,): a number (every dimension), a list of
    `dims` numbers, or a string of `dims` numbers separated by spaces (the
    command line's form: a comma separates the values of a grid axis there)."""
    given = value
    if isinstance(value, str):
        try:
            value = [float(v) for v in value.replace(";", " ").split()]
        except ValueError:
            raise ValueError(f"{field}: numbers separated by spaces, got {value!r}") from None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = [value] * dims
    try:
        out = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{field}: a number or {dims} numbers, got {value!r}") from None
    if out.shape != (dims,):
        raise ValueError(f"{field}: a number or {dims} numbers (one per observation dimension), got {given!r}")
    return out


def _box(low, high) -> tuple[np.ndarray, np.ndarray]:
    """Finite float32 bounds (D,) with high > low, or `ValueError` naming low/high."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    dims = low.shape[0] if low.ndim == 1 else 0
    if dims == 0 or high.shape != low.shape:
        raise ValueError(f"low, high: two lists of one length >= 1, got {low.tolist()!r} and {high.tolist()!r}")
    for name, b in (("low", low), ("high", high)):
        bad = [i for i in range(dims) if not np.isfinite(b[i]) or abs(b[i]) > 1e30]
        if bad:
            raise ValueError(f"{name}: the observation space is unbounded in dimension(s) "
                             f"{', '.join(map(str, bad))}; give finite low and high (task parameters)")
    if not np.all(high > low):
        raise ValueError(f"high: must exceed low in every dimension, got low {low.tolist()} and high {high.tolist()}")
    return low.astype(np.float32), high.astype(np.float32)


def _positive_int(field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{field}: an integer >= 1, got {value!r}")
    return int(value)


def _basis_size(field: str, per_dim: int, dims: int) -> int:
    k = per_dim ** dims
    if k > MAX_BASIS:
        raise ValueError(f"{field}: {per_dim}^{dims} = {_count(k)} features per action exceed {MAX_BASIS}; "
                         "choose a smaller value, or another feature map for a high-dimensional observation")
    return k


def _count(k: int) -> str:
    """k for a message: its digits, or its order of magnitude when it is huge."""
    return str(k) if k < 10**12 else f"about 1e{len(str(k)) - 1}"


def _scaled(x: jax.Array, low: np.ndarray, high: np.ndarray) -> jax.Array:
    """The observation scaled to [0, 1]^D, clipped at the box."""
    x = jnp.asarray(x, jnp.float32)
    return jnp.clip((x - low) / (high - low), 0.0, 1.0)


def per_action(state_features: Callable[[jax.Array], jax.Array], k: int, num_actions: int) -> Callable:
    """obs -> features of every action from state features x(obs) with one block
    of k weights per action: integer indices (m,) in [0, k) become (A, m)
    indices b k + i; a float vector (k,) becomes (A, A k) with x in row b's
    block b and zeros elsewhere. The kind is read from x's dtype at trace time."""
    A = int(num_actions)

    def fn(obs):
        x = state_features(obs)
        if jnp.issubdtype(x.dtype, jnp.integer):
            return (jnp.arange(A, dtype=jnp.int32)[:, None] * np.int32(k) + x[None, :]).astype(jnp.int32)
        eye = jnp.eye(A, dtype=x.dtype)
        return (eye[:, :, None] * x[None, None, :]).reshape(A, A * k)

    return fn


def tile_coding(low, high, num_actions: int, *, num_tilings=8, bins=8) -> FeatureMap:
    """Grid tile coding of the box [low, high] (module docstring): sparse,
    `num_tilings` active indices per action."""
    low, high = _box(low, high)
    t = _positive_int("num_tilings", num_tilings)
    try:
        b = tiles.bins_tuple(bins, low.shape[0])
    except ValueError as e:
        raise ValueError(f"{e} (an integer >= 1 or one per observation dimension)") from None
    k = tiles.num_tiles(b, low.shape[0], t)
    if int(num_actions) * k > np.iinfo(np.int32).max:  # the indices are int32
        raise ValueError(f"bins: {num_actions} actions x {_count(k)} tiles exceed 2**31 - 1 features; use fewer bins "
                         "or tilings, or another feature map for a high-dimensional observation")
    fn = per_action(lambda x: tiles.tile_indices(jnp.asarray(x, jnp.float32), low, high, b, t), k, num_actions)
    return FeatureMap(num_features=int(num_actions) * k, fn=fn, params={"num_tilings": t, "bins": list(b)})


def fourier(low, high, num_actions: int, *, order=3) -> FeatureMap:
    """The Fourier cosine basis of order `order` on [low, high] (Konidaris et
    al. 2011; module docstring): dense, one block per action."""
    low, high = _box(low, high)
    if isinstance(order, bool) or not isinstance(order, numbers.Integral) or order < 0:
        raise ValueError(f"order: an integer >= 0, got {order!r}")
    n = int(order) + 1
    dims = low.shape[0]
    k = _basis_size("order", n, dims)
    coeffs = np.asarray(list(itertools.product(range(n), repeat=dims)), np.float32).reshape(k, dims)
    c = jnp.asarray(coeffs * np.float32(np.pi))
    # HIGHEST: not a GPU's default TF32 (algorithms.base._dot); the same bits on the CPU.
    fn = per_action(lambda x: jnp.cos(jnp.matmul(c, _scaled(x, low, high), precision=jax.lax.Precision.HIGHEST)),
                    k, num_actions)
    return FeatureMap(num_features=int(num_actions) * k, fn=fn, params={"order": n - 1})


def rbf(low, high, num_actions: int, *, centers=5, sigma=None) -> FeatureMap:
    """Gaussian radial basis functions on a grid of `centers` points per
    dimension of the scaled box (module docstring): dense, one block per action."""
    low, high = _box(low, high)
    n = _positive_int("centers", centers)
    dims = low.shape[0]
    k = _basis_size("centers", n, dims)
    if sigma is None:
        sigma = 1.0 / (n - 1) if n > 1 else 1.0
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or not 0 < sigma < math.inf:
        raise ValueError(f"sigma: a number > 0 (in units of the box scaled to [0, 1]), got {sigma!r}")
    grid = np.linspace(0.0, 1.0, n) if n > 1 else np.array([0.5])
    pts = jnp.asarray(np.asarray(list(itertools.product(grid, repeat=dims)), np.float32).reshape(k, dims))
    scale = np.float32(-0.5 / float(sigma) ** 2)

    def state_features(x):
        diff = _scaled(x, low, high)[None, :] - pts
        return jnp.exp(scale * jnp.sum(diff * diff, axis=-1))

    fn = per_action(state_features, k, num_actions)
    return FeatureMap(num_features=int(num_actions) * k, fn=fn, params={"centers": n, "sigma": float(sigma)})


# kind -> builder (low, high, num_actions, **params) -> FeatureMap
KINDS: dict[str, Callable[..., FeatureMap]] = {"tiles": tile_coding, "fourier": fourier, "rbf": rbf}


def builder(kind: str) -> Callable[..., FeatureMap]:
    """The builder `kind` names: a built-in kind or `package.module:function`;
    `ValueError` naming `features` lists the kinds."""
    return lookup_callable(kind, KINDS, "features", "feature map", "feature-map builder",
                           f"{', '.join(KINDS)} (or package.module:function for your own)")


def make(kind: str, low, high, num_actions: int, **params) -> FeatureMap:
    """The feature map `kind` for observations in [low, high] and `num_actions`
    actions, with the kind's parameters; `ValueError` naming the field for an
    unknown kind or parameter or a bad value, or a map that does not keep the
    protocol (checked on one observation's shapes)."""
    build = builder(kind)
    sig = inspect.signature(build).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in sig.values()):
        allowed = [n for n in sig if n not in ("low", "high", "num_actions")]
        for name in params:
            if name not in allowed:
                raise ValueError(f"{name}: not a parameter of features {kind!r}; "
                                 f"allowed: {', '.join(allowed) or 'none'}")
    fm = build(low, high, num_actions, **params)
    if not isinstance(fm, FeatureMap):
        raise ValueError(f"features: {kind!r} returned a {type(fm).__name__}, not a FeatureMap")
    check(fm, len(np.atleast_1d(low)), num_actions, kind)
    return fm


def check(fm: FeatureMap, dims: int, num_actions: int, name: str = "features") -> tuple[int, bool]:
    """(row width, sparse) of `fm` on an observation (dims,), after checking the
    protocol's shapes and types; `ValueError` naming `features` otherwise."""
    try:
        out = jax.eval_shape(fm.fn, jax.ShapeDtypeStruct((dims,), jnp.float32))
    except Exception as e:  # the user's function: any error, one line
        raise ValueError(f"features: {name!r} fails on an observation of shape ({dims},): "
                         f"{type(e).__name__}: {e}") from None
    sparse = jnp.issubdtype(out.dtype, jnp.integer)
    if out.ndim != 2 or out.shape[0] != num_actions or not (sparse or jnp.issubdtype(out.dtype, jnp.floating)):
        raise ValueError(f"features: {name!r} gives {out.dtype}{list(out.shape)}; expected ({num_actions}, m) "
                         f"integer indices or ({num_actions}, {fm.num_features}) float vectors")
    if not sparse and out.shape[1] != fm.num_features:
        raise ValueError(f"features: {name!r} gives dense rows of {out.shape[1]}, but num_features is "
                         f"{fm.num_features}")
    return int(out.shape[1]), bool(sparse)


__all__ = ["KINDS", "FeatureMap", "builder", "check", "fourier", "make", "per_action", "rbf", "tile_coding",
           "vector"]
