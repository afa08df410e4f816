"""A stand-in for the GPU machine's python3, for the tests of the GPU check and of the route.

It answers the GPU check's steps the way the real tools do on a GPU (JUnit XML, JSON files) and
passes every other command to the real Python. ``FAKE_GPU`` (JSON) sets what it pretends: ``cuda``,
``dali`` (default true), and a step to ``fail``, ``crash`` or ``hang``. Each step appends to
``FAKE_RESULTS/../trace.jsonl`` what ``summary.json`` held when it started and its ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

STAND_IN = r'''#!{python}
"""Stands in for the GPU machine's python3 in the driver's steps; anything else goes to the real one."""
import json, os, sys, time

mode = json.loads(os.environ.get("FAKE_GPU", "{{}}"))
args = sys.argv[1:]
results = os.environ["FAKE_RESULTS"]


def step(name):
    summary = os.path.join(results, "summary.json")
    done = list(json.load(open(summary))["steps"]) if os.path.exists(summary) else []
    with open(os.path.join(results, "..", "trace.jsonl"), "a") as fh:
        fh.write(json.dumps({{"step": name, "summary_had": done, "pythonpath": os.environ.get("PYTHONPATH")}}) + "\n")
    if mode.get("hang") == name:
        time.sleep(3600)  # for ever, as far as the check can tell: only its budget ends it
    if mode.get("crash") == name:
        print(f"{{name}} crashed: CUDA error: an illegal memory access was encountered")
        sys.exit(3)


def value(flag):
    return args[args.index(flag) + 1]


if args[:1] == ["-c"] and "print(\"ENV \"" in args[1]:
    info = {{"python": "3.12.3", "torch": "2.11.0+cu130", "torch_cuda": "13.0", "cuda_available": mode.get("cuda", True)}}
    if info["cuda_available"]:
        info.update(device="Stand-in GPU", devices=1)
    if mode.get("dali", True):
        info["dali"] = "2.4.0"
    else:
        info["dali_error"] = "ModuleNotFoundError: No module named 'nvidia.dali'"
    print("ENV " + json.dumps(info))
elif args[:1] == ["-c"] and "pinned_copy_rate" in args[1]:
    step("pinned-copy")
    json.dump([{{"device": "Stand-in GPU", "layout": "pinned copy only (no DALI)", "pinned_copy_gb_per_s": 51.5}}],
              open(args[4], "w"))
elif args[:2] == ["-m", "pytest"]:
    marker = args[args.index("-m", 2) + 1]
    name = {{"gpu and not dali": "tests-torch", "gpu and dali": "tests-dali"}}.get(marker, "tests-cpu")
    step(name)
    junit = next(a.split("=", 1)[1] for a in args if a.startswith("--junitxml="))
    failing = mode.get("fail") == name
    cases = "".join(f'<testcase classname="tests.t" name="test_{{k}}"/>' for k in range(4))
    if failing:
        cases += '<testcase classname="tests.t" name="test_bad"><failure message="assert 1 == 2"/></testcase>'
    with open(junit, "w") as fh:
        fh.write(f'<testsuites><testsuite name="pytest" tests="{{4 + failing}}" failures="{{int(failing)}}" '
                 f'errors="0" skipped="0">{{cases}}</testsuite></testsuites>')
    print(f"{{4}} passed" + (", 1 failed" if failing else ""))
    sys.exit(1 if failing else 0)
elif args[:2] == ["-m", "dali_alchemi.cli"] and args[2] == "synth":
    step("store-inflate" if "--layout" in args and value("--layout") == "inflate" else "store")
    os.makedirs(args[3])
elif args[:2] == ["-m", "dali_alchemi.cli"] and args[2] == "h2d":
    layouts = value("--layouts").split(",")
    step("loader-" + layouts[-1])
    records = [{{"device": "Stand-in GPU", "layout": layout, "samples_per_s": 100000.0, "atoms_per_s": 5.5e6,
                "loader_gb_per_s": 3.25, "pinned_copy_gb_per_s": 50.0}} for layout in layouts]
    json.dump(records, open(value("--json"), "w"))
elif args[:2] == ["-m", "dali_alchemi.cli"] and args[2] == "augment-cost":
    step("augment")
    json.dump([{{"augmentation": "rotation", "ms_per_batch": 0.125, "device": value("--device")}}],
              open(value("--json"), "w"))
else:
    os.execv(sys.executable, [sys.executable, *args])
'''


def write_stand_in(path: Path) -> Path:
    path.write_text(STAND_IN.format(python=sys.executable))
    path.chmod(0o755)
    return path


def load_script(name: str, path: Path) -> ModuleType:
    """Import the script at ``path`` as module ``name`` (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
