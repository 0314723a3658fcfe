"""A centered actor-critic on CartPole: Bellman error centering in an agent's critic.

    python -m bec_jax.experiments.actor_critic --out DIR [--seeds N --steps T --beta B --shift C]

The paper's future work 4. The agent is the one-step actor-critic of Sutton & Barto
(2018, Section 13.5), run A2C-style: each seed has `envs` parallel copies of a
gymnax environment (CartPole-v1 by default, auto-reset by gymnax's `step`), and at
every step one transition from each copy forms the batch of one update. Actor and
critic are separate pure-JAX tanh MLPs (a softmax policy and a scalar value),
each with its own optax optimizer.

Three variants in one jitted program (vmap over variants and seeds, `lax.scan`
over time), with common random numbers: every variant sees the same seeds, so the
same initial weights and the same key stream (a variant's result depends only on
its seed and settings, tested bit for bit). With the default c (below) the program
runs twice: plain and centered, then the control.

  * ``plain``: TD(0) critic, delta = r + gamma v(s') - v(s); actor advantage delta.
  * ``centered``: the critic is trained with centered TD through
    `bec_jax.agents.value_learning` (paper eqs. thetawithrho and omegawithrho with rho = 1):
    params <- params + alpha (delta - omega) grad v(s), omega <- omega + beta
    (delta - omega). The actor's advantage is the centered error delta - omega.
  * ``shift``: the control. The plain agent on the reward r - c for a constant c:
    by default c = the centered agent's final omega (mean over seeds), or `--shift`.

Episode ends. A true termination (the pole falls, the cart leaves the track) has
discount 0: the target is r alone. A time-limit truncation (500 steps) is not a
termination: the target bootstraps from gymnax's `final_observation` with gamma.
What centering does there: the centered critic's target is r - omega + gamma
v(s') with v(terminal) = 0, so its fixed point is the value of the reward r -
omega: omega acts as a per-step cost. In a continuing task a constant shift only
lowers every value by omega / (1 - gamma) and leaves advantages alone; an episode
that terminates pays the cost only until it ends, so the shift lowers values by
an amount that depends on the expected time left, and actions that end the
episode sooner gain advantage (a cost above the per-step reward would make
ending early attractive). The centered agent is then a reward-shift agent with a
slowly moving c = omega_t. omega itself is not pinned down: if v is exactly the
value of r - omega, E[delta | s] = omega in every state and omega's update is at
rest for any omega; where it settles depends on beta and the learning dynamics
(on CartPole it rises from 0 towards r = 1 while v is still small). The program
measures this: the critic's mean value on visited states next to (mean r - c -
omega) / (1 - gamma), the mean TD error and its mean on terminating transitions,
per variant; the shift control with c = final omega tests whether a constant
per-step cost explains the centered agent's curve.

Returns: the undiscounted return of every finished episode is summed, with the
number of episodes, over blocks of `log_every` steps inside the program (the
purejaxrl way: per-step done flags and running returns). A block's mean is its
sum / count (NaN if none finished). The table's "final" return of a seed is the
mean over all episodes finished in the last 10% of the steps; 95% Student-t
intervals over seeds (`bec_jax.stats.t_interval`).
"""
from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bec_jax.agents import value_learning
from bec_jax.files import atomic_write, csv_text, write_json
from bec_jax.stats import t_interval

VARIANTS = ("plain", "centered", "shift")
LOGS = ("return_sum", "episodes", "omega", "value", "delta", "delta_terminal", "terminations", "reward")
OPTIMIZERS = {"adam": optax.adam, "sgd": optax.sgd}


@dataclass(frozen=True)
class Config:
    """The experiment. `steps` updates per agent, each on one transition from each
    of `envs` parallel environments (environment steps per agent = steps * envs).
    `beta`, `omega0`: the centered critic's omega step size and start. `shift`: the
    control's constant c (None: the centered agent's final omega, mean over seeds,
    which costs a second jitted run). `ent_coef`: entropy bonus weight."""

    env: str = "CartPole-v1"
    seeds: int = 20
    steps: int = 8_000
    envs: int = 16
    hidden: tuple = (64, 64)
    gamma: float = 0.99
    actor_lr: float = 3e-4
    critic_lr: float = 1e-3
    optimizer: str = "adam"
    beta: float = 0.01
    omega0: float = 0.0
    shift: float | None = None
    ent_coef: float = 0.01
    log_every: int = 100
    seed: int = 0


def small_config() -> Config:
    """A few-second configuration for tests and smoke runs (not evidence)."""
    return Config(seeds=2, steps=300, envs=4, hidden=(16,), log_every=50)


# ------------------------------------------------------------------- the networks

class Params(NamedTuple):
    """actor: policy parameters; critic: value parameters (any pytrees)."""

    actor: Any
    critic: Any


def init_mlp(key: jax.Array, sizes: tuple, last_scale: float = 1.0) -> list:
    """[(W, b), ...] for layer sizes `sizes`: LeCun-normal weights (the last layer
    scaled by `last_scale`), zero biases."""
    keys = jax.random.split(key, len(sizes) - 1)
    layers = [(jax.random.normal(k, (m, n), jnp.float32) / np.sqrt(m), jnp.zeros((n,), jnp.float32))
              for k, m, n in zip(keys, sizes[:-1], sizes[1:])]
    W, b = layers[-1]
    layers[-1] = (W * last_scale, b)
    return layers


def _matmul(h: jax.Array, W: jax.Array) -> jax.Array:
    """h @ W at HIGHEST precision: a GPU's default f32 matmul is TF32 (about 1e-3
    relative error); the CPU computes f32 dots in f32 either way (the same bits)."""
    return jnp.matmul(h, W, precision=jax.lax.Precision.HIGHEST)


def mlp(params: list, x: jax.Array) -> jax.Array:
    """A tanh MLP with a linear output, for one observation."""
    h = x
    for W, b in params[:-1]:
        h = jnp.tanh(_matmul(h, W) + b)
    W, b = params[-1]
    return _matmul(h, W) + b


def mlp_value(params: list, x: jax.Array) -> jax.Array:
    """v(params, x): the scalar value of one observation."""
    return mlp(params, x)[0]


def init_params(key: jax.Array, obs_dim: int, num_actions: int, hidden: tuple) -> Params:
    """Actor and critic MLPs; the policy's output layer starts near zero (a near
    uniform policy), the critic's at scale 1."""
    ka, kc = jax.random.split(key)
    return Params(actor=init_mlp(ka, (obs_dim,) + tuple(hidden) + (num_actions,), last_scale=0.01),
                  critic=init_mlp(kc, (obs_dim,) + tuple(hidden) + (1,)))


# ---------------------------------------------------------------- the update

class Batch(NamedTuple):
    """One transition from each of B environments: obs (B, d), action (B,),
    reward (B,) (already shifted by the control's c), discount (B,) (0 at a
    termination, gamma otherwise), next_obs (B, d) (the pre-reset observation)."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    discount: jax.Array
    next_obs: jax.Array


def actor_critic_loss(policy_fn: Callable, value_fn: Callable, params: Params,
                      omega: jax.Array | float, batch: Batch,
                      ent_coef: float = 0.0) -> tuple[jax.Array, jax.Array]:
    """(loss, (B,) TD errors) of one actor-critic update; the gradient in `params`
    is the update, for any optax optimizer.

    Critic: `value_learning.batch_centered_td_loss`, whose gradient is minus the mean of
    (delta - omega) grad v(s) (paper eq. thetawithrho, rho = 1). Actor:
    -mean(stop_gradient(delta - omega) log pi(a|s)) - ent_coef mean(entropy).
    The actor uses the CENTERED error: the centered critic converges to the value
    of r - omega, so delta - omega (not delta) is that critic's TD error for its
    own reward; E[delta | s, a] = (advantage) + omega, and the raw delta would add
    omega to every advantage, pushing up the probability of every action taken by
    an amount that depends on omega and not on the action's merit. omega = 0 gives
    the plain one-step actor-critic. `policy_fn(params, x)` returns logits.
    """
    critic_loss, deltas = value_learning.batch_centered_td_loss(
        value_fn, params.critic, omega, batch.obs, batch.reward, batch.discount, batch.next_obs)
    adv = jax.lax.stop_gradient(deltas - omega)
    logits = jax.vmap(policy_fn, (None, 0))(params.actor, batch.obs)
    logp = jax.nn.log_softmax(logits)
    logp_a = jnp.take_along_axis(logp, batch.action[:, None], axis=1)[:, 0]
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=1)
    actor_loss = -jnp.mean(adv * logp_a) - ent_coef * jnp.mean(entropy)
    return critic_loss + actor_loss, deltas


class AgentState(NamedTuple):
    """Everything an agent carries from one update to the next."""

    params: Params
    actor_opt: Any
    critic_opt: Any
    omega: value_learning.OmegaState


def make_update(policy_fn: Callable, value_fn: Callable, actor_opt: optax.GradientTransformation,
                critic_opt: optax.GradientTransformation, ent_coef: float = 0.0):
    """`update(agent, batch, beta) -> (agent, deltas)`: one actor-critic step with
    the centered critic. The gradients and deltas use omega_t; then omega_{t+1} =
    omega_t + beta mean(delta - omega_t) (eq. omegawithrho, rho = 1). beta = 0 with
    omega_0 = 0 is plain TD."""

    def update(agent: AgentState, batch: Batch, beta) -> tuple[AgentState, jax.Array]:
        om = agent.omega
        grads, deltas = jax.grad(actor_critic_loss, argnums=2, has_aux=True)(
            policy_fn, value_fn, agent.params, om.omega, batch, ent_coef)
        ua, actor_state = actor_opt.update(grads.actor, agent.actor_opt, agent.params.actor)
        uc, critic_state = critic_opt.update(grads.critic, agent.critic_opt, agent.params.critic)
        params = Params(actor=optax.apply_updates(agent.params.actor, ua),
                        critic=optax.apply_updates(agent.params.critic, uc))
        om = value_learning.omega_update(om, deltas, 1.0, beta)
        return AgentState(params, actor_state, critic_state, om), deltas

    return update


# ------------------------------------------------------------------- the program

def make_env(name: str):
    """(env, env_params) of a gymnax environment."""
    import gymnax  # optional dependency: only this experiment needs it

    return gymnax.make(name)


def make_agent(cfg: Config):
    """Python-side setup; returns `run_agent(key, beta, omega0, shift) -> logs`, one
    agent's whole training (not jitted, not vmapped): `logs` is a dict of
    (steps // log_every,) arrays, one per name in `LOGS`."""
    env, env_params = make_env(cfg.env)
    obs_dim = int(np.prod(env.observation_space(env_params).shape))
    num_actions = int(env.num_actions)
    if cfg.optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer: unknown optimizer {cfg.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    if cfg.steps % cfg.log_every:
        raise ValueError(f"steps ({cfg.steps}) must be a multiple of log_every ({cfg.log_every})")
    actor_opt, critic_opt = OPTIMIZERS[cfg.optimizer](cfg.actor_lr), OPTIMIZERS[cfg.optimizer](cfg.critic_lr)
    update = make_update(mlp, mlp_value, actor_opt, critic_opt, cfg.ent_coef)
    K, L, N, gamma = cfg.log_every, cfg.steps // cfg.log_every, cfg.envs, cfg.gamma
    env_step = jax.vmap(env.step, (0, 0, 0, None))

    def run_agent(key, beta, omega0, shift):
        k_init, k_env, k_run = jax.random.split(key, 3)
        params = init_params(k_init, obs_dim, num_actions, cfg.hidden)
        agent = AgentState(params, actor_opt.init(params.actor), critic_opt.init(params.critic),
                           value_learning.omega_init()._replace(omega=jnp.asarray(omega0, jnp.float32)))
        obs, env_state = jax.vmap(env.reset, (0, None))(jax.random.split(k_env, N), env_params)
        ep_ret = jnp.zeros((N,), jnp.float32)

        def step(carry, t):
            agent, obs, env_state, ep_ret = carry
            k_act, k_step = jax.random.split(jax.random.fold_in(k_run, t))
            logits = jax.vmap(mlp, (None, 0))(agent.params.actor, obs)
            action = jax.random.categorical(k_act, logits)
            next_obs, env_state, reward, term, trunc, info = env_step(
                jax.random.split(k_step, N), env_state, action, env_params)
            reward = reward.astype(jnp.float32)
            discount = jnp.where(term, 0.0, gamma).astype(jnp.float32)
            batch = Batch(obs, action, reward - shift, discount,
                          info["final_observation"].astype(jnp.float32))
            value = jax.vmap(mlp_value, (None, 0))(agent.params.critic, obs)
            agent, deltas = update(agent, batch, beta)
            ep_ret = ep_ret + reward
            done = jnp.logical_or(term, trunc)
            termf = term.astype(jnp.float32)
            log = jnp.stack([jnp.sum(jnp.where(done, ep_ret, 0.0)), jnp.sum(done.astype(jnp.float32)),
                             jnp.float32(0.0), jnp.mean(value), jnp.mean(deltas),
                             jnp.sum(termf * deltas), jnp.sum(termf), jnp.mean(reward)])
            ep_ret = jnp.where(done, 0.0, ep_ret)
            return (agent, next_obs.astype(jnp.float32), env_state, ep_ret), log

        def block(carry, j):
            carry, logs = jax.lax.scan(step, carry, j * K + jnp.arange(K))
            sums = jnp.sum(logs, axis=0)
            # per block: sums of returns, episodes, terminal deltas, terminations;
            # means of value, delta and reward; omega at the block's end
            out = sums.at[jnp.array([3, 4, 7])].divide(K).at[2].set(carry[0].omega.omega)
            return carry, out

        _, out = jax.lax.scan(block, (agent, obs.astype(jnp.float32), env_state, ep_ret), jnp.arange(L))
        return {name: out[:, i] for i, name in enumerate(LOGS)}

    return run_agent


def make_train(cfg: Config):
    """`train(key, betas, omega0s, shifts) -> logs`: `run_agent` vmapped over seeds
    (`cfg.seeds` keys folded from `key`, shared by every variant) and over V
    variants (the (V,) arrays), jitted. Each log has shape (V, seeds, logs)."""
    run_agent = make_agent(cfg)
    over_seeds = jax.vmap(run_agent, (0, None, None, None))
    over_variants = jax.vmap(over_seeds, (None, 0, 0, 0))

    @jax.jit
    def train(key, betas, omega0s, shifts):
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(cfg.seeds))
        return over_variants(keys, betas, omega0s, shifts)

    return train


def _f32(xs) -> jax.Array:
    return jnp.asarray(xs, jnp.float32)


def train_variants(cfg: Config, train=None) -> tuple[dict, float]:
    """Runs the three variants; returns ({variant: {log: (seeds, logs) array}}, c).

    With `cfg.shift` set, all three run in one call of the jitted program;
    otherwise plain and centered run first and the shift control second, with c =
    the centered agent's final omega (mean over seeds)."""
    train = train or make_train(cfg)
    key = jax.random.key(cfg.seed)

    def split(logs, i):
        return {k: np.asarray(v[i]) for k, v in logs.items()}

    if cfg.shift is not None:
        c = float(cfg.shift)
        logs = train(key, _f32([0.0, cfg.beta, 0.0]), _f32([0.0, cfg.omega0, 0.0]), _f32([0.0, 0.0, c]))
        return {v: split(logs, i) for i, v in enumerate(VARIANTS)}, c
    logs = train(key, _f32([0.0, cfg.beta]), _f32([0.0, cfg.omega0]), _f32([0.0, 0.0]))
    out = {v: split(logs, i) for i, v in enumerate(VARIANTS[:2])}
    c = float(np.mean(out["centered"]["omega"][:, -1]))
    out["shift"] = split(train(key, _f32([0.0]), _f32([0.0]), _f32([c])), 0)
    return out, c


# ------------------------------------------------------------------- statistics

def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def summarise(cfg: Config, logs: dict, shift: float, seconds: float | None = None) -> dict:
    """Per variant: the curve of mean episodic return per block (mean and 95% t
    interval over seeds; a block with no finished episode repeats the previous
    block), the final return (episodes finished in the last 10% of steps), the area
    under the curve (the per-seed curve's mean over all blocks: learning speed, as
    the final return saturates at CartPole's 500), each a mean and 95% CI over seeds;
    final omega; and the episode-end diagnostics over the last 10%: the critic's
    mean value on visited states, next to `value_per_step_cost` = (mean reward - c -
    omega) / (1 - gamma), the value of a never-ending episode whose per-step reward
    is r - c - omega (c = the control's shift); the mean TD error delta (uncentered,
    on the shifted reward), and its mean on terminating transitions."""
    L = cfg.steps // cfg.log_every
    tail = max(1, round(0.1 * L))
    steps = ((np.arange(L) + 1) * cfg.log_every * cfg.envs).tolist()
    out = {"config": asdict(cfg), "shift": shift, "env_steps": steps, "tail_blocks": tail,
           "seconds": seconds, "variants": {}}
    for v, lg in logs.items():
        per_block = _ratio(lg["return_sum"], lg["episodes"])  # (seeds, L)
        filled = per_block.copy()
        for s in range(filled.shape[0]):  # carry the last finished episode's mean forward
            for j in range(1, L):
                if np.isnan(filled[s, j]):
                    filled[s, j] = filled[s, j - 1]
        curve = [t_interval(filled[np.isfinite(filled[:, j]), j]) for j in range(L)]
        n_fin = np.isfinite(filled).sum(1)
        auc = _ratio(np.where(np.isfinite(filled), filled, 0.0).sum(1), n_fin)
        a_m, a_lo, a_hi = t_interval(auc[np.isfinite(auc)])
        final = _ratio(lg["return_sum"][:, -tail:].sum(1), lg["episodes"][:, -tail:].sum(1))
        m, lo, hi = t_interval(final[np.isfinite(final)])
        om = lg["omega"][:, -1]
        om_m, om_lo, om_hi = t_interval(om)
        val = lg["value"][:, -tail:].mean(1)
        dterm = _ratio(lg["delta_terminal"][:, -tail:].sum(1), lg["terminations"][:, -tail:].sum(1))
        c = shift if v == "shift" else 0.0
        per_step = (lg["reward"][:, -tail:].mean(1) - c - lg["omega"][:, -tail:].mean(1)) / (1.0 - cfg.gamma)
        out["variants"][v] = {
            "final_return": {"mean": m, "low": lo, "high": hi, "per_seed": final.tolist()},
            "auc_return": {"mean": a_m, "low": a_lo, "high": a_hi, "per_seed": auc.tolist()},
            "final_omega": {"mean": om_m, "low": om_lo, "high": om_hi},
            "final_value_mean": float(np.mean(val)),
            "value_per_step_cost": float(np.mean(per_step)),
            "final_delta_mean": float(np.mean(lg["delta"][:, -tail:])),
            "final_delta_terminal_mean": float(np.nanmean(dterm)) if np.isfinite(dterm).any() else None,
            "final_episodes": float(np.mean(lg["episodes"][:, -tail:].sum(1))),
            "curve_mean": [c[0] for c in curve],
            "curve_low": [c[1] for c in curve],
            "curve_high": [c[2] for c in curve],
            "omega_curve": lg["omega"].mean(0).tolist(),
            "value_curve": lg["value"].mean(0).tolist(),
            "value_per_step_cost_curve": ((lg["reward"] - c - lg["omega"]).mean(0)
                                          / (1.0 - cfg.gamma)).tolist(),
        }
    out["paired_auc"] = {}
    for a, b in (("centered", "plain"), ("shift", "plain"), ("centered", "shift")):
        if a in out["variants"] and b in out["variants"]:
            d = (np.asarray(out["variants"][a]["auc_return"]["per_seed"])
                 - np.asarray(out["variants"][b]["auc_return"]["per_seed"]))
            m, lo, hi = t_interval(d[np.isfinite(d)])
            out["paired_auc"][f"{a} - {b}"] = {"mean": m, "low": lo, "high": hi}
    return out


def run(cfg: Config) -> dict:
    """Runs the experiment (compile included in the timing) and returns
    `summarise`'s dict."""
    t0 = time.perf_counter()
    logs, c = train_variants(cfg)
    return summarise(cfg, logs, c, time.perf_counter() - t0)


# ---------------------------------------------------------------------- output

COLORS = {"plain": "tab:blue", "centered": "tab:orange", "shift": "tab:green"}


def label(variant: str, summary: dict) -> str:
    """The legend text of a variant."""
    cfg = summary["config"]
    return {"plain": "TD critic",
            "centered": f"centered TD critic (β = {cfg['beta']:g})",
            "shift": f"TD critic on r − c, c = {summary['shift']:.3f}"}[variant]


def figure(summary: dict):
    """Three panels, one line per variant: learning curves (mean episodic return,
    95% t band over seeds); omega; the critic's mean value on visited states with
    the per-step-cost value (mean r - c - omega) / (1 - gamma) dashed. A `Figure`
    made without pyplot."""
    from bec_jax.prediction.plotting import new_figure

    cfg = summary["config"]
    x = np.asarray(summary["env_steps"])
    fig, axes = new_figure(1, 3, panel=(5.4, 4.4))
    ax, ax_om, ax_v = axes[0]
    for v, res in summary["variants"].items():
        ax.plot(x, res["curve_mean"], color=COLORS[v], label=label(v, summary))
        ax.fill_between(x, res["curve_low"], res["curve_high"], color=COLORS[v], alpha=0.2, linewidth=0)
        if v == "centered":
            ax_om.plot(x, res["omega_curve"], color=COLORS[v], label=label(v, summary))
        ax_v.plot(x, res["value_curve"], color=COLORS[v], label=label(v, summary))
        ax_v.plot(x, res["value_per_step_cost_curve"], "--", color=COLORS[v], linewidth=1)
    if "shift" in summary["variants"]:
        ax_om.axhline(summary["shift"], color=COLORS["shift"], ls=":", label=f"control's c = {summary['shift']:.3f}")
    ax_om.axhline(0.0, color=COLORS["plain"], ls=":", label="TD critic: ω = 0")
    ax.set_ylabel("episodic return")
    ax.set_title("return of finished episodes, mean and 95% CI", fontsize=10)
    ax_om.set_ylabel("ω (acts as a per-step cost)")
    ax_om.set_title("ω of the centered critic, mean over seeds", fontsize=10)
    vals = np.concatenate([np.ravel(r[k]) for r in summary["variants"].values()
                           for k in ("value_curve", "value_per_step_cost_curve")])
    if np.all(vals[np.isfinite(vals)] > 0):
        ax_v.set_yscale("log")
    ax_v.set_ylabel("mean v(s) on visited states")
    ax_v.set_title("critic's value (solid); dashed: (r̄ − c − ω) / (1 − γ)", fontsize=10)
    for a in (ax, ax_om, ax_v):
        a.set_xlabel("environment steps per agent")
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle(f"One-step actor-critic on {cfg['env']}: {cfg['seeds']} seeds, {cfg['envs']} envs per "
                 f"agent, MLP {list(cfg['hidden'])}, {cfg['optimizer']}, γ = {cfg['gamma']:g}", fontsize=10)
    fig.tight_layout()
    return fig


def table(summary: dict) -> list[dict]:
    """One row per variant: final return (mean, 95% CI), final omega, diagnostics."""
    rows = []
    for v, res in summary["variants"].items():
        fr, au, om = res["final_return"], res["auc_return"], res["final_omega"]
        rows.append({"variant": v, "return_mean": fr["mean"], "return_ci_low": fr["low"],
                     "return_ci_high": fr["high"], "auc_mean": au["mean"], "auc_ci_low": au["low"],
                     "auc_ci_high": au["high"], "omega_mean": om["mean"], "omega_ci_low": om["low"],
                     "omega_ci_high": om["high"], "value_mean": res["final_value_mean"],
                     "value_per_step_cost": res["value_per_step_cost"],
                     "delta_mean": res["final_delta_mean"],
                     "delta_terminal_mean": res["final_delta_terminal_mean"]})
    return rows


def report(summary: dict) -> str:
    """The table as text."""
    cfg = summary["config"]

    def ci(m, lo, hi, f):
        return f"{m:{f}} [{lo:{f}}, {hi:{f}}]"

    def num(x):
        return "n/a" if x is None else f"{x:.3f}"

    lines = [(f"final = mean return of episodes finished in the last 10% of {cfg['steps']} steps x "
              f"{cfg['envs']} envs; auc = mean of the return curve over training; mean [95% CI] over "
              f"{cfg['seeds']} seeds; v, delta: last 10%")]
    for r in table(summary):
        lines.append(f"{r['variant']:>8}: final {ci(r['return_mean'], r['return_ci_low'], r['return_ci_high'], '.1f')}"
                     f"  auc {ci(r['auc_mean'], r['auc_ci_low'], r['auc_ci_high'], '.1f')}"
                     f"  omega {ci(r['omega_mean'], r['omega_ci_low'], r['omega_ci_high'], '.3f')}"
                     f"  mean v(s) {r['value_mean']:.2f} (per-step-cost value {r['value_per_step_cost']:.2f})"
                     f"  mean delta {r['delta_mean']:.3f}, at terminations {num(r['delta_terminal_mean'])}")
    for k, d in summary.get("paired_auc", {}).items():
        lines.append(f"paired auc difference {k}: {ci(d['mean'], d['low'], d['high'], '.1f')}")
    lines.append(f"shift control c = {summary['shift']:.4f}"
                 + (f"; wall time {summary['seconds']:.1f} s" if summary.get("seconds") else ""))
    return "\n".join(lines)


def write(summary: dict, out: str) -> list[str]:
    """actor_critic.png/.pdf, actor_critic.json (everything) and
    actor_critic.csv (the table) into `out`; returns the paths."""
    from bec_jax.prediction.plotting import save_figure

    paths = save_figure(figure(summary), out, "actor_critic")
    js, cs = os.path.join(out, "actor_critic.json"), os.path.join(out, "actor_critic.csv")
    write_json(js, summary)
    atomic_write(cs, lambda f: f.write(csv_text(table(summary))))
    return paths + [js, cs]


def main(argv=None) -> None:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/actor_critic", help="output directory")
    p.add_argument("--small", action="store_true", help="the few-second smoke configuration")
    helps = {"seeds": "independent agents per variant (default 20)",
             "steps": "updates per agent (default 8000); env steps = steps * envs",
             "envs": "parallel environments per agent (default 16)",
             "beta": "the centered critic's omega step size (default 0.01)",
             "omega0": "the centered critic's initial omega (default 0)",
             "shift": "the control's constant c (default: the centered agent's final mean omega)",
             "env": "a gymnax environment id (default CartPole-v1)"}
    for name, typ in (("env", str), ("seeds", int), ("steps", int), ("envs", int), ("beta", float),
                      ("omega0", float), ("shift", float), ("gamma", float), ("actor_lr", float),
                      ("critic_lr", float), ("ent_coef", float), ("log_every", int), ("seed", int)):
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, default=None, help=helps.get(name))
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default=None)
    p.add_argument("--hidden", default=None, help="comma-separated hidden sizes")
    a = p.parse_args(argv)
    cfg = small_config() if a.small else Config()
    over = {k: v for k, v in vars(a).items() if k not in ("out", "small", "hidden") and v is not None}
    if a.hidden:
        over["hidden"] = tuple(int(h) for h in a.hidden.split(","))
    cfg = replace(cfg, **over)
    summary = run(cfg)
    paths = write(summary, a.out)
    print(report(summary))
    print("wrote " + ", ".join(paths))


if __name__ == "__main__":
    main()
