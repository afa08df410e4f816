"""Both loaders over several stores: a mixture's batches equal the members' own per-sample reads, collated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dali_alchemi import AtomicDataZarrReader, Batch, MixturePlan, MultiReader, PlanError, plain_dataloader, unpad_batch
from dali_alchemi.plan import Plan
from tests.loader_contract import assert_batches_equal

SPLIT = 300
"""Structures of ``small_store``; ``other_store``'s follow (global indices 300..419)."""


def reference_batches(paths: tuple[Path, ...], plan: Plan, epoch: int, first_batch: int = 0) -> list[Batch]:
    """The plan's batches, each structure read on its own from its member store, plus its two dataset fields."""
    readers = [AtomicDataZarrReader(p) for p in paths]
    offsets = np.cumsum([0] + [len(r) for r in readers])
    levels = {**readers[0].field_levels, "dataset_id": "system", "dataset_index": "system"}
    out = []
    for indices in plan.epoch(epoch).batches(first_batch):
        member = np.searchsorted(offsets, indices, side="right") - 1
        local = indices - offsets[member]
        samples: list[dict[str, Any]] = [{} for _ in indices]
        for d, reader in enumerate(readers):  # each member's own reads of its structures in this batch
            where = np.flatnonzero(member == d)
            for k, (sample, _) in zip(where.tolist(), reader.read_many(local[where]), strict=True):
                samples[k] = {**sample, "dataset_id": torch.tensor([d]), "dataset_index": torch.tensor([int(local[k])])}
        out.append(Batch.from_samples(samples, levels=levels, sample_indices=indices))
    for r in readers:
        r.close()
    return out


def make(kind: str, source: Any, **options: Any) -> Any:
    if kind == "plain":
        return plain_dataloader(source, num_workers=0, batched=True, **options)
    from dali_alchemi import DALIDataLoader

    return DALIDataLoader(
        source, num_workers=2 if kind == "dali-workers" else 0, device="cpu", batches_per_window=4, **options
    )


KINDS = [
    pytest.param("dali-workers", marks=pytest.mark.dali),
    pytest.param("dali-thread", marks=pytest.mark.dali),
    "plain",
]


@pytest.mark.parametrize("kind", KINDS)
def test_weighted_batches_equal_the_reference_and_carry_their_dataset(
    kind: str, small_store: Path, other_store: Path
) -> None:
    paths = (small_store, other_store)
    loader = make(kind, list(paths), batch_size=10, weights=(3, 1), seed=5)
    try:
        assert isinstance(loader.plan, MixturePlan) and len(loader) == 42
        for epoch in range(2):
            loader.set_epoch(epoch)
            got = list(loader)
            assert_batches_equal(got, reference_batches(paths, loader.plan, epoch))
            for batch in got:
                assert batch.dataset_id.dtype == torch.int64 and batch.dataset_id.shape == (10,)
                assert torch.bincount(batch.dataset_id, minlength=2).tolist() == [8, 2]
                local = np.where(batch.dataset_id.numpy() == 1, batch.sample_indices - SPLIT, batch.sample_indices)
                assert np.array_equal(batch.dataset_index.numpy(), local)
    finally:
        loader.close()


@pytest.mark.parametrize("kind", KINDS)
def test_budget_shards_and_resume_over_a_multi_reader(kind: str, small_store: Path, other_store: Path) -> None:
    paths = (small_store, other_store)
    multi = MultiReader(list(paths))
    lengths, firsts = set(), []
    try:
        for shard in range(2):
            options = {
                "max_atoms": 300,
                "weights": (1, 1),
                "epoch_policy": "min_size",
                "shard_id": shard,
                "num_shards": 2,
            }
            loader = make(kind, multi, seed=3, **options)
            try:
                lengths.add(len(loader))
                head = [b for _, b in zip(range(3), loader, strict=False)]
                state = loader.state_dict() if kind != "plain" else None  # the plain DataLoader has no resume
            finally:
                loader.close()
            resumed = make(kind, multi, seed=3, **options)
            try:
                if state is not None:
                    resumed.load_state_dict(state)
                    rest = list(resumed)
                else:
                    rest = list(resumed)[3:]
                want = reference_batches(paths, resumed.plan, 0)
                assert_batches_equal(head + rest, want)
                assert all(b.num_nodes <= 300 for b in head + rest)
                firsts.append(head[0].sample_indices)
            finally:
                resumed.close()
        assert len(lengths) == 1
        assert not set(firsts[0]) & set(firsts[1])
        assert multi.read_packed([0]).fields["dataset_id"].tolist() == [0]  # the loaders left the reader open
    finally:
        multi.close()


def test_mixture_arguments_need_several_stores(small_store: Path, other_store: Path) -> None:
    with pytest.raises(PlanError, match="mix several datasets: pass a list of stores"):
        plain_dataloader(small_store, weights=(1, 1), num_workers=0)
    loader = plain_dataloader(
        [small_store, other_store], batch_size=50, shuffle=False, num_workers=0, fields=["energy", "dataset_id"]
    )
    try:  # no mixture arguments: the concatenation, in the default plan
        batches = list(loader)
        assert len(batches) == 9 and set(batches[0].fields) == {"energy", "dataset_id"}
        assert torch.cat([b.dataset_id for b in batches]).tolist() == [0] * 300 + [1] * 120
    finally:
        loader.close()


def test_padded_mixture_batches_have_one_shape(small_store: Path, other_store: Path) -> None:
    paths = (small_store, other_store)
    loader = plain_dataloader(
        list(paths), max_atoms=301, max_edges=2001, pad=True, weights=(1, 2), num_workers=0, batched=True
    )
    try:
        batches = list(loader)
        shapes = {(b.num_nodes, b.num_edges, b.num_graphs) for b in batches}
        assert len(shapes) == 1 and next(iter(shapes))[:2] == (301, 2001)
        assert_batches_equal([unpad_batch(b) for b in batches], reference_batches(paths, loader.plan, 0))
    finally:
        loader.close()


@pytest.mark.parametrize("kind", ["plain", pytest.param("dali-thread", marks=pytest.mark.dali)])
def test_a_block_shuffled_mixture_delivers_the_plans_batches(kind: str, small_store: Path, other_store: Path) -> None:
    paths = (small_store, other_store)
    loader = make(kind, list(paths), batch_size=10, weights=(3, 1), seed=2, shuffle="block")
    try:
        assert isinstance(loader.plan, MixturePlan) and loader.plan.span_bounds is not None
        got = list(loader)
        assert_batches_equal(got, reference_batches(paths, loader.plan, 0))
        assert {tuple(torch.bincount(b.dataset_id, minlength=2).tolist()) for b in got} == {(8, 2)}
    finally:
        loader.close()
