"""What identifies one state of a store, and whether an older state can still be served from a newer one.

A reader that notices the store changed (:func:`incompatibility`), and a pickled or forked copy of a
reader that opens the store again (:class:`SnapshotIdentity`, :func:`served_as`), compare two states:
the store may only have grown, keeping the pointers and mask of the samples already served bit for
bit. The pointers and mask are compared a window at a time, and a copy carries only a digest of them
(:func:`~dali_alchemi.store.read.pointers.state_digest`, built from per-segment checksums computed
once per state), so neither needs a second whole copy of 17 bytes per structure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.store.format import layout
from dali_alchemi.store.read import pointers
from dali_alchemi.store.read.pointers import META_ORDER, READ_ROWS, segment_crcs, state_digest

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.snapshot import Snapshot
    from dali_alchemi.types import IndexArray

__all__ = ["SnapshotIdentity", "identify", "incompatibility", "served_as"]


def incompatibility(old: Snapshot, new: Snapshot, fields: tuple[str, ...]) -> str | None:
    """Why ``old`` can no longer be served exactly from the store now in state ``new``; ``None`` if it can.

    ``old`` stays exact while the store only grew: the same pointers for its samples, none of its live
    samples deleted, and each of ``fields`` still there with the same level, dtype and shape, and not
    replaced.
    """
    n_old = old.n_physical
    if new.n_physical < n_old:
        return f"it now holds {new.n_physical} physical samples where this reader indexes {n_old} (a defragment)"
    for name, ptr_old, ptr_new in (("atom", old.atoms_ptr, new.atoms_ptr), ("edge", old.edges_ptr, new.edges_ptr)):
        moved = _first_difference(ptr_old, ptr_new[: n_old + 1])
        if moved is not None:
            return f"the {name} rows of physical sample {moved} onwards moved (a defragment or a rewrite)"
    deleted = _deleted_since(old.samples_mask, new.samples_mask[:n_old])
    if deleted.size:
        first = ", ".join(str(int(i)) for i in deleted[:5]) + (", ..." if deleted.size > 5 else "")
        return f"{deleted.size} of its samples were deleted (physical {first}) and their rows zeroed"
    for name in fields:
        before, after = old.handles[name], new.handles.get(name)
        if after is None:
            return f"field {name!r} was removed"
        if (after.level, after.dtype, after.shape[1:]) != (before.level, before.dtype, before.shape[1:]):
            return f"field {name!r} changed from {before.level} {before.dtype} to {after.level} {after.dtype}"
        if new.rewritten.get(name, 0) > old.rewritten.get(name, 0):
            return f"field {name!r} was replaced (add_custom, or repair)"
    return None


def _first_difference(a: NDArray[Any], b: NDArray[Any]) -> int | None:
    """The first index where two arrays of one length differ, compared a window at a time."""
    if a is b:
        return None
    for lo in range(0, a.size, READ_ROWS):
        differ = np.flatnonzero(a[lo : lo + READ_ROWS] != b[lo : lo + READ_ROWS])
        if differ.size:
            return lo + int(differ[0])
    return None


def _deleted_since(old: NDArray[np.bool_], new: NDArray[np.bool_]) -> IndexArray:
    """Samples live in ``old`` and deleted in ``new``, found a window at a time."""
    parts = [
        np.flatnonzero(old[lo : lo + READ_ROWS] & ~new[lo : lo + READ_ROWS]) + lo
        for lo in range(0, old.size, READ_ROWS)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class SnapshotIdentity:
    """What a pickled reader carries of the state its parent served, to serve exactly that state again.

    A worker process (spawned, or restarted when a pipeline is rebuilt) opens the store afresh; a
    delete, defragment or replaced field in between would have it read other structures under the
    parent's indices. The pointers and mask themselves can be large (17 bytes per sample), so only
    their digest travels, with the sample count, the token and the fields the parent read.
    """

    token: bytes
    n_physical: int
    digest: bytes
    """Of the parent's ``atoms_ptr``, ``edges_ptr`` and ``samples_mask`` (see :func:`_state_digest`)."""
    fields: tuple[tuple[str, str, str, tuple[int, ...]], ...]
    """``(name, level, dtype, trailing shape)`` of every field the parent read, in its order."""
    rewritten: tuple[tuple[str, int], ...]


def identify(snapshot: Snapshot, fields: tuple[str, ...]) -> SnapshotIdentity:
    """The identity of ``snapshot`` as served by a reader of ``fields``."""
    n = snapshot.n_physical
    return SnapshotIdentity(
        token=snapshot.token,
        n_physical=n,
        digest=_state_digest(snapshot, n),
        fields=tuple(
            (name, h.level, h.dtype.str, tuple(h.shape[1:])) for name, h in ((f, snapshot.handles[f]) for f in fields)
        ),
        rewritten=tuple(sorted(snapshot.rewritten.items())),
    )


def served_as(identity: SnapshotIdentity, fresh: Snapshot) -> Snapshot | str:
    """``fresh`` cut back to the state ``identity`` names, or why it cannot be.

    The store may only have grown since: the first ``n_physical`` samples keep their pointers and
    mask bit for bit, and every field is there with the same level, dtype and trailing shape, and not
    replaced. The result indexes exactly the parent's samples (appended ones are not seen); its
    arrays may hold more rows, which are never read.
    """
    n = identity.n_physical
    if fresh.n_physical < n:
        return f"it now holds {fresh.n_physical} physical samples where the reader indexes {n} (a defragment)"
    if fresh.token != identity.token and _state_digest(fresh, n) != identity.digest:
        return f"the pointers or deleted samples of its first {n} physical samples changed (a delete or a defragment)"
    rewritten = dict(identity.rewritten)
    for name, level, dtype, trailing in identity.fields:
        handle = fresh.handles.get(name)
        if handle is None:
            return f"field {name!r} was removed"
        if (handle.level, handle.dtype.str, tuple(handle.shape[1:])) != (level, dtype, trailing):
            return f"field {name!r} changed from {level} {dtype} to {handle.level} {handle.dtype.str}"
        if fresh.rewritten.get(name, 0) > rewritten.get(name, 0):
            return f"field {name!r} was replaced (add_custom, or repair)"
    if fresh.n_physical == n:
        return fresh
    mask = fresh.samples_mask[:n]
    if fresh.live is None or np.count_nonzero(mask) == n:
        live = None
    else:
        live = fresh.live[: int(np.searchsorted(fresh.live, n))]
    return replace(
        fresh, atoms_ptr=fresh.atoms_ptr[: n + 1], edges_ptr=fresh.edges_ptr[: n + 1], samples_mask=mask, live=live
    )


def _state_digest(snapshot: Snapshot, n: int) -> bytes:
    """A digest of the pointers and mask of the first ``n`` physical samples
    (:func:`~dali_alchemi.store.read.pointers.state_digest`: crc32c of whole segments, computed once per state)."""
    arrays = {
        layout.ATOMS_PTR: snapshot.atoms_ptr, layout.EDGES_PTR: snapshot.edges_ptr, layout.SAMPLES_MASK: snapshot.samples_mask
    }  # fmt: skip
    whole = n // pointers.SEGMENT_ROWS
    for name in META_ORDER:
        if whole and snapshot.crcs.get(name, np.zeros(0, np.uint32)).size < whole:
            snapshot.crcs[name] = segment_crcs(arrays[name], whole)
    return state_digest(arrays, n, snapshot.crcs)
