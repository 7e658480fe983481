"""The package's layers, read from its source with `ast`: the store imports no later stage, and no two of
trajlake's modules import each other, directly or round a longer circle.

An import counts when it runs as its module is imported (at the top level, in a class body, under `if` or `try`)
and also under `if TYPE_CHECKING:`: a circle that only the type checker walks is still two modules that each
need the other to be read. Imports inside a function run when it is called, after every module is loaded, and
are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "trajlake"
ROOT = Path(__file__).resolve().parents[1]  # the repository root is the package
#: the stages that come after the store: it must import none of them
LATER_STAGES = ("train", "rewards", "collect", "evaluate", "view")
#: what store/ may import from trajlake: itself, the kernel helpers and the table schemas
STORE_MAY_IMPORT = ("store", "core", "schemas")
#: folders of the root that are not the package's (setup.py leaves them out of the wheel)
NOT_PACKAGES = ("tests", "bench", "docs")


def _modules() -> dict[str, Path]:
    """Every module of the package: the root's own files and every folder with an __init__.py below it (as
    setup.py finds the wheel's packages; tests, bench and docs are not packages)."""
    found = {PACKAGE: ROOT / "__init__.py"}
    packages = [(ROOT, PACKAGE)]
    while packages:
        folder, name = packages.pop()
        for path in sorted(folder.iterdir()):
            if path.is_dir():
                if (path / "__init__.py").is_file() and not (folder == ROOT and path.name in NOT_PACKAGES):
                    found[f"{name}.{path.name}"] = path / "__init__.py"
                    packages.append((path, f"{name}.{path.name}"))
            elif path.suffix == ".py" and path.name != "__init__.py" and not (folder == ROOT and path.stem == "setup"):
                found[f"{name}.{path.stem}"] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_time_statements(body: list[ast.stmt]):
    """The import statements of `body` that run when the module is imported (see the module's docstring)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        elif isinstance(node, ast.ClassDef):
            yield from _import_time_statements(node.body)
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
            for field in ("body", "orelse", "finalbody"):
                yield from _import_time_statements(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                yield from _import_time_statements(handler.body)


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The trajlake modules `module` imports at import time: each module named, a package only for names taken
    from its __init__ (`from trajlake.store import Lake`; `from trajlake.store import reads` takes a module),
    and the packages around each module reached (their __init__ runs first), but not `module`'s own unless it
    names one: a module taking names from its own package's __init__, which imports that module, is a circle."""
    is_package = path.name == "__init__.py"
    named: set[str] = set()
    for node in _import_time_statements(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            named |= {a.name for a in node.names}
            continue
        base = node.module or ""
        if node.level:  # relative: from the module's own package (its own name, for a package)
            parts = module.split(".")
            parts = parts if is_package else parts[:-1]
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        submodules = {f"{base}.{a.name}" for a in node.names} & modules.keys()
        named |= submodules
        if len(submodules) < len(node.names):
            named.add(base)
    around = set(_packages_around(module))
    out = set()
    for name in named & modules.keys():  # a package named outright counts, its own included (names from its __init__)
        out |= ({name} - {module}) | (set(_packages_around(name)) - around - {module})
    return out


def _packages_around(module: str) -> list[str]:
    """The packages `module` lies in: trajlake.store for trajlake.store.lake, and trajlake."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imported(m, p, modules) for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's circles: one per strongly connected component of more than one module (Tarjan's), each as
    its modules in a path order that closes back on its first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle(graph, component) for component in components]


def _circle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest import circle through the component's first module, as the list of modules it passes."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    return component


def test_the_module_walk_finds_the_package():
    modules = _modules()
    for name in ("trajlake.store.lake", "trajlake.store.reads", "trajlake.train.batch", "trajlake.cli",
                 "trajlake.core.errors", "trajlake.view.server"):
        assert name in modules
    assert not any(m.startswith(("trajlake.tests", "trajlake.bench", "trajlake.docs")) for m in modules)


def _every_import(folder: str):
    """(file, line, module name) of every absolute import in `folder`'s modules, in functions too."""
    for path in sorted((ROOT / folder).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                yield f"{folder}/{path.name}", node.lineno, name


def test_the_store_imports_no_later_stage():
    """store/ is storage: it imports from trajlake only itself, core and schemas, so never train, rewards,
    collect or evaluate (nor the wings above them: cli, recipes, interop, lm)."""
    offending = []
    for where, line, name in _every_import("store"):  # every import, in functions too: none may reach up
        parts = name.split(".")
        if parts[0] == PACKAGE and len(parts) > 1 and parts[1] not in STORE_MAY_IMPORT:
            later = " (a later stage)" if parts[1] in LATER_STAGES else ""
            offending.append(f"{where}:{line} imports {name}{later}")
    assert not offending, "\n".join(offending)


def test_the_viewer_reads_runs_as_stored_data():
    """view/ shows what the lake holds: it imports no stage that produces runs (train, collect, rewards, recipes),
    so a run's config is read as stored (its defaults stored with it), never from today's code."""
    offending = [f"{where}:{line} imports {name}" for where, line, name in _every_import("view")
                 if name.split(".")[:2] in ([PACKAGE, "train"], [PACKAGE, "collect"], [PACKAGE, "rewards"],
                                            [PACKAGE, "recipes"])]
    assert not offending, "\n".join(offending)


def test_the_cycle_finder_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_a_module_importing_its_own_package_init_is_seen(tmp_path):
    # what interop/importers had: the package's __init__ imports the importer, which takes shared names from that
    # __init__ (read only because the __init__ imported it last)
    (tmp_path / "__init__.py").write_text("from trajlake.pkg.importer import run\nSHARED = 1\n")
    (tmp_path / "importer.py").write_text("from trajlake.pkg import SHARED\nfrom trajlake.pkg import other\n")
    (tmp_path / "other.py").write_text("import json\n")
    modules = {PACKAGE: ROOT / "__init__.py", "trajlake.pkg": tmp_path / "__init__.py",
               "trajlake.pkg.importer": tmp_path / "importer.py", "trajlake.pkg.other": tmp_path / "other.py"}
    graph = {m: _imported(m, p, modules) for m, p in modules.items()}
    assert graph["trajlake.pkg.importer"] == {"trajlake.pkg", "trajlake.pkg.other"}
    assert graph["trajlake.pkg.other"] == set()  # the packages around a module are not counted unless named
    assert _cycles(graph) == [["trajlake.pkg", "trajlake.pkg.importer", "trajlake.pkg"]]


def test_no_import_circle_among_the_modules():
    circles = _cycles(_graph())
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)
