"""The store imports nothing above it, its sub-packages import one way (format <- read <- check <- write),
and its modules import each other without cycles."""

from __future__ import annotations

import ast
from pathlib import Path

import dali_alchemi.store

STORE = Path(dali_alchemi.store.__file__).parent
ALLOWED_OUTSIDE = {
    "dali_alchemi.errors",
    "dali_alchemi.types",
    "dali_alchemi.config",
    "dali_alchemi.remote_config",
    "dali_alchemi.csr",
}

# Imports deferred into a function body on purpose, to break what would otherwise be a cycle:
# (importing module, imported module). Every other cycle, deferred or not, fails the test.
DEFERRED: set[tuple[str, str]] = {
    # a multi-store folder opens as a MultiReader of its parts, and MultiReader opens each part through opening
    ("dali_alchemi.store.read.opening", "dali_alchemi.store.read.multistore"),
}  # (module, what it imports inside a function) allowed to close a cycle


class _Imports(ast.NodeVisitor):
    """The ``dali_alchemi`` modules a file imports: at module level (``TYPE_CHECKING`` too), and in functions."""

    def __init__(self) -> None:
        self.top: set[str] = set()
        self.deferred: set[str] = set()
        self._depth = 0

    @property
    def all(self) -> set[str]:
        return self.top | self.deferred

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def _add(self, modules: list[str]) -> None:
        (self.deferred if self._depth else self.top).update(m for m in modules if m.startswith("dali_alchemi"))

    def visit_Import(self, node: ast.Import) -> None:
        self._add([alias.name for alias in node.names])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module == "dali_alchemi" or (module.startswith("dali_alchemi.store") and module.count(".") <= 2):
            # `from dali_alchemi import csr` imports dali_alchemi.csr (or a name the package re-exports)
            self._add([f"{module}.{alias.name}" for alias in node.names])
        else:
            self._add([module])


def _imports(path: Path) -> _Imports:
    found = _Imports()
    found.visit(ast.parse(path.read_text()))
    return found


SUBPACKAGES = ("format", "read", "check", "write")
"""The store's sub-packages, lowest first: each imports only those before it (and itself)."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(STORE.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in STORE.rglob("*.py") if p.stem != "__init__"}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        found = _imports(path)
        deferred = {m for m in found.deferred - found.top if (name, m) in DEFERRED}
        graph[name] = {m for m in found.all if m in modules} - deferred
    return graph


def test_the_store_imports_nothing_from_above_it() -> None:
    upward = {
        f"{path.name} imports {module}"
        for path in STORE.rglob("*.py")
        for module in _imports(path).all
        if not module.startswith("dali_alchemi.store") and module not in ALLOWED_OUTSIDE
    }
    assert not upward, sorted(upward)


def test_store_modules_form_no_import_cycle() -> None:
    graph = _graph()
    assert len(graph) >= 20 and "dali_alchemi.store.read.reader" in graph["dali_alchemi.store.write.defragment"]
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_the_deferred_imports_listed_are_still_deferred() -> None:
    for importer, imported in DEFERRED:
        found = _imports(_modules()[importer])
        assert imported in found.deferred - found.top, f"{importer} no longer defers {imported}: drop it from DEFERRED"


def test_every_store_module_is_in_a_subpackage() -> None:
    loose = [p.name for p in STORE.glob("*.py") if p.stem != "__init__"]
    assert not loose, f"store modules outside the sub-packages {SUBPACKAGES}: {loose}"
    assert sorted(p.name for p in STORE.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(SUBPACKAGES)


def test_the_subpackages_import_one_way() -> None:
    rank = {name: i for i, name in enumerate(SUBPACKAGES)}
    upward = []
    for module, path in _modules().items():
        mine = module.split(".")[2]
        for imported in _imports(path).all:
            parts = imported.split(".")
            if len(parts) > 2 and parts[1] == "store" and parts[2] in rank and rank[parts[2]] > rank[mine]:
                upward.append(f"{module} imports {imported}")
    assert not upward, sorted(upward)


def test_the_one_way_check_sees_an_upward_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from dali_alchemi.store.write.lock import WriterLock\n")
    assert "dali_alchemi.store.write.lock" in _imports(probe).all
