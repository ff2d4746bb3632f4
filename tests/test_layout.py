"""The package's shape: layers that import only what they may (CONTRIBUTING.md's map).

The package is a stack of layers, each a folder (or a module), each naming the layers it
may import; an arrow that goes anywhere else is either mended or written in
``ALLOWED`` with its reason. ``TYPE_CHECKING`` imports count: a circle or an arrow up
there is as real a coupling. Size follows cohesion: a module over ``LONG_MODULE`` lines
of code (docstrings, comments and blank lines not counted) says why in its docstring.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aiolock"

#: Each layer, top first, with the modules (prefixes of dotted names) it holds.
LAYERS: dict[str, tuple[str, ...]] = {
    # What users and the command line meet: configuration, life cycle, the CLI, bench.
    "face": (
        "aiolock",
        "aiolock.__main__",
        "aiolock._cli",
        "aiolock._bench",
        "aiolock._manager",
        "aiolock._campaign",
        "aiolock._ready",
        "aiolock.telemetry",
    ),
    "handles": ("aiolock._handles",),  # Lock, Semaphore, LockMany, ...: no Lua, no nodes
    "engine": ("aiolock._engine",),  # the one facade the handles call
    "waiting": ("aiolock._waiting",),  # local queues, turns, grants, handoffs
    "quorum": ("aiolock._quorum",),  # the fan-out and the renewal
    "io": ("aiolock._io",),  # connections, pub/sub, clusters, the redis-py seam
    "core": ("aiolock._core",),  # pure logic: votes, holds, fencing, keys, errors
    "lua": ("aiolock._lua",),  # the scripts, one file each
    "testing": ("aiolock.testing",),  # public: local servers, the delaying proxy
}
#: The layers each layer may import (besides modules of its own layer).
MAY_IMPORT: dict[str, frozenset[str]] = {
    "face": frozenset(LAYERS) - {"face"},
    "handles": frozenset({"engine", "core"}),
    "engine": frozenset({"waiting", "quorum", "io", "core", "lua"}),
    "waiting": frozenset({"quorum", "io", "core", "lua"}),
    "quorum": frozenset({"core", "lua"}),
    "io": frozenset({"core", "lua"}),
    "core": frozenset({"lua"}),
    "lua": frozenset(),
    "testing": frozenset(),
}
#: Arrows that break the layers, each with why it stands.
ALLOWED: dict[tuple[str, str], str] = {
    ("aiolock._handles.rwlock", "aiolock._lua"): (
        "a read-write lock's handles name the scripts of their own key layout (reader, "
        "writer, release) for the engine's fan-out to run; no Lua is written here"
    ),
    ("aiolock._handles.semaphore", "aiolock._lua"): (
        "a semaphore names the scripts of its slots and index, and reads SEM_CHECKS, "
        "the number of slots its script reports; no Lua is written here"
    ),
}
#: The longest chain of imports under ``import aiolock`` (modules, aiolock included).
MAX_CHAIN = 13
#: Lines of code past which a module says, in its docstring, why it is one module.
LONG_MODULE = 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _imports() -> dict[str, frozenset[str]]:
    """Each module of the package and the package modules it imports, at any level."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiolock"):
                found.add(node.module or "")
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("aiolock."))
        graph[name] = found
    # A package's own __init__ is not an arrow of its modules (they import its modules).
    return {
        name: frozenset(
            d for d in deps if d in graph and d != name and not name.startswith(d + ".")
        )
        for name, deps in graph.items()
    }


def _layer(module: str) -> str:
    best = max(
        (prefix for prefixes in LAYERS.values() for prefix in prefixes if _under(module, prefix)),
        key=len,
    )
    return next(layer for layer, prefixes in LAYERS.items() if best in prefixes)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _circles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
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


def longest_chain(graph: dict[str, frozenset[str]], start: str = "aiolock") -> list[str]:
    """The longest path of imports from ``start`` (the graph has no circle)."""
    memo: dict[str, list[str]] = {}

    def walk(name: str) -> list[str]:
        if name not in memo:
            below = [walk(dep) for dep in sorted(graph[name])]
            memo[name] = [name, *max(below, key=len, default=[])]
        return memo[name]

    return walk(start)


def _arrows_across_layers() -> dict[tuple[str, str], str]:
    """Every arrow that goes to a layer its module may not import: (from, to) -> layers."""
    wrong = {}
    for name, deps in _imports().items():
        here = _layer(name)
        for dep in deps:
            there = _layer(dep)
            if there != here and there not in MAY_IMPORT[here]:
                wrong[name, dep] = f"{here} -> {there}"
    return wrong


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not comments, not docstrings."""
    lines: set[int] = set()
    docstrings = {
        node.body[0].value.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    }
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in skip or token.type == tokenize.ENDMARKER:
            continue
        if token.type == tokenize.STRING and token.start[0] in docstrings:
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines)


def test_the_import_graph_is_read() -> None:
    graph = _imports()
    assert "aiolock._engine" in graph["aiolock._manager"]
    assert "aiolock._quorum.renewal" in graph["aiolock._engine"]
    assert "aiolock.testing._servers" in graph["aiolock.testing"]
    assert "aiolock._handles" not in graph["aiolock._handles.lock"]
    assert _circles({"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"})}) == [
        ["a", "b", "c", "a"]
    ]
    diamond = {"a": frozenset({"b", "c"}), "b": frozenset({"c"}), "c": frozenset()}
    assert longest_chain(diamond, "a") == ["a", "b", "c"]
    assert (
        code_lines('"""Doc.\n\nMore."""\n\n# note\nx = 1  # one\n\n\ndef f():\n    """Doc."""\n')
        == 2
    )


def test_every_module_is_in_a_layer_and_every_layer_names_what_it_may_import() -> None:
    assert set(MAY_IMPORT) == set(LAYERS)
    for name in _imports():
        assert _layer(name) in LAYERS


def test_no_module_of_the_package_imports_the_package_itself() -> None:
    # ``from aiolock import X`` inside aiolock is a circle through __init__ (which
    # imports the modules): each module imports the module it needs.
    graph = _imports()
    assert [name for name, deps in graph.items() if name != "aiolock" and "aiolock" in deps] == []


def test_no_import_circle_among_the_package_modules() -> None:
    assert _circles(_imports()) == []


def test_each_layer_imports_only_the_layers_it_may_or_an_arrow_allowed_with_its_reason() -> None:
    wrong = _arrows_across_layers()
    assert {arrow: layers for arrow, layers in wrong.items() if arrow not in ALLOWED} == {}


def test_every_allowed_arrow_is_still_drawn() -> None:
    # An arrow mended leaves the list: the list only shrinks.
    assert set(ALLOWED) <= set(_arrows_across_layers())
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_longest_chain_of_imports_is_no_longer_than_the_bound() -> None:
    chain = longest_chain(_imports())
    assert len(chain) <= MAX_CHAIN, " > ".join(chain)


def test_the_command_line_loads_the_testing_helpers_and_the_benchmarks_only_when_run() -> None:
    # aiolock.testing is for users' tests, the demo and the benchmarks; _bench imports
    # it, and is imported by the `bench` command alone: `import aiolock` and the
    # command line's start-up load neither.
    tree = ast.parse((PACKAGE / "_cli.py").read_text())
    top_level = {
        alias.name if node.module is None else node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert {"testing", "_bench"} & top_level == set()
    graph = _imports()
    assert not any(
        _under(dep, "aiolock._bench")
        for name, deps in graph.items()
        if name != "aiolock._cli"
        for dep in deps
        if not _under(name, "aiolock._bench")
    )


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_a_long_module_says_why_it_is_one(path: Path) -> None:
    source = path.read_text()
    if code_lines(source) > LONG_MODULE:
        docstring = ast.get_docstring(ast.parse(source)) or ""
        assert "One module because" in docstring, f"{path.name}: {code_lines(source)} code lines"


def test_no_two_classes_of_the_package_share_a_name() -> None:
    # One word per thing (CONTRIBUTING.md's glossary): a class is found by its name.
    seen: dict[str, str] = {}
    twice = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where = str(path.relative_to(PACKAGE))
                if node.name in seen:
                    twice.append((node.name, seen[node.name], where))
                seen.setdefault(node.name, where)
    assert twice == []


#: How history reads in text: a seed that failed, an issue's number, a session; also
#: across a line break (a comment's next line begins with its marker).
_BREAK = r"\s+(?:(?:#|--)\s*)?"
HISTORY = re.compile(
    rf"\bseeds?{_BREAK}(?:v\d+:)?\d{{4,}}|\bissue{_BREAK}\d+|\b[a-z]+th{_BREAK}session\b"
)


def test_the_package_and_the_guides_say_what_is_not_how_it_came_to_be() -> None:
    # History lives in CHANGELOG.md, commit messages and docs/project/findings.md (with
    # the engineering log and the performance history): a comment or a guide gives the
    # reason itself, not the seed or the issue that taught it.
    root = PACKAGE.parent
    history = {"changelog.md", "engineering-log.md", "findings.md", "performance-history.md"}
    texts = [
        *PACKAGE.rglob("*.py"),
        *PACKAGE.rglob("*.lua"),
        root / "README.md",
        root / "CONTRIBUTING.md",
        *(p for p in (root / "docs").rglob("*.md") if p.name not in history),
    ]
    found = [
        f"{path.relative_to(root)}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
        for path in texts
        for text in [path.read_text()]
        for match in HISTORY.finditer(text)
    ]
    assert found == []


#: What a test's comment may not say either: a seed names the schedule that shows a
#: behaviour (docs/project/findings.md), but an issue, a commit, a date or an earlier
#: version of the code is history (CONTRIBUTING.md, "Style").
TEST_HISTORY = re.compile(
    r"\bissues? \d+|\b(?:on|at) [0-9a-f]{7}\b|\bold code\b|\b[a-z]+th session\b"
    r"|\b20\d\d-\d\d-\d\d\b",
    re.IGNORECASE,
)


def test_the_tests_say_what_is_not_how_it_came_to_be() -> None:
    root = PACKAGE.parent
    kept = root / "tests" / "sim" / "kept.py"  # (the findings' record, prose and all)
    found = [
        f"{path.relative_to(root)}:{n}: {match.group(0)}"
        for path in sorted((root / "tests").rglob("*.py"))
        if path != kept
        for n, line in enumerate(path.read_text().splitlines(), 1)
        for match in [TEST_HISTORY.search(line)]
        if match is not None
    ]
    assert found == []


def test_no_function_of_the_package_is_excused_from_the_function_limits() -> None:
    # ruff's C901, PLR0915 and PLR1702 (pyproject.toml) hold every function of aiolock/:
    # one over them is split, not excused.
    excused = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "noqa" in line and any(rule in line for rule in ("C901", "PLR0915", "PLR1702"))
    ]
    assert excused == []


def test_cancellation_is_shielded_only_through_the_one_helper() -> None:
    # _core/cancel.py: shielded(), outlast(), join(); one idiom at every site.
    elsewhere = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "cancel.py" and "testing" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "CancelScope(shield" in line or "asyncio.shield(" in line
    ]
    assert elsewhere == []


def test_the_tests_reach_a_managers_engine_only_through_the_seam() -> None:
    # tests/seam.py is the one door (the simulation, which drives the engine itself,
    # and the named mutants, which quote the library's code, aside).
    tests = Path(__file__).resolve().parent
    aside = {"seam.py", "mutants.py", "test_layout.py"}
    reaching = [
        f"{path.relative_to(tests)}:{n}"
        for path in sorted(tests.rglob("*.py"))
        if path.name not in aside and "sim" not in path.relative_to(tests).parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "._engine" in line.replace("aiolock._engine", "")
    ]
    assert reaching == []
