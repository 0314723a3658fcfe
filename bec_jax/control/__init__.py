"""Control with linear action values: centered Q-learning and Greedy-GQ, run as
one compiled program over seeds and hyperparameter grids.

Modules: `transition` (the record updates consume), `algorithms` (Q, CQ, GQ,
CGQ, reward-centered Q: pure init/update pairs), `tiles` (a JAX tile coder),
`tasks` (CliffWalking, the authors' Maze, MountainCar, Acrobot as pure
environments), `loop` (epsilon-greedy behaviour, auto reset, episode buffers),
`sweep` (the one-program sweep, chunked and resumable).
"""
