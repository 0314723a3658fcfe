"""The fenced code blocks of README.md and docs/*.md, for the tests that run
them as pasted.

Each block is preceded by an HTML comment saying how it is checked (see
tests/test_docs.py): `<!-- tested by tests/FILE.py::NAME -->`,
`<!-- run by tests/test_docs.py -->` or `<!-- not run: REASON -->`.
"""
from __future__ import annotations

import os
import re
from typing import NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")

# A fence opens with ``` and a language at the start of a line and closes with ```.
_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"^<!--\s*(.*?)\s*-->$")


class Block(NamedTuple):
    page: str      # "README.md" or "docs/<name>.md"
    line: int      # 1-based line of the opening fence
    lang: str
    code: str
    mark: str | None  # the HTML comment directly above the fence, without <!-- -->
    section: str   # the nearest heading above the block


def pages() -> list[str]:
    """README.md and every Markdown page under docs/, as paths from the repository root."""
    out = ["README.md"]
    for root, _, files in os.walk(DOCS):
        out += [os.path.relpath(os.path.join(root, f), REPO) for f in sorted(files) if f.endswith(".md")]
    return sorted(out)


def read(page: str) -> str:
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        return f.read()


def blocks(page: str) -> list[Block]:
    """Every fenced block of `page` in order."""
    text = read(page)
    out = []
    for m in _FENCE.finditer(text):
        before = text[:m.start()]
        last = before.rstrip("\n").rsplit("\n", 1)[-1] if before.endswith("\n") else ""
        mark = _MARK.match(last) if before.endswith("-->\n") else None
        heads = re.findall(r"^#{1,6} (.*)$", before, re.M)
        out.append(Block(page, before.count("\n") + 1, m.group(1), m.group(2),
                         mark.group(1) if mark else None, heads[-1] if heads else ""))
    return out


def code(page: str, lang: str, *, section: str | None = None, containing: str | None = None) -> str:
    """The one block of `lang` in `page` (under the heading `section`, if given, and
    containing `containing`, if given): an error unless exactly one matches."""
    found = [b.code for b in blocks(page) if b.lang == lang
             and (section is None or b.section == section)
             and (containing is None or containing in b.code)]
    assert len(found) == 1, f"{page}: {len(found)} {lang} blocks match section={section!r} containing={containing!r}"
    return found[0]
