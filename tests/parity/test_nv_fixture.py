"""The store written by nvalchemi 0.2.0 reads exactly as nvalchemi's reader and Batch returned it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dali_alchemi import AtomicDataZarrReader, Batch


@pytest.fixture(scope="module")
def expected(nv_fixture: Path) -> tuple[dict, dict[str, np.ndarray]]:
    meta = json.loads((nv_fixture / "nv_basic.expected.json").read_text())
    with np.load(nv_fixture / "nv_basic.expected.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    return meta, arrays


@pytest.fixture(scope="module")
def reader(nv_fixture: Path) -> AtomicDataZarrReader:
    with AtomicDataZarrReader(nv_fixture / "nv_basic.zarr") as r:
        yield r


def _assert_same(actual: torch.Tensor, wanted: np.ndarray, what: str) -> None:
    got = actual.numpy()
    assert got.dtype == wanted.dtype, f"{what}: dtype {got.dtype} != {wanted.dtype}"
    assert got.shape == wanted.shape, f"{what}: shape {got.shape} != {wanted.shape}"
    assert np.array_equal(got, wanted), f"{what}: values differ"


def test_length_and_levels(reader: AtomicDataZarrReader, expected: tuple) -> None:
    meta, _ = expected
    assert len(reader) == meta["len"]
    assert reader.field_levels == meta["field_levels"]


def test_read_many_in_recorded_order(reader: AtomicDataZarrReader, expected: tuple) -> None:
    meta, arrays = expected
    results = reader.read_many(meta["order"])
    assert len(results) == len(meta["order"])
    for pos, ((sample, info), index) in enumerate(zip(results, meta["order"], strict=True)):
        assert info["index"] == (index if index >= 0 else index + meta["len"])
        assert set(sample) == set(meta["field_levels"])
        for field, tensor in sample.items():
            _assert_same(tensor, arrays[f"sample/{pos}/{field}"], f"sample {pos} {field}")


def test_batches_from_recorded_index_lists(reader: AtomicDataZarrReader, expected: tuple) -> None:
    meta, arrays = expected
    for b, indices in enumerate(meta["batches"]):
        for batch in (
            Batch.from_packed(reader.read_packed(indices)),
            Batch.from_samples([s for s, _ in reader.read_many(indices)]),
        ):
            for field in batch.fields:
                _assert_same(batch[field], arrays[f"batch/{b}/{field}"], f"batch {b} {field}")
            _assert_same(batch.batch_idx, arrays[f"batch/{b}/batch_idx"], f"batch {b} batch_idx")
            _assert_same(batch.batch_ptr, arrays[f"batch/{b}/batch_ptr"], f"batch {b} batch_ptr")
            assert {k: sorted(v) for k, v in batch.keys.items()} == meta["batch_keys"][str(b)]
