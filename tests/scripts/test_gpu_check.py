"""The GPU check's driver (scripts/gpu_check.py), run here with a stand-in for the GPU machine's Python.

The stand-in answers the driver's steps the way the real tools do on a GPU (JUnit XML, JSON files),
so the order of the steps, what lands in the results folder and when, the report of the pure-torch
steps apart from the DALI ones, failures, time limits and a missing DALI are all checked without a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts.stand_in import load_script, write_stand_in

ROOT = Path(__file__).resolve().parents[2]




gpu_check = load_script("gpu_check", ROOT / "scripts" / "gpu_check.py")


@pytest.fixture()
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Returns ``run(mode, *args) -> (exit, summary, results folder)`` with the stand-in as ``--python``."""
    python = write_stand_in(tmp_path / "python3")
    results = tmp_path / "out"
    monkeypatch.setenv("FAKE_RESULTS", str(results))
    monkeypatch.delenv("OUT", raising=False)

    def run(mode: dict, *args: str) -> tuple[int, dict, Path]:
        monkeypatch.setenv("FAKE_GPU", json.dumps(mode))
        code = gpu_check.main(["--python", str(python), "--results", str(results), *args])
        return code, json.loads((results / "summary.json").read_text()), results

    return run


def _trace(results: Path) -> list[dict]:
    return [json.loads(line) for line in (results.parent / "trace.jsonl").read_text().splitlines()]


def test_the_steps_run_most_valuable_first_and_each_result_is_saved_at_once(machine) -> None:
    code, summary, results = machine({})
    assert code == 0
    order = ["tests-torch", "tests-dali", "store", "loader-window", "loader-blob", "store-inflate", "loader-inflate", "augment"]
    assert list(summary["steps"]) == order and all(s["status"] == "passed" for s in summary["steps"].values())
    trace = _trace(results)
    assert [t["step"] for t in trace] == order
    for k, t in enumerate(trace):  # when each step started, every earlier one was already in summary.json
        assert t["summary_had"] == order[:k]
    assert summary["env"]["device"] == "Stand-in GPU" and summary["env"]["dali"] == "2.4.0"
    assert summary["steps"]["tests-dali"]["counts"] == {"tests": 4, "failed": 0, "errors": 0, "skipped": 0, "passed": 4}
    h2d = json.loads((results / "h2d.json").read_text())
    assert [r["layout"] for r in h2d] == ["window", "blob", "window", "inflate"] and h2d[0]["loader_gb_per_s"] == 3.25
    assert json.loads((results / "augment.json").read_text())[0]["device"] == "cuda"
    assert sorted(p.name for p in results.iterdir()) == ["augment.json", "gpu-check.log", "h2d.json", "summary.json"]
    lines = summary["report"]["lines"]
    torch_at, dali_at = lines.index("pure torch on CUDA:"), lines.index("through DALI:")
    assert any("tests-torch" in line for line in lines[torch_at:dali_at])
    assert any("augment" in line and "rotation 0.125 ms" in line for line in lines[torch_at:dali_at])
    loader = next(line for line in lines[dali_at:] if "loader-window" in line)
    assert "100,000 structures/s, 5,500,000 atoms/s, loader 3.25 GB/s vs pinned copy 50.00 GB/s" in loader
    assert "== tests-dali:" in (results / "gpu-check.log").read_text()


def test_without_dali_the_pure_torch_parts_still_run_and_are_reported_apart(machine) -> None:
    code, summary, results = machine({"dali": False})
    assert code == 1
    steps = summary["steps"]
    assert [n for n, s in steps.items() if s["status"] == "passed"] == [
        "tests-torch",
        "store",
        "pinned-copy",
        "augment",
    ]
    for name in ("tests-dali", "loader-window", "loader-blob", "store-inflate", "loader-inflate"):
        assert steps[name]["status"] == "skipped" and "No module named 'nvidia.dali'" in steps[name]["reason"]
    assert json.loads((results / "h2d.json").read_text())[0]["pinned_copy_gb_per_s"] == 51.5
    lines = summary["report"]["lines"]
    torch_part = lines[lines.index("pure torch on CUDA:") : lines.index("through DALI:")]
    assert any("pinned-copy" in line and "pinned copy 51.50 GB/s" in line for line in torch_part)
    assert "no DALI (ModuleNotFoundError" in lines[0]


def test_a_failing_or_crashing_step_is_reported_and_the_rest_still_run(machine) -> None:
    code, summary, _ = machine({"fail": "tests-torch", "crash": "loader-window"})
    assert code == 1
    tests = summary["steps"]["tests-torch"]
    assert tests["status"] == "failed" and tests["failed"] == ["tests.t::test_bad: assert 1 == 2"]
    assert tests["counts"]["passed"] == 4 and tests["counts"]["failed"] == 1
    crashed = summary["steps"]["loader-window"]
    assert crashed["status"] == "failed" and crashed["exit"] == 3 and "illegal memory access" in crashed["reason"]
    assert summary["steps"]["loader-blob"]["status"] == "passed" and summary["steps"]["augment"]["status"] == "passed"


def test_the_budget_stops_a_hanging_step_and_skips_what_no_longer_fits(machine) -> None:
    code, summary, _ = machine({"hang": "tests-dali"}, "--budget-s", "12")  # ample for the steps before the hang on a busy machine
    assert code == 1
    steps = summary["steps"]
    assert steps["tests-torch"]["status"] == "passed"
    assert steps["tests-dali"]["status"] == "timeout"
    assert all(steps[n]["status"] == "skipped" and "out of time" in steps[n]["reason"]
               for n in ("store", "store-inflate", "augment"))  # fmt: skip


def test_no_cuda_is_a_clear_error_and_cpu_mode_rehearses_without_it(machine) -> None:
    code, summary, _ = machine({"cuda": False})
    assert code == 2 and summary["error"] == "no CUDA device visible to torch" and summary["steps"] == {}
    code, summary, results = machine({"cuda": False}, "--cpu", "--pytest-args", "tests/test_batch.py")
    assert code == 0 and summary["mode"] == "cpu"
    assert summary["steps"]["tests-cpu"]["status"] == "passed"
    cuda_steps = ("store", "loader-window", "loader-blob", "store-inflate", "loader-inflate")
    assert all(summary["steps"][n]["reason"] == "--cpu: needs CUDA" for n in cuda_steps)
    assert json.loads((results / "augment.json").read_text())[0]["device"] == "cpu"
    assert "pure torch (--cpu: no CUDA):" in summary["report"]["lines"]


def test_junit_counts_reads_pytest_output(tmp_path: Path) -> None:
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="1" skipped="2">'
        '<testcase classname="a" name="ok"/><testcase classname="a" name="f"><failure message="boom&#10;more"/>'
        '</testcase><testcase classname="a" name="e"><error message="fixture failed"/></testcase>'
        "</testsuite></testsuites>"
    )
    counts, failed = gpu_check.junit_counts(xml)
    assert counts == {"tests": 5, "failed": 1, "errors": 1, "skipped": 2, "passed": 1}
    assert failed == ["a::f: boom", "a::e: fixture failed"]
    assert gpu_check.junit_counts(tmp_path / "missing.xml") == ({}, [])
