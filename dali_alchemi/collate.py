"""The steps of collation, from a window of structures to the pieces of each Batch, as PyG's ``collate.py``.

:func:`~dali_alchemi.batch.collate` runs them in order:

1. :func:`check_window`: every field has a level, the window is not empty, and the plan's batch bounds
   rise strictly over it;
2. :func:`window_offsets`: the window's pointers, the per-atom batch index and the neighbor-list offsets,
   once for the whole window: numpy on the CPU (:func:`collate_on_host`, also run early by the DALI
   source), torch on a GPU with sizes from the host so that nothing synchronises;
3. :func:`slice_window`: each batch's views of those tensors, as the keyword arguments of a Batch.

No I/O, no DALI, and no Batch: the Batch module builds them from what this returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dali_alchemi import csr
from dali_alchemi.csr import exclusive_cumsum
from dali_alchemi.errors import EmptyBatchError, FieldLevelError, PlanError
from dali_alchemi.store.format import layout
from dali_alchemi.types import PerLevel

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import Level, PtrArray

__all__ = ["WindowOffsets", "check_window", "collate_on_host", "host_indices", "slice_window", "window_offsets"]


@dataclass(frozen=True, slots=True)
class WindowOffsets:
    """What :func:`window_offsets` computed for a whole window."""

    fields: dict[str, torch.Tensor]
    """The window's fields, index fields offset to batch-local atom rows."""
    atoms_ptr: NDArray[np.int64]
    """``[n + 1]`` atom offsets of the window's structures, on the host."""
    edges_ptr: NDArray[np.int64]
    """``[n + 1]`` edge offsets of the window's structures, on the host."""
    device_atoms_ptr: torch.Tensor
    """``atoms_ptr`` on the fields' device."""
    device_edges_ptr: torch.Tensor
    """``edges_ptr`` on the fields' device."""
    batch_idx: torch.Tensor
    """``[V]`` int32: each atom's structure within its own batch."""


def host_indices(values: Any) -> torch.Tensor | None:
    """``values`` (store indices: a tensor on any device, an array, a list) as a 1-d int64 CPU tensor.

    A CPU int64 tensor is returned as it is and a contiguous int64 array is wrapped without a copy, so
    cutting a window's indices into batches costs no copy. ``None`` (indices unknown) stays ``None``.
    """
    if values is None:
        return None
    if isinstance(values, torch.Tensor):
        return values.to(device="cpu", dtype=torch.int64).reshape(-1)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64).reshape(-1))


def _exclusive_cumsum_t(counts: torch.Tensor) -> torch.Tensor:
    ptr = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=counts.device)
    torch.cumsum(counts, 0, out=ptr[1:])
    return ptr


def _within_batch(n_atoms: NDArray[np.int64], cuts: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Each structure's index and first-atom offset *within its own batch*."""
    per_batch = np.diff(cuts)
    atoms_ptr = exclusive_cumsum(n_atoms)
    structure = np.arange(n_atoms.size, dtype=np.int64) - np.repeat(cuts[:-1], per_batch)
    atom_offset = atoms_ptr[:-1] - np.repeat(atoms_ptr[cuts[:-1]], per_batch)
    return structure, atom_offset


def collate_on_host(
    index_fields: Mapping[str, NDArray[Any]],
    n_atoms: NDArray[np.int64],
    n_edges: NDArray[np.int64],
    cuts: NDArray[np.int64],
) -> NDArray[np.int32]:
    """The host half of collation, for data not yet on its way to a device.

    Offsets each index field (sample-local ``neighbor_list``) *in place* by its structure's first atom
    within its batch, and returns the per-atom batch index (int32 ``[V]``). Pass the result to
    :func:`~dali_alchemi.batch.collate` as ``batch_idx``.
    """
    structure, atom_offset = _within_batch(n_atoms, cuts)
    for values in index_fields.values():
        csr.rebase(values, atom_offset, n_edges)
    return np.repeat(structure.astype(np.int32), n_atoms)


def check_window(
    fields: Mapping[str, Any], levels: Mapping[str, Level], n: int, batch_bounds: PtrArray | None
) -> NDArray[np.int64]:
    """The batch bounds of a window of ``n`` structures (``None``: one batch of all), checked.

    Raises
    ------
    FieldLevelError
        If a field has no level.
    EmptyBatchError
        If the window is empty.
    PlanError
        If ``batch_bounds`` does not rise strictly from 0 to ``n``.
    """
    missing = set(fields) - set(levels)
    if missing:
        raise FieldLevelError(f"No level given for fields {sorted(missing)}")
    if n == 0:
        raise EmptyBatchError("Cannot create batch from empty data list")
    cuts = np.array([0, n], dtype=np.int64) if batch_bounds is None else np.asarray(batch_bounds, dtype=np.int64)
    if cuts.size < 2 or cuts[0] != 0 or cuts[-1] != n or bool(np.any(np.diff(cuts) < 1)):
        raise PlanError(f"batch_bounds must rise strictly from 0 to the window's {n} structures, got {cuts.tolist()}")
    return cuts


def window_offsets(
    fields: Mapping[str, torch.Tensor],
    n_atoms: torch.Tensor,
    n_edges: torch.Tensor,
    host_n_atoms: NDArray[np.int64],
    host_n_edges: NDArray[np.int64],
    cuts: NDArray[np.int64],
    batch_idx: torch.Tensor | None,
) -> WindowOffsets:
    """The window's pointers, batch index and offset index fields, on the fields' device.

    A ``batch_idx`` already given came from :func:`collate_on_host`, which also offset the index fields.
    """
    atoms_ptr, edges_ptr = exclusive_cumsum(host_n_atoms), exclusive_cumsum(host_n_edges)
    out = dict(fields)
    index_fields = {name: out[name] for name in out if name in layout.ATOM_INDEX_FIELDS and int(edges_ptr[-1])}
    if n_atoms.device.type == "cpu":
        # numpy, not torch: torch's intra-op thread pool contends with the reading threads for the cores.
        device_atoms_ptr, device_edges_ptr = torch.from_numpy(atoms_ptr), torch.from_numpy(edges_ptr)
        if batch_idx is None:
            offset = {name: tensor.numpy().copy() for name, tensor in index_fields.items()}
            batch_idx = torch.from_numpy(collate_on_host(offset, host_n_atoms, host_n_edges, cuts))
            out.update({name: torch.from_numpy(values) for name, values in offset.items()})
        return WindowOffsets(out, atoms_ptr, edges_ptr, device_atoms_ptr, device_edges_ptr, batch_idx)
    counts_atoms, counts_edges = n_atoms.to(torch.int64), n_edges.to(torch.int64)
    device_atoms_ptr, device_edges_ptr = _exclusive_cumsum_t(counts_atoms), _exclusive_cumsum_t(counts_edges)
    if batch_idx is None:
        batch_idx = _offsets_on_device(out, index_fields, counts_atoms, counts_edges, host_n_atoms, cuts, atoms_ptr, edges_ptr)
    return WindowOffsets(out, atoms_ptr, edges_ptr, device_atoms_ptr, device_edges_ptr, batch_idx)


def _offsets_on_device(
    out: dict[str, torch.Tensor],
    index_fields: Mapping[str, torch.Tensor],
    counts_atoms: torch.Tensor,
    counts_edges: torch.Tensor,
    host_n_atoms: NDArray[np.int64],
    cuts: NDArray[np.int64],
    atoms_ptr: NDArray[np.int64],
    edges_ptr: NDArray[np.int64],
) -> torch.Tensor:
    """The batch index on the device, and the index fields of ``out`` offset there (sizes from the host)."""
    device = counts_atoms.device
    total_atoms, total_edges = int(atoms_ptr[-1]), int(edges_ptr[-1])
    structure, atom_offset = _within_batch(host_n_atoms, cuts)
    structure_t = torch.from_numpy(structure.astype(np.int32)).to(device, non_blocking=True)
    batch_idx = torch.repeat_interleave(structure_t, counts_atoms, output_size=total_atoms)
    if index_fields:
        offset_t = torch.from_numpy(atom_offset).to(device, non_blocking=True)
        shift_t = torch.repeat_interleave(offset_t, counts_edges, output_size=total_edges)
        for name, index in index_fields.items():
            out[name] = index + shift_t.to(index.dtype).view((-1,) + (1,) * (index.dim() - 1))
    return batch_idx


def slice_window(
    window: WindowOffsets,
    levels: Mapping[str, Level],
    cuts: NDArray[np.int64],
    host_n_atoms: NDArray[np.int64],
    host_n_edges: NDArray[np.int64],
    sample_indices: NDArray[np.int64] | None,
) -> list[dict[str, Any]]:
    """Each batch's views of the window, as the keyword arguments of :class:`~dali_alchemi.batch.Batch`."""
    atoms_ptr, edges_ptr = window.atoms_ptr, window.edges_ptr
    level_cuts = PerLevel(atom=atoms_ptr[cuts].tolist(), edge=edges_ptr[cuts].tolist(), system=cuts.tolist())
    kept_levels = {name: levels[name] for name in window.fields}
    indices = host_indices(sample_indices)  # wrapped once for the window; each batch gets a view
    parts = []
    for j in range(cuts.size - 1):
        g0, g1 = int(cuts[j]), int(cuts[j + 1])
        a0, a1, e0 = level_cuts.atom[j], level_cuts.atom[j + 1], level_cuts.edge[j]
        batch_fields = {}
        for name, tensor in window.fields.items():
            bounds = level_cuts[kept_levels[name]]
            batch_fields[name] = tensor[bounds[j] : bounds[j + 1]]
        parts.append(
            {
                "fields": batch_fields,
                "levels": kept_levels,
                "batch_ptr": window.device_atoms_ptr[g0 : g1 + 1] - a0,
                "edge_batch_ptr": window.device_edges_ptr[g0 : g1 + 1] - e0,
                "batch_idx": window.batch_idx[a0:a1],
                "host_n_atoms": host_n_atoms[g0:g1],
                "host_n_edges": host_n_edges[g0:g1],
                "sample_indices": None if indices is None else indices[g0:g1],
            }
        )
    return parts
