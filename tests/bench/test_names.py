"""bench/names.py: the loader names need no torch to import, and each loader's code can be imported ahead."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json, sys
from dali_alchemi.bench.names import import_loader_code

seen = {"names": sorted(m for m in ("torch", "nvidia.dali") if m in sys.modules)}
import_loader_code("torch-batched-w0")
seen["torch"] = sorted(m for m in ("dali_alchemi.baseline", "nvidia.dali") if m in sys.modules)
import_loader_code("dali-w0")
seen["dali"] = "dali_alchemi.pipeline.loader" in sys.modules and "nvidia.dali" in sys.modules
sys.modules["nvalchemi"] = None  # not installed: left for opening the loader to report
import_loader_code("nvalchemi-fast")
import_loader_code("limit")
print(json.dumps(seen))
"""


def test_names_import_nothing_heavy_and_a_loaders_code_is_imported_before_its_clock() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"names": [], "torch": ["dali_alchemi.baseline"], "dali": True}
