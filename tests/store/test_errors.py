"""Errors the store raises on purpose are classes of dali_alchemi.errors that also inherit the builtin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from zarr.storage import MemoryStore

from dali_alchemi import AtomicDataZarrWriter
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.errors import (
    DaliAlchemiError,
    FieldLevelError,
    SampleDataError,
    StoreExistsError,
    UnsupportedStoreError,
)
from dali_alchemi.store.format.packed import PackedSamples


def test_writing_over_an_existing_store_is_a_store_exists_error(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(StoreExistsError, match=f"Zarr store already exists at {tmp_path / 'taken'}") as info:
        AtomicDataZarrWriter(tmp_path / "taken").write(synthetic_samples(2, seed=0))
    assert isinstance(info.value, FileExistsError) and isinstance(info.value, DaliAlchemiError)


def test_defragmenting_a_non_local_store_is_unsupported() -> None:
    memory = MemoryStore()
    writer = AtomicDataZarrWriter(memory)
    writer.write(synthetic_samples(3, seed=0))
    writer.delete([1])
    with pytest.raises(UnsupportedStoreError, match="rewrites local directory stores only") as info:
        writer.defragment()
    assert isinstance(info.value, NotImplementedError)


def test_no_samples_is_a_sample_data_error(tmp_path: Path) -> None:
    with pytest.raises(SampleDataError, match="No data provided to write"):
        AtomicDataZarrWriter(tmp_path / "a.zarr").write(synthetic_samples(3).take(np.zeros(0, np.int64)))
    with pytest.raises(SampleDataError, match="No samples given"):
        PackedSamples.from_samples([])
    assert not (tmp_path / "a.zarr").exists()


def test_a_packed_field_without_a_level_is_a_field_level_error(tmp_path: Path) -> None:
    fields = {"positions": np.zeros((3, 3), np.float32), "tag": np.ones(1)}
    with pytest.raises(FieldLevelError, match=r"Fields \['tag'\] have no level") as info:
        PackedSamples.from_fields(fields, {"positions": "atom"}, np.array([3]), np.array([0]))
    assert isinstance(info.value, ValueError)
    # levels for fields the window does not hold are fine
    packed = PackedSamples.from_fields(
        {"positions": fields["positions"]}, {"positions": "atom", "tag": "system"}, np.array([3]), np.array([0])
    )
    assert packed.take(np.array([0, 0])).fields["positions"].shape == (6, 3)
