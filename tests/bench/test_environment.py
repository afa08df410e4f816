"""What a benchmark record says of where it ran."""

from __future__ import annotations

import os
import platform

import torch

from dali_alchemi.bench.environment import machine_info, package_versions


def test_machine_info_names_the_machine_and_device() -> None:
    info = machine_info(torch.device("cpu"))
    assert info["cpus"] == os.cpu_count() and info["python"] == platform.python_version()
    assert info["device"] == "cpu" and "gpu" not in info
    assert info["memory_gb"] > 0


def test_package_versions_cover_the_stack() -> None:
    versions = package_versions()
    assert {"dali-alchemi", "numpy", "torch", "zarr", "numcodecs", "nvidia-dali-cuda120", "nvalchemi-toolkit"} <= set(versions)
    assert versions["numpy"] == __import__("numpy").__version__
    assert versions["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert all(isinstance(v, str) and v for v in versions.values())
