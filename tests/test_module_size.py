"""Every package module stays small enough to hold one job: at most :data:`MAX_LINES` lines.

A module that grows past it is split by job (as ``store/read/engine.py`` became engine, routes, decoder
and pool), not trimmed by squeezing lines."""

from __future__ import annotations

from pathlib import Path

import dali_alchemi

PACKAGE = Path(dali_alchemi.__file__).resolve().parent
MAX_LINES = 450


def test_no_package_module_is_over_the_line_limit() -> None:
    sizes = {
        module.relative_to(PACKAGE).as_posix(): len(module.read_text().splitlines())
        for module in PACKAGE.rglob("*.py")
        if "__pycache__" not in module.parts
    }
    assert len(sizes) > 60, "the package's modules were not found"
    over = sorted(f"dali_alchemi/{path}: {lines} lines" for path, lines in sizes.items() if lines > MAX_LINES)
    assert not over, f"split these modules by job (at most {MAX_LINES} lines each):\n" + "\n".join(over)
