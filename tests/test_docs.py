"""The documentation's code cannot rot: every Python block compiles, and every name it
uses from aiolock exists.

Whole programs are in ``examples/`` (run by ``test_examples.py``) and shown in the docs
through snippets (``--8<--``), which ``mkdocs build --strict`` (``nox -s docs``) refuses
when a file or section is missing. The blocks written in the pages are fragments (they
use a ``locks`` they do not create): each is compiled, top-level ``await`` allowed, and
its imports from aiolock, ``aiolock.X`` and ``locks.X`` are checked against the package.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import aiolock

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
#: The API contract (a copy of the project's API.md) writes signatures, not code.
SIGNATURES = ROOT / "docs" / "reference" / "contract.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        if page == SIGNATURES:
            continue
        for i, match in enumerate(BLOCK.finditer(page.read_text())):
            if "--8<--" not in match.group(1):
                out.append((f"{page.relative_to(ROOT)}#{i}", match.group(1)))
    return out


def test_the_docs_have_python_blocks_and_pages() -> None:
    assert len(PAGES) > 15
    assert len(blocks()) > 15


@pytest.mark.parametrize(("where", "source"), blocks(), ids=[w for w, _ in blocks()])
def test_a_python_block_compiles_and_names_what_exists(where: str, source: str) -> None:
    tree = compile(source, where, "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    assert isinstance(tree, ast.Module)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiolock"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                assert hasattr(module, alias.name), f"{where}: {node.module}.{alias.name}"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = {"aiolock": aiolock, "locks": aiolock.LockManager}.get(node.value.id)
            if owner is not None:
                assert hasattr(owner, node.attr), f"{where}: {node.value.id}.{node.attr}"
