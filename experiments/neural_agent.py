"""A worked agent: a small MLP value function trained with centered TD against TD.

    python -m experiments.neural_agent --out DIR

Setting: the Boyan chain (13 states, on-policy, gamma 0.9) with one-hot state
observations, so nothing about the chain's structure is built into the input. The
value function is a pure-JAX tanh MLP (params a list of (W, b) pairs, initialised
by hand) optimised with optax (Adam by default; `--optimizer sgd` for plain SGD).
Each update uses a batch of transitions, one from each of `batch` parallel Markov
trajectories of `bec_jax.prediction.sampling`, and the loss
`bec_jax.agents.value_learning.batch_centered_td_loss`. Centered TD (CTD) updates omega with
`value_learning.omega_update`; plain TD is the same program with omega held at 0
(beta = 0), so both see the same initial weights and the same transitions (common
random numbers). Seeds, methods and a small learning-rate grid are vmapped: the
whole experiment is one jitted program.

Errors are exact, from the model (v_pi = (I - gamma P_pi)^-1 r_pi, d = d_mu):
  * centered value error ||C(v_hat - v_pi)||_d, C x = x - (d^T x) 1: the value
    error up to a constant, which is what centering targets (CTD leaves the
    d-weighted mean of v_hat free);
  * RMSVE ||v_hat - v_pi||_d. For CTD also of v_hat + omega / (1 - gamma): on-policy
    omega tracks E_d[delta] = d^T (r + gamma P v_hat - v_hat), which equals
    (1 - gamma)(d^T v_pi - d^T v_hat) because d^T P = d^T, so omega / (1 - gamma)
    restores the missing constant (on-policy only; Boyan is on-policy);
  * RMSCBE ||C(r + gamma P v_hat - v_hat)||_d, the centered Bellman error.

Each method's learning rate is chosen from the grid by the lowest area under its
centered-value-error curve (the field's convention), and the table of all grid
points is printed too.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bec_jax import envs, mdp
from bec_jax.agents import value_learning
from bec_jax.prediction import sampling

METHODS = ("td", "ctd")
METRICS = ("centered_value_error", "rmsve", "rmsve_offset_corrected", "rmscbe")
OPTIMIZERS = {"adam": optax.adam, "sgd": optax.sgd}


@dataclass(frozen=True)
class Config:
    """The experiment. `optimizer` is "adam" or "sgd" (optax), `lrs` its
    learning-rate grid; `beta` is CTD's omega step size (TD uses 0)."""

    env: str = "boyan_chain"
    hidden: tuple = (32, 32)
    steps: int = 6_000
    log_every: int = 50
    batch: int = 8
    seeds: int = 20
    lrs: tuple = (3e-4, 1e-3, 3e-3, 1e-2)
    beta: float = 0.01
    optimizer: str = "adam"
    seed: int = 0


def small_config() -> Config:
    """A few-second configuration for tests and smoke runs (not evidence)."""
    return Config(hidden=(16,), steps=600, log_every=200, batch=4, seeds=2, lrs=(3e-3,))


# ------------------------------------------------------------------- the network

def init_mlp(key: jax.Array, sizes: tuple) -> list:
    """[(W, b), ...] for layer sizes `sizes`: LeCun-normal weights, zero biases."""
    keys = jax.random.split(key, len(sizes) - 1)
    return [(jax.random.normal(k, (m, n), jnp.float32) / np.sqrt(m), jnp.zeros((n,), jnp.float32))
            for k, m, n in zip(keys, sizes[:-1], sizes[1:])]


def mlp_value(params: list, x: jax.Array) -> jax.Array:
    """v(params, x): a tanh MLP with a linear scalar output, for one observation."""
    h = x
    for W, b in params[:-1]:
        h = jnp.tanh(h @ W + b)
    W, b = params[-1]
    return (h @ W + b)[0]


# --------------------------------------------------------------------- the model

def onehot_env(name: str):
    """The registered environment with one-hot state features (observations)."""
    env = envs.make(name)
    return env._replace(phi=np.eye(env.num_states), theta0=np.zeros(env.num_states))


class ExactModel:
    """v_pi, d_mu, P_pi, r_pi, gamma of an environment, in float32 for the program."""

    def __init__(self, env):
        S = env.num_states
        P, r, self.gamma = mdp.P_pi(env), mdp.r_pi(env), float(env.gamma)
        v = np.linalg.solve(np.eye(S) - self.gamma * P, r)
        self.on_policy = mdp.is_on_policy(env)
        self.obs = jnp.asarray(env.phi, jnp.float32)
        self.P, self.r, self.d, self.v_pi = (jnp.asarray(a, jnp.float32)
                                             for a in (P, r, mdp.d_mu(env), v))

    def errors(self, params, omega) -> jax.Array:
        """(4,) exact errors of `METRICS` for one network and its omega."""
        d = self.d
        v = jax.vmap(mlp_value, (None, 0))(params, self.obs)
        e = v - self.v_pi
        db = self.r + self.gamma * (self.P @ v) - v

        def centered(x):
            c = x - d @ x
            return jnp.sqrt(d @ (c * c))

        e_corr = e + omega / (1.0 - self.gamma)
        # The offset identity needs d stationary for P_pi: off-policy it reports NaN.
        corrected = jnp.sqrt(d @ (e_corr * e_corr)) if self.on_policy else jnp.float32(jnp.nan)
        return jnp.stack([centered(e), jnp.sqrt(d @ (e * e)), corrected, centered(db)])


# ------------------------------------------------------------------- the program

def make_train(cfg: Config):
    """Python-side setup; returns `train(key) -> (lrs, methods, seeds, logs + 1, 4)`
    errors, one jitted program (vmap over lr grid, methods and seeds)."""
    env = onehot_env(cfg.env)
    model = ExactModel(env)
    sampler = sampling.make_sampler(env, "markov")
    sizes = (env.num_states,) + tuple(cfg.hidden) + (1,)
    if cfg.optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer: unknown optimizer {cfg.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    make_opt = OPTIMIZERS[cfg.optimizer]
    K, L, B = cfg.log_every, cfg.steps // cfg.log_every, cfg.batch

    def run_one(key, lr, beta):
        opt = make_opt(lr)
        k_init, k_env, k_run = jax.random.split(key, 3)
        params = init_mlp(k_init, sizes)
        carry = (params, opt.init(params), value_learning.omega_init(),
                 jax.vmap(sampler.init)(jax.random.split(k_env, B)))

        def step(carry, t):
            params, opt_state, om, samp = carry
            # fold_in(t): one key per step without a split chain in the carry.
            tr, samp = jax.vmap(sampler.step)(jax.random.split(jax.random.fold_in(k_run, t), B), samp)
            grads, deltas = jax.grad(value_learning.batch_centered_td_loss, argnums=1, has_aux=True)(
                mlp_value, params, om.omega, *tr)
            updates, opt_state = opt.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            om = value_learning.omega_update(om, deltas, tr.rho, beta)  # beta = 0: omega stays 0 (TD)
            return (params, opt_state, om, samp), None

        def block(carry, j):
            carry, _ = jax.lax.scan(step, carry, j * K + jnp.arange(K))
            return carry, model.errors(carry[0], carry[2].omega)

        first = model.errors(params, carry[2].omega)
        _, logs = jax.lax.scan(block, carry, jnp.arange(L))
        return jnp.concatenate([first[None], logs])

    betas = jnp.asarray([0.0 if m == "td" else cfg.beta for m in METHODS], jnp.float32)
    lrs = jnp.asarray(cfg.lrs, jnp.float32)
    # seeds innermost and keys shared: every (lr, method) sees the same seeds.
    over_seeds = jax.vmap(run_one, (0, None, None))
    over_methods = jax.vmap(over_seeds, (None, None, 0))
    over_lrs = jax.vmap(over_methods, (None, 0, None))

    @jax.jit
    def train(key):
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(cfg.seeds))
        return over_lrs(keys, lrs, betas)

    return train


def summarise(cfg: Config, curves: np.ndarray) -> dict:
    """Per method: the learning rate with the lowest area under the mean centered
    value error curve, its final errors (mean, std over seeds) and the whole grid."""
    out = {"config": asdict(cfg), "methods": {}}
    steps = (np.arange(curves.shape[3]) * cfg.log_every).tolist()
    for mi, m in enumerate(METHODS):
        auc = curves[:, mi, :, :, 0].mean(axis=(1, 2))  # (lrs,)
        best = int(np.nanargmin(auc))
        sel = curves[best, mi]  # (seeds, logs, metrics)
        out["methods"][m] = {
            "lr": cfg.lrs[best],
            "final_mean": dict(zip(METRICS, sel[:, -1].mean(0).tolist())),
            "final_std": dict(zip(METRICS, sel[:, -1].std(0).tolist())),
            "initial_mean": dict(zip(METRICS, sel[:, 0].mean(0).tolist())),
            "curve_mean": sel.mean(0).tolist(),
            "curve_std": sel.std(0).tolist(),
            "grid": [{"lr": lr, "auc_centered_value_error": float(auc[i]),
                      "final_mean": dict(zip(METRICS, curves[i, mi, :, -1].mean(0).tolist()))}
                     for i, lr in enumerate(cfg.lrs)],
        }
    out["steps"] = steps
    return out


def run(cfg: Config) -> dict:
    """Runs the experiment and returns `summarise`'s dict."""
    curves = np.asarray(make_train(cfg)(jax.random.key(cfg.seed)))
    return summarise(cfg, curves)


# ---------------------------------------------------------------------- output

def plot(summary: dict, path: str) -> None:
    """Mean and std band over seeds, both methods, one panel per error."""
    from matplotlib.figure import (
        Figure,  # no pyplot: the caller's backend is left alone
    )

    cfg = summary["config"]
    x = np.asarray(summary["steps"])
    colors = {"td": "tab:blue", "ctd": "tab:orange"}
    label = {"td": "TD", "ctd": "centered TD"}
    panels = [("centered value error  ||C(v̂ − v_π)||_d", [(0, "")]),
              ("RMSVE  ||v̂ − v_π||_d", [(1, ""), (2, "offset")]),
              ("RMSCBE  ||C(r + γPv̂ − v̂)||_d", [(3, "")])]
    fig = Figure(figsize=(15, 4.4))
    axes = fig.subplots(1, 3)
    for ax, (title, series) in zip(axes, panels):
        for m, res in summary["methods"].items():
            mean, std = np.asarray(res["curve_mean"]), np.asarray(res["curve_std"])
            for j, kind in series:
                if kind == "offset" and m == "td":
                    continue  # TD's omega is 0: the corrected curve is the same line
                name = f"{label[m]} (lr {res['lr']:g})"
                if kind == "offset":
                    name = f"{label[m]}: v̂ + ω/(1−γ)"
                ls = "--" if kind == "offset" else "-"
                ax.plot(x, mean[:, j], ls, color=colors[m], label=name)
                ax.fill_between(x, np.maximum(mean[:, j] - std[:, j], 1e-6), mean[:, j] + std[:, j],
                                color=colors[m], alpha=0.2, linewidth=0)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("updates (batches of %d transitions)" % cfg["batch"])
        ax.set_ylabel("error (d_μ-weighted RMS)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"MLP {list(cfg['hidden'])} (tanh, {cfg['optimizer']}) on {cfg['env']} with one-hot states: "
                 f"mean ± std over {cfg['seeds']} seeds; lr per method by lowest area under "
                 f"the centered value error; CTD β = {cfg['beta']:g}", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)


def report(summary: dict) -> str:
    """The final errors as text: mean ± std over seeds, and the learning-rate grid."""
    lines = []
    for m, res in summary["methods"].items():
        fm, fs = res["final_mean"], res["final_std"]
        shown = [k for k in METRICS if not (m == "td" and k == "rmsve_offset_corrected")]
        lines.append(f"{m:>4} (lr {res['lr']:g}): "
                     + ", ".join(f"{k} {fm[k]:.4f} ± {fs[k]:.4f}" for k in shown))
    lines.append("grid (final mean centered value error / area under its curve):")
    for m, res in summary["methods"].items():
        lines.append(f"{m:>4}: " + "; ".join(
            f"lr {g['lr']:g}: {g['final_mean']['centered_value_error']:.4f} / "
            f"{g['auc_centered_value_error']:.4f}" for g in res["grid"]))
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for neural_agent.png and .json")
    p.add_argument("--docs", default="docs/neural_agent.png",
                   help="also save the figure here (empty string: do not)")
    p.add_argument("--small", action="store_true", help="the few-second smoke configuration")
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default=None)
    p.add_argument("--lrs", default=None, help="comma-separated learning-rate grid")
    a = p.parse_args(argv)
    cfg = small_config() if a.small else Config()
    lrs = tuple(float(v) for v in a.lrs.split(",")) if a.lrs else None
    cfg = replace(cfg, **{k: v for k, v in (("seeds", a.seeds), ("steps", a.steps),
                                            ("optimizer", a.optimizer), ("lrs", lrs)) if v is not None})
    summary = run(cfg)
    os.makedirs(a.out, exist_ok=True)
    fig = os.path.join(a.out, "neural_agent.png")
    plot(summary, fig)
    if a.docs:
        plot(summary, a.docs)
    with open(os.path.join(a.out, "neural_agent.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(report(summary))
    print(f"figure: {fig}" + (f" and {a.docs}" if a.docs else ""))


if __name__ == "__main__":
    main()
