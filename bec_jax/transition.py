"""The transition record that flows from samplers to update functions."""
from typing import NamedTuple

import jax


class Transition(NamedTuple):
    """One transition, as feature vectors, so updates never need the environment.

    Attributes:
      phi: (k,) features of s.
      reward: () reward r = R(s, a, s').
      discount: () gamma (0 would mark a terminal transition).
      phi_next: (k,) features of s'.
      rho: () importance ratio pi(a|s) / mu(a|s) (1 on-policy).
    """

    phi: jax.Array
    reward: jax.Array
    discount: jax.Array
    phi_next: jax.Array
    rho: jax.Array
