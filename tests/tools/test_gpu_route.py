"""The offline GPU route (tools/gpu-route/route.py): parts, checksums, install from parts, the plan.

Everything runs here without network or GPU: the wheels are small ones built by the tests.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.scripts.stand_in import load_script, write_stand_in

ROOT = Path(__file__).resolve().parents[2]
ROUTE_PY = ROOT / "tools" / "gpu-route" / "route.py"




route = load_script("gpu_route", ROUTE_PY)


def make_wheel(dest: Path, name: str = "gpuroute_probe", version: str = "1.0", payload: int = 30_000) -> Path:
    """A real, installable py3 wheel: a package whose ``VALUE`` names it, plus ``payload`` random bytes."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {name + ' ' + version!r}\n".encode(),
        f"{name}/blob.bin": os.urandom(payload),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def fake_wheels(dest: Path, sizes: dict[str, int]) -> list[Path]:
    """Files with wheel names and random contents (enough for splitting; not installable)."""
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, size in sizes.items():
        path = dest / f"{name}-1.0-py3-none-any.whl"
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths


def receive_all(parts: Path, received: Path) -> dict:
    manifest = json.loads((parts / "manifest.json").read_text())
    missing = None
    for part in manifest["parts"]:
        _, missing = route.receive_part(parts / part["file"], received)
    assert missing == []
    return manifest


def test_split_then_reassemble_gives_back_every_wheel_byte_for_byte(tmp_path: Path) -> None:
    wheels = fake_wheels(tmp_path / "w", {"big": 10_000, "tiny": 10, "mid": 2_500, "small": 700})
    manifest = route.split_wheels(wheels, tmp_path / "parts", max_part_bytes=3_000)
    assert [w["name"] for w in manifest["wheels"]] == ["tiny", "small", "mid", "big"]  # smallest first
    assert manifest["total_bytes"] == 13_210 and len(manifest["parts"]) == 5  # ceil(13210 / 3000)
    assert [p["file"] for p in manifest["parts"]][:2] == ["part-01-of-05.bin", "part-02-of-05.bin"]
    stream = b""
    for part in manifest["parts"]:
        data = (tmp_path / "parts" / part["file"]).read_bytes()
        assert len(data) == part["size"] <= 3_000 and hashlib.sha256(data).hexdigest() == part["sha256"]
        stream += data
    assert hashlib.sha256(stream).hexdigest() == manifest["bundle_sha256"]
    receive_all(tmp_path / "parts", tmp_path / "received")
    assert not list((tmp_path / "parts").glob("part-*.bin"))  # moved, not copied
    built, incomplete, _ = route.assemble(tmp_path / "received", tmp_path / "out")
    assert incomplete == {}
    assert sorted(w.name for w in built) == sorted(w.name for w in wheels)
    for wheel in wheels:
        assert (tmp_path / "out" / wheel.name).read_bytes() == wheel.read_bytes()


def test_a_corrupt_part_is_refused_on_arrival_with_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    route.split_wheels(fake_wheels(tmp_path / "w", {"a": 5_000}), tmp_path / "parts", max_part_bytes=2_000)
    part = tmp_path / "parts" / "part-02-of-03.bin"
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(
        route.RouteError, match=r"part-02-of-03.bin: sha256 mismatch \(got [0-9a-f]{64}.*carry it again"
    ):
        route.receive_part(part, tmp_path / "received")
    assert route.main(["receive", str(part), "--received", str(tmp_path / "received")]) == 2
    assert "gpu-route: error: part-02-of-03.bin: sha256 mismatch" in capsys.readouterr().err
    part.write_bytes(bytes(data[:-1]))
    with pytest.raises(route.RouteError, match="1,999 bytes, the manifest says 2,000"):
        route.receive_part(part, tmp_path / "received")
    assert part.exists()  # a refused part stays where it arrived


def test_corruption_after_arrival_and_a_wrong_wheel_checksum_stop_the_assembly(tmp_path: Path) -> None:
    route.split_wheels(fake_wheels(tmp_path / "w", {"a": 3_000, "b": 4_000}), tmp_path / "parts", max_part_bytes=2_500)
    receive_all(tmp_path / "parts", tmp_path / "received")
    part = tmp_path / "received" / "part-01-of-03.bin"
    original = part.read_bytes()
    part.write_bytes(bytes([original[0] ^ 0xFF]) + original[1:])  # a changed first byte, whatever it was
    with pytest.raises(route.RouteError, match=r"part-01-of-03\.bin: sha256 mismatch"):
        route.assemble(tmp_path / "received", tmp_path / "out")
    part.write_bytes(original)
    manifest_path = tmp_path / "received" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["wheels"][1]["sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(route.RouteError, match=r"b-1.0-py3-none-any.whl: sha256 mismatch after reassembly"):
        route.assemble(tmp_path / "received", tmp_path / "out")
    assert not (tmp_path / "out" / "b-1.0-py3-none-any.whl").exists()


def test_missing_parts_are_named_and_the_wheels_they_do_not_touch_still_build(tmp_path: Path) -> None:
    wheels = fake_wheels(tmp_path / "w", {"dali": 9_000, "zarr": 500, "codecs": 1_200})
    manifest = route.split_wheels(wheels, tmp_path / "parts", max_part_bytes=3_000)
    assert len(manifest["parts"]) == 4
    for part in manifest["parts"][:2]:  # the machine went back after two calls' worth
        route.receive_part(tmp_path / "parts" / part["file"], tmp_path / "received")
    with pytest.raises(route.RouteError, match=r"parts 3-4 of 4 are missing .*make their calls again"):
        route.assemble(tmp_path / "received", tmp_path / "out")
    built, incomplete, _ = route.assemble(tmp_path / "received", tmp_path / "out", allow_missing=True)
    assert sorted(w.name for w in built) == ["codecs-1.0-py3-none-any.whl", "zarr-1.0-py3-none-any.whl"]
    assert incomplete == {"dali-1.0-py3-none-any.whl": [3, 4]}
    assert route.main(["status", "--received", str(tmp_path / "received")]) == 1


def test_a_new_bundle_replaces_the_parts_of_an_old_one(tmp_path: Path) -> None:
    route.split_wheels(fake_wheels(tmp_path / "old", {"a": 3_000}), tmp_path / "p1", max_part_bytes=1_000)
    route.receive_part(tmp_path / "p1" / "part-01-of-03.bin", tmp_path / "received")
    route.split_wheels(fake_wheels(tmp_path / "new", {"a": 2_000}), tmp_path / "p2", max_part_bytes=1_000)
    _, missing = route.receive_part(tmp_path / "p2" / "part-02-of-02.bin", tmp_path / "received")
    assert missing == [1]  # the old bundle's part 1 does not count
    assert sorted(p.name for p in (tmp_path / "received").glob("part-*")) == ["part-02-of-02.bin"]


def test_install_from_parts_into_a_target_folder(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", payload=30_000)
    route.split_wheels([wheel], tmp_path / "parts", max_part_bytes=8_000)  # the wheel spans 4 parts
    receive_all(tmp_path / "parts", tmp_path / "received")
    built, _, _ = route.assemble(tmp_path / "received", tmp_path / "out")
    report = route.install(built, tmp_path / "site")
    assert report["installed"] == [wheel.name] and "skipped" not in report
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    code = "import gpuroute_probe, sys; print(gpuroute_probe.VALUE, len(open(gpuroute_probe.__path__[0] + '/blob.bin', 'rb').read()))"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["gpuroute_probe", "1.0", "30000"]
    seen = route.visible_versions(["gpuroute-probe"], sys.executable, env)
    assert seen["gpuroute-probe"]["version"] == "1.0"
    assert Path(seen["gpuroute-probe"]["location"]).resolve() == (tmp_path / "site").resolve()
    assert route.install(built, tmp_path / "site")["skipped"] == "already installed"  # a rerun starts at once


def test_a_failing_install_says_what_pip_said(tmp_path: Path) -> None:
    broken = fake_wheels(tmp_path / "w", {"broken": 100})  # random bytes: not a zip
    with pytest.raises(route.RouteError, match=r"pip install --target .* failed"):
        route.install(broken, tmp_path / "site")


def test_the_plan_fits_one_call_each_and_the_command_limit(tmp_path: Path) -> None:
    sizes = {"nvidia_dali_cuda120": 9_000, "zarr": 300, "numcodecs": 900}
    manifest = route.split_wheels(fake_wheels(tmp_path / "w", sizes), tmp_path / "parts", max_part_bytes=2_048)
    plan = route.make_plan(manifest, tree=700_000, budget_s=240)
    calls = plan["calls"]
    assert len(calls) == len(manifest["parts"]) == 5
    for call, part in zip(calls, manifest["parts"], strict=True):
        assert call["carry"] == [".gpu-route/parts/manifest.json", f".gpu-route/parts/{part['file']}"]
        assert len(call["command"]) <= route.COMMAND_LIMIT and "\n" not in call["command"]
        assert f"route.py receive .gpu-route/parts/{part['file']}" in call["command"]
        assert call["timeout_s"] <= 600
    assert "probe" in calls[0]["command"] and "finish" not in calls[0]["command"]
    assert calls[0]["completes"] == ["zarr 1.0", "numcodecs 1.0"]  # the small wheels arrive first
    assert [c["completes"] for c in calls[1:]] == [[], [], [], ["nvidia-dali-cuda120 1.0"]]
    assert all(c["command"].startswith("python3 ") and c["timeout_s"] == 60 for c in calls[:-1])
    assert calls[-1]["command"].endswith("finish --budget-s 240") and calls[-1]["timeout_s"] >= 240
    assert "receive" not in plan["rerun"]["command"] and plan["rerun"]["carry"] == []
    assert plan["estimate_s"] == 90 + 25 * 5 + 45 + 240
    with pytest.raises(route.RouteError, match="over 64 MiB: split with a smaller --max-part-mib"):
        route.make_plan(manifest, tree=64 * route.MIB)
    single = route.split_wheels(fake_wheels(tmp_path / "one", {"a": 100}), tmp_path / "p1", max_part_bytes=2_048)
    (call,) = route.make_plan(single)["calls"]
    assert call["command"].endswith("receive .gpu-route/parts/part-01-of-01.bin && "
                                    "{ python3 tools/gpu-route/route.py probe; "
                                    "python3 tools/gpu-route/route.py finish --budget-s 240; }")  # fmt: skip


def test_the_real_plan_command_prints_every_call(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    route.split_wheels(fake_wheels(tmp_path / "w", {"a": 5_000}), tmp_path / "parts", max_part_bytes=2_000)
    assert route.main(["plan", "--parts", str(tmp_path / "parts"), "--budget-s", "200"]) == 0
    out = capsys.readouterr().out
    assert "5,000 bytes of 1 wheels in 3 parts" in out
    assert out.count("\ncall ") == 3 and "call 3 of 3: timeout_s" in out
    commands = [line.strip() for line in out.splitlines() if "route.py" in line]
    assert len(commands) == 4 and all(len(c) <= route.COMMAND_LIMIT for c in commands)
    assert route.main(["plan", "--parts", str(tmp_path / "parts"), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["calls"]) == 3


def test_the_pins_are_what_the_project_requires_and_nothing_the_machine_has() -> None:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    required = {route._normalise(d.split(">")[0].split("=")[0].split("<")[0].strip()) for d in deps}
    shipped = {route._normalise(p.name) for p in route.SHIPPED}
    there = {route._normalise(n) for n in route.MACHINE_HAS}
    assert not shipped & there
    assert required <= shipped | there, (
        f"runtime dependencies neither shipped nor on the machine: {required - shipped - there}"
    )
    assert {"nvidia-dali-cuda120", "zarr", "numcodecs", "google-crc32c", "donfig"} <= shipped
    assert all(p.version and p.why for p in route.SHIPPED)
    command = route.download_command(Path("d"), "python", "3.12")
    assert command[4:7] == ["--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    assert "manylinux_2_28_x86_64" in command and "nvidia-dali-cuda120==2.4.0" in command


def test_downloads_are_checked_against_the_pins(tmp_path: Path) -> None:
    pins = (route.Pin("zarr", "3.1.6", "x"), route.Pin("google-crc32c", "1.9.0", "y"))
    (tmp_path / "zarr-3.1.6-py3-none-any.whl").write_bytes(b"z")
    with pytest.raises(route.RouteError, match=r"google-crc32c: want 1.9.0, found nothing"):
        route.check_downloads(tmp_path, pins)
    (tmp_path / "google_crc32c-1.9.0-cp312-cp312-manylinux2014_x86_64.whl").write_bytes(b"g")
    assert [p.name for p in route.check_downloads(tmp_path, pins)] == [
        "zarr-3.1.6-py3-none-any.whl",
        "google_crc32c-1.9.0-cp312-cp312-manylinux2014_x86_64.whl",
    ]
    (tmp_path / "zarr-3.1.5-py3-none-any.whl").write_bytes(b"z")
    (tmp_path / "extra-1-py3-none-any.whl").write_bytes(b"e")
    with pytest.raises(route.RouteError, match=r"zarr: want 3.1.6, found \['3.1.5', '3.1.6'\].*not pinned.*extra-1"):
        route.check_downloads(tmp_path, pins)


def _ship(tmp_path: Path) -> dict[str, Path]:
    """A real wheel sent in parts and received, as the calls before the final one leave it."""
    wheel = make_wheel(tmp_path / "w", payload=20_000)
    route.split_wheels([wheel], tmp_path / "parts", max_part_bytes=7_000)
    receive_all(tmp_path / "parts", tmp_path / "received")
    return {"received": tmp_path / "received", "assembled": tmp_path / "assembled", "target": tmp_path / "site"}


def _finish_args(paths: dict[str, Path], out: Path, python: Path | str, *extra: str) -> list[str]:
    return ["finish", "--out", str(out), "--python", str(python), "--received", str(paths["received"]),
            "--assembled", str(paths["assembled"]), "--target", str(paths["target"]), *extra]  # fmt: skip


def test_the_final_command_installs_from_parts_and_runs_the_check_with_pythonpath_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _ship(tmp_path)
    out = tmp_path / "out"
    python = write_stand_in(tmp_path / "python3")  # a GPU machine's Python, with DALI
    monkeypatch.setenv("FAKE_RESULTS", str(out))
    monkeypatch.setenv("FAKE_GPU", "{}")
    assert route.main(_finish_args(paths, out, python, "--budget-s", "60")) == 0
    report = json.loads((out / "route.json").read_text())
    assert report["assembled"] == ["gpuroute_probe-1.0-py3-none-any.whl"] and report["incomplete"] == {}
    assert report["visible"]["gpuroute-probe"]["version"] == "1.0"
    assert Path(report["visible"]["gpuroute-probe"]["location"]).resolve() == paths["target"].resolve()
    assert report["check_exit"] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["budget_s"] == 60 and all(s["status"] == "passed" for s in summary["steps"].values())
    trace = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert trace[0]["pythonpath"].split(os.pathsep)[:2] == [str(paths["target"]), str(ROOT)]
    assert sorted(p.name for p in out.iterdir()) == [
        "augment.json", "gpu-check.log", "h2d.json", "route.json", "summary.json",
    ]  # fmt: skip
    assert route.main(_finish_args(paths, out, python)) == 0  # the rerun: no reinstall
    assert json.loads((out / "route.json").read_text())["install"]["skipped"] == "already installed"


@pytest.mark.slow
def test_the_final_command_runs_the_cpu_part_of_the_suite(tmp_path: Path) -> None:
    paths = _ship(tmp_path)
    out = tmp_path / "out"
    args = _finish_args(
        paths, out, sys.executable, "--cpu", "--pytest-args", "tests/test_batch.py tests/plan/test_fixed.py"
    )
    proc = subprocess.run([sys.executable, str(ROUTE_PY), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    tests = summary["steps"]["tests-cpu"]
    assert tests["status"] == "passed" and tests["counts"]["passed"] >= 10 and tests["counts"]["failed"] == 0
    assert summary["steps"]["augment"]["status"] == "passed"
    assert json.loads((out / "route.json").read_text())["visible"]["gpuroute-probe"]["version"] == "1.0"
    assert "pure torch (--cpu: no CUDA):\n  tests-cpu      passed" in proc.stdout


def test_the_printed_calls_run_as_printed_on_a_copy_of_the_tree(tmp_path: Path) -> None:
    """What the device tool does: each call copies the tree and the carried paths, then runs the command."""
    here, machine, out = tmp_path / "here", tmp_path / "machine", tmp_path / "out"
    shutil.copytree(ROOT / "scripts", machine / "scripts")
    shutil.copytree(ROOT / "tools", machine / "tools")
    route.split_wheels([make_wheel(tmp_path / "w", payload=20_000)], here / route.PARTS, max_part_bytes=7_000)
    python = write_stand_in(tmp_path / "python3")  # the GPU machine's python3, with a GPU and DALI
    plan = route.make_plan(json.loads((here / route.PARTS / "manifest.json").read_text()), python=str(python))
    env = {**os.environ, "OUT": str(out), "FAKE_RESULTS": str(out), "FAKE_GPU": "{}"}

    def call(command: str, carry: list[str]) -> subprocess.CompletedProcess[str]:
        for path in carry:
            (machine / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(here / path, machine / path)
        # here the stand-in must also run the check; there, finish's own Python is the machine's
        command = command.replace(" finish ", f" finish --python {python} ")
        return subprocess.run(["bash", "-c", command], cwd=machine, env=env, capture_output=True, text=True)

    for c in plan["calls"]:
        done = call(c["command"], c["carry"])
        assert "sha256 ok" in done.stdout, done.stdout + done.stderr
        assert done.returncode == 0 or (c["call"] == 1 and "MISSING" in done.stdout), done.stdout + done.stderr
    n = len(plan["calls"])
    assert n >= 3 and f"have parts 1-{n} of {n}, missing none" in done.stdout
    assert done.returncode == 0 and "== gpu-check summary: Stand-in GPU" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["budget_s"] == 240 and all(s["status"] == "passed" for s in summary["steps"].values())
    again = call(plan["rerun"]["command"], plan["rerun"]["carry"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads((out / "route.json").read_text())["install"]["skipped"] == "already installed"
