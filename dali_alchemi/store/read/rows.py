"""Rows of uncompressed arrays read straight from their files, without decoding whole chunks.

A chunk stored as raw bytes (zarr's ``bytes`` serializer, optionally followed by ``crc32c``) holds row
``r`` at a known byte offset: ``(r - first row of the chunk) * row bytes`` past the chunk's first byte,
which is the start of the chunk's file, or the inner chunk's offset in its shard's index. A random
structure then costs its own bytes, not the decode of every chunk it touches: that is what keeps a
full shuffle fast on a store far larger than the decoded-chunk cache.

The rows of a span plan (:mod:`~dali_alchemi.store.read.spans`) are read segment by segment, with one
``preadv`` per cluster of segments into their output rows. Other rows of one file are read with one ``preadv``
per cluster of nearby rows (gaps under :data:`MAX_GAP_BYTES`), or, when scattered, with one vectorised take
over a read-only memory map closed before the next file is opened, so a read holds at most one file's pages
per thread in the process (the data stays in the operating system's page cache, not in this process).
Every chunk's length is checked against its shape; a trailing ``crc32c`` is checked the first time this
reader touches the chunk (the whole chunk is read with one ``preadv`` and hashed then: one disk request on
a cold page cache, where faulting it in through a map took one per page), so each chunk is verified once
per process and store state; a corrupt one is a :class:`~dali_alchemi.errors.ChunkDecodeError` as on the decode path.
"""

from __future__ import annotations

import itertools
import mmap
import os
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
from dali_alchemi.store.read.row_io import (
    CHECKSUM_BYTES,
    MAX_GAP_BYTES,
    MAX_RUNS,
    RowLocations,
    advise_will_need,
    check_lengths,
    chunk_file_size,
    fill_missing,
    preadv_segments,
    read_runs,
    regular_size,
    shrank_error,
    stored_chunk_bytes,
    take_rows,
)

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.codecs import ArrayCodec
    from dali_alchemi.store.read.fetch import ByteFetcher
    from dali_alchemi.store.read.spans import Segments

__all__ = ["CHECKSUM_BYTES", "IN_PLACE_SPAN_SIZE", "MAX_GAP_BYTES", "MAX_RUNS", "RowReader", "reads_rows"]


IN_PLACE_SPAN_SIZE = 64
"""Structures per block-shuffle span of a store whose per-atom arrays are all read in place: no chunk
is decoded, so spans need not follow chunks, and 64 structures of 20-100 atoms still read each array
as a few contiguous pages (measured: docs/bigger-than-memory.md)."""


def reads_rows(codec: ArrayCodec) -> bool:
    """Whether ``codec``'s rows can be read in place: raw chunks of whole rows (trailing dims unsplit)."""
    return codec.uncompressed and all(g == 1 for g in codec.trailing_grid) and codec.row_nbytes > 0


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
    _located: dict[tuple[int, int, int], RowLocations] = field(default_factory=dict)
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
        if codec.chunk_checksum and codec.sharded:
            self._advise_unverified(codec, where)
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

    def prepare(self, codec: ArrayCodec, rows: NDArray[np.int64]) -> RowLocations:
        """Locate ``rows`` for ``codec`` (once per chunking) and fetch the shard indexes they need.

        :meth:`read` calls it; calling it first on one thread lets several arrays then be read on others.
        """
        key = (id(rows), codec.block_rows, codec.chunks_per_shard[0])
        where = self._located.get(key)
        if where is None or where.rows is not rows:
            where = self._located[key] = RowLocations.of(rows, codec.block_rows, codec.chunks_per_shard[0])
        if codec.sharded:
            load_shard_indexes(self.fetcher, [(codec, codec.shard_key(f)) for f in where.files], self.shard_indexes)
        return where

    def _advise_unverified(self, codec: ArrayCodec, where: RowLocations) -> None:
        """Have the kernel start reading every chunk of ``where`` this reader has not checked yet, all at once.

        Each is then read whole to be checked, one file after another; on a cold page cache the reads find
        their pages in flight instead of waiting for the disk one by one (a shuffled read of 1,024 structures
        of the 110 M store: 2.2-3.5 s without, 1.3-3.2 s with, medians 2.4 and 1.6). Checked chunks cost nothing.
        """
        done = self.verified.get(codec.name)
        todo = np.ones(where.touched.size, dtype=np.bool_) if done is None else ~done[where.touched]
        nbytes = codec.block_rows * codec.row_nbytes + CHECKSUM_BYTES
        for k in np.unique(np.searchsorted(where.chunk_bounds, np.flatnonzero(todo), side="right") - 1).tolist():
            first, last = where.chunk_bounds[k], where.chunk_bounds[k + 1]
            key = codec.shard_key(where.files[k])
            offsets, _, missing = self._entries(codec, key, where.files[k], where.touched[first:last][todo[first:last]])
            advise_will_need(os.path.join(self.root, key), offsets[~missing], nbytes)

    def read_spans(self, codec: ArrayCodec, segments: Segments, out: NDArray[Any]) -> None:
        """Copy ``segments`` (of ``codec``'s chunking) of ``codec``'s array straight into ``out``.

        A span plan's rows are a few ranges, so each file's are read with one ``preadv`` per cluster of segments
        (the bytes between them, such as each chunk's checksum, into scratch): no row is planned or taken one by
        one. Chunks this reader has not checked yet are read whole first, checked, and copied from. Raises as
        :meth:`read` does.
        """
        if segments.block.size == 0:
            return
        flat = out.reshape(out.shape[0], -1).view(np.uint8).reshape(out.shape[0], codec.row_nbytes)
        files, bounds = self.prepare_spans(codec, segments)
        for k, file in enumerate(files):  # once per file (a chunk, or a shard of many)
            lo, hi = bounds[k], bounds[k + 1]
            self._read_file_spans(codec, file, segments.block[lo:hi], segments.start[lo:hi],
                                  segments.count[lo:hi], segments.dest[lo:hi], flat)  # fmt: skip
        if not codec.stored_dtype.isnative:
            out.byteswap(inplace=True)

    def prepare_spans(self, codec: ArrayCodec, segments: Segments) -> tuple[list[int], list[int]]:
        """The files ``segments`` lie in, with the bounds of each one's segments; fetches their shard indexes.

        :meth:`read_spans` calls it; calling it first on one thread lets several arrays then be read on
        others (a pool task must not fetch through the pool it runs on).
        """
        files, bounds = segments.files(codec.chunks_per_shard[0])
        if codec.sharded:
            load_shard_indexes(self.fetcher, [(codec, codec.shard_key(f)) for f in files], self.shard_indexes)
        return files, bounds

    def _read_file_spans(
        self,
        codec: ArrayCodec,
        file: int,
        blocks: NDArray[np.int64],
        starts: NDArray[np.int64],
        counts: NDArray[np.int64],
        dests: NDArray[np.int64],
        flat: NDArray[np.uint8],
    ) -> None:
        """:meth:`read_spans` for the segments lying in one file."""
        key = codec.shard_key(file)
        rb = codec.row_nbytes
        offsets, lengths, missing = self._entries(codec, key, file, blocks)
        try:
            fd = os.open(os.path.join(self.root, key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            missing[:] = True
            fd = -1
        try:
            if missing.any():
                rows_missing = np.zeros(flat.shape[0], dtype=np.bool_)
                for d, c in zip(dests[missing].tolist(), counts[missing].tolist(), strict=True):
                    rows_missing[d : d + c] = True
                fill_missing(codec, key, blocks[missing], rows_missing, flat)
                if fd < 0 or missing.all():
                    return
                offsets, lengths = offsets[~missing], lengths[~missing]
                blocks, starts, counts, dests = blocks[~missing], starts[~missing], counts[~missing], dests[~missing]
            size = regular_size(fd, codec, key) if codec.sharded else chunk_file_size(fd, codec, key, file)
            check_lengths(codec, key, blocks, offsets, lengths, size, None)
            self._count(mapped=False)
            byte_at = offsets + (starts - blocks * codec.block_rows) * rb
            if codec.chunk_checksum and not self._is_verified(codec, blocks):
                self._verify_and_copy(fd, codec, key, blocks, offsets, byte_at, counts, dests, flat)
                return
            short = preadv_segments(fd, byte_at, counts * rb, dests, flat)
            if short is not None:
                raise shrank_error(codec, int(blocks[short]), key)
        finally:
            if fd >= 0:
                os.close(fd)

    def _verify_and_copy(
        self,
        fd: int,
        codec: ArrayCodec,
        key: str,
        blocks: NDArray[np.int64],
        offsets: NDArray[np.int64],
        byte_at: NDArray[np.int64],
        counts: NDArray[np.int64],
        dests: NDArray[np.int64],
        flat: NDArray[np.uint8],
    ) -> None:
        """Read the chunks holding one file's segments whole (one ``preadv`` per run of them side by side:
        a block-order window's lie scattered over the shard), check their checksums once, copy the segments."""
        chunk_bytes = codec.block_rows * codec.row_nbytes
        stored = chunk_bytes + CHECKSUM_BYTES
        chunks, first_segment, segment_chunk = np.unique(blocks, return_index=True, return_inverse=True)
        chunk_at = offsets[first_segment]
        data = np.empty(chunks.size * stored, dtype=np.uint8)  # chunk k at byte k * stored
        runs = [0, *(np.flatnonzero(np.diff(chunk_at) != stored) + 1).tolist(), int(chunks.size)]
        for a, b in itertools.pairwise(runs):  # once per run of chunks side by side
            if os.preadv(fd, [data[a * stored : b * stored].data], int(chunk_at[a])) != (b - a) * stored:
                raise shrank_error(codec, int(chunks[a]), key)
        corrupt = self._verify(codec, data, chunks, np.arange(chunks.size, dtype=np.int64) * stored, chunk_bytes)
        if corrupt is not None:
            raise ChunkDecodeError(
                f"Array {codec.name!r}: chunk {corrupt} in {key!r} could not be decoded: crc32c checksum mismatch",
                array=codec.name, chunk=key,
            )  # fmt: skip
        at_in_data, rb = segment_chunk.reshape(-1) * stored + (byte_at - offsets), codec.row_nbytes
        for at, c, d in zip(at_in_data.tolist(), counts.tolist(), dests.tolist(), strict=True):  # per segment
            flat[d : d + c] = data[at : at + c * rb].reshape(c, rb)

    def _read_chunk(self, codec: ArrayCodec, chunk: int, local: NDArray[np.int64], out: NDArray[np.uint8]) -> None:
        """Fill ``out`` with rows ``local`` of chunk ``chunk``, stored alone in its file (unsharded)."""
        key = codec.shard_key(chunk)
        chunk_bytes = codec.block_rows * codec.row_nbytes
        try:
            fd = os.open(os.path.join(self.root, key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            fill_missing(codec, key, np.array([chunk]), np.ones(out.shape[0], dtype=np.bool_), out)
            return
        try:
            size = chunk_file_size(fd, codec, key, chunk)
            self._count(mapped=False)
            if codec.chunk_checksum and not self._is_verified(codec, np.array([chunk])):
                self._verify_by_reading(fd, codec, key, np.array([chunk]), np.zeros(1, dtype=np.int64))
            if read_runs(fd, local * codec.row_nbytes, codec.row_nbytes, out, aligned=True):
                return

            def take(data: NDArray[np.uint8]) -> None:
                np.take(data[:chunk_bytes].reshape(codec.block_rows, codec.row_nbytes), local, axis=0, out=out)

            self._take_mapped(fd, size, codec, key, take)
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
        offsets, lengths, missing = self._entries(codec, key, file, touched)
        try:
            fd = os.open(os.path.join(self.root, key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            missing[:] = True
            fd = -1
        try:
            if missing.any():
                fill_missing(codec, key, touched[missing], missing[position], out)
            if fd < 0 or missing.all():
                return
            size = regular_size(fd, codec, key)
            check_lengths(codec, key, touched, offsets, lengths, size, ~missing)
            self._count(mapped=False)
            byte_at = offsets[position] + local * codec.row_nbytes
            if codec.chunk_checksum and not self._is_verified(codec, touched):
                self._verify_by_reading(fd, codec, key, touched[~missing], offsets[~missing])
            if not missing.any() and read_runs(fd, byte_at, codec.row_nbytes, out, aligned=False):
                return
            present = None if not missing.any() else ~missing[position]

            def take(data: NDArray[np.uint8]) -> None:
                take_rows(data, byte_at, present, codec.row_nbytes, out)

            self._take_mapped(fd, size, codec, key, take)
        finally:
            if fd >= 0:
                os.close(fd)

    def _entries(
        self, codec: ArrayCodec, key: str, file: int, blocks: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.bool_]]:
        """``(offsets, lengths, missing)`` of chunks ``blocks`` in file ``file`` (``key``): from its shard index,
        or the whole file for an unsharded chunk; a never-written chunk gets offset 0 and its full length."""
        stored_bytes = stored_chunk_bytes(codec)
        if not codec.sharded:
            zeros = np.zeros(blocks.size, np.int64)
            return zeros, np.full(blocks.size, stored_bytes, np.int64), np.zeros(blocks.size, dtype=np.bool_)
        index = self.shard_indexes[(codec.name, key)]
        inner = blocks - file * codec.chunks_per_shard[0]
        offsets, lengths = index[inner, 0], index[inner, 1]
        missing = (offsets == MISSING_CHUNK) & (lengths == MISSING_CHUNK)
        return (np.where(missing, 0, offsets).astype(np.int64), np.where(missing, stored_bytes, lengths).astype(np.int64),
                missing)  # fmt: skip

    def _take_mapped(
        self, fd: int, size: int, codec: ArrayCodec, key: str, take: Callable[[NDArray[np.uint8]], None]
    ) -> None:
        """Map file ``fd`` and ``take`` its rows (its chunks' checksums were checked before).

        Errors are raised once the map is closed: a traceback holding a view of it would keep it open.
        """
        self._count(mapped=True)
        failure = ""
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
            data = np.frombuffer(mapped, dtype=np.uint8)
            try:
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

    def _verify_by_reading(
        self, fd: int, codec: ArrayCodec, key: str, chunks: NDArray[np.int64], offsets: NDArray[np.int64]
    ) -> None:
        """Check the crc32c of each of ``chunks`` of one shard not checked before, reading each with one ``preadv``.

        A chunk is read with one request rather than faulted in page by page through a map: on a cold
        page cache that is one disk read per chunk instead of a run of synchronous ones (about ten
        times faster for a shuffled window of a store far bigger than memory). Raises
        :class:`ChunkDecodeError` naming the first chunk that fails, or one cut short.
        """
        done = self.verified.get(codec.name)
        todo = np.ones(chunks.size, dtype=np.bool_) if done is None else ~done[chunks]
        chunk_bytes = codec.block_rows * codec.row_nbytes
        data = np.empty(chunk_bytes + CHECKSUM_BYTES, dtype=np.uint8)
        for chunk, offset in zip(chunks[todo].tolist(), offsets[todo].tolist(), strict=True):  # once per chunk
            if os.preadv(fd, [data.data], offset) != data.size:
                raise shrank_error(codec, chunk, key)
            if self._verify(codec, data, np.array([chunk]), np.zeros(1, dtype=np.int64), chunk_bytes) is not None:
                raise ChunkDecodeError(
                    f"Array {codec.name!r}: chunk {chunk} in {key!r} could not be decoded: crc32c checksum mismatch",
                    array=codec.name, chunk=key,
                )  # fmt: skip
