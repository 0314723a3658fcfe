"""Control with linear action values: centered Q-learning and Greedy-GQ, run as
one compiled program over seeds and hyperparameter grids.

Modules, in the order data flows: `transition` (the record updates consume:
sparse features as active indices or dense feature vectors), `algorithms` (Q,
CQ, GQ, CGQ, the authors' GQ/CGQ forms, reward-centered Q: pure init/update
pairs on one example, written once for both kinds of features), `tiles` (a JAX
tile coder), `features` (feature maps of observations: tile coding, Fourier,
RBF), `tasks` (CliffWalking, the authors' Maze, MountainCar, Acrobot, any gymnax
environment as `gymnax:ENV_ID`, or one's own: pure environments), `loop`
(epsilon-greedy behaviour, auto reset, episode buffers: one run), `spec` (`ControlSpec`, validated), `sweep` (the
one-program sweep, chunked and resumable through `bec_jax.run.runner`), `results`
(`ControlResult`: curves, best setting, summary, files) and `plotting`.
`algorithms` imports nothing from `tasks` or `features`.
"""
