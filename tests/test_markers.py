"""The GPU tests that need only torch run without DALI: the GPU check relies on it when DALI cannot travel.

One subprocess collects the suite twice, with DALI and with DALI made unimportable, and runs the
``dali``-marked tests of one module without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
import pytest

TESTS = sys.argv[1]


class Watch:
    def __init__(self):
        self.ids, self.errors, self.skips = [], [], {}

    def pytest_collection_finish(self, session):
        self.ids = sorted(item.nodeid for item in session.items)

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(report.nodeid)

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            self.skips[report.nodeid] = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)


def run(*args):
    watch = Watch()
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", *args], plugins=[watch])
    return {"exit": int(code), "ids": watch.ids, "errors": watch.errors, "skips": watch.skips}


result = {"with": run("--co", "-m", "gpu and not dali", TESTS)}
for name in list(sys.modules):  # forget DALI and everything that imported it
    path = getattr(sys.modules[name], "__file__", None) or ""
    if name.split(".")[0] == "nvidia" or name.startswith("dali_alchemi.pipeline") or path.startswith(TESTS):
        del sys.modules[name]
sys.modules["nvidia.dali"] = None  # `import nvidia.dali` now raises ImportError
result["without"] = run("--co", "-m", "gpu and not dali", TESTS)
result["run_without"] = run("-m", "dali", TESTS + "/test_augment.py")
print("RESULT " + json.dumps(result))
"""


@pytest.mark.slow  # collects the whole suite twice (about 10 s)
def test_the_pure_torch_gpu_tests_need_no_dali() -> None:
    tests = str(ROOT / "tests")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, tests], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    with_dali, without = result["with"], result["without"]
    assert with_dali["exit"] == 0 and not with_dali["errors"]
    assert without["exit"] == 0 and not without["errors"], "a test module fails to import without DALI"
    assert without["ids"] == with_dali["ids"], "gpu tests not marked dali differ without DALI"
    names = {nodeid.split("::")[1].split("[")[0] for nodeid in without["ids"]}
    assert {"test_to_cuda_keeps_values", "test_augmentations_on_the_gpu_match_their_cpu_physics"} <= names
    assert "test_the_iterator_collates_host_tensors_on_the_device" in names
    assert not any("test_loader.py" in nodeid for nodeid in without["ids"])  # the DALI loader's own are marked
    ran = result["run_without"]
    assert ran["exit"] == 0 and list(ran["skips"]) == ["tests/test_augment.py::test_the_loader_augments_reproducibly"]
    assert "needs NVIDIA DALI, which cannot be imported" in next(iter(ran["skips"].values()))
