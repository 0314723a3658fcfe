"""The distribution ships the whole library: every package of the source tree is
listed in pyproject.toml (a package left out installs from a checkout but is
missing from the wheel), with its data files. The slow check, building the wheel
and sdist and running the wheel in a fresh venv, is benchmarks/package_check.py."""
from __future__ import annotations

import glob
import os
import tomllib



REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setuptools() -> dict:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _source_packages() -> set[str]:
    """Every folder with an __init__.py under bec_jax/ and experiments/, by its installed name."""
    out = set()
    for root, name in (("bec_jax", "bec_jax"), ("experiments", "bec_jax.experiments")):
        base = os.path.join(REPO, root)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, base)
                out.add(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    return out


def test_every_source_package_is_in_the_distribution():
    listed = set(_setuptools()["packages"])
    assert _source_packages() == listed, (
        f"missing from pyproject.toml: {sorted(_source_packages() - listed)}; "
        f"listed but absent: {sorted(listed - _source_packages())}")
    # A removed entry is caught: the engine package was once left out of the wheel.
    assert "bec_jax.engine" in _source_packages()


def test_package_data_globs_match_files():
    cfg = _setuptools()
    dirs = {"bec_jax": os.path.join(REPO, "bec_jax"), **{k: os.path.join(REPO, v)
                                                         for k, v in cfg["package-dir"].items()}}
    for pkg, patterns in cfg["package-data"].items():
        for pat in patterns:
            assert glob.glob(os.path.join(dirs[pkg], pat)), f"{pkg}: {pat} matches no file"
    assert len(glob.glob(os.path.join(REPO, "experiments", "studies", "*.toml"))) >= 2

