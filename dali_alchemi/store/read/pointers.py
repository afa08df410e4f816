"""The meta arrays (``samples_mask``, ``atoms_ptr``, ``edges_ptr``) read chunk by chunk, checked as they are decoded.

At 110 M structures each pointer array is 880 MB. Reading one whole and then checking it with
whole-array temporaries (``np.diff``, a bool per step) cost a process several times that. Here each
chunk (for a store read through zarr, each window of :data:`READ_ROWS` entries) is decoded, checked
(pointers start at 0 and never decrease, across chunk boundaries too; the samples an unfinished delete
removes read as deleted) and handed to a :class:`MetaSink`: arrays of this process
(:class:`PrivateMeta`), or the file of a copy shared by the processes of a machine
(:mod:`~dali_alchemi.store.read.shared_pointers`). The errors are the ones the open-time checks
always raised.

It also defines the *segments* a state is identified by: runs of :data:`SEGMENT_ROWS` entries of
each array, each with its crc32c. :func:`state_digest` of the first ``n`` samples combines the
checksums of whole segments (computed once: when a shared copy is built, or the first time a
process's own arrays are identified) with a hash of the entries after them, so identifying a
state no longer hashes every byte of the pointers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import google_crc32c
import numpy as np

from dali_alchemi.errors import StoreFormatError, UnsupportedCodecError
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.location import zarr_error_text
from dali_alchemi.store.read.block_reads import fetch_blocks
from dali_alchemi.store.read.codecs import ArrayCodec
from dali_alchemi.store.read.fetch import StoreFetcher

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "META_ORDER", "READ_ROWS", "SEGMENT_ROWS", "MetaSink", "PrivateMeta", "SegmentCrcs", "read_meta_values",
    "segment_crcs", "state_digest",
]  # fmt: skip


READ_ROWS = 1 << 22
"""Entries decoded per step: a window of a meta array read through zarr, or the chunks fetched in one batch."""

SEGMENT_ROWS = 1 << 18
"""Entries of one segment of a meta array (2 MiB of a pointer): the unit of its checksums."""

_NONE = np.zeros(0, dtype=np.uint32)

META_ORDER = (layout.ATOMS_PTR, layout.EDGES_PTR, layout.SAMPLES_MASK)
"""The meta arrays a state is made of, in the order of their checksums."""


class MetaSink(Protocol):
    """Where checked chunks of the meta arrays go, in order of their first entry.

    A sink may keep the arrays it is handed and use them after the call returns (a copy writes them
    on a thread of its own), so callers hand over arrays they no longer change.
    """

    def mask(self, start: int, values: NDArray[np.bool_]) -> None: ...

    def pointer(self, name: str, start: int, values: NDArray[np.int64]) -> None: ...


class PrivateMeta:
    """A :class:`MetaSink` into arrays of this process (writable: the writer's operations update them)."""

    def __init__(self, n: int) -> None:
        self.arrays: dict[str, NDArray[Any]] = {
            layout.SAMPLES_MASK: np.empty(n, dtype=np.bool_),
            layout.ATOMS_PTR: np.empty(n + 1, dtype=np.int64),
            layout.EDGES_PTR: np.empty(n + 1, dtype=np.int64),
        }

    def mask(self, start: int, values: NDArray[np.bool_]) -> None:
        self.arrays[layout.SAMPLES_MASK][start : start + values.size] = values

    def pointer(self, name: str, start: int, values: NDArray[np.int64]) -> None:
        self.arrays[name][start : start + values.size] = values


class SegmentCrcs:
    """crc32c of every :data:`SEGMENT_ROWS` entries of an array handed over in consecutive pieces."""

    def __init__(self) -> None:
        self.crcs: list[int] = []
        self._crc = 0
        self._filled = 0

    def update(self, values: NDArray[Any]) -> None:
        pos = 0
        while pos < values.size:
            take = min(SEGMENT_ROWS - self._filled, values.size - pos)
            self._crc = google_crc32c.extend(self._crc, np.ascontiguousarray(values[pos : pos + take]).view(np.uint8))
            self._filled += take
            pos += take
            if self._filled == SEGMENT_ROWS:
                self.crcs.append(self._crc)
                self._crc, self._filled = 0, 0

    def finish(self) -> NDArray[np.uint32]:
        """Every segment's crc32c, the last (partial) one included."""
        if self._filled:
            self.crcs.append(self._crc)
            self._crc, self._filled = 0, 0
        return np.asarray(self.crcs, dtype=np.uint32)


def segment_crcs(values: NDArray[Any], segments: int) -> NDArray[np.uint32]:
    """crc32c of each of the first ``segments`` whole segments of ``values``."""
    out = np.empty(segments, dtype=np.uint32)
    for j in range(segments):
        out[j] = google_crc32c.value(
            np.ascontiguousarray(values[j * SEGMENT_ROWS : (j + 1) * SEGMENT_ROWS]).view(np.uint8)
        )
    return out


def state_digest(arrays: Mapping[str, NDArray[Any]], n: int, crcs: Mapping[str, NDArray[np.uint32]]) -> bytes:
    """A digest of the pointers and mask of the first ``n`` physical samples.

    ``crcs`` holds at least the checksums of the whole segments below ``n`` of each of
    :data:`META_ORDER`; the entries after the last whole segment are hashed as they are.
    """
    whole = n // SEGMENT_ROWS
    digest = hashlib.blake2b(digest_size=16)
    for name in META_ORDER:
        digest.update(np.ascontiguousarray(crcs.get(name, _NONE)[:whole], dtype="<u4").tobytes())
    start = whole * SEGMENT_ROWS
    for name, stop in ((layout.ATOMS_PTR, n + 1), (layout.EDGES_PTR, n + 1), (layout.SAMPLES_MASK, n)):
        digest.update(np.ascontiguousarray(arrays[name][start:stop]).tobytes())
    return digest.digest()


def read_meta_values(
    arrays: Mapping[str, Any], n: int, *, store: str, complete: bool, deleted: tuple[int, ...], sink: MetaSink
) -> None:
    """Decode and check the first ``n`` entries of ``samples_mask`` and ``n + 1`` of each pointer into ``sink``.

    ``deleted`` are samples to read as deleted (an unfinished delete). In a store that promises every
    chunk (``complete``) the chunks are read through the checking decoder (a missing chunk is an error,
    checksums are checked); otherwise through zarr.

    Raises
    ------
    StoreFormatError
        If a pointer is not an integer array, does not start at 0 or decreases, or a meta array cannot be
        read.
    ChunkDecodeError
        If a chunk is missing or corrupt in a store that promises every chunk.
    """
    doomed = np.unique(np.asarray(deleted, dtype=np.int64))
    doomed = doomed[(doomed >= 0) & (doomed < n)]
    for start, chunk in _chunks(arrays[layout.SAMPLES_MASK], n, layout.SAMPLES_MASK, store, complete):
        mask = np.asarray(chunk, dtype=np.bool_)
        lo, hi = np.searchsorted(doomed, [start, start + mask.size])
        if hi > lo:
            mask = mask.copy()
            mask[doomed[lo:hi] - start] = False
        sink.mask(start, mask)
    for name in (layout.ATOMS_PTR, layout.EDGES_PTR):
        arr = arrays[name]
        dtype = np.dtype(arr.dtype)
        if not np.issubdtype(dtype, np.integer):
            raise StoreFormatError(f"Store {store}: meta/{name} has dtype {dtype}; expected an integer pointer")
        previous: int | None = None
        total = 0
        for start, chunk in _chunks(arr, n + 1, name, store, complete):
            values = chunk.astype(np.int64, copy=False)
            _check_pointer_chunk(values, start, previous, name, store)
            previous, total = int(values[-1]), start + values.size
            sink.pointer(name, start, values)
        if total != n + 1:
            raise StoreFormatError(
                f"Store {store}: meta/{name} has shape ({total},); expected ({n + 1},) for {n} samples in samples_mask"
            )


def _check_pointer_chunk(values: NDArray[np.int64], start: int, previous: int | None, name: str, store: str) -> None:
    """Entries ``start ...`` of a pointer: the first is 0, none is below the one before (``previous`` too)."""
    if start == 0 and values[0] != 0:
        raise StoreFormatError(f"Store {store}: meta/{name} starts at {int(values[0])}; expected 0")
    if previous is not None and values[0] < previous:
        raise StoreFormatError(
            f"Store {store}: meta/{name} is not monotonic: entry {start} ({int(values[0])}) < entry {start - 1} ({previous})"
        )
    down = values[1:] < values[:-1]  # no int64 temporary of the differences: a bool per entry
    if down.any():
        at = int(np.argmax(down))
        raise StoreFormatError(
            f"Store {store}: meta/{name} is not monotonic: entry {start + at + 1} ({int(values[at + 1])}) "
            f"< entry {start + at} ({int(values[at])})"
        )


def _chunks(arr: Any, rows: int, name: str, store: str, complete: bool) -> Iterator[tuple[int, NDArray[Any]]]:
    """``(first entry, values)`` of consecutive pieces covering the first ``rows`` entries of a meta array."""
    codec = None
    if complete and rows:
        try:
            codec = ArrayCodec(name=f"meta/{name}", path=arr.store_path.path, metadata=arr.metadata, complete=True)
        except UnsupportedCodecError:
            codec = None
    if codec is not None:
        fetcher = StoreFetcher(arr.store_path.store)
        per_batch = max(1, READ_ROWS // codec.block_rows)
        n_blocks = -(-rows // codec.block_rows)
        indexes: dict[tuple[str, str], Any] = {}
        for first in range(0, n_blocks, per_batch):
            blocks = [(codec, b) for b in range(first, min(first + per_batch, n_blocks))]
            payloads, _ = fetch_blocks(fetcher, blocks, indexes)
            for (_, block), payload in zip(blocks, payloads, strict=True):
                start = block * codec.block_rows
                yield start, codec.decode_block(block, *payload)[: rows - start]
        return
    for start in range(0, rows, READ_ROWS):
        try:
            values = np.asarray(arr[start : min(start + READ_ROWS, rows)])
        except Exception as err:  # codecs raise many types; all mean the stored bytes are unusable
            raise StoreFormatError(f"Store {store}: meta/{name} could not be read: {zarr_error_text(err)}") from err
        yield start, values
