#!/usr/bin/env python3
"""Take the GPU check to an offline GPU machine: its missing wheels travel in parts, then it runs there.

The machine this is for has no package registry, its own Python 3.12 with torch (CUDA) and most of
what the project needs, and it accepts a working tree plus carried paths of 64 MiB at most per call.
Files it keeps between calls (while it stays warm) make it possible to send a large wheel in parts.

Here (with network)::

    route.py download      # pip-downloads the wheels the machine lacks (SHIPPED) into .gpu-route/wheels
    route.py split         # cuts them into parts under 60 MiB in .gpu-route/parts, with a manifest
    route.py plan          # prints the calls to make: what each carries, the one-line command of each

There (commands the plan prints)::

    route.py receive PART  # checks a part's sha256 and moves it into .gpu-route/received; exits at once
    route.py finish        # assemble + install + the GPU check, results under $OUT

``assemble`` and ``install`` are the two halves of ``finish``, usable alone. Standard library only: the
receiving end runs this file with the GPU machine's Python.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: every default path below is relative to it (commands run there)."""

WORK = ".gpu-route"  # ignored by git; everything this script writes lives under it
WHEELS = f"{WORK}/wheels"
PARTS = f"{WORK}/parts"
RECEIVED = f"{WORK}/received"
ASSEMBLED = f"{WORK}/assembled"
SITE = f"{WORK}/site"
MANIFEST = "manifest.json"
STAMP = ".gpu-route-installed.json"

MIB = 2**20
MAX_PART_BYTES = 60 * MIB - 64 * 1024
"""Parts stay under 60 MiB, so a part, its manifest and the working tree fit one call's 64 MiB."""
CALL_LIMIT_BYTES = 64 * MIB
COMMAND_LIMIT = 2000
"""Characters in one device command."""


@dataclass(frozen=True)
class Pin:
    """A wheel that travels: the version ``make install`` installs here, and who needs it."""

    name: str
    version: str
    why: str


SHIPPED = (
    Pin("zarr", "3.1.6", "the store format (dali_alchemi.store)"),
    Pin("numcodecs", "0.16.6", "chunk codecs (zarr; dali_alchemi.store.read.codecs)"),
    Pin("google-crc32c", "1.9.0", "chunk checksums (zarr; dali_alchemi.store.read.codecs)"),
    Pin("donfig", "0.8.1.post1", "zarr's configuration"),
    Pin("astunparse", "1.6.3", "DALI (its Python graph code)"),
    Pin("gast", "0.7.0", "DALI (its Python graph code)"),
    Pin("optree", "0.20.0", "DALI (nested outputs)"),
    Pin("nvidia-dali-cuda120", "2.4.0", "the loader (external_source, .gpu(), pipelines)"),
    Pin("nvidia-libnvcomp-cu12", "5.3.0.16", "nvCOMP: DALI's inflate, the loader's layout='inflate' (opened from ../libnvcomp/lib64)"),
)
"""Everything the GPU check needs that the machine lacks. The project itself travels as the working tree."""

LEFT_OUT = {
    "nvidia-nvimgcodec-cu12": "image and video decoders; no DALI library links it, DALI opens it only for decoder operators",
    "nvidia-nvjpeg-cu12, nvidia-nvjpeg2k-cu12, nvidia-nvtiff-cu12": "nvimgcodec[all]'s codecs",
    "libcst, makefun, nvtx": "imported only by DALI's experimental dynamic mode (nvidia.dali.experimental.dynamic), "
    "which the project does not use; the loader's tests pass without them, and leaving out their 5 MB saves a call",
}
"""DALI's requirements that this project never uses, and why. If the check ever fails with a
ModuleNotFoundError naming one of them, move it to SHIPPED (it costs one more part at most)."""

MACHINE_HAS = {
    "torch": "the project (a CUDA build: 2.11.0+cu130 there)",
    "numpy": "the project, DALI, zarr, numcodecs",
    "fsspec": "the project (remote stores)",
    "aiohttp": "the project (remote stores)",
    "rich": "the project's command line",
    "typing-extensions": "zarr, numcodecs, optree",
    "packaging": "zarr, DALI (<=26.3)",
    "six": "DALI, astunparse (<=1.17)",
    "pyyaml": "donfig",
    "wheel": "astunparse",
    "pytest": "the CUDA tests",
    "pytest-timeout": "the CUDA tests (pyproject sets a timeout)",
    "hypothesis": "the test suite's property tests (collected with the CUDA tests)",
}
"""What the GPU check needs and the machine already has (its image's package list), with who needs it."""

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


class RouteError(Exception):
    """Something about the wheels, parts or manifest is wrong; the message says what and what to do."""


# -- small helpers -------------------------------------------------------------------------------------
def _path(p: str | Path) -> Path:
    p = Path(p)
    return p if p.is_absolute() else ROOT / p


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def sha256_file(path: Path, chunk: int = 8 * MIB) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


def _log(msg: str) -> None:
    print(f"[gpu-route] {msg}", flush=True)


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def wheel_name_version(filename: str) -> tuple[str, str]:
    """``(name, version)`` of a wheel file name (``name-version(-build)?-py-abi-platform.whl``)."""
    if not filename.endswith(".whl") or filename.count("-") < 4:
        raise RouteError(f"{filename}: not a wheel file name (name-version-python-abi-platform.whl)")
    name, version = filename.split("-")[:2]
    return _normalise(name), version


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    out: list[str] = []
    for n in sorted(numbers):
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out) or "none"


# -- download --------------------------------------------------------------------------------------------
def download_command(dest: Path, python: str, python_version: str, pins: tuple[Pin, ...] = SHIPPED) -> list[str]:
    """The ``pip download`` command line for ``pins``: binary wheels only, no dependencies, for the target."""
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    cmd += ["--python-version", python_version, "--implementation", "cp"]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    return [*cmd, "-d", str(dest), *(f"{p.name}=={p.version}" for p in pins)]


def check_downloads(dest: Path, pins: tuple[Pin, ...] = SHIPPED) -> list[Path]:
    """The wheel of every pin in ``dest``, exactly one each and nothing else; raises otherwise."""
    by_name: dict[str, list[Path]] = {}
    for wheel in sorted(dest.glob("*.whl")):
        by_name.setdefault(wheel_name_version(wheel.name)[0], []).append(wheel)
    wanted = {_normalise(p.name): p for p in pins}
    problems = []
    for name, pin in wanted.items():
        found = by_name.get(name, [])
        versions = sorted(wheel_name_version(w.name)[1] for w in found)
        if versions != [pin.version]:
            problems.append(f"{pin.name}: want {pin.version}, found {versions or 'nothing'}")
    extra = sorted(w.name for name, ws in by_name.items() if name not in wanted for w in ws)
    if extra:
        problems.append(f"wheels that are not pinned (remove them): {', '.join(extra)}")
    if problems:
        raise RouteError(f"{_rel(dest)} does not hold exactly the pinned wheels: " + "; ".join(problems))
    return [by_name[name][0] for name in wanted]


def _local_versions(pins: tuple[Pin, ...]) -> list[str]:
    """Pins whose version differs from what this Python has installed (make install's environment)."""
    from importlib import metadata

    notes = []
    for pin in pins:
        try:
            have = metadata.version(pin.name)
        except metadata.PackageNotFoundError:
            continue
        if have != pin.version:
            notes.append(f"{pin.name}: pinned {pin.version}, this environment has {have}")
    return notes


def cmd_download(args: argparse.Namespace) -> int:
    dest = _path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.glob("*.whl"):
        if wheel_name_version(stale.name)[0] not in {_normalise(p.name) for p in SHIPPED}:
            stale.unlink()
    cmd = download_command(dest, args.python, args.python_version)
    _log(" ".join(shlex.quote(c) for c in cmd))
    subprocess.run(cmd, check=True)
    wheels = check_downloads(dest)
    total = sum(w.stat().st_size for w in wheels)
    for wheel in wheels:
        print(f"  {wheel.stat().st_size:>12,d}  {wheel.name}")
    print(f"  {total:>12,d}  bytes in {len(wheels)} wheels ({_mib(total)})")
    for note in _local_versions(SHIPPED):
        _log(f"warning: {note} (update SHIPPED so the GPU machine runs what is tested here)")
    return 0


# -- split -----------------------------------------------------------------------------------------------
def split_wheels(wheels: list[Path], parts_dir: Path, max_part_bytes: int = MAX_PART_BYTES) -> dict[str, Any]:
    """Concatenate ``wheels`` (smallest first) and cut the stream into parts of at most ``max_part_bytes``.

    Writes the parts and ``manifest.json`` (sha256 and byte range of every wheel and every part) to
    ``parts_dir``, replacing earlier parts there. Small wheels come first so that the first parts carry
    them whole and the big one last.
    """
    if max_part_bytes < 1:
        raise RouteError(f"max part size must be positive, got {max_part_bytes}")
    if not wheels:
        raise RouteError("no wheels to split (run `route.py download` first)")
    names = [w.name for w in wheels]
    if len(set(names)) != len(names):
        raise RouteError(f"two wheels share a file name: {sorted(n for n in names if names.count(n) > 1)}")
    ordered = sorted(wheels, key=lambda w: (w.stat().st_size, w.name))
    parts_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*parts_dir.glob("part-*.bin"), parts_dir / MANIFEST]:
        stale.unlink(missing_ok=True)
    total = sum(w.stat().st_size for w in ordered)
    n_parts = max(1, -(-total // max_part_bytes))
    width = max(2, len(str(n_parts)))
    entries, offset = [], 0
    bundle = hashlib.sha256()
    parts: list[dict[str, Any]] = []
    current: Any = None
    part_digest: Any = None
    part_size = 0

    def close_part() -> None:
        nonlocal current
        if current is not None:
            current.close()
            parts[-1].update(size=part_size, sha256=part_digest.hexdigest())
            current = None

    for wheel in ordered:
        digest = hashlib.sha256()
        size = wheel.stat().st_size
        with open(wheel, "rb") as fh:
            while block := fh.read(8 * MIB):
                digest.update(block)
                bundle.update(block)
                view = memoryview(block)
                while view:
                    if current is None or part_size == max_part_bytes:
                        close_part()
                        index = len(parts) + 1
                        part_name = f"part-{index:0{width}d}-of-{n_parts:0{width}d}.bin"
                        parts.append({"file": part_name, "index": index, "offset": (index - 1) * max_part_bytes})
                        current = open(parts_dir / part_name, "wb")
                        part_digest, part_size = hashlib.sha256(), 0
                    take = min(len(view), max_part_bytes - part_size)
                    current.write(view[:take])
                    part_digest.update(view[:take])
                    part_size += take
                    view = view[take:]
        name, version = wheel_name_version(wheel.name)
        entries.append(
            {"file": wheel.name, "name": name, "version": version, "size": size, "offset": offset,
             "sha256": digest.hexdigest()}
        )  # fmt: skip
        offset += size
    close_part()
    if len(parts) != n_parts:  # cannot happen: the stream is cut at fixed sizes
        raise RouteError(f"internal error: wrote {len(parts)} parts, expected {n_parts}")
    manifest = {
        "format": 1,
        "total_bytes": total,
        "max_part_bytes": max_part_bytes,
        "bundle_sha256": bundle.hexdigest(),
        "wheels": entries,
        "parts": parts,
    }
    (parts_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def cmd_split(args: argparse.Namespace) -> int:
    wheels_dir = _path(args.wheels)
    wheels = sorted(wheels_dir.glob("*.whl"))
    if args.pinned:
        wheels = check_downloads(wheels_dir)
    manifest = split_wheels(wheels, _path(args.parts), int(args.max_part_mib * MIB))
    for part in manifest["parts"]:
        print(f"  {part['size']:>12,d}  {part['file']}  sha256 {part['sha256'][:16]}...")
    print(
        f"  {manifest['total_bytes']:>12,d}  bytes of {len(manifest['wheels'])} wheels in "
        f"{len(manifest['parts'])} parts under {_rel(_path(args.parts))}"
    )
    return 0


# -- receive (on the GPU machine, one call per part) ------------------------------------------------------
def load_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise RouteError(f"no manifest at {_rel(path)}: carry {PARTS}/{MANIFEST} with the part") from None
    except json.JSONDecodeError as err:
        raise RouteError(f"{_rel(path)} is not valid JSON ({err}); carry it again") from None
    if manifest.get("format") != 1 or "parts" not in manifest or "wheels" not in manifest:
        raise RouteError(f"{_rel(path)} is not a gpu-route manifest (format 1 with parts and wheels)")
    return manifest


def check_part(path: Path, entry: dict[str, Any]) -> None:
    """Raise unless ``path`` has the size and sha256 the manifest gives for it."""
    if not path.is_file():
        raise RouteError(f"{entry['file']} is missing from {_rel(path.parent)}")
    size = path.stat().st_size
    if size != entry["size"]:
        raise RouteError(
            f"{entry['file']}: {size:,d} bytes, the manifest says {entry['size']:,d}: the transfer broke; carry it again"
        )
    digest = sha256_file(path)
    if digest != entry["sha256"]:
        raise RouteError(
            f"{entry['file']}: sha256 mismatch (got {digest}, the manifest says {entry['sha256']}): carry it again"
        )


def received_parts(received: Path, manifest: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Indices of the parts present in ``received`` (by size; sha256 was checked on arrival), and the missing."""
    have, missing = [], []
    for entry in manifest["parts"]:
        path = received / entry["file"]
        (have if path.is_file() and path.stat().st_size == entry["size"] else missing).append(entry["index"])
    return have, missing


def receive_part(part: Path, received: Path, manifest_path: Path | None = None) -> tuple[dict[str, Any], list[int]]:
    """Check ``part`` against its manifest and move both into ``received``; returns the manifest and missing parts.

    A manifest for a different bundle than the one already in ``received`` starts it afresh.
    """
    manifest_path = manifest_path or part.parent / MANIFEST
    manifest = load_manifest(manifest_path)
    entry = next((p for p in manifest["parts"] if p["file"] == part.name), None)
    if entry is None:
        raise RouteError(f"{part.name} is not a part of the bundle in {_rel(manifest_path)}")
    check_part(part, entry)
    received.mkdir(parents=True, exist_ok=True)
    old = received / MANIFEST
    if old.exists() and load_manifest(old)["bundle_sha256"] != manifest["bundle_sha256"]:
        for stale in received.glob("part-*.bin"):
            stale.unlink()
    if manifest_path.resolve() != old.resolve():
        shutil.copyfile(manifest_path, old)
    shutil.move(str(part), str(received / part.name))
    _, missing = received_parts(received, manifest)
    return manifest, missing


def cmd_receive(args: argparse.Namespace) -> int:
    part = _path(args.part)
    manifest, missing = receive_part(part, _path(args.received), _path(args.manifest) if args.manifest else None)
    have = [p["index"] for p in manifest["parts"] if p["index"] not in missing]
    _log(f"{part.name}: sha256 ok; have parts {_ranges(have)} of {len(manifest['parts'])}, missing {_ranges(missing)}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    received = _path(args.received)
    manifest = load_manifest(received / MANIFEST)
    have, missing = received_parts(received, manifest)
    _log(f"have parts {_ranges(have)} of {len(manifest['parts'])}, missing {_ranges(missing)}")
    return 0 if not missing else 1


def cmd_probe(args: argparse.Namespace) -> int:
    """Print this Python and which of the packages the route expects on the machine are there."""
    from importlib import metadata

    print(f"python {sys.version.split()[0]} at {sys.executable}")
    absent = []
    for name, why in MACHINE_HAS.items():
        try:
            print(f"  {name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            absent.append(name)
            print(f"  {name} MISSING (needed by {why})")
    shipped = []
    for pin in SHIPPED:
        try:
            shipped.append(f"{pin.name} {metadata.version(pin.name)}")
        except metadata.PackageNotFoundError:
            pass
    if shipped:
        print("  already there, shipped anyway: " + ", ".join(shipped))
    return 1 if absent else 0


# -- assemble and install (on the GPU machine) --------------------------------------------------------------
def assemble(
    received: Path, out: Path, *, allow_missing: bool = False
) -> tuple[list[Path], dict[str, list[int]], dict[str, Any]]:
    """Rebuild the wheels from the parts in ``received`` into ``out``, checking every sha256.

    Returns the wheels rebuilt, the wheels that could not be (with the parts they still need) and the
    manifest. A corrupt part or wheel is always an error; missing parts are one unless ``allow_missing``,
    in which case the wheels they do not touch are still rebuilt.
    """
    manifest = load_manifest(received / MANIFEST)
    parts = manifest["parts"]
    have, missing = received_parts(received, manifest)
    if missing and not allow_missing:
        raise RouteError(
            f"parts {_ranges(missing)} of {len(parts)} are missing from {_rel(received)}: make their calls again"
        )
    for entry in parts:
        if entry["index"] in have:
            check_part(received / entry["file"], entry)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.whl"):
        stale.unlink()
    built, incomplete = [], {}
    for wheel in manifest["wheels"]:
        start, end = wheel["offset"], wheel["offset"] + wheel["size"]
        needs = [p for p in parts if p["offset"] < end and p["offset"] + p["size"] > start]
        lacking = [p["index"] for p in needs if p["index"] in missing]
        if lacking:
            incomplete[wheel["file"]] = lacking
            continue
        target = out / wheel["file"]
        digest = hashlib.sha256()
        with open(target, "wb") as dst:
            for p in needs:
                lo, hi = max(start, p["offset"]), min(end, p["offset"] + p["size"])
                with open(received / p["file"], "rb") as src:
                    src.seek(lo - p["offset"])
                    remaining = hi - lo
                    while remaining:
                        block = src.read(min(8 * MIB, remaining))
                        if not block:
                            raise RouteError(f"{p['file']} ended early while rebuilding {wheel['file']}")
                        dst.write(block)
                        digest.update(block)
                        remaining -= len(block)
        if digest.hexdigest() != wheel["sha256"]:
            target.unlink()
            raise RouteError(
                f"{wheel['file']}: sha256 mismatch after reassembly (got {digest.hexdigest()}, the manifest says "
                f"{wheel['sha256']}): split again here and resend every part"
            )
        built.append(target)
    return built, incomplete, manifest


def install(wheels: list[Path], target: Path, python: str = sys.executable) -> dict[str, Any]:
    """``pip install --no-index --no-deps --target`` of ``wheels`` into a clean ``target``; skipped when done.

    ``target`` holds a stamp of the wheels (by sha256) it was made from; the same wheels again are not
    reinstalled, so a rerun on a warm machine starts the check at once.
    """
    wanted = sorted((w.name, sha256_file(w)) for w in wheels)
    stamp = target / STAMP
    if stamp.is_file():
        try:
            if json.loads(stamp.read_text()).get("wheels") == [list(x) for x in wanted]:
                return {"installed": [n for n, _ in wanted], "seconds": 0.0, "skipped": "already installed"}
        except json.JSONDecodeError:
            pass
    if target.exists():
        shutil.rmtree(target)
    if not wheels:
        target.mkdir(parents=True)
        return {"installed": [], "seconds": 0.0}
    cmd = [python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--disable-pip-version-check", "--quiet", "--target", str(target), *map(str, wheels)]  # fmt: skip
    started = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RouteError(
            f"pip install --target {_rel(target)} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"
        )
    stamp.write_text(json.dumps({"wheels": [list(x) for x in wanted]}) + "\n")
    return {"installed": [n for n, _ in wanted], "seconds": round(seconds, 2)}


def visible_versions(names: list[str], python: str, env: dict[str, str]) -> dict[str, Any]:
    """The version and location of each distribution as ``python`` sees it with ``env``."""
    code = (
        "import json, sys\nfrom importlib import metadata\nout = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        d = metadata.distribution(name)\n"
        "        out[name] = {'version': d.version, 'location': str(d.locate_file(''))}\n"
        "    except metadata.PackageNotFoundError:\n"
        "        out[name] = None\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        return {"error": result.stderr.strip()[-2000:]}
    return json.loads(result.stdout)


def cmd_assemble(args: argparse.Namespace) -> int:
    built, incomplete, _ = assemble(_path(args.received), _path(args.out), allow_missing=args.allow_missing)
    for wheel in built:
        print(f"  {wheel.stat().st_size:>12,d}  {wheel.name}  sha256 ok")
    for name, lacking in incomplete.items():
        print(f"  {'':>12}  {name}  INCOMPLETE: needs parts {_ranges(lacking)}")
    return 1 if incomplete else 0


def cmd_install(args: argparse.Namespace) -> int:
    wheels = sorted(_path(args.wheels).glob("*.whl"))
    if not wheels:
        raise RouteError(f"no wheels in {_rel(_path(args.wheels))} (run `route.py assemble` first)")
    report = install(wheels, _path(args.target), args.python)
    _log(f"installed {len(report['installed'])} wheels into {_rel(_path(args.target))} in {report['seconds']} s")
    return 0


def cmd_finish(args: argparse.Namespace) -> int:
    """Assemble what arrived, install it into the target folder and run the GPU check with it."""
    out = Path(args.out or os.environ.get("OUT") or ROOT / "bench-results" / "gpu-check")
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    route_file = out / "route.json"

    def save() -> None:
        route_file.write_text(json.dumps(report, indent=2) + "\n")

    started = time.perf_counter()
    received, target = _path(args.received), _path(args.target)
    try:
        built, incomplete, manifest = assemble(received, _path(args.assembled), allow_missing=True)
        report.update(
            assembled=[w.name for w in built], incomplete=incomplete, assemble_s=round(time.perf_counter() - started, 2)
        )
        for name, lacking in incomplete.items():
            _log(f"{name} is incomplete (needs parts {_ranges(lacking)}): the check runs without it")
        report["install"] = install(built, target, args.python)
        _log(f"{len(built)} wheels in {_rel(target)} ({report['install'].get('skipped') or 'installed'}) "
             f"after {time.perf_counter() - started:.1f} s")  # fmt: skip
    except RouteError as err:
        report["error"] = str(err)
        save()
        raise
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), str(ROOT), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    report["pythonpath"] = [_rel(Path(p)) for p in env["PYTHONPATH"].split(os.pathsep)]
    report["visible"] = visible_versions([w["name"] for w in manifest["wheels"]], args.python, env)
    save()
    check = [args.python, str(ROOT / "scripts" / "gpu_check.py"), "--python", args.python, "--results", str(out)]
    if args.cpu:
        check.append("--cpu")
    if args.budget_s:
        check += ["--budget-s", str(args.budget_s)]
    if args.pytest_args:
        check += ["--pytest-args", args.pytest_args]
    _log("running " + " ".join(shlex.quote(c) for c in check))
    rc = subprocess.run(check, env=env, cwd=ROOT).returncode
    report.update(check_exit=rc, total_s=round(time.perf_counter() - started, 1))
    save()
    return rc or (1 if incomplete else 0)


# -- plan ----------------------------------------------------------------------------------------------------
def tree_bytes() -> int:
    """Bytes of the working tree that travels with every call (tracked and untracked-not-ignored files)."""
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return 0
    total = 0
    for name in filter(None, listing.split(b"\0")):
        path = ROOT / os.fsdecode(name)
        if path.is_file():
            total += path.stat().st_size
    return total


def make_plan(
    manifest: dict[str, Any],
    *,
    parts_dir: str = PARTS,
    python: str = "python3",
    budget_s: int = 240,
    tree: int = 0,
    manifest_bytes: int = 4096,
    start_s: float = 90,
    per_call_s: float = 25,
    install_s: float = 45,
) -> dict[str, Any]:
    """The device calls, in order: what each carries, its command and timeout, and the time they take."""
    route = "tools/gpu-route/route.py"
    manifest_path = f"{parts_dir}/{MANIFEST}"
    parts = manifest["parts"]
    calls = []
    for k, part in enumerate(parts, start=1):
        path = f"{parts_dir}/{part['file']}"
        receive, probe = f"{python} {route} receive {path}", f"{python} {route} probe"
        finish = f"{python} {route} finish --budget-s {budget_s}"
        last = k == len(parts)
        if last:  # a part that fails its check stops here: resending it costs less than a check without it
            after = f"{{ {probe}; {finish}; }}" if k == 1 else finish
            command = f"export PYTHONUNBUFFERED=1; {receive} && {after}"
        else:
            command = f"{receive} && {probe}" if k == 1 else receive
        timeout = min(600, int(budget_s + install_s + 90)) if last else 60
        end = part["offset"] + part["size"]
        completes = [
            f"{w['name']} {w['version']}" for w in manifest["wheels"] if part["offset"] < w["offset"] + w["size"] <= end
        ]
        calls.append({"call": k, "carry": [manifest_path, path], "command": command, "timeout_s": timeout,
                      "carry_bytes": part["size"] + manifest_bytes, "completes": completes})  # fmt: skip
    rerun = {
        "carry": [],
        "command": f"export PYTHONUNBUFFERED=1; {python} {route} finish --budget-s {budget_s}",
        "timeout_s": min(600, int(budget_s + 90)),
    }
    for call in [*calls, rerun]:
        if len(call["command"]) > COMMAND_LIMIT:
            raise RouteError(f"a command is {len(call['command'])} characters, over the {COMMAND_LIMIT} limit")
    for call in calls:
        if tree + call["carry_bytes"] > CALL_LIMIT_BYTES:
            raise RouteError(
                f"call {call['call']} would send {_mib(tree + call['carry_bytes'])} (working tree {_mib(tree)} + "
                f"carried {_mib(call['carry_bytes'])}), over 64 MiB: split with a smaller --max-part-mib"
            )
    estimate = start_s + per_call_s * len(calls) + install_s + budget_s
    return {"calls": calls, "rerun": rerun, "tree_bytes": tree, "estimate_s": estimate,
            "assumed": {"start_s": start_s, "per_call_s": per_call_s, "install_s": install_s, "check_s": budget_s}}  # fmt: skip


def cmd_plan(args: argparse.Namespace) -> int:
    parts_dir = _path(args.parts)
    manifest = load_manifest(parts_dir / MANIFEST)
    for part in manifest["parts"]:
        check_part(parts_dir / part["file"], part)
    plan = make_plan(
        manifest, parts_dir=_rel(parts_dir), python=args.remote_python, budget_s=args.budget_s, tree=tree_bytes(),
        manifest_bytes=(parts_dir / MANIFEST).stat().st_size, start_s=args.start_s, per_call_s=args.per_call_s,
        install_s=args.install_s,
    )  # fmt: skip
    if args.json:
        print(json.dumps(plan, indent=2))
        return 0
    n = len(plan["calls"])
    print(f"{manifest['total_bytes']:,d} bytes of {len(manifest['wheels'])} wheels in {n} parts; "
          f"working tree {_mib(plan['tree_bytes'])} travels with each call.")  # fmt: skip
    print("Make the calls one right after the other: the machine stays warm about 30 s after each,")
    print("and a machine that went back has lost the parts (receive then reports what is missing).\n")
    for call in plan["calls"]:
        print(f"call {call['call']} of {n}: timeout_s {call['timeout_s']}, carry {json.dumps(call['carry'])}")
        print(f"  {call['command']}")
        if call["completes"]:
            print(f"  (completes {', '.join(call['completes'])})")
        print()
    print("rerun on the same warm machine (parts and installed wheels are still there), or, short of time")
    print("after any call, the check with what has arrived (the pure-torch CUDA steps run without DALI):")
    print(f"  timeout_s {plan['rerun']['timeout_s']}, carry []\n  {plan['rerun']['command']}\n")
    a = plan["assumed"]
    print(f"device time, estimated: {plan['estimate_s'] / 60:.1f} min = start {a['start_s']:.0f} s + {n} calls x "
          f"{a['per_call_s']:.0f} s + install {a['install_s']:.0f} s + check {a['check_s']} s")  # fmt: skip
    if plan["estimate_s"] > 600:
        print("warning: over 10 minutes; lower --budget-s or ship fewer bytes")
    return 0


# -- command line ----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="route.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("download", help="pip-download the wheels the GPU machine lacks (needs network)")
    p.add_argument("--dest", default=WHEELS)
    p.add_argument("--python", default=sys.executable, help="the Python whose pip downloads (default: this one)")
    p.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("split", help="cut the wheels into parts with a manifest of sha256s")
    p.add_argument("--wheels", default=WHEELS)
    p.add_argument("--parts", default=PARTS)
    p.add_argument("--max-part-mib", type=float, default=MAX_PART_BYTES / MIB)
    p.add_argument("--any", dest="pinned", action="store_false", help="split whatever wheels are there (tests)")
    p.set_defaults(func=cmd_split)

    p = sub.add_parser("plan", help="print the device calls: what each carries and its command")
    p.add_argument("--parts", default=PARTS)
    p.add_argument("--remote-python", default="python3", help="the GPU machine's Python (default python3)")
    p.add_argument("--budget-s", type=int, default=240, help="seconds the GPU check may take (default 240)")
    p.add_argument("--start-s", type=float, default=90, help="assumed machine start (estimate only)")
    p.add_argument("--per-call-s", type=float, default=25, help="assumed seconds per shipping call")
    p.add_argument("--install-s", type=float, default=45, help="assumed seconds to assemble and install")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("receive", help="(GPU machine) check a carried part and move it into the received folder")
    p.add_argument("part")
    p.add_argument("--manifest", help="default: manifest.json beside the part")
    p.add_argument("--received", default=RECEIVED)
    p.set_defaults(func=cmd_receive)

    p = sub.add_parser("status", help="(GPU machine) which parts have arrived")
    p.add_argument("--received", default=RECEIVED)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("probe", help="(GPU machine) this Python and the packages the route expects there")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("assemble", help="(GPU machine) rebuild the wheels from the parts, checking sha256s")
    p.add_argument("--received", default=RECEIVED)
    p.add_argument("--out", default=ASSEMBLED)
    p.add_argument("--allow-missing", action="store_true", help="rebuild the wheels that missing parts do not touch")
    p.set_defaults(func=cmd_assemble)

    p = sub.add_parser("install", help="(GPU machine) pip install --no-index --no-deps --target the wheels")
    p.add_argument("--wheels", default=ASSEMBLED)
    p.add_argument("--target", default=SITE)
    p.add_argument("--python", default=sys.executable)
    p.set_defaults(func=cmd_install)

    p = sub.add_parser("finish", help="(GPU machine) assemble, install and run the GPU check; results in $OUT")
    p.add_argument("--out", help="results folder (default $OUT, else bench-results/gpu-check)")
    p.add_argument("--received", default=RECEIVED)
    p.add_argument("--assembled", default=ASSEMBLED)
    p.add_argument("--target", default=SITE)
    p.add_argument("--python", default=sys.executable, help="the Python that runs the check (default: this one)")
    p.add_argument("--budget-s", type=int, help="seconds the check may take (passed to gpu_check.py)")
    p.add_argument("--cpu", action="store_true", help="no GPU: run the CPU part of the suite, skip the CUDA steps")
    p.add_argument("--pytest-args", help="with --cpu: what pytest runs (default: the suite without gpu/slow)")
    p.set_defaults(func=cmd_finish)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except RouteError as err:
        print(f"gpu-route: error: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        print(f"gpu-route: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
