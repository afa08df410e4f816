"""The reader's read-time guards: what :class:`~dali_alchemi.store.read.reader.AtomicDataZarrReader` checks
around every read, and when a copy of it starts serving.

A read is refused before anything is allocated when its output could not fit in memory
(:func:`check_read_size`); re-based neighbor indices must stay inside their own sample
(:func:`check_local_indices`); a store rewritten under an open reader is noticed after the chunks are read
(:func:`check_unchanged`), and a pickled or forked copy serves exactly the state its parent served, or
refuses (:func:`served_snapshot`, :func:`reconnected`). Each check is vectorised over the samples of a read.
"""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.storage import MemoryStore

from dali_alchemi import csr
from dali_alchemi.errors import ReadTooLargeError, StoreChangedError, StoreFormatError
from dali_alchemi.store.format.generation import read_token
from dali_alchemi.store.format.location import StoreLike, StoreLocation, resolve_store
from dali_alchemi.store.read.identity import SnapshotIdentity, incompatibility, served_as
from dali_alchemi.store.read.snapshot import Snapshot, open_snapshot
from dali_alchemi.types import PerLevel

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.remote_config import FetchConfig
    from dali_alchemi.store.read.shared_pointers import SharedPointers
    from dali_alchemi.types import CountArray, IndexArray, Level

__all__ = [
    "INDEX_PLAN_BYTES", "NOT_REBASED_HINT", "REFRESH_HINT",
    "check_local_indices", "check_read_size", "check_unchanged", "counts", "reconnected", "served_snapshot",
]  # fmt: skip


REFRESH_HINT = (
    "Call refresh() on the reader to read the store as it is now (a MultiReader: open a new one over its "
    "stores; a DALIDataLoader: build a new loader)"
)
"""What to do about a :class:`StoreChangedError`, as its messages say."""

INDEX_PLAN_BYTES = 16
"""Bytes of the row plan per atom or edge row of a read (a source and a destination int64)."""


NOT_REBASED_HINT = (
    "The likely cause: it was written by an append that did not re-base neighbor lists to store-global "
    "indices (nvalchemi 0.2.0's append of a list, a Batch or a single AtomicData, and its dynamics ZarrData "
    "sink, do this; its defragment moves rows without re-basing them). Fix: `dali-alchemi repair {store}` (--dry-run shows what changes; --out DIR writes a "
    "repaired copy of a store you cannot write), or AtomicDataZarrWriter(store).repair(). If repair finds no way "
    "the sample could have been stored, its chunk was damaged instead: `dali-alchemi verify {store}` checks every chunk"
)
"""What the reader's out-of-range neighbor_list error adds: the usual cause, and the fix."""


def counts(ptr: NDArray[np.int64], physical: IndexArray) -> CountArray:
    """Rows of each of ``physical`` samples under CSR pointer ``ptr``."""
    return ptr[physical + 1] - ptr[physical]


def check_read_size(
    snap: Snapshot, logical: IndexArray, physical: IndexArray, names: Sequence[str], *, budget: int, source: str
) -> None:
    """Refuse, before allocating anything, a read of distinct samples whose output could not fit in memory.

    ``budget`` is the most bytes a read may claim (half of this machine's memory); ``source`` names the
    store in the message. Where the whole store would fit, so does every such read: nothing is counted.

    Raises
    ------
    ReadTooLargeError
        Naming the read's size and its largest sample (logical and physical index, atoms, edges).
    """
    handles = [snap.handles[name] for name in names]

    def field_bytes(level: Level) -> int:
        return sum(math.prod(h.shape[1:]) * h.dtype.itemsize for h in handles if h.level == level)

    row_bytes = PerLevel(
        atom=INDEX_PLAN_BYTES + field_bytes("atom"),
        edge=INDEX_PLAN_BYTES + field_bytes("edge"),
        system=field_bytes("system"),
    )
    whole = int(snap.atoms_ptr[-1]) * row_bytes.atom + int(snap.edges_ptr[-1]) * row_bytes.edge
    if whole + (snap.atoms_ptr.size - 1) * row_bytes.system <= budget:
        return
    atoms, edges = counts(snap.atoms_ptr, physical), counts(snap.edges_ptr, physical)
    per_sample = atoms * row_bytes.atom + edges * row_bytes.edge + row_bytes.system
    if int(per_sample.sum(dtype=np.float64)) <= budget:
        return
    worst = int(np.argmax(per_sample))
    raise ReadTooLargeError(
        f"Store {source}: reading {len(logical)} samples needs {per_sample.sum(dtype=np.float64) / 2**30:,.1f} GiB, "
        f"more than half of this machine's memory; the largest, sample {int(logical[worst])} (physical "
        f"{int(physical[worst])}), claims {int(atoms[worst]):,} atoms and {int(edges[worst]):,} edges"
    )


def check_local_indices(
    name: str, values: NDArray[Any], logical: IndexArray, physical: IndexArray,
    n_atoms: CountArray, n_edges: CountArray, *, atoms_ptr: NDArray[np.int64], source: str,
) -> None:  # fmt: skip
    """Every re-based index must point inside its own sample; a store that says otherwise is corrupt.

    ``values`` holds the read's ``name`` rows already re-based to sample-local indices; ``atoms_ptr`` is
    the store's atom pointer, to name the offending rows as stored.

    Raises
    ------
    StoreFormatError
        Naming the first sample with an index outside its atom rows, and how to repair the store.
    """
    bad = csr.first_out_of_range(values, n_atoms, n_edges)
    if bad is None:
        return
    edge, sample = bad
    ptr = atoms_ptr
    raise StoreFormatError(
        f"Store {source}: {name} of sample {int(logical[sample])} (physical {int(physical[sample])}) holds "
        f"{(values[edge] + ptr[physical[sample]]).tolist()}, outside its atom rows "
        f"[{int(ptr[physical[sample]])}, {int(ptr[physical[sample] + 1])}). {NOT_REBASED_HINT.format(store=source)}"
    )


def check_unchanged(
    location: StoreLocation,
    snap: Snapshot,
    fields: tuple[str, ...],
    *,
    source: str,
    cause: BaseException | None = None,
    shared: SharedPointers | None = None,
) -> Snapshot | None:
    """Raise if another process rewrote the store since ``snap`` was opened (checked once per read).

    Call it after the chunks are read: the token is read then, so a rewrite that started before or during
    the read is seen. A store that only grew (appends) is still served exactly as it was opened: then
    ``snap`` under the new token is returned, for the reader to keep serving (the read may have used
    shard indexes the append rewrote). ``None``: the store did not change. ``shared``: where the store's
    pointers are shared (see :func:`~dali_alchemi.store.read.snapshot.open_snapshot`).

    Raises
    ------
    StoreChangedError
        If the rewrite moved, deleted or replaced what ``snap`` indexes (chained to ``cause``, the read's
        own error, if any).
    """
    token = read_token(location)
    if token == snap.token:
        return None
    try:
        fresh = open_snapshot(location, shared=shared)
        why = incompatibility(snap, fresh, fields)
    except StoreFormatError as err:
        why = f"it could not be opened again ({err})"
    if why is not None:
        raise StoreChangedError(
            f"Store {source} changed under this reader: {why}. The samples this reader indexes are no longer "
            f"where it read them, so nothing of this read is returned. {REFRESH_HINT}"
        ) from cause
    return replace(snap, token=fresh.token)  # grown only: keep serving the state it opened


def served_snapshot(
    location: StoreLocation, identity: SnapshotIdentity, *, source: str, shared: SharedPointers | None = None
) -> Snapshot:
    """The state a parent reader served (``identity``), for a pickled or forked copy, from the store opened afresh.

    Raises
    ------
    StoreChangedError
        If the store changed since in a way that moved, deleted or replaced what the parent read;
        a store that only grew is served as the parent had it (same length, same pointers).
    """
    try:
        snapshot = served_as(identity, open_snapshot(location, shared=shared))
    except StoreFormatError as err:
        snapshot = f"it could not be opened again ({err})"
    if isinstance(snapshot, str):
        raise StoreChangedError(
            f"Store {source} changed since the reader this copy was made from opened it: {snapshot}. This "
            f"copy (e.g. in a loader's worker process) would read other samples under the same indices, so it "
            f"refuses. {REFRESH_HINT}"
        )
    return snapshot


def reconnected(
    location: StoreLocation, store: StoreLike, *, fetch: FetchConfig, storage_options: dict[str, Any] | None
) -> StoreLocation | None:
    """In a forked child (DALI's default way to start workers), a fresh connection to a non-local store.

    Connections to remote stores belong to the parent's event loop and are unusable in a forked child,
    so the child opens its own: from the URL again, or from a pickled copy of ``store`` (the argument the
    reader was opened with). ``None``: ``location`` (local or in memory) is usable as it is.
    """
    if location.local_root is not None or isinstance(location.store, MemoryStore):
        return None
    fresh = pickle.loads(pickle.dumps(store)) if not isinstance(store, (str, os.PathLike)) else store
    return resolve_store(fresh, read_only=True, must_exist=False, fetch=fetch, storage_options=storage_options)
