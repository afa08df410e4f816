"""Opening one consistent view of a store while a writer may be working on it.

:func:`open_snapshot` reads the journal, reads the store as :func:`~dali_alchemi.store.format.journal.interpret`
says, checks the cheap invariants (:mod:`dali_alchemi.store.read.open_checks`) and prepares a decoder per
array. If the journal changed while it was reading (a write started or finished under it), it reads
again, so the result is the store's old or new state, never a mix. The result is a frozen
:class:`Snapshot`; a reader holds one and swaps it for a fresh one on ``refresh()``.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.errors import BaseZarrError, ZarrUserWarning
from zarr.storage import LocalStore

from dali_alchemi.errors import ChunkDecodeError, StoreFormatError, StoreNotFoundError, UnsupportedCodecError
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.generation import read_token, writer_state
from dali_alchemi.store.format.journal import ReadView, interpret, read_journal, sibling
from dali_alchemi.store.format.location import StoreLocation, store_not_found, zarr_error_text
from dali_alchemi.store.read.codecs import ArrayCodec
from dali_alchemi.store.read.open_checks import MetaInfo, check_chunk_size, check_data_array, check_meta, open_root
from dali_alchemi.store.read.shared_pointers import PointersChanged, SharedPointers

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import IndexArray, Level, PtrArray

__all__ = [
    "KEPT_CHANGING",
    "LOAD_ATTEMPTS",
    "RETRY_WAIT_S",
    "ArrayHandle",
    "Snapshot",
    "open_snapshot",
    "read_through_zarr",
]


logger = logging.getLogger(__name__)

LOAD_ATTEMPTS = 10
"""Times a store whose metadata a concurrent writer changed while it was opened is read (in all)."""

RETRY_WAIT_S = (0.0, 0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4)
"""Seconds waited before each attempt after the first: an append changes the pointers' metadata
several times while it runs, so attempts in a row can all land inside one writer operation; waiting
lets it finish (about 0.8 s in all before the store is reported as changing)."""


@dataclass(frozen=True, slots=True)
class ArrayHandle:
    """One data array: where it lives, its level, and how to decode it (``codec=None``: via zarr)."""

    name: str
    level: Level
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    codec: ArrayCodec | None
    array: Any  # the zarr array, used for the fallback path


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent state of a store: its pointers, masks, schema and array handles.

    The numpy arrays are read-only. ``location`` is where the state was read from: the store itself,
    or, in the instant a defragment swaps directories, the copy beside it.
    """

    location: StoreLocation
    schema: layout.StoreSchema
    atoms_ptr: PtrArray
    edges_ptr: PtrArray
    samples_mask: NDArray[np.bool_]
    live: IndexArray | None
    """Physical index of each logical (live) sample; ``None`` when none is deleted (the two are the same)."""
    handles: Mapping[str, ArrayHandle]
    """Every core and custom array by name (custom wins on a collision, as in nvalchemi)."""
    token: bytes = b""
    """What :func:`~dali_alchemi.store.format.generation.read_token` read as this state was opened."""
    rewritten: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """The writer's generation that last replaced each custom field (see :mod:`~dali_alchemi.store.format.generation`)."""
    skipped: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Arrays this version cannot interpret (no level it knows), by name: why, as an error would say."""
    crcs: dict[str, NDArray[np.uint32]] = field(default_factory=dict, compare=False, repr=False)
    """Segment checksums of the meta arrays (:mod:`~dali_alchemi.store.read.pointers`): a shared copy's,
    or computed here the first time the state is identified."""

    @property
    def n_physical(self) -> int:
        """Physical samples (soft-deleted ones included)."""
        return int(self.samples_mask.size)

    @property
    def n_live(self) -> int:
        """Live (logical) samples."""
        return self.n_physical if self.live is None else int(self.live.size)

    @property
    def active(self) -> IndexArray:
        """Physical index of each logical sample, as an array (one is made when none is deleted: use
        :meth:`physical` to map some indices)."""
        if self.live is not None:
            return self.live
        identity = np.arange(self.n_physical, dtype=np.int64)
        identity.flags.writeable = False
        return identity

    def physical(self, logical: IndexArray) -> IndexArray:
        """Physical indices of ``logical`` ones (checked by the caller), as a new array."""
        if self.live is None:
            return np.array(logical, dtype=np.int64)
        return self.live[logical]

    @property
    def levels(self) -> dict[str, Level]:
        """Level of every array."""
        return {name: handle.level for name, handle in self.handles.items()}


KEPT_CHANGING = "kept changing while it was opened; try again"
"""How a store that a writer changed at every attempt to open it is told (no damage: it was busy)."""


def open_snapshot(requested: StoreLocation, *, shared: SharedPointers | None = None) -> Snapshot:
    """Open the store at ``requested`` as one consistent state while a writer may be working.

    ``shared``: where the pointers and mask of a large local store are kept once per machine (see
    :mod:`~dali_alchemi.store.read.shared_pointers`); ``None`` reads them into this process.

    Raises
    ------
    StoreNotFoundError
        If the store does not exist (and no interrupted defragment left a copy beside it).
    StoreFormatError
        If its layout is inconsistent, its metadata unreadable, or it kept changing while being read.
    """
    for attempt in range(LOAD_ATTEMPTS):
        if attempt:
            time.sleep(RETRY_WAIT_S[min(attempt, len(RETRY_WAIT_S)) - 1])
        token = read_token(requested)
        op = read_journal(requested)
        view = interpret(op)
        loc = _effective_location(requested, view)
        try:
            with warnings.catch_warnings():
                # a journal inside a non-local store is a foreign key to zarr's group listing
                warnings.simplefilter("ignore", ZarrUserWarning)
                root = open_root(loc)
                meta = check_meta(root, store=loc.display, view=view, shared=shared)
                handles, skipped = _open_arrays(root, meta, loc, requested, view)
                _, rewritten = writer_state(root.attrs.asdict())
        except (ValueError, BaseZarrError, KeyError, TypeError) as err:  # zarr's metadata parsing raises all of these
            # A write that started, finished or swapped directories under us (the journal or the token
            # moved), or meta arrays that changed while a shared copy was built: what was read may mix two
            # states (root attributes of one, meta arrays of the other), so it is read again.
            changed = (
                isinstance(err, PointersChanged) or read_journal(requested) != op or read_token(requested) != token
            )
            if changed and attempt + 1 < LOAD_ATTEMPTS:
                continue
            if changed:
                raise StoreFormatError(f"Store {requested.display} {KEPT_CHANGING}") from err
            if isinstance(err, StoreFormatError):
                raise
            raise StoreFormatError(f"Store {loc.display}: unreadable metadata: {zarr_error_text(err)}") from err
        if read_journal(requested) == op and read_token(requested) == token:
            return _freeze(loc, meta, handles, token, rewritten, skipped)
    raise StoreFormatError(f"Store {requested.display} {KEPT_CHANGING}")


def _freeze(
    loc: StoreLocation,
    meta: MetaInfo,
    handles: dict[str, ArrayHandle],
    token: bytes,
    rewritten: dict[str, int],
    skipped: dict[str, str],
) -> Snapshot:
    for arr in (meta.atoms_ptr, meta.edges_ptr, meta.samples_mask, meta.active):
        if arr is not None:
            arr.flags.writeable = False
    return Snapshot(
        location=loc,
        schema=meta.schema,
        atoms_ptr=meta.atoms_ptr,
        edges_ptr=meta.edges_ptr,
        samples_mask=meta.samples_mask,
        live=meta.active,
        handles=MappingProxyType(handles),
        token=token,
        rewritten=MappingProxyType(rewritten),
        skipped=MappingProxyType(skipped),
        crcs=dict(meta.crcs or {}),
    )


def _open_arrays(
    root: Any, meta: MetaInfo, loc: StoreLocation, requested: StoreLocation, view: ReadView
) -> tuple[dict[str, ArrayHandle], dict[str, str]]:
    """Check every core and custom array and prepare its decoder.

    A custom array that an unfinished ``add_custom`` is writing is not part of the store yet; if it
    replaces an older array, that older one (possibly moved aside) is read instead. While a repair
    swaps its rewritten core array in, the rewritten one is read wherever it is. Arrays with no level
    this version knows (a newer writer's) are returned apart, with the reason, instead of failing.
    """
    skipped: dict[str, str] = {}
    arrays: list[tuple[str, str, Any, dict[str, Level]]] = []
    for group_name, recorded in ((layout.CORE_GROUP, meta.schema.core), (layout.CUSTOM_GROUP, meta.schema.custom)):
        if group_name not in meta.groups:
            continue
        for name, arr in sorted(root[group_name].arrays()):
            arrays.append((group_name, name, arr, recorded))
    key = view.hidden_custom
    if key is not None:
        arrays = [a for a in arrays if not (a[0] == layout.CUSTOM_GROUP and a[1] == key)]
        if view.replaced_level is not None:
            moved = (
                sibling(requested, view.moved_aside)
                if requested.local_root is not None and view.moved_aside is not None
                else None
            )
            old = (
                zarr.open_array(str(moved), mode="r")
                if moved is not None and moved.exists()
                else root[f"{layout.CUSTOM_GROUP}/{key}"]
            )
            arrays.append((layout.CUSTOM_GROUP, key, old, {key: view.replaced_level}))
    if view.staged_core is not None and requested.local_root is not None:
        name, suffix = view.staged_core
        staged = sibling(requested, suffix)
        if staged.exists():  # a repair swapping its rewritten array in: that one is the store's new state
            arrays = [a for a in arrays if not (a[0] == layout.CORE_GROUP and a[1] == name)]
            arrays.append((layout.CORE_GROUP, name, zarr.open_array(str(staged), mode="r"), meta.schema.core))
    _check_fields_present(meta, arrays, loc.display, hidden=key)
    complete = meta.integrity.complete_chunks
    handles: dict[str, ArrayHandle] = {}
    for group_name, name, arr, recorded in arrays:
        key = f"{group_name}/{name}"
        if key in meta.schema.unknown_levels:
            skipped[name] = layout.unknown_level_message(loc.display, key, meta.schema.unknown_levels[key])
            continue
        if name not in recorded and layout.default_level(name) is None:
            skipped[name] = (
                f"Store {loc.display}: array {key} has no level in the 'fields' attribute and is not a known "
                f"AtomicData field, so this version cannot interpret it"
            )
            continue
        level = check_data_array(
            arr, name=name, group=group_name, recorded=recorded, expected_rows=meta.rows,
            store=loc.display, growing=meta.growing,
        )  # fmt: skip
        check_chunk_size(arr, name=f"{group_name}/{name}", store=loc.display)
        # an unfinished append: its metadata grew before its chunks were written, so the old state's rows
        # are all there is (a whole-array read of the grown shape would find the new chunks missing)
        shape = (min(int(arr.shape[0]), meta.rows[level]), *arr.shape[1:]) if meta.growing else tuple(arr.shape)
        codec: ArrayCodec | None = None
        if arr.store_path.store is loc.store:  # arrays moved aside are read through zarr
            try:
                codec = ArrayCodec(
                    name=f"{group_name}/{name}", path=arr.store_path.path, metadata=arr.metadata, complete=complete,
                    rows=shape[0],
                )  # fmt: skip
            except UnsupportedCodecError as err:
                logger.info("array %s/%s read through zarr: %s", group_name, name, err)
        handles[name] = ArrayHandle(
            name=name, level=level, shape=shape, dtype=np.dtype(arr.dtype), codec=codec, array=arr
        )
    for name in handles:
        skipped.pop(name, None)
    return handles, skipped


def _check_fields_present(
    meta: MetaInfo, arrays: list[tuple[str, str, Any, dict[str, Level]]], store: str, *, hidden: str | None
) -> None:
    """Every field the root ``fields`` attribute lists must be an array of its group.

    A deleted array directory, or one whose ``zarr.json`` is gone, is not listed by zarr at all; without
    this check the field would silently vanish from every sample. ``hidden`` is the custom array an
    unfinished ``add_custom`` is writing (not part of the state being read).
    """
    found = {(group, name) for group, name, _, _ in arrays}
    if hidden is not None:
        found.add((layout.CUSTOM_GROUP, hidden))
    for group, recorded in ((layout.CORE_GROUP, meta.schema.core), (layout.CUSTOM_GROUP, meta.schema.custom)):
        for name in sorted(recorded):
            if (group, name) not in found:
                raise StoreFormatError(
                    f"Store {store}: field {name!r} is listed in the root 'fields' attribute but array "
                    f"{group}/{name} is missing (its directory or its zarr.json is gone)"
                )


def _effective_location(loc: StoreLocation, view: ReadView) -> StoreLocation:
    """Where to read: the store itself, or, in the instant a defragment swaps directories, the new one."""
    if loc.local_root is None or loc.local_root.exists():
        return loc
    if not view.fallback_dirs:
        raise store_not_found(loc.local_root)
    for candidate in (sibling(loc, suffix) for suffix in view.fallback_dirs):
        if candidate.exists():
            return StoreLocation(
                store=LocalStore(candidate, read_only=True), prefix="", display=loc.display, local_root=candidate
            )
    raise StoreNotFoundError(f"Zarr store does not exist at {loc.display} (an interrupted defragment left no copy)")


def read_through_zarr(handle: ArrayHandle, rows: NDArray[np.int64]) -> NDArray[Any]:
    """Rows of an array the fast decoder does not take, read by zarr (which checks crc32c too)."""
    try:
        return handle.array.get_orthogonal_selection((rows,))  # type: ignore[no-any-return]
    except Exception as err:  # codecs raise many types; all mean the stored bytes are unusable
        name = handle.array.path or handle.name
        raise ChunkDecodeError(
            f"Array {name!r} could not be read through zarr: {zarr_error_text(err)}", array=name
        ) from err
