"""ppdist's modules import one another one way: the import graph has no cycle.

Every import counts, also one inside a function (a function-local import that hides a cycle is
a cycle) and ``importlib.import_module("ppdist...")`` with a literal name; imports under
``if TYPE_CHECKING:`` do not run and are left out. Importing ``ppdist.a.b`` also runs the
package ``ppdist.a`` (its ``__init__``), so that is an edge too. The root package ``ppdist`` is
the Python API on top of everything: no module of the package imports it. A module inside a
package may import its siblings while the package's ``__init__`` imports them (the registration
pattern); a module outside depends on the ``__init__`` of every package it imports from.
"""

from __future__ import annotations

import ast
import os
from typing import Dict, Iterator, List, Set

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "ppdist"


def module_files() -> Dict[str, str]:
    """``{module name: file}`` of every module of the package (packages by their ``__init__``)."""
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, PACKAGE)):
        for name in files:
            if not name.endswith(".py"):
                continue
            parts = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = os.path.join(folder, name)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def imported_names(module: str, path: str) -> Iterator[str]:
    """Dotted names ``module`` imports (``from a import b`` gives ``a.b``; resolved later)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    is_package = path.endswith("__init__.py")
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value


def import_graph() -> Dict[str, Set[str]]:
    """``{module: modules it imports}`` within the package, parent packages included."""
    files = module_files()
    graph: Dict[str, Set[str]] = {name: set() for name in files}
    for module, path in files.items():
        for name in imported_names(module, path):
            if not (name == PACKAGE or name.startswith(PACKAGE + ".")):
                continue
            while name not in files:  # ``from pkg.mod import function``: the module ``pkg.mod``
                name = name.rpartition(".")[0]
            graph[module].add(name)
            parts = name.split(".")
            for depth in range(2, len(parts)):  # ppdist.a.b runs the package ppdist.a first ...
                package = ".".join(parts[:depth])
                if not (module + ".").startswith(package + "."):  # ... unless the importer is part of it
                    graph[module].add(package)
            graph[module].discard(module)
            if name == PACKAGE and module != PACKAGE:
                graph[module].add(PACKAGE)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_the_root_api():
    graph = import_graph()
    offenders = sorted(module for module, targets in graph.items() if PACKAGE in targets)
    assert not offenders, f"import the defining module instead of the package {PACKAGE!r}: {offenders}"


def test_the_import_graph_has_no_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (every import counts, function-local ones too):\n" + "\n".join(
        " <-> ".join(component) for component in found
    )


def test_the_checker_sees_function_local_imports_and_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    names = list(imported_names("ppdist.x", os.path.join(ROOT, "tests", "test_import_graph.py")))
    assert "ast" in names and "typing.Set" in names


def folder_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """The import graph between the package's folders and top-level modules (``ppdist.engine``,
    ``ppdist.metrics``, ``ppdist.cli``, ...): an edge when any module of one imports one of the other."""

    def folder(module: str) -> str:
        return ".".join(module.split(".")[:2])

    folders: Dict[str, Set[str]] = {}
    for module, targets in graph.items():
        edges = folders.setdefault(folder(module), set())
        edges.update(folder(t) for t in targets if folder(t) != folder(module))
    return folders


def test_the_package_folders_form_no_import_circle():
    """One layer per folder: metrics hand picture data to visualize (which imports metrics.report),
    the optimizers live in ppdist.optim (not in the engine that uses them), the browser sits above
    the components it builds; a new import that closes a circle between folders fails here."""
    graph = import_graph()
    folders = folder_graph(graph)
    found = cycles(folders)
    witnesses = [
        f"{module} -> {target}"
        for component in found
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if ".".join(module.split(".")[:2]) in component
        and ".".join(target.split(".")[:2]) in component
        and ".".join(module.split(".")[:2]) != ".".join(target.split(".")[:2])
    ]
    assert not found, (
        "folders importing one another in a circle:\n"
        + "\n".join(" <-> ".join(component) for component in found)
        + "\nthrough:\n"
        + "\n".join(witnesses)
    )


def test_the_folder_check_sees_a_circle_between_folders():
    graph = {"ppdist.a.x": {"ppdist.b.y"}, "ppdist.b.y": set(), "ppdist.b.z": {"ppdist.a"}, "ppdist.a": set()}
    assert cycles(folder_graph(graph)) == [["ppdist.a", "ppdist.b"]]
