"""``torch.utils.data.DataLoader`` over a reader: per-sample reads, or one packed read per batch.

The comparison the project measures itself against, built from the same parts as the DALI loader:
the same :class:`~dali_alchemi.plan.Plan` (so, for a seed, epoch and shard, both yield the same
batches), the same :class:`~dali_alchemi.store.format.protocol.PackedReader` seam and the same
:class:`~dali_alchemi.batch.Batch`. The plan's batches go to torch as a ``batch_sampler``; the dataset
reads them sample by sample (the common setup) or, with ``batched=True``, through torch's
``__getitems__`` hook with one read per batch, handed on as per-sample dicts and concatenated as
``Batch.from_samples`` does, as code written against nvalchemi's ``read_many`` does. Each sample
travels with its atom and edge counts, so a batch of system-level fields only still has the counts
the DALI loader gives it. ``num_workers``,
``pin_memory`` and ``prefetch_factor`` mean what they mean in torch. This module does not import DALI.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from dali_alchemi.batch import Batch
from dali_alchemi.errors import EmptyBatchError
from dali_alchemi.keywords import checks_keywords
from dali_alchemi.loader_inputs import check_reader_length, resolve_inputs
from dali_alchemi.padding import pad_batch
from dali_alchemi.plan import PadShape, PlanArguments, restore
from dali_alchemi.store.format.packed import PackedSamples
from dali_alchemi.store.format.protocol import as_field_names

if TYPE_CHECKING:
    from dali_alchemi.loader_inputs import LoaderSource
    from dali_alchemi.plan import BlockShuffle, EpochPlan, Plan
    from dali_alchemi.store.format.protocol import PackedReader
    from dali_alchemi.types import Level

__all__ = ["Collater", "Item", "PlanBatchSampler", "PlanDataLoader", "SampleDataset", "plain_dataloader"]


Item = tuple[dict[str, torch.Tensor], int, int, int]
"""A sample, its reader index, and its atom and edge counts (which its fields alone may not show)."""


class SampleDataset(Dataset[Item]):
    """Map-style dataset: ``dataset[i]`` is ``(sample dict, i, n_atoms, n_edges)``, one read of one structure.

    With ``batched=True``, ``__getitems__`` reads a whole batch with one read instead (torch's
    DataLoader calls it with a batch's indices when it exists) and splits it into per-sample dicts, as
    nvalchemi's ``read_many`` returns them.
    """

    def __init__(self, reader: PackedReader, fields: tuple[str, ...], *, batched: bool = False) -> None:
        self.reader = reader
        self.fields = fields
        self.batched = batched

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> Item:
        return self._read([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Item]:
        if not self.batched:
            return [self[int(i)] for i in indices]
        return self._read(indices)

    def _read(self, indices: Sequence[int]) -> list[Item]:
        packed = self.reader.read_packed(np.asarray(indices, dtype=np.int64), fields=self.fields)
        samples = [{name: torch.from_numpy(value) for name, value in s.items()} for s in packed.split()]
        indices, atoms, edges = (packed.logical_indices.tolist(), packed.n_atoms.tolist(), packed.n_edges.tolist())
        return list(zip(samples, indices, atoms, edges, strict=True))


class Collater:
    """Picklable collate function: :data:`Item` tuples -> :class:`Batch` (padded to ``shape`` when given).

    The counts come from the items, not from the fields: with only system-level fields selected, the
    samples hold no atom or edge rows, yet the batch keeps the structures' atom and edge counts.
    """

    def __init__(self, levels: Mapping[str, Level], shape: PadShape | None = None) -> None:
        self.levels = dict(levels)
        self.shape = shape

    def __call__(self, items: list[Item]) -> Batch:
        if not items:
            raise EmptyBatchError("Cannot create batch from empty data list")
        samples, indices, atoms, edges = zip(*items, strict=True)
        packed = PackedSamples.from_samples(samples, levels=self.levels)
        index = np.asarray(indices, dtype=np.int64)
        packed = replace(
            packed,
            logical_indices=index,
            physical_indices=index,
            n_atoms=np.asarray(atoms, dtype=np.int64),
            n_edges=np.asarray(edges, dtype=np.int64),
        )
        batch = Batch.from_packed(packed)
        return batch if self.shape is None else pad_batch(batch, **self.shape.to_kwargs())


class PlanBatchSampler(Sampler[list[int]]):
    """Yields one shard's batches of ``plan`` for the current epoch, with ``DistributedSampler``'s ``set_epoch``."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.epoch = 0
        self.start_batch = 0
        """The batch the next iteration starts at (set by a resume; back to 0 once it starts)."""
        self._epoch_plan: EpochPlan | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.start_batch = 0

    def set_plan(self, plan: Plan) -> None:
        """Take batches from ``plan`` from now on (a resume may continue with another plan)."""
        self.plan, self._epoch_plan = plan, None

    def epoch_plan(self) -> EpochPlan:
        """The plan of the current epoch (computed once per epoch)."""
        if self._epoch_plan is None or self._epoch_plan.epoch != self.epoch:
            self._epoch_plan = self.plan.epoch(self.epoch)
        return self._epoch_plan

    def __len__(self) -> int:
        return self.epoch_plan().num_batches

    def __iter__(self) -> Iterator[list[int]]:
        first, self.start_batch = self.start_batch, 0
        return (batch.tolist() for batch in self.epoch_plan().batches(first))


class PlanDataLoader(DataLoader[Any]):
    """A torch DataLoader whose batches come from a plan; ``set_epoch`` picks the epoch, as on the DALI loader."""

    batch_sampler: PlanBatchSampler

    @property
    def plan(self) -> Plan:
        """The plan the batches come from."""
        return self.batch_sampler.plan

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next (as ``DistributedSampler.set_epoch``)."""
        self.batch_sampler.set_epoch(epoch)
        self._yielded = 0

    _yielded: int = 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # counts the batches it yields
        """The batches of the current epoch, from where the loader stands.

        Raises
        ------
        StoreChangedError
            If the reader was refreshed to another length than the plan was made for; build a new loader.
        """
        check_reader_length(self.dataset.reader, self.plan, "plain_dataloader")  # type: ignore[attr-defined]
        sampler = self.batch_sampler
        if self._yielded >= len(sampler):
            self._yielded = 0  # a finished pass: iterate the same epoch again, as torch does
        sampler.start_batch = self._yielded
        for batch in super().__iter__():
            self._yielded += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The position (epoch and batches yielded in it) and the plan's identity, as the DALI loader's."""
        return {"epoch": self.batch_sampler.epoch, "batch": self._yielded, "plan": self.plan.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the position of :meth:`state_dict`, as the DALI loader does (also across shard counts
        with ``shuffle="block"``); the next iteration starts with the batch that followed.

        Raises
        ------
        ConfigTypeError
            If ``state`` is not a dict or ``epoch``/``batch`` are not ints (a float, a bool).
        PlanError
            If an entry is missing or unknown, negative, the state belongs to a different plan, or its
            batch is outside its epoch.
        """
        plan, epoch, batch = restore(self.plan, state)
        sampler = self.batch_sampler
        sampler.set_plan(plan)
        sampler.set_epoch(epoch)
        sampler.start_batch = self._yielded = batch

    owns_reader: bool = False

    def close(self) -> None:
        """Stop persistent workers now, not at garbage collection, and close a reader the loader opened."""
        iterator = getattr(self, "_iterator", None)
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        if self.owns_reader:
            self.dataset.reader.close()  # type: ignore[attr-defined]


@checks_keywords({"batches_per_window": "'prefetch_factor' (torch's: batches loaded ahead by each worker)"})
def plain_dataloader(
    store_or_reader: LoaderSource,
    *,
    batch_size: int | None = None,
    shuffle: bool | str | BlockShuffle = True,
    seed: int = 0,
    drop_last: bool = False,
    shard_id: int | None = None,
    num_shards: int | None = None,
    max_atoms: int | None = None,
    max_edges: int | None = None,
    oversized: str = "error",
    pad: bool = False,
    weights: Sequence[float] | None = None,
    samples_per_dataset: Sequence[int | float] | None = None,
    epoch_policy: str | None = None,
    plan: Plan | None = None,
    num_workers: int = 2,
    pin_memory: bool = False,
    batched: bool = False,
    fields: str | Iterable[str] | None = None,
    prefetch_factor: int | None = None,
    cache_bytes: int | None = None,
) -> PlanDataLoader:
    """A torch DataLoader yielding :class:`Batch` objects from a store, any packed reader, or any reader
    with nvalchemi's ``read_many`` contract (read through a :class:`~dali_alchemi.interop.read_many.ReadManyAdapter`).

    The plan arguments (``batch_size``, ``shuffle``, ``seed``, ``drop_last``, ``shard_id``,
    ``num_shards``, the budgets ``max_atoms``/``max_edges``/``oversized``, ``pad``, the mixture of several
    stores ``weights``/``samples_per_dataset``/``epoch_policy``, or ``plan``), ``fields``, ``cache_bytes``
    and a list of stores or readers mean exactly what they mean for
    :class:`~dali_alchemi.pipeline.loader.DALIDataLoader`, sharding by torch.distributed rank by default.
    ``batched=False`` reads sample by sample (a map-style dataset, the common setup); ``batched=True``
    reads each batch with one packed read. ``num_workers``, ``pin_memory`` and ``prefetch_factor`` are
    torch's (``prefetch_factor``: batches loaded in advance by each worker). Call ``loader.set_epoch(e)``
    for a new order; ``loader.state_dict()``/``load_state_dict()`` save and restore the position.
    """
    names = None if fields is None else as_field_names(fields)
    arguments = PlanArguments(
        batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, shard_id=shard_id,
        num_shards=num_shards, max_atoms=max_atoms, max_edges=max_edges, oversized=oversized, pad=pad,
        weights=weights, samples_per_dataset=samples_per_dataset, epoch_policy=epoch_policy,
    )  # fmt: skip
    inputs = resolve_inputs(
        store_or_reader, plan=plan, arguments=arguments, fields=names, cache_bytes=cache_bytes, loader="plain_dataloader"
    )
    reader, owns, selected, plan, shape = inputs.reader, inputs.owns_reader, inputs.fields, inputs.plan, inputs.pad_shape
    specs = reader.field_specs
    extra: dict[str, Any] = {}
    if num_workers > 0:
        extra["persistent_workers"] = True
        if prefetch_factor is not None:
            extra["prefetch_factor"] = prefetch_factor
    loader = PlanDataLoader(
        SampleDataset(reader, selected, batched=batched),
        batch_sampler=PlanBatchSampler(plan),
        collate_fn=Collater({name: specs[name].level for name in selected}, shape),
        num_workers=num_workers,
        pin_memory=pin_memory,
        **extra,
    )
    loader.owns_reader = owns
    return loader
