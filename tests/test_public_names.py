"""Public and private are visible below the top level: every module lists its public names in
``__all__``, and the package's modules import from each other only names listed there."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from dali_alchemi.errors import NvalchemiNotInstalledError

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dali_alchemi"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, ast.Module]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "__pycache__" in path.parts or path.name == "__main__.py":
            continue
        found[_module_name(path)] = ast.parse(path.read_text())
    return found


def _declared(tree: ast.Module, name: str = "") -> list[str] | None:
    """The names ``__all__`` lists (``None``: no ``__all__``); one built at import time is read from the module."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            if isinstance(node.value, ast.List | ast.Tuple):
                return [ast.literal_eval(e) for e in node.value.elts]
            return list(importlib.import_module(name).__all__)
    return None


def _defines_anything(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Assign | ast.AnnAssign) for n in tree.body)


def test_every_module_that_defines_names_declares_all() -> None:
    modules = _modules()
    assert len(modules) > 60
    missing = [name for name, tree in modules.items() if _defines_anything(tree) and _declared(tree, name) is None]
    assert not missing, f"modules without __all__: {sorted(missing)}"


def test_every_name_in_all_exists() -> None:
    for name, tree in _modules().items():
        declared = _declared(tree, name) or []
        if not declared:
            continue
        try:
            module = importlib.import_module(name)
        except NvalchemiNotInstalledError:  # dali_alchemi.nvalchemi needs nvalchemi-toolkit
            continue
        absent = [n for n in declared if not hasattr(module, n)]
        assert not absent, f"{name}.__all__ lists {absent}, which it does not define"


def test_modules_import_only_public_names_from_each_other() -> None:
    modules = _modules()
    declared = {name: set(_declared(tree, name) or []) for name, tree in modules.items()}
    private = []
    for importer, tree in modules.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.module not in declared or node.level:
                continue
            for alias in node.names:
                if f"{node.module}.{alias.name}" in modules or alias.name.startswith("__"):  # a sub-module, a dunder
                    continue
                if alias.name not in declared[node.module]:
                    private.append(f"{importer} imports {alias.name} from {node.module}")
    assert not private, sorted(private)
