"""bec_jax: batched simulation of Bellman error centering (TD, TDC, CTD, CTDC, SRC, VRC).

Data flows one way: model (`mdp`, `envs`) -> sampler (`sampling`) -> update
(`algorithms`) -> metric (`analysis`) -> result (`sweep`, `results`) -> plot.
"""
__version__ = "0.3.0"
