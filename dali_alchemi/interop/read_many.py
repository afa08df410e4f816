"""ReadManyAdapter: any reader with nvalchemi's ``read_many`` contract, as a :class:`PackedReader`.

nvalchemi-toolkit's documented extension point is a ``Reader`` subclass whose ``read_many(indices)``
returns ``[(tensors, metadata), ...]``: one dict of CPU tensors per structure, atom fields ``[V, ...]``,
edge fields ``[E, ...]``, system fields ``[1, ...]``, ``neighbor_list`` indexing the structure's own
atoms. :class:`ReadManyAdapter` turns such a reader (nvalchemi's own ``AtomicDataZarrReader``, or one
written by a user) into the reader seam the loaders read through: one ``read_many`` call per window,
then one ``torch.cat`` per field into the window's flat arrays. Nothing loops per atom; the checks
that every structure's rows agree, and that every neighbor index lies inside its structure, are
vectorised over the window.

Sizes come from the reader's ``get_metadata(index)`` (``(num_atoms, num_edges)``) where it has one,
else from reading the structures; either way each structure's sizes are asked for once and
remembered (also from every window read). :func:`as_packed_reader` is what the loaders call on the
object they are given: a packed reader is used as it is, a ``read_many`` reader is wrapped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch

from dali_alchemi import csr
from dali_alchemi.errors import NotAReaderError, ReaderClosedError, ReaderOutputError
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.indices import checked_indices
from dali_alchemi.store.format.packed import PackedSamples
from dali_alchemi.store.format.protocol import FieldSpec, PackedReader, select_fields

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import CountArray, IndexArray, Level

__all__ = ["SIZE_READ_WINDOW", "ReadManyAdapter", "ReadManyReader", "as_packed_reader"]


SIZE_READ_WINDOW = 1024
"""Structures per ``read_many`` call when sizes must be learned by reading (no ``get_metadata``)."""


@runtime_checkable
class ReadManyReader(Protocol):
    """nvalchemi's reader contract, as its ``Dataset`` uses it: ``read_many``, ``__len__``, ``close``."""

    def read_many(self, indices: Sequence[int]) -> Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]: ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...


class ReadManyAdapter:
    """A :class:`~dali_alchemi.store.format.protocol.PackedReader` over a reader with nvalchemi's ``read_many``.

    Parameters
    ----------
    reader
        Anything with ``read_many(indices) -> [(dict of tensors, metadata), ...]`` and ``__len__``
        (``close`` and ``get_metadata`` are used when present). Values may be torch tensors or numpy
        arrays. The adapter pickles the reader with itself, so DALI worker processes need a reader
        that pickles; otherwise use ``num_workers=0``.
    levels
        Levels of fields that are neither in the reader's ``field_levels`` nor among nvalchemi's
        AtomicData keys (``{"my_field": "atom" | "edge" | "system"}``); they win over both.

    The fields, their dtypes and trailing shapes are those of structure 0, read once here. Indices are
    the reader's own (``0 .. len - 1``; negatives count from the end); the window's
    ``physical_indices`` are the same indices, since the adapter knows nothing of the reader's storage.

    Raises
    ------
    NotAReaderError
        If ``reader`` has no ``read_many`` or no ``__len__`` (also a ``TypeError``).
    FieldLevelError
        For a field with no level from ``levels``, the reader or nvalchemi's key sets.
    ReaderOutputError
        When the reader's samples break the contract (see :meth:`read_packed`).
    """

    def __init__(self, reader: Any, *, levels: Mapping[str, str] | None = None) -> None:
        if not (callable(getattr(reader, "read_many", None)) and hasattr(reader, "__len__")):
            raise NotAReaderError(
                f"{type(reader).__name__} is not a reader: it needs read_many(indices) and __len__ "
                "(nvalchemi's Reader contract), or the PackedReader protocol"
            )
        self._reader = reader
        self._levels_arg = None if levels is None else dict(levels)
        self._n = len(reader)
        self._n_atoms = np.full(self._n, -1, dtype=np.int64)
        self._n_edges = np.full(self._n, -1, dtype=np.int64)
        self._closed = False
        self._specs = self._probe() if self._n else {}
        self._refs: dict[Level, str | None] = {
            level: next((n for n, spec in self._specs.items() if spec.level == level), None)
            for level in ("atom", "edge")
        }

    # -- what the reader holds ----------------------------------------------------------------------
    def _probe(self) -> dict[str, FieldSpec]:
        """Fields, levels, dtypes and trailing shapes from structure 0."""
        sample = self._pairs([0])[0]
        known = dict(getattr(self._reader, "field_levels", None) or {})
        known.update(self._levels_arg or {})
        specs = {}
        for name, value in sample.items():
            if name in layout.NON_DATA_KEYS or value is None:  # an optional field this structure lacks
                continue
            level = layout.resolve_level(name, known)
            shape = tuple(value.shape)
            if level == "system" and len(shape) == 0:
                shape = (1,)
            if len(shape) == 0:
                raise ReaderOutputError(
                    f"Field {name!r} ({level} level) of sample 0 is 0-dimensional; expected one row per {level}"
                )
            specs[name] = FieldSpec(level=level, dtype=_numpy_dtype(value), trailing=shape[1:])
        return specs

    @property
    def reader(self) -> Any:
        """The wrapped reader."""
        return self._reader

    def __len__(self) -> int:
        """Structures in the wrapped reader (as it was when the adapter was made)."""
        return self._n

    @property
    def field_specs(self) -> dict[str, FieldSpec]:
        """Level, dtype and trailing shape of every field structure 0 holds, in the reader's order."""
        return dict(self._specs)

    def normalize_indices(self, indices: int | Sequence[int] | NDArray[Any]) -> IndexArray:
        """Indices as a non-negative int64 array; an index outside ``-len .. len - 1`` is a :class:`SampleIndexError`."""
        return checked_indices(indices, self._n, what="Index", owner="reader")

    def sample_sizes(self, indices: int | Sequence[int] | NDArray[Any]) -> tuple[CountArray, CountArray]:
        """Atom and edge counts: remembered, else from the reader's ``get_metadata``, else read."""
        idx = self.normalize_indices(indices)
        unknown = np.unique(idx[self._n_atoms[idx] < 0])
        if unknown.size:
            self._learn_sizes(unknown)
        return self._n_atoms[idx].copy(), self._n_edges[idx].copy()

    def _learn_sizes(self, unknown: IndexArray) -> None:
        get_metadata = getattr(self._reader, "get_metadata", None)
        if callable(get_metadata):
            # The reader's per-structure call is its API; each structure is asked once, then remembered.
            sizes = np.array([tuple(get_metadata(i)) for i in unknown.tolist()], dtype=np.int64).reshape(-1, 2)
            self._n_atoms[unknown], self._n_edges[unknown] = sizes[:, 0], sizes[:, 1]
            return
        for start in range(0, unknown.size, SIZE_READ_WINDOW):
            self.read_packed(unknown[start : start + SIZE_READ_WINDOW])  # remembers the sizes it read

    # -- reading ------------------------------------------------------------------------------------
    def _pairs(self, indices: list[int]) -> list[Mapping[str, Any]]:
        pairs = self._reader.read_many(indices)
        if len(pairs) != len(indices):
            raise ReaderOutputError(
                f"{type(self._reader).__name__}.read_many returned {len(pairs)} samples for {len(indices)} indices"
            )
        samples = [data for data, _ in pairs]
        if samples and not isinstance(samples[0], Mapping):
            raise ReaderOutputError(
                f"{type(self._reader).__name__}.read_many returned {type(samples[0]).__name__} samples, not dicts "
                "of tensors; give the reader itself (for an nvalchemi Dataset, its .reader)"
            )
        return samples

    def read_packed(
        self, indices: int | Sequence[int] | NDArray[Any], *, fields: Iterable[str] | None = None
    ) -> PackedSamples:
        """One ``read_many`` call, then one ``torch.cat`` per field; request order, duplicates allowed.

        ``neighbor_list`` stays sample-local, as :class:`~dali_alchemi.store.format.packed.PackedSamples`
        holds it (the Batch adds each structure's atom offset).

        Raises
        ------
        ReaderOutputError
            Naming the sample and field: a field missing from a sample, atom or edge fields whose row
            counts disagree within a sample, a system field without its leading 1, a trailing shape or
            dtype other than structure 0's, or a neighbor index outside its structure.
        """
        if self._closed:
            raise ReaderClosedError("This ReadManyAdapter is closed; wrap the reader again")
        names = tuple(self._specs) if fields is None else select_fields(self, fields)
        idx = self.normalize_indices(indices)
        samples = self._pairs(idx.tolist())
        wanted = set(names) | {ref for ref in self._refs.values() if ref is not None}
        parts: dict[str, list[Any]] = {name: [s.get(name) for s in samples] for name in self._specs if name in wanted}
        n_atoms, n_edges = (self._level_counts(parts, names, idx, level) for level in ("atom", "edge"))
        out = {name: self._concat(name, parts[name], idx) for name in names}
        for name in layout.ATOM_INDEX_FIELDS.intersection(names):
            self._check_local(name, out[name], idx, n_atoms, n_edges)
        self._remember_sizes(idx, n_atoms, n_edges)
        return PackedSamples(
            logical_indices=idx,
            physical_indices=idx.copy(),
            n_atoms=n_atoms,
            n_edges=n_edges,
            fields=out,
            levels={name: self._specs[name].level for name in names},
        )

    def _remember_sizes(self, idx: IndexArray, n_atoms: CountArray, n_edges: CountArray) -> None:
        """Record the sizes read; sizes the plan already had (``get_metadata``) must agree with them."""
        known = self._n_atoms[idx] >= 0
        wrong = known & ((self._n_atoms[idx] != n_atoms) | (self._n_edges[idx] != n_edges))
        if wrong.any():
            at = int(np.argmax(wrong))
            i = int(idx[at])
            raise ReaderOutputError(
                f"Sample {i}: get_metadata gave {int(self._n_atoms[i])} atoms and {int(self._n_edges[i])} edges, "
                f"read_many returned {int(n_atoms[at])} atoms and {int(n_edges[at])} edges"
            )
        self._n_atoms[idx], self._n_edges[idx] = n_atoms, n_edges

    def _level_counts(
        self, parts: Mapping[str, list[Any]], names: Sequence[str], idx: IndexArray, level: Level
    ) -> CountArray:
        """Rows per sample at ``level`` (its first field's), checked against every requested field of the level."""
        ref = self._refs[level]
        if ref is None:
            return np.zeros(idx.size, dtype=np.int64)
        want = _row_counts(ref, parts[ref], idx)
        for name in names:
            if name == ref or self._specs[name].level != level:
                continue
            rows = _row_counts(name, parts[name], idx)
            bad = rows != want
            if bad.any():
                at = int(np.argmax(bad))
                raise ReaderOutputError(
                    f"Sample {int(idx[at])}: its {level}-level fields disagree on rows: {ref!r} has "
                    f"{int(want[at])}, {name!r} has {int(rows[at])}"
                )
        return want

    def _concat(self, name: str, parts: list[Any], idx: IndexArray) -> NDArray[Any]:
        spec = self._specs[name]
        if spec.level == "system" and any(p is None for p in parts):
            at = next(i for i, p in enumerate(parts) if p is None)
            raise ReaderOutputError(f"Sample {int(idx[at])} has no field {name!r}; sample 0 has it")
        if spec.level == "system":
            parts = [p.reshape(1) if p.ndim == 0 else p for p in parts]
        try:
            if isinstance(parts[0], torch.Tensor):
                joined = torch.cat(parts).cpu().numpy()
            else:
                joined = np.concatenate([np.asarray(p) for p in parts])
        except (RuntimeError, TypeError, ValueError) as err:
            at = next((i for i, p in enumerate(parts) if tuple(p.shape[1:]) != spec.trailing), 0)
            raise ReaderOutputError(
                f"Sample {int(idx[at])}: field {name!r} has shape {tuple(parts[at].shape)}; expected "
                f"(rows, {', '.join(map(str, spec.trailing))}) as in sample 0 ({err})"
            ) from err
        if joined.dtype != spec.dtype or joined.shape[1:] != spec.trailing:
            at = next((i for i, p in enumerate(parts) if _numpy_dtype(p) != spec.dtype), 0)
            raise ReaderOutputError(
                f"Sample {int(idx[at])}: field {name!r} is {_numpy_dtype(parts[at])} {tuple(parts[at].shape)}; "
                f"sample 0 has {spec.dtype} with trailing shape {spec.trailing}"
            )
        if spec.level == "system" and joined.shape[0] != len(parts):
            at = next(i for i, p in enumerate(parts) if p.shape[0] != 1)
            raise ReaderOutputError(
                f"Sample {int(idx[at])}: system field {name!r} has shape {tuple(parts[at].shape)}; "
                "expected a leading 1, e.g. (1, ...)"
            )
        return joined

    @staticmethod
    def _check_local(
        name: str, values: NDArray[Any], idx: IndexArray, n_atoms: CountArray, n_edges: CountArray
    ) -> None:
        bad = csr.first_out_of_range(values, n_atoms, n_edges)
        if bad is None:
            return
        edge, sample = bad
        local = edge - int(n_edges[:sample].sum())
        raise ReaderOutputError(
            f"Sample {int(idx[sample])}: {name} row {local} holds {values[edge].tolist()}, outside its "
            f"{int(n_atoms[sample])} atoms (read_many must return indices local to each structure)"
        )

    def close(self) -> None:
        """Close the wrapped reader (when it has ``close``). Idempotent; later reads raise ``ReaderClosedError``."""
        if self._closed:
            return
        self._closed = True
        close = getattr(self._reader, "close", None)
        if callable(close):
            close()

    def __repr__(self) -> str:
        return f"ReadManyAdapter({type(self._reader).__name__}, {self._n} samples, {len(self._specs)} fields)"


def _row_counts(name: str, parts: list[Any], idx: IndexArray) -> CountArray:
    """Rows of each sample's value of an atom- or edge-level field; a missing or 0-d value is named."""
    try:
        return np.fromiter((p.shape[0] for p in parts), dtype=np.int64, count=len(parts))
    except (AttributeError, IndexError):
        at = next(i for i, p in enumerate(parts) if p is None or len(p.shape) == 0)
        if parts[at] is None:
            raise ReaderOutputError(f"Sample {int(idx[at])} has no field {name!r}; sample 0 has it") from None
        raise ReaderOutputError(
            f"Sample {int(idx[at])}: field {name!r} is 0-dimensional; expected one row per atom or edge"
        ) from None


def _numpy_dtype(value: Any) -> np.dtype[Any]:
    if isinstance(value, torch.Tensor):
        return torch.empty(0, dtype=value.dtype).numpy().dtype
    return np.asarray(value).dtype


def as_packed_reader(store_or_reader: Any) -> Any:
    """What a loader reads through: a packed reader or a store as given, a ``read_many`` reader wrapped.

    An object with ``read_packed`` and the rest of :class:`~dali_alchemi.store.format.protocol.PackedReader`
    is used as it is (this project's readers); one with only nvalchemi's ``read_many`` and
    ``__len__`` becomes a :class:`ReadManyAdapter`; anything else (a path, a URL, a zarr Store) is
    returned unchanged, for the loader to open as a store. A list or tuple (several stores read as one
    dataset) has each of its members treated so.
    """
    if isinstance(store_or_reader, (list, tuple)):
        return [as_packed_reader(member) for member in store_or_reader]
    if isinstance(store_or_reader, PackedReader):
        return store_or_reader
    if callable(getattr(store_or_reader, "read_many", None)) and hasattr(store_or_reader, "__len__"):
        return ReadManyAdapter(store_or_reader)
    return store_or_reader
