"""Open-time checks of a store: the cheap invariants, with errors that name the array and the problem.

Everything here reads only metadata plus the pointer arrays and ``samples_mask`` (one int64 and one
bool per sample), so opening a large store stays fast. Chunk contents are checked lazily, when the
reader decodes them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.core.sync import sync
from zarr.errors import BaseZarrError, GroupNotFoundError

from dali_alchemi.errors import NotAStoreError, StoreFormatError
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.journal import AS_IS, ReadView
from dali_alchemi.store.format.location import NOT_A_STORE_NEXT_STEP, open_group, root_groups, zarr_error_text
from dali_alchemi.store.format.multistore import is_multistore
from dali_alchemi.store.read.pointers import PrivateMeta, read_meta_values
from dali_alchemi.store.read.shared_pointers import (
    SharedPointers,
    content_key,
    store_id,
)  # fmt: skip
from dali_alchemi.types import PerLevel

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.format.location import StoreLocation
    from dali_alchemi.store.read.pointers import MetaSink
    from dali_alchemi.types import Level

__all__ = [
    "FALLBACK_MEMORY_BUDGET",
    "NOT_A_STORE_NEXT_STEP",
    "ROW_SOURCES",
    "MetaInfo",
    "check_chunk_size",
    "check_data_array",
    "check_every_array_known",
    "check_meta",
    "holds_root_metadata",
    "memory_budget",
    "open_root",
]


@dataclass(frozen=True, slots=True)
class MetaInfo:
    """What the ``meta`` group and root attributes say: pointers, mask and schema, all checked."""

    schema: layout.StoreSchema
    atoms_ptr: NDArray[np.int64]
    edges_ptr: NDArray[np.int64]
    samples_mask: NDArray[np.bool_]
    groups: frozenset[str]
    growing: bool = False  # an append is in progress: data arrays may be longer than the pointers say
    integrity: layout.Integrity = field(default_factory=layout.Integrity)  # what the store promises of its chunks
    active: NDArray[np.int64] | None = None
    """Physical index of each live sample; ``None`` when none is deleted (the physical index is the logical)."""
    crcs: dict[str, NDArray[np.uint32]] | None = None
    """Segment checksums of the meta arrays (see :mod:`~dali_alchemi.store.read.pointers`), where a shared copy holds them."""

    @property
    def n_physical(self) -> int:
        """Physical samples (soft-deleted ones included)."""
        return int(self.samples_mask.size)

    @property
    def rows(self) -> PerLevel[int]:
        """Rows of each level the pointers and mask account for (deleted samples included)."""
        return PerLevel(atom=int(self.atoms_ptr[-1]), edge=int(self.edges_ptr[-1]), system=self.n_physical)


def holds_root_metadata(loc: StoreLocation) -> bool:
    """Whether there is a ``zarr.json`` at the store's root (readable or not): a store, perhaps a damaged
    one, rather than a path that holds none (an empty or unrelated folder, a plain file)."""
    if loc.local_root is not None:
        return (loc.local_root / "zarr.json").is_file()
    try:
        return bool(sync(loc.store.exists(loc.key("zarr.json"))))
    except (OSError, BaseZarrError, ValueError):
        return False


def open_root(loc: StoreLocation) -> Any:
    """Open the store's root group read-only; not a zarr v3 group -> :class:`StoreFormatError`.

    Raises
    ------
    NotAStoreError
        If there is no group at all (no ``zarr.json``: an empty folder, say); also a ``FileNotFoundError``.
    StoreFormatError
        If the path is a plain file, its ``zarr.json`` is unreadable, or it is not zarr format 3.
    """
    if loc.local_root is not None and loc.local_root.exists() and not loc.local_root.is_dir():
        raise StoreFormatError(
            f"Store {loc.display} is a file, not a store: a store is a folder (a zarr v3 group). {NOT_A_STORE_NEXT_STEP}"
        )
    try:
        root = open_group(loc, mode="r")
    except GroupNotFoundError as err:
        if loc.local_root is not None and is_multistore(loc.local_root):
            raise NotAStoreError(
                f"Store {loc.display} is a multi-store (part stores and a manifest, as a parallel convert writes): "
                "open it as one dataset with open_reader(path), a loader given the path, or open_multistore(path)"
            ) from err
        raise NotAStoreError(
            f"Store {loc.display} is not a zarr group: there is no zarr.json at its root. {NOT_A_STORE_NEXT_STEP}"
        ) from err
    except (BaseZarrError, FileNotFoundError, KeyError, ValueError, TypeError) as err:
        kind = NotAStoreError if isinstance(err, FileNotFoundError) else StoreFormatError
        raise kind(
            f"Store {loc.display} is not a zarr group: its zarr.json is unreadable: {zarr_error_text(err)}. "
            f"{NOT_A_STORE_NEXT_STEP}"
        ) from err
    version = root.metadata.zarr_format
    if version != 3:
        raise StoreFormatError(f"Store {loc.display} is zarr format {version}; expected zarr format 3")
    return root


def _read_meta_array(meta: Any, name: str, store: str) -> Any:
    try:
        return meta[name]
    except KeyError as err:
        raise StoreFormatError(f"Store {store}: missing array meta/{name}") from err


def _check_meta_sizes(n: int, store: str) -> None:
    """Refuse meta arrays that could not be read into memory, before reading them."""
    needed = 2 * 8 * (n + 1) + n
    budget = memory_budget()
    if needed > budget:
        raise StoreFormatError(
            f"Store {store}: meta/samples_mask claims {n:,} samples, so the pointers and mask need "
            f"{needed / 2**30:,.1f} GiB, more than half of this machine's memory ({budget / 2**30:,.1f} GiB)"
        )


FALLBACK_MEMORY_BUDGET = 8 << 30
"""The read budget where the machine's memory cannot be queried."""


def memory_budget() -> int:
    """Half of this machine's physical memory, in bytes: the most one read may allocate."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return FALLBACK_MEMORY_BUDGET


def check_meta(root: Any, *, store: str, view: ReadView = AS_IS, shared: SharedPointers | None = None) -> MetaInfo:
    """Check groups, root attributes, pointers and masks; return the pointers and mask as numpy arrays.

    ``view`` says how to read a store with an unfinished operation
    (:func:`~dali_alchemi.store.format.journal.interpret`): during an append the meta arrays may already be
    longer than the old state they are read at (``view.rows``); during a delete, ``view.deleted``
    samples are read as deleted. With ``shared`` (a local store with at least its ``min_samples``
    samples) the pointers and mask are mapped read-only from the copy a process of this machine built
    (:mod:`~dali_alchemi.store.read.shared_pointers`), or built into it here.

    Raises
    ------
    StoreFormatError
        If the layout, a pointer or the mask is inconsistent; as its subclass
        :class:`~dali_alchemi.store.read.shared_pointers.PointersChanged`, if the meta arrays changed while a
        shared copy of them was built (read the store again).
    """
    groups = frozenset(root_groups(root))
    for required in (layout.META_GROUP, layout.CORE_GROUP):
        if required not in groups:
            raise StoreFormatError(f"Store {store} is missing the {required!r} group")
    attributes = root.attrs.asdict()
    schema = layout.parse_schema(attributes, store=store)
    integrity = layout.parse_integrity(attributes, store=store)
    complete = integrity.complete_chunks
    meta = root[layout.META_GROUP]
    arrays = {name: _read_meta_array(meta, name, store) for name in layout.META_ARRAYS}
    mask_arr = arrays[layout.SAMPLES_MASK]
    if len(mask_arr.shape) != 1:
        raise StoreFormatError(f"Store {store}: meta/samples_mask has shape {mask_arr.shape}; expected 1-D")
    if mask_arr.dtype != np.bool_:
        raise StoreFormatError(f"Store {store}: meta/samples_mask has dtype {mask_arr.dtype}; expected bool")
    appending = view.rows is not None
    n = view.rows.system if view.rows is not None else int(mask_arr.shape[0])
    if appending and mask_arr.shape[0] < n:
        raise StoreFormatError(
            f"Store {store}: meta/samples_mask has {mask_arr.shape[0]} entries; the write journal says {n}"
        )
    for name in (layout.ATOMS_PTR, layout.EDGES_PTR):
        rows = int(arrays[name].shape[0]) if len(arrays[name].shape) == 1 else -1
        if rows != n + 1 and not (appending and rows > n):
            raise StoreFormatError(
                f"Store {store}: meta/{name} has shape {tuple(arrays[name].shape)}; "
                f"expected ({n + 1},) for {n} samples in samples_mask"
            )
    _check_meta_sizes(n, store)
    values, active, crcs = _meta_values(arrays, n, store=store, complete=complete, view=view, shared=shared)
    samples_mask, atoms_ptr, edges_ptr = (values[k] for k in (layout.SAMPLES_MASK, layout.ATOMS_PTR, layout.EDGES_PTR))
    for mask_name, ptr, what in ((layout.ATOMS_MASK, atoms_ptr, "atoms"), (layout.EDGES_MASK, edges_ptr, "edges")):
        shape = tuple(arrays[mask_name].shape)
        if shape != (int(ptr[-1]),) and not (appending and len(shape) == 1 and shape[0] >= int(ptr[-1])):
            raise StoreFormatError(
                f"Store {store}: meta/{mask_name} has shape {shape}; expected ({int(ptr[-1])},) for the {what} in the pointers"
            )
    if view.rows is not None and (int(atoms_ptr[-1]), int(edges_ptr[-1])) != (view.rows.atom, view.rows.edge):
        raise StoreFormatError(f"Store {store}: the pointers disagree with the write journal of an unfinished append")
    if not appending and schema.num_samples not in (-1, n):
        raise StoreFormatError(
            f"Store {store}: root attribute num_samples is {schema.num_samples} but meta/samples_mask has {n} entries"
        )
    return MetaInfo(
        schema=schema, atoms_ptr=atoms_ptr, edges_ptr=edges_ptr, samples_mask=samples_mask, groups=groups,
        growing=appending, integrity=integrity, active=active, crcs=crcs,
    )  # fmt: skip


def _meta_values(
    arrays: dict[str, Any], n: int, *, store: str, complete: bool, view: ReadView, shared: SharedPointers | None
) -> tuple[dict[str, NDArray[Any]], NDArray[np.int64] | None, dict[str, NDArray[np.uint32]] | None]:
    """The checked meta arrays, the physical index of each live sample (``None``: none deleted) and the
    arrays' segment checksums (``None``: not computed yet), from a shared copy where ``shared`` allows."""

    def fill(sink: MetaSink) -> None:
        read_meta_values(arrays, n, store=store, complete=complete, deleted=view.deleted, sink=sink)

    if shared is not None and n >= shared.min_samples:
        key = content_key(arrays, n, view, complete=complete)
        if key is not None:
            where = store_id(arrays[layout.SAMPLES_MASK].store_path.store.root)
            copy = shared.load(where, key, lambda: content_key(arrays, n, view, complete=complete), n, fill)
            if copy is not None:
                found = dict(copy.arrays)
                return found, found.pop("active", None), dict(copy.crcs)
    private = PrivateMeta(n)
    fill(private)
    mask = private.arrays[layout.SAMPLES_MASK]
    active = None if np.count_nonzero(mask) == n else np.flatnonzero(mask).astype(np.int64, copy=False)
    return private.arrays, active, None


def check_every_array_known(root: Any, meta: MetaInfo, *, store: str) -> None:
    """Refuse to change a store holding arrays this version cannot interpret (a newer writer's levels).

    An operation that keeps every array consistent with the pointers could not extend, zero or copy them.
    """
    unknown = sorted(meta.schema.unknown_levels)
    for group in (layout.CORE_GROUP, layout.CUSTOM_GROUP):
        if group in meta.groups:
            unknown += [
                key for key in (f"{group}/{name}" for name in root[group].array_keys() if name not in meta.schema.field_levels)
                if key not in meta.schema.unknown_levels
            ]  # fmt: skip
    if unknown:
        raise StoreFormatError(
            f"Store {store} holds arrays this version cannot interpret ({', '.join(unknown)}: levels of a newer "
            f"writer, or none recorded); it reads such a store but does not change it"
        )


ROW_SOURCES = PerLevel(atom="atoms (atoms_ptr[-1])", edge="edges (edges_ptr[-1])", system="samples (samples_mask)")
"""What fixes the row count of each level, as error messages name it."""


def check_data_array(
    arr: Any,
    *,
    name: str,
    group: str,
    recorded: dict[str, Level],
    expected_rows: PerLevel[int],
    store: str,
    growing: bool = False,
) -> Level:
    """Check one core/custom array against its level and the pointers; return its level."""
    level = recorded.get(name) or layout.default_level(name)
    if level is None:
        raise StoreFormatError(
            f"Store {store}: array {group}/{name} has no level in the 'fields' attribute and is not a known AtomicData field"
        )
    shape = tuple(arr.shape)
    if not shape:
        raise StoreFormatError(f"Store {store}: array {group}/{name} is 0-dimensional; expected one row per {level}")
    if shape[0] != expected_rows[level] and not (growing and shape[0] > expected_rows[level]):
        what = ROW_SOURCES[level]
        raise StoreFormatError(
            f"Store {store}: array {group}/{name} has {shape[0]} rows; expected {expected_rows[level]} {what}"
        )
    problem = layout.field_array_problem(name, arr.dtype, shape)
    if problem is not None:
        raise StoreFormatError(f"Store {store}: array {group}/{name} {problem}")
    return level


def check_chunk_size(arr: Any, *, name: str, store: str) -> None:
    """Refuse an array whose chunks (or shard index) could not be decoded into memory."""
    chunk_shape = tuple(int(c) for c in arr.chunks)
    itemsize = np.dtype(arr.dtype).itemsize
    chunk_bytes = itemsize
    for extent in chunk_shape:
        chunk_bytes *= extent
    budget = memory_budget()
    if chunk_bytes > budget:
        raise StoreFormatError(
            f"Store {store}: array {name} has chunks of shape {chunk_shape} ({chunk_bytes / 2**30:,.1f} GiB each), "
            f"more than half of this machine's memory"
        )
    shards = getattr(arr, "shards", None)
    if shards is not None:
        inner = 1
        for shard, chunk in zip(shards, chunk_shape, strict=True):
            inner *= max(1, int(shard) // max(1, chunk))
        if 16 * inner > budget:
            raise StoreFormatError(
                f"Store {store}: array {name} claims {inner:,} chunks per shard; its index cannot be read"
            )
