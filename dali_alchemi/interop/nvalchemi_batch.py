"""nvalchemi ``Batch`` objects built straight from flat, collated tensors: no per-structure step.

nvalchemi 0.2.0 keeps a batch in a ``MultiLevelStorage`` of three groups: ``"atoms"`` and ``"edges"``
(``SegmentedLevelStorage``: flat ``[ΣV, *t]`` / ``[ΣE, *t]`` tensors plus int32 ``segment_lengths``) and
``"system"`` (``UniformLevelStorage``: ``[B, *t]``). Its ``from_data_list`` and ``from_raw_dicts``
concatenate per-structure tensors into exactly that, offsetting ``neighbor_list`` by each structure's
first atom. A window read by this project's reader is already in that form, so :func:`build_batch`
fills the storage directly, through nvalchemi's own storage constructors (the same ``LevelSchema``,
the same lazy ``batch_idx``/``batch_ptr``), and the result is nvalchemi's ``Batch`` in every respect.
The tensors are used as given (views, no copy) on their own device.

:func:`from_batch` converts this project's :class:`~dali_alchemi.batch.Batch` (what
:func:`~dali_alchemi.interop.to_nvalchemi` and ``DALIDataLoader(batch_type="nvalchemi")`` call).
nvalchemi is imported when a batch is built.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from dali_alchemi.errors import EmptyBatchError, FieldLevelError

if TYPE_CHECKING:
    from dali_alchemi.batch import Batch
    from dali_alchemi.types import Level

__all__ = ["build_batch", "from_batch"]


_GROUP_OF_LEVEL: dict[str, str] = {"atom": "atoms", "edge": "edges", "system": "system"}
_KEY_OF_LEVEL: dict[str, str] = {"atom": "node", "edge": "edge", "system": "system"}


def build_batch(
    fields: Mapping[str, torch.Tensor],
    levels: Mapping[str, Level],
    n_atoms: torch.Tensor,
    n_edges: torch.Tensor,
    *,
    device: torch.device,
    order: Iterable[str] | None = None,
) -> Any:
    """An ``nvalchemi.data.Batch`` holding ``fields`` as its level storage.

    Parameters
    ----------
    fields
        Flat tensors on ``device``: atom level ``[ΣV, *t]``, edge level ``[ΣE, *t]``, system level
        ``[B, *t]``, with ``neighbor_list`` already offset to the batch's atom rows (as nvalchemi's
        collation leaves it). They become the batch's tensors without a copy (non-contiguous ones
        are made contiguous, as nvalchemi's ``_make_contiguous`` does).
    levels
        The level of every field.
    n_atoms, n_edges
        ``[B]`` per-structure counts (any integer dtype, any device); they become the groups'
        int32 ``segment_lengths`` on ``device``.
    device
        The batch's device.
    order
        The order of the keys in each group (nvalchemi's collation keeps the first sample's key
        order); default the order of ``fields``.

    Raises
    ------
    FieldLevelError
        If a field has no level or an unknown one.
    EmptyBatchError
        If the batch has no structures (nvalchemi's message; a ``ValueError``).
    """
    from nvalchemi.data import Batch as NvBatch
    from nvalchemi.data.atomic_data import AtomicData
    from nvalchemi.data.level_storage import (
        LevelSchema,
        MultiLevelStorage,
        SegmentedLevelStorage,
        UniformLevelStorage,
    )
    from tensordict import TensorDict

    if int(n_atoms.numel()) == 0:
        raise EmptyBatchError("Cannot create batch from empty data list")
    names = list(fields) if order is None else [name for name in order if name in fields]
    grouped: dict[str, dict[str, torch.Tensor]] = {"atoms": {}, "edges": {}, "system": {}}
    keys: dict[str, set[str]] = {"node": set(), "edge": set(), "system": set()}
    for name in names:
        level = levels.get(name)
        if level not in _GROUP_OF_LEVEL:
            raise FieldLevelError(f"Field {name!r} has level {level!r}; expected 'atom', 'edge' or 'system'")
        tensor = fields[name]
        grouped[_GROUP_OF_LEVEL[level]][name] = tensor if tensor.is_contiguous() else tensor.contiguous()
        keys[_KEY_OF_LEVEL[level]].add(name)
    schema = LevelSchema()
    groups: dict[str, Any] = {}
    for group, counts in (("atoms", n_atoms), ("edges", n_edges), ("system", None)):
        data = grouped[group]
        if not data:
            continue
        rows = next(iter(data.values())).shape[0]
        # The tensors are already what the storage would make of them (same device, contiguous), so the
        # TensorDict is built without re-checking each one: per batch that check cost more than the read.
        td = TensorDict._new_unsafe(source=data, batch_size=torch.Size([rows]), device=device)
        if counts is None:
            groups[group] = UniformLevelStorage(data=td, device=device, validate=False, attr_map=schema)
        else:
            lengths = _lengths(counts, device)
            groups[group] = SegmentedLevelStorage(
                data=td, device=device, segment_lengths=lengths, validate=False, attr_map=schema
            )
    # Every group is on ``device`` already: set the groups on an empty storage rather than have the
    # constructor move each group to the device it is on.
    storage = MultiLevelStorage(attr_map=schema, validate=False)
    storage.groups = groups
    storage.device = device
    return NvBatch._construct(device=device, keys=keys, storage=storage, data_class=AtomicData)


def _lengths(counts: torch.Tensor, device: torch.device) -> torch.Tensor:
    if counts.device == device and counts.dtype == torch.int32:
        return counts
    return counts.to(device=device, dtype=torch.int32, non_blocking=True)


def from_batch(batch: Batch, *, order: Iterable[str] | None = None) -> Any:
    """This project's Batch as an ``nvalchemi.data.Batch`` over the same tensors (no copy, same device).

    Every field keeps its level, dtype and values; ``num_nodes_list``, ``batch_ptr``, ``batch_idx``
    and the rest are nvalchemi's own, derived from the counts. A padded batch converts with its
    padding structures (unpad it first to drop them).
    """
    counts = torch.tensor(batch.num_nodes_list, dtype=torch.int32)
    edges = torch.tensor(batch.num_edges_list, dtype=torch.int32)
    return build_batch(batch.fields, batch.levels, counts, edges, device=batch.device, order=order)
