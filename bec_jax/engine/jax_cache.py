"""JAX's persistent compilation cache, mended: an entry that cannot be read
(a truncated or garbled file) is removed and its program compiled again, so
JAX writes the entry afresh in the same run.

Left to itself, JAX warns (two lines on stderr) on every run that meets such
an entry and never replaces it: its cache writes only keys that are absent
(`jax._src.lru_cache.LRUCache.put`). `mend` wraps the one function JAX reads
entries with (`jax._src.compilation_cache.get_executable_and_time`, which
`jax._src.compiler` looks up at each call): a read that fails as JAX would
only warn about removes the entry's files and reports a miss. Errors JAX
raises (`jax_raise_persistent_cache_errors`, a failed verification) still
raise. This is JAX's private API: where it is not there, nothing changes.
bec_jax's own kept programs (`engine.program_cache`) mend themselves.
"""
from __future__ import annotations

import functools
import threading

_LOCK = threading.Lock()
_MENDED = [False]


def mend() -> bool:
    """Installs the mended read (module docstring), once per process; whether
    it is in place."""
    with _LOCK:
        if _MENDED[0]:
            return True
        try:
            from jax._src import compilation_cache, compiler
        except ImportError:
            return False
        read = getattr(compilation_cache, "get_executable_and_time", None)
        if read is None:
            return False
        compilation_cache.get_executable_and_time = _mended(read, compilation_cache, compiler)
        _MENDED[0] = True
        return True


def _mended(read, cache_module, compiler):
    """`read`, with a failed read of an entry turned into a miss that removes it."""

    @functools.wraps(read)
    def get_executable_and_time(cache_key, *args, **kwargs):
        try:
            return read(cache_key, *args, **kwargs)
        except Exception as e:
            should_raise = getattr(compiler, "_should_raise_persistent_cache_error", None)
            if (should_raise is not None and should_raise(e)) or not _remove(cache_module, cache_key):
                raise  # as JAX would have it: raised, or warned about by its caller
            return None, None

    return get_executable_and_time


def _remove(cache_module, key: str) -> bool:
    """Removes the files of cache entry `key` from JAX's file cache; whether
    the entry is gone."""
    try:
        from jax._src import lru_cache
    except ImportError:
        return False
    cache = getattr(cache_module, "_cache", None)
    path = getattr(cache, "path", None)
    if not isinstance(cache, lru_cache.LRUCache) or path is None:
        return False
    entry = path / f"{key}{lru_cache._CACHE_SUFFIX}"
    try:
        for p in (entry, path / f"{key}{lru_cache._ATIME_SUFFIX}"):
            if p.exists():
                p.unlink()
    except OSError:
        return False
    return not entry.exists()


__all__ = ["mend"]
