"""PackedSamples: a window of samples as one flat (CSR) array per field.

This is the currency between the reader, the writer and everything downstream. Atom-level fields
are ``[ΣV, *t]``, edge-level fields ``[ΣE, *t]`` and system-level fields ``[B, *t]`` (the store's rows,
without nvalchemi's per-sample leading 1), all in request order. ``neighbor_list`` holds
*sample-local* atom indices; :class:`~dali_alchemi.batch.Batch` adds each sample's node offset.
:meth:`PackedSamples.from_samples` packs per-sample dicts (the writer's input), and
:meth:`PackedSamples.split` is its inverse. Pure numpy; torch tensors are accepted as input values.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from dali_alchemi.csr import concat_aranges, exclusive_cumsum
from dali_alchemi.errors import FieldLevelError, SampleDataError
from dali_alchemi.store.format import layout

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import CountArray, IndexArray, Level, PtrArray

__all__ = ["PackedSamples", "SupportsPacked", "as_numpy"]


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
        Field name -> ``"atom"``, ``"edge"`` or ``"system"``; every field needs one (a field without a
        level raises :class:`~dali_alchemi.errors.FieldLevelError`).
    """

    logical_indices: IndexArray
    physical_indices: IndexArray
    n_atoms: CountArray
    n_edges: CountArray
    fields: Mapping[str, NDArray[Any]]
    levels: Mapping[str, Level]

    def __post_init__(self) -> None:
        unleveled = [name for name in self.fields if name not in self.levels]
        if unleveled:
            raise FieldLevelError(f"Fields {unleveled} have no level; levels= must give every field one")

    @classmethod
    def from_samples(
        cls, samples: Sequence[Mapping[str, Any]], *, levels: Mapping[str, str] | None = None
    ) -> PackedSamples:
        """Concatenate per-sample dicts (sample-local ``neighbor_list`` kept); indices are ``0 .. B-1``.

        Every sample must have the same fields. Atom counts come from the atom-level fields, edge counts
        from the edge-level ones (0 when there are none). System values are ``[1, *t]`` per sample (a 0-d
        value counts as ``[1]``). Values may be numpy arrays, torch tensors or anything array-like.
        This loops over samples: it is the writer's and the reference path, not the loader's.

        Raises
        ------
        SampleDataError
            Naming the sample and field when fields differ between samples or row counts disagree.
        FieldLevelError
            When a field has no level (not in ``levels`` nor in nvalchemi's default key sets).
        """
        if not samples:
            raise SampleDataError("No samples given")
        names = [k for k in samples[0] if k not in layout.NON_DATA_KEYS]
        resolved = {name: layout.resolve_level(name, levels) for name in names}
        arrays: dict[str, list[NDArray[Any]]] = {name: [] for name in names}
        n_atoms = np.zeros(len(samples), dtype=np.int64)
        n_edges = np.zeros(len(samples), dtype=np.int64)
        for i, sample in enumerate(samples):
            present = [k for k in sample if k not in layout.NON_DATA_KEYS]
            if set(present) != set(names):
                raise SampleDataError(
                    f"Sample {i} has fields {sorted(present)}; sample 0 has {sorted(names)} "
                    "(all samples need the same fields)"
                )
            counts: dict[str, tuple[str, int]] = {}
            for name in names:
                arr = as_numpy(sample[name])
                level = resolved[name]
                if level == "system":
                    if arr.ndim == 0:
                        arr = arr.reshape(1)
                    if arr.shape[0] != 1:
                        raise SampleDataError(
                            f"Sample {i} field {name!r} (system level) has shape {arr.shape}; "
                            "expected a leading 1, e.g. (1, ...)"
                        )
                else:
                    if arr.ndim == 0:
                        raise SampleDataError(
                            f"Sample {i} field {name!r} ({level} level) is 0-dimensional; expected one row per {level}"
                        )
                    seen = counts.get(level)
                    if seen is not None and seen[1] != arr.shape[0]:
                        raise SampleDataError(
                            f"Sample {i}: field {name!r} has {arr.shape[0]} rows but {seen[0]!r} has "
                            f"{seen[1]} ({level} level)"
                        )
                    counts[level] = (name, int(arr.shape[0]))
                arrays[name].append(arr)
            n_atoms[i] = counts.get("atom", ("", 0))[1]
            n_edges[i] = counts.get("edge", ("", 0))[1]
        fields: dict[str, NDArray[Any]] = {}
        for name, parts in arrays.items():
            trailing = {p.shape[1:] for p in parts}
            if len(trailing) > 1:
                raise SampleDataError(
                    f"Field {name!r} has different trailing shapes across samples: {sorted(trailing)}"
                )
            fields[name] = np.concatenate(parts, axis=0)
        return cls.from_fields(fields, resolved, n_atoms, n_edges)

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


@runtime_checkable
class SupportsPacked(Protocol):
    """Anything that can give its samples back as :class:`PackedSamples` (a Batch, for one)."""

    def to_packed(self) -> PackedSamples: ...


def as_numpy(value: Any) -> NDArray[Any]:
    """``value`` as a numpy array; a torch tensor is detached and copied to the host first (torch is never
    imported here: a tensor can only exist once it is)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()  # type: ignore[no-any-return]
    return np.asarray(value)
