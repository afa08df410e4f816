"""Fixed-shape batches: pad a Batch to constant atom, edge and structure counts, with masks on the device.

``torch.compile`` specialises on shapes and CUDA graphs record them, so a model fed ragged batches
recompiles or re-records whenever a batch's size changes. :func:`pad_batch` gives every batch exactly
``max_atoms`` atom rows, ``max_edges`` edge rows and ``max_structures`` structures by appending padding
structures at the end, in the manner of jraph's ``pad_with_graphs``:

- the first padding structure owns every padding atom and every padding edge; the others are empty;
- padding atoms sit far from everything: padding atom ``k`` (0-based) is at ``PAD_SPACING * (k + 1)``
  in every coordinate, so no real atom is within any cutoff of one, nor are two padding atoms of each
  other; every other atom field is zero (atomic number 0, zero forces, masses, velocities, ...);
- padding edges are self-loops on padding atoms (``neighbor_list`` rows ``[p, p]``, spread over the
  padding atoms), so no message reaches a real atom; every other edge field is zero (shifts);
- padding system rows are zero (energy 0, pbc False), except ``cell``: ``PAD_SPACING`` times the
  identity, a valid cell wider than any cutoff;
- ``sample_indices`` is -1 for a padding structure.

So a sum-pooled energy over real structures, the forces on real atoms and a message-passing step over
real atoms are what they were without padding. A model ignores the padding through the masks of
:class:`Padding` (``batch.padding``), which are device tensors, as are the real counts: nothing the
model reads changes shape or becomes a Python number that varies per batch. One caveat: a padding
self-loop has length zero, so a model that divides by an edge's length, or differentiates a bare
``sqrt`` of it, must mask padding edges first (``torch.where(edge_mask, r, 1.0)``), as for any
self-loop.

Everything is vectorised torch on the batch's device, sized from the Batch's host counts: no Python
step per structure or atom, and no host-device synchronisation. This module does no I/O and knows
nothing of DALI or of planning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from dali_alchemi.batch import Batch
from dali_alchemi.errors import ConfigError
from dali_alchemi.store.format import layout
from dali_alchemi.types import Level, PerLevel

__all__ = ["CELL", "PAD_SPACING", "POSITIONS", "Padding", "pad_batch", "unpad_batch"]


PAD_SPACING = 1.0e6
"""How far padding atoms sit from the origin and from each other (per coordinate, positions' unit)."""

POSITIONS = "positions"
CELL = "cell"


@dataclass(frozen=True, slots=True, repr=False)
class Padding:
    """What :func:`pad_batch` adds to a Batch: which rows are real, as tensors on the batch's device.

    Attributes
    ----------
    atom_mask
        ``[max_atoms]`` bool: True for a real atom.
    edge_mask
        ``[max_edges]`` bool: True for a real edge.
    structure_mask
        ``[max_structures]`` bool: True for a real structure.
    num_real_structures, num_real_atoms, num_real_edges
        0-d int64 tensors: the number of real structures, atoms and edges. Use them (or the masks) in a
        model, never a Python int: those vary per batch and would make ``torch.compile`` re-specialise.
    host_counts
        The same three counts as Python ints on the host (atom, edge, system), for bookkeeping outside
        the model (:func:`unpad_batch`, logging).

    The real rows are always a prefix: the first ``num_real_atoms`` atoms, and so on. The names follow
    the glossary (structure, atom); ``num_real_graphs`` and ``num_real_nodes`` are deprecated aliases.
    """

    atom_mask: torch.Tensor
    edge_mask: torch.Tensor
    structure_mask: torch.Tensor
    num_real_structures: torch.Tensor
    num_real_atoms: torch.Tensor
    num_real_edges: torch.Tensor
    host_counts: PerLevel[int]

    def __repr__(self) -> str:
        real = self.host_counts
        return (
            f"Padding(atoms={real.atom}/{self.atom_mask.shape[0]}, edges={real.edge}/{self.edge_mask.shape[0]}, "
            f"structures={real.system}/{self.structure_mask.shape[0]})"
        )

    @property
    def num_real_graphs(self) -> torch.Tensor:
        """Deprecated alias of :attr:`num_real_structures`."""
        _deprecated("num_real_graphs", "num_real_structures")
        return self.num_real_structures

    @property
    def num_real_nodes(self) -> torch.Tensor:
        """Deprecated alias of :attr:`num_real_atoms`."""
        _deprecated("num_real_nodes", "num_real_atoms")
        return self.num_real_atoms

    def mask(self, level: Level) -> torch.Tensor:
        """The mask of a level's rows: ``"atom"``, ``"edge"`` or ``"system"``."""
        return {"atom": self.atom_mask, "edge": self.edge_mask, "system": self.structure_mask}[level]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Padding:
        """A copy with ``fn`` applied to every tensor (what ``Batch.to`` and ``Batch.pin_memory`` use)."""
        return Padding(
            atom_mask=fn(self.atom_mask),
            edge_mask=fn(self.edge_mask),
            structure_mask=fn(self.structure_mask),
            num_real_structures=fn(self.num_real_structures),
            num_real_atoms=fn(self.num_real_atoms),
            num_real_edges=fn(self.num_real_edges),
            host_counts=self.host_counts,
        )


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"Padding.{old} is deprecated and will be removed; use Padding.{new}", DeprecationWarning, stacklevel=3
    )


def _check_budget(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _prefix_mask(n_real: int, n_total: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n_total, device=device) < n_real


def _filler(
    name: str, level: Level, tensor: torch.Tensor, rows: int, first_pad_atom: int, pad_atoms: int
) -> torch.Tensor:
    """The ``rows`` padding rows of one field, shaped ``[rows, *tensor.shape[1:]]``."""
    trailing = tensor.shape[1:]
    per_row = (-1, *([1] * len(trailing)))
    if level == "atom" and name == POSITIONS:
        far = torch.arange(1, rows + 1, dtype=torch.float64, device=tensor.device) * PAD_SPACING
        return far.to(tensor.dtype).view(per_row).expand(rows, *trailing)
    if level == "edge" and name in layout.ATOM_INDEX_FIELDS:
        atom = first_pad_atom + torch.arange(rows, device=tensor.device) % pad_atoms
        return atom.to(tensor.dtype).view(per_row).expand(rows, *trailing)
    if level == "system" and name == CELL and len(trailing) == 2 and trailing[0] == trailing[1]:
        cell = torch.eye(trailing[0], dtype=torch.float64, device=tensor.device) * PAD_SPACING
        return cell.to(tensor.dtype).expand(rows, *trailing)
    return tensor.new_zeros((rows, *trailing))


def _padding_rows(real: PerLevel[int], max_atoms: int, max_edges: int, max_structures: int) -> PerLevel[int]:
    """How many padding rows each level needs to reach the budgets; a ``ConfigError`` if it cannot."""
    max_atoms = _check_budget("max_atoms", max_atoms)
    max_edges = _check_budget("max_edges", max_edges)
    max_structures = _check_budget("max_structures", max_structures)
    n_structures, n_atoms, n_edges = real.system, real.atom, real.edge
    for budget, value, count, what in (
        ("max_atoms", max_atoms, n_atoms, "atoms"),
        ("max_edges", max_edges, n_edges, "edges"),
        ("max_structures", max_structures, n_structures, "structures"),
    ):
        if count > value:
            raise ConfigError(f"batch has {count} {what}, over the budget {budget}={value}")
    pad_atoms, pad_edges, pad_structures = max_atoms - n_atoms, max_edges - n_edges, max_structures - n_structures
    if (pad_atoms or pad_edges) and not pad_structures:
        raise ConfigError(
            f"max_structures={max_structures} leaves no room for a padding structure: the batch has "
            f"{n_structures} structures and needs {pad_atoms} padding atoms and {pad_edges} padding edges, "
            f"so max_structures must be at least {n_structures + 1}"
        )
    if pad_edges and not pad_atoms:
        raise ConfigError(
            f"max_atoms={max_atoms} leaves no padding atom for the {pad_edges} padding edges' self-loops: "
            f"the batch has {n_atoms} atoms, so max_atoms must be at least {n_atoms + 1}"
        )
    return PerLevel(atom=pad_atoms, edge=pad_edges, system=pad_structures)


def _padded_fields(batch: Batch, real: PerLevel[int], pad: PerLevel[int]) -> dict[str, torch.Tensor]:
    """Every field with its level's filler rows appended (a field whose level needs none is kept as is)."""
    fields = {}
    for name, tensor in batch.fields.items():
        level = batch.levels[name]
        rows = pad[level]
        filler = _filler(name, level, tensor, rows, real.atom, pad.atom) if rows else None
        fields[name] = tensor if filler is None else torch.cat([tensor, filler])
    return fields


def _padding_masks(real: PerLevel[int], pad: PerLevel[int], device: torch.device) -> Padding:
    """The masks and real counts of ``real`` rows padded by ``pad`` rows, on ``device``."""
    n_structures, n_atoms, n_edges = real.system, real.atom, real.edge

    def count(n: int) -> torch.Tensor:
        return torch.full((), n, dtype=torch.int64, device=device)

    return Padding(
        atom_mask=_prefix_mask(n_atoms, n_atoms + pad.atom, device),
        edge_mask=_prefix_mask(n_edges, n_edges + pad.edge, device),
        structure_mask=_prefix_mask(n_structures, n_structures + pad.system, device),
        num_real_structures=count(n_structures),
        num_real_atoms=count(n_atoms),
        num_real_edges=count(n_edges),
        host_counts=real,
    )


def pad_batch(batch: Batch, *, max_atoms: int, max_edges: int, max_structures: int) -> Batch:
    """``batch`` padded to exactly ``max_atoms`` atoms, ``max_edges`` edges and ``max_structures`` structures.

    Padding structures are appended after the real ones (see the module's docstring for their values);
    the returned Batch's ``padding`` holds the masks and the real counts as tensors on the batch's
    device, and its ``sample_indices`` (when known) are -1 for the padding structures. Real rows keep
    their values and positions, so ``neighbor_list`` indices of real edges are unchanged. The input is
    not modified. Runs on the batch's device without a host synchronisation: the sizes come from the
    Batch's host counts.

    Raises
    ------
    ConfigError
        (a ``ValueError``) If a budget is not a non-negative integer; if the batch already exceeds one
        (naming it and the sizes); if atoms or edges need padding but ``max_structures`` leaves no room
        for a padding structure (real structures + 1 <= ``max_structures`` is needed), or edges need
        padding but ``max_atoms`` leaves no room for a padding atom to carry their self-loops; or if the
        batch is already padded.
    """
    if batch.padding is not None:
        raise ConfigError("batch is already padded; pad the unpadded batch (see unpad_batch)")
    real = PerLevel(atom=batch.num_nodes, edge=batch.num_edges, system=batch.num_graphs)
    pad = _padding_rows(real, max_atoms, max_edges, max_structures)
    device = batch.device

    def ptr(real: torch.Tensor, total: int) -> torch.Tensor:
        # The first padding structure ends at the budget; the others are empty there.
        return torch.cat([real, torch.full((pad.system,), total, dtype=real.dtype, device=real.device)])

    batch_idx = torch.cat(
        [batch.batch_idx, torch.full((pad.atom,), real.system, dtype=batch.batch_idx.dtype, device=device)]
    )
    host_pad = np.zeros(pad.system, dtype=np.int64)
    host_pad_atoms, host_pad_edges = host_pad.copy(), host_pad.copy()
    if pad.system:
        host_pad_atoms[0], host_pad_edges[0] = pad.atom, pad.edge
    sample_indices = None
    if batch.sample_indices is not None:
        sample_indices = torch.cat([batch.sample_indices, torch.from_numpy(host_pad - 1)])
    return Batch(
        fields=_padded_fields(batch, real, pad),
        levels=batch.levels,
        batch_ptr=ptr(batch.batch_ptr, real.atom + pad.atom),
        edge_batch_ptr=ptr(batch.edge_batch_ptr, real.edge + pad.edge),
        batch_idx=batch_idx,
        host_n_atoms=np.concatenate([batch._n_atoms, host_pad_atoms]),
        host_n_edges=np.concatenate([batch._n_edges, host_pad_edges]),
        sample_indices=sample_indices,
        padding=_padding_masks(real, pad, device),
    )


def unpad_batch(batch: Batch) -> Batch:
    """The real part of a padded batch: the inverse of :func:`pad_batch` (views, no copy).

    An unpadded batch is returned as it is.
    """
    padding = batch.padding
    if padding is None:
        return batch
    real = padding.host_counts
    fields = {name: tensor[: real[batch.levels[name]]] for name, tensor in batch.fields.items()}
    return Batch(
        fields=fields,
        levels=batch.levels,
        batch_ptr=batch.batch_ptr[: real.system + 1],
        edge_batch_ptr=batch.edge_batch_ptr[: real.system + 1],
        batch_idx=batch.batch_idx[: real.atom],
        host_n_atoms=batch._n_atoms[: real.system],
        host_n_edges=batch._n_edges[: real.system],
        sample_indices=None if batch.sample_indices is None else batch.sample_indices[: real.system],
    )
