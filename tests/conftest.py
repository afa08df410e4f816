"""Shared fixtures: small seeded stores built once per session, and the nvalchemi 0.2.0 fixture."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from dali_alchemi import AtomicDataZarrReader
from dali_alchemi.bench.synth import write_synthetic_store
from dali_alchemi.config import INFLATE_CODECS, ArrayConfig, WriteConfig

NV_FIXTURE_DIR = Path(__file__).parent / "fixtures" / "nvalchemi-0.2.0"
"""A store written by nvalchemi 0.2.0 and what its reader returned (see its README)."""

# Small chunks so that a few hundred structures span many chunks and shards.
SMALL_CHUNKS = WriteConfig(core=ArrayConfig(chunk_size=97), custom=ArrayConfig(chunk_size=13))


@functools.cache
def dali_missing() -> str | None:
    """Why NVIDIA DALI cannot be imported here, or ``None`` when it can."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError as err:
        return f"{type(err).__name__}: {err}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu``-marked tests cleanly without a CUDA device, and ``dali``-marked ones without DALI."""
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make gpu-check` on a GPU machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    dali_items = [item for item in items if "dali" in item.keywords]
    if dali_items and dali_missing():
        skip = pytest.mark.skip(reason=f"needs NVIDIA DALI, which cannot be imported ({dali_missing()})")
        for item in dali_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def nv_fixture() -> Path:
    """Directory of the store written by nvalchemi 0.2.0 and what its reader returned."""
    if not (NV_FIXTURE_DIR / "nv_basic.zarr").exists():
        pytest.skip(f"nvalchemi fixture not found at {NV_FIXTURE_DIR}")
    return NV_FIXTURE_DIR


@pytest.fixture(scope="session")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 synthetic structures (10-40 atoms) in small chunks; read-only for tests."""
    path = tmp_path_factory.mktemp("stores") / "small.zarr"
    return write_synthetic_store(path, 300, seed=7, min_atoms=10, max_atoms=40, config=SMALL_CHUNKS)


@pytest.fixture(scope="session")
def other_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 other synthetic structures (5-25 atoms), the second member of the multi-store tests."""
    path = tmp_path_factory.mktemp("stores") / "other.zarr"
    return write_synthetic_store(path, 120, seed=21, min_atoms=5, max_atoms=25, config=SMALL_CHUNKS)


@pytest.fixture(scope="session")
def sharded_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same 300 structures, sharded (4 chunks per shard)."""
    path = tmp_path_factory.mktemp("stores") / "sharded.zarr"
    config = WriteConfig(
        core=ArrayConfig(chunk_size=64, shard_size=256), meta=ArrayConfig(chunk_size=128, shard_size=256)
    )
    return write_synthetic_store(path, 300, seed=7, min_atoms=10, max_atoms=40, config=config)


@pytest.fixture(scope="session")
def raw_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same 300 structures, core arrays uncompressed (read in place), checksummed."""
    path = tmp_path_factory.mktemp("stores") / "raw.zarr"
    config = WriteConfig(core=ArrayConfig(compressors=(), chunk_size=97))
    return write_synthetic_store(path, 300, seed=7, min_atoms=10, max_atoms=40, config=config)


@pytest.fixture(scope="session")
def inflate_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same 300 structures, every core array byte-shuffled in LZ4 blocks of 64 rows (4 per shard): what
    DALI's GPU inflate decodes as stored (``layout="inflate"``)."""
    path = tmp_path_factory.mktemp("stores") / "inflate.zarr"
    config = WriteConfig(core=ArrayConfig(compressors=INFLATE_CODECS, chunk_size=64, shard_size=256))
    return write_synthetic_store(path, 300, seed=7, min_atoms=10, max_atoms=40, config=config)


@pytest.fixture(scope="session")
def reader(small_store: Path) -> Iterator[AtomicDataZarrReader]:
    """An open reader over ``small_store``, shared by the session; tests must not close it."""
    with AtomicDataZarrReader(small_store) as r:
        yield r


@pytest.fixture()
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
