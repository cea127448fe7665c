"""Layering is checked, not hoped for (DESIGN): every import of fedveil, including lazy and
TYPE_CHECKING ones, points to a lower layer, and no modules import each other in a cycle.

The graph is read from the source with ``ast`` (not from ``sys.modules``), so an import
inside a function or an ``if TYPE_CHECKING:`` block counts as much as one at the top.
"""
from __future__ import annotations

import ast
from pathlib import Path

import fedveil

PACKAGE = Path(fedveil.__file__).parent

# Lowest first; a package may import only packages of a strictly lower layer.
LAYERS = [
    {"__init__", "errors", "options", "params", "registry", "seeding"},
    {"config_file"},  # reads TOML config files (errors only)
    {"data", "models"},
    {"engine"},  # stacked kernels for the models' own layers (GradientReversal)
    {"metrics"},  # evaluation metrics read data.arrays
    {"privacy"},
    {"training", "theory", "pets"},
    {"algorithms", "ecos"},
    {"config"},
    {"runtime"},
    {"bench", "reproduce", "deploy"},
    {"cli"},
    {"__main__"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the fedveil modules it imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    deps.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in paths else target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in paths and d != name}
    return graph


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_every_package_has_a_layer():
    tops = {_top(m) for m in import_graph()}
    assert tops <= set(RANK), f"packages without a layer in LAYERS: {sorted(tops - set(RANK))}"


def test_imports_point_downwards():
    upward = sorted(
        f"{m} -> {d}"
        for m, deps in import_graph().items()
        for d in deps
        if _top(m) != _top(d) and RANK[_top(d)] >= RANK[_top(m)]
    )
    assert not upward, "imports that do not point to a lower layer:\n" + "\n".join(upward)


def test_no_import_cycles():
    assert _cycles(import_graph()) == []


def test_the_checker_sees_lazy_and_type_checking_imports(tmp_path, monkeypatch):
    """The checker must fail on the kinds of import that hid the old cycle."""
    pkg = tmp_path / "fedveil"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("def f():\n    from .y import g\n")
    (pkg / "a" / "y.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import x\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    graph = import_graph()
    assert graph["fedveil.a.x"] == {"fedveil.a.y"}
    assert graph["fedveil.a.y"] == {"fedveil.a.x"}
    assert _cycles(graph) == [["fedveil.a.x", "fedveil.a.y"]]


REPRODUCTIONS_PACKAGE = PACKAGE.parent / "fedveil_reproductions"
# The modules reproductions share; every other module is one reproduction (or one family's
# registration) and no sibling may import it.
SHARED_REPRODUCTION_MODULES = {
    "paper_numbers", "silo_study", "vehicle_silos", "fade_uda", "ecos_study", "splitmix_study",
}


def _imported_modules(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved within its package)."""
    package = path.parent.name
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = f"{package}.{node.module}" if node.level == 1 and node.module else package if node.level else node.module
            names.add(base or "")
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_library_never_imports_the_reproductions():
    """fedveil finds them only through the ``fedveil.reproductions`` entry point."""
    offending = sorted(
        f"{p.relative_to(PACKAGE.parent)} -> {name}"
        for p in PACKAGE.rglob("*.py") for name in _imported_modules(p)
        if name.split(".")[0] == "fedveil_reproductions"
    )
    assert not offending, "library modules importing the reproductions:\n" + "\n".join(offending)


def test_reproductions_share_code_only_through_shared_modules():
    modules = {p.stem for p in REPRODUCTIONS_PACKAGE.glob("*.py")} - {"__init__"}
    assert SHARED_REPRODUCTION_MODULES <= modules
    offending = sorted(
        f"{p.stem} -> {name}"
        for p in REPRODUCTIONS_PACKAGE.glob("*.py") if p.stem != "__init__"
        for name in _imported_modules(p)
        if name.startswith("fedveil_reproductions.")
        and name.split(".")[1] in modules - SHARED_REPRODUCTION_MODULES - {p.stem}
    )
    assert not offending, "reproductions importing another reproduction's internals:\n" + "\n".join(offending)


def test_the_checker_sees_a_reproduction_importing_a_sibling(tmp_path):
    (tmp_path / "fedveil_reproductions").mkdir()
    path = tmp_path / "fedveil_reproductions" / "b.py"
    path.write_text("from .a import f\nfrom . import c\nfrom fedveil.reproduce import ResultRow\n")
    assert {"fedveil_reproductions.a", "fedveil_reproductions.c", "fedveil.reproduce.ResultRow"} <= _imported_modules(path)
