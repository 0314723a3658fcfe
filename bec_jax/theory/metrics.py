"""The error metrics of a sweep: closed-form affine maps of theta from the model.

Metrics are affine maps of theta followed by a Euclidean norm,
metric(theta) = || W [theta; 1] ||, and W is compressed by a QR factorisation to at
most k + 1 rows. Evaluating one inside a scan costs O(k^2) and stays a sum of
squares of a short vector, so it keeps its relative precision in float32 (an
expanded quadratic form theta^T H theta + 2 h^T theta + h0 cancels catastrophically
near the minimum). `metric_values` is the evaluator the sweep program uses.

The metrics are a registry: `register_metric(name, build, doc)` adds one, where
`build(env)` gives W, and returns its value function `f(env, theta)`;
`metric_names()` lists them (a sweep's `metrics` may name any of them, or a
`MetricDef` of the user's own as `package.module:attribute`) and
`metric(env, name)` builds one, compressed.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax.algorithms import import_attribute
from bec_jax.mdp import FiniteMDP
from bec_jax.theory.fixpoints import (
    RANK_TOL,
    ModelArrays,
    centered_td_fixpoint_set,
    model_arrays,
)


class Metric(NamedTuple):
    """metric(theta) = || R theta + h ||, with R of shape (m, k), m <= k + 1.

    A pytree: cast with `astype` and evaluate with `evaluate` inside jitted code.
    """

    R: jax.Array
    h: jax.Array

    def astype(self, dtype) -> "Metric":
        return Metric(jnp.asarray(self.R, dtype), jnp.asarray(self.h, dtype))


def evaluate(metric: Metric, theta: jax.Array) -> jax.Array:
    """|| R theta + h ||: O(k^2) and a sum of squares of a short vector."""
    e = metric.R @ theta + metric.h
    return jnp.sqrt(jnp.sum(e * e))


def metric_values(metrics, theta, nonzero=None) -> jax.Array:
    """(M, G, N) values ||R theta + h|| of each metric for a batch of weights
    theta (G, N, k), or its k columns theta[..., i] as a sequence of (G, N)
    arrays: the evaluator the sweep program runs every log step.

    Each `Metric` holds either numpy arrays R (m, k), h (m,) (constants, the same
    for every run) or jax arrays R (G, m, k), h (G, m) (one model per grid point,
    e.g. a gamma sweep); `nonzero` then gives the static (m, k) pattern of R's
    nonzeros over all models. The product is unrolled over those nonzeros (R is
    triangular) into elementwise arithmetic. A dot or einsum here would round
    differently depending on the batch shape (even between seeds of one batch),
    which would make a grid point's result depend on the chunk size.

    A metric whose map has no rows (R of shape (0, k): a projection onto
    features that are zero on every state the weighting sees) is defined as 0
    at every theta, as `evaluate` gives.
    """
    cols = list(theta) if isinstance(theta, (list, tuple)) else [theta[..., i] for i in range(theta.shape[-1])]
    dtype, batch = cols[0].dtype, cols[0].shape
    out = []
    for j, m in enumerate(metrics):
        const = isinstance(m.R, np.ndarray)
        pattern = np.asarray(m.R) != 0 if const else np.asarray(nonzero[j])
        ss = None
        for r in range(pattern.shape[0]):
            if const:
                e = jnp.full(batch, m.h[r], dtype)
            else:
                e = jnp.broadcast_to(m.h[:, r][:, None], batch).astype(dtype)
            for i in np.flatnonzero(pattern[r]):
                c = dtype.type(m.R[r, i]) if const else m.R[:, r, i][:, None].astype(dtype)
                e = e + c * cols[i]
            sq = e * e
            ss = sq if ss is None else ss + sq
        out.append(jnp.zeros(batch, dtype) if ss is None else jnp.sqrt(ss))
    return jnp.stack(out)


def _compress(W: np.ndarray) -> Metric:
    R = np.linalg.qr(W, mode="r")
    return Metric(R[:, :-1], R[:, -1])


def _pinv_sqrt(C: np.ndarray) -> np.ndarray:
    """L with L^T L = C^+ (so ||L y||^2 = y^T C^+ y)."""
    w, U = np.linalg.eigh(C)
    tol = RANK_TOL * max(1.0, w.max(initial=0.0))
    keep = w > tol
    return (U[:, keep] / np.sqrt(w[keep])).T


def emphatic_weighting(env: FiniteMDP, interest: float = 1.0) -> np.ndarray:
    """(S,) the emphatic weighting m = (I - P_g^T)^-1 (d_mu * i) of Sutton, Mahmood &
    White (2016) with constant interest i, normalised to sum to 1 (so the emphatic
    metrics are on the same scale as the d_mu-weighted ones). Emphatic TD's
    fixpoint zeroes the projected Bellman error under this weighting."""
    m = model_arrays(env)
    w = np.linalg.solve(np.eye(len(m.d)) - m.Pg.T, m.d * interest)
    return w / w.sum()


class MetricDef(NamedTuple):
    """A metric of the registry: its `name` (as in a spec's `metrics`), its
    documentation, and `build(env)`, the (m, k + 1) matrix W of the affine map
    with metric(theta) = || W [theta; 1] || (float64, from `env`'s model)."""

    name: str
    doc: str
    build: Callable[[FiniteMDP], np.ndarray]


# name -> MetricDef in registration order; `register_metric` adds to it.
METRIC_REGISTRY: dict[str, MetricDef] = {}


def register_metric(name: str, build: Callable[[FiniteMDP], np.ndarray], doc: str, *,
                    replace: bool = False) -> Callable:
    """Adds the metric `name`, theta -> || build(env) [theta; 1] ||, to the
    registry (a sweep's `metrics` may then name it) and returns its value
    function `f(env, theta) -> float`. A name that is already taken is an error
    (`replace=True` overrides)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"metric: the name must be a non-empty string without ':', got {name!r}")
    if name in METRIC_REGISTRY and not replace and METRIC_REGISTRY[name].build is not build:
        raise ValueError(f"metric: the name {name!r} is already registered; choose another name")
    METRIC_REGISTRY[name] = MetricDef(name, doc, build)

    def value(env: FiniteMDP, theta) -> float:
        M = metric(env, name)
        e = M.R @ np.asarray(theta, np.float64) + M.h
        return float(np.sqrt(e @ e))

    value.__name__ = value.__qualname__ = name
    value.__doc__ = f"{doc}\n\nIts value at one theta (float64); `metric(env, {name!r})` is its map."
    return value


def metric_names() -> list[str]:
    """The registered metric names, in registration order (the built-ins first)."""
    return list(METRIC_REGISTRY)


def metric_def(ref: str, field: str = "metric") -> MetricDef:
    """The metric `ref` names: a registered name, or a `package.module:attribute`
    reference to a `MetricDef` (imported, not registered). `ValueError` naming
    `field` lists the known names."""
    if ref in METRIC_REGISTRY:
        return METRIC_REGISTRY[ref]
    if isinstance(ref, str) and ":" in ref:
        found = import_attribute(ref, field)
        if not isinstance(found, MetricDef):
            raise ValueError(f"{field}: {ref!r} is a {type(found).__name__}, not a bec_jax.theory.metrics.MetricDef")
        return found
    raise ValueError(f"{field}: unknown metric {ref!r}; known: {', '.join(METRIC_REGISTRY)} "
                     "(or package.module:attribute for your own)")


def metric(env: FiniteMDP, name: str) -> Metric:
    """The closed-form metric `name` of `env` (float64): its affine map,
    compressed (see `Metric`). `name` is registered or a `package.module:attribute`
    reference; `metric_names()` lists the registered ones, and
    `metric_def(name).doc` says what each measures."""
    return _compress(metric_def(name).build(env))


# The built-in metrics. D = diag(d_mu), delta_bar = r + P_g Phi theta - Phi theta
# the expected TD error under pi, and Pi the D-weighted projection onto the
# feature span. The emphatic variants put the emphatic weighting m
# (`emphatic_weighting`, interest 1) in place of d_mu, both for the norm and the
# projection and centering: the ETD literature (Sutton, Mahmood & White 2016)
# measures the error in this weighting.

def _weighting(env: FiniteMDP, emphatic: bool) -> tuple[ModelArrays, np.ndarray]:
    m = model_arrays(env)
    return m, emphatic_weighting(env) if emphatic else m.d


def _bellman_map(m: ModelArrays) -> np.ndarray:
    """[M, r] with delta_bar(theta) = [M, r] [theta; 1]."""
    return np.hstack([(m.Pg - np.eye(len(m.d))) @ m.phi, m.r[:, None]])


def _centering(w: np.ndarray) -> np.ndarray:
    S = len(w)
    return np.eye(S) - np.outer(np.ones(S), w)


def _rmscbe_map(env: FiniteMDP) -> np.ndarray:
    m, w = _weighting(env, False)
    return np.sqrt(w)[:, None] * (_centering(w) @ _bellman_map(m))


def _rmsbe_map(env: FiniteMDP) -> np.ndarray:
    m, w = _weighting(env, False)
    return np.sqrt(w)[:, None] * _bellman_map(m)


def _projected_map(env: FiniteMDP, centered: bool, emphatic: bool) -> np.ndarray:
    """The projected error's map; with C = Phi^T D Phi rank-deficient, C's
    pseudo-inverse (rank-deficient features are legal). Where C = 0 (features zero
    on every weighted state) the map has no rows and the metric is 0."""
    m, w = _weighting(env, emphatic)
    x = _centering(w) @ _bellman_map(m) if centered else _bellman_map(m)
    return _pinv_sqrt(m.phi.T @ np.diag(w) @ m.phi) @ (m.phi.T @ (w[:, None] * x))


def _value_error_map(env: FiniteMDP, emphatic: bool) -> np.ndarray:
    m, w = _weighting(env, emphatic)
    v = np.linalg.solve(np.eye(len(m.d)) - m.Pg, m.r)
    return np.sqrt(w)[:, None] * np.hstack([m.phi, -v[:, None]])


def _fixpoint_distance_map(env: FiniteMDP) -> np.ndarray:
    fs = centered_td_fixpoint_set(env)
    P = np.eye(len(fs.theta)) - fs.null_space @ fs.null_space.T  # drops the directions along the set
    return np.hstack([P, -(P @ fs.theta)[:, None]])


rmscbe = register_metric(
    "rmscbe", _rmscbe_map,
    "Root mean squared centered Bellman error || delta_bar - (d^T delta_bar) 1 ||_D (the paper's RMSCBE).")
rmspcbe = register_metric(
    "rmspcbe", functools.partial(_projected_map, centered=True, emphatic=False),
    "Root mean squared projected centered Bellman error || Pi (delta_bar - (d^T delta_bar) 1) ||_D "
    "(zero at the centered TD fixpoint).")
rmspbe = register_metric(
    "rmspbe", functools.partial(_projected_map, centered=False, emphatic=False),
    "Root mean squared projected Bellman error || Pi delta_bar ||_D (zero at the TD fixpoint; "
    "Ghiassian et al. 2020's error, sqrt((b - A theta)^T C^+ (b - A theta))).")
rmsve = register_metric(
    "rmsve", functools.partial(_value_error_map, emphatic=False),
    "Root mean squared value error || Phi theta - v_pi ||_D.")
rmsbe = register_metric(
    "rmsbe", _rmsbe_map, "Root mean squared (uncentered) Bellman error || delta_bar ||_D.")
rmspbe_emphatic = register_metric(
    "rmspbe_emphatic", functools.partial(_projected_map, centered=False, emphatic=True),
    "RMSPBE under the emphatic weighting (zero at emphatic TD's fixpoint).")
rmspcbe_emphatic = register_metric(
    "rmspcbe_emphatic", functools.partial(_projected_map, centered=True, emphatic=True),
    "RMSPCBE under the emphatic weighting (zero at centered emphatic TD's fixpoint).")
rmsve_emphatic = register_metric(
    "rmsve_emphatic", functools.partial(_value_error_map, emphatic=True), "RMSVE under the emphatic weighting.")
fixpoint_distance = register_metric(
    "fixpoint_distance", _fixpoint_distance_map,
    "Euclidean distance from theta to the centered TD fixpoint set (along the directions off the set).")

METRICS = tuple(metric_names())  # the built-in metrics; `metric_names()` adds the registered ones

__all__ = ["METRICS", "METRIC_REGISTRY", "Metric", "MetricDef", "emphatic_weighting", "evaluate",
           "fixpoint_distance", "metric", "metric_def", "metric_names", "metric_values", "register_metric",
           "rmsbe", "rmscbe", "rmspbe", "rmspbe_emphatic", "rmspcbe", "rmspcbe_emphatic", "rmsve",
           "rmsve_emphatic"]
