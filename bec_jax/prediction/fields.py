"""The checks every front's spec shares: integers and reals as a spec means them,
list fields, TOML tables read with one-line errors, and the limits of the
program's 32-bit counters and keys."""
from __future__ import annotations

import keyword
import tomllib
from typing import Any

import numpy as np

# Step counters and diverged steps are int32 inside the program; seeds key a
# 32-bit PRNG (in JAX's default 32-bit mode key(2**32) equals key(0)).
MAX_INT32 = 2**31 - 1
SEED_LIMIT = 2**32


def read_toml(path: str, field: str) -> dict:
    """The table of a TOML file; `ValueError` naming `field` and the file when it
    cannot be read, is not UTF-8 or is not valid TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ValueError(f"{field}: cannot read {path!r} ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{field}: {path!r} is not valid TOML ({e})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{field}: {path!r} is not UTF-8 text") from None


def is_int(x) -> bool:
    """An integer (numpy's too), never bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def is_real(x) -> bool:
    """A real number: int or float (numpy's too), never bool or a string."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def field_key(k: Any) -> str:
    """A dict key as an error message names it: plain if it looks like a field name."""
    return k if isinstance(k, str) and k.isidentifier() else repr(k)


def as_tuple(name: str, value: Any) -> tuple:
    """A list field as a tuple (a lone value becomes a 1-tuple); ValueError if it cannot be one."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        return (value,)
    try:
        return tuple(value)
    except Exception:  # e.g. a 0-d numpy array, an object whose iteration fails
        raise ValueError(f"{name}: expected a list, got {value!r}") from None


def plain(v: Any) -> Any:
    """A JSON-ready, hashable environment-parameter value (numpy scalars become
    Python numbers, lists become tuples)."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple, np.ndarray)):
        return tuple(plain(x) for x in v)
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    raise ValueError(f"expected a number, string or boolean, got {v!r}")


def canonical_name(name: str) -> str:
    """`lambda_` (the Python spelling) -> `lambda`."""
    if isinstance(name, str) and name.endswith("_") and keyword.iskeyword(name[:-1]):
        return name[:-1]
    return name
