"""The README and the guide state what the Makefile installs: the versions, and the sizes make install announces."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_torch_versions_are_the_makefiles_or_nvalchemis() -> None:
    makefile = (ROOT / "Makefile").read_text()
    installed = re.search(r"^TORCH_SPEC \?= torch==([\d.]+)$", makefile, re.M)
    assert installed, "the Makefile pins torch in TORCH_SPEC"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"torch=={installed.group(1)}" in readme, "the README says which torch make install installs"
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = " ".join(page.read_text().split())
        for match in re.finditer(r"torch(?:==| )(\d+\.\d+\.\d+)", text):
            if match.group(1) != installed.group(1):
                after = text[match.end() : match.end() + 60]
                assert "nvalchemi" in after, (
                    f"{page.name}: torch {match.group(1)} is neither what the Makefile installs nor said to be nvalchemi's"
                )


def _install_commands(*settings: str) -> list[str]:
    """What ``make install`` would run into a venv that does not exist yet (``make -n``: nothing runs)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    with tempfile.TemporaryDirectory() as folder:
        run = subprocess.run(
            ["make", "-n", "--no-print-directory", "-C", str(ROOT), "install", f"VENV={folder}/venv", *settings],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    return run.stdout.splitlines()


def test_make_install_says_what_it_installs_how_big_and_how_to_get_the_cpu_build_before_it_starts() -> None:
    default = _install_commands()
    assert default[0].startswith('echo "make install: torch==') and "pip install" in default[2]
    said = default[0]
    sizes = re.search(r"About ([\d.]+) GB to download and ([\d.]+) GB on disk \(PyPI's torch is a CUDA build\)", said)
    cpu = re.search(r"TORCH_INDEX=(\S+) gets the CPU build: ([\d.]+) GB and ([\d.]+) GB", said)
    assert sizes and cpu and "DALI" in said and "A few minutes" in said
    cpu_only = _install_commands(f"TORCH_INDEX={cpu.group(1)}")[0]
    assert f"from {cpu.group(1)}" in cpu_only and "CUDA" not in cpu_only
    assert f"about {cpu.group(2)} GB to download and {cpu.group(3)} GB on disk" in cpu_only
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"downloads about {sizes.group(1)} GB and takes {sizes.group(2)} GB on disk" in readme
    assert f"(about {cpu.group(2)} GB to download, {cpu.group(3)} GB on disk)" in readme
