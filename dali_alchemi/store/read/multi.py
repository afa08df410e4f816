"""MultiReader: several stores or readers as one dataset, behind one global index.

Member ``d`` holds the global indices ``offsets[d] .. offsets[d + 1] - 1``, in the order the members
are given, as in nvalchemi 0.2.0's ``MultiDataset``. A MultiReader is a
:class:`~dali_alchemi.store.format.protocol.PackedReader`, so both loaders and every plan read through it
unchanged; :class:`~dali_alchemi.plan.mixture.MixturePlan` decides how often each member is drawn.

- **Fields**: those every member returns (in the first member's order), plus two system-level int64
  fields the MultiReader adds itself: ``dataset_id`` (the member) and ``dataset_index`` (the index in
  that member), on the Batch as ``batch.dataset_id`` (``[B]``); a field the members share with other
  levels, dtypes or row shapes is a :class:`~dali_alchemi.errors.FieldMismatchError`. With
  ``one_dataset=True`` (a multi-store's parts) the members are one dataset: same fields, none added.
- **Reads**: a window is routed to the members vectorised: its indices are grouped per member (one
  packed read per member touched), and each member's rows are copied straight to their place in
  request order: one pass over the window's bytes more than a single store's read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.csr import concat_aranges, exclusive_cumsum
from dali_alchemi.errors import (
    ConfigError,
    FieldMismatchError,
    ReaderClosedError,
    SampleIndexError,
    UnknownFieldError,
)
from dali_alchemi.store.format.indices import checked_indices
from dali_alchemi.store.format.packed import PackedSamples
from dali_alchemi.store.format.protocol import (
    UNCHUNKED_SPAN_SIZE,
    ChunkedReader,
    FieldSpec,
    PackedReader,
    as_field_names,
)
from dali_alchemi.store.read.cache import DEFAULT_CACHE_BYTES
from dali_alchemi.store.read.opening import open_reader

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.format.location import StoreLike
    from dali_alchemi.types import CountArray, IndexArray, Level

__all__ = ["ADDED_FIELDS", "MAX_RUN_COPIES", "MultiReader"]


DATASET_ID, DATASET_INDEX = "dataset_id", "dataset_index"
"""The system-level fields a MultiReader adds: each structure's member and its index in that member."""

ADDED_FIELDS = (DATASET_ID, DATASET_INDEX)

MAX_RUN_COPIES = 4096
"""A window that passes between members in few runs is copied run by run (slices) when runs times
fields stay under this; otherwise it is scattered with index arrays (one pass either way, but slices
move contiguous bytes)."""
_ADDED_SPEC = FieldSpec(level="system", dtype=np.dtype(np.int64), trailing=())


def _display(member: Any, store: Any) -> str:
    """A name for a member in messages: its store path or URL when it has one."""
    source = getattr(member, "source", None)
    if isinstance(source, str):
        return source
    return str(store) if not isinstance(store, PackedReader) else type(member).__name__


class MultiReader:
    """Several stores (paths, URLs, zarr Stores) or :class:`PackedReader` objects read as one dataset.

    Parameters
    ----------
    sources
        The members, in global index order. Stores are opened as
        :class:`~dali_alchemi.store.read.reader.AtomicDataZarrReader` (and closed by :meth:`close`); readers
        are used as they are and left open.
    fields
        Read only these fields (member fields and/or ``dataset_id``/``dataset_index``); ``None``: every
        field all members share, plus the two added ones.
    names
        A name per member for messages (default: the store's path or URL).
    cache_bytes
        Decoded-chunk cache of each store the MultiReader opens itself.
    one_dataset
        The members are parts of one dataset (a multi-store's): no fields added, and plans see one store.

    Raises
    ------
    ConfigError
        With no members, or a ``names`` list of the wrong length.
    FieldMismatchError
        When members share a field with different levels, dtypes or row shapes (naming both), or share
        no field at all.
    UnknownFieldError
        When a requested field is missing from a member (naming the member).
    """

    def __init__(
        self,
        sources: Sequence[StoreLike | PackedReader],
        *,
        fields: str | Iterable[str] | None = None,
        names: Sequence[str] | None = None,
        cache_bytes: int | None = None,
        one_dataset: bool = False,
    ) -> None:
        if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence) or len(sources) == 0:
            raise ConfigError(f"MultiReader needs a non-empty list of stores or readers, got {sources!r}")
        if names is not None and len(names) != len(sources):
            raise ConfigError(f"names= has {len(names)} entries for {len(sources)} members")
        wanted = None if fields is None else as_field_names(fields)
        member_fields = None if wanted is None else tuple(f for f in wanted if f not in ADDED_FIELDS) or None
        self.one_dataset = one_dataset
        self._options = {"fields": wanted, "names": None if names is None else list(names), "one_dataset": one_dataset}
        self._members: list[PackedReader] = []
        self._owned: list[bool] = []
        try:
            for source in sources:
                if isinstance(source, PackedReader):
                    self._members.append(source)
                    self._owned.append(False)
                else:
                    reader, owned = open_reader(source, fields=member_fields, cache_bytes=cache_bytes)
                    self._members.append(reader)
                    self._owned.append(owned)
            self.names: tuple[str, ...] = (
                tuple(names) if names is not None else tuple(map(_display, self._members, sources))
            )
            self._specs = self._shared_specs(wanted)
        except BaseException:
            self.close()
            raise
        self._sources = list(sources)
        self.lengths: tuple[int, ...] = tuple(len(m) for m in self._members)
        self.offsets: IndexArray = exclusive_cumsum(np.asarray(self.lengths, dtype=np.int64))
        self._closed = False

    # -- fields -------------------------------------------------------------------------------------
    def _label(self, d: int) -> str:
        return f"dataset {d} ({self.names[d]!r})"

    def _shared_specs(self, wanted: tuple[str, ...] | None) -> dict[str, FieldSpec]:
        """The fields every member returns, checked to agree; narrowed to ``wanted`` if given."""
        first: dict[str, tuple[int, FieldSpec]] = {}
        for d, member in enumerate(self._members):
            for name, spec in member.field_specs.items():
                seen = first.setdefault(name, (d, spec))
                if seen[0] == d or seen[1] == spec:
                    continue
                e, other = seen
                what = [
                    f"{label} {getattr(other, attr)} in {self._label(e)} but {getattr(spec, attr)} in {self._label(d)}"
                    for attr, label in (("level", "level"), ("dtype", "dtype"), ("trailing", "row shape"))
                    if getattr(other, attr) != getattr(spec, attr)
                ]
                raise FieldMismatchError(f"field {name!r} differs between stores: {'; '.join(what)}")
        shared = [name for name in self._members[0].field_specs if all(name in m.field_specs for m in self._members)]
        added = () if self.one_dataset else ADDED_FIELDS  # one dataset's parts: no member fields added
        clash = [name for name in shared if name in added]
        if clash:
            raise FieldMismatchError(f"the stores already have fields {clash}, which a MultiReader adds itself")
        if wanted is not None:
            for name in wanted:
                if name in added:
                    continue
                lacking = [self._label(d) for d, m in enumerate(self._members) if name not in m.field_specs]
                if lacking:
                    raise UnknownFieldError(f"Unknown fields [{name!r}]: missing from {', '.join(lacking)}")
            return {name: (_ADDED_SPEC if name in added else first[name][1]) for name in wanted}
        if not shared:
            listing = "; ".join(f"{self._label(d)}: {sorted(m.field_specs)}" for d, m in enumerate(self._members))
            raise FieldMismatchError(f"the stores share no field ({listing})")
        specs = {name: first[name][1] for name in shared}
        specs.update(dict.fromkeys(added, _ADDED_SPEC))
        return specs

    @property
    def field_specs(self) -> Mapping[str, FieldSpec]:
        """The shared fields (checked to agree across members), then ``dataset_id`` and ``dataset_index``."""
        return dict(self._specs)

    @property
    def field_levels(self) -> dict[str, Level]:
        """Level of every field, as :attr:`AtomicDataZarrReader.field_levels`."""
        return {name: spec.level for name, spec in self._specs.items()}

    @property
    def members(self) -> tuple[PackedReader, ...]:
        """The member readers, in global index order."""
        return tuple(self._members)

    # -- chunking (the ChunkedReader capability, for shuffle="block") ---------------------------------
    def sample_chunk_bounds(self) -> IndexArray:
        """``[S + 1]`` global span offsets: each member's own spans, shifted by its offset.

        A member with :class:`~dali_alchemi.store.format.protocol.ChunkedReader` gives its chunk spans; one
        without gets spans of :data:`~dali_alchemi.store.format.protocol.UNCHUNKED_SPAN_SIZE` structures. No
        span crosses from one member into the next. Pointers only, no data read.
        """
        self._check_open()
        starts = []
        for offset, member in zip(self.offsets[:-1].tolist(), self._members, strict=True):
            n = len(member)
            if isinstance(member, ChunkedReader):
                bounds = np.asarray(member.sample_chunk_bounds(), dtype=np.int64)
            else:
                bounds = np.append(np.arange(0, n, UNCHUNKED_SPAN_SIZE, dtype=np.int64), np.int64(n))
            starts.append(bounds[:-1] + offset)
        return np.append(np.concatenate(starts), np.int64(len(self))).astype(np.int64)

    @property
    def cache_bytes(self) -> int:
        """The smallest member cache budget (a member without a cache counts as the default budget).

        Each member decodes into its own cache, and a block-shuffle buffer may draw all its spans from
        one member, so buffers are sized for the smallest cache: they fit whichever member they read.
        """
        return min(int(m.cache_bytes) if isinstance(m, ChunkedReader) else DEFAULT_CACHE_BYTES for m in self._members)

    # -- indices ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.offsets[-1])

    def normalize_indices(self, indices: int | Sequence[int] | NDArray[Any]) -> IndexArray:
        """Global indices as a non-negative int64 array; negatives count from the end.

        Raises
        ------
        SampleIndexError
            Naming the first out-of-range index and the length.
        ConfigTypeError
            If the indices are not integers (a ``TypeError``).
        """
        return checked_indices(indices, len(self), what="Index", owner="MultiReader")

    def to_local(self, indices: int | Sequence[int] | NDArray[Any]) -> tuple[IndexArray, IndexArray]:
        """``(dataset_id, dataset_index)`` of global indices (vectorised)."""
        logical = self.normalize_indices(indices)
        member = np.searchsorted(self.offsets, logical, side="right") - 1
        return member.astype(np.int64), logical - self.offsets[member]

    def to_global(self, dataset_id: int | NDArray[Any], dataset_index: int | NDArray[Any]) -> IndexArray:
        """Global indices of ``(dataset_id, dataset_index)`` pairs (vectorised).

        Raises
        ------
        SampleIndexError
            Naming the first member or local index out of range.
        """
        raw_ids, raw_local = np.broadcast_arrays(
            np.asarray(dataset_id).reshape(-1), np.asarray(dataset_index).reshape(-1)
        )
        ids = checked_indices(
            raw_ids, len(self.lengths), what="dataset_id", owner="MultiReader", negative=False, unit="stores"
        )
        largest = max(self.lengths, default=0)
        local = checked_indices(raw_local, largest, what="dataset_index", owner="the largest store", negative=False)
        lengths = np.asarray(self.lengths, dtype=np.int64)[ids]
        bad = local >= lengths
        if bad.any():
            k = int(np.argmax(bad))
            raise SampleIndexError(
                f"dataset_index {int(local[k])} out of range for {self._label(int(ids[k]))} with {int(lengths[k])} samples"
            )
        return np.asarray(self.offsets[ids] + local, dtype=np.int64)

    def _groups(self, logical: IndexArray) -> tuple[IndexArray, IndexArray, list[int]]:
        """Member and local index of each request, and the members touched."""
        member = np.searchsorted(self.offsets, logical, side="right") - 1
        return member, logical - self.offsets[member], np.unique(member).tolist()

    # -- the reader seam ----------------------------------------------------------------------------
    def sample_sizes(self, indices: int | Sequence[int] | NDArray[Any]) -> tuple[CountArray, CountArray]:
        """Atom and edge counts from the members' pointers (no data read), one call per member touched."""
        self._check_open()
        logical = self.normalize_indices(indices)
        member, local, touched = self._groups(logical)
        n_atoms = np.zeros(logical.size, dtype=np.int64)
        n_edges = np.zeros(logical.size, dtype=np.int64)
        for d in touched:
            mask = member == d
            atoms, edges = self._members[d].sample_sizes(local[mask])
            n_atoms[mask], n_edges[mask] = atoms, edges
        return n_atoms, n_edges

    def read_packed(
        self, indices: int | Sequence[int] | NDArray[Any], *, fields: Sequence[str] | None = None
    ) -> PackedSamples:
        """One window in request order (duplicates allowed): one packed read per member touched.

        ``fields`` narrows this reader's fields for this call; ``dataset_id`` and ``dataset_index``
        are computed, not read.
        """
        self._check_open()
        names = tuple(self._specs) if fields is None else as_field_names(fields)
        unknown = sorted(set(names) - set(self._specs))
        if unknown:
            raise UnknownFieldError(f"Unknown fields {unknown}; the reader returns {list(self._specs)}")
        logical = self.normalize_indices(indices)
        member, local, touched = self._groups(logical)
        read = [name for name in names if name not in ADDED_FIELDS]
        if not read:  # only the added fields: sizes suffice
            n_atoms, n_edges = self.sample_sizes(logical)
            packed = PackedSamples(logical, logical, n_atoms, n_edges, {}, {})
        elif len(touched) <= 1:  # one member (or an empty window): its own read, in request order
            packed = self._members[touched[0] if touched else 0].read_packed(local, fields=read)
        else:
            packed = self._read_members(member, local, touched, read)
        added = {DATASET_ID: member, DATASET_INDEX: local}
        out = {name: (added[name] if name in added else packed.fields[name]) for name in names}
        levels = {name: self._specs[name].level for name in names}
        return replace(packed, logical_indices=logical, physical_indices=logical, fields=out, levels=levels)

    def _read_members(
        self, member: IndexArray, local: IndexArray, touched: list[int], read: list[str]
    ) -> PackedSamples:
        """A window spread over several members: one read per member, scattered into place.

        A member whose requests are all distinct reads them in request order, and its rows are copied
        straight to where they go (one pass over the window's bytes, nothing else); one with repeats
        reads its distinct structures once and the repeats are gathered from them.
        """
        parts: list[tuple[PackedSamples, IndexArray, IndexArray | None]] = []
        for d in touched:
            where = np.flatnonzero(member == d)
            unique, inverse = np.unique(local[where], return_inverse=True)
            if unique.size == where.size:  # no repeats: read in request order, no gather needed
                parts.append((self._members[d].read_packed(local[where], fields=read), where, None))
            else:
                parts.append((self._members[d].read_packed(unique, fields=read), where, inverse.reshape(-1)))
        n = member.size
        counts = {"atom": np.empty(n, dtype=np.int64), "edge": np.empty(n, dtype=np.int64)}
        for part, where, inv in parts:
            counts["atom"][where] = part.n_atoms if inv is None else part.n_atoms[inv]
            counts["edge"][where] = part.n_edges if inv is None else part.n_edges[inv]
        ptr = {level: exclusive_cumsum(c) for level, c in counts.items()}
        levels = parts[0][0].levels
        runs = np.flatnonzero(np.diff(member)) + 1  # where the window passes from one member to another
        if all(inv is None for _, _, inv in parts) and (runs.size + 1) * len(read) <= MAX_RUN_COPIES:
            return self._copy_runs(parts, member, runs, counts, ptr, read)
        moves: dict[str, list[tuple[IndexArray, IndexArray | None]]] = {"atom": [], "edge": [], "system": []}
        for part, where, inv in parts:  # destination and source rows per level, shared by every field
            own = {"atom": (part.atoms_ptr, part.n_atoms), "edge": (part.edges_ptr, part.n_edges)}
            for level, (src_ptr, src_counts) in own.items():
                dest = concat_aranges(ptr[level][where], counts[level][where])
                moves[level].append((dest, None if inv is None else concat_aranges(src_ptr[inv], src_counts[inv])))
            moves["system"].append((where, inv))
        fields = {}
        for name in read:
            level, sample = levels[name], parts[0][0].fields[name]
            out = np.empty((n if level == "system" else int(ptr[level][-1]), *sample.shape[1:]), dtype=sample.dtype)
            rows = _as_rows(out)
            for (part, _, _), (dest, src) in zip(parts, moves[level], strict=True):
                values = _as_rows(part.fields[name])
                rows[dest] = values if src is None else values[src]
            fields[name] = out
        return PackedSamples(member, member, counts["atom"], counts["edge"], fields, dict(levels))

    @staticmethod
    def _copy_runs(
        parts: list[tuple[PackedSamples, IndexArray, IndexArray | None]],
        member: IndexArray,
        runs: IndexArray,
        counts: dict[str, CountArray],
        ptr: dict[str, IndexArray],
        read: list[str],
    ) -> PackedSamples:
        """A window made of few runs of one member each: one slice copy per run and field, no index arrays."""
        n = member.size
        starts = np.concatenate([[0], runs]).astype(np.int64)
        ends = np.append(runs, n).astype(np.int64)
        rank = np.empty(n, dtype=np.int64)  # each request's position in its member's read
        part_of = np.empty(n, dtype=np.int64)  # and which part holds it
        source_ptr: dict[str, list[IndexArray]] = {"atom": [], "edge": []}
        for k, (part, where, _) in enumerate(parts):
            rank[where] = np.arange(where.size, dtype=np.int64)
            part_of[where] = k
            source_ptr["atom"].append(part.atoms_ptr)
            source_ptr["edge"].append(part.edges_ptr)
        run_part, run_rank = part_of[starts], rank[starts]
        # Each part's pointers, end to end, so one lookup gives every run's first source row.
        flat = {lv: np.concatenate(p) for lv, p in source_ptr.items()}
        base = np.concatenate([[0], np.cumsum([p.size for p in source_ptr["atom"]])[:-1]]).astype(np.int64)
        bounds: dict[str, tuple[list[int], list[int], list[int]]] = {}
        for level in ("atom", "edge", "system"):
            out_ptr = ptr[level] if level != "system" else np.arange(n + 1, dtype=np.int64)
            src = run_rank if level == "system" else flat[level][base[run_part] + run_rank]
            bounds[level] = (out_ptr[starts].tolist(), out_ptr[ends].tolist(), src.tolist())
        levels = parts[0][0].levels
        owners = [parts[k][0] for k in run_part.tolist()]
        fields = {}
        for name in read:
            level, sample = levels[name], parts[0][0].fields[name]
            lo, hi, src = bounds[level]
            out = np.empty((n if level == "system" else int(ptr[level][-1]), *sample.shape[1:]), dtype=sample.dtype)
            for owner, a, b, c in zip(owners, lo, hi, src, strict=True):
                out[a:b] = owner.fields[name][c : c + b - a]
            fields[name] = out
        return PackedSamples(member, member, counts["atom"], counts["edge"], fields, dict(levels))

    # -- lifetime -----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise ReaderClosedError("This MultiReader is closed")

    def close(self) -> None:
        """Close the members this MultiReader opened (readers passed in are left open). Idempotent."""
        for member, owned in zip(self._members, self._owned, strict=True):
            if owned:
                member.close()
        self._closed = True

    def __enter__(self) -> MultiReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # Members pickle as their own recipes; the copy opens (and so owns) every one of them.
        return (_rebuild, (self._members, self._options))

    def __repr__(self) -> str:
        parts = ", ".join(f"{n!r}: {length}" for n, length in zip(self.names, self.lengths, strict=True))
        return f"MultiReader({{{parts}}}, {len(self._specs)} fields)"


def _as_rows(arr: NDArray[Any]) -> NDArray[Any]:
    """``arr`` as one opaque item per row (a 1-D void view), so row scatters copy bytes, not elements."""
    arr = np.ascontiguousarray(arr)
    nbytes = arr.dtype.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
    if arr.ndim < 2 or nbytes == 0 or arr.shape[0] == 0:
        return arr
    return arr.reshape(arr.shape[0], -1).view(np.dtype((np.void, nbytes))).reshape(-1)


def _rebuild(members: list[PackedReader], options: dict[str, Any]) -> MultiReader:
    reader = MultiReader(members, fields=options["fields"], names=options["names"], one_dataset=options["one_dataset"])
    reader._owned = [True] * len(members)
    return reader
