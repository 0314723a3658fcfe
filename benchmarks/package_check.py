"""The package as a user installs it: build, inspect, install in a fresh venv, run.

    python -m benchmarks.package_check [--out-dir DIR] [--keep DIR] [--no-reproduce]

1. `python -m build` makes the sdist, then the wheel from the sdist, so a file
   missing from the sdist also fails the wheel.
2. Both archives are checked for what the library needs:
   - every module of `bec_jax/` and `experiments/` (the latter as `bec_jax.experiments`);
   - `py.typed`, and the worked studies' TOML files;
   - the `bec-jax` entry point and the version;
   - no other top-level package in the wheel.
3. A fresh virtual environment installs the wheel, with its dependencies from the
   package index.
4. From a directory outside the repository, it runs `bec-jax --version`, imports
   the installed package (not the checkout), and runs `bec-jax list --json` and
   `bec-jax reproduce --quick` with an empty compilation cache.

Needs `build` (`pip install build`) and the package index. It writes
benchmarks/results/package_check.json: each step's wall time and what it checked.
Any failure stops the script with a message and exit status 1.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

from benchmarks._common import (
    REPO_ROOT,
    RESULTS_DIR,
    machine_info,
    result_path,
    timestamp,
    write_json,
)


class CheckFailed(Exception):
    """A step of the check failed; the message says which and why."""


def _step(timings: dict, name: str, cmd: list[str], cwd: str, env: dict | None = None, timeout: float = 1800):
    """Runs `cmd`, records its wall time under `name`, and returns its stdout;
    `CheckFailed` with the output's tail if it fails."""
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    timings[name] = round(time.perf_counter() - t0, 2)
    print(f"[{name}] {timings[name]:.1f} s, exit {r.returncode}", flush=True)
    if r.returncode != 0:
        raise CheckFailed(f"{name}: exit {r.returncode}\n{(r.stdout + r.stderr)[-3000:]}")
    return r.stdout


def source_modules() -> set[str]:
    """The installed paths of every module of the checkout: bec_jax/... and
    experiments/... (as bec_jax/experiments/...)."""
    out = set()
    for root, dest in (("bec_jax", "bec_jax"), ("experiments", "bec_jax/experiments")):
        for path in glob.glob(os.path.join(REPO_ROOT, root, "**", "*.py"), recursive=True):
            rel = os.path.relpath(path, os.path.join(REPO_ROOT, root)).replace(os.sep, "/")
            if "__pycache__" not in rel:
                out.add(f"{dest}/{rel}")
    return out


def check_wheel(path: str, version: str) -> dict:
    """What the wheel must hold; `CheckFailed` naming what is missing."""
    names = set(zipfile.ZipFile(path).namelist())
    missing = sorted(source_modules() - names)
    studies = sorted(n for n in names if re.fullmatch(r"bec_jax/experiments/studies/[^/]+\.toml", n))
    want_studies = len(glob.glob(os.path.join(REPO_ROOT, "experiments", "studies", "*.toml")))
    if missing:
        raise CheckFailed(f"wheel: {len(missing)} modules missing, e.g. {missing[:5]}")
    if "bec_jax/py.typed" not in names or len(studies) != want_studies:
        raise CheckFailed(f"wheel: package data missing (py.typed, {len(studies)} of {want_studies} studies)")
    tops = sorted({n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")})
    if tops != ["bec_jax"]:
        raise CheckFailed(f"wheel: top-level names other than bec_jax: {tops}")
    info = {n.split("/")[-1]: n for n in names if ".dist-info/" in n}
    with zipfile.ZipFile(path) as z:
        entry = z.read(info["entry_points.txt"]).decode()
        meta = z.read(info["METADATA"]).decode()
    if "bec-jax = bec_jax.__main__:main" not in entry:
        raise CheckFailed(f"wheel: no bec-jax entry point in entry_points.txt:\n{entry}")
    if f"\nVersion: {version}\n" not in meta:
        raise CheckFailed(f"wheel: METADATA does not say Version: {version}")
    return {"files": len(names), "modules": len(source_modules()), "studies": studies}


def check_sdist(path: str) -> dict:
    """What the sdist must hold (the wheel is built from it, which checks the rest)."""
    with tarfile.open(path) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    sources = {("experiments/" + m[len("bec_jax/experiments/"):]) if m.startswith("bec_jax/experiments/") else m
               for m in source_modules()}
    missing = sorted(({"pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "CITATION.cff"} | sources) - names)
    if missing:
        raise CheckFailed(f"sdist: missing {missing[:8]}")
    return {"files": len(names)}


def _wheel_python(venv: str) -> tuple[str, str]:
    return os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "bec-jax")


def run_installed(work: str, timings: dict, reproduce: bool, version: str) -> dict:
    """The installed wheel, run from `work` (outside the repository)."""
    python, cli = _wheel_python(os.path.join(work, "venv"))
    home = os.path.join(work, "home")
    os.makedirs(home, exist_ok=True)
    env = {"PATH": os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""), "HOME": home,
           "BEC_JAX_CACHE_DIR": os.path.join(work, "xla-cache"), "MPLBACKEND": "Agg"}
    run_dir = os.path.join(work, "run")
    os.makedirs(run_dir, exist_ok=True)
    out = {"version_line": _step(timings, "bec-jax --version", [cli, "--version"], run_dir, env).strip()}
    if not out["version_line"].startswith(f"bec-jax {version} (jax "):
        raise CheckFailed(f"--version: expected 'bec-jax {version} (jax ...)', got {out['version_line']!r}")
    where = _step(timings, "import", [python, "-c", "import bec_jax, bec_jax.engine, bec_jax.experiments.paper; "
                                      "print(bec_jax.__file__)"], run_dir, env).strip()
    if not where.startswith(os.path.join(work, "venv")):
        raise CheckFailed(f"import: bec_jax came from {where}, not the fresh venv")
    listed = json.loads(_step(timings, "bec-jax list --json", [cli, "list", "--json"], run_dir, env))
    out["listed"] = {k: len(v) for k, v in listed.items()}
    if reproduce:
        _step(timings, "bec-jax reproduce --quick", [cli, "reproduce", "--quick", "--out", "repro"], run_dir, env)
        written = sorted(os.listdir(os.path.join(run_dir, "repro")))
        if "report.md" not in written or "table.md" not in written:
            raise CheckFailed(f"reproduce --quick: no report.md/table.md in its output ({written})")
        out["reproduce_files"] = len(written)
    return out


def main(argv=None) -> int:
    """Builds, checks, installs and runs the package; writes the JSON record."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=RESULTS_DIR, help="where package_check.json goes")
    p.add_argument("--keep", help="work in this directory and keep it (default: a temporary one, removed)")
    p.add_argument("--no-reproduce", action="store_true", help="skip bec-jax reproduce --quick")
    args = p.parse_args(argv)
    sys.path.insert(0, REPO_ROOT)
    import bec_jax
    version = bec_jax.__version__
    work = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="bec-jax-package-")
    os.makedirs(work, exist_ok=True)
    timings, record = {}, {"timestamp": timestamp(), "version": version, "machine": machine_info()}
    try:
        dist = os.path.join(work, "dist")
        _step(timings, "build", [sys.executable, "-m", "build", "--outdir", dist, REPO_ROOT], REPO_ROOT)
        wheel, = glob.glob(os.path.join(dist, f"bec_jax-{version}-*.whl"))
        sdist, = glob.glob(os.path.join(dist, f"bec_jax-{version}.tar.gz"))
        record["wheel"] = {"name": os.path.basename(wheel), "bytes": os.path.getsize(wheel),
                           **check_wheel(wheel, version)}
        record["sdist"] = {"name": os.path.basename(sdist), "bytes": os.path.getsize(sdist), **check_sdist(sdist)}
        _step(timings, "venv", [sys.executable, "-m", "venv", os.path.join(work, "venv")], work)
        pip = os.path.join(work, "venv", "bin", "pip")
        _step(timings, "pip install wheel", [pip, "install", "--quiet", wheel], work)
        record["installed"] = run_installed(work, timings, not args.no_reproduce, version)
        record["ok"] = True
    except (CheckFailed, subprocess.TimeoutExpired, ValueError) as e:  # ValueError: not exactly one archive
        record["ok"], record["error"] = False, str(e)
        print(f"package_check: FAILED: {e}", file=sys.stderr)
    finally:
        record["wall_s"] = timings
        path = write_json(result_path(args.out_dir, "package_check", False), record)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: record[k] for k in ("ok", "wall_s")}, indent=1))
    print(f"wrote {path}")
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
