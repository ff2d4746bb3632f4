"""The package's shape: no import circle, small modules (see CONTRIBUTING.md's map)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aiolock"
#: The longest module, in lines: one job per module.
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports, at any level.

    ``TYPE_CHECKING`` imports count: a circle there is as real a coupling.
    """
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
                if node.module is None:
                    found.update(f"{target}.{alias.name}" for alias in node.names)
                else:
                    found.add(target)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiolock"):
                found.add(node.module or "")
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("aiolock."))
        graph[name] = found
    return {name: {d for d in deps if d in graph and d != name} for name, deps in graph.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    circles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                circles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    return circles


def test_the_import_graph_is_read() -> None:
    graph = _imports()
    assert "aiolock._engine" in graph["aiolock._manager"]
    assert "aiolock._renewal" in graph["aiolock._lock"]  # a TYPE_CHECKING import
    assert "aiolock.testing._servers" in graph["aiolock.testing"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_module_of_the_package_imports_the_package_itself() -> None:
    # ``from aiolock import X`` inside aiolock is a circle through __init__ (which
    # imports the modules): each module imports the module it needs.
    graph = _imports()
    assert [name for name, deps in graph.items() if name != "aiolock" and "aiolock" in deps] == []


def test_no_import_circle_among_the_package_modules() -> None:
    # The handles import the engine; the engine never the handles; the manager both.
    assert _circles(_imports()) == []


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_no_module_is_over_the_line_limit(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.name}: {lines} lines, split it by job"
