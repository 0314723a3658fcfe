"""Exact mean-square stability of a linear method's recursion, from the model.

The mean of a linear method's iterates can converge while every run diverges:
the sampling noise grows the second moment. For a one-step linear method at
constant step sizes the recursion is, per sampled transition Y_t = (S_t, A_t,
S_{t+1}),

    x_{t+1} = Gamma(Y_t) x_t + b(Y_t),        Gamma(Y) = I + A(Y),

with the step sizes folded into A and b (x stacks the state's floating-point
fields, as in `analysis.state_layout`). Gamma and b are read off the
algorithm's own update function, outcome by outcome, as `analysis.expected_update`
reads its mean (g from x = 0, the columns from the unit vectors, and a check that
the update is affine). Nothing here is written per algorithm.

Under Markov sampling this is a Markov jump linear system (Costa, Fragoso &
Marques, *Discrete-Time Markov Jump Linear Systems*, 2005, ch. 3). Its mode is
the state S_t: given S_t, the outcome (A_t, S_{t+1}) is independent of x_t, so
the moments conditioned on the mode,
q_s(t) = E[x_t 1{S_t = s}] and Z_s(t) = E[x_t x_t^T 1{S_t = s}], obey

    q_{s'}(t+1) = sum_{(s,a)} p(a, s' | s) Gamma q_s               (+ affine terms)
    Z_{s'}(t+1) = sum_{(s,a)} p(a, s' | s) Gamma Z_s Gamma^T        (+ affine terms)

(CFM Prop. 3.1 with the operator their T; here p(a, s' | s) = mu(a|s) P(s'|s, a)
and Gamma = Gamma(s, a, s')). The recursion is mean-square stable iff the
spectral radius of the second-moment operator is < 1 (CFM Thm. 3.9), and stable
in the mean iff that of the first-moment operator is < 1; the first implies the
second. Under i.i.d. sampling there is one mode and the operators are
E[Gamma] and E[Gamma (x) Gamma].

Neutral directions: where every sample leaves a direction n unchanged
(A(Y) n = 0 for every outcome, e.g. Baird's feature null space), the component
of x along n never moves under the homogeneous part and the recursion off it is
closed. Those directions are factored out (`MeanSquare.neutral` counts them);
radii and stationary moments are those of the rest. Along them the affine part
makes x random-walk, which no metric that is constant along the fixpoint set
sees.

Trace methods (centered TD(lambda), emphatic TD) are refused: their trace is a
continuous-valued part of the mode, so the system is not a finite jump linear
system (an augmented state (x, e) is not linear either: the update multiplies
e by the TD error of x).

The spectral radius is computed from the operator's structure: for a small
problem the operator on symmetric matrices is formed from its blocks; for a
large one it is applied without being formed and ARPACK's Arnoldi iteration
(`scipy.sparse.linalg.eigs`) finds the eigenvalue of largest real part, which is
the spectral radius because the operator maps positive semidefinite matrices to
positive semidefinite ones (Krein-Rutman; CFM Prop. 3.6).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bec_jax import algorithms as algorithms_lib
from bec_jax import mdp as mdp_lib
from bec_jax.mdp import FiniteMDP
from bec_jax.transition import Transition

SAMPLERS = ("markov", "iid")
# Relative rank tolerance: a direction is neutral when every outcome's A(Y) maps
# it below this times the largest |A(Y)| (rounding of float64 products).
NEUTRAL_TOL = 1e-10
# A radius within this of 1 is marginal: a mode that neither grows nor decays
# exponentially (an eigenvalue that is 1 in exact arithmetic: a direction of the
# fixpoint set that some samples move, e.g. the constant of tabular features in an
# episodic task), counted as stable, as `verdicts.exact` counts neutral modes.
MARGINAL_TOL = 1e-9
# Next to such a mode of the mean the second moment often grows, slowly and for
# real: the noise multiplies the marginal direction, E[(1 + e)^2] = 1 + O(alpha^2)
# (the random walk's CTDC: simple eigenvalues 1 + 4e-9 at alpha 1/64 to 1 + 4.7e-4
# at 1/2, unmoved by perturbations of 1e-12, so no rounding of a Jordan block). It
# is reported as growth; a typical run need not grow (its almost-sure rate is at
# most the RMS rate, and can be negative).
# Operators on symmetric matrices of at most this many dimensions are formed and
# their eigenvalues computed by LAPACK; larger ones are applied matrix-free and
# ARPACK's Arnoldi iteration finds the radius. Near radius 1 (small step sizes)
# the top of the spectrum is clustered within ~1e-5 and Arnoldi needs hundreds
# to thousands of products; LAPACK's cubic cost overtakes that at a few hundred
# dimensions (Boyan's CTDC, 468: LAPACK faster; Baird's, 735: Arnoldi faster;
# benchmarks/README.md).
DENSE_MAX = 500
# The stationary moments solve (I - T) Z = C: densely (LU) up to this many
# dimensions, where GMRES would need about 1 / (1 - radius) iterations.
STATIONARY_DENSE_MAX = 4000


class JumpSystem(NamedTuple):
    """x_{t+1} = gamma[i] x_t + b[i] for outcome i, drawn in mode src[i] with
    probability p[i] given the mode, leading to mode dst[i].

    Markov sampling: the modes are the states of positive d_mu; i.i.d.: one mode.
    All arrays float64; `pi` is the stationary distribution of the modes.
    """

    gamma: np.ndarray   # (m, n, n)
    b: np.ndarray       # (m, n)
    p: np.ndarray       # (m,)
    src: np.ndarray     # (m,) int
    dst: np.ndarray     # (m,) int
    pi: np.ndarray      # (modes,)

    @property
    def modes(self) -> int:
        """Number of modes (states of positive d_mu; 1 under i.i.d. sampling)."""
        return len(self.pi)

    @property
    def size(self) -> int:
        """n, the length of the stacked state x."""
        return self.gamma.shape[1]

    def second_moment(self, Z: np.ndarray) -> np.ndarray:
        """Z (modes, n, n) -> sum_i p_i Gamma_i Z_{src_i} Gamma_i^T, collected at
        dst_i: CFM's operator T (no affine term)."""
        G = self.gamma
        GZG = (G @ Z[self.src]) @ np.swapaxes(G, 1, 2) * self.p[:, None, None]
        out = np.zeros_like(Z)
        np.add.at(out, self.dst, GZG)
        return out

    def first_moment_matrix(self) -> np.ndarray:
        """The first-moment operator as a (modes * n, modes * n) matrix."""
        n, M = self.size, self.modes
        B = np.zeros((M, n, M, n))
        np.add.at(B, (self.dst, slice(None), self.src), self.p[:, None, None] * self.gamma)
        return B.reshape(M * n, M * n)

    def second_moment_matrix(self) -> np.ndarray:
        """CFM's operator T as a dense (modes * n^2, modes * n^2) matrix acting on
        the row-major vec of (Z_1, ..., Z_modes): vec(G Z G^T) = (G (x) G) vec(Z)."""
        n, M = self.size, self.modes
        T = np.zeros((M, n * n, M, n * n))
        kron = np.einsum("ijk,ilm->ijlkm", self.gamma, self.gamma).reshape(-1, n * n, n * n)
        np.add.at(T, (self.dst, slice(None), self.src), self.p[:, None, None] * kron)
        return T.reshape(M * n * n, M * n * n)


class Stationary(NamedTuple):
    """The stationary moments of x off the neutral directions (x's component in
    the range of `MeanSquare.basis`), at constant step sizes.

    Attributes:
      mean: (n,) E[x] in the stationary regime.
      second: (n, n) E[x x^T].
      fixpoint: (n,) the mean dynamics' fixpoint (solution of G x + g = 0 off the
        neutral directions); under Markov sampling `mean` differs from it by a bias.
    """

    mean: np.ndarray
    second: np.ndarray
    fixpoint: np.ndarray

    @property
    def rms_to_fixpoint(self) -> float:
        """sqrt(E ||x - fixpoint||^2): the stationary spread around the fixpoint."""
        e2 = np.trace(self.second) - 2 * self.mean @ self.fixpoint + self.fixpoint @ self.fixpoint
        return float(np.sqrt(max(e2, 0.0)))


class MeanSquare(NamedTuple):
    """The exact mean and mean-square stability of a recursion (`mean_square`).

    Rates are per-step logarithms of growth factors, one sign convention: < 0
    decays, > 0 grows. `rate` is that of the RMS, sqrt(E|x|^2) ~ radius^(t/2).

    Attributes:
      sampler: "markov" or "iid".
      bounded: the second moment does not grow exponentially (radius <= 1 +
        MARGINAL_TOL; see `marginal`).
      radius: spectral radius of the second-moment operator.
      rate: log(radius) / 2, the RMS's per-step rate.
      mean_stable: the mean does not grow (mean_radius <= 1 + MARGINAL_TOL).
      marginal: a radius is within MARGINAL_TOL of 1: a mode that neither grows
        nor decays exponentially (along it the second moment may still grow
        polynomially, a random walk); no stationary moments then.
      mean_radius: spectral radius of the first-moment operator.
      mean_rate: log(mean_radius).
      neutral: directions every sample leaves unchanged (factored out).
      steps_to_tol: steps for the RMS to shrink by `tol`: log(tol) / rate; inf
        unless bounded.
      tol: that factor.
      stationary: `Stationary` moments where radius < 1 - MARGINAL_TOL (else None).
      basis: (n, n - neutral) orthonormal basis of the directions analysed.
      method: "dense" or "arnoldi", how the radius was computed.
    """

    sampler: str
    bounded: bool
    radius: float
    rate: float
    mean_stable: bool
    mean_radius: float
    mean_rate: float
    neutral: int
    steps_to_tol: float
    tol: float
    stationary: Stationary | None
    basis: np.ndarray
    method: str
    marginal: bool = False

    @property
    def label(self) -> str:
        """"diverges in mean", "mean stable, variance grows" or "stable in mean square"."""
        if not self.mean_stable:
            return "diverges in mean"
        return "stable in mean square" if self.bounded else "mean stable, variance grows"


# ---------------------------------------------------------------- the per-outcome recursion

def _check(alg, sampler: str):
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: expected one of {', '.join(SAMPLERS)}, got {sampler!r}")
    if alg.traces:
        raise ValueError(f"algorithm: {alg.name} carries traces ({', '.join(alg.traces)}); the exact "
                         "mean-square analysis covers one-step linear methods only (a trace makes the "
                         "recursion's mode continuous)")


def _hyperparameters(alg, hyperparameters: dict | None) -> tuple[dict, dict]:
    """(traced, static) values: every step size must be given (the second moment
    depends on its absolute scale); others default to their declared defaults
    (`Algorithm.resolve_hyperparameters`)."""
    return alg.resolve_hyperparameters(hyperparameters, analysis="the mean-square analysis")


def _bucket(m: int) -> int:
    """Outcome counts are padded to a power of two, so models of one feature count
    share a compiled evaluator."""
    return 1 << max(4, (m - 1).bit_length())


@functools.lru_cache(maxsize=128)
def _evaluator(alg, static_items: tuple, k: int, m: int):
    """(n, layout-free ravel size, jitted f(X, tr, hp) -> (m, rows, n)): the
    updated state of each outcome at each row of X."""
    template = alg.init(jnp.zeros(k, jnp.float64))
    leaves, treedef = jax.tree_util.tree_flatten(template)
    names = [jax.tree_util.keystr(p).lstrip(".") for p, _ in jax.tree_util.tree_flatten_with_path(template)[0]]
    fl = [j for j, x in enumerate(leaves) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
          and names[j] not in alg.traces]
    shapes = [jnp.shape(leaves[j]) for j in fl]
    n = sum(int(np.prod(s)) for s in shapes)
    static = dict(static_items)

    def unflatten(x):
        new, i = list(leaves), 0
        for j, s in zip(fl, shapes):
            c = int(np.prod(s))
            new[j] = x[i:i + c].reshape(s)
            i += c
        return jax.tree_util.tree_unflatten(treedef, new)

    def ravel(state):
        ls = jax.tree_util.tree_leaves(state)
        return jnp.concatenate([jnp.ravel(ls[j]).astype(jnp.float64) for j in fl])

    def one(x, tr, hp):
        return ravel(alg.apply(unflatten(x), tr, {**hp, **static}))

    f = jax.vmap(jax.vmap(one, in_axes=(0, None, None)), in_axes=(None, 0, None))
    return n, jax.jit(f)


class _Outcomes(NamedTuple):
    s: np.ndarray
    t: np.ndarray
    w: np.ndarray       # d_mu(s) mu(a|s) P(s'|s,a)
    tr: Transition


def _outcomes(env: FiniteMDP) -> _Outcomes:
    d = mdp_lib.d_mu(env)
    w = d[:, None, None] * np.asarray(env.mu)[:, :, None] * np.asarray(env.P)
    s, a, t = np.nonzero(w > 0)
    phi = np.asarray(env.phi, np.float64)
    tr = Transition(phi=phi[s], reward=np.asarray(env.R, np.float64)[s, a, t],
                    discount=mdp_lib.discounts(env)[s, a, t], phi_next=phi[t], rho=mdp_lib.rho(env)[s, a])
    return _Outcomes(s, t, w[s, a, t], tr)


def jump_system(env: FiniteMDP, alg, hyperparameters: dict, sampler: str = "markov") -> JumpSystem:
    """The recursion x_{t+1} = Gamma(Y) x_t + b(Y) of `alg` on `env` at these
    (constant) step sizes, outcome by outcome, read off the update function.

    `ValueError` for a trace method, a missing step size, or an update that is
    not affine in its state for some outcome."""
    alg = algorithms_lib.get(alg)
    _check(alg, sampler)
    traced, static = _hyperparameters(alg, hyperparameters)
    o = _outcomes(env)
    m = len(o.w)
    size = _bucket(m)
    pad = lambda v: np.concatenate([v, np.repeat(v[:1], size - m, axis=0)])
    with jax.enable_x64(True):
        n, f = _evaluator(alg, tuple(sorted(static.items())), env.num_features, size)
        if n == 0:
            raise ValueError(f"algorithm: {alg.name}'s state has no floating-point fields to analyse")
        rng = np.random.default_rng(0)
        xs = np.concatenate([rng.normal(size=(1, n)), 100.0 * rng.normal(size=(1, n))])
        X = np.concatenate([np.zeros((1, n)), np.eye(n), xs])
        tr = jax.tree_util.tree_map(lambda v: pad(np.asarray(v, np.float64)), o.tr)
        hp = {k: np.asarray(v, np.float64) for k, v in traced.items()}
        F = np.asarray(f(X, tr, hp), np.float64)[:m]
    b = F[:, 0]
    gamma = np.transpose(F[:, 1:n + 1] - b[:, None], (0, 2, 1))
    want = np.einsum("ijk,rk->irj", gamma, xs) + b[:, None]
    scale = np.abs(gamma).max(initial=0.0) * np.abs(xs).max() * n + np.abs(b).max(initial=0.0) + 1.0
    err = np.abs(F[:, n + 1:] - want).max()
    if not np.isfinite(err) or err > 1e-9 * scale:
        raise ValueError(f"algorithm: {alg.name}'s update is not affine in its state (off by {err:.3g} "
                         "at a random state); the mean-square analysis covers linear methods")
    if sampler == "iid":
        z = np.zeros(m, int)
        return JumpSystem(gamma, b, o.w / o.w.sum(), z, z, np.ones(1))
    d = mdp_lib.d_mu(env)
    live = np.flatnonzero(d > 0)
    mode = np.full(env.num_states, -1)
    mode[live] = np.arange(len(live))
    return JumpSystem(gamma, b, o.w / d[o.s], mode[o.s], mode[o.t], d[live] / d[live].sum())


# ---------------------------------------------------------------- reductions and radii

def neutral_basis(system: JumpSystem) -> tuple[np.ndarray, np.ndarray]:
    """(V, N): orthonormal bases of the analysed directions and of the neutral
    ones, {n : (Gamma_i - I) n = 0 for every outcome i}."""
    n = system.size
    A = (system.gamma - np.eye(n)).reshape(-1, n)
    _, s, Vt = np.linalg.svd(A, full_matrices=False)
    tol = NEUTRAL_TOL * max(1.0, s.max(initial=0.0))
    r = int(np.sum(s > tol))
    return Vt[:r].T, Vt[r:].T


def _reduced(system: JumpSystem, V: np.ndarray) -> JumpSystem:
    return system._replace(gamma=np.einsum("ji,mjk,kl->mil", V, system.gamma, V), b=system.b @ V)


def _sym_index(n: int):
    """Row-major indices of the upper triangle and the map from full to it."""
    iu = np.triu_indices(n)
    full = np.zeros((n, n), int)
    full[iu] = np.arange(len(iu[0]))
    full = np.maximum(full, full.T)
    return iu, full


def _sym_matrix(system: JumpSystem) -> np.ndarray:
    """The second-moment operator restricted to symmetric matrices, in the
    coordinates of their upper triangles (modes * n(n+1)/2 square), built outcome
    by outcome: never the (modes n^2)^2 matrix on all matrices."""
    n, M = system.size, system.modes
    iu, _ = _sym_index(n)
    p = len(iu[0])
    off = (iu[0] != iu[1]).astype(np.float64)
    G = system.gamma
    # Row (a, b), column (c, d) of G Z G^T on Z = E_cd + E_dc (E_cc once):
    # G[a, c] G[b, d] + G[a, d] G[b, c] [c != d].
    K = (G[:, iu[0]][:, :, iu[0]] * G[:, iu[1]][:, :, iu[1]]
         + off * G[:, iu[0]][:, :, iu[1]] * G[:, iu[1]][:, :, iu[0]])
    S = np.zeros((M, p, M, p))
    np.add.at(S, (system.dst, slice(None), system.src), system.p[:, None, None] * K)
    return S.reshape(M * p, M * p)


def _radius(system: JumpSystem, force: str | None = None) -> tuple[float, str]:
    n, M = system.size, system.modes
    dim = M * n * (n + 1) // 2
    if dim == 0:
        return 0.0, "dense"
    if (force or ("dense" if dim <= DENSE_MAX else "arnoldi")) == "dense":
        return float(np.abs(np.linalg.eigvals(_sym_matrix(system))).max()), "dense"
    import scipy.sparse.linalg as spla  # here, not at import: scipy is 0.3-0.7 s of the CLI's start-up
    shape = (M, n, n)
    op = spla.LinearOperator((M * n * n,) * 2, dtype=np.float64,
                             matvec=lambda v: system.second_moment(v.reshape(shape)).ravel())
    v0 = np.broadcast_to(np.eye(n), shape).ravel() * np.repeat(system.pi, n * n)
    k = min(4, M * n * n - 2)
    ev = spla.eigs(op, k=k, which="LR", v0=v0, ncv=min(M * n * n - 1, 80),
                   tol=1e-10, maxiter=100_000, return_eigenvectors=False)
    return float(ev.real.max()), "arnoldi"


def _stationary(system: JumpSystem, V: np.ndarray) -> Stationary:
    n, M = system.size, system.modes
    pi, p = system.pi, system.p
    # first moments: q = B q + c1, c1_{d} = sum_i p_i pi_{src_i} b_i at dst_i
    c1 = np.zeros((M, n))
    np.add.at(c1, system.dst, (p * pi[system.src])[:, None] * system.b)
    q = np.linalg.solve(np.eye(M * n) - system.first_moment_matrix(), c1.ravel()).reshape(M, n)
    # second moments: Z = T Z + C2, C2_d = sum_i p_i (G q b^T + b q^T G^T + pi b b^T)
    Gq = np.einsum("ijk,ik->ij", system.gamma, q[system.src])
    terms = np.einsum("ij,ik->ijk", Gq, system.b)
    terms = terms + np.swapaxes(terms, 1, 2) + pi[system.src][:, None, None] * np.einsum(
        "ij,ik->ijk", system.b, system.b)
    C2 = np.zeros((M, n, n))
    np.add.at(C2, system.dst, p[:, None, None] * terms)
    iu, full = _sym_index(n)
    if M * len(iu[0]) <= STATIONARY_DENSE_MAX:
        rhs = C2[:, iu[0], iu[1]].ravel()
        z = np.linalg.solve(np.eye(len(rhs)) - _sym_matrix(system), rhs).reshape(M, -1)
        Z = z[:, full]
    else:
        import scipy.sparse.linalg as spla
        op = spla.LinearOperator((M * n * n,) * 2, dtype=np.float64,
                                 matvec=lambda v: v - system.second_moment(v.reshape(M, n, n)).ravel())
        sol, info = spla.gmres(op, C2.ravel(), rtol=1e-10, restart=100, maxiter=50)
        if info != 0:
            raise ValueError(f"stationary: GMRES did not converge in {50 * 100} iterations "
                             f"({M * len(iu[0])} dimensions, radius near 1); pass stationary=False")
        Z = sol.reshape(M, n, n)
        Z = 0.5 * (Z + np.swapaxes(Z, 1, 2))
    G = np.einsum("i,ijk->jk", p * pi[system.src], system.gamma) - np.eye(n)
    g = (p * pi[system.src]) @ system.b
    fix = np.linalg.lstsq(G, -g, rcond=None)[0]
    return Stationary(V @ q.sum(0), V @ Z.sum(0) @ V.T, V @ fix)


def _mean_radius(system: JumpSystem) -> float:
    """The spectral radius of the first-moment operator (the mean's)."""
    return float(np.abs(np.linalg.eigvals(system.first_moment_matrix())).max(initial=0.0))


def _log(r: float) -> float:
    return math.log(r) if r > 0 else -math.inf


def analyse(system: JumpSystem, sampler: str = "markov", tol: float = 1e-3,
            method: str | None = None, stationary: bool = True) -> MeanSquare:
    """`MeanSquare` of a `JumpSystem` (see `mean_square`); `method` forces
    "dense" or "arnoldi" for the second-moment radius; `stationary=False` skips
    the stationary moments."""
    if not 0.0 < tol < 1.0:
        raise ValueError(f"tol: expected a value in (0, 1), got {tol}")
    if method not in (None, "dense", "arnoldi"):
        raise ValueError(f"method: expected dense or arnoldi, got {method!r}")
    V, N = neutral_basis(system)
    red = _reduced(system, V)
    radius, how = _radius(red, method)
    mean_radius = _mean_radius(red)
    decays = radius < 1.0 - MARGINAL_TOL
    marginal = abs(radius - 1.0) <= MARGINAL_TOL or abs(mean_radius - 1.0) <= MARGINAL_TOL
    rate = 0.5 * _log(radius)
    steps = (math.log(tol) / rate if rate < 0 else 0.0) if decays else math.inf
    stat = _stationary(red, V) if decays and stationary else None
    return MeanSquare(sampler, bool(radius <= 1.0 + MARGINAL_TOL), radius, rate,
                      bool(mean_radius <= 1.0 + MARGINAL_TOL), mean_radius, _log(mean_radius), N.shape[1], steps,
                      tol, stat, V, how, bool(marginal))


def mean_square(env: FiniteMDP, alg, hyperparameters: dict, sampler: str = "markov",
                tol: float = 1e-3, stationary: bool = True) -> MeanSquare:
    """Exact mean and mean-square stability of `alg` on `env` at constant step
    sizes `hyperparameters` ({name: value}; every step size required), under
    Markov or i.i.d. sampling (`sampler`).

    The second moment is bounded iff the spectral radius of the operator
    Z_j -> sum_i p_ij Gamma_i Z_i Gamma_i^T is < 1 (Costa, Fragoso & Marques
    2005, Thm. 3.9; i.i.d.: E[Gamma (x) Gamma]). Where it is, the stationary
    first and second moments (the affine term included) are solved for, from
    which `stationary_metric` gives the expected error floor. See the module
    docstring for the construction, the neutral directions and the refusal of
    trace methods. `stationary=False` skips the stationary moments (None)."""
    return analyse(jump_system(env, alg, hyperparameters, sampler), sampler, tol, stationary=stationary)


def label(env: FiniteMDP, alg, hyperparameters: dict, sampler: str = "markov") -> str:
    """`mean_square(...).label`, computed with only what the label needs: the
    mean's radius first, and the second moment's only where the mean is
    stable; never the stationary moments. The same label as `mean_square`'s
    (the same reduction, radii and tolerances), at a fraction of the cost
    where the mean diverges (a grid's large step sizes): a sweep's summary
    labels every point of a small grid (`results.SweepResult.summary`)."""
    system = jump_system(env, alg, hyperparameters, sampler)
    red = _reduced(system, neutral_basis(system)[0])
    if not _mean_radius(red) <= 1.0 + MARGINAL_TOL:
        return "diverges in mean"
    radius, _ = _radius(red)
    return "stable in mean square" if radius <= 1.0 + MARGINAL_TOL else "mean stable, variance grows"


def stationary_metric(ms: MeanSquare, R: np.ndarray, h: np.ndarray, rows: slice) -> float | None:
    """sqrt(E[||R theta + h||^2]) in the stationary regime, theta = x[rows] (the
    RMS of a metric of `metrics.metric`, e.g. the expected RMSCBE floor at a
    constant step size). None when the second moment is unbounded, or when the
    metric changes along a neutral direction (there x random-walks)."""
    if ms.stationary is None:
        return None
    R = np.asarray(R, np.float64)
    h = np.asarray(h, np.float64)
    import scipy.linalg
    N = scipy.linalg.null_space(ms.basis.T) if ms.neutral else np.zeros((ms.basis.shape[0], 0))
    if N.size and np.abs(R @ N[rows]).max() > 1e-8 * max(1.0, np.abs(R).max()):
        return None
    m, S = ms.stationary.mean[rows], ms.stationary.second[rows, rows]
    e2 = np.trace(R @ S @ R.T) + 2 * h @ R @ m + h @ h
    return float(np.sqrt(max(e2, 0.0)))
