"""The block decoder: block jobs in, decoded rows scattered into the outputs, each block decoded once.

A job's block comes from the byte-bounded cache (:mod:`dali_alchemi.store.read.cache`) when it is
there, from the folder shared with other processes (:mod:`dali_alchemi.store.read.shared`) when
another process published it, and is fetched (:mod:`dali_alchemi.store.read.fetch`) and decoded
(:mod:`dali_alchemi.store.read.codecs`) otherwise, on the thread pool
(:mod:`dali_alchemi.store.read.pool`). Arrays read whole (:mod:`dali_alchemi.store.read.whole`), or
stitched from all their blocks, are kept in the cache as one resident array under :data:`RESIDENT`.

The decoder owns the cache, the pool, the parsed shard indexes and the blocks it published; which
blocks a read needs, and which arrays are worth keeping whole, the engine decides
(:mod:`dali_alchemi.store.read.routes`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.errors import ChunkDecodeError
from dali_alchemi.store.read.block_reads import block_requests, read_blocks
from dali_alchemi.store.read.cache import BlockCache
from dali_alchemi.store.read.fetch import LocalFetcher
from dali_alchemi.store.read.gather import balanced_groups, block_layout, contiguous_groups, scatter
from dali_alchemi.store.read.io_batches import read_and_finish
from dali_alchemi.store.read.pool import ReadPool
from dali_alchemi.store.read.shared import snapshot_token
from dali_alchemi.store.read.whole import read_whole

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.codecs import ArrayCodec
    from dali_alchemi.store.read.gather import BlockJob
    from dali_alchemi.store.read.shared import SharedBlocks
    from dali_alchemi.store.read.snapshot import ArrayHandle, Snapshot

__all__ = ["INLINE_ROWS", "RESIDENT", "TASKS_PER_THREAD", "BlockDecoder", "errors_of"]


RESIDENT = -1
"""Cache key (in place of a block index) of an array held whole: read with one take, no scatter."""

INLINE_ROWS = 1 << 15
"""Reads of at most this many rows, all cached, are copied on the calling thread (no pool hand-off)."""

TASKS_PER_THREAD = 4
"""Block jobs are grouped into this many tasks per thread, so uneven blocks still balance."""


class BlockDecoder:
    """Decodes row blocks through a cache of ``cache_bytes`` on ``num_threads`` threads.

    ``max_concurrency`` bounds the requests in flight to a non-local store; ``shared``, a folder of
    decoded blocks shared with other processes, is scoped to each attached snapshot.
    """

    def __init__(
        self, *, cache_bytes: int, num_threads: int, max_concurrency: int, shared: SharedBlocks | None
    ) -> None:
        self.cache = BlockCache(cache_bytes, on_evict=self._evicted)
        self.pool = ReadPool(num_threads, max_concurrency)
        self.shard_indexes: dict[tuple[str, str], NDArray[np.uint64]] = {}
        """Parsed shard indexes, by ``(array name, shard key)``."""
        self.raw_runs: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
        """A raw array's shard index as runs of whole chunks side by side, by ``(array name, shard key)``
        (:func:`~dali_alchemi.store.read.row_io.side_by_side_runs`)."""
        self.carried: dict[str, tuple[int, NDArray[Any]]] = {}
        """By field name, ``(block, rows)`` a read in store order ended inside (:meth:`hand_on`)."""
        self.chunks_fetched = 0
        self.blocks_decoded = 0
        self._shared_root = shared
        self._shared: SharedBlocks | None = None
        self._published: set[tuple[str, int]] = set()
        self._published_pid = os.getpid()

    @property
    def shares_blocks(self) -> bool:
        """Whether decoded blocks are shared with other processes (so arrays are not kept whole here)."""
        return self._shared_root is not None

    def attach(self, snapshot: Snapshot) -> None:
        """Decode ``snapshot``'s blocks from now on: drop the blocks, shard indexes and fetcher of the last one."""
        self.cache.clear()
        if self._shared_root is not None:
            self._shared = self._shared_root.scoped(snapshot_token(snapshot))
        self.shard_indexes.clear()
        self.raw_runs.clear()
        self.carried.clear()
        self.pool.attach(snapshot.location.store)

    def close(self) -> None:
        """Drop the cache and stop this process's threads."""
        self.cache.clear()
        self.carried.clear()
        self.pool.close()

    def carried_block(self, name: str, block: int) -> NDArray[Any] | None:
        """Block ``block`` of array ``name`` if the last read in store order handed it on (:meth:`hand_on`)."""
        carried = self.carried.get(name)
        return carried[1] if carried is not None and carried[0] == block else None

    def hand_on(
        self, name: str, block: int, data: NDArray[Any] | None, end: int, codec: ArrayCodec, bound: int
    ) -> None:
        """Keep the block a read in store order ended inside (at row ``end`` of ``codec``'s array) for the next
        read in store order, which begins there: one block per array, at most ``bound`` bytes in all, beside
        the cache, so a pass decodes each block once even when a block of every array outgrows the cache."""
        self.carried.pop(name, None)  # (dict operations hold the GIL: pool tasks hand on their arrays at once)
        if data is None or block != (end - 1) // codec.block_rows or end % codec.block_rows == 0:
            return  # the read ends with this block, or its last block was never decoded here
        if end < codec.shape[0] and sum(b.nbytes for _, b in list(self.carried.values())) + data.nbytes <= bound:
            self.carried[name] = (block, data)

    def resident(self, name: str) -> NDArray[Any] | None:
        """Array ``name`` held whole, if it is (looked up without counting a miss)."""
        return self.cache.get((name, RESIDENT)) if self.cache.peek((name, RESIDENT)) is not None else None

    # -- block jobs ---------------------------------------------------------------------------------
    def decode_group(
        self,
        jobs: list[BlockJob],
        outputs: dict[str, NDArray[Any]],
        resident: list[tuple[str, NDArray[Any]]],
        take: Callable[[tuple[str, NDArray[Any]]], None],
    ) -> None:
        """Fetch, decode and scatter one group of block jobs (and the resident takes, if any).

        With a shared folder, a block missing here is mapped if another process published it; of the
        rest, this process decodes those it claims and waits for the others (decoding them itself
        after all if their claim ends without a block).
        """
        shared = self._shared_blocks()
        self._look_up(jobs, shared)
        theirs = self._claimed_by_others(jobs, shared)
        waiting = {id(job) for job in theirs}
        self._decode_blocks([job for job in jobs if id(job) not in waiting], outputs, resident, take, shared)
        if theirs:
            assert shared is not None
            self._wait_for_others(theirs, outputs, take, shared)

    def _look_up(self, jobs: list[BlockJob], shared: SharedBlocks | None) -> None:
        """Give each job its block from the cache, or mapped from the shared folder (then cached too)."""
        for job in jobs:
            job.data = self.cache.get((job.handle.name, job.block))
            if job.data is None:
                job.data = self.carried_block(job.handle.name, job.block)
            if job.data is None and shared is not None:
                job.data = shared.open(job.handle.name, job.block, *block_layout(job))
                if job.data is not None:
                    self.cache.put((job.handle.name, job.block), job.data)

    @staticmethod
    def _claimed_by_others(jobs: list[BlockJob], shared: SharedBlocks | None) -> list[BlockJob]:
        """The jobs whose missing block another process is decoding; this process claims the rest."""
        if shared is None:
            return []
        return [job for job in jobs if job.data is None and not shared.claim(job.handle.name, job.block)]

    def _wait_for_others(
        self,
        theirs: list[BlockJob],
        outputs: dict[str, NDArray[Any]],
        take: Callable[[tuple[str, NDArray[Any]]], None],
        shared: SharedBlocks,
    ) -> None:
        """Scatter the blocks other processes claimed once published; decode those never published here.

        A block whose claim ended without one is claimed and decoded (and published) here; if yet
        another process claimed it first, it is decoded here all the same, without publishing.
        """
        pool = self.pool.executor()
        waits = [pool.submit(self._wait_and_scatter, job, outputs, shared) for job in theirs]
        unfinished = [job for job, task in zip(theirs, waits, strict=True) if not task.result()]
        claimed = {id(job) for job in unfinished if shared.claim(job.handle.name, job.block)}
        self._decode_blocks([job for job in unfinished if id(job) in claimed], outputs, [], take, shared)
        self._decode_blocks([job for job in unfinished if id(job) not in claimed], outputs, [], take, None)

    def _wait_and_scatter(self, job: BlockJob, outputs: dict[str, NDArray[Any]], shared: SharedBlocks) -> bool:
        """Scatter a block another process is decoding, once published; ``False`` if it never was."""
        job.data = shared.wait(job.handle.name, job.block, *block_layout(job))
        if job.data is None:
            return False
        self.cache.put((job.handle.name, job.block), job.data)
        codec = job.handle.codec
        assert codec is not None
        scatter(outputs[job.handle.name], job.plan, job.lo, job.hi, job.data, job.block * codec.block_rows, codec.block_rows)
        return True

    def _decode_blocks(
        self,
        jobs: list[BlockJob],
        outputs: dict[str, NDArray[Any]],
        resident: list[tuple[str, NDArray[Any]]],
        take: Callable[[tuple[str, NDArray[Any]]], None],
        shared: SharedBlocks | None,
    ) -> None:
        """Fetch the jobs' missing blocks, decode (and publish) them, scatter every job.

        From a local store each pool task reads its own blocks' chunks just before decoding them, in
        batches of about :data:`~dali_alchemi.store.read.io_batches.READ_BATCH_BYTES` (neighbouring chunks
        of a shard in one ``pread``): payloads are decoded while still in the CPU cache and their
        memory is reused, and the pool is crossed once rather than twice. Other stores' chunks are
        fetched in one concurrent batch first.
        """
        missing = [job for job in jobs if job.data is None]
        self.blocks_decoded += len(missing)
        local = self._fetch(missing, shared) if missing else None
        rows = sum(job.rows for job in jobs) + sum(outputs[name].shape[0] for name, _ in resident)
        if not missing and rows <= INLINE_ROWS:
            self._finish_task(outputs, shared, local, jobs)  # small and cached: a hand-off costs more than the copies
            for item in resident:
                take(item)
            return
        pool = self.pool.executor()
        split = balanced_groups if local is None else contiguous_groups
        groups = split(jobs, self.pool.num_threads * TASKS_PER_THREAD)
        tasks = [pool.submit(self._finish_task, outputs, shared, local, group) for group in groups]
        tasks += [pool.submit(take, item) for item in resident]
        errors = errors_of(tasks)
        if errors:
            _release_undecoded(missing, shared)
            raise errors[0]

    def _fetch(self, missing: list[BlockJob], shared: SharedBlocks | None) -> LocalFetcher | None:
        """Prepare the chunks of the blocks to decode; the local fetcher when the tasks read them themselves.

        From a local store each job gets its byte ``requests``, read by its pool task; from any
        other, its ``payloads``, all fetched here in one concurrent batch. If that fails, this
        process's claims on the blocks end, so others waiting for them decode them instead.
        """
        try:
            fetcher = self.pool.fetcher()
            blocks = [(job.handle.codec, job.block) for job in missing]
            wanted = block_requests(fetcher, blocks, self.shard_indexes)  # type: ignore[arg-type]
            if isinstance(fetcher, LocalFetcher):
                for job, requests in zip(missing, wanted, strict=True):
                    job.requests = requests
                self.chunks_fetched += sum(r is not None for requests, _ in wanted for r in requests)
                return fetcher
            fetched, count = read_blocks(fetcher, wanted)
            self.chunks_fetched += count
            for job, payloads in zip(missing, fetched, strict=True):
                job.payloads = payloads
            return None
        except BaseException:
            _release_undecoded(missing, shared)
            raise

    def _finish_task(
        self,
        outputs: dict[str, NDArray[Any]],
        shared: SharedBlocks | None,
        local: LocalFetcher | None,
        jobs: list[BlockJob],
    ) -> None:
        """One pool task: finish its jobs, reading their chunks batch by batch first from a local store."""
        finish = partial(self._finish, outputs, shared)
        if local is None:
            for job in jobs:
                finish(job)
        else:
            read_and_finish(local, jobs, finish)

    def _finish(self, outputs: dict[str, NDArray[Any]], shared: SharedBlocks | None, job: BlockJob) -> None:
        """Decode the job's block if it is not at hand yet, then scatter its rows into the output."""
        codec = job.handle.codec
        assert codec is not None
        data = job.data if job.data is not None else self._decode(job, codec, shared)
        scatter(outputs[job.handle.name], job.plan, job.lo, job.hi, data, job.block * codec.block_rows, codec.block_rows)

    def _decode(self, job: BlockJob, codec: ArrayCodec, shared: SharedBlocks | None) -> NDArray[Any]:
        """Decode the job's payloads into ``job.data``, publish the block (with a shared folder), cache it.

        A failed decode ends this process's claim, so a process waiting for the block decodes it.
        """
        key = (job.handle.name, job.block)
        try:
            job.data = codec.decode_block(job.block, *job.payloads)  # type: ignore[misc]
        except BaseException:
            if shared is not None:
                shared.release(*key)
            raise
        job.payloads = None
        if shared is not None:
            job.data = shared.publish(*key, job.data)
            self._published.add(key)
        self.cache.put(key, job.data)
        return job.data

    # -- whole arrays -------------------------------------------------------------------------------
    def read_whole(self, handles: list[ArrayHandle]) -> list[NDArray[Any] | None]:
        """Read arrays whole (:mod:`~dali_alchemi.store.read.whole`) and keep them resident in place of their blocks.

        An array with a corrupt or missing chunk is ``None``: its healthy blocks stay readable one by one.
        """
        if not handles:
            return []
        fetcher = self.pool.fetcher()
        if isinstance(fetcher, LocalFetcher):  # on the pool's threads: read there, not through the pool again
            fetcher = _ReadOnThisThread(fetcher)

        decoded = [self._cached_blocks(handle) for handle in handles]  # held from here: the cache may drop them

        def read(handle: ArrayHandle, blocks: dict[int, NDArray[Any]]) -> tuple[NDArray[Any], int] | None:
            assert handle.codec is not None
            try:
                return read_whole(handle.codec, fetcher, self.shard_indexes, blocks)
            except ChunkDecodeError:
                return None

        if len(handles) == 1:
            results = [read(handles[0], decoded[0])]
        else:
            results = list(self.pool.executor().map(read, handles, decoded))
        wholes: list[NDArray[Any] | None] = []
        for handle, blocks, result in zip(handles, decoded, results, strict=True):  # the bookkeeping on this thread
            assert handle.codec is not None
            if result is None:
                wholes.append(None)
                continue
            whole, chunks = result
            self.chunks_fetched += chunks
            self.blocks_decoded += handle.codec.n_blocks - len(blocks)
            for block in range(handle.codec.n_blocks):
                self.cache.pop((handle.name, block))
            self.cache.put((handle.name, RESIDENT), whole)
            wholes.append(whole)
        return wholes

    def _cached_blocks(self, handle: ArrayHandle) -> dict[int, NDArray[Any]]:
        """``handle``'s row blocks in the cache, or handed on, by block number (a whole read copies them instead
        of decoding)."""
        assert handle.codec is not None
        found = {block: self.cache.peek((handle.name, block)) for block in range(handle.codec.n_blocks)}
        found = {b: self.carried_block(handle.name, b) if data is None else data for b, data in found.items()}
        return {block: data for block, data in found.items() if data is not None}

    def stitch(self, name: str, blocks: list[int]) -> None:
        """Replace an array's cached blocks by one resident copy of the whole array (all must be cached)."""
        if sorted(blocks) != list(range(len(blocks))):
            return
        data = [self.cache.peek((name, block)) for block in range(len(blocks))]
        present = [d for d in data if d is not None]
        if len(present) != len(data):
            return
        whole = np.concatenate(present, axis=0)
        for block in range(len(blocks)):
            self.cache.pop((name, block))
        self.cache.put((name, RESIDENT), whole)

    # -- the shared folder --------------------------------------------------------------------------
    def _evicted(self, key: tuple[str, int]) -> None:
        """The cache let a block go: a block this process published leaves the shared folder too."""
        if self._shared is not None and self._published_pid == os.getpid() and key in self._published:
            self._published.discard(key)
            self._shared.discard(*key)

    def _shared_blocks(self) -> SharedBlocks | None:
        """The shared folder of the current snapshot; what a parent process published is not ours."""
        if self._published_pid != os.getpid():
            self._published = set()
            self._published_pid = os.getpid()
        return self._shared


def errors_of(tasks: list[Future[Any]]) -> list[BaseException]:
    """Wait for every task, and return what they raised, in order (every task ends before a raise)."""
    errors = []
    for task in tasks:
        try:
            task.result()
        except BaseException as err:
            errors.append(err)
    return errors


def _release_undecoded(jobs: list[BlockJob], shared: SharedBlocks | None) -> None:
    """End this process's claims on the jobs' blocks it did not decode, so waiting processes decode them."""
    if shared is None:
        return
    for job in jobs:
        if job.data is None:
            shared.release(job.handle.name, job.block)


class _ReadOnThisThread:
    """A local fetcher whose ``fetch`` reads on the calling thread (a pool task must not wait on its pool)."""

    def __init__(self, local: LocalFetcher) -> None:
        self.fetch = local.read
