#!/usr/bin/env python3
"""The GPU check, most valuable results first, each written to the results folder as soon as it exists.

Steps, in order (each runs in its own process, with a time cap, so one that hangs or crashes costs
only itself):

1. ``env``: the GPU, its driver, torch and its CUDA, and DALI's version or why it cannot be imported.
2. ``tests-torch``: the CUDA tests that need only torch (``pytest -m "gpu and not dali"``): a Batch on
   the device, the iterator's device collation given host tensors, the augmentations.
3. ``tests-dali``: the CUDA tests through DALI (``pytest -m "gpu and dali"``): Batches on the GPU
   equal the CPU path value for value.
4. ``store``: a synthetic store for the benchmarks (``dali-alchemi synth``).
5. ``loader-window``, ``loader-blob``: the loader on the GPU, structures/s and atoms/s, and the
   host-to-device GB/s it achieves beside a pinned torch copy of the same bytes (``dali-alchemi h2d``).
   ``store-inflate``, ``loader-inflate``: a store of LZ4 blocks (``synth --layout inflate``) read in the
   ``"inflate"`` layout (chunks inflated on the GPU by nvCOMP) beside the ``"window"`` layout.
6. ``pinned-copy``, only when DALI cannot be imported: the pinned torch copy alone.
7. ``augment``: the augmentations on CUDA (``dali-alchemi augment-cost --device cuda``).

Without DALI the pure-torch steps still run; the summary reports them apart from the DALI ones.
The results folder (``--results``, else ``$OUT``, else ``bench-results/gpu-check``) holds
``summary.json`` (rewritten after every step), ``gpu-check.log`` (every step's output), ``h2d.json``
and ``augment.json``. ``--budget-s`` bounds the whole check: a step that would start past it is
recorded as skipped. ``--cpu`` rehearses the check without a GPU: it runs the CPU part of the test
suite in place of the CUDA tests and skips the steps that need CUDA.

Standard library only; every step runs with ``--python`` (default: the Python running this file).
Exit status: 0 when every step passed, 1 when one failed or was skipped, 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[1]

ENV_PROBE = r"""
import json, platform, sys
info = {"python": platform.python_version(), "executable": sys.executable}
try:
    import torch
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), devices=torch.cuda.device_count(),
                    capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                    memory_gib=round(props.total_memory / 2**30, 1))
except Exception as err:
    info["torch_error"] = f"{type(err).__name__}: {err}"
for module in ("zarr", "numcodecs", "numpy"):
    try:
        info[module] = __import__(module).__version__
    except Exception as err:
        info[module + "_error"] = f"{type(err).__name__}: {err}"
try:
    import nvidia.dali
    info["dali"] = nvidia.dali.__version__
    info["dali_location"] = nvidia.dali.__file__
except Exception as err:
    info["dali_error"] = f"{type(err).__name__}: {err}"
print("ENV " + json.dumps(info))
"""

PINNED_PROBE = r"""
import json, sys, torch
from dali_alchemi.bench.h2d import pinned_copy_rate
device = torch.device("cuda")
total, chunk = int(sys.argv[1]), int(sys.argv[2])
rate = pinned_copy_rate(total, chunk, device)
record = {"device": torch.cuda.get_device_name(device), "layout": "pinned copy only (no DALI)",
          "bytes": total, "chunk_bytes": chunk, "pinned_copy_gb_per_s": rate}
open(sys.argv[3], "w").write(json.dumps([record]))
print(f"pinned torch copy of {total:,d} bytes in {chunk:,d}-byte pieces: {rate:.2f} GB/s")
"""


class Check:
    """Runs the steps and keeps the results folder up to date."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.python = args.python
        self.results = Path(args.results or os.environ.get("OUT") or ROOT / "bench-results" / "gpu-check")
        self.results.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.log: TextIO = open(self.results / "gpu-check.log", "a", buffering=1)
        self.started = time.monotonic()
        self.deadline = None if args.budget_s is None else self.started + args.budget_s
        self.summary: dict[str, Any] = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "mode": "cpu" if args.cpu else "cuda",
            "budget_s": args.budget_s,
            "env": {},
            "steps": {},
        }
        self.h2d: list[dict[str, Any]] = []

    # -- bookkeeping ------------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")

    def save(self) -> None:
        self.summary["elapsed_s"] = round(time.monotonic() - self.started, 1)
        tmp = self.results / "summary.json.tmp"
        tmp.write_text(json.dumps(self.summary, indent=2) + "\n")
        tmp.replace(self.results / "summary.json")

    def record(self, name: str, needs: str, result: dict[str, Any]) -> dict[str, Any]:
        result = {"needs": needs, **result}
        self.summary["steps"][name] = result
        self.save()
        line = f"-- {name}: {result['status']}"
        if result.get("reason"):
            line += f" ({result['reason']})"
        self.say(line + (f" in {result['seconds']} s" if "seconds" in result else ""))
        return result

    def time_left(self, cap: float) -> float:
        if self.deadline is None:
            return cap
        return min(cap, self.deadline - time.monotonic())

    def run(self, name: str, cmd: list[str], cap: float) -> tuple[int | None, str, float]:
        """Run ``cmd`` (output to the log and the console), at most ``cap`` seconds or what the budget leaves.

        Returns the exit status (``None`` when it ran out of time and was killed), its output and seconds.
        """
        timeout = self.time_left(cap)
        self.say(f"== {name}: {' '.join(shlex.quote(c) for c in cmd)}")
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        lines: list[str] = []

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                sys.stdout.write(line)
                sys.stdout.flush()
                self.log.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc: int | None = proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            with_children(proc, signal.SIGKILL)
            proc.wait()
            rc = None
        reader.join(timeout=5)
        return rc, "".join(lines), round(time.monotonic() - started, 1)

    def out_of_time(self, name: str, needs: str, minimum: float = 2) -> bool:
        if self.time_left(float("inf")) < minimum:
            self.record(name, needs, {"status": "skipped", "reason": f"out of time (budget {self.args.budget_s} s)"})
            return True
        return False

    # -- the steps --------------------------------------------------------------------------------------
    def env(self) -> dict[str, Any]:
        rc, output, _ = self.run("env", [self.python, "-c", ENV_PROBE], 120)
        info: dict[str, Any] = {}
        for line in output.splitlines():
            if line.startswith("ENV "):
                info = json.loads(line[4:])
        if rc != 0 or not info:
            info["error"] = output.strip()[-2000:] or f"exit {rc}"
        smi = shutil.which("nvidia-smi")
        if smi:
            query = [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
            try:
                info["nvidia_smi"] = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
            except (OSError, subprocess.SubprocessError) as err:
                info["nvidia_smi"] = f"failed: {err}"
        self.summary["env"] = info
        self.save()
        self.say("-- env: " + json.dumps(info))
        return info

    def tests(self, name: str, needs: str, marker: str, extra: list[str], cap: float) -> dict[str, Any]:
        if self.out_of_time(name, needs):
            return self.summary["steps"][name]
        junit = self.scratch / f"{name}.xml"
        cmd = [self.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker, f"--junitxml={junit}",
               *(extra or ["tests"])]  # fmt: skip
        rc, output, seconds = self.run(name, cmd, cap)
        counts, failed = junit_counts(junit)
        result: dict[str, Any] = {"seconds": seconds, "exit": rc, "counts": counts, "failed": failed}
        if rc is None:
            result.update(status="timeout", reason=f"stopped after {seconds} s")
        elif rc == 5 or (counts and counts["tests"] == 0):
            result.update(status="failed", reason=f"no tests selected by -m {marker!r}")
        elif rc != 0 or not counts or counts["failed"] or counts["errors"]:
            result.update(status="failed", reason=tail(output, 3) if not counts else None)
        elif counts["passed"] == 0:
            result.update(status="failed", reason="every selected test was skipped")
        else:
            result["status"] = "passed"
        return self.record(name, needs, {k: v for k, v in result.items() if v is not None})

    def command(
        self, name: str, needs: str, cmd: list[str], cap: float, json_out: Path | None = None
    ) -> dict[str, Any]:
        """A step that runs one command, with its JSON output (when it writes one) kept in the summary."""
        if self.out_of_time(name, needs):
            return self.summary["steps"][name]
        if json_out is not None:
            json_out.unlink(missing_ok=True)
        rc, output, seconds = self.run(name, cmd, cap)
        result: dict[str, Any] = {"seconds": seconds, "exit": rc}
        if rc is None:
            result.update(status="timeout", reason=f"stopped after {seconds} s")
        elif rc != 0:
            result.update(status="failed", reason=tail(output, 3))
        else:
            result["status"] = "passed"
            if json_out is not None:
                try:
                    result["figures"] = json.loads(json_out.read_text())
                except (OSError, json.JSONDecodeError) as err:
                    result.update(status="failed", reason=f"no JSON result: {err}")
        return self.record(name, needs, result)

    def loader(self, layout: str, store: Path, layouts: str | None = None) -> None:
        """Step ``loader-<layout>``: the loader on the GPU in ``layouts`` (default: ``layout`` alone) side by side."""
        name = f"loader-{layout}"
        out = self.scratch / f"{name}.json"
        cmd = [self.python, "-m", "dali_alchemi.cli", "h2d", str(store), "--layouts", layouts or layout,
               "--epochs", str(self.args.epochs), "--json", str(out)]  # fmt: skip
        result = self.command(name, "dali", cmd, 240, out)
        if result["status"] == "passed":
            self.h2d += result["figures"]
            (self.results / "h2d.json").write_text(json.dumps(self.h2d, indent=2) + "\n")

    def inflate(self, args: argparse.Namespace, info: dict[str, Any], dali: bool, needs_cuda: str) -> None:
        """Steps ``store-inflate`` and ``loader-inflate``: a store of LZ4 blocks, read with its chunks inflated
        on the GPU by nvCOMP beside the window layout's host decoding of the same store."""
        if args.cpu or not dali:
            why = needs_cuda if args.cpu else info.get("dali_error", "no DALI")
            for name, needs in (("store-inflate", "torch"), ("loader-inflate", "dali")):
                self.record(name, needs, {"status": "skipped", "reason": why})
            return
        store = self.scratch / "inflate.zarr"
        cmd = [self.python, "-m", "dali_alchemi.cli", "synth", str(store), "--n", str(args.n), "--seed", "42",
               "--layout", "inflate"]  # fmt: skip
        if self.command("store-inflate", "torch", cmd, 120)["status"] == "passed":
            self.loader("inflate", store, layouts="window,inflate")
        else:
            self.record("loader-inflate", "dali", {"status": "skipped", "reason": "no inflate store"})

    def main(self) -> int:
        try:
            return self.steps()
        finally:
            self.log.close()
            shutil.rmtree(self.scratch, ignore_errors=True)

    def steps(self) -> int:
        args = self.args
        info = self.env()
        dali = "dali" in info
        cuda = bool(info.get("cuda_available"))
        needs_cuda = "--cpu: needs CUDA"
        if not cuda and not args.cpu:
            self.say("gpu-check needs a CUDA GPU and a CUDA build of torch (torch sees no CUDA device)")
            self.summary["error"] = "no CUDA device visible to torch"
            self.save()
            return 2
        extra = shlex.split(args.pytest_args) if args.pytest_args else []
        if args.cpu:
            self.tests("tests-cpu", "torch", "not gpu and not slow", extra, 900)
        else:
            self.tests("tests-torch", "torch", "gpu and not dali", extra, 180)
            if dali:
                self.tests("tests-dali", "dali", "gpu and dali", extra, 300)
            else:
                self.record("tests-dali", "dali", {"status": "skipped", "reason": info.get("dali_error", "no DALI")})
        store = self.scratch / "synthetic.zarr"
        if args.cpu:
            self.record("store", "torch", {"status": "skipped", "reason": needs_cuda})
        else:
            cmd = [self.python, "-m", "dali_alchemi.cli", "synth", str(store), "--n", str(args.n), "--seed", "42"]
            self.command("store", "torch", cmd, 120)
        store_step = self.summary["steps"]["store"]
        for layout in ("window", "blob"):
            if args.cpu or not dali or store_step["status"] != "passed":
                why = (
                    needs_cuda if args.cpu
                    else info.get("dali_error", "no DALI") if not dali
                    else f"no store: {store_step.get('reason') or store_step['status']}"
                )  # fmt: skip
                self.record(f"loader-{layout}", "dali", {"status": "skipped", "reason": why})
            else:
                self.loader(layout, store)
        self.inflate(args, info, dali, needs_cuda)
        if not dali and not args.cpu:
            out = self.scratch / "pinned.json"
            cmd = [self.python, "-c", PINNED_PROBE, str(2**30), str(4 * 2**20), str(out)]
            result = self.command("pinned-copy", "torch", cmd, 60, out)
            if result["status"] == "passed":
                self.h2d += result["figures"]
                (self.results / "h2d.json").write_text(json.dumps(self.h2d, indent=2) + "\n")
        out = self.results / "augment.json"
        device = "cpu" if args.cpu else "cuda"
        repeats = 2 if args.cpu else args.repeats
        cmd = [self.python, "-m", "dali_alchemi.cli", "augment-cost", "--device", device, "--repeats", str(repeats),
               "--json", str(out)]  # fmt: skip
        self.command("augment", "torch", cmd, 120, out)
        return self.finish()

    def finish(self) -> int:
        self.summary["report"] = report(self.summary)
        self.save()
        self.say("\n".join(self.summary["report"]["lines"]))
        ok = all(s["status"] == "passed" for s in self.summary["steps"].values() if "--cpu" not in s.get("reason", ""))
        return 0 if ok else 1


def with_children(proc: subprocess.Popen[str], sig: int) -> None:
    """Signal ``proc``'s whole process group (it was started in a session of its own)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail(text: str, n: int) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-n:])


def junit_counts(path: Path) -> tuple[dict[str, int], list[str]]:
    """Test counts and the failing tests (``name: message``) of a pytest JUnit XML file ({} without one)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}, []
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failed": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        counts["tests"] += int(suite.get("tests", 0))
        counts["failed"] += int(suite.get("failures", 0))
        counts["errors"] += int(suite.get("errors", 0))
        counts["skipped"] += int(suite.get("skipped", 0))
    counts["passed"] = counts["tests"] - counts["failed"] - counts["errors"] - counts["skipped"]
    failed = []
    for case in root.iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                message = (child.get("message") or "").strip().splitlines()
                failed.append(f"{case.get('classname')}::{case.get('name')}: {message[0] if message else child.tag}")
    return counts, failed


def describe(name: str, step: dict[str, Any]) -> str:
    """One line for a step: its status and its figures."""
    text = f"  {name:<14} {step['status']:<8}"
    counts = step.get("counts")
    if counts:
        text += f" {counts['passed']} passed, {counts['failed']} failed, {counts['errors']} errors, {counts['skipped']} skipped"
    for fig in step.get("figures") or []:
        if not isinstance(fig, dict):
            continue
        if "samples_per_s" in fig:
            text += f" {fig['layout']}:" if fig.get("layout") else ""
            text += (f" {fig['samples_per_s']:,.0f} structures/s, {fig['atoms_per_s']:,.0f} atoms/s, loader "
                     f"{fig['loader_gb_per_s']:.2f} GB/s vs pinned copy {fig['pinned_copy_gb_per_s']:.2f} GB/s")  # fmt: skip
        elif "ms_per_batch" in fig:
            text += f" {fig['augmentation']} {fig['ms_per_batch']:.3f} ms;"
        elif "pinned_copy_gb_per_s" in fig:
            text += f" pinned copy {fig['pinned_copy_gb_per_s']:.2f} GB/s"
    if step.get("reason") and step["status"] != "passed":
        text += f" ({step['reason']})"
    if "seconds" in step:
        text += f" [{step['seconds']} s]"
    return text


def report(summary: dict[str, Any]) -> dict[str, Any]:
    """The closing report: pure-torch steps apart from the DALI ones, one line each."""
    env = summary["env"]
    head = ", ".join(
        str(v) for v in (
            env.get("device") or "no CUDA device", env.get("nvidia_smi") and f"nvidia-smi: {env['nvidia_smi']}",
            env.get("torch") and f"torch {env['torch']} (CUDA {env.get('torch_cuda')})",
            f"DALI {env['dali']}" if env.get("dali") else f"no DALI ({env.get('dali_error')})",
        ) if v
    )  # fmt: skip
    groups: dict[str, list[str]] = {"torch": [], "dali": []}
    for name, step in summary["steps"].items():
        groups[step["needs"]].append(describe(name, step))
    torch_label = "pure torch on CUDA:" if summary["mode"] == "cuda" else "pure torch (--cpu: no CUDA):"
    lines = [f"== gpu-check summary: {head}", torch_label, *groups["torch"], "through DALI:", *groups["dali"]]
    return {"lines": lines, "torch": groups["torch"], "dali": groups["dali"]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the Python that runs every step")
    parser.add_argument("--results", help="results folder (default $OUT, else bench-results/gpu-check)")
    parser.add_argument("--budget-s", type=float, help="seconds the whole check may take (default: no limit)")
    parser.add_argument("--n", type=int, default=20000, help="structures in the benchmark store (default 20000)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each loader measurement (default 2)")
    parser.add_argument("--repeats", type=int, default=20, help="repeats of the augmentation timing (default 20)")
    parser.add_argument("--cpu", action="store_true", help="no GPU: the CPU part of the suite, CUDA steps skipped")
    parser.add_argument("--pytest-args", help="what pytest runs instead of the whole tests folder (quoted)")
    return parser


def main(argv: list[str] | None = None) -> int:
    return Check(build_parser().parse_args(argv)).main()


if __name__ == "__main__":
    sys.exit(main())
