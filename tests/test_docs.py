"""The documentation's code cannot rot: every Python block is a whole program, and runs.

Each block of README.md and docs/ is complete as written (imports, ``asyncio.run``,
local nodes at ``localhost:6379``-``6381``, what ``python -m aiolock servers 3 --port
6379`` runs): it is run in a process of its own, as a reader who pasted it would, against
three servers this test starts (its ports put in place of 6379-6381). Blocks that define
``test_*`` functions (the testing how-to) have them run too. Whole programs in
``examples/`` are shown through snippets (``--8<--``, which ``mkdocs build --strict``
refuses when a file or section is missing) and run by ``test_examples.py``.

The servers are started a moment before the blocks run, while a reader's have been up
for a while: the blocks that use them run with the suite's ``restart_grace=0`` default
(conftest.py). Blocks that start servers of their own run exactly as written.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import aiolock
from aiolock.testing import Servers, find_server_binary, redis_servers

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
#: The API contract (a copy of the project's API.md) writes signatures, not code.
SIGNATURES = ROOT / "docs" / "reference" / "contract.md"
#: A fenced Python block, also indented (in a list item).
BLOCK = re.compile(r"^([ \t]*)```python\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
#: The local nodes the blocks name.
LOCAL = re.compile(r"(localhost|127\.0\.0\.1):(6379|6380|6381)\b")
#: How a block runs: the suite's restart_grace default unless the block starts its own
#: servers, the block as ``__main__``, then any ``test_*`` coroutine functions it made.
RUNNER = """
import asyncio, functools, inspect, sys
import aiolock
source, where, waive = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if waive:
    original = aiolock.LockManager.__init__
    @functools.wraps(original)
    def init(self, nodes, **kwargs):
        kwargs.setdefault("restart_grace", 0)
        original(self, nodes, **kwargs)
    aiolock.LockManager.__init__ = init
namespace = {"__name__": "__main__"}
exec(compile(source, where, "exec"), namespace)
for name, value in list(namespace.items()):
    if name.startswith("test_") and inspect.iscoroutinefunction(value):
        asyncio.run(value())
        print("ran", name)
"""


def blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        if page == SIGNATURES:
            continue
        for i, match in enumerate(BLOCK.finditer(page.read_text())):
            source = textwrap.dedent(match.group(2))
            if "--8<--" not in source:
                out.append((f"{page.relative_to(ROOT)}#{i}", source))
    return out


def test_the_docs_have_python_blocks_and_pages() -> None:
    assert len(PAGES) > 15
    assert len(blocks()) > 15


@pytest.fixture(scope="module")
async def local_nodes() -> AsyncIterator[Servers]:
    """Three servers on consecutive ports, standing for localhost:6379-6381."""
    if find_server_binary() is None:
        pytest.skip("no local server binary")
    for base in range(20000, 60000, 997):
        try:
            async with redis_servers(3, port=base) as urls:
                yield urls
                return
        except RuntimeError:
            continue  # a port taken: another base
    pytest.fail("no three consecutive free ports")


@pytest.mark.parametrize(("where", "source"), blocks(), ids=[w for w, _ in blocks()])
async def test_a_python_block_runs_as_written(
    where: str, source: str, local_nodes: Servers
) -> None:
    assert "asyncio.run(" in source or "async def test_" in source or "LockManager(" in source, (
        f"{where}: not a whole program (no asyncio.run, no test function)"
    )
    ports = {str(6379 + i): str(server.port) for i, server in enumerate(local_nodes.servers)}
    program = LOCAL.sub(lambda m: f"{m.group(1)}:{ports[m.group(2)]}", source)
    waive = "redis_servers(" not in source
    result = subprocess.run(  # noqa: ASYNC221 (the block's own process, a few seconds)
        [sys.executable, "-c", RUNNER, program, where, "1" if waive else "0"],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, f"{where}:\n{result.stdout}\n{result.stderr[-3000:]}"
    if "async def test_" in source:
        assert "ran test_" in result.stdout


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
