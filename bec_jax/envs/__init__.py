"""Environments: constructors with named parameters, a registry, and a user's MDP.

An environment is a *factory*: a function of named parameters (`gamma` and its
own, e.g. `two_state(a, b, x, y, m, n, gamma, theta0)`) that returns a validated
`FiniteMDP`. Every module of this package that defines a module-level dict
`ENVIRONMENTS = {name: factory}` is registered on import, so adding an
environment is adding a module.

A sweep names its environment by a *source* string:
  * a registered name: "boyan_chain", "two_state", "baird" (`register` adds yours);
  * an MDP file: "path/to/mdp.npz" (arrays named as the `FiniteMDP` fields) or
    "path/to/mdp.toml" (the same fields as nested lists); `start` and `theta0`
    are optional. A file's MDP has one parameter, `gamma`. Where the file's
    gamma is a number, `gamma` replaces it (default: the file's). Where it is an
    (S, A, S) array (an episodic task), `gamma` is the discount of the
    non-terminal transitions, those whose discount in the file is not 0: they
    all get `gamma`, and the 0s that end the episodes stay, so `gamma=1.0` is an
    undiscounted episodic task. Its default is the file's one nonzero
    discount; a file whose nonzero discounts are not all one number (or that
    has none) has no default (None: the file's array as it is) and refuses a
    number. An array given for `gamma` (from Python) replaces the file's;
  * "package.module:function": a factory in your own code (its keyword
    parameters are the environment's parameters), or a `FiniteMDP` object.
Whatever the source, the MDP goes through `make_mdp` validation; a bad one is a
`ValueError` naming the source and the field.
"""
from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import tomllib
import zipfile
from typing import Callable

import numpy as np

from bec_jax import mdp as mdp_lib
from bec_jax.mdp import FiniteMDP

REGISTRY: dict[str, Callable[..., FiniteMDP]] = {}
MDP_FILE_SUFFIXES = (".npz", ".toml")


def register(name: str, factory: Callable[..., FiniteMDP], *, replace: bool = False) -> Callable:
    """Registers `factory` (keyword parameters -> `FiniteMDP`) under `name`. A name
    that is taken is an error (`replace=True` overrides)."""
    if not isinstance(name, str) or not name or ":" in name or name.endswith(MDP_FILE_SUFFIXES):
        raise ValueError(f"env: a registered name must be a non-empty string without ':' that does not "
                         f"end in .npz or .toml, got {name!r}")
    if not callable(factory):
        raise ValueError(f"env: the factory of {name!r} must be callable, got {factory!r}")
    if name in REGISTRY and not replace and REGISTRY[name] is not factory:
        raise ValueError(f"env: the name {name!r} is already registered; choose another name")
    REGISTRY[name] = factory
    return factory


def names() -> list[str]:
    """The registered environment names, sorted."""
    return sorted(REGISTRY)


def is_file_source(source: str) -> bool:
    return isinstance(source, str) and source.lower().endswith(MDP_FILE_SUFFIXES)


def _file_fields(path: str) -> dict:
    """The MDP fields stored in an .npz or .toml file; `ValueError` naming the
    file (and the field) for anything wrong."""
    where = f"env: {path!r}"
    if not os.path.exists(path):
        raise ValueError(f"{where}: no such file")
    if not os.path.isfile(path):
        raise ValueError(f"{where}: not a file")
    try:
        if path.lower().endswith(".npz"):
            with np.load(path, allow_pickle=False) as z:
                fields = {k: z[k] for k in z.files}
        else:
            with open(path, "rb") as f:
                fields = tomllib.load(f)
    except (OSError, zipfile.BadZipFile, tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError,
            EOFError) as e:
        raise ValueError(f"{where}: cannot read it ({type(e).__name__}: {' '.join(str(e).split())})") from None
    unknown = sorted(k for k in fields if k not in mdp_lib.FIELDS)
    if unknown:
        raise ValueError(f"{where}: {unknown[0]}: unknown field; an MDP file holds "
                         f"{', '.join(mdp_lib.FIELDS)}")
    missing = [k for k in mdp_lib.REQUIRED_FIELDS if k not in fields]
    if missing:
        raise ValueError(f"{where}: {missing[0]}: missing (an MDP file needs {', '.join(mdp_lib.REQUIRED_FIELDS)}; "
                         "start and theta0 are optional)")
    return fields


def _number(value) -> float | None:
    """`value` as a float when it is one real number (not a bool or a string)."""
    if isinstance(value, (bool, np.bool_, str, bytes)):
        return None
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        return None
    return float(arr) if arr.ndim == 0 and arr.dtype.kind in "iuf" else None


def _discount_array(value) -> np.ndarray | None:
    """`value` as a float64 array when it is an array of discounts in [0, 1],
    converted as `make_mdp` converts it; else None, and `make_mdp` refuses it."""
    try:
        if np.asarray(value).dtype.kind == "c":
            return None
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    ok = arr.ndim > 0 and np.all(np.isfinite(arr)) and np.all((arr >= 0) & (arr <= 1))
    return arr if ok else None


def _values_text(values) -> str:
    shown = ", ".join(repr(float(v)) for v in values[:4])
    return shown + (f", ... ({len(values)} values)" if len(values) > 4 else "")


def _nonterminal_gamma(gamma, nonterminal: np.ndarray) -> float:
    """`gamma` checked as the one discount of a file's non-terminal transitions
    (`nonterminal`: their distinct discounts in the file)."""
    g = _number(gamma)
    if g is None:
        raise ValueError(f"gamma: expected a number in [0, 1] (the discount of the file's non-terminal "
                         f"transitions), got {gamma!r}")
    if not 0.0 <= g <= 1.0:
        raise ValueError(f"gamma: the discount of the file's non-terminal transitions must be in [0, 1], "
                         f"got {g!r}")
    if len(nonterminal) == 0:
        raise ValueError("gamma: the file's discount is 0 on every transition (each one ends an "
                         "episode), so there is no discount for gamma to set; leave gamma out")
    if len(nonterminal) > 1:
        raise ValueError(f"gamma: the file's non-terminal transitions have several discounts "
                         f"({_values_text(nonterminal)}), so one number cannot replace them; leave gamma "
                         "out, or give the whole (S, A, S) array from Python")
    return g


def _file_factory(path: str) -> Callable[..., FiniteMDP]:
    fields = _file_fields(path)
    file_gamma = fields["gamma"]
    try:
        scalar = np.ndim(file_gamma) == 0
    except ValueError:  # a ragged TOML list: make_mdp names it
        scalar = False
    array = None if scalar else _discount_array(file_gamma)  # None for a bad array too
    nonterminal = np.unique(array[array > 0]) if array is not None else np.zeros(0)
    if scalar:
        default = _number(file_gamma)
        doc = "the discount; replaces the file's"
    elif array is not None and len(nonterminal) == 1:
        default = float(nonterminal[0])
        doc = ("the discount of the non-terminal transitions (default the file's); "
               "the transitions whose discount is 0 in the file end an episode and keep 0")
    else:
        default = None
        doc = ("None: the file's per-transition discounts, whose nonzero values are not one number, "
               "so gamma takes no number")

    def discount(gamma):
        """The MDP's discount for the parameter `gamma` (see the module docstring)."""
        if gamma is None:
            return file_gamma
        if scalar or np.ndim(gamma) != 0:  # a number replaces the file's number; an array, anything
            return gamma
        if array is None:  # the file's gamma is bad: make_mdp names what is wrong
            return file_gamma
        return np.where(array > 0, _nonterminal_gamma(gamma, nonterminal), 0.0)

    def from_file(gamma=default):
        return mdp_lib.make_mdp(**dict(fields, gamma=discount(gamma)))

    from_file.__doc__ = f"The MDP of the file {path!r}; gamma: {doc}."
    from_file.__name__ = os.path.basename(path)
    return from_file


def factory(source) -> Callable[..., FiniteMDP]:
    """The factory a source string names (see the module docstring); a callable
    is returned as is. `ValueError` naming the source for an unknown name, a
    missing or unreadable file, or a failed import."""
    if callable(source):
        return source
    if not isinstance(source, str) or not source:
        raise ValueError(f"env: expected an environment name, an .npz/.toml file or package.module:function, "
                         f"got {source!r}")
    if is_file_source(source):
        return _file_factory(source)
    if ":" in source:
        from bec_jax.algorithms import import_attribute
        obj = import_attribute(source, "env")
        if isinstance(obj, FiniteMDP):
            return lambda: obj
        if not callable(obj):
            raise ValueError(f"env: {source!r} is a {type(obj).__name__}, not a function returning an MDP")
        return obj
    if source not in REGISTRY:
        raise ValueError(f"env: unknown environment {source!r}; known: {', '.join(names())} "
                         "(or an .npz/.toml MDP file, or package.module:function)")
    return REGISTRY[source]


def parameters(source) -> dict:
    """{name: default} of the environment's parameters (the factory's keyword
    parameters; a parameter without a default maps to `inspect.Parameter.empty`)."""
    fn = factory(source)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}
    return {n: p.default for n, p in sig.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def check_parameters(source, names_given, label: str | None = None) -> None:
    """`ValueError` naming the first parameter the environment does not take
    (`label` names the environment in it; default: `source`)."""
    fn = factory(source)  # once: a file source is read here
    known = parameters(fn)
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    for n in names_given:
        if n not in known and not takes_kwargs:
            raise ValueError(f"env_params.{n}: {label or source} has no parameter {n!r}; "
                             f"its parameters: {', '.join(known) or 'none'}")


def build(source, **params) -> FiniteMDP:
    """The validated MDP of `source` with parameters `params`. Any failure is a
    `ValueError` naming the source (and the field of the MDP that is wrong)."""
    fn = factory(source)
    label = source if isinstance(source, str) else getattr(source, "__name__", "env")
    check_parameters(fn, params, label)
    where = f"env: {label!r}" + (f" with {', '.join(f'{k}={v!r}' for k, v in params.items())}" if params else "")
    try:
        out = fn(**params)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    except Exception as e:  # a user's factory
        raise ValueError(f"{where}: the factory failed ({type(e).__name__}: {e})") from None
    if isinstance(out, dict):
        fields = out
    elif isinstance(out, FiniteMDP):
        fields = out._asdict()
    else:
        raise ValueError(f"{where}: expected a FiniteMDP (or a dict of its fields), got {type(out).__name__}")
    try:
        return mdp_lib.validate(fields)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None


def make(name: str, **kwargs) -> FiniteMDP:
    """Builds an environment from its source (a registered name, an MDP file or
    package.module:function); keyword arguments are its parameters."""
    return build(name, **kwargs)


def _discover() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        for name, fn in getattr(mod, "ENVIRONMENTS", {}).items():
            register(name, fn)
            globals()[name] = fn


_discover()

__all__ = ["REGISTRY", "register", "names", "factory", "parameters", "build", "make",
           "boyan_chain", "two_state", "baird"]
