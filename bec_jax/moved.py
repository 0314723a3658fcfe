"""Where the modules of bec_jax 0.3 went: the old import paths, kept for one
minor release.

`MOVED` maps each old module path to its new one. `import bec_jax.sweep`,
`from bec_jax.sweep import run` and `from bec_jax import sweep` keep working:
the old name is bound to the new module itself (the same object, so a patch
through either name is seen by both), with one `DeprecationWarning` per old
path naming the new one. `bec_jax.analysis` also re-exported the fixpoints,
the metrics and `mean_square`; its old path still finds those names where they
live now.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

MOVED = {
    "bec_jax.analysis": "bec_jax.theory.expected_updates",
    "bec_jax.fixpoints": "bec_jax.theory.fixpoints",
    "bec_jax.mean_square": "bec_jax.theory.mean_square",
    "bec_jax.metrics": "bec_jax.theory.metrics",
    "bec_jax.verdicts": "bec_jax.theory.verdicts",
    "bec_jax.centering": "bec_jax.agents.value_learning",
    "bec_jax.centered_values": "bec_jax.agents.targets",
    "bec_jax.memory": "bec_jax.engine.memory",
    "bec_jax.spec": "bec_jax.prediction.spec",
    "bec_jax.sampling": "bec_jax.prediction.sampling",
    "bec_jax.sweep": "bec_jax.prediction.sweep",
    "bec_jax.results": "bec_jax.prediction.results",
    "bec_jax.plotting": "bec_jax.prediction.plotting",
    "bec_jax.engine.kernel": "bec_jax.prediction.kernel",
    "bec_jax.runner": "bec_jax.run.runner",
    "bec_jax.rundir": "bec_jax.run.rundir",
    "bec_jax.study": "bec_jax.run.study",
    "bec_jax.watchdog": "bec_jax.run.watchdog",
    "bec_jax.figures": "bec_jax.run.figures",
    "bec_jax.cli_parser": "bec_jax.cli.parser",
    "bec_jax.cli_args": "bec_jax.cli.args",
    "bec_jax.analyze": "bec_jax.cli.analyze",
    "bec_jax.catalog": "bec_jax.cli.catalog",
}

# Names that moved out of a module that stays: (old module, name) -> the new
# module that holds it. The old module's `__getattr__` asks `attribute`, so it
# needs no import of the new home (`prediction.results` would otherwise import
# the table of kinds above it).
MOVED_NAMES = {("bec_jax.prediction.results", "load_result"): "bec_jax.run.kinds"}

# The old `bec_jax.analysis` namespace: its own names, then those it star-imported.
ANALYSIS_PARTS = ("bec_jax.theory.expected_updates", "bec_jax.theory.fixpoints", "bec_jax.theory.metrics",
                  "bec_jax.theory.mean_square")

# The old `bec_jax.cli` module is now the package `bec_jax.cli`; its functions
# live in `bec_jax.cli.commands`.
CLI_NAMES = ("main", "parse", "build_parser", "use_all_cpu_cores", "init_distributed",
             "enable_compilation_cache", "EXIT_USAGE", "PAPERS")
# Those of them that moved on from `bec_jax.cli.commands`, and where to.
CLI_HOMES = {"init_distributed": "bec_jax.cli.cluster"}

_warned: set[str] = set()


def warn(old: str, new: str, stacklevel: int = 3) -> None:
    """One `DeprecationWarning` per old path, naming the new one."""
    if old in _warned:
        return
    _warned.add(old)
    warnings.warn(f"{old} has moved to {new}; the old path goes in the next minor release",
                  DeprecationWarning, stacklevel=stacklevel)


def _analysis_module() -> types.ModuleType:
    """The old `bec_jax.analysis`: a module that finds each name in its new home."""
    mod = types.ModuleType("bec_jax.analysis", "Moved: see bec_jax.theory (expected_updates, fixpoints, metrics).")
    parts = [importlib.import_module(p) for p in ANALYSIS_PARTS]

    def __getattr__(name):
        for p in parts:
            if hasattr(p, name):
                return getattr(p, name)
        raise AttributeError(f"module 'bec_jax.analysis' has no attribute {name!r}")

    mod.__getattr__ = __getattr__
    return mod


def attribute(module: str, name: str):
    """`name` of the old `module` where it lives now (`MOVED_NAMES`), warning
    once; AttributeError, as a module's own would say, for any other name."""
    home = MOVED_NAMES.get((module, name))
    if home is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warn(f"{module}.{name}", f"{home}.{name}", stacklevel=4)
    return getattr(importlib.import_module(home), name)


def resolve(old: str) -> types.ModuleType:
    """The module an old path now names (warning once)."""
    warn(old, MOVED[old], stacklevel=4)
    if old == "bec_jax.analysis":
        return sys.modules.get(old) or _analysis_module()
    return importlib.import_module(MOVED[old])


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return resolve(spec.name)

    def exec_module(self, module):
        pass


class Finder(importlib.abc.MetaPathFinder):
    """Finds the old paths of `MOVED` (installed on `sys.meta_path` by `bec_jax`)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Loader())


def install() -> None:
    """Puts `Finder` on `sys.meta_path` once."""
    if not any(isinstance(f, Finder) for f in sys.meta_path):
        sys.meta_path.append(Finder())
