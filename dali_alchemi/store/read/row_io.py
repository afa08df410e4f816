"""Byte-level reads of raw rows from one open file: the system calls under :mod:`~dali_alchemi.store.read.rows`.

Rows are first located (:class:`RowLocations`: each row's chunk and file). Rows in a few clusters are
read with one ``preadv`` per cluster (straight into the output where they are contiguous), scattered rows are taken from a ``[rows, row bytes]`` view of a mapped file, and the
segments of a span plan go with one ``preadv`` per cluster into their output rows; chunks about to be read
are announced to the kernel, and rows of never-written chunks filled. Nothing here knows about caches or
checksums: the row reader decides what to read and checks what it read.
"""

from __future__ import annotations

import itertools
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.errors import ChunkDecodeError

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.codecs import ArrayCodec

__all__ = [
    "CHECKSUM_BYTES", "MAX_GAP_BYTES", "MAX_RUNS", "RowLocations", "advise_will_need", "check_lengths", "chunk_file_size",
    "fill_missing", "length_error", "preadv_segments", "read_runs", "regular_size", "shrank_error",
    "side_by_side_runs", "stored_chunk_bytes", "take_rows",
]  # fmt: skip


CHECKSUM_BYTES = 4
"""Bytes of the ``crc32c`` that ends a checksummed chunk."""

MAX_RUNS = 8
"""Rows of one file lying in fewer clusters than this are read with a ``preadv`` per cluster; more
scattered rows (a full shuffle's) are taken from a memory map of the file."""

MAX_GAP_BYTES = 64 << 10
"""Rows less than this far apart in a file are read together (the bytes between them are read too)."""


@dataclass(frozen=True, slots=True)
class RowLocations:
    """Where ascending ``rows`` lie for one chunking: each row's chunk and row in it, grouped by file."""

    rows: NDArray[np.int64]
    local: NDArray[np.int64]  # each row's row within its chunk
    position: NDArray[np.int64]  # each row's chunk, as an index into ``touched``
    touched: NDArray[np.int64]  # the chunks the rows lie in, ascending
    files: list[int]  # the files (chunks, or shards) holding them, ascending
    row_bounds: list[int]  # rows [row_bounds[k], row_bounds[k + 1]) lie in files[k]
    chunk_bounds: list[int]  # and so do touched[chunk_bounds[k] : chunk_bounds[k + 1]]

    @classmethod
    def of(cls, rows: NDArray[np.int64], block_rows: int, per_file: int) -> RowLocations:
        chunk = rows // block_rows
        new_chunk = np.empty(rows.size, dtype=np.bool_)
        new_chunk[0] = True
        np.not_equal(chunk[1:], chunk[:-1], out=new_chunk[1:])
        first_rows = np.flatnonzero(new_chunk)
        touched = chunk[first_rows]
        file_of = touched // per_file
        file_starts = np.flatnonzero(np.diff(file_of, prepend=-1))
        return cls(
            rows=rows,
            local=rows - chunk * block_rows,
            position=np.cumsum(new_chunk) - 1,
            touched=touched,
            files=file_of[file_starts].tolist(),
            row_bounds=[*first_rows[file_starts].tolist(), int(rows.size)],
            chunk_bounds=[*file_starts.tolist(), int(touched.size)],
        )


def regular_size(fd: int, codec: ArrayCodec, key: str) -> int:
    """The size of the open file ``fd``, which must be a regular file (not a directory in a chunk's place)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ChunkDecodeError(
            f"Array {codec.name!r}: {key!r} is not a regular file, so it holds no chunk", array=codec.name, chunk=key
        )
    return info.st_size


def stored_chunk_bytes(codec: ArrayCodec) -> int:
    """The bytes a full raw chunk of ``codec`` takes on disk: its rows, and its crc32c if it has one."""
    return codec.block_rows * codec.row_nbytes + (CHECKSUM_BYTES if codec.chunk_checksum else 0)


def side_by_side_runs(index: NDArray[np.uint64], stored: int) -> tuple[list[int], list[int]]:
    """Each inner chunk's offset in its shard, and where the run of whole raw chunks stored side by side
    that starts at it ends (exclusive; the chunk itself where it is missing or of another length), from
    the shard's parsed ``index`` and a full chunk's ``stored`` bytes. Chunks ``[c0, c1)`` can then be read
    with one ``preadv`` from ``offsets[c0]`` exactly when ``ends[c0] >= c1``: two list look-ups a read."""
    entries = index.astype(np.int64)
    n = entries.shape[0]
    whole = entries[:, 1] == stored
    follows = np.zeros(n, dtype=np.bool_)  # chunk k starts where chunk k - 1 ends
    follows[1:] = whole[1:] & whole[:-1] & (entries[1:, 0] == entries[:-1, 0] + stored)
    breaks = np.full(n, n, dtype=np.int64)  # at c: c + 1 where chunk c + 1 does not follow c
    breaks[:-1] = np.where(follows[1:], n, np.arange(1, n))
    ends = np.minimum.accumulate(breaks[::-1])[::-1]
    return entries[:, 0].tolist(), np.where(whole, ends, np.arange(n)).tolist()


def check_lengths(
    codec: ArrayCodec,
    key: str,
    chunks: NDArray[np.int64],
    offsets: NDArray[np.int64],
    lengths: NDArray[np.int64],
    size: int,
    present: NDArray[np.bool_] | None,
) -> None:
    """Raise :func:`length_error` for the first of ``chunks`` (where ``present``) whose stored length is not its
    shape's, or whose range leaves the ``size``-byte file."""
    stored_bytes = stored_chunk_bytes(codec)
    bad = (lengths != stored_bytes) | (offsets < 0) | (offsets + lengths > size)
    if present is not None:
        bad &= present
    if bad.any():
        at = int(np.argmax(bad))
        held = int(min(lengths[at], max(size - offsets[at], 0)))
        raise length_error(codec, int(chunks[at]), key, held, stored_bytes)


def chunk_file_size(fd: int, codec: ArrayCodec, key: str, chunk: int) -> int:
    """The size of file ``fd`` holding chunk ``chunk`` alone, which must be exactly the chunk's stored bytes."""
    size = regular_size(fd, codec, key)
    stored_bytes = stored_chunk_bytes(codec)
    if size != stored_bytes:
        raise length_error(codec, chunk, key, size, stored_bytes)
    return size


def shrank_error(codec: ArrayCodec, chunk: int, key: str) -> ChunkDecodeError:
    """The error for chunk ``chunk`` of ``key`` ending before its rows were read: the file shrank meanwhile."""
    return ChunkDecodeError(
        f"Array {codec.name!r}: chunk {chunk} in {key!r} ended before its rows were read (the file shrank "
        f"while it was read: a rewrite in progress?)",
        array=codec.name, chunk=key,
    )  # fmt: skip


def length_error(codec: ArrayCodec, chunk: int, key: str, held: int, expected: int) -> ChunkDecodeError:
    """The error for chunk ``chunk`` of ``key`` holding ``held`` bytes where its shape needs ``expected``."""
    return ChunkDecodeError(
        f"Array {codec.name!r}: chunk {chunk} in {key!r} holds {held} bytes, expected {expected} for "
        f"{codec.block_rows} rows of {codec.row_nbytes} bytes (a truncated or rewritten chunk)",
        array=codec.name, chunk=key,
    )  # fmt: skip


def read_runs(fd: int, byte_at: NDArray[np.int64], row_nbytes: int, out: NDArray[np.uint8], *, aligned: bool) -> bool:
    """Read rows lying in fewer than :data:`MAX_RUNS` clusters with one ``preadv`` per cluster, into ``out``.

    A cluster is a run of rows with gaps under :data:`MAX_GAP_BYTES` between them (a block-shuffle
    span, a sequential window): a gap-free one is read straight into the output, another into a
    buffer of its extent and taken from there. Returns ``False`` (reading nothing) when the rows are
    more scattered than that: mapping the file and taking them is then cheaper than a call per cluster.
    """
    gaps = np.diff(byte_at) - row_nbytes  # bytes between one row's end and the next row's start
    if gaps.size and int(gaps.min()) < 0:  # inner chunks stored out of order (the format allows it): map
        return False
    breaks = np.flatnonzero(gaps > MAX_GAP_BYTES) + 1
    if breaks.size >= MAX_RUNS:
        return False
    bounds = [0, *breaks.tolist(), int(byte_at.size)]
    for a, b in itertools.pairwise(bounds):  # once per cluster, fewer than MAX_RUNS
        first, extent = int(byte_at[a]), int(byte_at[b - 1]) - int(byte_at[a]) + row_nbytes
        if extent == (b - a) * row_nbytes:  # no gap: straight into the output
            if os.preadv(fd, [out[a:b].data], first) != extent:
                return False  # the file shrank: let the mapped path check it again and report it
            continue
        buffer = np.empty(extent, dtype=np.uint8)
        if os.preadv(fd, [buffer.data], first) != extent:
            return False
        take_rows(buffer, byte_at[a:b] - first, None, row_nbytes, out[a:b], aligned=aligned)
    return True


def preadv_segments(
    fd: int,
    byte_at: NDArray[np.int64],
    nbytes: NDArray[np.int64],
    dests: NDArray[np.int64],
    flat: NDArray[np.uint8],
) -> int | None:
    """Read segment ``k`` (``nbytes[k]`` bytes at ``byte_at[k]``) into ``flat`` rows from ``dests[k]``.

    Segments in file order less than :data:`MAX_GAP_BYTES` apart are read with one ``preadv``, the bytes
    between them going to scratch. Returns the first segment the file ended in (it shrank), or ``None``.
    """
    order = np.argsort(byte_at, kind="stable")
    at, size, dest = byte_at[order].tolist(), nbytes[order].tolist(), dests[order].tolist()
    out = flat.reshape(-1)
    rb = flat.shape[1]
    scratch = np.empty(MAX_GAP_BYTES, dtype=np.uint8).data
    k, n = 0, len(at)
    while k < n:  # once per cluster of segments
        first, end = at[k], at[k]
        buffers: list[Any] = []
        j = k
        while j < n and len(buffers) < _IOV_MAX - 1 and 0 <= at[j] - end <= MAX_GAP_BYTES:
            if at[j] > end:
                buffers.append(scratch[: at[j] - end])
            buffers.append(out[dest[j] * rb : dest[j] * rb + size[j]].data)
            end = at[j] + size[j]
            j += 1
        if os.preadv(fd, buffers, first) != end - first:
            return int(order[j - 1])
        k = j
    return None


_IOV_MAX = 1024
"""Buffers one ``preadv`` takes at most (Linux's ``IOV_MAX``)."""


def take_rows(
    data: NDArray[np.uint8],
    byte_at: NDArray[np.int64],
    present: NDArray[np.bool_] | None,
    row_nbytes: int,
    out: NDArray[np.uint8],
    *,
    aligned: bool = False,
) -> None:
    """Copy the ``row_nbytes`` bytes at each of ``byte_at`` (where ``present``; all if ``None``) into ``out``.

    Rows whose offsets agree modulo the row size are taken together from one ``[rows, row_nbytes]`` view
    of the file (a contiguous view, so the take copies each row with one move and the file is never
    copied whole). Shards whose inner chunks end with a checksum shift that residue from chunk to
    chunk, so there are at most ``row_nbytes / 4`` groups; a chunk stored alone (``aligned``) has one.
    """
    residue = None if aligned else byte_at % row_nbytes
    groups = [0] if residue is None or not residue.any() else np.unique(residue).tolist()
    for r in groups:  # once per residue class, a handful at most
        count = (data.size - r) // row_nbytes
        view = data[r : r + count * row_nbytes].reshape(count, row_nbytes)
        mine = present if len(groups) == 1 else (residue == r) if present is None else present & (residue == r)
        if mine is None:
            np.take(view, byte_at // row_nbytes, axis=0, out=out)
        else:
            out[mine] = np.take(view, byte_at[mine] // row_nbytes, axis=0)


def advise_will_need(path: str, offsets: NDArray[np.int64], nbytes: int) -> None:
    """Ask the kernel to start reading ``nbytes`` at each of ``offsets`` of ``path`` (``POSIX_FADV_WILLNEED``).

    Only a hint: a file that cannot be opened is left for the read that follows to report, and systems
    without ``posix_fadvise`` skip it.
    """
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        for offset in offsets.tolist():
            os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


def fill_missing(
    codec: ArrayCodec, key: str, chunks: NDArray[np.int64], rows_missing: NDArray[np.bool_], out: NDArray[np.uint8]
) -> None:
    """Rows of never-written chunks: the fill value, or an error where every chunk was promised."""
    if codec.complete:
        raise ChunkDecodeError(
            f"Array {codec.name!r}: chunk {int(chunks[0])} ({key!r}) is missing, but the store promises that "
            f"every chunk was written (a deleted or lost file); it would read as the fill value "
            f"{np.asarray(codec.fill_value).item()!r}",
            array=codec.name, chunk=key,
        )  # fmt: skip
    fill = np.full(1, codec.fill_value, dtype=codec.stored_dtype).view(np.uint8)
    per_row = np.tile(fill, codec.row_nbytes // codec.stored_dtype.itemsize)
    out[rows_missing] = per_row
