"""The public API: listed once, every name importable, the README's imports real, the package import cheap."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import dali_alchemi

ROOT = Path(__file__).resolve().parents[1]


def _type_checking_names() -> dict[str, str]:
    tree = ast.parse((ROOT / "dali_alchemi" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING")
    return {a.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for a in node.names}  # type: ignore[misc]


def test_the_type_checkers_block_repeats_the_exports_exactly() -> None:
    assert _type_checking_names() == dali_alchemi._EXPORTS
    assert dali_alchemi.__all__ == sorted(dali_alchemi._EXPORTS)


def test_every_exported_name_resolves_to_its_module() -> None:
    for name, module in dali_alchemi._EXPORTS.items():
        value = getattr(dali_alchemi, name)
        assert value.__module__.startswith(module), (name, value.__module__)


def test_the_readmes_imports_exist() -> None:
    text = (ROOT / "README.md").read_text()
    imports = re.findall(r"^\s*from (dali_alchemi[\w.]*) import ([\w, ]+)$", text, re.M)
    assert imports
    for module, names in imports:
        mod = __import__(module, fromlist=["_"])
        for name in (n.strip() for n in names.split(",")):
            assert hasattr(mod, name), f"README imports {name} from {module}"


def test_importing_the_package_imports_no_torch_zarr_or_dali() -> None:
    code = "import sys, dali_alchemi; print(sorted(m for m in ('torch', 'zarr', 'nvidia.dali') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
