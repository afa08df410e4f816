"""The chunk-block engine: read the rows of a window from a snapshot's arrays, block by block.

For each level the window's rows are planned (:mod:`dali_alchemi.store.read.gather`), and every row block
the plan touches is fetched and decoded at most once per call: blocks in the byte-bounded cache
(:mod:`dali_alchemi.store.read.cache`) are not fetched at all, the missing ones are fetched in one
concurrent batch (:mod:`dali_alchemi.store.read.fetch`; shard indexes first, for sharded arrays), then
decoded (:mod:`dali_alchemi.store.read.codecs`) and scattered into the outputs on a thread pool. An array
that fits in a quarter of the cache is read whole once reads have touched a quarter of its blocks,
and kept whole ("resident"): later reads take its rows with one take.

The engine owns the thread pool, the fetcher, the shard indexes, the cache and the read counters.
Threads do not survive ``fork`` (DALI's default worker start), so the pool and the fetcher that reads
on it are rebuilt in a new process. Reconnecting to a non-local store after a fork is the reader's
job: it owns the store argument, and hands the engine the snapshot it reopened.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.storage import LocalStore

from dali_alchemi.csr import concat_aranges
from dali_alchemi.errors import ChunkDecodeError, ConfigError
from dali_alchemi.store.read.block_reads import block_requests, read_blocks
from dali_alchemi.store.read.cache import BlockCache, CacheStats
from dali_alchemi.store.read.fetch import ByteFetcher, LocalFetcher, StoreFetcher
from dali_alchemi.store.read.gather import (
    BlockJob,
    LevelPlan,
    balanced_groups,
    block_jobs,
    block_layout,
    contiguous_groups,
    every_block,
    plan_rows,
    plan_system_rows,
    rows_view,
    scatter,
    working_set_groups,
)
from dali_alchemi.store.read.io_batches import read_and_finish
from dali_alchemi.store.read.rows import RowReader, reads_rows
from dali_alchemi.store.read.shared import snapshot_token
from dali_alchemi.store.read.snapshot import read_through_zarr
from dali_alchemi.store.read.whole import read_whole, reads_whole
from dali_alchemi.types import PerLevel

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.codecs import ArrayCodec
    from dali_alchemi.store.read.shared import SharedBlocks
    from dali_alchemi.store.read.snapshot import ArrayHandle, Snapshot
    from dali_alchemi.types import CountArray, IndexArray, Level

__all__ = [
    "DEFAULT_WORKING_SET_BYTES", "INLINE_ROWS", "RESIDENT", "TASKS_PER_THREAD", "WHOLE_ARRAY_SHARE",
    "BlockEngine", "ReadStats", "RowsRead", "default_threads"
]


RESIDENT = -1
"""Cache key (in place of a block index) of an array held whole: read with one take, no scatter."""

INLINE_ROWS = 1 << 15
"""Reads of at most this many rows, all cached, are copied on the calling thread (no pool hand-off)."""

MIN_THREADS, MAX_THREADS = 2, 8
"""Bounds of the default thread count (the core count): decoding overlaps I/O even on one core, and
more than 8 threads only contend for memory bandwidth."""

DEFAULT_WORKING_SET_BYTES = 64 << 20
"""Decoded bytes one read holds beyond the cache, by default (at least one row block): reads that touch
more blocks than this decode them in groups, so a window never decodes the whole store at once."""

TASKS_PER_THREAD = 4
"""Block jobs are grouped into this many tasks per thread, so uneven blocks still balance."""


WHOLE_ARRAY_SHARE = 4
"""Once reads since the store was opened have touched 1/this of the blocks of an array that fits a
quarter of the cache, the next read decodes all of them and the array is kept whole: with small
chunks a shuffled window touches most blocks but never all, a sequential epoch touches a few per
window, and per-block lookups would otherwise cost every later read (0: never)."""


def default_threads() -> int:
    """The default thread count: the core count, clamped to ``MIN_THREADS .. MAX_THREADS``."""
    return max(MIN_THREADS, min(MAX_THREADS, os.cpu_count() or MIN_THREADS))


@dataclass(frozen=True, slots=True)
class ReadStats:
    """Counters for tests and benchmarks: packed reads, chunk payloads fetched, cache behaviour."""

    packed_reads: int
    samples_read: int
    chunks_fetched: int
    blocks_decoded: int
    cache: CacheStats
    files_read: int = 0
    """Files whose rows were read in place (uncompressed arrays of a local store), counted once per read."""
    files_mapped: int = 0
    """Of those, the ones whose rows were too scattered for a read per cluster, and were mapped instead."""


@dataclass(frozen=True, slots=True)
class RowsRead:
    """What :meth:`BlockEngine.read` returns: one flat array per field, and per-sample row counts."""

    fields: dict[str, NDArray[Any]]
    n_atoms: CountArray
    n_edges: CountArray


class BlockEngine:
    """Reads rows of a snapshot's arrays through a shared decoded-block cache and a thread pool.

    Parameters
    ----------
    cache_bytes
        Budget of the decoded-block cache (0 disables it).
    num_threads
        Threads that fetch and decode blocks (``None``: :func:`default_threads`).
    max_concurrency
        Requests in flight at once to a non-local store.
    working_set_bytes
        Decoded bytes one read may hold beyond the cache (``None``: :data:`DEFAULT_WORKING_SET_BYTES`).
        A read's decoded blocks then stay within ``cache_bytes + working_set_bytes`` (or one block).
    shared
        A folder of decoded blocks shared with other processes (:mod:`dali_alchemi.store.read.shared`): a
        block another process published is mapped instead of decoded, one it is decoding is waited
        for, and blocks decoded here are published. ``None``: this process's cache only.
    """

    def __init__(
        self,
        *,
        cache_bytes: int,
        num_threads: int | None,
        max_concurrency: int,
        working_set_bytes: int | None = None,
        shared: SharedBlocks | None = None,
    ) -> None:
        if working_set_bytes is not None and working_set_bytes < 1:
            raise ConfigError(f"working_set_bytes must be >= 1, got {working_set_bytes}")
        self.cache = BlockCache(cache_bytes, on_evict=self._evicted)
        self._shared_root = shared
        self._shared: SharedBlocks | None = None
        self._published: set[tuple[str, int]] = set()
        self._published_pid = os.getpid()
        self.working_set_bytes = working_set_bytes or DEFAULT_WORKING_SET_BYTES
        self.num_threads = num_threads or default_threads()
        self._max_concurrency = max_concurrency
        self._snapshot: Snapshot | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid = -1
        self._executor_lock = threading.Lock()
        self._fetcher: ByteFetcher | None = None
        self._shard_indexes: dict[tuple[str, str], NDArray[np.uint64]] = {}
        self._verified: dict[str, NDArray[np.bool_]] = {}
        self._in_place = False
        self._files_read = 0
        self._files_mapped = 0
        self._packed_reads = 0
        self._samples_read = 0
        self._chunks_fetched = 0
        self._blocks_decoded = 0
        self._block_touches: dict[str, int] = {}
        self._whole_failed: set[str] = set()  # arrays with a bad chunk: read block by block  # per array, blocks its reads touched since attach()

    # -- state --------------------------------------------------------------------------------------
    def attach(self, snapshot: Snapshot) -> None:
        """Read from ``snapshot`` from now on: drop the blocks, shard indexes and fetcher of the last one."""
        self._snapshot = snapshot
        self.cache.clear()
        if self._shared_root is not None:
            self._shared = self._shared_root.scoped(snapshot_token(snapshot))
        self._shard_indexes.clear()
        self._block_touches.clear()
        self._whole_failed.clear()
        self._verified = {}
        raw = [h.codec for h in snapshot.handles.values() if h.codec is not None and reads_rows(h.codec)]
        raw_bytes = sum(codec.row_nbytes * codec.shape[0] for codec in raw)
        self._in_place = isinstance(snapshot.location.store, LocalStore) and raw_bytes > self.cache.capacity_bytes // 2
        self._fetcher = None  # follows the location, which a defragment may have moved

    def holds_shard_indexes(self) -> bool:
        """Whether shard indexes are cached (an append rewrites the last shard's, so they may be stale)."""
        return bool(self._shard_indexes)

    def stats(self) -> ReadStats:
        """Counters of packed reads, samples, chunk payloads fetched and cache behaviour so far."""
        return ReadStats(
            packed_reads=self._packed_reads,
            samples_read=self._samples_read,
            chunks_fetched=self._chunks_fetched,
            blocks_decoded=self._blocks_decoded,
            files_read=self._files_read,
            files_mapped=self._files_mapped,
            cache=CacheStats(**{f.name: getattr(self.cache.stats, f.name) for f in fields(CacheStats)}),
        )

    def close(self) -> None:
        """Drop the cache and stop this process's threads."""
        self.cache.clear()
        if self._executor is not None and self._executor_pid == os.getpid():
            self._executor.shutdown(wait=True)
        self._executor = None

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

    def _pool(self) -> ThreadPoolExecutor:
        # Threads do not survive fork (DALI's default worker start): rebuild the pool in a new process.
        with self._executor_lock:
            if self._executor is None or self._executor_pid != os.getpid():
                self._executor = ThreadPoolExecutor(self.num_threads, thread_name_prefix="dali-alchemi-read")
                self._executor_pid = os.getpid()
                self._fetcher = None
            if self._fetcher is None:
                self._fetcher = self._make_fetcher(self._executor)
            return self._executor

    def _io_fetcher(self) -> ByteFetcher:
        """The fetcher for this process and location (built with the thread pool it reads on)."""
        self._pool()
        assert self._fetcher is not None
        return self._fetcher

    def _make_fetcher(self, executor: ThreadPoolExecutor) -> ByteFetcher:
        """Direct file reads for a local directory, the store's own async reads otherwise.

        Chunk keys are paths from the root of the zarr store (a StorePath's prefix included), so a
        local fetcher reads relative to that root, not to the group the reader opened.
        """
        assert self._snapshot is not None, "attach() a snapshot first"
        store = self._snapshot.location.store
        if isinstance(store, LocalStore):
            return LocalFetcher(Path(store.root), executor)
        return StoreFetcher(store, max_concurrency=self._max_concurrency)

    # -- reading ------------------------------------------------------------------------------------
    def read(self, snapshot: Snapshot, physical: IndexArray, names: Sequence[str]) -> RowsRead:
        """Rows of distinct ``physical`` samples (request order) of arrays ``names``, one array each.

        Atom-index fields come back as stored (store-global); the caller re-bases them.
        """
        if snapshot is not self._snapshot:
            self.attach(snapshot)
        handles = snapshot.handles
        order = np.argsort(physical, kind="stable")
        atom_plan, n_atoms = plan_rows(snapshot.atoms_ptr, physical, order)
        edge_plan, n_edges = plan_rows(snapshot.edges_ptr, physical, order)
        plans = PerLevel(atom=atom_plan, edge=edge_plan, system=plan_system_rows(physical, order))
        outputs: dict[str, NDArray[Any]] = {}
        for name in names:
            handle = handles[name]
            outputs[name] = np.empty((plans[handle.level].total, *handle.shape[1:]), dtype=handle.dtype)

        def request_rows(level: Level) -> NDArray[np.int64]:
            if level == "atom":
                return concat_aranges(snapshot.atoms_ptr[physical], n_atoms)
            if level == "edge":
                return concat_aranges(snapshot.edges_ptr[physical], n_edges)
            return physical

        self._gather(handles, names, plans, outputs, request_rows)
        self._packed_reads += 1
        self._samples_read += int(physical.size)
        return RowsRead(fields=outputs, n_atoms=n_atoms, n_edges=n_edges)

    def _gather(
        self,
        handles: Mapping[str, ArrayHandle],
        names: Sequence[str],
        plans: PerLevel[LevelPlan],
        outputs: dict[str, NDArray[Any]],
        request_rows: Callable[[Level], NDArray[np.int64]],
    ) -> None:
        """Fill ``outputs``.

        Arrays held whole in the cache (*resident*) are read with one take in request order. The other
        arrays' row blocks are handled in groups whose decoded size stays within ``working_set_bytes``:
        a group's blocks are looked up in the cache, the missing ones fetched in one concurrent batch,
        then decoded and scattered on the thread pool (each block's rows go to disjoint output rows),
        and the group is released before the next begins. So one read holds at most the cache plus one
        group of decoded blocks, however many blocks of the store it touches. An array that fits in a
        quarter of the cache, once reads have touched a quarter of its blocks, is read whole and
        stitched into one resident array for later calls (:data:`WHOLE_ARRAY_SHARE`).
        """
        block_plans: dict[tuple[Level, int], tuple[NDArray[np.int64], NDArray[np.int64]]] = {}
        jobs: list[BlockJob] = []
        resident: list[tuple[str, NDArray[Any]]] = []
        to_stitch: list[str] = []
        whole_reads: list[tuple[ArrayHandle, LevelPlan, NDArray[np.int64], NDArray[np.int64]]] = []
        in_place = self._row_reader()
        raw: list[tuple[str, ArrayCodec, LevelPlan]] = []
        for name in names:
            handle = handles[name]
            plan = plans[handle.level]
            if plan.total == 0:
                continue
            if handle.codec is None:
                outputs[name][plan.dest] = read_through_zarr(handle, plan.rows)
                continue
            if in_place is not None and reads_rows(handle.codec):
                in_place.prepare(handle.codec, plan.rows)
                raw.append((name, handle.codec, plan))
                continue
            whole = self.cache.get((name, RESIDENT)) if self.cache.peek((name, RESIDENT)) is not None else None
            if whole is not None:
                resident.append((name, whole))
                continue
            key = (handle.level, handle.codec.block_rows)
            if key not in block_plans:
                block_plans[key] = plan.blocks(handle.codec.block_rows)
            blocks, bounds = block_plans[key]
            nbytes = handle.codec.row_nbytes * handle.shape[0]
            touches = self._block_touches[name] = self._block_touches.get(name, 0) + int(blocks.size)
            small = WHOLE_ARRAY_SHARE > 0 and nbytes <= self.cache.capacity_bytes // 4 and self._shared_root is None
            if small and reads_whole(handle.codec) and name not in self._whole_failed:
                if touches * WHOLE_ARRAY_SHARE >= handle.codec.n_blocks:
                    whole_reads.append((handle, plan, blocks, bounds))  # one read per stored object, then resident
                    continue
            elif small and blocks.size * WHOLE_ARRAY_SHARE >= handle.codec.n_blocks:
                blocks, bounds = every_block(blocks, bounds, handle.codec.n_blocks)
                to_stitch.append(name)  # read whole once, then one resident array: no per-block work again
            jobs += block_jobs(handle, plan, blocks, bounds)

        def take(item: tuple[str, NDArray[Any]]) -> None:
            name, whole = item
            rows = request_rows(handles[name].level)
            np.take(rows_view(whole), rows, out=rows_view(outputs[name]))

        if raw:
            assert in_place is not None
            self._read_in_place(in_place, raw, outputs)
        for (handle, plan, blocks, bounds), whole in zip(whole_reads, self._read_whole(whole_reads), strict=True):
            if whole is None:  # a chunk of it is bad: read the blocks asked for, which may be fine
                jobs += block_jobs(handle, plan, blocks, bounds)
            else:
                resident.append((handle.name, whole))
        groups = working_set_groups(jobs, self.working_set_bytes)
        for k, group in enumerate(groups):
            self._gather_group(group, outputs, resident if k == len(groups) - 1 else [], take)
            for job in group:  # release the group's decoded blocks (the cache keeps what fits)
                job.data = job.payloads = None
        if not groups and resident:
            self._gather_group([], outputs, resident, take)
        for name in to_stitch:
            self._stitch(name, [job.block for job in jobs if job.handle.name == name])
        if in_place is not None:
            self._files_read += in_place.files_read
            self._files_mapped += in_place.files_mapped

    def _read_whole(self, arrays: list[tuple[ArrayHandle, Any, Any, Any]]) -> list[NDArray[Any] | None]:
        """Read arrays whole (:mod:`~dali_alchemi.store.read.whole`) and keep them resident in place of their blocks.

        An array with a corrupt or missing chunk is ``None`` and is not read whole again for this
        snapshot: its healthy blocks stay readable one by one.
        """
        if not arrays:
            return []
        fetcher = self._io_fetcher()
        if isinstance(fetcher, LocalFetcher):  # on the pool's threads: read there, not through the pool again
            fetcher = _ReadOnThisThread(fetcher)

        def read(item: tuple[ArrayHandle, Any, Any, Any]) -> tuple[NDArray[Any], int] | None:
            assert item[0].codec is not None
            try:
                return read_whole(item[0].codec, fetcher, self._shard_indexes)
            except ChunkDecodeError:
                return None

        results = [read(arrays[0])] if len(arrays) == 1 else list(self._pool().map(read, arrays))
        wholes: list[NDArray[Any] | None] = []
        for (handle, *_), result in zip(arrays, results, strict=True):  # the bookkeeping on this thread
            assert handle.codec is not None
            if result is None:
                self._whole_failed.add(handle.name)
                wholes.append(None)
                continue
            whole, chunks = result
            self._chunks_fetched += chunks
            self._blocks_decoded += handle.codec.n_blocks
            for block in range(handle.codec.n_blocks):
                self.cache.pop((handle.name, block))
            self.cache.put((handle.name, RESIDENT), whole)
            wholes.append(whole)
        return wholes

    def _read_in_place(
        self, reader: RowReader, arrays: list[tuple[str, ArrayCodec, LevelPlan]], outputs: dict[str, NDArray[Any]]
    ) -> None:
        """Read the rows of uncompressed arrays in place, one array per task on the pool when they are many."""

        def read(item: tuple[str, ArrayCodec, LevelPlan]) -> None:
            name, codec, plan = item
            rows_view(outputs[name])[plan.dest] = rows_view(reader.read(codec, plan.rows))

        if len(arrays) == 1 or sum(plan.total for _, _, plan in arrays) <= INLINE_ROWS:
            for item in arrays:
                read(item)
            return
        for task in [self._pool().submit(read, item) for item in arrays]:
            task.result()

    def reads_in_place(self, handle: ArrayHandle) -> bool:
        """Whether ``handle``'s rows are read in place instead of through the cache.

        They are for an uncompressed array of a local directory store, once the store's uncompressed
        arrays would fill more than half the cache: below that, keeping their blocks (or whole arrays)
        decoded in the cache is faster still (docs/bigger-than-memory.md).
        """
        return self._in_place and handle.codec is not None and reads_rows(handle.codec)

    def _row_reader(self) -> RowReader | None:
        """A reader of uncompressed rows in place, when this store's are read so (``None`` otherwise)."""
        if not self._in_place:
            return None
        assert self._snapshot is not None
        store = self._snapshot.location.store
        assert isinstance(store, LocalStore)
        return RowReader(Path(store.root), self._io_fetcher(), self._shard_indexes, self._verified)

    def _gather_group(
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
        for job in jobs:
            job.data = self.cache.get((job.handle.name, job.block))
            if job.data is None and shared is not None:
                job.data = shared.open(job.handle.name, job.block, *block_layout(job))
                if job.data is not None:
                    self.cache.put((job.handle.name, job.block), job.data)
        theirs: list[BlockJob] = []
        if shared is not None:
            theirs = [job for job in jobs if job.data is None and not shared.claim(job.handle.name, job.block)]
        waiting = {id(job) for job in theirs}
        self._decode_blocks([job for job in jobs if id(job) not in waiting], outputs, resident, take, shared)
        if theirs:
            assert shared is not None
            pool = self._pool()
            waits = [pool.submit(self._wait_andscatter, job, outputs, shared) for job in theirs]
            unfinished = [job for job, task in zip(theirs, waits, strict=True) if not task.result()]
            claimed = {id(job) for job in unfinished if shared.claim(job.handle.name, job.block)}
            self._decode_blocks([job for job in unfinished if id(job) in claimed], outputs, [], take, shared)
            self._decode_blocks([job for job in unfinished if id(job) not in claimed], outputs, [], take, None)

    def _wait_andscatter(self, job: BlockJob, outputs: dict[str, NDArray[Any]], shared: SharedBlocks) -> bool:
        """Scatter a block another process is decoding, once published; ``False`` if it never was."""
        job.data = shared.wait(job.handle.name, job.block, *block_layout(job))
        if job.data is None:
            return False
        self.cache.put((job.handle.name, job.block), job.data)
        codec = job.handle.codec
        assert codec is not None
        scatter(outputs[job.handle.name], job.plan, job.lo, job.hi, job.data, job.block * codec.block_rows)
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
        self._blocks_decoded += len(missing)
        local: LocalFetcher | None = None
        try:
            if missing:
                fetcher = self._io_fetcher()
                blocks = [(job.handle.codec, job.block) for job in missing]
                wanted = block_requests(fetcher, blocks, self._shard_indexes)  # type: ignore[arg-type]
                if isinstance(fetcher, LocalFetcher):
                    local = fetcher
                    for job, requests in zip(missing, wanted, strict=True):
                        job.requests = requests
                    self._chunks_fetched += sum(r is not None for requests, _ in wanted for r in requests)
                else:
                    fetched, count = read_blocks(fetcher, wanted)
                    self._chunks_fetched += count
                    for job, payloads in zip(missing, fetched, strict=True):
                        job.payloads = payloads
        except BaseException:
            for job in missing if shared is not None else []:
                shared.release(job.handle.name, job.block)  # type: ignore[union-attr]
            raise

        def finish(job: BlockJob) -> None:
            codec = job.handle.codec
            assert codec is not None
            if job.data is None:
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
            scatter(outputs[job.handle.name], job.plan, job.lo, job.hi, job.data, job.block * codec.block_rows)

        def run(group: list[BlockJob]) -> None:
            if local is None:
                for job in group:
                    finish(job)
            else:
                read_and_finish(local, group, finish)

        rows = sum(job.hi - job.lo for job in jobs) + sum(outputs[name].shape[0] for name, _ in resident)
        if not missing and rows <= INLINE_ROWS:
            run(jobs)  # small and cached: a thread hand-off would cost more than the copies
            for item in resident:
                take(item)
            return
        pool = self._pool()
        split = balanced_groups if local is None else contiguous_groups
        tasks = [pool.submit(run, group) for group in split(jobs, self.num_threads * TASKS_PER_THREAD)]
        tasks += [pool.submit(take, item) for item in resident]
        errors = []
        for task in tasks:
            try:
                task.result()
            except BaseException as err:
                errors.append(err)
        if errors:
            if shared is not None:
                for job in missing:
                    if job.data is None:
                        shared.release(job.handle.name, job.block)
            raise errors[0]

    def _stitch(self, name: str, blocks: list[int]) -> None:
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


class _ReadOnThisThread:
    """A local fetcher whose ``fetch`` reads on the calling thread (a pool task must not wait on its pool)."""

    def __init__(self, local: LocalFetcher) -> None:
        self.fetch = local.read
