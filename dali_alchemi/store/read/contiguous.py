"""A few runs of consecutive samples (a sequential or block-order window), read with the least Python per array.

A read in store order (a sequential loader, the bench's ``packed-sequential``, a rewrite or verify
pass) asks for one run of samples, so each array's rows are one range lying in neighbouring chunks of
one or two shards; a block-order window is read as the few runs that cover it (one per stretch of
the store it samples, :func:`~dali_alchemi.store.read.spans.covering_runs`). Such ranges need no
segment plan, block job or byte request per chunk, only a little work per range:

- a raw array read in place is read with one ``preadv`` per shard straight into the output rows (each
  chunk's checksum into scratch). A chunk this reader has not checked yet is read whole in the same
  ``preadv`` (the rows before and after the window into scratch) and its crc32c computed over those
  pieces, so the bytes are checked in the pass that copies them;
- a compressed array's chunks the cache lacks are read with one ``pread`` per shard (through the same kept
  files) and decoded once each, straight into the output where one range covers a chunk that the cache could not keep anyway.

Only the plain case is taken here: chunks present, of their shape's length and (for raw arrays) stored
side by side, with matching checksums. Any other array (a missing, short or corrupt raw chunk, a
missing compressed chunk, an array read whole, stitched or through zarr) is left to the general path
(:mod:`~dali_alchemi.store.read.engine`), which reads it and raises as ``docs/guarantees.md`` says: each
error keeps the one place that words it. A compressed chunk that fails to decode raises the decoder's
own error (:meth:`~dali_alchemi.store.read.codecs.ArrayCodec.decode_block`), as on every path.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from dali_alchemi.store.read.block_reads import load_shard_indexes
from dali_alchemi.store.read.codecs import MISSING_CHUNK
from dali_alchemi.store.read.decoder import errors_of
from dali_alchemi.store.read.fetch import ByteRequest
from dali_alchemi.store.read.row_io import CHECKSUM_BYTES, side_by_side_runs, stored_chunk_bytes

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.codecs import ArrayCodec
    from dali_alchemi.store.read.decoder import BlockDecoder
    from dali_alchemi.store.read.fetch import LocalFetcher
    from dali_alchemi.store.read.open_files import OpenFiles
    from dali_alchemi.store.read.routes import Router
    from dali_alchemi.store.read.snapshot import ArrayHandle
    from dali_alchemi.types import Level

__all__ = ["RunReader"]


@dataclass(frozen=True, slots=True)
class _BlockRead:
    """One array's part of a read by blocks: rows ``[lo[k], hi[k])`` into ``out`` one range after the other,
    and the chunks to fetch. ``name`` is the field's (the cache's key), not the array's path."""

    name: str
    codec: ArrayCodec
    lo: list[int]
    hi: list[int]
    out: NDArray[Any]
    blocks: list[int]  # ascending, each once: the ones to copy rows from
    requests: dict[int, ByteRequest]  # block -> its chunk's bytes, for the blocks the cache lacked
    held: dict[int, NDArray[Any] | None]  # block -> the cache's copy (``None``: to decode)


@dataclass(slots=True)
class RunReader:
    """Reads a few runs' rows of the arrays of a local store, through ``decoder``'s cache and shard indexes.

    ``router`` says how each array is read (``in_place``: whether raw arrays are read in place);
    ``verified`` is the engine's record of the raw chunks whose checksum passed (shared with its
    in-place reader); ``fetcher`` reads on the calling thread. An array whose blocks to decode would
    hold more than ``working_set_bytes`` is left to the general path, which decodes them in bounded
    groups. ``in_store_order``: the window asked for its samples in store order (a sequential pass,
    which comes back to a block only after the whole store): a block one range covers whole is then
    decoded straight into the output, not kept, when the array outgrows the cache. A window read by
    covering runs (a block order's, whose next windows take the rest of the same stretches) keeps
    every block it decodes. A window in store order that ends inside a block hands that block on to the
    next (:meth:`~dali_alchemi.store.read.decoder.BlockDecoder.hand_on`: within ``working_set_bytes``), which
    begins there, so a pass decodes each block once even when a block of every array outgrows the cache.
    Raw arrays are read through ``files``, the engine's descriptors kept open between reads.
    ``files_read`` counts the files read in place.
    """

    decoder: BlockDecoder
    fetcher: LocalFetcher
    router: Router
    in_place: bool
    verified: dict[str, NDArray[np.bool_]]
    working_set_bytes: int
    in_store_order: bool
    files: OpenFiles
    files_read: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def read(
        self,
        handles: Mapping[str, ArrayHandle],
        names: Sequence[str],
        bounds: Mapping[Level, tuple[NDArray[np.int64], NDArray[np.int64]]],
        outputs: dict[str, NDArray[Any]],
        wanted_blocks: Callable[[Level, int], list[int]] | None = None,
    ) -> list[str]:
        """Fill ``outputs[name]`` with each array's rows ``[lo[k], hi[k])`` of ``bounds[level]``, one range after
        the other, where it can; returns the names left.

        ``wanted_blocks(level, block_rows)``, for ranges that cover a window rather than being it, gives
        the blocks that hold the window's own rows: a compressed array's other blocks are not decoded
        (their rows in the output are left unwritten, for the caller takes only the window's rows).
        Compressed arrays are planned here, then fetched and decoded on the pool (codecs and ``pread``
        release the GIL) while this thread reads the raw arrays.
        """
        left: list[str] = []
        raw: list[tuple[str, ArrayCodec, list[int], list[int]]] = []
        decoding: list[tuple[str, int, Future[bool]]] = []
        ranges = {level: (lo.tolist(), hi.tolist()) for level, (lo, hi) in bounds.items()}
        for name in names:
            handle = handles[name]
            lo, hi = ranges[handle.level]
            if not outputs[name].shape[0]:
                continue
            codec = handle.codec
            if codec is None:
                blocks = []
            elif wanted_blocks is None:
                blocks = _blocks_of(lo, hi, codec.block_rows)
            else:
                blocks = wanted_blocks(handle.level, codec.block_rows)
            how = self.router.run_route(handle, len(blocks), self.in_place)
            if isinstance(how, np.ndarray):
                _copy_ranges(how, lo, hi, outputs[name])
            elif how == "rows" and codec is not None:
                raw.append((name, codec, lo, hi))
            elif how == "blocks" and codec is not None and (job := self._plan_blocks(name, codec, lo, hi, blocks, outputs[name])):
                decoding.append((name, len(blocks), self.decoder.pool.executor().submit(self._decode_blocks, job)))
            else:
                left.append(name)
        try:
            self.files.begin_read()
            left += [name for name, codec, lo, hi in raw if not self._read_raw_ranges(codec, lo, hi, outputs[name])]
        finally:  # the pool's writes into the outputs are over before anything returns
            errors = errors_of([future for *_, future in decoding])
        if errors:
            raise errors[0]
        for name, touched, future in decoding:
            if future.result():
                self.router.touched(name, touched)  # the general path counts the arrays it is left
            else:
                left.append(name)
        return left

    # -- raw arrays, in place -----------------------------------------------------------------------
    def _read_raw_ranges(self, codec: ArrayCodec, lo: list[int], hi: list[int], out: NDArray[Any]) -> bool:
        """Rows ``[lo[k], hi[k])`` of a raw array into ``out``, one range after the other (see :meth:`_read_raw`)."""
        at = 0
        for a, b in zip(lo, hi, strict=True):  # once per range
            if b > a and not self._read_raw(codec, a, b, out[at : at + b - a]):
                return False
            at += b - a
        return True

    def _read_raw(self, codec: ArrayCodec, lo: int, hi: int, out: NDArray[Any]) -> bool:
        """Rows ``[lo, hi)`` of a raw array into ``out``; ``False`` (``out`` then partly written) where the
        chunks are not plain, for the general path to read them and say what is wrong."""
        if not codec.sharded or not codec.stored_dtype.isnative:
            return False  # a chunk a file: the general path checks each file's size
        block_rows = codec.block_rows
        per_file = codec.chunks_per_shard[0] if codec.sharded else 1
        first, stop = lo // block_rows, (hi - 1) // block_rows + 1
        done = None
        if codec.chunk_checksum:
            done = self.verified.get(codec.name)
            if done is None:
                done = self.verified.setdefault(codec.name, np.zeros(codec.n_blocks, dtype=np.bool_))
        flat = out.reshape(-1).view(np.uint8)
        at = 0
        for file in range(first // per_file, (stop - 1) // per_file + 1):  # one or two files
            c0, c1 = max(first, file * per_file), min(stop, (file + 1) * per_file)
            key = codec.shard_key(file)
            start = self._first_chunk_offset(codec, key, file, c0, c1)
            if start is None:
                return False
            r0, r1 = max(lo, c0 * block_rows), min(hi, c1 * block_rows)
            nbytes = (r1 - r0) * codec.row_nbytes
            check = done is not None and not bool(done[c0:c1].all())
            if not self._read_file(codec, key, start, c0, c1, r0, r1, flat[at : at + nbytes], check):
                return False
            if check and done is not None:
                done[c0:c1] = True
            at += nbytes
        return True

    def _first_chunk_offset(self, codec: ArrayCodec, key: str, file: int, c0: int, c1: int) -> int | None:
        """Where chunk ``c0`` starts in its file, when chunks ``[c0, c1)`` are all there, of their shape's length
        and side by side (``None`` otherwise)."""
        runs = self.decoder.raw_runs.get((codec.name, key))
        if runs is None:
            runs = self.decoder.raw_runs[(codec.name, key)] = side_by_side_runs(
                self._shard_index(codec, key), stored_chunk_bytes(codec)
            )
        base = file * codec.chunks_per_shard[0]
        offsets, ends = runs
        if ends[c0 - base] < c1 - base:
            return None  # a missing chunk (its entries are all ones), a bad length, or chunks out of order
        return offsets[c0 - base]

    def _read_file(
        self,
        codec: ArrayCodec,
        key: str,
        start: int,
        c0: int,
        c1: int,
        r0: int,
        r1: int,
        rows: NDArray[np.uint8],
        check: bool,
    ) -> bool:
        """Rows ``[r0, r1)`` of chunks ``[c0, c1)`` (stored side by side from byte ``start``) into ``rows`` with one
        ``preadv``; ``check``: read the chunks whole and compare their crc32c. ``False``: short, unreadable or corrupt."""
        block_rows, row_nbytes = codec.block_rows, codec.row_nbytes
        head = (r0 - c0 * block_rows) * row_nbytes  # bytes of the first chunk before the window
        tail = (c1 * block_rows - r1) * row_nbytes  # bytes of the last chunk after it
        crcs = np.empty((c1 - c0, CHECKSUM_BYTES), dtype=np.uint8)
        before = np.empty(head if check else 0, dtype=np.uint8)
        after = np.empty(tail if check else 0, dtype=np.uint8)
        pieces: list[NDArray[np.uint8]] = []
        buffers: list[Any] = [before.data] if before.size else []
        at = 0
        for k, chunk in enumerate(range(c0, c1)):
            n = (min(r1, (chunk + 1) * block_rows) - max(r0, chunk * block_rows)) * row_nbytes
            pieces.append(rows[at : at + n])
            buffers.append(pieces[-1].data)
            at += n
            if chunk == c1 - 1 and not check:
                break  # the rest of the last chunk is not wanted
            if chunk == c1 - 1 and after.size:
                buffers.append(after.data)
            if codec.chunk_checksum:
                buffers.append(crcs[k].data)
        expected = sum(b.nbytes for b in buffers)
        fd = self.files.get(key)
        if fd is None:
            return False
        try:
            self.files_read += 1
            if os.preadv(fd, buffers, start if check else start + head) != expected:
                return False
        except OSError:  # a directory in the file's place, or a read error: the general path says which
            return False
        if not check:
            return True
        for k, piece in enumerate(pieces):  # once per chunk, the first time this reader reads it
            crc = google_crc32c.value(before) if k == 0 else 0
            crc = google_crc32c.extend(crc, piece)
            if k == len(pieces) - 1:
                crc = google_crc32c.extend(crc, after)
            if crc != int.from_bytes(crcs[k].tobytes(), "little"):
                return False  # the general path reads the chunk again and names it
        return True

    # -- compressed arrays, by blocks ----------------------------------------------------------------
    def _plan_blocks(
        self, name: str, codec: ArrayCodec, lo: list[int], hi: list[int], blocks: list[int], out: NDArray[Any]
    ) -> _BlockRead | None:
        """The blocks ``blocks`` holding rows ``[lo[k], hi[k])`` of an array decoded by blocks (one chunk each),
        with the byte ranges of those the cache lacks; ``None`` where one of those was never written, or
        they would outgrow the working set."""
        block_rows, cache = codec.block_rows, self.decoder.cache
        carried = {block: self.decoder.carried_block(name, block) for block in blocks}
        todo = [block for block in blocks if carried[block] is None and cache.peek((name, block)) is None]
        if len(todo) * block_rows * codec.row_nbytes > self.working_set_bytes:
            return None
        requests = self._chunk_requests(codec, todo)
        if requests is None:
            return None
        # Hold the cached blocks from now on (counted as the general path counts them): the pool's other
        # tasks may evict them. One evicted since it was looked at is fetched after all.
        held = {block: cache.get((name, block)) if carried[block] is None else carried[block] for block in blocks}
        late = [block for block, data in held.items() if data is None and block not in todo]
        late_requests = self._chunk_requests(codec, late) if late else []
        if late_requests is None:
            return None
        wanted = dict(zip(todo + late, requests + late_requests, strict=True))
        return _BlockRead(name, codec, lo, hi, out, blocks, wanted, held)

    def _decode_blocks(self, job: _BlockRead) -> bool:
        """A pool task: fetch ``job``'s missing chunks, decode each once, copy every block's rows into the
        output; ``False`` (nothing copied) when a chunk's file is missing."""
        codec, out, name = job.codec, job.out, job.name
        block_rows, cache = codec.block_rows, self.decoder.cache
        self.files.begin_read()  # on a pool thread: its own descriptors, of the store's current state
        payloads = self.fetcher.read(list(job.requests.values()), kept=self.files) if job.requests else []
        if any(payload is None for payload in payloads):
            return False
        fetched = dict(zip(job.requests, payloads, strict=True))
        with self._lock:
            self.decoder.blocks_decoded += len(fetched)
            self.decoder.chunks_fetched += len(fetched)
        stream = self.in_store_order and codec.row_nbytes * codec.shape[0] > cache.capacity_bytes
        at = 0
        for lo, hi in zip(job.lo, job.hi, strict=True):  # once per range
            for block in range(lo // block_rows, (hi - 1) // block_rows + 1) if hi > lo else ():  # once per block
                if block not in job.held:
                    continue  # it holds none of the window's own rows, only rows the ranges read through
                a, b = max(lo, block * block_rows), min(hi, (block + 1) * block_rows)
                dest = out[at + a - lo : at + b - lo]
                data = job.held[block]
                if data is None:
                    key = job.requests[block].key
                    if stream and a == block * block_rows and b - a == block_rows:
                        # this range holds the whole block (so no other does), which the cache could not keep
                        codec.decode_block_into(block, fetched[block], key, dest)
                        continue
                    data = codec.decode_block(block, [fetched[block]], [key])
                    cache.put((name, block), data)
                    job.held[block] = data  # another range may cut the same block
                dest[...] = data[a - block * block_rows : b - block * block_rows]
            at += hi - lo
        if self.in_store_order and job.hi:
            end = job.hi[-1]
            block = (end - 1) // block_rows
            self.decoder.hand_on(name, block, job.held.get(block), end, codec, self.working_set_bytes)
        return True

    def _chunk_requests(self, codec: ArrayCodec, blocks: list[int]) -> list[ByteRequest] | None:
        """The byte range of each of ``blocks`` (one chunk each) in its shard; ``None`` if one was never written."""
        if not codec.sharded:
            return [ByteRequest(codec.shard_key(block)) for block in blocks]
        per_shard = codec.chunks_per_shard[0]
        requests: list[ByteRequest] = []
        k = 0
        while k < len(blocks):  # once per stretch of blocks in one shard (one a shard: they ascend)
            shard = blocks[k] // per_shard
            j = k + 1
            while j < len(blocks) and blocks[j] // per_shard == shard:
                j += 1
            key = codec.shard_key(shard)
            inner = [block - shard * per_shard for block in blocks[k:j]]
            for offset, nbytes in self._shard_index(codec, key)[inner].tolist():
                if offset == MISSING_CHUNK and nbytes == MISSING_CHUNK:
                    return None
                requests.append(ByteRequest(key, offset, offset + nbytes))
            k = j
        return requests

    def _shard_index(self, codec: ArrayCodec, key: str) -> NDArray[np.uint64]:
        """The parsed index of shard ``key``, fetched once (a corrupt one raises as on every path)."""
        index = self.decoder.shard_indexes.get((codec.name, key))
        if index is None:
            load_shard_indexes(self.fetcher, [(codec, key)], self.decoder.shard_indexes)
            index = self.decoder.shard_indexes[(codec.name, key)]
        return index


def _blocks_of(lo: list[int], hi: list[int], block_rows: int) -> list[int]:
    """The ``block_rows``-row blocks that rows ``[lo[k], hi[k])`` lie in, ascending, each once."""
    if len(lo) == 1:
        return list(range(lo[0] // block_rows, (hi[0] - 1) // block_rows + 1)) if hi[0] > lo[0] else []
    blocks = {block for a, b in zip(lo, hi, strict=True) if b > a for block in range(a // block_rows, (b - 1) // block_rows + 1)}
    return sorted(blocks)


def _copy_ranges(whole: NDArray[Any], lo: list[int], hi: list[int], out: NDArray[Any]) -> None:
    """Rows ``[lo[k], hi[k])`` of an array held whole into ``out``, one range after the other."""
    at = 0
    for a, b in zip(lo, hi, strict=True):  # once per range
        out[at : at + b - a] = whole[a:b]
        at += b - a
