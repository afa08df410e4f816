"""The plain DataLoader baseline meets the loader contract, per-sample and batched, with workers on and off."""

from __future__ import annotations

from typing import Any

import pytest

from dali_alchemi import AtomicDataZarrReader, PlanError, ReaderClosedError
from dali_alchemi.baseline import plain_dataloader
from dali_alchemi.baseline.torch_loader import PlanDataLoader
from tests.loader_contract import LoaderContract, assert_batches_equal, reference_batches


class TestPerSample(LoaderContract):
    def make_loader(self, source: Any, **options: Any) -> PlanDataLoader:
        return plain_dataloader(source, num_workers=0, **options)


class TestBatched(LoaderContract):
    def make_loader(self, source: Any, **options: Any) -> PlanDataLoader:
        return plain_dataloader(source, num_workers=0, batched=True, **options)


@pytest.mark.parametrize("batched", [False, True])
def test_worker_processes_give_the_same_batches(reader: AtomicDataZarrReader, batched: bool) -> None:
    loader = plain_dataloader(reader, batch_size=16, seed=11, num_workers=2, batched=batched, prefetch_factor=3)
    try:
        assert len(loader) == 19
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            assert_batches_equal(list(loader), reference_batches(reader, loader.plan, epoch))
    finally:
        loader.close()


def test_cache_bytes_configures_only_a_reader_it_opens(reader: AtomicDataZarrReader) -> None:
    with pytest.raises(ValueError, match="set it on your reader"):
        plain_dataloader(reader, cache_bytes=1 << 20)


def test_a_reader_the_loader_opened_is_closed_with_it(small_store: Any) -> None:
    loader = plain_dataloader(small_store, num_workers=0, batch_size=100)
    assert len(list(loader)) == 3
    loader.close()
    with pytest.raises(ReaderClosedError):
        loader.dataset.reader.read_packed([0])
    with pytest.raises(PlanError):  # a failed construction leaves nothing open behind it
        plain_dataloader(small_store, num_workers=0, max_atoms=1)
