"""PackedSamples: a window of samples as one flat (CSR) array per field.

This is the currency between the reader and everything downstream. Atom-level fields are
``[ΣV, *t]``, edge-level fields ``[ΣE, *t]`` and system-level fields ``[B, *t]`` (the store's rows,
without nvalchemi's per-sample leading 1), all in request order. ``neighbor_list`` holds
*sample-local* atom indices; :class:`~dali_alchemi.batch.Batch` adds each sample's node offset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.store.gather import concat_aranges, exclusive_cumsum

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import CountArray, IndexArray, Level, PtrArray


@dataclass(frozen=True, slots=True)
class PackedSamples:
    """Samples of one window, flat per field, in request order.

    Attributes
    ----------
    logical_indices, physical_indices
        ``[B]`` int64: the indices as requested (normalised, non-negative) and their store rows.
    n_atoms, n_edges
        ``[B]`` int64 per-sample counts.
    fields
        Field name -> flat numpy array (see the module docstring for shapes). Arrays are owned by this
        object (never views into the reader's cache).
    levels
        Field name -> ``"atom"``, ``"edge"`` or ``"system"``.
    """

    logical_indices: IndexArray
    physical_indices: IndexArray
    n_atoms: CountArray
    n_edges: CountArray
    fields: Mapping[str, NDArray[Any]]
    levels: Mapping[str, Level]

    @classmethod
    def from_fields(
        cls, fields: Mapping[str, NDArray[Any]], levels: Mapping[str, Level], n_atoms: CountArray, n_edges: CountArray
    ) -> PackedSamples:
        """Samples that come from no store (built in memory): their indices are ``0 .. B-1``."""
        indices = np.arange(n_atoms.size, dtype=np.int64)
        return cls(
            logical_indices=indices,
            physical_indices=indices,
            n_atoms=n_atoms,
            n_edges=n_edges,
            fields=fields,
            levels=levels,
        )

    def __len__(self) -> int:
        return int(self.logical_indices.size)

    @property
    def atoms_ptr(self) -> PtrArray:
        """``[B + 1]`` int64 offsets of each sample's atoms in the atom-level arrays."""
        return exclusive_cumsum(self.n_atoms)

    @property
    def edges_ptr(self) -> PtrArray:
        """``[B + 1]`` int64 offsets of each sample's edges in the edge-level arrays."""
        return exclusive_cumsum(self.n_edges)

    def take(self, order: IndexArray) -> PackedSamples:
        """Samples in the order ``order`` (positions into this window; repeats allowed), as new arrays."""
        order = np.asarray(order, dtype=np.int64)
        atoms, edges = self.atoms_ptr, self.edges_ptr
        rows = {
            "atom": concat_aranges(atoms[order], self.n_atoms[order]),
            "edge": concat_aranges(edges[order], self.n_edges[order]),
            "system": order,
        }
        return PackedSamples(
            logical_indices=self.logical_indices[order],
            physical_indices=self.physical_indices[order],
            n_atoms=self.n_atoms[order],
            n_edges=self.n_edges[order],
            fields={name: arr[rows[self.levels[name]]] for name, arr in self.fields.items()},
            levels=self.levels,
        )

    def split(self) -> list[dict[str, Any]]:
        """One dict per sample in nvalchemi's per-sample shapes (system rows get their leading 1).

        The values are views (slices) of this object's flat arrays, whatever their type (numpy arrays,
        or torch tensors put in with ``dataclasses.replace``). This loops over samples, so it is for the
        per-sample compatibility API, not for the hot path.
        """
        atoms, edges = self.atoms_ptr.tolist(), self.edges_ptr.tolist()
        out: list[dict[str, Any]] = []
        for i in range(len(self)):
            bounds = {"atom": (atoms[i], atoms[i + 1]), "edge": (edges[i], edges[i + 1]), "system": (i, i + 1)}
            sample = {}
            for name, arr in self.fields.items():
                lo, hi = bounds[self.levels[name]]
                sample[name] = arr[lo:hi]
            out.append(sample)
        return out
