"""Bellman error centering inside JAX agents: rlax-style functions written for one example."""
