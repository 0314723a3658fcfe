"""The documentation: the strict site build, the API reference's coverage, the
README's size and links, and every fenced code block of README.md and docs/.

Every block is preceded by an HTML comment that says how it is checked:

- `<!-- tested by tests/FILE.py::NAME -->`: NAME (a test or a fixture) reads the
  block from its page and runs it; checked here: NAME exists and its source names
  the page.
- `<!-- run by tests/test_docs.py -->`: run here as pasted (Python in a fresh
  process, bash by bash), in an empty directory.
- `<!-- not run: REASON -->`: a reason of a few words; any `tests/FILE.py::NAME` it
  names must exist.

Every `bec-jax` command line of every bash block, run or not, must parse.
"""
from __future__ import annotations

import ast
import os
import pkgutil
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
import yaml
from docs_blocks import REPO, Block, blocks, code, pages, read

import bec_jax

ALL = [b for p in pages() for b in blocks(p)]
RUN_HERE = "run by tests/test_docs.py"
TEST_REF = re.compile(r"tests/([\w/]+\.py)::(\w+)")
ENV = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
       "BEC_JAX_CPU_DEVICES": "1"}


def _functions(path: str) -> dict[str, str]:
    """{name: source} of the module-level functions of a test file."""
    text = open(os.path.join(REPO, path)).read()
    return {n.name: ast.get_source_segment(text, n) for n in ast.parse(text).body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _id(b: Block) -> str:
    return f"{b.page}:{b.line}"


# ------------------------------------------------------------------ every block is checked

def test_blocks_were_found():
    assert len(ALL) >= 30 and {b.page for b in ALL} >= {"README.md", "docs/agents.md", "docs/theory.md"}


@pytest.mark.parametrize("b", ALL, ids=_id)
def test_every_block_says_how_it_is_checked(b):
    assert b.mark is not None, f"{_id(b)}: no <!-- tested by / run by / not run: --> comment above the block"
    if b.mark.startswith("tested by "):
        m = TEST_REF.fullmatch(b.mark[len("tested by "):].strip())
        assert m, f"{_id(b)}: expected 'tested by tests/FILE.py::NAME', got {b.mark!r}"
        funcs = _functions(os.path.join("tests", m.group(1)))
        assert m.group(2) in funcs, f"{_id(b)}: tests/{m.group(1)} has no function {m.group(2)}"
        assert b.page in funcs[m.group(2)], f"{_id(b)}: {m.group(2)} does not read {b.page}"
    elif b.mark == RUN_HERE:
        assert b.lang in ("python", "bash"), f"{_id(b)}: only python and bash blocks are run here"
    elif b.mark.startswith("not run:"):
        reason = b.mark[len("not run:"):].strip()
        assert len(reason.split()) >= 3, f"{_id(b)}: 'not run' needs a reason, got {reason!r}"
        for file, name in TEST_REF.findall(reason):
            assert name in _functions(os.path.join("tests", file)), f"{_id(b)}: tests/{file}::{name} does not exist"
    else:
        pytest.fail(f"{_id(b)}: unknown mark {b.mark!r}")


def test_the_mark_check_can_fail():
    """A block without a mark, a test that does not read the page, a bare 'not run'."""
    bad = [Block("docs/x.md", 1, "python", "1\n", None, ""),
           Block("docs/x.md", 1, "python", "1\n", "tested by tests/test_readme.py::test_agent_program_runs_as_pasted", ""),
           Block("docs/x.md", 1, "python", "1\n", "not run: slow", ""),
           Block("docs/x.md", 1, "python", "1\n", "not run: see tests/test_readme.py::nope for why", "")]
    for b in bad:
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            test_every_block_says_how_it_is_checked(b)


def _commands(block: str) -> list[list[str]]:
    """The `bec-jax` command lines of a bash block, continuations joined, comments and
    lines with placeholders (`...`, `$`, `<`) left out."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if line.startswith("bec-jax ") and not re.search(r"\.\.\.|\$|<", line):
            out.append(shlex.split(line)[1:])
    return out


def _check_command(argv: list[str]) -> bool:
    """Parses a command line; for `run`, `control` and `continuing` on sources
    found from the repository root, also builds its spec (which refuses an option
    the algorithm does not declare). True if the spec was built."""
    from bec_jax.cli import args as cli_args
    from bec_jax.cli import commands as cli
    args = cli.parse(argv)
    build = {"run": cli_args.spec_from_args, "control": cli_args.control_spec_from_args,
             "continuing": cli_args.continuing_spec_from_args}
    if args.command not in build or any(s in a for a in argv for s in (
            "--config", "--resume", "mine:", "mytasks:", "mymod:", "commute:", ".npz", ".toml")):
        return False
    build[args.command](args)
    return True


def test_every_command_line_parses(monkeypatch):
    monkeypatch.chdir(REPO)  # examples.gridworld is found from the repository root
    parsed = built = 0
    for b in ALL:
        if b.lang == "bash":
            for argv in _commands(b.code):
                try:
                    built += _check_command(argv)
                except (SystemExit, ValueError) as e:
                    pytest.fail(f"{_id(b)}: bec-jax {' '.join(argv)}: {e!r}")
                parsed += 1
    assert parsed >= 15 and built >= 6, (parsed, built)


@pytest.mark.parametrize("line", ["bec-jax run --env baird --algorithm td --alfa 0.1",
                                  "bec-jax run --env baird --algorithm td --alpha 0.1 --sampler nope",
                                  "bec-jax control --task maze --algorithm cq --alpha 0.1 --zeta 0.1"])
def test_a_stale_option_is_caught(line, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises((SystemExit, ValueError)):
        _check_command(_commands(line + "\n")[0])


# ------------------------------------------------------------------ the blocks run here

# The blocks of several seconds each (compiles of their own): run once by CI with the long checks.
LONG_BLOCKS = {"docs/continuing.md:156", "docs/your-mdp.md:10", "docs/concepts.md:57", "docs/continuing.md:239",
               "docs/agents.md:123", "docs/concepts.md:128"}


def test_the_long_blocks_are_blocks_that_run_here():
    """A line moved by an edit would leave a long block in the suite: each name must still be a block."""
    assert LONG_BLOCKS <= {_id(b) for b in ALL if b.mark == RUN_HERE}


@pytest.mark.parametrize("b", [pytest.param(b, marks=pytest.mark.long) if _id(b) in LONG_BLOCKS else b
                               for b in ALL if b.mark == RUN_HERE], ids=_id)
def test_block_runs_as_pasted(b, tmp_path):
    if b.lang == "python":
        (tmp_path / "block.py").write_text(b.code)
        argv = [sys.executable, "block.py"]
    else:
        argv = ["bash", "-ec", b.code]
    p = subprocess.run(argv, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{_id(b)}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    if "ctd_lambda" in b.code and b.lang == "bash":  # docs/your-mdp.md: 3 gammas x 2 alphas x 3 lambdas
        from bec_jax.prediction.results import SweepResult
        r = SweepResult.load(str(tmp_path / "runs" / "lambda_gamma"))
        assert r.num_points == 18 and list(r.grid)[:1] == ["gamma"] and r.alive[:, -1].min() == 50
    if "theory" in b.page:  # off-policy TD's ODE on the 2-state example: +0.2; CTD there is stable
        assert p.stdout.split()[:2] == ["0.2", "True"], p.stdout


@pytest.mark.long
def test_sweeps_page_runs_as_pasted(tmp_path, monkeypatch):
    """docs/sweeps.md's two command lines, the second on its TOML block saved as
    sweep.toml: the grids are what the block says."""
    from bec_jax.cli import commands as cli
    from bec_jax.prediction.results import SweepResult
    (tmp_path / "sweep.toml").write_text(code("docs/sweeps.md", "toml", containing='env = "baird"'))
    lines = _commands(code("docs/sweeps.md", "bash", containing="--config sweep.toml"))
    assert [a[0] for a in lines] == ["run", "run"]
    monkeypatch.chdir(tmp_path)
    for argv in lines:
        assert cli.main(argv) == 0
    boyan = SweepResult.load(str(tmp_path / "runs" / "boyan_ctdc"))
    assert boyan.num_points == 12 and boyan.seeds == 50 and np.isfinite(boyan.final).all()
    x = SweepResult.load(str(tmp_path / "runs" / "x"))
    assert sorted(set(x.grid["gamma"])) == [0.9, 0.99] and x.num_points == 8
    assert x.metrics == ("rmscbe", "rmspcbe") and x.spec.schedule.kind == "robbins_monro"


# ------------------------------------------------------------------ the site

def _mkdocs(config: str, site: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", config, "-d", site],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**ENV, "NO_MKDOCS_2_WARNING": "1"})


@pytest.mark.long
def test_strict_build_passes(tmp_path):
    """The README's build command (its strict build, into a temporary directory)."""
    assert "mkdocs build --strict" in code("README.md", "bash", containing="mkdocs build")
    p = _mkdocs(os.path.join(REPO, "mkdocs.yml"), str(tmp_path / "site"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    page = (tmp_path / "site" / "api" / "bec_jax.theory.expected_updates.html").read_text()
    assert "ode_eigenvalues" in page and "expected_update" in page  # the reference is generated


def test_strict_build_fails_on_a_broken_link_anchor_or_reference(tmp_path):
    """The same configuration on three small pages, each with one fault: the build
    fails and names each."""
    with open(os.path.join(REPO, "mkdocs.yml")) as f:
        cfg = yaml.safe_load(f)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [a page](nowhere.md) and [a section](other.md#no-such-heading).\n")
    (docs / "other.md").write_text("# Other\n\n## A heading\n\ntext\n")
    (docs / "ref.md").write_text("# Ref\n\n::: bec_jax.no_such_module\n")
    cfg.update(docs_dir=str(docs), nav=[{"Home": "index.md"}, {"Other": "other.md"}, {"Ref": "ref.md"}])
    for plugin in cfg["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [REPO]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(cfg))
    p = _mkdocs(str(tmp_path / "mkdocs.yml"), str(tmp_path / "site"))
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    assert "bec_jax.no_such_module" in out, out[-3000:]
    (docs / "ref.md").write_text("# Ref\n\n::: bec_jax.mdp\n")  # the reference fixed: the links still fail
    p = _mkdocs(str(tmp_path / "mkdocs.yml"), str(tmp_path / "site"))
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "nowhere.md" in out and "no-such-heading" in out, out[-3000:]


def _public_modules() -> list[str]:
    return ["bec_jax"] + sorted(m.name for m in pkgutil.walk_packages(bec_jax.__path__, "bec_jax.")
                                if not any(part.startswith("_") for part in m.name.split(".")))


def test_every_public_module_has_a_reference_page():
    with open(os.path.join(REPO, "mkdocs.yml")) as f:
        nav = yaml.safe_load(f)["nav"]
    api = next(item["API reference"] for item in nav if isinstance(item, dict) and "API reference" in item)
    in_nav = {list(entry.values())[0] for entry in api}
    for module in _public_modules():
        page = f"api/{module}.md"
        assert os.path.exists(os.path.join(REPO, "docs", page)), f"{module}: no docs/{page}"
        assert f"::: {module}\n" in read(f"docs/{page}"), f"docs/{page} does not render {module}"
        assert page in in_nav, f"{page} is not in mkdocs.yml's nav"
    assert len(in_nav) == len(_public_modules())


# ------------------------------------------------------------------ the README

def test_readme_is_short_and_its_links_resolve():
    text = read("README.md")
    assert len(text.splitlines()) <= 300
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [x for x in links if "://" not in x]
    assert len(local) >= 15
    for target in local:
        assert os.path.exists(os.path.join(REPO, target)), f"README links to {target}, which does not exist"
    # No commit hashes: 7-12 hex digits with both letters and digits.
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,12}\b", text) if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert not hashes, hashes


def test_readme_sections_in_the_issues_order():
    heads = re.findall(r"^## (.*)$", read("README.md"), re.M)
    assert [h.split(":")[0] for h in heads] == [
        "Install", "Set-up", "Quickstart 1", "Quickstart 2", "Quickstart 3", "A figure",
        "Against the tools you would otherwise use", "Documentation", "Citing and license"]
