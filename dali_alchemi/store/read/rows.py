"""Rows of uncompressed arrays read straight from their files, without decoding whole chunks.

A chunk stored as raw bytes (zarr's ``bytes`` serializer, optionally followed by ``crc32c``) holds row
``r`` at a known byte offset: ``(r - first row of the chunk) * row bytes`` past the chunk's first byte,
which is the start of the chunk's file, or the inner chunk's offset in its shard's index. A random
structure then costs its own bytes, not the decode of every chunk it touches: that is what keeps a
full shuffle fast on a store far larger than the decoded-chunk cache.

The rows of one file are read with one ``preadv`` per cluster of nearby rows (gaps under
:data:`MAX_GAP_BYTES`), or, when they are scattered, with one vectorised take over a read-only memory
map that is closed before the next file is opened, so a read holds at most one file's pages per thread
in the process (the data stays in the operating system's page cache, not in this process). Every chunk's
length is checked against its shape; a trailing ``crc32c`` is checked the first time this reader
touches the chunk (the whole chunk is hashed then), so each chunk is verified once per process and
store state, and a corrupt one is a :class:`~dali_alchemi.errors.ChunkDecodeError` as on the decode path.
"""

from __future__ import annotations

import itertools
import mmap
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from dali_alchemi.errors import ChunkDecodeError
from dali_alchemi.store.read.block_reads import load_shard_indexes
from dali_alchemi.store.read.codecs import MISSING_CHUNK

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.codecs import ArrayCodec
    from dali_alchemi.store.read.fetch import ByteFetcher

__all__ = ["CHECKSUM_BYTES", "IN_PLACE_SPAN_SIZE", "MAX_GAP_BYTES", "MAX_RUNS", "RowReader", "reads_rows"]


CHECKSUM_BYTES = 4
"""Bytes of the ``crc32c`` that ends a checksummed chunk."""

MAX_RUNS = 8
"""Rows of one file lying in fewer clusters than this are read with a ``preadv`` per cluster; more
scattered rows (a full shuffle's) are taken from a memory map of the file."""

MAX_GAP_BYTES = 64 << 10
"""Rows less than this far apart in a file are read together (the bytes between them are read too)."""

IN_PLACE_SPAN_SIZE = 64
"""Structures per block-shuffle span of a store whose per-atom arrays are all read in place: no chunk
is decoded, so spans need not follow chunks, and 64 structures of 20-100 atoms still read each array
as a few contiguous pages (measured: docs/bigger-than-memory.md)."""


def reads_rows(codec: ArrayCodec) -> bool:
    """Whether ``codec``'s rows can be read in place: raw chunks of whole rows (trailing dims unsplit)."""
    return codec.uncompressed and all(g == 1 for g in codec.trailing_grid) and codec.row_nbytes > 0


@dataclass(frozen=True, slots=True)
class _Locations:
    """Where ascending ``rows`` lie for one chunking: each row's chunk and row in it, grouped by file."""

    rows: NDArray[np.int64]
    local: NDArray[np.int64]  # each row's row within its chunk
    position: NDArray[np.int64]  # each row's chunk, as an index into ``touched``
    touched: NDArray[np.int64]  # the chunks the rows lie in, ascending
    files: list[int]  # the files (chunks, or shards) holding them, ascending
    row_bounds: list[int]  # rows [row_bounds[k], row_bounds[k + 1]) lie in files[k]
    chunk_bounds: list[int]  # and so do touched[chunk_bounds[k] : chunk_bounds[k + 1]]

    @classmethod
    def of(cls, rows: NDArray[np.int64], block_rows: int, per_file: int) -> _Locations:
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


def _regular_size(fd: int, codec: ArrayCodec, key: str) -> int:
    """The size of the open file ``fd``, which must be a regular file (not a directory in a chunk's place)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ChunkDecodeError(
            f"Array {codec.name!r}: {key!r} is not a regular file, so it holds no chunk", array=codec.name, chunk=key
        )
    return info.st_size


def _length_error(codec: ArrayCodec, chunk: int, key: str, held: int, expected: int) -> ChunkDecodeError:
    """The error for chunk ``chunk`` of ``key`` holding ``held`` bytes where its shape needs ``expected``."""
    return ChunkDecodeError(
        f"Array {codec.name!r}: chunk {chunk} in {key!r} holds {held} bytes, expected {expected} for "
        f"{codec.block_rows} rows of {codec.row_nbytes} bytes (a truncated or rewritten chunk)",
        array=codec.name, chunk=key,
    )  # fmt: skip


def _read_runs(fd: int, byte_at: NDArray[np.int64], row_nbytes: int, out: NDArray[np.uint8], *, aligned: bool) -> bool:
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
        _take_rows(buffer, byte_at[a:b] - first, None, row_nbytes, out[a:b], aligned=aligned)
    return True


def _take_rows(
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


@dataclass(slots=True)
class RowReader:
    """Reads rows of raw arrays of one local store in place; remembers which chunks passed their checksum.

    ``shard_indexes`` is the decoder's cache of parsed shard indexes, by ``(array name, shard key)``;
    ``verified`` says, per array, which chunks passed their checksum (the engine clears it when the
    store's state changes). Several arrays may be read at once on different threads once each was
    :meth:`prepare`-d.
    """

    root: Path
    fetcher: ByteFetcher
    shard_indexes: dict[tuple[str, str], NDArray[np.uint64]]
    verified: dict[str, NDArray[np.bool_]] = field(default_factory=dict)
    files_read: int = 0
    files_mapped: int = 0
    _located: dict[tuple[int, int, int], _Locations] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self, codec: ArrayCodec, rows: NDArray[np.int64]) -> NDArray[Any]:
        """Rows ``rows`` (ascending) of ``codec``'s array, as a new ``[len(rows), *trailing]`` array.

        Arrays of one level and chunking share where their rows lie, so pass the same ``rows`` object
        for each: it is located once per read.

        Raises
        ------
        ChunkDecodeError
            If a chunk holds other than its shape's bytes, fails its checksum, or is missing from a store
            that promises every chunk (a missing chunk otherwise reads as the fill value).
        """
        stored = codec.stored_dtype
        out = np.empty((rows.size, *codec.shape[1:]), dtype=stored)
        if rows.size == 0:
            return out.astype(codec.dtype, copy=False)
        flat = out.reshape(rows.size, -1).view(np.uint8).reshape(rows.size, codec.row_nbytes)
        where = self.prepare(codec, rows)
        for k, file in enumerate(where.files):  # once per file (a chunk, or a shard of many)
            lo, hi = where.row_bounds[k], where.row_bounds[k + 1]
            if not codec.sharded:
                self._read_chunk(codec, file, where.local[lo:hi], flat[lo:hi])
                continue
            first, last = where.chunk_bounds[k], where.chunk_bounds[k + 1]
            self._read_shard(
                codec, file, where.touched[first:last], where.position[lo:hi] - first, where.local[lo:hi], flat[lo:hi]
            )
        return out if stored.isnative else out.astype(codec.dtype)

    def prepare(self, codec: ArrayCodec, rows: NDArray[np.int64]) -> _Locations:
        """Locate ``rows`` for ``codec`` (once per chunking) and fetch the shard indexes they need.

        :meth:`read` calls it; calling it first on one thread lets several arrays then be read on others.
        """
        key = (id(rows), codec.block_rows, codec.chunks_per_shard[0])
        where = self._located.get(key)
        if where is None or where.rows is not rows:
            where = self._located[key] = _Locations.of(rows, codec.block_rows, codec.chunks_per_shard[0])
        if codec.sharded:
            load_shard_indexes(self.fetcher, [(codec, codec.shard_key(f)) for f in where.files], self.shard_indexes)
        return where

    def _read_chunk(self, codec: ArrayCodec, chunk: int, local: NDArray[np.int64], out: NDArray[np.uint8]) -> None:
        """Fill ``out`` with rows ``local`` of chunk ``chunk``, stored alone in its file (unsharded)."""
        key = codec.shard_key(chunk)
        chunk_bytes = codec.block_rows * codec.row_nbytes
        stored_bytes = chunk_bytes + (CHECKSUM_BYTES if codec.chunk_checksum else 0)
        try:
            fd = os.open(os.path.join(self.root, key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            self._fill_missing(codec, key, np.array([chunk]), np.ones(out.shape[0], dtype=np.bool_), out)
            return
        try:
            size = _regular_size(fd, codec, key)
            if size != stored_bytes:
                raise _length_error(codec, chunk, key, size, stored_bytes)
            self._count(mapped=False)
            verified = not codec.chunk_checksum or self._is_verified(codec, np.array([chunk]))
            if verified and _read_runs(fd, local * codec.row_nbytes, codec.row_nbytes, out, aligned=True):
                return

            def take(data: NDArray[np.uint8]) -> None:
                np.take(data[:chunk_bytes].reshape(codec.block_rows, codec.row_nbytes), local, axis=0, out=out)

            unverified = None if verified else (np.array([chunk]), np.zeros(1, dtype=np.int64))
            self._take_mapped(fd, size, codec, key, unverified, take)
        finally:
            os.close(fd)

    def _read_shard(
        self,
        codec: ArrayCodec,
        file: int,
        touched: NDArray[np.int64],
        position: NDArray[np.int64],
        local: NDArray[np.int64],
        out: NDArray[np.uint8],
    ) -> None:
        """Fill ``out`` with rows of one shard: chunk ``touched[position[i]]``, row ``local[i]`` of it, for row i."""
        key = codec.shard_key(file)
        chunk_bytes = codec.block_rows * codec.row_nbytes
        stored_bytes = chunk_bytes + (CHECKSUM_BYTES if codec.chunk_checksum else 0)
        index = self.shard_indexes[(codec.name, key)]
        inner = touched - file * codec.chunks_per_shard[0]
        offsets, lengths = index[inner, 0], index[inner, 1]
        missing = (offsets == MISSING_CHUNK) & (lengths == MISSING_CHUNK)
        offsets = np.where(missing, 0, offsets).astype(np.int64)
        lengths = np.where(missing, stored_bytes, lengths).astype(np.int64)
        try:
            fd = os.open(os.path.join(self.root, key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            missing[:] = True
            fd = -1
        try:
            if missing.any():
                self._fill_missing(codec, key, touched[missing], missing[position], out)
            if fd < 0 or missing.all():
                return
            size = _regular_size(fd, codec, key)
            bad = ~missing & ((lengths != stored_bytes) | (offsets < 0) | (offsets + lengths > size))
            if bad.any():
                at = int(np.argmax(bad))
                held = int(min(lengths[at], max(size - offsets[at], 0)))
                raise _length_error(codec, int(touched[at]), key, held, stored_bytes)
            self._count(mapped=False)
            byte_at = offsets[position] + local * codec.row_nbytes
            verified = not codec.chunk_checksum or self._is_verified(codec, touched)
            if not missing.any() and verified and _read_runs(fd, byte_at, codec.row_nbytes, out, aligned=False):
                return
            present = None if not missing.any() else ~missing[position]

            def take(data: NDArray[np.uint8]) -> None:
                _take_rows(data, byte_at, present, codec.row_nbytes, out)

            unverified = None if not codec.chunk_checksum else (touched[~missing], offsets[~missing])
            self._take_mapped(fd, size, codec, key, unverified, take)
        finally:
            if fd >= 0:
                os.close(fd)

    def _take_mapped(
        self,
        fd: int,
        size: int,
        codec: ArrayCodec,
        key: str,
        unverified: tuple[NDArray[np.int64], NDArray[np.int64]] | None,
        take: Callable[[NDArray[np.uint8]], None],
    ) -> None:
        """Map file ``fd``, check the checksums of ``unverified`` ``(chunks, offsets)``, and ``take`` its rows.

        Errors are raised once the map is closed: a traceback holding a view of it would keep it open.
        """
        self._count(mapped=True)
        corrupt: int | None = None
        failure = ""
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
            data = np.frombuffer(mapped, dtype=np.uint8)
            try:
                if unverified is not None:
                    corrupt = self._verify(codec, data, *unverified, codec.block_rows * codec.row_nbytes)
                if corrupt is None:
                    take(data)
            except (IndexError, ValueError) as err:  # a layout the length checks missed; kept as text
                failure = f"{type(err).__name__}: {err}"
            finally:
                del data  # the views must go before the map closes
        if failure:
            raise ChunkDecodeError(
                f"Array {codec.name!r}: rows of {key!r} could not be read in place: {failure}",
                array=codec.name, chunk=key,
            )  # fmt: skip
        if corrupt is not None:
            raise ChunkDecodeError(
                f"Array {codec.name!r}: chunk {corrupt} in {key!r} could not be decoded: crc32c checksum mismatch",
                array=codec.name, chunk=key,
            )  # fmt: skip

    def _count(self, *, mapped: bool) -> None:
        """Count a file read in place (``mapped``: of those, one that was mapped)."""
        with self._lock:
            if mapped:
                self.files_mapped += 1
            else:
                self.files_read += 1

    def _is_verified(self, codec: ArrayCodec, chunks: NDArray[np.int64]) -> bool:
        """Whether every one of ``chunks`` passed its checksum in this reader already."""
        done = self.verified.get(codec.name)
        return done is not None and bool(done[chunks].all())

    def _verify(
        self,
        codec: ArrayCodec,
        data: NDArray[np.uint8],
        chunks: NDArray[np.int64],
        offsets: NDArray[np.int64],
        chunk_bytes: int,
    ) -> int | None:
        """Check the crc32c of each of ``chunks`` not checked before (once per chunk per process).

        Returns the first chunk that fails, or ``None``.
        """
        done = self.verified.get(codec.name)
        if done is None:
            done = self.verified.setdefault(codec.name, np.zeros(codec.n_blocks, dtype=np.bool_))
        todo = ~done[chunks]
        for chunk, offset in zip(chunks[todo].tolist(), offsets[todo].tolist(), strict=True):  # once per chunk
            stored = data[offset + chunk_bytes : offset + chunk_bytes + CHECKSUM_BYTES].tobytes()
            computed = np.uint32(google_crc32c.value(data[offset : offset + chunk_bytes])).tobytes()
            if stored != computed:
                return int(chunk)
        done[chunks[todo]] = True
        return None

    def _fill_missing(
        self,
        codec: ArrayCodec,
        key: str,
        chunks: NDArray[np.int64],
        rows_missing: NDArray[np.bool_],
        out: NDArray[np.uint8],
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
