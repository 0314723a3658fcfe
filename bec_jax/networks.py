"""Fully connected networks in plain JAX: `mlp_init` and `mlp_apply`, written
for one example (an observation vector, or a batch of them along the leading
axis); callers vmap over runs.

A network is a tuple of `Dense(w (in, out), b (out,))` layers, the activation
after every layer but the last (a linear output), as Naik et al.'s deep agents
build theirs (`build_fc_net_tanh` in abhisheknaik96/continuing-rl-exps,
`agents/control_agents_deep.py`, commit de89d49: tanh between layers, none after
the last). Layer sizes are given whole, `(inputs, hidden..., outputs)`, their
`layer_sizes`.

The initialisation is PyTorch's default for `nn.Linear` (its
`reset_parameters`: Kaiming-uniform with a = sqrt(5) for the weights, which is
U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the biases), so a
network here starts from the distribution theirs does, drawn from a JAX key.

Every product is at `Precision.HIGHEST`: float32 on every backend (a GPU's
default for a float32 matmul is TF32, with about 1e-3 relative error), so a run
on a GPU computes what the CPU does up to float32 rounding (tests/test_lowering.py
checks every dot of the programs).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu}


class Dense(NamedTuple):
    """One fully connected layer: x @ w + b."""

    w: jax.Array
    b: jax.Array


def mlp_init(key: jax.Array, layers: Sequence[int], dtype=jnp.float32) -> tuple[Dense, ...]:
    """The layers of a network of sizes `layers` = (inputs, hidden..., outputs),
    drawn as PyTorch's `nn.Linear` draws them: w and b uniform in
    +-1/sqrt(fan_in) (module docstring)."""
    sizes = tuple(int(n) for n in layers)
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"layers: at least an input and an output size, each >= 1, got {list(layers)}")
    out = []
    for k, (n_in, n_out) in zip(jax.random.split(key, len(sizes) - 1), zip(sizes[:-1], sizes[1:])):
        kw, kb = jax.random.split(k)
        bound = 1.0 / math.sqrt(n_in)
        out.append(Dense(w=jax.random.uniform(kw, (n_in, n_out), dtype, -bound, bound),
                         b=jax.random.uniform(kb, (n_out,), dtype, -bound, bound)))
    return tuple(out)


def mlp_apply(params: Sequence[Dense], x: jax.Array, activation: str = "tanh") -> jax.Array:
    """The network's outputs for `x` (..., inputs): the activation after every
    layer but the last."""
    act = ACTIVATIONS[activation]
    h = x
    for i, layer in enumerate(params):
        h = jnp.matmul(h, layer.w, precision=jax.lax.Precision.HIGHEST)
        h = h + layer.b.reshape((1,) * (h.ndim - 1) + layer.b.shape)  # explicit: no implicit rank promotion
        if i < len(params) - 1:
            h = act(h)
    return h


def num_params(layers: Sequence[int]) -> int:
    """The number of weights and biases of a network of sizes `layers`."""
    sizes = [int(n) for n in layers]
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


def flops(layers: Sequence[int], rows: int) -> int:
    """Floating-point operations of one forward pass over `rows` inputs: two per
    multiply-add of the products (the biases and activations, O(rows * units),
    are left out: they are not matmul work)."""
    sizes = [int(n) for n in layers]
    return 2 * int(rows) * sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))


def max_abs(params) -> jax.Array:
    """The largest |weight| of a network (NaN if any weight is NaN): a run's
    blow-up shows here, as `max_abs_w` shows a linear learner's."""
    leaves = jax.tree_util.tree_leaves(params)
    return jnp.max(jnp.stack([jnp.max(jnp.abs(a)) for a in leaves]))


__all__ = ["ACTIVATIONS", "Dense", "flops", "max_abs", "mlp_apply", "mlp_init", "num_params"]
