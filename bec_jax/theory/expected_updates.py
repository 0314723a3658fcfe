"""The expected updates of an algorithm on a model, in float64.

Its job is the expected updates, derived from an algorithm's own update
function, not written per algorithm (`expected_update`): for a linear method,
the mean increment over s ~ d_mu, a ~ mu, s' ~ P is affine in the state,
G x + g, and is read off by enumerating the outcomes and differentiating. From
them come the ODE's eigenvalues (`ode_eigenvalues`) and the two-timescale
slow matrix (`slow_ode_matrix`).

The closed-form TD fixpoints live in `bec_jax.theory.fixpoints`, the error
metrics in `bec_jax.theory.metrics`: import them from there.
"""
from __future__ import annotations

import functools
import threading
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax import algorithms as algorithms_lib
from bec_jax import mdp as mdp_lib
from bec_jax.algorithms.base import ModelStats
from bec_jax.mdp import FiniteMDP
from bec_jax.theory.fixpoints import RANK_TOL
from bec_jax.transition import Transition

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
    scale), other hyperparameters to their declared defaults (`Algorithm.resolve_hyperparameters`)."""
    return alg.resolve_hyperparameters(hyperparameters, step_size=1.0)


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
    Y = np.linalg.pinv(Gyy, rcond=RANK_TOL) @ Gyt
    if np.abs(Gyy @ Y - Gyt).max(initial=0.0) > 1e-8 * max(1.0, np.abs(Gyt).max(initial=0.0)):
        raise ValueError(f"algorithm: the fast recursions of {alg.name} have no equilibrium for some "
                         f"{alg.weights}, so there is no two-timescale limit")
    return Gtt - Gty @ Y
