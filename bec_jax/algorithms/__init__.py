"""Linear policy-evaluation updates as pure `init`/`update` pairs on one example.

Batch them with `jax.vmap`. Each module describes itself with an `Algorithm`
(name, init, update, hyperparameters, the paper's equations): `td`, `tdc`, `ctd`,
`ctdc` (and `ctdc_omega_no_rho`), `src`, `vrc`, and centered TD(lambda) `ctd_lambda`.
Every module of this package is found and registered on import, so adding an
algorithm is adding a module that defines a module-level `Algorithm`.

`get(name)` returns a registered descriptor (or, given
`"package.module:attribute"`, imports one from the user's own code) and
`register(alg)` adds a user's. `resolve_step(step, count)` is a step size at an
update count (a float as is, a schedule called). This package imports nothing
from `bec_jax.envs`.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import sys

from bec_jax.algorithms.base import (
    Algorithm,
    Hyperparameter,
    StepSize,
    parameter,
    shared,
    sharing,
    step_size,
    td_error,
    vdot,
)
from bec_jax.algorithms.base import resolve as resolve_step

_REGISTRY: dict[str, Algorithm] = {}


def register(alg: Algorithm, *, replace: bool = False) -> Algorithm:
    """Adds `alg` to the registry under `alg.name` and returns it. A name that is
    already taken is an error (`replace=True` overrides)."""
    if not isinstance(alg, Algorithm):
        raise ValueError(f"algorithm: register expects an Algorithm, got {type(alg).__name__}")
    if alg.name in _REGISTRY and not replace and _REGISTRY[alg.name] is not alg:
        raise ValueError(f"algorithm: the name {alg.name!r} is already registered; choose another name")
    _REGISTRY[alg.name] = alg
    return alg


def names() -> list[str]:
    """The registered algorithm names, in registration order."""
    return list(_REGISTRY)


# Names that were changed: old -> (new, why).
RENAMED = {"ctdc_literal": ("ctdc_omega_no_rho", "it puts rho on theta and u but not on omega, which is neither "
                            "the paper's sub-sampled form nor the authors' code")}


def get(ref) -> Algorithm:
    """The `Algorithm` `ref` names: a registered name, a `package.module:attribute`
    reference (imported, not registered), or an `Algorithm` itself (returned as
    is). `ValueError` lists the known names (and names the new name of a renamed one)."""
    if isinstance(ref, str) and ref in RENAMED:
        new, why = RENAMED[ref]
        raise ValueError(f"algorithm: {ref!r} was renamed {new!r} ({why}); use {new!r}")
    return lookup(ref, _REGISTRY, "algorithm")


def lookup(ref, registry: dict, what: str) -> Algorithm:
    """The `Algorithm` `ref` names in `registry`: a registered name, a
    `package.module:attribute` reference (imported, not registered), or an
    `Algorithm` itself. `ValueError` naming `algorithm` lists the registry's
    names, calling an unknown name an unknown `what` (the control registry
    shares this lookup)."""
    if isinstance(ref, Algorithm):
        return ref
    if isinstance(ref, str) and ref in registry:
        return registry[ref]
    if isinstance(ref, str) and ":" in ref:
        alg = import_attribute(ref, "algorithm")
        if not isinstance(alg, Algorithm):
            raise ValueError(f"algorithm: {ref!r} is a {type(alg).__name__}, not a bec_jax Algorithm")
        return alg
    raise ValueError(f"algorithm: unknown {what} {ref!r}; known: {', '.join(registry)} "
                     "(or package.module:attribute for your own)")


def lookup_callable(ref, registry: dict, field: str, noun: str, thing: str, known: str):
    """The callable `ref` names in `registry`: a registered name, or a
    `package.module:attribute` reference (imported, not registered).
    `ValueError` naming `field`: an unknown `noun`, listing `known`; or an
    attribute that is not a `thing` (the control tasks' and feature maps'
    lookups share this)."""
    if isinstance(ref, str) and ref in registry:
        return registry[ref]
    if isinstance(ref, str) and ":" in ref:
        found = import_attribute(ref, field)
        if not callable(found):
            raise ValueError(f"{field}: {ref!r} is a {type(found).__name__}, not a {thing}")
        return found
    raise ValueError(f"{field}: unknown {noun} {ref!r}; known: {known}")


def register_callable(registry: dict, name: str, factory, field: str, *, replace: bool = False):
    """Puts `factory` in `registry` under `name` and returns it (the control
    tasks' registries share this). `ValueError` naming `field`: a name that is
    empty or holds ':' (that form is package.module:function), a factory that
    is not callable, or a name taken by another factory unless `replace`."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"{field}: a registered name must be a non-empty string without ':', got {name!r}")
    if not callable(factory):
        raise ValueError(f"{field}: the factory of {name!r} must be callable, got {factory!r}")
    if name in registry and not replace and registry[name] is not factory:
        raise ValueError(f"{field}: the name {name!r} is already registered; choose another name")
    registry[name] = factory
    return factory


def import_attribute(ref: str, field: str):
    """The object `package.module:attribute` names, importing the module (the
    current directory is searched too, as `python -m` does). `ValueError` naming
    `field` if it cannot be imported."""
    mod_name, _, attr = ref.partition(":")
    if not mod_name or not attr:
        raise ValueError(f"{field}: expected package.module:attribute, got {ref!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # any error in the user's module
        raise ValueError(f"{field}: cannot import {mod_name!r} ({type(e).__name__}: {e})") from None
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{field}: module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _discover() -> None:
    """Registers every module-level `Algorithm` of this package's modules (in
    module-name order, then definition order)."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "base" or info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        globals()[info.name] = mod
        for value in vars(mod).values():
            if isinstance(value, Algorithm):
                register(value)


_discover()

__all__ = ["Algorithm", "Hyperparameter", "StepSize", "get", "lookup", "lookup_callable", "names", "register",
           "register_callable",
           "import_attribute",
           "parameter", "step_size", "resolve_step", "td_error", "vdot", "shared", "sharing"]


def __getattr__(name: str):
    # The old name of `get` read too much like `resolve_step`: say where each went.
    if name == "resolve":
        raise AttributeError("algorithms.resolve was renamed algorithms.get (an algorithm by name); "
                             "for a step size at a count use algorithms.resolve_step")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
