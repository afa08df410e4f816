"""The README and the guide state the versions the Makefile installs."""

from __future__ import annotations

import re
from pathlib import Path

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
