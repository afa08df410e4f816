"""A small checksummed store, and a fresh copy of it per test, for the tests that damage stores."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dali_alchemi import AtomicDataZarrWriter
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig

N = 40
"""Structures in ``pristine``."""

CONFIG = WriteConfig(core=ArrayConfig(chunk_size=64), meta=ArrayConfig(chunk_size=16))
"""``pristine``'s layout: several chunks per array, every one checksummed."""


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``N`` synthetic structures written with ``CONFIG``; read-only (modules may define their own)."""
    path = tmp_path_factory.mktemp("pristine") / "store.zarr"
    AtomicDataZarrWriter(path, CONFIG).write(synthetic_samples(N, seed=4))
    return path


@pytest.fixture()
def store(pristine: Path, tmp_path: Path) -> Path:
    """A copy of ``pristine`` this test may damage."""
    path = tmp_path / "store.zarr"
    shutil.copytree(pristine, path)
    return path
