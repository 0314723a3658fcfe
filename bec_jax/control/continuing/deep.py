"""The continuing front's network learners: DQN and its reward-centered forms,
as `DeepLearner` descriptors in the continuing learner registry
(`continuing.learners`), with their static settings (`Settings`) and the
update of one run (`init`, `act`, `update`).

Naik, Wan, Tomar and Sutton, *Reward Centering* (RLC 2024, arXiv 2405.09999),
their deep agents (`DeepCDiscAgent`, `CDQNAgent` in abhisheknaik96/
continuing-rl-exps, `agents/control_agents_deep.py`, commit de89d49), written
from that definition with `bec_jax.agents.reward_centering` (the BEC paper's
eqs. (9)-(13) [src1, src2, src3, rewardcentering1, rewardcentering2] on a
network's action values):

  dqn                   DQN: target r + gamma max_a' q_target(s', a'), no rbar.
  cdqn                  value-based centering: target r - rbar + gamma max
                        q_target(s'); rbar += beta mean(delta), beta = eta alpha.
  cdqn_unbiased         cdqn with Naik et al.'s unbiased step size for rbar
                        (`robust_to_initialization`: o += beta0 (1 - o) from 0,
                        beta = beta0 / o) and the target with the updated rbar:
                        what their nonlinear configs run.
  cdqn_simple           simple centering: rbar += beta mean(r - rbar).
  cdqn_simple_unbiased  the same with the unbiased step size.
  diff_dqn              differential DQN (Wan, Naik & Sutton 2021 on a
                        network): cdqn at gamma = 1 (the grid's gamma ignored).

Every step of a run acts epsilon-greedily on q(s, .) and adds the transition
(s, a, r + offset, s') to a replay ring (`bec_jax.replay`); every
`update_period` steps one update: the target network is first set to the
network when the step count is a multiple of `sync_period` (their order:
synced before the update), then one optimizer step on the MSE loss over a
batch, and rbar's update. Their `_sample_from_buffer` draws min(buffer_size,
len(buffer)) transitions: every update of their runs is one full-batch step
over the whole buffer, and `batch_size` (64 in their configs) is never read.
`batch = full` follows what ran (a masked pass over every transition held);
`batch = N` draws N transitions uniformly with replacement, as DQN usually
does; the default is N = 64, their configs' number, at a fraction of the cost.

The same holds for the unbiased step size's target. Their update means the
target to use the updated rbar (`target_return += old_avg_reward -
self.avg_reward`), but `old_avg_reward` names the very tensor that `+=` then
updates in place, so the correction adds 0: their runs' targets use rbar from
before the update, and `robust_to_initialization` changes only rbar's step
size. `target_rbar = new` is the update as written (the default of the
`_unbiased` learners, as the linear `q_vrc_unbiased` does it); `target_rbar =
old` is what ran (the default of the others, which have no correction).

Grid hyperparameters (traced, one program for the grid): alpha (the
optimizer's learning rate, their `step_size`), eta (beta0 = eta alpha), and
the front's loop axes epsilon, gamma and the reward offset. Static settings
(`--learner-param NAME=VALUE`; each combination is its own program):
`SETTINGS`. Their defaults are Naik et al.'s nonlinear configs for the task
at hand (`DEFAULT_HIDDEN`: Catch's board [128], Pendulum [64, 64], PuckWorld
[32, 32]).
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from bec_jax import networks, replay
from bec_jax.agents import reward_centering as rc
from bec_jax.algorithms.base import Hyperparameter, parameter, step_size

FULL = "full"  # batch = full: every transition held (what Naik et al.'s runs did)
OPTIMIZERS = ("adam", "sgd", "rmsprop")
# Naik et al.'s nonlinear configs' hidden layers by task (config_files/*_nonlinear/*.json).
DEFAULT_HIDDEN = {"catch": (128,), "windy_catch": (128,), "dancing_catch": (128,), "pendulum": (64, 64),
                  "puckworld": (32, 32)}
OTHER_HIDDEN = (64, 64)
# The static settings and their defaults (their configs: buffer_size, batch_size,
# param_update_freq, net_sync_freq, optimizer; tanh layers).
SETTINGS = {"hidden": None, "layers": None, "activation": "tanh", "buffer": 10_000, "batch": 64,
            "update_period": 32, "sync_period": 128, "optimizer": "adam", "target_rbar": None}
TARGET_RBAR = ("new", "old")  # the loss's target with rbar after this update's move, or before it
MAX_BUFFER = 10_000_000


@dataclasses.dataclass(frozen=True)
class Settings:
    """A network learner's static settings, resolved against the task.

    Attributes:
      layers: (observation size, hidden..., actions).
      activation: "tanh" (theirs) or "relu".
      buffer: transitions the replay ring holds (C).
      batch: transitions per update, or 0 for the whole buffer (`batch = full`).
      update_period: environment steps between updates.
      sync_period: steps between target-network syncs (a multiple of update_period).
      optimizer: "adam" (theirs: Adam at lr = alpha), "sgd" or "rmsprop".
      target_rbar: "new", the loss's target with the rbar this update moved
        to, or "old", with the rbar before it (module docstring).
    """

    layers: tuple
    activation: str
    buffer: int
    batch: int
    update_period: int
    sync_period: int
    optimizer: str
    target_rbar: str = "old"

    @property
    def full(self) -> bool:
        """Whether every update is a step over the whole buffer."""
        return self.batch == 0

    @property
    def rows(self) -> int:
        """The rows one update's forward passes see: the ring's C + 1 slots, or the batch."""
        return self.buffer + 1 if self.full else self.batch

    def as_params(self) -> dict:
        """The settings as `learner_params` (JSON-ready): hidden sizes, not the
        whole layer list (the task decides its ends), and batch as given."""
        return {"hidden": list(self.layers[1:-1]), "activation": self.activation, "buffer": self.buffer,
                "batch": FULL if self.full else self.batch, "update_period": self.update_period,
                "sync_period": self.sync_period, "optimizer": self.optimizer, "target_rbar": self.target_rbar}


def _int(field: str, v, low: int = 1, high: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) and not (
            isinstance(v, float) and v.is_integer()) or v < low or (high is not None and v > high):
        bound = f"an integer >= {low}" + (f" and <= {high:,}" if high is not None else "")
        raise ValueError(f"learner_params.{field}: {bound}, got {v!r}")
    return int(v)


def _sizes(field: str, v) -> tuple:
    vals = v if isinstance(v, (list, tuple)) else [v]
    return tuple(_int(field, x, 1, 1 << 16) for x in vals)


def resolve_settings(task, params: dict | None, obs_size: int,  # noqa: C901  (one check a field)
                     unbiased: bool = False) -> Settings:
    """The `Settings` of `params` (`learner_params`: {name: value}) on `task`
    (a `ContinuingEnv` whose observations have `obs_size` entries), each
    unspecified one its default (`SETTINGS`, `DEFAULT_HIDDEN`; `target_rbar`
    new for an `unbiased` learner, else old); a one-line `ValueError` naming
    `learner_params.NAME` otherwise."""
    params = dict(params or {})
    for name in params:
        if name not in SETTINGS:
            raise ValueError(f"learner_params.{name}: not a setting of a network learner; known: "
                             f"{', '.join(SETTINGS)}")
    A = task.num_actions
    if params.get("layers") is not None:
        if params.get("hidden") is not None:
            raise ValueError("learner_params.layers: give layers (all sizes) or hidden (the hidden ones), not both")
        layers = _sizes("layers", params["layers"])
        if len(layers) < 2 or layers[0] != obs_size or layers[-1] != A:
            raise ValueError(f"learner_params.layers: {task.name} needs layers from its {obs_size} observation "
                             f"entries to its {A} actions, [{obs_size}, ..., {A}]; got {list(layers)}")
    else:
        hidden = params.get("hidden")
        hidden = DEFAULT_HIDDEN.get(task.name, OTHER_HIDDEN) if hidden is None else (
            () if hidden == [] else _sizes("hidden", hidden))
        layers = (obs_size,) + tuple(hidden) + (A,)
    activation = params.get("activation", SETTINGS["activation"])
    if activation not in networks.ACTIVATIONS:
        raise ValueError(f"learner_params.activation: one of {', '.join(networks.ACTIVATIONS)}, got {activation!r}")
    optimizer = params.get("optimizer", SETTINGS["optimizer"])
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"learner_params.optimizer: one of {', '.join(OPTIMIZERS)} (optax's), got {optimizer!r}")
    buffer = _int("buffer", params.get("buffer", SETTINGS["buffer"]), 1, MAX_BUFFER)
    batch = params.get("batch", SETTINGS["batch"])
    if batch == FULL:
        batch = 0
    else:
        if isinstance(batch, str):
            raise ValueError(f"learner_params.batch: a number of transitions or {FULL!r}, got {batch!r}")
        batch = _int("batch", batch)
        if batch > buffer:
            raise ValueError(f"learner_params.batch: {batch} transitions per update, more than the buffer holds "
                             f"({buffer}); give batch <= buffer, or batch=full for the whole buffer")
    period = _int("update_period", params.get("update_period", SETTINGS["update_period"]))
    sync = _int("sync_period", params.get("sync_period", SETTINGS["sync_period"]))
    if sync % period:
        raise ValueError(f"learner_params.sync_period: a multiple of update_period ({period}), since the target "
                         f"is synced at updates; got {sync}")
    target_rbar = params.get("target_rbar") or ("new" if unbiased else "old")
    if target_rbar not in TARGET_RBAR:
        raise ValueError(f"learner_params.target_rbar: new (the target with the updated rbar) or old (with rbar "
                         f"before the update, what Naik et al.'s code computes), got {target_rbar!r}")
    return Settings(layers=layers, activation=activation, buffer=buffer, batch=batch, update_period=period,
                    sync_period=sync, optimizer=optimizer, target_rbar=target_rbar)


def make_optimizer(name: str, learning_rate):
    """The optax optimizer `name` at `learning_rate` (a number, traced per run,
    or an optax schedule): adam with optax's defaults (PyTorch's: b1 0.9, b2
    0.999, eps 1e-8), sgd, or rmsprop with the decay 0.95 and eps 0.01 of
    Naik et al.'s RMSprop (optax's rmsprop adds eps inside the square root,
    PyTorch's outside; their nonlinear configs use Adam)."""
    import optax  # the command line's start does not import optax (algorithms.base)

    if name == "adam":
        return optax.adam(learning_rate)
    if name == "sgd":
        return optax.sgd(learning_rate)
    return optax.rmsprop(learning_rate, decay=0.95, eps=0.01)


# ------------------------------------------------------------------ one run's learner

class DeepState(NamedTuple):
    """A network learner's state: `params` and `target` (the network and its
    target copy, tuples of `networks.Dense`), the optimizer's state, the
    reward rate (`agents.reward_centering.RateState`; rbar stays 0 for dqn),
    the replay ring, the updates so far, and `values` (M,): max_a q_target(o,
    a) of the observation in each slot of the ring (`refresh`)."""

    params: Any
    opt_state: Any
    target: Any
    rate: rc.RateState
    replay: replay.Replay
    updates: jax.Array
    values: jax.Array


def init(key: jax.Array, settings: Settings, first_obs: jax.Array, learning_rate, dtype=jnp.float32) -> DeepState:
    """The learner at the start of a run: a network drawn from `key`
    (`networks.mlp_init`), its target a copy, an empty buffer whose stream
    starts at `first_obs`."""
    params = networks.mlp_init(key, settings.layers, dtype)
    opt = make_optimizer(settings.optimizer, learning_rate)
    return DeepState(params=params, opt_state=opt.init(params), target=params, rate=rc.rate_init(0.0, dtype),
                     replay=replay.replay_init(settings.buffer, first_obs, dtype), updates=jnp.zeros((), jnp.int32),
                     values=jnp.zeros((settings.buffer + 1,), dtype))


def q_values(settings: Settings, params, obs: jax.Array) -> jax.Array:
    """q(obs, .) of the network `params`: (A,) for one observation."""
    return networks.mlp_apply(params, obs, settings.activation)


def target_values(settings: Settings, target, obs: jax.Array) -> jax.Array:
    """max_a q_target(o, a) of each observation `obs` (rows, d): the bootstrap values."""
    return jnp.max(networks.mlp_apply(target, obs, settings.activation), axis=-1)


def refresh(settings: Settings, state: DeepState, sync) -> tuple:
    """(target, values) for this update. At a sync (`sync`, a bool: the
    caller's clock, the same for every run of a batch, so that this is a
    branch and not a select of both sides under vmap) the target becomes the
    network; with `batch = full`, every slot's value is then computed again,
    and between syncs only the update_period observations added since the last
    update get theirs: the same numbers as one pass of the target over the
    ring every update (the target changes only at a sync), for a quarter of
    that work at their settings (`update` must run every update_period
    steps). A sampled batch computes its own values (`_batch`): the cache is
    left as it is."""
    buf, P = state.replay, settings.update_period
    M = buf.actions.shape[0]
    if not settings.full:
        target = jax.lax.cond(sync, lambda _: state.params, lambda _: state.target, None)
        return target, state.values

    def synced(_):
        return state.params, target_values(settings, state.params, buf.obs)

    def added(_):
        slots = (buf.count - P + 1 + jnp.arange(P, dtype=buf.count.dtype)) % M  # transitions' next observations
        return state.target, state.values.at[slots].set(target_values(settings, state.target, buf.obs[slots]))

    return jax.lax.cond(sync, synced, added, None)


def _batch(settings: Settings, buf: replay.Replay, target, values: jax.Array, key):
    """(obs, actions, rewards, bootstrap values, mask) of one update: every
    slot of the ring with the valid ones masked (`full`; the values from the
    cache `values`), or `batch` transitions drawn from it (the target's pass
    over their next observations)."""
    if settings.full:
        # Slot k's next observation is slot k + 1's (`bec_jax.replay`).
        return buf.obs, buf.actions, buf.rewards, jnp.roll(values, -1), replay.valid(buf)
    slots = replay.sample_slots(buf, key, settings.batch)
    obs, actions, rewards, nxt = replay.transitions(buf, slots)
    return obs, actions, rewards, target_values(settings, target, nxt), None


def synced(settings: Settings, updates) -> jax.Array:
    """Whether update number `updates` (from 1) syncs the target: their agent
    syncs when the step count is a multiple of net_sync_freq, checked on
    update steps, before the update."""
    return updates % (settings.sync_period // settings.update_period) == 0


def update(learner: DeepLearner, settings: Settings, state: DeepState, key: jax.Array, alpha, eta, gamma,
           sync) -> DeepState:
    """One update of a network learner (module docstring), every
    update_period steps: the target synced at `sync` (`synced` of the
    caller's update count; `refresh`), one optimizer step on the centered MSE
    loss (`agents.reward_centering.centered_q_loss`) over a batch, and rbar's
    update (value-based: the batch mean of delta; simple: of r - rbar; the
    loss's target with the updated rbar or the one before it,
    `Settings.target_rbar`). `key` draws the batch; `alpha` is the optimizer's
    learning rate (as its state was made with), beta0 = eta alpha."""
    target, values = refresh(settings, state, sync)
    obs, actions, rewards, v_next, mask = _batch(settings, state.replay, target, values, key)
    g = jnp.ones_like(rewards[0]) if learner.differential else jnp.asarray(gamma, rewards.dtype)
    rate = state.rate

    def loss_fn(params):
        q = networks.mlp_apply(params, obs, settings.activation)
        q_sa = jnp.take_along_axis(q, actions[:, None], axis=1)[:, 0]
        new = rate
        if learner.centering is not None:
            delta = rc.centered_q_td_error(jax.lax.stop_gradient(q_sa), rewards, g, v_next, rate.rbar)
            signal = delta if learner.centering == "value" else rewards - rate.rbar
            new = rc.rate_update(rate, signal, jnp.asarray(eta, rewards.dtype) * alpha, unbiased=learner.unbiased,
                                 mask=mask)
        if learner.centering is None:  # DQN: no rbar in its target
            rbar = jnp.zeros_like(rate.rbar)
        else:
            rbar = new.rbar if settings.target_rbar == "new" else rate.rbar
        return rc.centered_q_loss(q_sa, rewards, g, v_next, rbar, mask), new

    (_, rate), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    import optax

    opt = make_optimizer(settings.optimizer, alpha)
    steps, opt_state = opt.update(grads, state.opt_state, state.params)
    return DeepState(params=optax.apply_updates(state.params, steps), opt_state=opt_state, target=target, rate=rate,
                     replay=state.replay, updates=state.updates + 1, values=values)


def update_flops(settings: Settings, sync: bool | None = None) -> float:
    """Floating-point operations of one update's products, two a
    multiply-add: the network's forward pass over its rows and its backward
    pass (every layer's weight gradient, every layer's input gradient but the
    first's: the observations need none), and the target's pass: with `batch
    = full` over the ring's M slots at a sync (`sync` True) or over the
    update_period new observations (False; None: the mean over a sync
    period), else over the batch's next observations. What the roofline
    measures; biases and activations are left out."""
    sizes = settings.layers
    products = sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))  # multiply-adds of one forward pass a row
    net = 2 * settings.rows * (3 * products - sizes[0] * sizes[1])
    if not settings.full:  # the target's pass over the batch's next observations, every update
        return net + 2 * settings.batch * products
    at_sync, between = 2 * (settings.buffer + 1) * products, 2 * settings.update_period * products
    if sync is not None:
        return net + (at_sync if sync else between)
    k = settings.sync_period // settings.update_period
    return net + (at_sync + (k - 1) * between) / k


def sweep_flops(spec) -> float:
    """A network learner's sweep's products: every run's updates
    (`update_flops`) and its acting (one forward pass of one observation a
    step), over the grid's points and seeds."""
    st = spec.settings
    acting = networks.flops(st.layers, 1) * spec.steps
    per_run = spec.steps // st.update_period * update_flops(st) + acting
    return float(spec.num_points) * spec.seeds * per_run


# ------------------------------------------------------------------ descriptors

_ALPHA = step_size("alpha", "the optimizer's learning rate (Naik et al.'s step_size)")
_ETA = parameter("eta", "ratio of rbar's step size to alpha (beta0 = eta * alpha)", low=0.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeepLearner:
    """A network learner as it describes itself to the continuing front (the
    fields of `algorithms.base.Algorithm` that a sweep reads: name, label,
    hyperparameters, equations), and what its update does: `centering`
    (None, "value" or "simple"), `unbiased` (Naik et al.'s step size for rbar)
    and `differential` (gamma = 1). `init` and `update` are this module's, for
    the executable caches' keys."""

    name: str
    label: str
    hyperparameters: tuple
    equations: str
    centering: str | None = None
    unbiased: bool = False
    differential: bool = False
    init: Any = init
    update: Any = update
    weights: str = "params"
    counter: str | None = None

    @property
    def names(self) -> tuple:
        """The hyperparameter names, in grid order."""
        return tuple(h.name for h in self.hyperparameters)

    @property
    def step_sizes(self) -> tuple:
        """The names of the step-size hyperparameters."""
        return tuple(h.name for h in self.hyperparameters if h.step_size)

    def hyperparameter(self, name: str) -> Hyperparameter:
        """The declared hyperparameter `name`; `ValueError` naming it otherwise."""
        for h in self.hyperparameters:
            if h.name == name:
                return h
        raise ValueError(f"{name}: {self.name} does not take {name} (it takes {', '.join(self.names)})")

    def defaults(self) -> dict:
        """{name: default} of the hyperparameters that have one."""
        return {h.name: h.default for h in self.hyperparameters if h.default is not None}


_CITE = "Naik, Wan, Tomar & Sutton 2024 (arXiv 2405.09999), their CDQNAgent"
DQN = DeepLearner(name="dqn", label="DQN", hyperparameters=(_ALPHA,),
                  equations="DQN (Mnih et al. 2015) as Naik et al. run it: MSE loss to r + gamma max q_target(s'), "
                            "a target network, replay")
CDQN = DeepLearner(name="cdqn", label="CDQN (value-based centering)", hyperparameters=(_ALPHA, _ETA),
                   centering="value",
                   equations=f"DQN with value-based reward centering ({_CITE}); eqs. (12)-(13) [rewardcentering1, "
                             "rewardcentering2] on a network: rbar += eta alpha mean(delta)")
CDQN_UNBIASED = DeepLearner(name="cdqn_unbiased", label="CDQN (value-based, unbiased)",
                            hyperparameters=(_ALPHA, _ETA), centering="value", unbiased=True,
                            equations=f"cdqn with the unbiased step size for rbar ({_CITE}, robust_to_"
                                      "initialization): o += beta0 (1 - o), beta = beta0 / o, target with the new rbar")
CDQN_SIMPLE = DeepLearner(name="cdqn_simple", label="CDQN (simple centering)", hyperparameters=(_ALPHA, _ETA),
                          centering="simple",
                          equations=f"DQN with simple reward centering ({_CITE}); eqs. (9)-(11) [src1, src2, src3] "
                                    "on a network: rbar += eta alpha mean(r - rbar)")
CDQN_SIMPLE_UNBIASED = DeepLearner(name="cdqn_simple_unbiased", label="CDQN (simple, unbiased)",
                                   hyperparameters=(_ALPHA, _ETA), centering="simple", unbiased=True,
                                   equations="cdqn_simple with the unbiased step size for rbar (o += beta0 (1 - o), "
                                             "beta = beta0 / o; target with the new rbar)")
DIFF_DQN = DeepLearner(name="diff_dqn", label="Differential DQN", hyperparameters=(_ALPHA, _ETA),
                       centering="value", differential=True,
                       equations="differential Q-learning (Wan, Naik & Sutton, ICML 2021) on a network: delta = r - "
                                 "rbar + max q_target(s') - q(s, a), rbar += eta alpha mean(delta); no discount")
LEARNERS = (DQN, CDQN, CDQN_UNBIASED, CDQN_SIMPLE, CDQN_SIMPLE_UNBIASED, DIFF_DQN)


def is_deep(alg) -> bool:
    """Whether `alg` is a network learner."""
    return isinstance(alg, DeepLearner)


__all__ = ["CDQN", "CDQN_SIMPLE", "CDQN_SIMPLE_UNBIASED", "CDQN_UNBIASED", "DEFAULT_HIDDEN", "DIFF_DQN", "DQN",
           "DeepLearner", "DeepState", "FULL", "LEARNERS", "OPTIMIZERS", "SETTINGS", "Settings", "TARGET_RBAR", "init", "is_deep",
           "make_optimizer", "q_values", "refresh", "resolve_settings", "sweep_flops", "synced", "target_values", "update",
           "update_flops"]
