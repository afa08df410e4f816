"""The plain DataLoader baseline meets the loader contract, per-sample and batched, with workers on and off."""

from __future__ import annotations

from typing import Any

import pytest

from dali_alchemi import AtomicDataZarrReader, ConfigTypeError, PlanError, ReaderClosedError
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


def _take(loader: Any, count: int) -> list[Any]:
    taken = []
    for batch in loader:
        taken.append(batch)
        if len(taken) == count:
            break
    return taken


def test_state_dict_resumes_exactly_where_it_stopped(reader: AtomicDataZarrReader) -> None:
    loader = plain_dataloader(reader, batch_size=16, seed=4, shuffle="block", num_workers=0)
    loader.set_epoch(2)
    full = [b.sample_indices.tolist() for b in loader]
    loader.set_epoch(2)
    _take(loader, 5)
    state = loader.state_dict()
    assert state["epoch"] == 2 and state["batch"] == 5 and state["plan"]["kind"] == "block"
    resumed = plain_dataloader(reader, batch_size=16, seed=4, shuffle="block", num_workers=0)
    resumed.load_state_dict(state)
    assert [b.sample_indices.tolist() for b in resumed] == full[5:]
    with pytest.raises(PlanError, match="seed=4"):
        plain_dataloader(reader, batch_size=16, seed=5, shuffle="block", num_workers=0).load_state_dict(state)


@pytest.mark.parametrize(("before", "after", "stop"), [(2, 3, 4), (4, 2, 2)])
def test_block_shuffle_resumes_on_another_number_of_shards(
    reader: AtomicDataZarrReader, before: int, after: int, stop: int
) -> None:
    options: dict[str, Any] = dict(batch_size=15, seed=9, shuffle="block", num_workers=0)
    seen: list[int] = []
    states = []
    for rank in range(before):
        loader = plain_dataloader(reader, shard_id=rank, num_shards=before, **options)
        loader.set_epoch(1)
        seen += [i for b in _take(loader, stop) for i in b.sample_indices.tolist()]
        states.append(loader.state_dict())
    counts = set()
    for rank in range(after):
        loader = plain_dataloader(reader, shard_id=rank, num_shards=after, **options)
        loader.load_state_dict(states[rank % before])
        rest = [b.sample_indices.tolist() for b in loader]
        counts.add(len(rest))
        seen += [i for b in rest for i in b]
    assert len(counts) == 1  # every new shard has as many batches
    assert sorted(seen) == list(range(len(reader)))  # every structure once: none skipped, none twice


def test_block_shuffle_with_pad_gives_one_shape_and_every_structure_once(reader: AtomicDataZarrReader) -> None:
    loader = plain_dataloader(reader, max_atoms=400, max_edges=20_000, pad=True, shuffle="block", num_workers=0)
    batches = list(loader)
    assert {(b.num_nodes, b.num_graphs) for b in batches} == {(400, batches[0].num_graphs)}
    real = [i for b in batches for i in b.sample_indices.tolist() if i >= 0]
    assert sorted(real) == list(range(len(reader)))


def test_a_mistyped_keyword_names_the_one_meant(reader: AtomicDataZarrReader) -> None:
    with pytest.raises(
        ConfigTypeError,
        match=r"^plain_dataloader\(\) got an unexpected keyword argument 'shufle'; did you mean 'shuffle'\?$",
    ):
        plain_dataloader(reader, shufle=False)
    with pytest.raises(ConfigTypeError, match=r"'batches_per_window'; did you mean 'prefetch_factor' \(torch's"):
        plain_dataloader(reader, batches_per_window=4)
