"""Exact quantities from the model matrices, in float64.

Notation (all from the model; d = d_mu, D = diag(d), r = r_pi, and
P_g = sum_a pi(a|s) P(s'|s,a) gamma(s,a,s') the discounted target matrix, which
is gamma P_pi for a constant gamma; see `mdp.discounted_matrix`):
  TD:        A = Phi^T D (I - P_g) Phi,            b = Phi^T D r
  centered:  A_c = Phi^T (D - d d^T)(I - P_g) Phi, b_c = Phi^T (D - d d^T) r
  C = Phi^T D Phi.
With per-transition discounts (episodic tasks) these are the standard forms of
transition-based discounting (White 2017): the Bellman operator is
T v = r + P_g v. The centered TD fixpoint solves A_c theta = b_c (paper eq. (27)
[centeredTDfixpoint] and Theorem 1). When A_c is singular (Boyan: the constant
vector is in the feature span; Baird: more features than states) the fixpoints
form an affine subspace: `centered_td_fixpoint` returns its minimum-norm point,
`fixpoint_set` the whole set.

Expected updates are derived from an algorithm's own update function, not
written per algorithm (`expected_update`): for a linear method, the mean
increment over s ~ d_mu, a ~ mu, s' ~ P is affine in the state, G x + g, and
is read off by enumerating the outcomes and differentiating.

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
import threading
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax import algorithms as algorithms_lib
from bec_jax import mdp as mdp_lib
from bec_jax.algorithms.base import ModelStats
from bec_jax.mdp import FiniteMDP
from bec_jax.transition import Transition

_RANK_TOL = 1e-10


class _Model(NamedTuple):
    phi: np.ndarray
    d: np.ndarray
    Pg: np.ndarray   # discounted target matrix P_g
    r: np.ndarray


def _model(env: FiniteMDP) -> _Model:
    return _Model(np.asarray(env.phi, np.float64), mdp_lib.d_mu(env), mdp_lib.P_pi_gamma(env),
                  mdp_lib.r_pi(env))


def td_matrices(env: FiniteMDP) -> tuple[np.ndarray, np.ndarray]:
    """(A, b) of the off-policy TD fixpoint A theta = b, with d = d_mu."""
    m = _model(env)
    D = np.diag(m.d)
    A = m.phi.T @ D @ (np.eye(len(m.d)) - m.Pg) @ m.phi
    return A, m.phi.T @ D @ m.r


def centered_td_matrices(env: FiniteMDP) -> tuple[np.ndarray, np.ndarray]:
    """(A_c, b_c) of the centered TD fixpoint: A_c = Phi^T (D - d d^T)(I - P_g) Phi,
    b_c = Phi^T (D - d d^T) r, d = d_mu. A_c is the (off-policy) CTD matrix of the
    paper's lemma and of Theorem 1 (there written Cov(phi, phi - gamma phi'))."""
    m = _model(env)
    K = np.diag(m.d) - np.outer(m.d, m.d)
    A = m.phi.T @ K @ (np.eye(len(m.d)) - m.Pg) @ m.phi
    return A, m.phi.T @ K @ m.r


def feature_covariance(env: FiniteMDP) -> np.ndarray:
    """C = E[phi phi^T] = Phi^T D Phi under d_mu (TDC's auxiliary matrix)."""
    m = _model(env)
    return m.phi.T @ np.diag(m.d) @ m.phi


class FixpointSet(NamedTuple):
    """The solutions of A theta = b.

    Attributes:
      theta: the minimum-norm (least-squares) solution.
      null_space: (k, k - rank) orthonormal basis of null(A); every
        theta + null_space @ z is a fixpoint too (empty when A is nonsingular).
      rank: rank of A.
      residual: ||A theta - b|| (0 up to rounding when a solution exists).
    """

    theta: np.ndarray
    null_space: np.ndarray
    rank: int
    residual: float

    @property
    def unique(self) -> bool:
        return self.null_space.shape[1] == 0

    def describe(self) -> str:
        if self.unique:
            return "unique fixpoint"
        return (f"fixpoints form an affine subspace of dimension {self.null_space.shape[1]} "
                f"(A has rank {self.rank}); minimum-norm point returned")


def fixpoint_set(A: np.ndarray, b: np.ndarray) -> FixpointSet:
    """All solutions of A theta = b via the SVD: the minimum-norm point and null(A)."""
    U, s, Vt = np.linalg.svd(A)
    tol = _RANK_TOL * max(1.0, s.max(initial=0.0))
    rank = int(np.sum(s > tol))
    s_inv = np.where(s > tol, 1.0 / np.where(s > tol, s, 1.0), 0.0)
    theta = Vt.T @ (s_inv * (U.T @ b))
    return FixpointSet(theta, Vt[rank:].T, rank, float(np.linalg.norm(A @ theta - b)))


def centered_td_fixpoint_set(env: FiniteMDP) -> FixpointSet:
    """The set of centered TD fixpoints (paper eq. centeredTDfixpoint)."""
    return fixpoint_set(*centered_td_matrices(env))


def centered_td_fixpoint(env: FiniteMDP) -> np.ndarray:
    """The minimum-norm centered TD fixpoint A_c^+ b_c (see `centered_td_fixpoint_set`
    for whether it is unique)."""
    return centered_td_fixpoint_set(env).theta


def td_fixpoint_set(env: FiniteMDP) -> FixpointSet:
    """The set of (off-policy) TD fixpoints A theta = b."""
    return fixpoint_set(*td_matrices(env))


def td_fixpoint(env: FiniteMDP) -> np.ndarray:
    """The minimum-norm TD fixpoint."""
    return td_fixpoint_set(env).theta


# ---------------------------------------------------------------- expected updates

def outcomes(env: FiniteMDP) -> tuple[np.ndarray, Transition]:
    """Every (s, a, s') of positive probability d_mu(s) mu(a|s) P(s'|s,a), as
    (weights (n,), a `Transition` batch of n) in float64: the i.i.d. setting of
    the paper's theorems."""
    w = mdp_lib.d_mu(env)[:, None, None] * np.asarray(env.mu)[:, :, None] * np.asarray(env.P)
    s, a, t = np.nonzero(w > 0)
    phi = np.asarray(env.phi, np.float64)
    tr = Transition(phi=phi[s], reward=np.asarray(env.R, np.float64)[s, a, t],
                    discount=mdp_lib.discounts(env)[s, a, t], phi_next=phi[t],
                    rho=mdp_lib.rho(env)[s, a])
    return w[s, a, t], tr


def _leaf_names(tree) -> list[str]:
    out = []
    for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
        out.append(jax.tree_util.keystr(path).lstrip(".").replace("[", "").replace("]", "")
                   .replace("'", "") or "state")
    return out


class _Flat(NamedTuple):
    treedef: object
    leaves: list          # the template's leaves (non-float ones are kept as they are)
    float_idx: list       # which leaves are stacked into x
    shapes: list
    layout: dict          # field name -> slice of x
    trace_idx: list       # which leaves are traces (set to their expectation per outcome)
    trace_names: list


def _flatten_spec(alg, k: int) -> _Flat:
    template = alg.init(jnp.zeros(k, jnp.float64))
    leaves, treedef = jax.tree_util.tree_flatten(template)
    names = _leaf_names(template)
    unknown = set(alg.traces) - set(names)
    if unknown:
        raise ValueError(f"algorithm: {alg.name} declares traces {sorted(unknown)}, which are not fields of "
                         f"its state ({', '.join(names)})")
    float_idx, shapes, layout, i, trace_idx, trace_names = [], [], {}, 0, [], []
    for j, x in enumerate(leaves):
        x = jnp.asarray(x)
        if names[j] in alg.traces:
            trace_idx.append(j)
            trace_names.append(names[j])
        elif jnp.issubdtype(x.dtype, jnp.floating):
            float_idx.append(j)
            shapes.append(x.shape)
            layout[names[j]] = slice(i, i + int(np.prod(x.shape)))
            i += int(np.prod(x.shape))
    return _Flat(treedef, leaves, float_idx, shapes, layout, trace_idx, trace_names)


def _hyperparameters(alg, hyperparameters: dict | None) -> tuple[dict, dict]:
    """(traced values, static values): step sizes default to 1 (the ODE's time
    scale), other hyperparameters to their declared defaults."""
    given = dict(hyperparameters or {})
    for n in given:
        alg.hyperparameter(n)  # ValueError naming an undeclared one
    traced, static = {}, {}
    for h in alg.hyperparameters:
        if h.name in given:
            v = h.check(given[h.name], f"hyperparameters.{h.name}")
        elif h.step_size:
            v = 1.0
        elif h.default is not None:
            v = h.default
        else:
            raise ValueError(f"hyperparameters.{h.name}: {alg.name} needs a value for {h.name} "
                             f"(in {h.range_text}); it has no default")
        (static if h.static else traced)[h.name] = v
    return traced, static


def model_stats(env: FiniteMDP) -> ModelStats:
    """The model quantities a trace's stationary expectation is computed from."""
    return ModelStats(d=mdp_lib.d_mu(env), P_g=mdp_lib.P_pi_gamma(env), phi=np.asarray(env.phi, np.float64))


# Rows of states the mean increment is evaluated at: x = 0, the unit vectors and
# these many random states (the affine check).
_CHECK_ROWS = 4


def _bucket(n: int) -> int:
    """Outcome counts are padded (with weight 0) to a power of two, so models of
    one feature count share a compiled evaluator."""
    return 1 << max(4, (n - 1).bit_length())


@functools.lru_cache(maxsize=256)
def _evaluator(alg, static_items: tuple, k: int, n_outcomes: int):
    """A compiled function (X, tr, w, hp, traces) -> mean increments at the rows of
    X, for one algorithm, static hyperparameters, feature count and (padded)
    outcome count. Compiled ahead of time at LLVM -O1 on CPU: these programs are
    small, and a suite of models asks for dozens of them."""
    flat = _flatten_spec(alg, k)
    static = dict(static_items)
    n = sum(int(np.prod(s)) for s in flat.shapes)

    def unflatten(x, traces):
        leaves = list(flat.leaves)
        i = 0
        for j, shape in zip(flat.float_idx, flat.shapes):
            m = int(np.prod(shape))
            leaves[j] = x[i:i + m].reshape(shape)
            i += m
        for j, t in zip(flat.trace_idx, traces):
            leaves[j] = t
        return jax.tree_util.tree_unflatten(flat.treedef, leaves)

    def ravel(state):
        leaves = jax.tree_util.tree_leaves(state)
        return jnp.concatenate([jnp.ravel(leaves[j]).astype(jnp.float64) for j in flat.float_idx])

    def mean_increment(x, tr, w, hp, traces):
        new = jax.vmap(lambda t, tv: alg.apply(unflatten(x, tv), t, {**hp, **static}))(tr, traces)
        inc = jax.vmap(ravel)(new) - x[None, :]
        return w @ inc

    fn = jax.jit(jax.vmap(mean_increment, in_axes=(0, None, None, None, None)))
    return flat, n, fn


def _compiled(fn, args):
    """`fn` lowered and compiled for `args` (cached by the argument shapes)."""
    key = (id(fn), tuple((a.shape, a.dtype) for a in jax.tree_util.tree_leaves(args)))
    exe = _COMPILED.get(key)
    if exe is None:
        opts = {"xla_backend_optimization_level": 1} if jax.devices()[0].platform == "cpu" else None
        exe = fn.lower(*args).compile(opts)
        _COMPILED[key] = exe
    return exe


_COMPILED: dict = {}


def state_layout(env: FiniteMDP, alg) -> dict:
    """{field: slice} of the stacked state x that `expected_update` uses: the
    state's floating-point leaves in order (for NamedTuple states: their fields,
    e.g. theta, u, omega); integer leaves such as the update count, and the
    traces the algorithm declares, left out."""
    alg = algorithms_lib.get(alg)
    with jax.enable_x64(True):
        return dict(_flatten_spec(alg, env.num_features).layout)


class _Prepared(NamedTuple):
    """A model's side of `expected_update`, the same for every algorithm and point."""

    size: int        # outcomes, padded (`_bucket`)
    w: np.ndarray    # (size,) weights, 0 on the padding
    tr: Transition   # (size,) outcomes, the first repeated as padding
    s_of: np.ndarray  # each outcome's state

    def pad(self, a: np.ndarray) -> np.ndarray:
        return np.concatenate([a, np.repeat(a[:1], self.size - len(a), axis=0)])


_PREPARED: dict = {}  # `mdp.fingerprint` of a model -> _Prepared, the last used last
_PREPARED_LOCK = threading.Lock()


def _prepared(env: FiniteMDP) -> _Prepared:
    """`_Prepared` of `env`, computed once for the last few models asked about:
    an analysis of every point of a grid asks about one model again and again
    (the outcomes alone cost twice what the rest of a point's analysis does).
    Kept by the model's fingerprint: a model changed in place gets its own."""
    key = mdp_lib.fingerprint(env)
    with _PREPARED_LOCK:
        hit = _PREPARED.pop(key, None)
        if hit is not None:
            _PREPARED[key] = hit
            return hit
    w, tr = outcomes(env)
    s_of = np.nonzero(mdp_lib.d_mu(env)[:, None, None] * np.asarray(env.mu)[:, :, None] * np.asarray(env.P) > 0)[0]
    size = _bucket(len(w))
    m = _Prepared(size, np.concatenate([w, np.zeros(size - len(w))]), tr, s_of)
    m = m._replace(tr=jax.tree_util.tree_map(lambda v: m.pad(np.asarray(v, np.float64)), tr))
    for a in (m.w, m.s_of, *m.tr):
        a.flags.writeable = False  # shared by every later call
    with _PREPARED_LOCK:
        while len(_PREPARED) >= 8:
            _PREPARED.pop(next(iter(_PREPARED)))
        _PREPARED[key] = m
    return m


@functools.lru_cache(maxsize=64)
def _rows(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(random states, every row) the mean increment is evaluated at, for a state
    of n numbers: x = 0 gives g, the unit vectors G's columns (exact for an affine
    map), and random states of two scales check that it is affine."""
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.normal(size=(_CHECK_ROWS // 2, n)),
                         100.0 * rng.normal(size=(_CHECK_ROWS - _CHECK_ROWS // 2, n))])
    X = np.concatenate([np.zeros((1, n)), np.eye(n), xs])
    xs.flags.writeable = X.flags.writeable = False  # shared by every call
    return xs, X


def expected_update(env: FiniteMDP, alg, hyperparameters: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(G, g) with E[x_{t+1} - x_t | x_t = x] = G x + g under i.i.d. samples
    s ~ d_mu, a ~ mu, s' ~ P, where x stacks the state's floating-point fields
    (`state_layout`).

    Derived from the algorithm's own update function: the mean increment is
    computed by enumerating the (s, a, s') outcomes in float64; g is its value
    at x = 0 and G's columns its increments at the unit vectors (exact for an
    affine map). A trace the algorithm declares
    (`Algorithm.traces`: the followon trace of emphatic TD, the eligibility trace
    of centered TD(lambda)) is set, for each outcome, to its stationary
    expectation given s; the update is affine in the rest given the trace, and
    the trace depends on the past only, so this is the exact expected update of
    the Markov chain's stationary regime. An update that is not affine in its
    (non-trace) state is refused with a `ValueError`.

    Args:
      env: the model.
      alg: a registered name, an `Algorithm` or "package.module:attribute".
      hyperparameters: {name: value}; step sizes default to 1, which makes G the
        algorithm's ODE matrix (the recursion is locally stable when every
        eigenvalue has negative real part); other hyperparameters default to
        their declared defaults.
    """
    alg = algorithms_lib.get(alg)
    traced, static = _hyperparameters(alg, hyperparameters)
    m = _prepared(env)
    with jax.enable_x64(True):
        flat, n, fn = _evaluator(alg, tuple(sorted(static.items())), env.num_features, m.size)
        if n == 0:
            raise ValueError(f"algorithm: {alg.name}'s state has no floating-point fields to analyse")
        stats = model_stats(env) if flat.trace_names else None
        traces = tuple(m.pad(np.asarray(alg.traces[name](stats, {**traced, **static}), np.float64)[m.s_of])
                       for name in flat.trace_names)
        hp = {name: np.asarray(v, np.float64) for name, v in traced.items()}
        xs, X = _rows(n)
        args = (X, m.tr, m.w, hp, traces)
        F = np.asarray(_compiled(fn, args)(*args), np.float64)
    g = F[0]
    G = (F[1:n + 1] - g).T
    got = F[n + 1:]
    want = xs @ G.T + g
    scale = np.abs(G).max(initial=0.0) * np.abs(xs).max() * n + np.abs(g).max(initial=0.0) + 1.0
    err = np.abs(got - want).max()
    if not np.isfinite(err) or err > 1e-9 * scale:
        raise ValueError(f"algorithm: {alg.name}'s expected update is not affine in its state "
                         f"(off by {err:.3g} at a random state); the exact analysis covers linear "
                         "methods whose mean increment is G x + g")
    return G, g


def ode_eigenvalues(env: FiniteMDP, alg, hyperparameters: dict | None = None) -> np.ndarray:
    """Eigenvalues of the expected-update matrix G of `expected_update`."""
    return np.linalg.eigvals(expected_update(env, alg, hyperparameters)[0])


def slow_ode_matrix(env: FiniteMDP, alg, hyperparameters: dict | None = None) -> np.ndarray:
    """The ODE matrix of the value weights once the faster recursions have
    equilibrated (the two-timescale limit of Theorems 1 and 2).

    Generic: with x = (theta, y) split into the algorithm's `weights` field and
    everything else, and G from `expected_update` at unit step sizes, it is the
    Schur complement G_tt - G_ty G_yy^+ G_yt: y sits at its quasi-static
    equilibrium G_yy y + G_yt theta + g_y = 0 (the minimum-norm one where G_yy is
    singular). For the built-in methods this gives -A (TD), -A^T C^+ A (TDC), -A_c
    (CTD, VRC), -A (SRC: rbar does not depend on theta) and -A^T C^+ A_c (CTDC).
    For CTDC the correction -gamma phi' phi^T u is not centered, so the uncentered
    TD matrix A stands on the left. (The proof of Theorem 2 writes
    -A_c^T C^-1 A_c, which would be stable wherever A_c is nonsingular; on the
    2-state counterexample the actual matrix is -A^T C^-1 A_c = +0.02.)

    `ValueError` when the fast block has an unstable mode or no equilibrium for
    some theta: then the two-timescale limit does not apply.
    """
    alg = algorithms_lib.get(alg)
    G, _ = expected_update(env, alg, hyperparameters)
    layout = state_layout(env, alg)
    if alg.weights not in layout:
        raise ValueError(f"algorithm: {alg.name} declares weights {alg.weights!r}, which is not a "
                         f"floating-point field of its state ({', '.join(layout)})")
    t = np.zeros(G.shape[0], bool)
    t[layout[alg.weights]] = True
    Gtt, Gty, Gyt, Gyy = G[np.ix_(t, t)], G[np.ix_(t, ~t)], G[np.ix_(~t, t)], G[np.ix_(~t, ~t)]
    if Gyy.size == 0:
        return Gtt
    if np.linalg.eigvals(Gyy).real.max() > 1e-10:
        raise ValueError(f"algorithm: the recursions of {alg.name} other than {alg.weights} are unstable "
                         "on their own, so there is no two-timescale limit")
    Y = np.linalg.pinv(Gyy, rcond=_RANK_TOL) @ Gyt
    if np.abs(Gyy @ Y - Gyt).max(initial=0.0) > 1e-8 * max(1.0, np.abs(Gyt).max(initial=0.0)):
        raise ValueError(f"algorithm: the fast recursions of {alg.name} have no equilibrium for some "
                         f"{alg.weights}, so there is no two-timescale limit")
    return Gtt - Gty @ Y


# ----------------------------------------------------------------------- metrics

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
        out.append(jnp.sqrt(ss))
    return jnp.stack(out)


def _compress(W: np.ndarray) -> Metric:
    R = np.linalg.qr(W, mode="r")
    return Metric(R[:, :-1], R[:, -1])


def _pinv_sqrt(C: np.ndarray) -> np.ndarray:
    """L with L^T L = C^+ (so ||L y||^2 = y^T C^+ y)."""
    w, U = np.linalg.eigh(C)
    tol = _RANK_TOL * max(1.0, w.max(initial=0.0))
    keep = w > tol
    return (U[:, keep] / np.sqrt(w[keep])).T


def emphatic_weighting(env: FiniteMDP, interest: float = 1.0) -> np.ndarray:
    """(S,) the emphatic weighting m = (I - P_g^T)^-1 (d_mu * i) of Sutton, Mahmood &
    White (2016) with constant interest i, normalised to sum to 1 (so the emphatic
    metrics are on the same scale as the d_mu-weighted ones). Emphatic TD's
    fixpoint zeroes the projected Bellman error under this weighting."""
    m = _model(env)
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
        found = algorithms_lib.import_attribute(ref, field)
        if not isinstance(found, MetricDef):
            raise ValueError(f"{field}: {ref!r} is a {type(found).__name__}, not a bec_jax analysis.MetricDef")
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

def _weighting(env: FiniteMDP, emphatic: bool) -> tuple[_Model, np.ndarray]:
    m = _model(env)
    return m, emphatic_weighting(env) if emphatic else m.d


def _bellman_map(m: _Model) -> np.ndarray:
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
