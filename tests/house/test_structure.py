"""The project's imports: no cycle anywhere, and layers only point down (cli -> export -> zoo ->
runtime -> registry, docs/architecture.md); the `zoo` package root is the public facade, which
reaches up lazily (PEP 562); runtime/ imports only the libraries that run an export. Read from
the source with ast, so nothing is imported.

Importing `a.b.c` runs the package `a.b`'s __init__ first, so it counts as an import of `a.b`
too: a table in a package's __init__ that imports a module which imports a sibling through
that package is a cycle at run time, even when no two modules name each other.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {"cli": 4, "commands": 4, "export": 3, "zoo": 2, "runtime": 1, "registry": 0}
FACADES = {"zoo"}  # `import zoo`: the public API, its names imported on first use


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    files = [ROOT / "cli.py", *(p for top in LAYERS if (ROOT / top).is_dir()
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
                  if layer(b) > layer(a) and a not in FACADES)


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
             "zoo.assemble": {"export.families"}, "runtime.sessions": {"zoo.files.weights"},
             "zoo": {"export.api"}}
    assert find_cycle(graph) == ["export.checks.cases", "export.families",
                                 "export.families.decoder", "export.checks.cases"]
    assert upward_imports(graph) == ["runtime.sessions -> zoo.files.weights",
                                     "zoo.assemble -> export.families"]


def test_importing_a_submodule_counts_as_importing_its_package(tmp_path: Path) -> None:
    tree = ast.parse("from export.family import Case\nimport export.families.decoder\n")
    assert imported_names(tree) == {"export.family", "export.family.Case",
                                    "export.families.decoder"}


# Where a command starts (export/commands, the public API, the export pipeline) or an engine is
# opened (export/opening.py): the only modules that may turn a family name into its object.
# Everything below takes the family it is handed (`engine.family`), so it is resolved once.
FAMILY_TABLE = "export.families"
OPENERS = {"export.opening", "export.pipeline", "export.api"}


def family_table_importers(modules: dict[str, Path]) -> list[str]:
    graph = import_graph(modules)
    return sorted(name for name, targets in graph.items()
                  if FAMILY_TABLE in targets and not name.startswith(FAMILY_TABLE)
                  and name not in OPENERS and name != "export.commands")


def test_only_where_a_command_starts_is_the_family_table_looked_up() -> None:
    assert family_table_importers(project_modules()) == []


def test_the_family_table_check_finds_a_driver_that_looks_it_up(tmp_path: Path) -> None:
    """Planted: a generic driver importing the table is named; an opener is not."""
    (tmp_path / "export" / "families").mkdir(parents=True)
    for name in ("export/__init__.py", "export/families/__init__.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "export" / "opening.py").write_text("from export.families import family_of\n")
    (tmp_path / "export" / "writer.py").write_text("from export.families import family_of\n")
    modules = {"export": tmp_path / "export/__init__.py",
               "export.families": tmp_path / "export/families/__init__.py",
               "export.opening": tmp_path / "export/opening.py",
               "export.writer": tmp_path / "export/writer.py"}
    assert family_table_importers(modules) == ["export.writer"]


# Head sizes are derived in registry/sizes.py alone: a `d_model // n_heads` (or `/` in the
# JavaScript) anywhere else would be wrong for a card whose key/value heads or head size are
# set apart.
HEAD_ARITHMETIC = re.compile(r"d_model\W*\s*/+\s*\w*\W*n_heads")


def head_arithmetic(files: list[Path]) -> list[str]:
    return sorted(f"{path.relative_to(ROOT)}:{number}" for path in files
                  for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                  if HEAD_ARITHMETIC.search(line))


def product_sources() -> list[Path]:
    scripts = [p for folder in ("examples/node", "examples/web") for p in (ROOT / folder).glob("*")
               if p.suffix in (".js", ".mjs")]
    return [*project_modules().values(), *scripts]


def test_head_sizes_are_worked_out_in_one_place(tmp_path: Path) -> None:
    assert head_arithmetic([p for p in product_sources() if p != ROOT / "registry/sizes.py"]) == []
    planted = ROOT / "tests" / f"planted-{tmp_path.name}.py"  # both forms the code once had
    planted.write_text('head = card["d_model"] // card["n_heads"]\n'
                       "const dims = [1, card.n_heads, 0, card.d_model / card.n_heads];\n")
    try:
        assert [line.rsplit(":", 1)[1] for line in head_arithmetic([planted])] == ["1", "2"]
    finally:
        planted.unlink()


# A family's meaning is data (registry/families.py's FamilySpec): only the model's assembly, the
# family table, the registry's parameter arithmetic and the card validation may switch on a
# family's name (the pattern ../shared/tools/structure.py counts).
FAMILY_SWITCH = re.compile(
    r"""family\s*(==|!=|in\s*[\(\[\{])|==\s*["'](decoder|encoder|encoder-decoder)["']""")
SWITCHING = {"zoo/assemble.py", "export/families/__init__.py", "registry/params.py",
             "registry/schema.py"}


def family_switches(files: list[Path]) -> list[str]:
    return sorted(f"{path.relative_to(ROOT)}:{number}" for path in files
                  for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                  if FAMILY_SWITCH.search(line))


def test_only_four_files_switch_on_a_family_name(tmp_path: Path) -> None:
    found = family_switches(list(project_modules().values()))
    assert [hit for hit in found if hit.rsplit(":", 1)[0] not in SWITCHING] == []
    planted = ROOT / "tests" / f"planted-{tmp_path.name}.py"  # the forms the code once had
    planted.write_text('if card.family == "decoder":\n    pass\n'
                       'noun = "source" if card["family"] == "encoder-decoder" else "prompt"\n'
                       'if card.family in ("decoder", "encoder-decoder"):\n    pass\n')
    try:
        assert [line.rsplit(":", 1)[1] for line in family_switches([planted])] == ["1", "3", "4"]
    finally:
        planted.unlink()


# Running an export needs neither torch nor the exporter: runtime/ imports the standard library,
# the libraries that run a graph and read its files, and registry/ (jinja2, sentencepiece,
# Pillow and soundfile only inside the functions that read a chat template, MarianMT's files,
# an image or an audio file;
# starlette and uvicorn (and h11, uvicorn's HTTP parser, whose refusals the server words) only
# in runtime/serve/, `zoo serve`'s server; ray (the `ray` extra) only in
# runtime/serve/ray_app.py, which no module imports at load).
RUNTIME_LIBRARIES = {"numpy", "onnxruntime", "tokenizers", "yaml", "jinja2", "sentencepiece",
                     "llguidance", "PIL", "soundfile",
                     "registry", "runtime"}
SERVER_LIBRARIES = {"starlette", "uvicorn", "h11"}
RAY_MODULE = "runtime.serve.ray_app"


def foreign_imports(modules: dict[str, Path]) -> list[str]:
    allowed = RUNTIME_LIBRARIES | set(sys.stdlib_module_names)
    return sorted(f"{name} -> {imported}" for name, path in modules.items()
                  if name.split(".")[0] == "runtime"
                  for imported in imported_names(ast.parse(path.read_text(encoding="utf-8")))
                  if imported.split(".")[0] not in allowed
                  | (SERVER_LIBRARIES if name.startswith("runtime.serve") else set())
                  | ({"ray"} if name == RAY_MODULE else set()))


def test_the_runtime_imports_only_what_runs_an_export(tmp_path: Path) -> None:
    assert foreign_imports(project_modules()) == []
    planted = tmp_path / "sessions.py"
    planted.write_text("import numpy\n\ndef f():\n    import torch\n    from onnx import helper\n")
    assert foreign_imports({"runtime.sessions": planted}) == [
        "runtime.sessions -> onnx", "runtime.sessions -> onnx.helper", "runtime.sessions -> torch"]
    server = tmp_path / "app.py"  # the server's libraries only in the server's modules
    server.write_text("import uvicorn\nfrom starlette.routing import Route\n")
    assert foreign_imports({"runtime.serve.app": server, "runtime.exported": server}) == [
        "runtime.exported -> starlette.routing", "runtime.exported -> starlette.routing.Route",
        "runtime.exported -> uvicorn"]
    ray = tmp_path / "ray_app.py"  # Ray in the Ray module alone
    ray.write_text("import ray\nfrom ray import serve\n")
    assert foreign_imports({RAY_MODULE: ray, "runtime.serve.app": ray}) == [
        "runtime.serve.app -> ray", "runtime.serve.app -> ray.serve"]


def ray_imports(modules: dict[str, Path]) -> list[str]:
    """Ray imported anywhere but the Ray module, and the Ray module imported at load."""
    found = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if name != RAY_MODULE:
            found += [f"{name} -> {imported}" for imported in imported_names(tree)
                      if imported.split(".")[0] == "ray"]
        found += [f"{name} -> {RAY_MODULE} at load" for imported in top_level_imports(tree)
                  if imported.startswith(RAY_MODULE)]
    return sorted(set(found))


def test_ray_stays_in_its_module_imported_only_when_asked_for(tmp_path: Path) -> None:
    assert ray_imports(project_modules()) == []
    planted = tmp_path / "server.py"
    planted.write_text("from runtime.serve.ray_app import serve_on_ray\n\n"
                       "def f():\n    import ray\n")
    assert ray_imports({"runtime.serve.server": planted}) == [
        "runtime.serve.server -> ray", f"runtime.serve.server -> {RAY_MODULE} at load"]


# The house (issue #44): torch stays in zoo/ and export/; the command bodies that run an export
# (commands/) load nothing of torch, the exporter or zoo/ when their module is imported; the
# exporter's Family reaches neither the benchmarks nor the attention pictures (each registers
# what it does per family against the torch-free spec); a built-in block's name is spelled once.
TORCH_PACKAGES = {"zoo", "export"}
COMMAND_LIBRARIES = RUNTIME_LIBRARIES | {"click", "commands"}
FAMILY_MODULES = ("export.family", "export.families")
NOT_EXPORT = ("export.bench", "export.inspect")


def is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def load_time_nodes(node: ast.AST) -> list[ast.AST]:
    """The statements that run when a module is imported: everything but the bodies of its
    functions and lambdas (a try, an if, a with or a class body all run) and an
    `if TYPE_CHECKING:` block."""
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if is_type_checking(child):  # only its else branch runs
            for part in child.orelse:
                found += [part, *load_time_nodes(part)]
            continue
        found += [child, *load_time_nodes(child)]
    return found


def top_level_imports(tree: ast.Module) -> set[str]:
    """What a module imports when it is imported (not inside its functions)."""
    imports = [node for node in load_time_nodes(tree)
               if isinstance(node, (ast.Import, ast.ImportFrom))]
    return imported_names(ast.Module(body=imports, type_ignores=[]))


def torch_outside(modules: dict[str, Path]) -> list[str]:
    return sorted(name for name, path in modules.items()
                  if name.split(".")[0] not in TORCH_PACKAGES
                  and any(imported.split(".")[0] == "torch" for imported
                          in imported_names(ast.parse(path.read_text(encoding="utf-8")))))


def command_imports(modules: dict[str, Path]) -> list[str]:
    allowed = COMMAND_LIBRARIES | set(sys.stdlib_module_names)
    return sorted(f"{name} -> {imported}" for name, path in modules.items()
                  if name.split(".")[0] == "commands"
                  for imported in top_level_imports(ast.parse(path.read_text(encoding="utf-8")))
                  if imported.split(".")[0] not in allowed)


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), set()) - seen:
            seen.add(target)
            todo.append(target)
    return seen


def family_reaches(modules: dict[str, Path]) -> list[str]:
    """Family modules that load the benchmarks or the pictures, directly or through others."""
    graph = import_graph(modules)
    return sorted(f"{name} -> {target}" for name in graph if name.startswith(FAMILY_MODULES)
                  for target in reachable(graph, name) if target.startswith(NOT_EXPORT))


def test_torch_is_imported_only_in_zoo_and_export(tmp_path: Path) -> None:
    assert torch_outside(project_modules()) == []
    planted = tmp_path / "run.py"
    planted.write_text("def f():\n    import torch.nn\n")
    assert torch_outside({"commands.run": planted, "zoo.assemble": planted}) == ["commands.run"]


def test_the_torch_free_commands_import_only_the_runtime_at_load(tmp_path: Path) -> None:
    assert command_imports(project_modules()) == []
    planted = tmp_path / "run.py"  # a function-level import (a PyTorch comparison) may stay
    planted.write_text("import click\nfrom export.opening import open_model\n"
                       "def f():\n    from zoo.files.weights import load_built\n"
                       "try:\n    import zoo.assemble\nexcept ImportError:\n    pass\n"
                       "class A:\n    from export import api\n"
                       "if TYPE_CHECKING:\n    from zoo.files import sources\n")
    assert command_imports({"commands.run": planted}) == [
        "commands.run -> export", "commands.run -> export.api",
        "commands.run -> export.opening", "commands.run -> export.opening.open_model",
        "commands.run -> zoo.assemble"]


def test_the_family_object_reaches_no_benchmark_or_picture(tmp_path: Path) -> None:
    assert family_reaches(project_modules()) == []
    planted = tmp_path / "decoder.py"  # through a check that imports the benchmark
    planted.write_text("from export.checks.cases import decoder_cases\n")
    cases = tmp_path / "cases.py"
    cases.write_text("from export.bench.decoder import bench_decoder\n")
    bench = tmp_path / "bench.py"
    bench.write_text("")
    assert family_reaches({"export.families.decoder": planted, "export.checks.cases": cases,
                           "export.bench.decoder": bench}
                          ) == ["export.families.decoder -> export.bench.decoder"]


# Where a built-in block's name may be written: its declaration, and a foreign name that happens
# to be spelled the same (ONNX Runtime's MoE `activation_type`). Caught: a whole string (a
# comparison, a dict key, an f-string's literal part); not caught: a keyword argument's name
# (`rotary=` passes the rotary tables, not the block's name), a name built by concatenation or
# tested by prefix.
DECLARATIONS = {"registry/blocks.py", "registry/experts.py", "registry/stems.py"}
FOREIGN_SPELLINGS = {("export/onnx/experts.py", "swiglu")}


def builtin_block_names() -> set[str]:
    from registry.blocks import BLOCKS
    from registry.schema import FIELDS  # noqa: F401  (registers the mixture of experts' block)

    return {name for entries in BLOCKS.values() for name, entry in entries.items()
            if entry.origin == "built-in"}


def block_name_spellings(files: list[Path], names: set[str]) -> list[str]:
    found = []
    for path in files:
        where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Constant) and node.value in names
                    and (where, node.value) not in FOREIGN_SPELLINGS):
                found.append(f"{where}:{node.lineno}:{node.value}")
    return sorted(found)


def test_a_block_name_is_spelled_only_where_it_is_declared(tmp_path: Path) -> None:
    names = builtin_block_names()
    assert {"rmsnorm", "rotary", "swiglu", "moe"} <= names
    files = [path for path in project_modules().values()
             if path.relative_to(ROOT).as_posix() not in DECLARATIONS]
    assert block_name_spellings(files, names) == []
    planted = tmp_path / "params.py"  # the forms the code once had
    planted.write_text('if card["activation"] == "moe":\n    pass\n'
                       'NORMS = {"layernorm": 1, "rmsnorm": 2}\n'
                       'kind = f"{prefix}swiglu"\n')
    assert block_name_spellings([planted], names) == [
        "params.py:1:moe", "params.py:3:layernorm", "params.py:3:rmsnorm", "params.py:4:swiglu"]
