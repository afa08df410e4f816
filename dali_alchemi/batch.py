"""Batch: many structures collated into flat tensors, with nvalchemi's names and PyG's ``ptr`` logic.

Collation is the forward direction (:meth:`Batch.from_packed`, :meth:`Batch.from_samples`) and
separation the inverse (:meth:`Batch.__getitem__`, :meth:`Batch.to_data_list`, :meth:`Batch.to_packed`).
Atom- and edge-level fields are concatenated; system-level fields are stacked on dim 0 (energy
``[B, 1]``, cell ``[B, 3, 3]``, pbc ``[B, 3]``); ``neighbor_list`` is offset by each structure's node
offset. Where each batch ends is given (``batch_bounds``, from the plan), never re-derived here.
Building a Batch from packed data has no per-sample Python step, and the per-atom ``batch_idx`` and the
offsets are computed on the Batch's device without a host synchronisation. This module does no I/O,
knows nothing of DALI, and leaves conversions to other frameworks to :mod:`dali_alchemi.interop`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from numpy.typing import NDArray

from dali_alchemi import csr
from dali_alchemi.collate import check_window, host_indices, slice_window, window_offsets
from dali_alchemi.csr import exclusive_cumsum
from dali_alchemi.errors import (
    ConfigTypeError,
    EmptyBatchError,
    FieldAssignmentError,
    FieldLevelError,
    SampleIndexError,
)
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.packed import PackedSamples
from dali_alchemi.types import PerLevel

if TYPE_CHECKING:
    from dali_alchemi.padding import Padding
    from dali_alchemi.types import Level, PtrArray

__all__ = ["ArrayLike", "Batch", "collate"]


_KEY_OF_LEVEL: dict[Level, str] = {"atom": "node", "edge": "edge", "system": "system"}

ArrayLike = torch.Tensor | NDArray[Any]


def collate(
    *,
    fields: Mapping[str, torch.Tensor],
    levels: Mapping[str, Level],
    n_atoms: torch.Tensor,
    n_edges: torch.Tensor,
    host_n_atoms: NDArray[np.int64],
    host_n_edges: NDArray[np.int64],
    batch_bounds: PtrArray | None = None,
    sample_indices: NDArray[np.int64] | None = None,
    batch_idx: torch.Tensor | None = None,
) -> list[Batch]:
    """Cut a window of structures (flat tensors, in order) into Batches at structure offsets ``batch_bounds``.

    ``fields`` are flat and on one device, with sample-local index fields (``neighbor_list``);
    ``n_atoms``/``n_edges`` are the per-structure counts on that device and ``host_n_atoms``/
    ``host_n_edges`` the same counts on the host. The per-atom batch index, the pointers and the
    index-field offsets are computed once for the whole window (numpy on the CPU, torch on a GPU, with
    sizes from the host so nothing synchronises), and every Batch gets views of them. ``batch_bounds`` is
    the ``[b + 1]`` int64 structure offsets of the window's batches, as the plan decided them (``None``
    makes one batch of everything). When ``batch_idx`` is given it came from :func:`~dali_alchemi.collate.collate_on_host`,
    and the index fields are already offset. The steps are in :mod:`dali_alchemi.collate`.

    Raises
    ------
    FieldLevelError
        If a field has no level.
    EmptyBatchError
        If the window is empty.
    PlanError
        If ``batch_bounds`` does not rise strictly from 0 to the window's length.
    """
    cuts = check_window(fields, levels, int(host_n_atoms.size), batch_bounds)
    window = window_offsets(fields, n_atoms, n_edges, host_n_atoms, host_n_edges, cuts, batch_idx)
    return [Batch(**parts) for parts in slice_window(window, levels, cuts, host_n_atoms, host_n_edges, sample_indices)]


class Batch:
    """A collated batch of structures.

    Attributes
    ----------
    fields
        Field name -> tensor: atom level ``[V, *t]``, edge level ``[E, *t]``, system level ``[B, *t]``.
    levels
        Field name -> ``"atom"``, ``"edge"`` or ``"system"``.
    batch_ptr
        ``[B + 1]`` int64: structure ``i`` owns atom rows ``batch_ptr[i]:batch_ptr[i + 1]``.
    edge_batch_ptr
        ``[B + 1]`` int64: the same for edge rows.
    batch_idx
        ``[V]`` int32: the structure of each atom.
    sample_indices
        ``[B]`` int64 torch tensor on the CPU, whatever the batch's device: the logical store index of each
        structure, when known (``None`` when not); -1 for a padding structure. It stays on the host, as
        the counts ``num_nodes_list``/``num_edges_list`` do, because it is bookkeeping read on the host
        (logging, looking samples up): on a GPU it would cost a copy per batch and a sync to read.
        It used to be a numpy array; ``.numpy()`` gives that array (sharing memory). Anything assigned
        to it (an array, a list, a tensor on any device) is stored as such a tensor.
    padding
        ``None``, or for a batch made by :func:`~dali_alchemi.padding.pad_batch` its
        :class:`~dali_alchemi.padding.Padding`: the masks (``atom_mask``, ``edge_mask``,
        ``structure_mask``) and the real counts as device tensors. A padded batch's rows, counts and
        structures include the padding: ``num_graphs``, ``num_nodes`` and ``num_edges`` are the padded
        sizes (``max_structures``, ``max_atoms``, ``max_edges``), the same for every batch, and
        ``batch[i]``/``to_data_list()`` give the padding structures too (with their filler values);
        :func:`~dali_alchemi.padding.unpad_batch` gives back the real part.

    Fields are also reachable as attributes (``batch.positions``) and by name (``batch["positions"]``).
    ``batch[i]`` gives structure ``i`` back as a dict with local ``neighbor_list`` indices. Build
    Batches with :meth:`from_packed`, :meth:`from_samples` or :func:`collate`; the constructor takes
    already collated parts.
    """

    __slots__ = (
        "_n_atoms",
        "_n_edges",
        "_sample_indices",
        "batch_idx",
        "batch_ptr",
        "edge_batch_ptr",
        "fields",
        "levels",
        "padding",
    )

    def __init__(
        self,
        *,
        fields: Mapping[str, torch.Tensor],
        levels: Mapping[str, Level],
        batch_ptr: torch.Tensor,
        edge_batch_ptr: torch.Tensor,
        batch_idx: torch.Tensor,
        host_n_atoms: NDArray[np.int64],
        host_n_edges: NDArray[np.int64],
        sample_indices: torch.Tensor | NDArray[np.int64] | Sequence[int] | None = None,
        padding: Padding | None = None,
    ) -> None:
        self.fields: dict[str, torch.Tensor] = dict(fields)
        self.levels: dict[str, Level] = dict(levels)
        self.batch_ptr = batch_ptr
        self.edge_batch_ptr = edge_batch_ptr
        self.batch_idx = batch_idx
        self.sample_indices = sample_indices
        self.padding = padding
        self._n_atoms = np.asarray(host_n_atoms, dtype=np.int64)
        self._n_edges = np.asarray(host_n_edges, dtype=np.int64)

    @property
    def sample_indices(self) -> torch.Tensor | None:
        """``[B]`` int64 CPU tensor of the structures' store indices (-1 for padding), or ``None`` when unknown."""
        return self._sample_indices

    @sample_indices.setter
    def sample_indices(self, value: torch.Tensor | NDArray[np.int64] | Sequence[int] | None) -> None:
        self._sample_indices = host_indices(value)

    # -- constructors -------------------------------------------------------------------------------
    @classmethod
    def from_packed(
        cls, packed: PackedSamples, *, device: torch.device | str | None = None, non_blocking: bool = False
    ) -> Batch:
        """Collate a packed read (see :class:`~dali_alchemi.store.format.packed.PackedSamples`) with no per-sample step.

        The numpy arrays are wrapped without a copy on the CPU, or copied once per field to ``device``.
        """
        target = torch.device(device) if device is not None else torch.device("cpu")

        def put(arr: NDArray[Any]) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(arr)).to(target, non_blocking=non_blocking)

        return collate(
            fields={name: put(arr) for name, arr in packed.fields.items()},
            levels=packed.levels,
            n_atoms=put(packed.n_atoms),
            n_edges=put(packed.n_edges),
            host_n_atoms=packed.n_atoms,
            host_n_edges=packed.n_edges,
            sample_indices=packed.logical_indices,
        )[0]

    @classmethod
    def from_samples(
        cls,
        samples: Sequence[Mapping[str, ArrayLike]],
        *,
        levels: Mapping[str, str] | None = None,
        device: torch.device | str | None = None,
        sample_indices: Sequence[int] | NDArray[np.int64] | None = None,
    ) -> Batch:
        """Collate per-sample dicts (nvalchemi shapes: atom ``[V, *t]``, edge ``[E, *t]``, system ``[1, *t]``).

        Levels come from ``levels``, then nvalchemi's default key sets; an unknown field is an error.
        ``neighbor_list`` must be sample-local. ``sample_indices`` records where the samples came from
        (``None``: unknown). This loops over samples: it is the reference path, not the fast one.
        """
        if not samples:
            raise EmptyBatchError("Cannot create batch from empty data list")
        batch = cls.from_packed(PackedSamples.from_samples(samples, levels=levels), device=device)
        batch.sample_indices = sample_indices
        return batch

    # -- inverse ------------------------------------------------------------------------------------
    def to_packed(self) -> PackedSamples:
        """The inverse of :meth:`from_packed`: host numpy arrays with sample-local ``neighbor_list``."""
        host = self.to("cpu")
        fields: dict[str, NDArray[Any]] = {}
        for name, tensor in host.fields.items():
            values = tensor.numpy()
            if name in layout.ATOM_INDEX_FIELDS:
                values = csr.rebase(values.copy(), host.batch_ptr[:-1].numpy(), self._n_edges, sign=-1)
            fields[name] = values
        indices = self.sample_indices if self.sample_indices is not None else np.arange(self.num_graphs, dtype=np.int64)
        return PackedSamples(
            logical_indices=np.asarray(indices, dtype=np.int64),
            physical_indices=np.asarray(indices, dtype=np.int64),
            n_atoms=self._n_atoms.copy(),
            n_edges=self._n_edges.copy(),
            fields=fields,
            levels=dict(self.levels),
        )

    def get_sample(self, index: int) -> dict[str, torch.Tensor]:
        """Structure ``index`` as a dict in nvalchemi's per-sample shapes, with local ``neighbor_list``."""
        n = self.num_graphs
        if not -n <= index < n:
            raise SampleIndexError(f"Index {index} out of range for batch with {n} structures")
        index %= n
        atoms = exclusive_cumsum(self._n_atoms)
        edges = exclusive_cumsum(self._n_edges)
        bounds = PerLevel(
            atom=(int(atoms[index]), int(atoms[index + 1])),
            edge=(int(edges[index]), int(edges[index + 1])),
            system=(index, index + 1),
        )
        sample = {}
        for name, tensor in self.fields.items():
            lo, hi = bounds[self.levels[name]]
            part = tensor[lo:hi]
            if name in layout.ATOM_INDEX_FIELDS:
                part = part - int(atoms[index])
            sample[name] = part
        return sample

    def to_data_list(self) -> list[dict[str, torch.Tensor]]:
        """Every structure as a dict (see :meth:`get_sample`)."""
        return [self.get_sample(i) for i in range(self.num_graphs)]

    # -- access -------------------------------------------------------------------------------------
    def __getitem__(self, key: str | int) -> Any:
        if isinstance(key, str):
            return self.fields[key]
        if isinstance(key, (int, np.integer)):
            return self.get_sample(int(key))
        raise ConfigTypeError(f"Batch indices must be a field name or an int, got {type(key).__name__}")

    def __getattr__(self, name: str) -> torch.Tensor:
        # Only called when normal lookup fails: expose fields as attributes.
        if name.startswith("_") or name in Batch.__slots__:
            raise AttributeError(name)
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(f"Batch has no field or attribute {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self.fields

    def __setattr__(self, name: str, value: Any) -> None:
        """``batch.name = tensor`` adds (or replaces) a field, its level read from the leading dimension.

        Raises
        ------
        FieldLevelError
            When the leading dimension matches no level's rows, or several (say ``num_graphs ==
            num_nodes``): :meth:`add_field` names the level.
        FieldAssignmentError
            For a value that is not a tensor with at least one dimension (also a ``TypeError``).
        """
        if name in Batch.__slots__ or name == "sample_indices":
            object.__setattr__(self, name, value)
            return
        if name in self.levels:
            self.add_field(name, value, self.levels[name])
            return
        rows = self._level_rows()
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            raise FieldAssignmentError(
                f"batch.{name} = ... needs a tensor with one row per atom ({rows['atom']}), edge ({rows['edge']}) "
                f"or structure ({rows['system']}); got {type(value).__name__}"
                + (" with no dimensions" if isinstance(value, torch.Tensor) else "")
            )
        matches = [level for level, n in rows.items() if n == value.shape[0]]
        if len(matches) != 1:
            found = "matches no level" if not matches else f"matches {' and '.join(matches)} level"
            raise FieldLevelError(
                f"Cannot tell the level of {name!r} from its leading dimension {value.shape[0]}: it {found} "
                f"(atoms {rows['atom']}, edges {rows['edge']}, structures {rows['system']}); "
                f"use batch.add_field({name!r}, tensor, level='atom' | 'edge' | 'system')"
            )
        self.add_field(name, value, matches[0])

    def _level_rows(self) -> dict[Level, int]:
        return {"atom": self.num_nodes, "edge": self.num_edges, "system": self.num_graphs}

    def add_field(self, name: str, tensor: torch.Tensor, level: Level) -> None:
        """Add or replace field ``name`` at ``level``; its leading dimension must be that level's row count.

        Raises
        ------
        FieldLevelError
            For an unknown level, or a row count that does not fit it.
        FieldAssignmentError
            If ``tensor`` is not a tensor with at least one dimension.
        """
        rows = self._level_rows()
        if level not in rows:
            raise FieldLevelError(f"level must be 'atom', 'edge' or 'system', got {level!r}")
        if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
            raise FieldAssignmentError(f"Field {name!r} needs a tensor with at least one dimension, got {tensor!r}")
        if tensor.shape[0] != rows[level]:
            raise FieldLevelError(
                f"Field {name!r} at {level} level needs {rows[level]} rows, got a tensor of shape {tuple(tensor.shape)}"
            )
        self.fields[name] = tensor
        self.levels[name] = level

    @property
    def keys(self) -> dict[str, set[str]]:
        """nvalchemi's view of the levels: ``{"node": {...}, "edge": {...}, "system": {...}}``."""
        keys: dict[str, set[str]] = {"node": set(), "edge": set(), "system": set()}
        for name, level in self.levels.items():
            keys[_KEY_OF_LEVEL[level]].add(name)
        return keys

    @property
    def device(self) -> torch.device:
        """The device of the batch's tensors."""
        return self.batch_ptr.device

    @property
    def num_graphs(self) -> int:
        """Number of structures (B), padding structures included."""
        return int(self._n_atoms.size)

    batch_size = num_graphs

    @property
    def num_nodes(self) -> int:
        """Total atoms (V), padding atoms included."""
        return int(self._n_atoms.sum())

    @property
    def num_edges(self) -> int:
        """Total edges (E), padding edges included."""
        return int(self._n_edges.sum())

    @property
    def num_nodes_list(self) -> list[int]:
        """Atoms per structure, as a Python list (host data; no device synchronisation)."""
        return self._n_atoms.tolist()  # type: ignore[no-any-return]

    @property
    def num_edges_list(self) -> list[int]:
        """Edges per structure, as a Python list (host data; no device synchronisation)."""
        return self._n_edges.tolist()  # type: ignore[no-any-return]

    @property
    def num_nodes_per_graph(self) -> torch.Tensor:
        """``[B]`` int32 atoms per structure, on the batch's device."""
        return torch.diff(self.batch_ptr).to(torch.int32)

    @property
    def num_edges_per_graph(self) -> torch.Tensor:
        """``[B]`` int32 edges per structure, on the batch's device."""
        return torch.diff(self.edge_batch_ptr).to(torch.int32)

    # -- movement -----------------------------------------------------------------------------------
    def _map(self, fn: Any) -> Batch:
        new = object.__new__(Batch)
        new.fields = {name: fn(t) for name, t in self.fields.items()}
        new.levels = dict(self.levels)
        new.batch_ptr = fn(self.batch_ptr)
        new.edge_batch_ptr = fn(self.edge_batch_ptr)
        new.batch_idx = fn(self.batch_idx)
        new.sample_indices = self.sample_indices
        new.padding = None if self.padding is None else self.padding.map(fn)
        new._n_atoms = self._n_atoms
        new._n_edges = self._n_edges
        return new

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy on ``device`` (tensors already there are shared, not copied)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def cpu(self) -> Batch:
        """A copy on the CPU."""
        return self.to("cpu")

    def pin_memory(self) -> Batch:
        """A copy with every tensor in pinned host memory (needs CUDA)."""
        return self._map(lambda t: t.pin_memory())

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={tuple(v.shape)}" for k, v in self.fields.items())
        padded = "" if self.padding is None else f", real_structures={self.padding.host_counts.system}"
        return (
            f"Batch(num_graphs={self.num_graphs}, num_nodes={self.num_nodes}, num_edges={self.num_edges}{padded}, "
            f"{shapes})"
        )
