"""Continuing control: tasks with no episodes, runs measured in steps.

A continuing task is reset once per run and stepped forever; its learners are
scored by the reward rate (reward per step), and a tabular task's exact model
gives the optimal average reward to measure against (issue 46). Modules:

  env       the task contract (`ContinuingEnv`) and its shared checks
  tabular   Naik et al.'s TwoChoice and RiverSwim, csuite's Access-Control,
            each with its exact model (P, R)
  exact     average reward of a policy, optimal gain, policy and differential
            values of a tabular model (numpy float64)
  csuite    csuite's Catch family, Pendulum and Taxi in JAX
  puckworld Naik et al.'s PuckWorld (their csuite fork)
  tasks     the registry: make, names, register, factory
  learners  the continuing learners (Q-learning, reward centering,
            differential and RVI Q-learning, ...), the network ones included
  deep      the network learners (DQN, centered DQN): settings, state, update
  spec, program, sweep, results, plotting
            the front: a run's spec, its one compiled program, the sweep,
            saved results and figures
"""
