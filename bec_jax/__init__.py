"""bec_jax: batched simulation of Bellman error centering (TD, TDC, CTD, CTDC, SRC, VRC).

Data flows one way: model (`mdp`, `envs`) -> sampler (`prediction.sampling`)
-> update (`algorithms`) -> metric (`theory.metrics`) -> result
(`prediction.sweep`, `prediction.results`) -> plot. The map of the house is in
docs/where-to-add.md; `bec_jax.moved` lists where the 0.3 modules went.
"""
import importlib as _importlib

__version__ = "0.3.0"


def __getattr__(name: str):
    # `from bec_jax import sweep` (a 0.3 path) finds the moved module, warning once.
    if name.startswith("_") or name == "moved":
        raise AttributeError(f"module 'bec_jax' has no attribute {name!r}")
    if f"bec_jax.{name}" in _importlib.import_module("bec_jax.moved").MOVED:
        return _importlib.import_module(f"bec_jax.{name}")
    raise AttributeError(f"module 'bec_jax' has no attribute {name!r}")


_importlib.import_module("bec_jax.moved").install()
