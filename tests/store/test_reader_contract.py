"""This project's reader meets the PackedReader contract, on a plain and a sharded store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, PackedSamples
from dali_alchemi.testing.reader import PackedReaderTests


def _everything(path: Path) -> PackedSamples:
    with AtomicDataZarrReader(path) as reader:
        return PackedSamples.from_samples(
            [sample for sample, _ in reader.read_many(range(len(reader)))], levels=reader.field_levels
        )


class TestZarrReader(PackedReaderTests):
    @pytest.fixture(autouse=True)
    def _store(self, small_store: Path) -> None:
        self.path = small_store

    def make_reader(self) -> AtomicDataZarrReader:
        return AtomicDataZarrReader(self.path)

    def expected(self) -> PackedSamples:
        return _everything(self.path)


class TestShardedZarrReader(TestZarrReader):
    @pytest.fixture(autouse=True)
    def _store(self, sharded_store: Path) -> None:
        self.path = sharded_store


def test_the_expected_samples_come_from_per_sample_reads(small_store: Path) -> None:
    want = _everything(small_store)
    assert len(want) == 300 and want.n_atoms.min() >= 10 and np.all(want.logical_indices == np.arange(300))
