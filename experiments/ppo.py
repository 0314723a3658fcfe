"""A centered PPO agent on gymnax classic control, with a reward-shift control.

    python -m bec_jax.experiments.ppo --out DIR [--tasks T,... --seeds N --timesteps S --beta B --shift C]

Issue 17, item 5: does Bellman error centering help an actor-critic, or does it
only shift the reward? The agent is PPO with purejaxrl's defaults (Lu et al.,
2022, `ppo.py`): 4 environment copies per agent, rollouts of 128 steps, 4 epochs
of 4 minibatches, gamma 0.99, GAE lambda 0.95, clip 0.2 (policy ratio and value),
entropy 0.01, value coefficient 0.5, gradient norm 0.5, Adam at 2.5e-4 annealed
linearly to 0, advantages normalised per minibatch, separate tanh MLP actor and
critic (64, 64; orthogonal init). Tasks: gymnax `CartPole-v1`, `Acrobot-v1`,
`MountainCar-v0`. Pure JAX: per task, one jitted program vmaps over variants and
seeds and scans over updates (rollout + PPO epochs).

Variants, with common random numbers (a seed gives every variant the same initial
weights and the same key stream; in one call a variant's run depends only on its
seed and its settings, not on the variants beside it, tested bit for bit; the shift
control's second pass is a program of another batch shape, whose CPU matmuls round
differently in the last bits, so its pairing with the first pass is exact in the
keys and initial weights but not bit for bit in the run):

  * ``plain``: GAE on r (`rlax.truncated_generalized_advantage_estimation`'s
    recursion).
  * ``centered``: GAE of the centered TD errors delta_t - omega (paper eq.
    thetawithrho, eq. (31), rho = 1: the advantages are the GAE of r - omega),
    through `bec_jax.agents.targets.centered_truncated_generalized_advantage_estimation`.
    The actor uses these centered advantages; the critic regresses on values +
    centered advantages. omega is updated ONCE PER ROLLOUT from all the rollout's
    uncentered TD errors, omega <- omega + beta mean(delta - omega) (eq.
    omegawithrho, eq. (30), rho = 1; `bec_jax.agents.value_learning.omega_update`), beta =
    0.1 by default, omega_0 = 0. The epochs use the rollout's omega.
  * ``centered_terminal``: the same with the termination option (`terminal_t`): a
    TRUE termination bootstraps from the absorbing value -omega / (1 - gamma), so
    the centered values are v - omega / (1 - gamma) for any fixed omega and the
    optimal policy is unchanged (see `bec_jax.agents.targets`). Without it a
    termination's target is r - omega, so omega acts as a per-step cost (omega > 0)
    or bonus (omega < 0) that changes which policy is best.
  * ``shift``: the control. ``plain`` on the reward r - c with a FIXED c: by
    default c = the ``centered`` agent's final omega (mean over seeds, per task),
    run as a second pass; ``--shift C`` sets c for every task and runs all four in
    one pass.

Terminations and truncations. gymnax 1.x's `env.step` auto-resets and returns
`terminated` and `truncated` separately (a time limit is `truncated`; natural ends
such as the pole falling, Acrobot's swing-up or MountainCar's goal are
`terminated`; both flags can be set, and then it is a termination) and the
pre-reset observation as `info["final_observation"]`. A termination has discount 0
(or, with ``centered_terminal``, the absorbing bootstrap above). A truncation
bootstraps with gamma from v(final observation): the GAE recursion takes values
(T+1,) whose entry t+1 is v of the auto-reset observation, so the reward of a
truncated step is corrected by gamma (v(final obs) - v(reset obs)), which makes
its TD error exactly r + gamma v(final obs) - v(s) (the same TD error enters
omega's update), and the trace is cut there (lambda_t = 0) so the next episode's
errors do not leak back. CartPole's and Acrobot's limit is 500 steps,
MountainCar's 200.

Returns: the undiscounted return (of the raw reward r, for every variant) of each
episode finished during a rollout is summed, with the count of such episodes, per
update inside the program. A seed's FINAL score is the mean return of all
episodes it finished in the last 10% of the updates (sum of returns / number of
episodes). Tables give the mean over seeds and the 95% Student-t interval
(`bec_jax.stats.t_interval`). Curves: per seed, episodes finished in blocks of
updates (sum / count), 95% t band over seeds.

Outputs in `--out`: table.csv, table.md, curves.npz (per task and variant: the
per-update return sums, episode counts, omega and mean critic value, (seeds,
updates) each), summary.json (config, per-task timesteps, shift values used,
wall times, the statistics) and ppo.png/.pdf (a panel of learning curves per task,
omega below). Each finished task is also saved as logs_<task>.npz; a rerun into
the same `--out` with the same settings reuses it (so `--tasks` runs, one process
per task, can be combined by a final run without `--tasks`).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bec_jax.agents import value_learning
from bec_jax.agents.targets import centered_truncated_generalized_advantage_estimation
from bec_jax.files import atomic_write, csv_text, write_json
from bec_jax.run import watchdog
from bec_jax.stats import t_interval

VARIANTS = ("plain", "centered", "centered_terminal", "shift")
TASKS = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0")
# Per-task environment steps per agent of the default run (chosen so that the
# whole default run takes about 8 minutes on two CPU cores; CartPole at 2e5 as
# in the measurement).
DEFAULT_TIMESTEPS = {"CartPole-v1": 200_000, "Acrobot-v1": 500_000, "MountainCar-v0": 200_000}
LOGS = ("return_sum", "episodes", "omega", "value")


@dataclass(frozen=True)
class Config:
    """The experiment. `timesteps`: environment steps per agent for every task
    (None: `DEFAULT_TIMESTEPS`); updates = timesteps // (num_envs * num_steps).
    `beta`: omega's step size (once per rollout). `shift`: the control's c (None:
    the centered agent's final omega per task, a second pass). The rest are
    purejaxrl's PPO defaults."""

    tasks: tuple = TASKS
    seeds: int = 16
    timesteps: int | None = None
    beta: float = 0.1
    shift: float | None = None
    num_envs: int = 4
    num_steps: int = 128
    update_epochs: int = 4
    num_minibatches: int = 4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    lr: float = 2.5e-4
    anneal_lr: bool = True
    hidden: tuple = (64, 64)
    final_fraction: float = 0.1
    curve_points: int = 50
    seed: int = 0

    def steps_for(self, task: str) -> int:
        return int(self.timesteps if self.timesteps is not None else DEFAULT_TIMESTEPS[task])

    def updates_for(self, task: str) -> int:
        return self.steps_for(task) // (self.num_envs * self.num_steps)


def small_config() -> Config:
    """A few-second configuration for tests and smoke runs (not evidence)."""
    return Config(tasks=("CartPole-v1",), seeds=2, timesteps=4 * 2 * 32, num_envs=2, num_steps=32,
                  update_epochs=2, num_minibatches=2, hidden=(16,), curve_points=4)


# ------------------------------------------------------------------- the networks

class Params(NamedTuple):
    """actor: policy MLP [(W, b), ...]; critic: value MLP."""

    actor: Any
    critic: Any


def orthogonal(key: jax.Array, shape: tuple, scale: float) -> jax.Array:
    """`jax.nn.initializers.orthogonal(scale)(key, shape, float32)`; under a vmap
    over keys, a loop of one-key QRs (the same weights bit for bit, tested)."""
    init = jax.nn.initializers.orthogonal(scale)
    # jaxlib 0.10's CPU LAPACK splits a batched QR over XLA's thread pool and waits
    # for the pieces on a pool thread: with every thread waiting the process
    # deadlocks now and then (jax-ml/jax#36927). A loop keeps each QR unbatched.
    return jax.custom_batching.sequential_vmap(lambda k: init(k, shape, jnp.float32))(key)


def init_mlp(key: jax.Array, sizes: tuple, last_scale: float) -> list:
    """purejaxrl's initialisation: orthogonal weights with scale sqrt(2) (hidden)
    and `last_scale` (output), zero biases."""
    keys = jax.random.split(key, len(sizes) - 1)
    layers = []
    for i, (k, m, n) in enumerate(zip(keys, sizes[:-1], sizes[1:])):
        scale = last_scale if i == len(sizes) - 2 else np.sqrt(2.0)
        W = orthogonal(k, (m, n), scale)
        layers.append((W, jnp.zeros((n,), jnp.float32)))
    return layers


def _matmul(h: jax.Array, W: jax.Array) -> jax.Array:
    """h @ W at HIGHEST precision: a GPU's default f32 matmul is TF32 (about 1e-3
    relative error); the CPU computes f32 dots in f32 either way (the same bits)."""
    return jnp.matmul(h, W, precision=jax.lax.Precision.HIGHEST)


def mlp(params: list, x: jax.Array) -> jax.Array:
    """A tanh MLP with a linear output; x (..., d)."""
    lead = (1,) * (x.ndim - 1)  # explicit broadcast of the biases (no rank promotion)
    h = x
    for W, b in params[:-1]:
        h = jnp.tanh(_matmul(h, W) + b.reshape(lead + b.shape))
    W, b = params[-1]
    return _matmul(h, W) + b.reshape(lead + b.shape)


def init_params(key: jax.Array, obs_dim: int, num_actions: int, hidden: tuple) -> Params:
    ka, kc = jax.random.split(key)
    return Params(actor=init_mlp(ka, (obs_dim,) + tuple(hidden) + (num_actions,), 0.01),
                  critic=init_mlp(kc, (obs_dim,) + tuple(hidden) + (1,), 1.0))


def value(params: Params, obs: jax.Array) -> jax.Array:
    return mlp(params.critic, obs)[..., 0]


# ------------------------------------------------------------ advantages, omega

class Advantages(NamedTuple):
    """advantages (T,) (centered when omega != 0), td_errors (T,) (uncentered: omega's
    input), targets (T,) = values[:-1] + advantages (the critic's regression target)."""

    advantages: jax.Array
    td_errors: jax.Array
    targets: jax.Array


def advantages(reward, terminated, truncated, values, final_values, omega, *, gamma: float,
               lambda_: float, terminal_option=False, shift=0.0) -> Advantages:
    """The GAE of one environment copy's rollout, for every variant: T steps,
    `values` (T+1,) = v(s_0..s_T) (s_{t+1} the auto-reset observation after an
    episode end), `final_values` (T,) = v(pre-reset observation after step t).

    reward r_t - shift; discount gamma (0 at a termination); at a truncation (not a
    termination) the reward gains gamma (final_values_t - values_{t+1}) so the TD
    error bootstraps from the final observation, and lambda_t = 0 cuts the trace.
    Then `centered_truncated_generalized_advantage_estimation` with omega, and
    `terminal_t` = terminated where `terminal_option` (a true termination
    bootstraps from -omega / (1 - gamma)). With omega = 0 and terminal_option off
    this is `rlax.truncated_generalized_advantage_estimation` on the corrected
    reward (tested)."""
    term = terminated.astype(bool)
    trunc = truncated.astype(bool) & ~term
    discount = jnp.where(term, 0.0, gamma).astype(reward.dtype)
    r = reward - shift
    r = jnp.where(trunc, r + discount * (final_values - values[1:]), r)
    lam = jnp.where(trunc, 0.0, lambda_).astype(reward.dtype)
    terminal_t = term & jnp.asarray(terminal_option, bool)
    out = centered_truncated_generalized_advantage_estimation(
        r, discount, lam, values, omega, terminal_t=terminal_t, gamma=gamma)
    return Advantages(out.advantages, out.td_errors, values[:-1] + out.advantages)


def rollout_omega_update(state: value_learning.OmegaState, td_errors: jax.Array, beta) -> value_learning.OmegaState:
    """omega's update once per rollout: omega + beta mean(delta - omega) over ALL
    the rollout's uncentered TD errors (every step of every copy; eq. omegawithrho,
    rho = 1)."""
    return value_learning.omega_update(state, jnp.ravel(td_errors), 1.0, beta)


# ------------------------------------------------------------------------ PPO

class Transition(NamedTuple):
    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_value: jax.Array


def ppo_loss(params: Params, obs, action, old_log_prob, old_value, adv, targets, cfg: Config):
    """purejaxrl's PPO loss: clipped policy ratio on minibatch-normalised
    advantages, clipped value loss, entropy bonus."""
    logits = mlp(params.actor, obs)
    logp_all = jax.nn.log_softmax(logits)
    logp = jnp.take_along_axis(logp_all, action[:, None], axis=1)[:, 0]
    v = value(params, obs)
    v_clipped = old_value + jnp.clip(v - old_value, -cfg.clip_eps, cfg.clip_eps)
    value_loss = 0.5 * jnp.mean(jnp.maximum(jnp.square(v - targets), jnp.square(v_clipped - targets)))
    ratio = jnp.exp(logp - old_log_prob)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    actor_loss = -jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv))
    entropy = jnp.mean(-jnp.sum(jnp.exp(logp_all) * logp_all, axis=1))
    return actor_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy


def make_env(name: str):
    import gymnax  # optional dependency: only the agent experiments need it

    return gymnax.make(name)


def make_agent(cfg: Config, task: str, num_updates: int | None = None):
    """`run_agent(key, beta, terminal_option, shift) -> logs`: one agent's whole
    training (not jitted, not vmapped); `logs` maps each name in `LOGS` to a
    (num_updates,) array: per update, the sum of returns and the number of
    episodes finished during its rollout, omega after the update, the mean critic
    value on the rollout."""
    env, env_params = make_env(task)
    obs_dim = int(np.prod(env.observation_space(env_params).shape))
    num_actions = int(env.num_actions)
    N, T = cfg.num_envs, cfg.num_steps
    U = cfg.updates_for(task) if num_updates is None else num_updates
    batch = N * T
    if batch % cfg.num_minibatches:
        raise ValueError(f"num_envs * num_steps ({batch}) must be a multiple of num_minibatches")
    mb = batch // cfg.num_minibatches

    def lr_schedule(count):
        frac = 1.0 - (count // (cfg.num_minibatches * cfg.update_epochs)) / U
        return cfg.lr * frac

    tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                     optax.adam(lr_schedule if cfg.anneal_lr else cfg.lr, eps=1e-5))
    env_step = jax.vmap(env.step, (0, 0, 0, None))
    gae = jax.vmap(lambda r, te, tr, v, fv, om, opt, c: advantages(
        r, te, tr, v, fv, om, gamma=cfg.gamma, lambda_=cfg.gae_lambda, terminal_option=opt, shift=c),
        (1, 1, 1, 1, 1, None, None, None), 1)
    grad_fn = jax.grad(ppo_loss)

    def run_agent(key, beta, terminal_option, shift):
        k_init, k_env, k_run = jax.random.split(key, 3)
        params = init_params(k_init, obs_dim, num_actions, cfg.hidden)
        opt_state = tx.init(params)
        obs, env_state = jax.vmap(env.reset, (0, None))(jax.random.split(k_env, N), env_params)
        carry0 = (params, opt_state, value_learning.omega_init(), obs.astype(jnp.float32), env_state,
                  jnp.zeros((N,), jnp.float32), k_run)

        def env_step_fn(carry, _):
            params, opt_state, om, obs, env_state, ep_ret, key = carry
            key, k_act, k_step = jax.random.split(key, 3)
            logits = mlp(params.actor, obs)
            action = jax.random.categorical(k_act, logits)
            log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=1)[:, 0]
            v = value(params, obs)
            next_obs, env_state, reward, term, trunc, info = env_step(
                jax.random.split(k_step, N), env_state, action, env_params)
            final_v = value(params, info["final_observation"].astype(jnp.float32))
            reward = reward.astype(jnp.float32)
            done = jnp.logical_or(term, trunc)
            ep_ret = ep_ret + reward
            finished = (jnp.sum(jnp.where(done, ep_ret, 0.0)), jnp.sum(done.astype(jnp.float32)))
            ep_ret = jnp.where(done, 0.0, ep_ret)
            tr = Transition(obs, action, log_prob, v, reward, term, trunc, final_v)
            return (params, opt_state, om, next_obs.astype(jnp.float32), env_state, ep_ret, key), (tr, finished)

        def update(carry, _):
            carry, (traj, finished) = jax.lax.scan(env_step_fn, carry, None, T)
            params, opt_state, om, obs, env_state, ep_ret, key = carry
            values = jnp.concatenate([traj.value, value(params, obs)[None]], axis=0)  # (T+1, N)
            out = gae(traj.reward, traj.terminated, traj.truncated, values, traj.final_value,
                      om.omega, terminal_option, shift)
            om = rollout_omega_update(om, out.td_errors, beta)
            flat = jax.tree.map(lambda x: x.reshape((batch,) + x.shape[2:]),
                                (traj.obs, traj.action, traj.log_prob, traj.value,
                                 out.advantages, out.targets))

            def epoch(state, key):
                params, opt_state = state
                perm = jax.random.permutation(key, batch)
                mbs = jax.tree.map(lambda x: x[perm].reshape((cfg.num_minibatches, mb) + x.shape[1:]), flat)

                def minibatch(state, b):
                    params, opt_state = state
                    grads = grad_fn(params, *b, cfg)
                    upd, opt_state = tx.update(grads, opt_state, params)
                    return (optax.apply_updates(params, upd), opt_state), None

                return jax.lax.scan(minibatch, (params, opt_state), mbs)[0], None

            key, k_epochs = jax.random.split(key)
            (params, opt_state), _ = jax.lax.scan(epoch, (params, opt_state),
                                                  jax.random.split(k_epochs, cfg.update_epochs))
            log = jnp.stack([jnp.sum(finished[0]), jnp.sum(finished[1]), om.omega, jnp.mean(traj.value)])
            return (params, opt_state, om, obs, env_state, ep_ret, key), log

        _, logs = jax.lax.scan(update, carry0, None, U)
        return {name: logs[:, i] for i, name in enumerate(LOGS)}

    return run_agent


def make_train(cfg: Config, task: str, num_updates: int | None = None):
    """`train(key, betas, terminal_options, shifts) -> logs`: `run_agent` vmapped
    over `cfg.seeds` seeds (keys folded from `key`, the same for every variant)
    and over V variants (the (V,) arrays), jitted; each log (V, seeds, updates)."""
    run_agent = make_agent(cfg, task, num_updates)
    over = jax.vmap(jax.vmap(run_agent, (0, None, None, None)), (None, 0, 0, 0))

    @jax.jit
    def train(key, betas, terminal_options, shifts):
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(cfg.seeds))
        return over(keys, betas, terminal_options, shifts)

    return train


SETTINGS = {  # variant -> (beta is cfg.beta?, terminal option, shift is c?)
    "plain": (False, False, False),
    "centered": (True, False, False),
    "centered_terminal": (True, True, False),
    "shift": (False, False, True),
}


def variant_arrays(cfg: Config, variants, c: float = 0.0):
    """(betas, terminal_options, shifts) for `variants`, as (V,) arrays."""
    b = [cfg.beta if SETTINGS[v][0] else 0.0 for v in variants]
    t = [SETTINGS[v][1] for v in variants]
    s = [c if SETTINGS[v][2] else 0.0 for v in variants]
    return jnp.asarray(b, jnp.float32), jnp.asarray(t, bool), jnp.asarray(s, jnp.float32)


def train_task(cfg: Config, task: str, train=None) -> tuple[dict, float, float]:
    """Runs the four variants on one task: ({variant: {log: (seeds, updates)}}, c,
    seconds). With `cfg.shift` all four run in one call; otherwise plain, centered
    and centered_terminal first, then the shift control with c = the centered
    agent's final omega (mean over seeds)."""
    t0 = time.perf_counter()
    train = train or make_train(cfg, task)
    key = jax.random.key(cfg.seed)

    def split(logs, variants):
        return {v: {k: np.asarray(x[i]) for k, x in logs.items()} for i, v in enumerate(variants)}

    if cfg.shift is not None:
        c = float(cfg.shift)
        out = split(train(key, *variant_arrays(cfg, VARIANTS, c)), VARIANTS)
    else:
        first = VARIANTS[:3]
        out = split(train(key, *variant_arrays(cfg, first)), first)
        c = float(np.mean(out["centered"]["omega"][:, -1]))
        out.update(split(train(key, *variant_arrays(cfg, ("shift",), c)), ("shift",)))
    return out, c, time.perf_counter() - t0


# ------------------------------------------------------------------- statistics

def _ratio(num, den):
    num, den = np.asarray(num, float), np.asarray(den, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def final_scores(lg: dict, fraction: float) -> np.ndarray:
    """(seeds,) mean return of the episodes finished in the last `fraction` of the
    updates (NaN for a seed that finished none)."""
    U = lg["return_sum"].shape[1]
    tail = max(1, round(fraction * U))
    return _ratio(lg["return_sum"][:, -tail:].sum(1), lg["episodes"][:, -tail:].sum(1))


def curve(lg: dict, points: int) -> tuple[np.ndarray, np.ndarray]:
    """(block ends in updates, (seeds, blocks) mean return of the episodes each seed
    finished in the block; a block with none repeats the previous value)."""
    U = lg["return_sum"].shape[1]
    k = max(1, U // points)
    nb = U // k
    rs = lg["return_sum"][:, :nb * k].reshape(-1, nb, k).sum(2)
    ep = lg["episodes"][:, :nb * k].reshape(-1, nb, k).sum(2)
    c = _ratio(rs, ep)
    for j in range(1, nb):
        c[:, j] = np.where(np.isnan(c[:, j]), c[:, j - 1], c[:, j])
    return (np.arange(nb) + 1) * k, c


def summarise(cfg: Config, results: dict) -> dict:
    """`results`: {task: (logs, c, seconds)} -> a JSON-ready dict."""
    out = {"config": asdict(cfg), "tasks": {}}
    for task, (logs, c, secs) in results.items():
        U = logs["plain"]["return_sum"].shape[1]
        spu = cfg.num_envs * cfg.num_steps
        t = {"timesteps": U * spu, "updates": U, "shift": c, "seconds": secs,
             "final_updates": max(1, round(cfg.final_fraction * U)), "variants": {}}
        for v, lg in logs.items():
            fin = final_scores(lg, cfg.final_fraction)
            m, lo, hi = t_interval(fin[np.isfinite(fin)])
            blocks, cv = curve(lg, cfg.curve_points)
            band = [t_interval(cv[np.isfinite(cv[:, j]), j]) for j in range(cv.shape[1])]
            om = lg["omega"][:, -1]
            t["variants"][v] = {
                "final": {"mean": m, "low": lo, "high": hi, "per_seed": fin.tolist(),
                          "seeds": int(np.isfinite(fin).sum())},
                "final_omega": float(np.mean(om)) if v.startswith("centered") else None,
                "final_omega_ci": list(t_interval(om)[1:]) if v.startswith("centered") else None,
                "final_value_mean": float(np.mean(lg["value"][:, -1])),
                "curve_steps": (blocks * spu).tolist(),
                "curve_mean": [b[0] for b in band], "curve_low": [b[1] for b in band],
                "curve_high": [b[2] for b in band],
                "omega_curve": lg["omega"].mean(0).tolist(),
            }
        out["tasks"][task] = t
    return out


def table(summary: dict) -> list[dict]:
    """One row per task and variant."""
    rows = []
    for task, t in summary["tasks"].items():
        for v, r in t["variants"].items():
            f = r["final"]
            rows.append({"task": task, "variant": v, "final_mean": f["mean"],
                         "ci_half_width": (f["high"] - f["mean"]) if np.isfinite(f["high"]) else float("nan"),
                         "final_omega": r["final_omega"] if r["final_omega"] is not None else "",
                         "shift_c": t["shift"] if v == "shift" else "",
                         "seeds": f["seeds"], "timesteps": t["timesteps"]})
    return rows


def table_md(summary: dict) -> str:
    cfg = summary["config"]
    head = (f"Final return: mean over {cfg['seeds']} seeds of each seed's mean return of the episodes it "
            f"finished in the last {cfg['final_fraction']:.0%} of the updates; ± the 95% Student-t "
            "half-width. omega: the final omega (mean over seeds); c: the shift control's constant.")
    lines = [head, "",
             "| task | steps | plain | centered | centered + termination | shift (c) |",
             "|---|---:|---:|---:|---:|---:|"]
    for task, t in summary["tasks"].items():
        cells = []
        for v in VARIANTS:
            r = t["variants"][v]
            f = r["final"]
            s = f"{f['mean']:.1f} ± {f['high'] - f['mean']:.1f}"
            if r["final_omega"] is not None:
                s += f" (ω {r['final_omega']:.3f})"
            if v == "shift":
                s += f" (c {t['shift']:.3f})"
            cells.append(s)
        lines.append(f"| {task} | {t['timesteps']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- output

COLORS = {"plain": "tab:blue", "centered": "tab:orange", "centered_terminal": "tab:red", "shift": "tab:green"}


def _label(v: str, summary: dict, task: str) -> str:
    b = summary["config"]["beta"]
    return {"plain": "PPO (GAE on r)", "centered": f"centered GAE (β = {b:g})",
            "centered_terminal": f"centered GAE + termination (β = {b:g})",
            "shift": f"GAE on r − c, c = {summary['tasks'][task]['shift']:.3f}"}[v]


def figure(summary: dict):
    """Top row: return vs environment steps per task (mean and 95% t band over
    seeds); bottom row: omega of the two centered variants (mean over seeds)."""
    from bec_jax.prediction.plotting import new_figure

    cfg = summary["config"]
    tasks = list(summary["tasks"])
    fig, axes = new_figure(2, len(tasks), panel=(5.2, 3.6))
    for j, task in enumerate(tasks):
        t = summary["tasks"][task]
        ax, ax_om = axes[0, j], axes[1, j]
        spu = cfg["num_envs"] * cfg["num_steps"]
        for v, r in t["variants"].items():
            x = np.asarray(r["curve_steps"])
            m = np.asarray(r["curve_mean"], float)
            ax.plot(x, m, color=COLORS[v], label=_label(v, summary, task))
            ax.fill_between(x, np.asarray(r["curve_low"], float), np.asarray(r["curve_high"], float),
                            color=COLORS[v], alpha=0.18, linewidth=0)
            if v.startswith("centered"):
                om = np.asarray(r["omega_curve"])
                ax_om.plot((np.arange(om.size) + 1) * spu, om, color=COLORS[v], label=_label(v, summary, task))
        ax_om.axhline(t["shift"], color=COLORS["shift"], ls=":", label=f"shift control's c = {t['shift']:.3f}")
        ax.set_title(f"{task}: return, mean and 95% CI", fontsize=10)
        ax.set_ylabel("episodic return")
        ax_om.set_title(f"{task}: ω (mean over seeds)", fontsize=10)
        ax_om.set_ylabel("ω")
        for a in (ax, ax_om):
            a.set_xlabel("environment steps per agent")
            a.grid(True, alpha=0.3)
            a.legend(fontsize=7)
            a.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    fig.suptitle(f"PPO (purejaxrl defaults), centered GAE: {cfg['seeds']} seeds, "
                 f"ω updated once per rollout", fontsize=10)
    fig.tight_layout()
    return fig


def write(summary: dict, results: dict, out: str) -> list[str]:
    """table.csv, table.md, curves.npz, summary.json and ppo.png/.pdf into `out`."""
    from bec_jax.prediction.plotting import save_figure

    os.makedirs(out, exist_ok=True)
    paths = save_figure(figure(summary), out, "ppo")
    p = {k: os.path.join(out, k) for k in ("table.csv", "table.md", "curves.npz", "summary.json")}
    atomic_write(p["table.csv"], lambda f: f.write(csv_text(table(summary))))
    atomic_write(p["table.md"], lambda f: f.write(table_md(summary)))
    arrays = {f"{task}/{v}/{k}": x for task, (logs, _, _) in results.items()
              for v, lg in logs.items() for k, x in lg.items()}
    atomic_write(p["curves.npz"], lambda f: np.savez_compressed(f, **arrays), binary=True)
    write_json(p["summary.json"], summary)
    return paths + list(p.values())


def _settings(cfg: Config) -> str:
    """The config but its task list, as the JSON a saved task result is keyed by."""
    return json.dumps({k: v for k, v in asdict(cfg).items() if k != "tasks"}, sort_keys=True, default=str)


def _task_file(out: str, task: str) -> str:
    return os.path.join(out, f"logs_{task}.npz")


def save_task(out: str, cfg: Config, task: str, result: tuple) -> None:
    """One task's (logs, c, seconds) into `out`/logs_<task>.npz, with the settings
    that produced it (everything in the config except the task list)."""
    logs, c, secs = result
    arrays = {f"{v}/{k}": x for v, lg in logs.items() for k, x in lg.items()}
    meta = _settings(cfg)
    atomic_write(_task_file(out, task), lambda f: np.savez_compressed(
        f, meta=np.asarray(meta), c=np.asarray(c), seconds=np.asarray(secs), **arrays), binary=True)


def load_task(out: str, cfg: Config, task: str) -> tuple | None:
    """A task's saved (logs, c, seconds) when it was run with the same settings."""
    path = _task_file(out, task)
    if not os.path.exists(path):
        return None
    with np.load(path) as z:
        if str(z["meta"]) != _settings(cfg):
            return None
        logs: dict = {}
        for name in z.files:
            if "/" in name:
                v, k = name.split("/")
                logs.setdefault(v, {})[k] = z[name]
        return logs, float(z["c"]), float(z["seconds"])


def run(cfg: Config, log=print, out: str | None = None) -> tuple[dict, dict]:
    """All tasks: (summary, {task: (logs, c, seconds)}). With `out`, each finished
    task is saved there and a rerun with the same settings reuses it (a resume)."""
    results = {}
    t0 = time.perf_counter()
    for task in cfg.tasks:
        saved = load_task(out, cfg, task) if out else None
        if saved is not None:
            results[task] = saved
            log(f"{task}: reused {_task_file(out, task)} ({saved[2]:.1f} s when run)")
            continue
        results[task] = train_task(cfg, task)
        watchdog.beat()  # a task's one program may leave the host idle for long on a GPU
        if out:
            os.makedirs(out, exist_ok=True)
            save_task(out, cfg, task, results[task])
        log(f"{task}: {results[task][2]:.1f} s, c = {results[task][1]:.4f}")
    summary = summarise(cfg, results)
    summary["seconds"] = time.perf_counter() - t0
    summary["task_seconds_total"] = sum(r[2] for r in results.values())
    summary["machine"] = {"devices": [str(d) for d in jax.devices()], "cpus": os.cpu_count()}
    return summary, results


def _stall_timeout(text: str) -> float:
    try:
        return watchdog.parse_timeout(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/ppo", help="output directory")
    p.add_argument("--small", action="store_true", help="the few-second smoke configuration")
    p.add_argument("--tasks", default=None, help=f"comma-separated gymnax ids (default {','.join(TASKS)})")
    p.add_argument("--seeds", type=int, default=None, help="seeds per variant (default 16)")
    p.add_argument("--timesteps", type=int, default=None,
                   help="environment steps per agent, every task (default: per task, "
                        + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_TIMESTEPS.items()) + ")")
    p.add_argument("--beta", type=float, default=None, help="omega's step size per rollout (default 0.1)")
    p.add_argument("--shift", type=float, default=None,
                   help="the control's c for every task (default: the centered agent's final mean omega)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stall-timeout", type=_stall_timeout, default=None, metavar="SECONDS",
                   help="exit with status 75 and the thread stacks in OUT/stall-PID.txt after this long without "
                        "CPU progress (a deadlock); 0: off (default: $BEC_JAX_STALL_TIMEOUT, else 120 on a CPU, "
                        "off on a GPU)")
    a = p.parse_args(argv)
    cfg = small_config() if a.small else Config()
    over = {k: getattr(a, k) for k in ("seeds", "timesteps", "beta", "shift", "seed") if getattr(a, k) is not None}
    if a.tasks:
        over["tasks"] = tuple(s.strip() for s in a.tasks.split(",") if s.strip())
    cfg = replace(cfg, **over)
    hint = "to continue: run the same command again (finished tasks are reused)"
    with watchdog.Watchdog(watchdog.timeout_for(a.stall_timeout), a.out, hint, prog="bec_jax.experiments.ppo"):
        summary, results = run(cfg, out=a.out)
        paths = write(summary, results, a.out)
    print(table_md(summary))
    print(f"wall time {summary['seconds']:.1f} s (tasks' own run times {summary['task_seconds_total']:.1f} s)")
    print("wrote " + ", ".join(paths))


if __name__ == "__main__":
    main()
