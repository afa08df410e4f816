"""The plain DataLoader baseline yields the same batches as the reference, like the DALI loader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader
from dali_alchemi.baseline import plain_dataloader
from tests.pipeline.reference import _assert_batches_equal, _reference


@pytest.fixture(scope="module")
def reader(small_store: Path) -> AtomicDataZarrReader:
    with AtomicDataZarrReader(small_store) as r:
        yield r


@pytest.mark.parametrize(("batched", "workers"), [(False, 0), (True, 0), (False, 2), (True, 2)])
def test_same_batches_as_the_reference(reader: AtomicDataZarrReader, batched: bool, workers: int) -> None:
    loader = plain_dataloader(reader, batch_size=16, seed=11, num_workers=workers, batched=batched)
    assert len(loader) == 19
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)
        _assert_batches_equal(list(loader), _reference(reader, loader.sampler.plan, epoch))


def test_shards_and_options(small_store: Path, reader: AtomicDataZarrReader) -> None:
    parts = []
    for shard in range(3):
        loader = plain_dataloader(small_store, batch_size=25, num_workers=0, batched=True, shard_id=shard, num_shards=3)
        parts.append(np.concatenate([b.sample_indices for b in loader]))
    assert sorted(np.concatenate(parts).tolist()) == list(range(300))
    fields = plain_dataloader(small_store, batch_size=8, num_workers=0, fields=["positions", "energy"])
    assert set(next(iter(fields)).fields) == {"positions", "energy"}
    with pytest.raises(ValueError, match="set them on your reader"):
        plain_dataloader(reader, fields=["positions"])
