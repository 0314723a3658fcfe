"""The paper's environments and a registry: `make(name, **kwargs)`."""
from typing import Callable

from bec_jax.envs.baird import baird
from bec_jax.envs.boyan_chain import boyan_chain
from bec_jax.envs.two_state import two_state
from bec_jax.mdp import FiniteMDP

REGISTRY: dict[str, Callable[..., FiniteMDP]] = {
    "boyan_chain": boyan_chain,
    "two_state": two_state,
    "baird": baird,
}


def names() -> list[str]:
    """The registered environment names, sorted."""
    return sorted(REGISTRY)


def make(name: str, **kwargs) -> FiniteMDP:
    """Builds a registered environment; keyword arguments go to its constructor.

    Raises `ValueError` listing the known names for an unknown one.
    """
    if name not in REGISTRY:
        raise ValueError(f"env: unknown environment {name!r}; known: {', '.join(names())}")
    return REGISTRY[name](**kwargs)


__all__ = ["make", "names", "REGISTRY", "boyan_chain", "two_state", "baird"]
