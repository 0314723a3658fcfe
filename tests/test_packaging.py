"""The distribution ships the whole library: every package of the source tree is
listed in pyproject.toml (a package left out installs from a checkout but is
missing from the wheel), with its data files. The slow check, building the wheel
and sdist and running the wheel in a fresh venv, is benchmarks/package_check.py."""
from __future__ import annotations

import glob
import os
import re
import tomllib

import pytest

import bec_jax
from bec_jax import algorithms

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
    cfg = _setuptools()
    listed = set(cfg["packages"])
    assert _source_packages() <= listed, f"missing from pyproject.toml: {sorted(_source_packages() - listed)}"
    # Anything else listed is a folder of data files only (no __init__.py), with its package data.
    assert listed - _source_packages() <= set(cfg["package-data"]), sorted(listed - _source_packages())
    # A removed entry is caught: the engine package was once left out of the wheel.
    assert "bec_jax.engine" in _source_packages()


def test_package_data_globs_match_files():
    cfg = _setuptools()
    for pkg, patterns in cfg["package-data"].items():
        # A package's folder: bec_jax.X.Y is bec_jax/X/Y, under bec_jax.experiments' own folder.
        top = next((k for k in cfg["package-dir"] if pkg == k or pkg.startswith(k + ".")), None)
        base = os.path.join(REPO, cfg["package-dir"][top]) if top else os.path.join(REPO, "bec_jax")
        rest = pkg[len(top or "bec_jax"):].lstrip(".")
        folder = os.path.join(base, *rest.split(".")) if rest else base
        for pat in patterns:
            assert glob.glob(os.path.join(folder, pat)), f"{pkg}: {pat} matches no file in {folder}"
    assert len(glob.glob(os.path.join(REPO, "experiments", "studies", "*.toml"))) >= 2


def test_version_is_semantic_and_recorded_in_the_changelog_and_citation():
    assert re.fullmatch(r"\d+\.\d+\.\d+", bec_jax.__version__)
    with open(os.path.join(REPO, "CHANGELOG.md")) as f:
        changelog = f.read()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.M)
    assert releases and releases[0] == bec_jax.__version__, releases  # the newest release is this one
    assert "## [Unreleased]" in changelog
    with open(os.path.join(REPO, "CITATION.cff")) as f:
        assert f"version: {bec_jax.__version__}\n" in f.read()


def test_every_refused_old_name_is_in_the_changelog():
    with open(os.path.join(REPO, "CHANGELOG.md")) as f:
        changelog = f.read()
    for old, (new, _) in algorithms.RENAMED.items():
        assert f"`{old}`" in changelog and f"`{new}`" in changelog, old
    assert "`algorithms.resolve`" in changelog and "`algorithms.get`" in changelog


def _synthetic_wheel(path, version: str, drop: str = "", entry: str = "bec-jax = bec_jax.__main__:main") -> str:
    """A wheel-shaped zip of the checkout's modules and data, without the files under `drop`."""
    import zipfile

    from benchmarks.package_check import source_modules
    names = sorted(source_modules()) + ["bec_jax/py.typed"] + [
        "bec_jax/experiments/studies/" + os.path.basename(p)
        for p in glob.glob(os.path.join(REPO, "experiments", "studies", "*.toml"))]
    info = f"bec_jax-{version}.dist-info/"
    with zipfile.ZipFile(path, "w") as z:
        for n in names:
            if not (drop and n.startswith(drop)):
                z.writestr(n, "")
        z.writestr(info + "entry_points.txt", f"[console_scripts]\n{entry}\n")
        z.writestr(info + "METADATA", f"Metadata-Version: 2.4\nName: bec_jax\nVersion: {version}\n\n")
    return str(path)


def test_the_wheel_check_finds_a_missing_package_entry_point_or_version(tmp_path):
    """benchmarks/package_check.py's wheel check, on wheel-shaped archives: a
    complete one passes; one without the engine (as the wheel once was), without
    the entry point or with another version fails naming what is wrong."""
    from benchmarks.package_check import CheckFailed, check_wheel
    v = bec_jax.__version__
    assert check_wheel(_synthetic_wheel(tmp_path / "ok.whl", v), v)["modules"] > 60
    for name, kw, message in [("engine", {"drop": "bec_jax/engine/"}, "bec_jax/engine/__init__.py"),
                              ("studies", {"drop": "bec_jax/experiments/studies/"}, "package data"),
                              ("entry", {"entry": "bec-jax = elsewhere:main"}, "no bec-jax entry point")]:
        with pytest.raises(CheckFailed, match=re.escape(message)):
            check_wheel(_synthetic_wheel(tmp_path / f"{name}.whl", v, **kw), v)
    with pytest.raises(CheckFailed, match="Version: 9.9.9"):
        check_wheel(_synthetic_wheel(tmp_path / "v.whl", v), "9.9.9")
