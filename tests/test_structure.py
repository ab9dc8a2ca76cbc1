"""The project's imports: no cycle anywhere, and layers only point down (cli -> export -> zoo ->
registry, docs/architecture.md). Read from the source with ast, so nothing is imported.

Importing `a.b.c` runs the package `a.b`'s __init__ first, so it counts as an import of `a.b`
too: a table in a package's __init__ that imports a module which imports a sibling through
that package is a cycle at run time, even when no two modules name each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"cli": 3, "export": 2, "zoo": 1, "registry": 0}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    files = [ROOT / "cli.py", *(p for top in ("export", "zoo", "registry")
                                for p in (ROOT / top).rglob("*.py"))]
    return {module_name(path): path for path in files}


def imported_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):  # function-level imports count: they run too
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imported in imported_names(ast.parse(path.read_text(encoding="utf-8"))):
            parts = imported.split(".")
            # every package on the way is initialised; the longest known prefix is the module
            targets = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
            for target in targets & modules.keys():
                if target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    layer = lambda module: LAYERS[module.split(".")[0]]  # noqa: E731
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if layer(b) > layer(a))


def test_the_project_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph(project_modules()))
    assert cycle is None, " -> ".join(cycle)


def test_imports_point_down_the_layers() -> None:
    assert upward_imports(import_graph(project_modules())) == []


def test_the_checks_find_what_they_are_for() -> None:
    """The two checks on a made-up graph: a package-init cycle and an upward import."""
    graph = {"export.families": {"export.families.decoder"},
             "export.families.decoder": {"export.checks.cases"},
             "export.checks.cases": {"export.families"},
             "zoo.build": {"export.families"}}
    assert find_cycle(graph) == ["export.checks.cases", "export.families",
                                 "export.families.decoder", "export.checks.cases"]
    assert upward_imports(graph) == ["zoo.build -> export.families"]


def test_importing_a_submodule_counts_as_importing_its_package(tmp_path: Path) -> None:
    tree = ast.parse("from export.family import Case\nimport export.families.decoder\n")
    assert imported_names(tree) == {"export.family", "export.family.Case",
                                    "export.families.decoder"}
