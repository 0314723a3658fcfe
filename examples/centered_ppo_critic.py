"""A centered PPO critic in purejaxrl's layout (`make_train(cfg)` -> `train(rng)`, one jit).

    python examples/centered_ppo_critic.py   (needs gymnax: pip install 'bec_jax[control]')

What centering changes in purejaxrl's PPO is marked "# centering". Networks and loss:
experiments/ppo.py's (purejaxrl's).
"""
import jax
import jax.numpy as jnp
import optax

from bec_jax.agents import value_learning
from bec_jax.agents.targets import centered_truncated_generalized_advantage_estimation
from bec_jax.experiments.ppo import Config, init_params, mlp, ppo_loss, value


def make_train(cfg: Config, beta: float, num_updates: int):
    """purejaxrl's `make_train`: PPO on gymnax CartPole-v1 with a centered critic."""
    import gymnax
    env, env_params = gymnax.make("CartPole-v1")
    N, T, mb = cfg.num_envs, cfg.num_steps, cfg.num_envs * cfg.num_steps // cfg.num_minibatches
    tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.lr, eps=1e-5))

    def _env_step(runner_state, _):
        params, opt_state, omega, env_state, obs, ep_ret, rng = runner_state
        rng, k_act, k_step = jax.random.split(rng, 3)
        logits = mlp(params.actor, obs)
        action = jax.random.categorical(k_act, logits)
        log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], 1)[:, 0]
        obs2, env_state, reward, term, trunc, info = jax.vmap(env.step, (0, 0, 0, None))(
            jax.random.split(k_step, N), env_state, action, env_params)
        done, ep_ret, trunc = term | trunc, ep_ret + reward, trunc & ~term
        # A time-limit truncation bootstraps from the final observation, not the reset one.
        reward += jnp.where(trunc, cfg.gamma * (value(params, info["final_observation"]) - value(params, obs2)), 0)
        traj = (obs, action, log_prob, value(params, obs), reward, term, trunc)
        log = (jnp.sum(jnp.where(done, ep_ret, 0.0)), jnp.sum(done))
        return (params, opt_state, omega, env_state, obs2, jnp.where(done, 0.0, ep_ret), rng), (traj, log)

    def _update_minibatch(state, b):
        updates, opt_state = tx.update(jax.grad(ppo_loss)(state[0], *b, cfg), state[1], state[0])
        return (optax.apply_updates(state[0], updates), opt_state), None

    def _update_step(runner_state, _):
        runner_state, (traj, (ret_sum, episodes)) = jax.lax.scan(_env_step, runner_state, None, T)
        params, opt_state, omega, env_state, obs, ep_ret, rng = runner_state
        t_obs, action, log_prob, v, reward, term, trunc = traj
        values = jnp.concatenate([v, value(params, obs)[None]])  # (T + 1, N)
        discount, lam = jnp.where(term, 0.0, cfg.gamma), jnp.where(trunc, 0.0, cfg.gae_lambda)
        # centering: the centered GAE (TD errors delta - omega) per environment copy (axis 1).
        gae = jax.vmap(lambda *x: centered_truncated_generalized_advantage_estimation(*x, omega.omega),
                       (1, 1, 1, 1), 1)(reward, discount, lam, values)
        # centering: omega once per rollout, towards the mean of every uncentered TD error.
        omega = value_learning.omega_update(omega, jnp.ravel(gae.td_errors), 1.0, beta)
        batch = jax.tree.map(lambda x: x.reshape((N * T,) + x.shape[2:]),
                             (t_obs, action, log_prob, v, gae.advantages, v + gae.advantages))

        def _update_epoch(state, key):
            perm = jax.random.permutation(key, N * T)
            mbs = jax.tree.map(lambda x: x[perm].reshape((cfg.num_minibatches, mb) + x.shape[1:]), batch)
            return jax.lax.scan(_update_minibatch, state, mbs)[0], None

        rng, k = jax.random.split(rng)
        (params, opt_state), _ = jax.lax.scan(_update_epoch, (params, opt_state),
                                              jax.random.split(k, cfg.update_epochs))
        return (params, opt_state, omega, env_state, obs, ep_ret, rng), {
            "return": ret_sum.sum() / jnp.maximum(episodes.sum(), 1), "episodes": episodes.sum(),
            "omega": omega.omega, "mean_td_error": gae.td_errors.mean()}

    def train(rng):
        rng, k_init, k_env = jax.random.split(rng, 3)
        params = init_params(k_init, 4, 2, cfg.hidden)
        obs, env_state = jax.vmap(env.reset, (0, None))(jax.random.split(k_env, N), env_params)
        runner_state = (params, tx.init(params), value_learning.omega_init(), env_state, obs, jnp.zeros(N), rng)
        return jax.lax.scan(_update_step, runner_state, None, num_updates)[1]
    return train


def main(beta=0.1, num_updates=30, seed=0):
    """A tiny run (4 envs x 64 steps, 30 updates); prints and returns the per-update metrics."""
    cfg = Config(num_envs=4, num_steps=64, update_epochs=2, num_minibatches=2, hidden=(32, 32))
    metrics = jax.jit(make_train(cfg, beta, num_updates))(jax.random.key(seed))
    for u in range(0, num_updates, max(1, num_updates // 6)):
        print(f"update {u:3d}: mean return {float(metrics['return'][u]):6.1f} over "
              f"{int(metrics['episodes'][u]):3d} episodes, omega {float(metrics['omega'][u]):.4f}")
    return metrics


if __name__ == "__main__":
    main()
