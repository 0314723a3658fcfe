"""Linear policy-evaluation updates as pure `init`/`update` pairs on one example.

Batch them with `jax.vmap`. Each module cites the paper's equation it implements:
`td`, `tdc`, `ctd`, `ctdc`, `src`, `vrc`, and centered TD(lambda) `ctd_lambda` (an
extension the paper lists as future work). `get(name)` returns the uniform
`Algorithm` descriptor the sweep engine drives. This package imports nothing from
`bec_jax.envs`.
"""
from bec_jax.algorithms import ctd, ctd_lambda, ctdc, src, td, tdc, vrc
from bec_jax.algorithms.base import Algorithm, StepSize, StepSizes, resolve, td_error

REGISTRY: dict[str, Algorithm] = {
    "td": Algorithm("td", td.init, lambda s, tr, h: td.update(s, tr, h.alpha),
                    ("alpha",), ("theta",), "td(0)theta (rho on theta off-policy)"),
    "tdc": Algorithm("tdc", tdc.init, lambda s, tr, h: tdc.update(s, tr, h.alpha, h.zeta),
                     ("alpha", "zeta"), ("theta", "u"), "thetavmtdc, uvmtdc with omega = 0"),
    "ctd": Algorithm("ctd", ctd.init, lambda s, tr, h: ctd.update(s, tr, h.alpha, h.beta),
                     ("alpha", "beta"), ("theta", "omega"), "omegawithrho, thetawithrho"),
    "ctdc": Algorithm("ctdc", ctdc.init,
                      lambda s, tr, h: ctdc.update(s, tr, h.alpha, h.beta, h.zeta),
                      ("alpha", "beta", "zeta"), ("theta", "u", "omega"),
                      "thetavmtdc, uvmtdc, omegavmtdc (rho on all three)"),
    "ctdc_literal": Algorithm("ctdc_literal", ctdc.init,
                              lambda s, tr, h: ctdc.update(s, tr, h.alpha, h.beta, h.zeta,
                                                           rho_on_omega=False),
                              ("alpha", "beta", "zeta"), ("theta", "u", "omega"),
                              "thetavmtdc, uvmtdc, omegavmtdc (no rho on omega)"),
    "src": Algorithm("src", src.init, lambda s, tr, h: src.update(s, tr, h.alpha, h.beta),
                     ("alpha", "beta"), ("theta", "rbar"), "src1-src3"),
    "vrc": Algorithm("vrc", vrc.init, lambda s, tr, h: vrc.update(s, tr, h.alpha, h.beta),
                     ("alpha", "beta"), ("theta", "rbar"), "rewardcentering1-2"),
    # lambda is static (not on the step-size grid): ctd_lambda.make(lam) for other values.
    "ctd_lambda": ctd_lambda.make(ctd_lambda.DEFAULT_LAMBDA),
}


def names() -> list[str]:
    """The registered algorithm names."""
    return list(REGISTRY)


def get(name: str) -> Algorithm:
    """The `Algorithm` descriptor for `name`; `ValueError` lists the known names."""
    if name not in REGISTRY:
        raise ValueError(f"algorithm: unknown algorithm {name!r}; known: {', '.join(names())}")
    return REGISTRY[name]


__all__ = ["Algorithm", "StepSize", "StepSizes", "get", "names", "resolve", "td_error",
           "td", "tdc", "ctd", "ctdc", "src", "vrc", "ctd_lambda"]
