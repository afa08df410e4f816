"""Handing a Batch to other frameworks: nvalchemi-toolkit and PyTorch Geometric.

Both conversions keep the tensors' device and values. PyG gets its own vocabulary (``pos``, ``z``,
``edge_index``, ``batch``, ``ptr``) with every other field under its own name, and the bookkeeping that
lets ``get_example``/``to_data_list`` undo the batching. The packages are imported when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dali_alchemi.store.format import layout

if TYPE_CHECKING:
    import torch

    from dali_alchemi.batch import Batch

__all__ = ["PYG_NAMES", "to_nvalchemi", "to_pyg"]


PYG_NAMES = {"positions": "pos", "atomic_numbers": "z", "neighbor_list": "edge_index"}


def to_nvalchemi(batch: Batch) -> Any:
    """An ``nvalchemi.data.Batch`` with the same structures, over the same tensors (no copy, same device).

    Built straight into nvalchemi's level storage by
    :func:`~dali_alchemi.interop.nvalchemi_batch.from_batch`: no split into structures and no
    ``from_raw_dicts``; equal to what ``from_raw_dicts`` makes of the batch's structures.
    """
    from dali_alchemi.interop.nvalchemi_batch import from_batch

    return from_batch(batch)


def to_pyg(batch: Batch) -> Any:
    """A ``torch_geometric.data.Batch``: ``pos``, ``z``, ``edge_index`` ``[2, E]``, ``batch``, ``ptr`` and
    every other field under its own name; ``to_data_list()`` gives the structures back."""
    import torch
    from torch_geometric.data import Batch as PygBatch

    n = batch.num_graphs
    structure_ptr = torch.arange(n + 1, device=batch.device)
    attributes: dict[str, torch.Tensor] = {}
    slices: dict[str, torch.Tensor] = {}
    increments: dict[str, torch.Tensor] = {}
    zeros = torch.zeros(n, dtype=torch.long, device=batch.device)
    for name, tensor in batch.fields.items():
        key = PYG_NAMES.get(name, name)
        level = batch.levels[name]
        if name in layout.ATOM_INDEX_FIELDS:
            tensor = tensor.t().long().contiguous()  # PyG stores edges as [2, E]
        attributes[key] = tensor
        slices[key] = {"atom": batch.batch_ptr, "edge": batch.edge_batch_ptr, "system": structure_ptr}[level]
        increments[key] = batch.batch_ptr[:-1] if name in layout.ATOM_INDEX_FIELDS else zeros
    pyg = PygBatch(**attributes, batch=batch.batch_idx.long(), ptr=batch.batch_ptr)
    pyg._num_graphs = n
    pyg._slice_dict = slices
    pyg._inc_dict = increments
    return pyg
