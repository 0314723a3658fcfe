"""The learners of continuing control: discounted Q-learning, its reward-centered
forms, centered Q-learning, and the average-reward anchors (differential and RVI
Q-learning), as `Algorithm` descriptors over a `ControlTransition`.

The continuing front drives them as episodic control drives its own: each step
`alg.apply(state, ControlTransition(active=phi(s, a), reward=r + offset,
discount=gamma, gamma=gamma, next_active=phi(s', .)), hyperparameters)`, from
`alg.init(w0)`. A continuing task has no terminal state, so `discount` is the
task's gamma every step (gamma = 1 is allowed). Action values are linear,
Q(s, a) = w^T phi(s, a), with sparse or dense features
(`bec_jax.control.transition`); the greedy action a* = argmax_b Q(s', b) takes
the lowest index on ties. With delta = r + gamma Q(s', a*) - Q(s, a):

  q                Watkins' Q-learning: w += alpha delta phi(s, a) (control's `q`,
                   the same descriptor).
  q_src            simple reward centering (Naik, Wan, Tomar & Sutton 2024, arXiv
                   2405.09999; the BEC paper's eqs. (9)-(11) [src1, src2, src3] on
                   action values): w += alpha (delta - rbar) phi(s, a);
                   rbar += beta (r - rbar).
  q_vrc            value-based reward centering (Naik et al. 2024; the BEC paper's
                   eqs. (12)-(13) [rewardcentering1, rewardcentering2]):
                   w += alpha (delta - rbar) phi(s, a); rbar += beta (delta - rbar).
  q_src_unbiased,  the same with Naik et al.'s unbiased step size for rbar (the
  q_vrc_unbiased   trick of Sutton & Barto 2018, Exercise 2.7):
                   o += beta0 (1 - o) from o = 0, rbar moves with beta0 / o, and
                   w by the target that uses the new rbar (`unbiased_update`).
  cq               centered Q-learning (control's `cq`, the same descriptor: the
                   BEC paper's eqs. (28)-(29) [omega, theta] on action values),
                   with its own step size beta, not tied to alpha.
  cgq              centered Greedy-GQ (control's `cgq`, the same descriptor: the
                   BEC paper's eqs. (32)-(34) [thetavmtdc, uvmtdc, omegavmtdc]
                   on action values): CQ's updates plus the gradient correction
                   w -= alpha gamma p phi(s', a*), u += zeta (delta - omega - p)
                   phi(s, a), p = u^T phi(s, a); at zeta = 0 it is cq bit for bit
                   (control's `case_of`: u stays 0, the correction adds -0).
  diff_q           differential Q-learning (Wan, Naik & Sutton, ICML 2021, arXiv
                   2006.16318):
                   delta_d = r - rbar + Q(s', a*) - Q(s, a), no discount;
                   w += alpha delta_d phi(s, a); rbar += eta alpha delta_d.
  rvi_q            RVI Q-learning (Abounadi, Bertsekas & Borkar, SIAM J. Control
                   Optim. 40(3), 2001): delta = r - f(Q) + Q(s', a*) - Q(s, a),
                   no discount, w += alpha delta phi(s, a), with the reference
                   f(Q) = the mean of Q over all state-action pairs
                   (`rvi_q_update`); sparse features only.

Step sizes as Naik et al. tie them: the reward-centered learners and diff_q take
alpha and eta, and move rbar with beta = eta alpha (alpha resolved at the update
counter when it is a schedule). alpha here is the step size of each weight:
control does not divide it by the number of active features (`control.features`).
Naik et al.'s tile-coded runs divide their alpha by the number of tilings n and
tie beta to the undivided one; their (alpha, eta) is this module's
(alpha / n, n eta), which the front maps. eta = 0 is allowed (their grids hold
it): rbar then stays at its initial value 0, and q_src and q_vrc are Q-learning
bit for bit (delta - 0 is delta).

Value-based centering is CQ (the BEC paper's reading, Sec. "Revisit Reward
Centering", eq. (24) [tdcentering]: value-based reward centering is Bellman
error centering). q_vrc's update is control's `rcq_value_update` at
beta = eta * alpha, which computes the same operations as `cq_update`; so q_vrc
at (alpha, eta) and cq at (alpha, beta = eta * alpha) give the same weights and
rbar = omega bit for bit, run for run, whenever the beta cq receives is the same
float32 number as the product eta * alpha q_vrc forms (a float32 product: an
eta * alpha rounded once from float64 can differ from it in the last bit; on
Naik et al.'s grids, powers of two, the product is exact and the two agree
whichever way it is formed). tests/test_continuing_learners.py checks this over
a random stream of 200 transitions. diff_q is q_vrc at gamma = 1, bit for bit
(r + 1 * Q equals r + Q in IEEE arithmetic).

The reward-rate estimate each learner keeps, for the front's metrics, is the
state field `rate_field(name)` names (`RATE_FIELDS`): rbar, omega (cq, cgq), or None
(q). `Algorithm` has no slot for it, so this module keeps the table (the base
class is unchanged); `register(alg, rate_field=...)` adds a user's.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from bec_jax.algorithms import lookup
from bec_jax.algorithms.base import Algorithm, StepSize, parameter, resolve, step_size, zero_count
from bec_jax.control import algorithms as control
from bec_jax.control.continuing import deep
from bec_jax.control.transition import ControlTransition, add, is_sparse, q_values

_ALPHA = step_size("alpha", "step size of the weights w")
_ETA = parameter("eta", "ratio of rbar's step size to alpha (beta = eta * alpha)", low=0.0)


def tied_beta(alpha: jax.Array, eta: jax.Array) -> jax.Array:
    """beta = eta * alpha, Naik et al.'s tie of rbar's step size to alpha, formed
    as one product in alpha's dtype (the number CQ must receive to match q_vrc
    bit for bit)."""
    return eta * alpha


# ------------------------------------------------------------------ reward centering

def q_src_update(state: control.RCQState, tr: ControlTransition, alpha: StepSize,
                 eta: jax.Array) -> control.RCQState:
    """One Q-learning step with simple reward centering (Naik et al. 2024; the BEC
    paper's eqs. (9)-(11) [src1, src2, src3] on action values):
    w += alpha (r - rbar + gamma Q(s', a*) - Q(s, a)) phi(s, a); rbar += beta (r - rbar),
    beta = eta alpha. Control's `rcq_simple_update` at that beta (not written twice)."""
    a = resolve(alpha, state.count)
    return control.rcq_simple_update(state, tr, a, tied_beta(a, eta))


def q_vrc_update(state: control.RCQState, tr: ControlTransition, alpha: StepSize,
                 eta: jax.Array) -> control.RCQState:
    """One Q-learning step with value-based reward centering (Naik et al. 2024; the
    BEC paper's eqs. (12)-(13) [rewardcentering1, rewardcentering2] on action
    values): with delta_bar = r - rbar + gamma Q(s', a*) - Q(s, a),
    w += alpha delta_bar phi(s, a); rbar += beta delta_bar, beta = eta alpha.
    Control's `rcq_value_update` at that beta, whose operations are `cq_update`'s:
    this is CQ at beta = eta alpha, bit for bit (eq. (24) [tdcentering])."""
    a = resolve(alpha, state.count)
    return control.rcq_value_update(state, tr, a, tied_beta(a, eta))


# ------------------------------------------------------------------ unbiased step size

class UnbiasedState(NamedTuple):
    """w: (d,) weights; rbar: () reward-rate estimate; o: () the unbiased-step trace
    (0 before the first update); count: updates so far."""

    w: jax.Array
    rbar: jax.Array
    o: jax.Array
    count: jax.Array


def unbiased_init(w0: jax.Array) -> UnbiasedState:
    """Starts at `w0` with rbar = 0 and o = 0 (the first step then takes beta = 1,
    so rbar's initial value is forgotten at once)."""
    w0 = jnp.asarray(w0)
    zero = jnp.zeros((), w0.dtype)
    return UnbiasedState(w=w0, rbar=zero, o=zero, count=zero_count())


def unbiased_update(state: UnbiasedState, tr: ControlTransition, alpha: StepSize, eta: jax.Array,
                    *, value_based: bool) -> UnbiasedState:
    """One reward-centered Q-learning step with Naik et al.'s unbiased step size for
    rbar (the trick of Sutton & Barto 2018, Exercise 2.7, as in Naik et al.'s
    code, abhisheknaik96/continuing-rl-exps):

        beta0 = eta alpha;  o' = o + beta0 (1 - o);  beta = beta0 / o'
        delta = r + gamma Q(s', a*) - Q(s, a)
        rbar' = (1 - beta) rbar + beta delta     value-based: rbar + beta (delta - rbar)
        rbar' = (1 - beta) rbar + beta r         simple: rbar + beta (r - rbar)
        w' = w + alpha (delta - rbar') phi(s, a)

    The weights use the target corrected by rbar's change in this step,
    (r - rbar + gamma Q(s', a*)) + (rbar - rbar') = r - rbar' + gamma Q(s', a*),
    written directly with rbar'. From o = 0 the first step has o' = beta0, so
    beta = 1 and rbar' no longer depends on rbar (value-based: rbar' = delta and
    w does not move; simple: rbar' = r): what follows is independent of rbar's
    initial value, bit for bit (the averaged form gives exactly x at beta = 1;
    Naik et al.'s rbar += beta (x - rbar) would keep the first step's rounding
    of x - rbar). With beta0 = 0 (eta = 0) o stays 0 and beta is 0, as in their
    code, instead of 0 / 0."""
    control.check_inputs(state.w, tr)
    a = resolve(alpha, state.count)
    beta0 = tied_beta(a, eta)
    o = state.o + beta0 * (1 - state.o)
    # o' > 0 whenever beta0 > 0; the guard only turns eta = 0's 0 / 0 into 0.
    beta = beta0 / jnp.where(o > 0, o, jnp.ones_like(o))
    delta, _ = control.greedy_td_error(state.w, tr)
    # rbar + beta (x - rbar) written as the average (1 - beta) rbar + beta x: equal in
    # real arithmetic, and at beta = 1 exactly x in floating point too, so the
    # initial rbar is forgotten bit for bit, not only up to the first step's rounding.
    x = delta if value_based else tr.reward
    rbar = (1 - beta) * state.rbar + beta * x
    return UnbiasedState(w=add(state.w, tr.active, a * (delta - rbar)), rbar=rbar, o=o,
                         count=state.count + 1)


def q_src_unbiased_update(state: UnbiasedState, tr: ControlTransition, alpha: StepSize,
                          eta: jax.Array) -> UnbiasedState:
    """Simple reward centering with the unbiased step size (`unbiased_update`)."""
    return unbiased_update(state, tr, alpha, eta, value_based=False)


def q_vrc_unbiased_update(state: UnbiasedState, tr: ControlTransition, alpha: StepSize,
                          eta: jax.Array) -> UnbiasedState:
    """Value-based reward centering with the unbiased step size (`unbiased_update`)."""
    return unbiased_update(state, tr, alpha, eta, value_based=True)


# ------------------------------------------------------------------ average-reward anchors

def diff_q_update(state: control.RCQState, tr: ControlTransition, alpha: StepSize,
                  eta: jax.Array) -> control.RCQState:
    """One differential Q-learning step (Wan, Naik & Sutton, ICML 2021):
    delta_d = r - rbar + Q(s', a*) - Q(s, a); w += alpha delta_d phi(s, a);
    rbar += eta alpha delta_d.

    An average-reward method has no discount: the transition's `discount` and
    `gamma` are ignored (replaced by 1), so a sweep's gamma axis does not change
    it. That is value-based centering at gamma = 1, so the update is control's
    `rcq_value_update` on the transition with discount 1."""
    a = resolve(alpha, state.count)
    undiscounted = tr._replace(discount=jnp.ones_like(tr.discount))
    return control.rcq_value_update(state, undiscounted, a, tied_beta(a, eta))


def reference_value(w: jax.Array, active: jax.Array) -> jax.Array:
    """RVI Q-learning's reference f(Q) for sparse features with m active indices per
    (s, a) (the width of `active`): m times the mean weight. For one-hot tabular
    features (m = 1, one weight per state-action pair) it is the mean of Q over all
    state-action pairs. For any m it satisfies f(Q + c) = f(Q) + c (adding c to
    every Q(s, a) adds c / m to every weight), the property Abounadi et al.'s
    convergence needs; it is not a mean of Q values there."""
    return w.mean() * active.shape[0]


class RVIState(NamedTuple):
    """w: (d,) weights; rbar: () the reference f(Q) the last update subtracted, the
    reward-rate estimate (0 before the first update); count: updates so far."""

    w: jax.Array
    rbar: jax.Array
    count: jax.Array


def rvi_q_init(w0: jax.Array) -> RVIState:
    """Starts RVI Q-learning at `w0` (rbar = 0 until the first update computes f)."""
    w0 = jnp.asarray(w0)
    return RVIState(w=w0, rbar=jnp.zeros((), w0.dtype), count=zero_count())


def rvi_q_update(state: RVIState, tr: ControlTransition, alpha: StepSize) -> RVIState:
    """One RVI Q-learning step (Abounadi, Bertsekas & Borkar 2001, their reference-
    function form with f(Q) the mean of Q over all state-action pairs):
    delta = r - f(Q) + Q(s', a*) - Q(s, a); w += alpha delta phi(s, a).

    No discount: `discount` and `gamma` are ignored. f is `reference_value`, a
    function of the weights alone (no reference state to choose, and no
    argument beyond `init(w0)`): it costs one sum over the d weights a step,
    so it suits tabular tasks. At the fixed point f(Q) is the optimal gain, so
    the state keeps the f it subtracted as `rbar` (one step behind w). Sparse
    features only: a dense phi has no count of active features that makes f
    shift with Q."""
    if not is_sparse(tr.active):
        raise ValueError("rvi_q: the reference f(Q) is defined for sparse binary features "
                         "(integer indices); got dense feature vectors")
    control.check_inputs(state.w, tr)
    a = resolve(alpha, state.count)
    f = reference_value(state.w, tr.active)
    q_next = q_values(state.w, tr.next_active)
    delta = tr.reward - f + q_next.max() - q_values(state.w, tr.active)
    return RVIState(w=add(state.w, tr.active, a * delta), rbar=f, count=state.count + 1)


# ------------------------------------------------------------------ descriptors

Q_SRC = Algorithm(
    name="q_src", label="Q (simple centering)", init=control.rcq_init, update=q_src_update,
    hyperparameters=(_ALPHA, _ETA),
    equations="Q-learning with simple reward centering (Naik, Wan, Tomar & Sutton 2024, arXiv "
              "2405.09999); eqs. (9)-(11) [src1, src2, src3] on action values, beta = eta alpha",
    weights="w", counter="count")

Q_VRC = Algorithm(
    name="q_vrc", label="Q (value-based centering)", init=control.rcq_init, update=q_vrc_update,
    hyperparameters=(_ALPHA, _ETA),
    equations="Q-learning with value-based reward centering (Naik et al. 2024); eqs. (12)-(13) "
              "[rewardcentering1, rewardcentering2] on action values, beta = eta alpha; CQ at "
              "beta = eta alpha (eq. (24) [tdcentering])",
    weights="w", counter="count")

Q_SRC_UNBIASED = Algorithm(
    name="q_src_unbiased", label="Q (simple centering, unbiased)", init=unbiased_init,
    update=q_src_unbiased_update, hyperparameters=(_ALPHA, _ETA),
    equations="eqs. (9)-(11) [src1, src2, src3] on action values with Naik et al.'s unbiased "
              "step size for rbar (o += beta0 (1 - o), beta = beta0 / o; target with the new rbar)",
    weights="w", counter="count")

Q_VRC_UNBIASED = Algorithm(
    name="q_vrc_unbiased", label="Q (value-based centering, unbiased)", init=unbiased_init,
    update=q_vrc_unbiased_update, hyperparameters=(_ALPHA, _ETA),
    equations="eqs. (12)-(13) [rewardcentering1, rewardcentering2] on action values with Naik "
              "et al.'s unbiased step size for rbar (o += beta0 (1 - o), beta = beta0 / o; target "
              "with the new rbar)",
    weights="w", counter="count")

DIFF_Q = Algorithm(
    name="diff_q", label="Differential Q", init=control.rcq_init, update=diff_q_update,
    hyperparameters=(_ALPHA, _ETA),
    equations="differential Q-learning (Wan, Naik & Sutton, ICML 2021): delta = r - rbar + "
              "max Q(s') - Q(s, a), rbar += eta alpha delta; no discount",
    weights="w", counter="count")

RVI_Q = Algorithm(
    name="rvi_q", label="RVI Q", init=rvi_q_init, update=rvi_q_update, hyperparameters=(_ALPHA,),
    equations="RVI Q-learning (Abounadi, Bertsekas & Borkar 2001) with f(Q) the mean of Q over "
              "all state-action pairs (m times the mean weight); no discount; sparse features",
    weights="w", counter="count")

# ------------------------------------------------------------------ registry

# name -> Algorithm, in registration order; name -> the state field holding the
# reward-rate (centering) estimate, or None.
ALGORITHMS: dict[str, Algorithm] = {}
RATE_FIELDS: dict[str, str | None] = {}


def register(alg: Algorithm | deep.DeepLearner, *, rate_field: str | None = None, replace: bool = False):
    """Adds the continuing learner `alg` (a linear `Algorithm` or a network
    learner, `continuing.deep.DeepLearner`) under `alg.name` and returns it;
    `rate_field` names its state field holding the reward-rate estimate (None:
    it keeps none). A name that is already taken is an error (`replace=True`
    overrides)."""
    if not isinstance(alg, (Algorithm, deep.DeepLearner)):
        raise ValueError(f"algorithm: register expects an Algorithm or a DeepLearner, got {type(alg).__name__}")
    if alg.name in ALGORITHMS and not replace and ALGORITHMS[alg.name] is not alg:
        raise ValueError(f"algorithm: the continuing learner name {alg.name!r} is already registered; "
                         "choose another name")
    ALGORITHMS[alg.name] = alg
    RATE_FIELDS[alg.name] = rate_field
    return alg


def names() -> list[str]:
    """The continuing learner names, in registration order."""
    return list(ALGORITHMS)


def get(ref) -> Algorithm:
    """The continuing learner `ref` names: a registered name, a
    `package.module:attribute` reference (imported, not registered), or an
    `Algorithm` or `DeepLearner` itself; `ValueError` listing the known names
    otherwise."""
    if isinstance(ref, deep.DeepLearner):
        return ref
    return lookup(ref, ALGORITHMS, "continuing learner")


def rate_field(ref) -> str | None:
    """The state field of `ref`'s reward-rate estimate (rbar or omega), or None
    where it keeps none; an `Algorithm` not registered here (a user's
    `package.module:attribute`) has None: register it with `rate_field=`."""
    alg = get(ref)
    if alg.name in ALGORITHMS and ALGORITHMS[alg.name] is alg:
        return RATE_FIELDS[alg.name]
    return None


# q, cq and cgq are control's own descriptors (one object in both registries).
for _alg, _field in ((control.Q, None), (Q_SRC, "rbar"), (Q_VRC, "rbar"), (Q_SRC_UNBIASED, "rbar"),
                     (Q_VRC_UNBIASED, "rbar"), (control.CQ, "omega"), (control.CGQ, "omega"), (DIFF_Q, "rbar"),
                     (RVI_Q, "rbar")):
    register(_alg, rate_field=_field)
# The network learners (`continuing.deep`): rbar is their rate's, NaN-logged for dqn.
for _alg in deep.LEARNERS:
    register(_alg, rate_field="rbar" if _alg.centering is not None else None)
