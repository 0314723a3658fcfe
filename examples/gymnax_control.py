"""A gymnax control task: Q-learning against centered Q-learning (CQ) on CartPole.

    python examples/gymnax_control.py        (needs the control extra: pip install 'bec_jax[control]')

Any gymnax environment with discrete actions is a task by name, `gymnax:ENV_ID`;
its features are a feature map given as task parameters (here a Fourier basis of
order 2 on the box [-3, 3] in every dimension, one weight block per action).
Each algorithm's grid points and seeds run in one compiled program; CQ is the
paper's CTD with a greedy target, w += alpha (delta - omega) phi, omega += beta (delta - omega).
CartPole pays +1 a step, so a learner that learns is one whose episodes grow long.
"""
from bec_jax.control import sweep
from bec_jax.control.spec import ControlSpec

TASK = dict(task="gymnax:CartPole-v1", task_params={"features": "fourier", "order": 2, "low": -3, "high": 3})


def main(episodes=40, seeds=4):
    """Runs Q and CQ; prints and returns {algorithm: (result, summary records)}."""
    specs = [ControlSpec(algorithm="q", hyperparameters={"alpha": [0.005, 0.02]}, **TASK,
                         episodes=episodes, seeds=seeds, epsilon=0.1),
             ControlSpec(algorithm="cq", hyperparameters={"alpha": [0.005, 0.02], "beta": 0.01}, **TASK,
                         episodes=episodes, seeds=seeds, epsilon=0.1)]
    out = {}
    for spec in specs:
        result = sweep.run(spec, progress=False)
        out[spec.algorithm] = (result, result.summary())
        for rec in out[spec.algorithm][1]:
            print(f"{spec.algorithm:>3} alpha={rec['alpha']:<6g} return per episode {rec['auc_return']:7.1f} "
                  f"[{rec['auc_return_ci_low']:.1f}, {rec['auc_return_ci_high']:.1f}] (95% CI over {seeds} seeds), "
                  f"last 10% of episodes {rec['final_return']:7.1f}"
                  + (f", omega {rec['omega_mean']:.3f}" if "omega_mean" in rec else ""))
    return out


if __name__ == "__main__":
    main()
