"""``torch.utils.data.DataLoader`` over the reader: per-sample reads, or one ``read_many`` per batch.

Both variants use the same :class:`~dali_alchemi.planning.SamplePlan` as the DALI loader (so, for a
seed, epoch and shard, they produce the same batches) and collate with :meth:`Batch.from_samples`, the
reference collation. ``num_workers`` and ``pin_memory`` mean what they mean in torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from dali_alchemi.batch import Batch
from dali_alchemi.planning import SamplePlan
from dali_alchemi.store.reader import AtomicDataZarrReader

if TYPE_CHECKING:
    from dali_alchemi.store.location import StoreLike
    from dali_alchemi.types import Level


Item = tuple[dict[str, torch.Tensor], int]  # a sample and its store index


class SampleDataset(Dataset[Item]):
    """Map-style dataset: ``dataset[i]`` is ``(sample dict, i)`` read with ``reader.read(i)``."""

    def __init__(self, reader: AtomicDataZarrReader) -> None:
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> Item:
        sample, meta = self.reader.read(index)
        return sample, meta["index"]


class BatchDataset(SampleDataset):
    """``dataset[indices]`` reads a whole batch with one ``reader.read_many(indices)``."""

    def __getitem__(self, indices: Sequence[int]) -> list[Item]:  # type: ignore[override]
        return [(sample, meta["index"]) for sample, meta in self.reader.read_many(list(indices))]


class Collater:
    """Picklable collate function: ``(sample, index)`` pairs -> :class:`Batch` with the store's levels."""

    def __init__(self, levels: Mapping[str, Level]) -> None:
        self.levels = dict(levels)

    def __call__(self, items: list[Item]) -> Batch:
        return Batch.from_samples(
            [sample for sample, _ in items], levels=self.levels, sample_indices=[index for _, index in items]
        )


class _EpochSampler:
    """A sampler over one shard of ``plan``, with ``DistributedSampler``'s ``set_epoch``."""

    def __init__(self, plan: SamplePlan) -> None:
        self.plan = plan
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class PlanSampler(_EpochSampler, Sampler[int]):
    """Yields one shard's indices of ``plan`` for the current epoch."""

    def __len__(self) -> int:
        return min(self.plan.samples_per_shard, self.plan.num_batches * self.plan.batch_size)

    def __iter__(self) -> Iterator[int]:
        order = self.plan.shard_order(self.epoch)
        return iter(order[: len(self)].tolist())


class PlanBatchSampler(_EpochSampler, Sampler[list[int]]):
    """Yields one shard's batches of ``plan`` for the current epoch."""

    def __len__(self) -> int:
        return self.plan.num_batches

    def __iter__(self) -> Iterator[list[int]]:
        return (batch.tolist() for batch in self.plan.batches(self.epoch))


def plain_dataloader(
    store_or_reader: StoreLike | AtomicDataZarrReader,
    *,
    batch_size: int = 64,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    num_workers: int = 2,
    pin_memory: bool = False,
    batched: bool = False,
    fields: Sequence[str] | None = None,
    prefetch_factor: int | None = None,
    shard_id: int = 0,
    num_shards: int = 1,
    cache_bytes: int | None = None,
) -> DataLoader[Any]:
    """A torch DataLoader yielding :class:`Batch` objects from a store.

    ``batched=False`` reads sample by sample (a map-style dataset, the common setup); ``batched=True``
    passes each batch's indices to the dataset, which reads them with one ``read_many``. The loader's
    sampler has a ``set_epoch`` like ``DistributedSampler``: call ``loader.sampler.set_epoch(e)`` for a
    new order. ``shard_id``/``num_shards`` shard the epoch exactly as the DALI loader does. ``fields`` and
    ``cache_bytes`` configure the reader opened from a store; pass them to your own reader instead.
    """
    if isinstance(store_or_reader, AtomicDataZarrReader):
        if fields is not None or cache_bytes is not None:
            raise ValueError("fields= and cache_bytes= configure a reader this function opens; set them on your reader")
        reader = store_or_reader
    else:
        options: dict[str, Any] = {} if cache_bytes is None else {"cache_bytes": cache_bytes}
        reader = AtomicDataZarrReader(store_or_reader, fields=fields, **options)
    plan = SamplePlan(
        num_samples=len(reader), batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
        shard_id=shard_id, num_shards=num_shards,
    )  # fmt: skip
    collate = Collater(reader.field_levels)
    extra: dict[str, Any] = {}
    if num_workers > 0:
        extra["persistent_workers"] = True
        if prefetch_factor is not None:
            extra["prefetch_factor"] = prefetch_factor
    if batched:
        return DataLoader(
            BatchDataset(reader),
            batch_size=None,
            sampler=PlanBatchSampler(plan),
            collate_fn=collate,
            num_workers=num_workers,
            pin_memory=pin_memory,
            **extra,
        )
    return DataLoader(
        SampleDataset(reader),
        batch_size=batch_size,
        sampler=PlanSampler(plan),
        drop_last=drop_last,
        collate_fn=collate,
        num_workers=num_workers,
        pin_memory=pin_memory,
        **extra,
    )
