"""The house's shape.

Imports, read from the source: no import cycle among the library's
modules (imports inside functions count), no module importing another's private
name, and every import going down the layers of ../shared/DESIGN.md.

The graph is read with `ast`, not by importing, so an import hidden inside a
function is an arrow like any other. Each check is also run on a copy of the
package with a fault injected, so the checks are shown to fail.

Registries found from the modules, imports that change no global state, no
generic top-level name installed, and one room per workflow.
"""
from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
import tomllib

import pytest

import bec_jax
from bec_jax import algorithms, envs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("backend", ["svg", "pdf"])
def test_importing_plotting_leaves_the_matplotlib_backend_alone(backend, tmp_path):
    code = (f"import matplotlib; matplotlib.use({backend!r}); "
            "import bec_jax.prediction.plotting, bec_jax.experiments.paper; "
            "import matplotlib as m; print(m.get_backend())")
    r = _run(code, str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == backend


def test_default_backend_unchanged_and_no_pyplot(tmp_path):
    code = ("import matplotlib; before = matplotlib.get_backend(); "
            "import bec_jax.prediction.plotting, bec_jax.cli.commands; "
            "assert matplotlib.get_backend() == before, (before, matplotlib.get_backend())")
    r = _run(code, str(tmp_path))
    assert r.returncode == 0, r.stderr
    # Drawing and saving a figure never goes through pyplot's global state.
    code = ("import sys, numpy as np; from bec_jax import plotting; fig, ax = plotting.new_figure(); "
            "ax[0, 0].plot(np.arange(3)); plotting.save_figure(fig, '.', 'f', formats=('png',)); "
            "assert 'matplotlib.pyplot' not in sys.modules")
    r = _run(code, str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "f.png").stat().st_size > 100


def test_no_generic_top_level_package_is_installed(tmp_path):
    # Outside the repository, `experiments` is not importable: the paper's experiment
    # is installed as bec_jax.experiments.
    r = _run("import importlib.util as u; print(u.find_spec('experiments')); "
             "import bec_jax.experiments.paper as p; print(p.__name__)", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["None", "bec_jax.experiments.paper"]
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        cfg = tomllib.load(f)["tool"]["setuptools"]
    assert all(p == "bec_jax" or p.startswith("bec_jax.") for p in cfg["packages"])
    assert cfg["package-dir"] == {"bec_jax.experiments": "experiments"}
    assert os.path.isdir(os.path.join(REPO, "experiments"))


def test_every_algorithm_module_registers_itself():
    pkg = os.path.dirname(algorithms.__file__)
    for info in pkgutil.iter_modules([pkg]):
        if info.name == "base":
            continue
        mod = importlib.import_module(f"bec_jax.algorithms.{info.name}")
        own = [v for v in vars(mod).values() if isinstance(v, algorithms.Algorithm)]
        assert own, f"bec_jax/algorithms/{info.name}.py defines no Algorithm"
        for alg in own:
            assert algorithms.get(alg.name) is alg


def test_every_environment_module_registers_itself():
    pkg = os.path.dirname(envs.__file__)
    for info in pkgutil.iter_modules([pkg]):
        mod = importlib.import_module(f"bec_jax.envs.{info.name}")
        assert mod.ENVIRONMENTS, info.name
        for name, fn in mod.ENVIRONMENTS.items():
            assert envs.REGISTRY[name] is fn
            assert "gamma" in envs.parameters(name)  # every built-in takes gamma


def test_env_register_and_collisions():
    def tiny(gamma: float = 0.5):
        return envs.two_state(gamma=gamma)

    try:
        envs.register("tiny_for_test", tiny)
        assert envs.parameters("tiny_for_test") == {"gamma": 0.5}
        assert float(envs.make("tiny_for_test", gamma=0.7).gamma) == 0.7
        with pytest.raises(ValueError, match="already registered"):
            envs.register("tiny_for_test", lambda: None)
        with pytest.raises(ValueError, match="has no parameter 'nope'"):
            envs.make("tiny_for_test", nope=1)
    finally:
        envs.REGISTRY.pop("tiny_for_test", None)
    with pytest.raises(ValueError, match="must be a non-empty string without ':'"):
        envs.register("a:b", tiny)


def test_analysis_does_not_dispatch_on_algorithm_names():
    src = open(os.path.join(os.path.dirname(bec_jax.__file__), "theory", "expected_updates.py")).read()
    for name in algorithms.names():
        assert f'"{name}"' not in src, name


def test_cli_is_a_thin_parser():
    """Resume rules, the chunk store and the output-directory policy live in
    bec_jax.run.runner; the paper's marker lives with the paper's experiment."""
    import bec_jax.cli.commands as cli
    src = open(cli.__file__).read()
    for word in ("ChunkStore", "manifest", "def check_out_dir", "def prepare_out_dir", "REPRODUCE_KIND"):
        assert word not in src, word
    from bec_jax.run import rundir, runner
    assert callable(runner.run_to_dir) and callable(rundir.prepare_out_dir)


# ------------------------------------------------------------ the import graph

LIB = os.path.dirname(os.path.abspath(bec_jax.__file__))
EXPERIMENTS = os.path.join(os.path.dirname(LIB), "experiments")  # installed as bec_jax.experiments

# Layers, top first: a module may import modules of its own layer or below, never
# above (the house of ../shared/DESIGN.md: the command line -> runs -> fronts ->
# theory -> models, samplers and updates -> the engine -> the core). The most
# specific pattern wins. A module missing here fails the test: place a new module
# in the house when you add it.
LAYERS = [
    ("command line", ["bec_jax.cli*", "bec_jax.__main__", "bec_jax.experiments*"]),
    ("studies", ["bec_jax.run.study", "bec_jax.run.slurm", "bec_jax.run.sensitivity"]),
    ("runner", ["bec_jax.run.runner", "bec_jax.run.rundir"]),
    ("kinds", ["bec_jax.run*"]),
    ("fronts", ["bec_jax.prediction.sweep", "bec_jax.control.sweep", "bec_jax.prediction.plotting",
                "bec_jax.control.plotting", "bec_jax.control.continuing.sweep",
                "bec_jax.control.continuing.plotting"]),
    ("front programs", ["bec_jax.prediction*", "bec_jax.control.program", "bec_jax.control.continuing.program"]),
    ("results and specs", ["bec_jax.prediction.results", "bec_jax.control.results", "bec_jax.prediction.spec",
                           "bec_jax.prediction.fields",
                           "bec_jax.control.spec", "bec_jax.control.continuing.results",
                           "bec_jax.control.continuing.spec"]),
    ("theory", ["bec_jax.theory*"]),
    # The agents' functions are updates too (jax and algorithms.base only): the network learners use them.
    ("models, samplers, updates", ["bec_jax.envs*", "bec_jax.prediction.sampling", "bec_jax.algorithms*",
                                   "bec_jax.control*", "bec_jax.agents*"]),
    ("engine", ["bec_jax.engine*"]),
    ("core", ["bec_jax", "bec_jax.mdp", "bec_jax.threefry", "bec_jax.transition", "bec_jax.schedules",
              "bec_jax.provenance", "bec_jax.stats", "bec_jax.files", "bec_jax.moved", "bec_jax.networks",
              "bec_jax.replay"]),
]
FRONTS = ("bec_jax.prediction", "bec_jax.control")  # and every front to come
CORE = LAYERS[-1][1]
MAX_TOP_LEVEL = 12      # modules at the top of bec_jax/, __init__ and __main__ aside
MAX_MODULE_LINES = 600  # in the library
MAX_FUNCTION_LINES = 100


def module_files(lib: str = LIB, experiments: str = EXPERIMENTS) -> dict[str, str]:
    """{module name: file} for the library and its experiments."""
    out = {}
    for root, pkg in ((lib, "bec_jax"), (experiments, "bec_jax.experiments")):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))]
            rel = os.path.relpath(dirpath, root)
            prefix = pkg if rel == "." else pkg + "." + rel.replace(os.sep, ".")
            for f in filenames:
                if f.endswith(".py"):
                    stem = f[:-3]
                    out[prefix if stem == "__init__" else f"{prefix}.{stem}"] = os.path.join(dirpath, f)
    return out


def _package_of(name: str, files: dict) -> str:
    return name if files[name].endswith("__init__.py") else name.rpartition(".")[0]


_TREES: dict[str, ast.Module] = {}


def parse(path: str) -> tuple[str, ast.Module]:
    """(source, syntax tree) of the file at `path`. A tree is parsed once per
    source text: the checks run many times over the library and its copies,
    whose untouched files are the library's own, and they only read the trees."""
    with open(path) as f:
        src = f.read()
    tree = _TREES.get(src)
    if tree is None:
        tree = _TREES[src] = ast.parse(src, path)
    return src, tree


def imports_of(name: str, files: dict) -> list[tuple[str, str, int]]:
    """(imported module, name taken from it or "", line) for every import of a
    library module in module `name`, wherever it stands (functions included)."""
    _, tree = parse(files[name])
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name in files]
        elif isinstance(node, ast.ImportFrom):
            out += [(t, attr, node.lineno) for t, attr in imports_of_node(node, name, files)]
    return out


def graph(files: dict) -> dict[str, set[str]]:
    """{module: the library modules it imports}, self-imports left out."""
    return {m: {t for t, _, _ in imports_of(m, files) if t != m} for m in files}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def private_imports(files: dict) -> list[str]:
    """"module:line imports target._name" for each private name a module takes
    from another module, by `from target import _name` or as `alias._name`."""
    out = []
    for m, path in files.items():
        for target, attr, line in imports_of(m, files):
            if _private(attr) and target != m:
                out.append(f"{m}:{line} imports {target}.{attr}")
        _, tree = parse(path)
        aliases = _module_aliases(tree, m, files)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and aliases.get(node.value.id, m) != m and _private(node.attr)):
                out.append(f"{m}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    return sorted(set(out))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_aliases(tree: ast.AST, m: str, files: dict) -> dict[str, str]:
    """{local name: library module bound to it} in module `m`."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.name in files and a.asname})
        elif isinstance(node, ast.ImportFrom):
            aliases.update({_bound_name(node, t): t for t, attr in imports_of_node(node, m, files) if not attr})
    return aliases


def imports_of_node(node: ast.ImportFrom, name: str, files: dict) -> list[tuple[str, str]]:
    """The (module, name) pairs one `from ... import ...` statement takes."""
    if node.level:
        base = _package_of(name, files).split(".")
        base = base[: len(base) - node.level + 1]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    if mod not in files:
        return []
    return [(f"{mod}.{a.name}", "") if f"{mod}.{a.name}" in files else (mod, a.name) for a in node.names]


def _bound_name(node: ast.ImportFrom, target: str) -> str:
    for a in node.names:
        if target.endswith("." + a.name):
            return a.asname or a.name
    return target.rpartition(".")[2]


def layer_of(module: str) -> int | None:
    """The index in LAYERS (0 = top) of `module`; the most specific pattern wins."""
    best, rank = -1, None
    for i, (_, patterns) in enumerate(LAYERS):
        for p in patterns:
            hit = (module == p[:-1] or module.startswith(p[:-1] + ".")) if p.endswith("*") else module == p
            if hit and len(p) > best:
                best, rank = len(p), i
    return rank


def upward_imports(files: dict) -> list[str]:
    """"module (layer) imports target (higher layer)" for each arrow going up."""
    out = []
    for m, targets in graph(files).items():
        for t in sorted(targets):
            if layer_of(t) is not None and layer_of(m) is not None and layer_of(t) < layer_of(m):
                out.append(f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})")
    return out


def engine_imports_of_fronts(files: dict) -> list[str]:
    """"engine module imports target" for each arrow from the engine to anything
    but the engine and the core: the engine knows no front (fronts hand it their
    programs through `engine.protocol`)."""
    allowed = {p for p in CORE}
    out = []
    for m, targets in graph(files).items():
        if m == "bec_jax.engine" or m.startswith("bec_jax.engine."):
            out += [f"{m} imports {t}" for t in sorted(targets)
                    if not (t == "bec_jax.engine" or t.startswith("bec_jax.engine.") or t in allowed)]
    return out


def top_level_modules(lib: str = LIB) -> list[str]:
    """The modules at the top of the package (`__init__` and `__main__` aside)."""
    return sorted(f[:-3] for f in os.listdir(lib) if f.endswith(".py") and f not in ("__init__.py", "__main__.py"))


def facades(files: dict) -> list[str]:
    """Star-imports anywhere, and modules (not package `__init__`s) that re-export
    names they import: through `__all__`, or an import kept by `# noqa: F401`."""
    out = []
    for m, path in files.items():
        src, tree = parse(path)
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if any(a.name == "*" for a in node.names):
                    out.append(f"{m}:{node.lineno} star-imports {node.module}")
                imported |= {a.asname or a.name for a in node.names}
                if not path.endswith("__init__.py") and "noqa: F401" in src.splitlines()[node.lineno - 1]:
                    out.append(f"{m}:{node.lineno} re-exports what it imports (noqa: F401)")
        if not path.endswith("__init__.py"):
            out += [f"{m} re-exports {n} in __all__" for n in sorted(_all_names(tree) & imported)]
    return out


def _all_names(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
    return set()


def oversized(lib: str = LIB) -> list[str]:
    """Library modules over MAX_MODULE_LINES lines and functions over MAX_FUNCTION_LINES."""
    out = []
    for m, path in module_files(lib, EXPERIMENTS).items():
        if not path.startswith(lib):
            continue
        src, tree = parse(path)
        if src.count("\n") > MAX_MODULE_LINES:
            out.append(f"{m}: {src.count(chr(10))} lines")
        out += [f"{m}.{n.name}: {n.end_lineno - n.lineno + 1} lines" for n in ast.walk(tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    return out


# ------------------------------------------------------------------ the library as it is

FILES = module_files()


def test_the_graph_sees_function_level_imports():
    g = graph(FILES)
    assert len(FILES) > 30 and "bec_jax.prediction.sweep" in FILES and "bec_jax.experiments.paper" in FILES
    assert "bec_jax.mdp" in g["bec_jax.theory.expected_updates"]
    assert "bec_jax.algorithms.base" in g["bec_jax.algorithms.td"]


def test_no_import_cycle():
    assert cycles(graph(FILES)) == []


def test_no_private_name_of_another_module():
    assert private_imports(FILES) == []


def test_every_module_has_a_layer():
    assert [m for m in FILES if layer_of(m) is None] == []


def test_imports_go_down_the_layers():
    assert upward_imports(FILES) == []


# ------------------------------------------------------------------ the checks can fail

@pytest.fixture
def copy(tmp_path):
    lib = shutil.copytree(LIB, tmp_path / "bec_jax", ignore=shutil.ignore_patterns("__pycache__"))
    exp = shutil.copytree(EXPERIMENTS, tmp_path / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    return str(lib), str(exp)


def _append(path: str, code: str) -> None:
    with open(path, "a") as f:
        f.write("\n\n" + code + "\n")


def test_an_injected_cycle_is_found(copy):
    lib, exp = copy
    # An import inside a function, the kind that used to hide a cycle.
    _append(os.path.join(lib, "mdp.py"), "def _late():\n    from bec_jax.run import runner  # noqa\n")
    files = module_files(lib, exp)
    found = cycles(graph(files))
    assert any("bec_jax.mdp" in c and "bec_jax.run.runner" in c for c in found), found
    assert "bec_jax.mdp (core) imports bec_jax.run.runner (runner)" in upward_imports(files)


def test_an_injected_private_import_is_found(copy):
    lib, exp = copy
    _append(os.path.join(lib, "theory", "verdicts.py"), "from bec_jax.mdp import _secret  # noqa\n"
                "from bec_jax.theory import expected_updates as an\nx = an._hidden\n")
    found = private_imports(module_files(lib, exp))
    assert any(f.startswith("bec_jax.theory.verdicts:") and f.endswith("imports bec_jax.mdp._secret") for f in found)
    assert any(f.startswith("bec_jax.theory.verdicts:") and f.endswith("uses bec_jax.theory.expected_updates._hidden") for f in found)


def test_an_unplaced_module_is_found(copy):
    lib, exp = copy
    _append(os.path.join(lib, "newthing.py"), "X = 1")
    files = module_files(lib, exp)
    assert [m for m in files if layer_of(m) is None] == ["bec_jax.newthing"]


def test_the_engine_imports_no_front():
    assert engine_imports_of_fronts(FILES) == []
    # and no front is ever named in its code, even as a string
    for m, path in FILES.items():
        if m.startswith("bec_jax.engine"):
            src = open(path).read()
            assert not any(f in src for f in FRONTS), m


def test_few_modules_at_the_top():
    assert len(top_level_modules()) <= MAX_TOP_LEVEL, top_level_modules()


def test_no_facade():
    assert facades(FILES) == []


def test_no_oversized_module_or_function():
    assert oversized() == []


def test_an_engine_importing_a_front_is_found(copy):
    lib, exp = copy
    _append(os.path.join(lib, "engine", "clock.py"), "def _late():\n    from bec_jax.control import spec  # noqa: F401\n")
    files = module_files(lib, exp)
    new = set(engine_imports_of_fronts(files)) - set(engine_imports_of_fronts(FILES))
    assert new == {"bec_jax.engine.clock imports bec_jax.control.spec"}
    assert "bec_jax.engine.clock (engine) imports bec_jax.control.spec (results and specs)" in upward_imports(files)


def test_a_crowded_top_level_is_found(copy):
    lib, _ = copy
    for i in range(MAX_TOP_LEVEL + 1 - len(top_level_modules())):
        _append(os.path.join(lib, f"extra{i}.py"), "X = 1")
    assert len(top_level_modules(lib)) == MAX_TOP_LEVEL + 1


def test_an_injected_facade_is_found(copy):
    lib, exp = copy
    _append(os.path.join(lib, "theory", "verdicts.py"), "from bec_jax.mdp import *  # noqa\n")
    _append(os.path.join(lib, "run", "runner.py"), "from bec_jax.files import write_json  # noqa: F401\n")
    _append(os.path.join(lib, "stats.py"), "from bec_jax.files import write_json\n__all__ = ['write_json']\n")
    found = set(facades(module_files(lib, exp))) - set(facades(FILES))
    assert any(f.startswith("bec_jax.theory.verdicts:") and "star-imports bec_jax.mdp" in f for f in found), found
    assert any(f.startswith("bec_jax.run.runner:") and "noqa: F401" in f for f in found), found
    assert "bec_jax.stats re-exports write_json in __all__" in found, found


def test_an_oversized_function_is_found(copy):
    lib, _ = copy
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    _append(os.path.join(lib, "stats.py"), "def too_long():\n" + body)
    assert set(oversized(lib)) - set(oversized()) == {f"bec_jax.stats.too_long: {MAX_FUNCTION_LINES + 1} lines"}
