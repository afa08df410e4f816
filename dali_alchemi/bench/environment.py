"""Where a benchmark ran: the machine and the versions of the packages that matter, for its record."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

__all__ = ["machine_info", "package_versions"]


def machine_info(device: torch.device) -> dict[str, Any]:
    """The machine a run happened on."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "device": str(device),
    }
    try:
        with open("/proc/meminfo") as fh:
            info["memory_gb"] = round(int(fh.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def package_versions() -> dict[str, str]:
    """Versions of the packages that matter, and the git commit of this checkout when known."""
    versions = {}
    for dist in ("dali-alchemi", "numpy", "torch", "zarr", "numcodecs", "nvidia-dali-cuda120", "nvalchemi-toolkit"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    try:
        root = Path(__file__).resolve().parents[2]
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        if commit.returncode == 0:
            versions["commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return versions
