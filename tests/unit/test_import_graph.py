"""The import graph of the project's own modules (everything under libs/ and services/), read
with ``ast`` without importing anything:

- no import cycles, inside a package (one adapter) as well as between packages, and none
  either when the imports under ``if TYPE_CHECKING:`` are counted (a cycle of types is a
  layering one: a lower module naming a higher one's class);
- flowmq_queue does not import flowmq_kas3 (the queue engine is independent of stream storage);
- flowmq_core and flowmq_wire import no other project package (they are the bottom layers).

An edge is an import statement anywhere in a module (a function's body included), relative
imports resolved, except (unless asked for) those under ``if TYPE_CHECKING:`` (they never
run). ``from p import n`` depends on ``p`` and, if it is a module, on ``p.n``; an import of a
module's own ancestor package is no edge (Python initialises that package first anyway)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = (ROOT / "libs", ROOT / "services")


def project_modules(roots: tuple[Path, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``roots`` (a package is named by
    its ``__init__.py``)."""
    found: dict[str, Path] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, type_checking: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree``, except the bodies of ``if TYPE_CHECKING:`` unless
    ``type_checking``."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and not type_checking and _is_type_checking(node.test):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))
    return found


def _imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names ``node`` imports, relative ones made absolute."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph(modules: dict[str, Path], type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports (also under ``if TYPE_CHECKING:`` if
    ``type_checking``)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in _imports(tree, type_checking):
            for name in _imported_names(node, module, path.name == "__init__.py"):
                while name and name not in modules:  # ``p.n`` where n is not a module: p
                    name = name.rpartition(".")[0]
                if name and name != module and not module.startswith(name + "."):
                    graph[module].add(name)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm),
    each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def _describe(cycle: list[str], graph: dict[str, set[str]]) -> str:
    members = set(cycle)
    edges = "; ".join(
        f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in cycle if graph[m] & members
    )
    return f"{' / '.join(cycle)}\n    ({edges})"


def _seen_project(found: dict[str, set[str]]) -> dict[str, set[str]]:
    # The walk must have seen the project, or every assertion below would hold vacuously.
    assert len(found) > 50, sorted(found)
    assert "flowmq_admin.app" in found["flowmq_broker.server"]
    return found


@pytest.fixture(scope="module")
def modules() -> dict[str, Path]:
    return project_modules(SOURCE_ROOTS)


@pytest.fixture(scope="module")
def graph(modules) -> dict[str, set[str]]:
    return _seen_project(import_graph(modules))


@pytest.fixture(scope="module")
def typed_graph(modules) -> dict[str, set[str]]:
    """The graph with the imports under ``if TYPE_CHECKING:`` too."""
    return _seen_project(import_graph(modules, type_checking=True))


def _assert_no_cycles(graph: dict[str, set[str]], what: str) -> None:
    cycles = import_cycles(graph)
    assert not cycles, f"{len(cycles)} {what}:\n" + "\n".join(_describe(c, graph) for c in cycles)


# --- the project -----------------------------------------------------------------------------
def test_no_import_cycles(graph):
    _assert_no_cycles(graph, "import cycle(s)")


def test_no_import_cycles_of_types_either(typed_graph):
    _assert_no_cycles(typed_graph, "import cycle(s) with type-only imports")


def _imports_from(graph: dict[str, set[str]], package: str, into) -> dict[str, list[str]]:
    """For each module of ``package``: the project modules it imports for which ``into(top
    package name)`` holds (only modules that have some)."""
    found = {
        m: sorted(t for t in graph[m] if into(t.partition(".")[0]))
        for m in graph
        if m.partition(".")[0] == package
    }
    return {m: targets for m, targets in found.items() if targets}


def test_queue_does_not_import_kas3(graph):
    offenders = _imports_from(graph, "flowmq_queue", lambda top: top == "flowmq_kas3")
    assert not offenders, f"flowmq_queue modules importing flowmq_kas3: {offenders}"


@pytest.mark.parametrize("package", ["flowmq_core", "flowmq_wire"])
def test_bottom_layers_import_no_other_project_package(graph, package):
    offenders = _imports_from(graph, package, lambda top: top != package)
    assert not offenders, f"{package} modules importing other project packages: {offenders}"


# --- the walk itself, on a small tree with a known shape -------------------------------------
def test_the_walk_finds_relative_and_lazy_imports_and_skips_type_checking(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "def f():\n    from .sub.c import x\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from ..a import y\nimport pkg.d\n",
        "pkg/d.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from pkg import a\nelse:\n    from pkg import e\n"
        ),
        "pkg/e.py": "from pkg.sub import c\nimport os\n",
        "other/__init__.py": "from pkg import helper_name\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(project_modules((tmp_path,)))
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.a", "pkg.d"},
        "pkg.d": {"pkg.e"},
        "pkg.e": {"pkg.sub", "pkg.sub.c"},
        "other": {"pkg"},
    }
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.d", "pkg.e", "pkg.sub.c"]]
    # counted when asked for: d's type-only import of a
    typed = import_graph(project_modules((tmp_path,)), type_checking=True)
    assert typed["pkg.d"] == {"pkg.a", "pkg.e"}
