"""The chunk-block engine: read the rows of a window from a snapshot's arrays, block by block.

For each level the window's rows are planned (:mod:`dali_alchemi.store.gather`), and every row block
the plan touches is fetched and decoded at most once per call: blocks in the byte-bounded cache
(:mod:`dali_alchemi.store.cache`) are not fetched at all, the missing ones are fetched in one
concurrent batch (:mod:`dali_alchemi.store.fetch`; shard indexes first, for sharded arrays), then
decoded (:mod:`dali_alchemi.store.codecs`) and scattered into the outputs on a thread pool. An array
whose every block a call touched, and that fits in a quarter of the cache, is kept whole
("resident") and later read with one take.

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
from dali_alchemi.store.cache import BlockCache, CacheStats
from dali_alchemi.store.codecs import MISSING_CHUNK, ArrayCodec
from dali_alchemi.store.fetch import ByteFetcher, ByteRequest, LocalFetcher, StoreFetcher
from dali_alchemi.store.gather import LevelPlan, plan_rows, plan_system_rows
from dali_alchemi.types import PerLevel

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.snapshot import ArrayHandle, Snapshot
    from dali_alchemi.types import CountArray, IndexArray, Level

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
    """

    def __init__(
        self, *, cache_bytes: int, num_threads: int | None, max_concurrency: int, working_set_bytes: int | None = None
    ) -> None:
        if working_set_bytes is not None and working_set_bytes < 1:
            raise ValueError(f"working_set_bytes must be >= 1, got {working_set_bytes}")
        self.cache = BlockCache(cache_bytes)
        self.working_set_bytes = working_set_bytes or DEFAULT_WORKING_SET_BYTES
        self.num_threads = num_threads or default_threads()
        self._max_concurrency = max_concurrency
        self._snapshot: Snapshot | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid = -1
        self._executor_lock = threading.Lock()
        self._fetcher: ByteFetcher | None = None
        self._shard_indexes: dict[tuple[str, str], NDArray[np.uint64]] = {}
        self._packed_reads = 0
        self._samples_read = 0
        self._chunks_fetched = 0
        self._blocks_decoded = 0

    # -- state --------------------------------------------------------------------------------------
    def attach(self, snapshot: Snapshot) -> None:
        """Read from ``snapshot`` from now on: drop the blocks, shard indexes and fetcher of the last one."""
        self._snapshot = snapshot
        self.cache.clear()
        self._shard_indexes.clear()
        self._fetcher = None  # follows the location, which a defragment may have moved

    def stats(self) -> ReadStats:
        """Counters of packed reads, samples, chunk payloads fetched and cache behaviour so far."""
        return ReadStats(
            packed_reads=self._packed_reads,
            samples_read=self._samples_read,
            chunks_fetched=self._chunks_fetched,
            blocks_decoded=self._blocks_decoded,
            cache=CacheStats(**{f.name: getattr(self.cache.stats, f.name) for f in fields(CacheStats)}),
        )

    def close(self) -> None:
        """Drop the cache and stop this process's threads."""
        self.cache.clear()
        if self._executor is not None and self._executor_pid == os.getpid():
            self._executor.shutdown(wait=True)
        self._executor = None

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
        group of decoded blocks, however many blocks of the store it touches. An array whose every
        block this call touched, and that fits in a quarter of the cache, is then stitched into one
        resident array for later calls.
        """
        block_plans: dict[tuple[Level, int], tuple[NDArray[np.int64], NDArray[np.int64]]] = {}
        jobs: list[_BlockJob] = []
        resident: list[tuple[str, NDArray[Any]]] = []
        to_stitch: list[str] = []
        for name in names:
            handle = handles[name]
            plan = plans[handle.level]
            if plan.total == 0:
                continue
            if handle.codec is None:
                outputs[name][plan.dest] = handle.array.get_orthogonal_selection((plan.rows,))
                continue
            whole = self.cache.get((name, RESIDENT)) if self.cache.peek((name, RESIDENT)) is not None else None
            if whole is not None:
                resident.append((name, whole))
                continue
            key = (handle.level, handle.codec.block_rows)
            if key not in block_plans:
                block_plans[key] = plan.blocks(handle.codec.block_rows)
            blocks, bounds = block_plans[key]
            for k, block in enumerate(blocks.tolist()):
                jobs.append(_BlockJob(handle, block, plan, int(bounds[k]), int(bounds[k + 1]), None))
            nbytes = handle.codec.row_nbytes * handle.shape[0]
            if blocks.size == handle.codec.n_blocks and nbytes <= self.cache.capacity_bytes // 4:
                to_stitch.append(name)

        def take(item: tuple[str, NDArray[Any]]) -> None:
            name, whole = item
            rows = request_rows(handles[name].level)
            np.take(_rows_view(whole), rows, out=_rows_view(outputs[name]))

        groups = _working_set_groups(jobs, self.working_set_bytes)
        for k, group in enumerate(groups):
            self._gather_group(group, outputs, resident if k == len(groups) - 1 else [], take)
            for job in group:  # release the group's decoded blocks (the cache keeps what fits)
                job.data = job.payloads = None
        if not groups and resident:
            self._gather_group([], outputs, resident, take)
        for name in to_stitch:
            self._stitch(name, [job.block for job in jobs if job.handle.name == name])

    def _gather_group(
        self,
        jobs: list[_BlockJob],
        outputs: dict[str, NDArray[Any]],
        resident: list[tuple[str, NDArray[Any]]],
        take: Callable[[tuple[str, NDArray[Any]]], None],
    ) -> None:
        """Fetch, decode and scatter one group of block jobs (and the resident takes, if any)."""
        for job in jobs:
            job.data = self.cache.get((job.handle.name, job.block))
        missing = [job for job in jobs if job.data is None]
        self._blocks_decoded += len(missing)
        if missing:
            fetched = self._fetch_blocks([(job.handle.codec, job.block) for job in missing])  # type: ignore[misc]
            for job, payloads in zip(missing, fetched, strict=True):
                job.payloads = payloads

        def run(group: list[_BlockJob]) -> None:
            for job in group:
                codec = job.handle.codec
                assert codec is not None
                if job.data is None:
                    job.data = codec.decode_block(job.block, *job.payloads)  # type: ignore[misc]
                    job.payloads = None
                    self.cache.put((job.handle.name, job.block), job.data)
                _scatter(outputs[job.handle.name], job.plan, job.lo, job.hi, job.data, job.block * codec.block_rows)

        rows = sum(job.hi - job.lo for job in jobs) + sum(outputs[name].shape[0] for name, _ in resident)
        if not missing and rows <= INLINE_ROWS:
            run(jobs)  # small and cached: a thread hand-off would cost more than the copies
            for item in resident:
                take(item)
            return
        pool = self._pool()
        tasks = [pool.submit(run, group) for group in _balanced_groups(jobs, self.num_threads * TASKS_PER_THREAD)]
        tasks += [pool.submit(take, item) for item in resident]
        for task in tasks:
            task.result()

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

    def _fetch_blocks(self, blocks: list[tuple[ArrayCodec, int]]) -> list[tuple[list[Any | None], list[str]]]:
        """Fetch every chunk payload of the given row blocks in one concurrent batch (two for shards)."""
        fetcher = self._io_fetcher()
        locations = [codec.chunks_of_block(block) for codec, block in blocks]
        # Sharded arrays: make sure every needed shard index is known, fetching the missing ones together.
        index_requests: dict[tuple[str, str], tuple[ArrayCodec, ByteRequest]] = {}
        for (codec, _), locs in zip(blocks, locations, strict=True):
            if not codec.sharded:
                continue
            for _, loc in locs:
                ikey = (codec.name, loc.key)
                if ikey not in self._shard_indexes and ikey not in index_requests:
                    request = (
                        ByteRequest(loc.key, suffix=codec.index_nbytes)
                        if codec.index_at_end
                        else ByteRequest(loc.key, start=0, stop=codec.index_nbytes)
                    )
                    index_requests[ikey] = (codec, request)
        if index_requests:
            raw = fetcher.fetch([req for _, req in index_requests.values()])
            for (ikey, (codec, _)), payload in zip(index_requests.items(), raw, strict=True):
                if payload is None:
                    self._shard_indexes[ikey] = _missing_index(codec)
                else:
                    self._shard_indexes[ikey] = codec.parse_shard_index(ikey[1], payload)
        requests: list[ByteRequest | None] = []
        for (codec, _), locs in zip(blocks, locations, strict=True):
            for _, loc in locs:
                if not codec.sharded:
                    requests.append(ByteRequest(loc.key))
                    continue
                index = self._shard_indexes[(codec.name, loc.key)]
                span = codec.shard_payload_range(index, loc.inner_index)
                requests.append(None if span is None else ByteRequest(loc.key, start=span[0], stop=span[1]))
        present = [r for r in requests if r is not None]
        fetched = iter(fetcher.fetch(present))
        self._chunks_fetched += len(present)
        result: list[tuple[list[Any | None], list[str]]] = []
        wanted = iter(requests)
        for locs in locations:
            chunk_payloads = [None if next(wanted) is None else next(fetched) for _ in locs]
            result.append((chunk_payloads, [loc.key for _, loc in locs]))
        return result


@dataclass(slots=True)
class _BlockJob:
    """One row block of one array in a read: where its rows go, and its data or payloads."""

    handle: ArrayHandle
    block: int
    plan: LevelPlan
    lo: int
    hi: int
    data: NDArray[Any] | None
    payloads: tuple[list[Any | None], list[str]] | None = None


def _balanced_groups(jobs: list[_BlockJob], n_groups: int) -> list[list[_BlockJob]]:
    """Split jobs into at most ``n_groups`` lists of similar row counts (greedy, largest first)."""
    if len(jobs) <= n_groups:
        return [[job] for job in jobs]
    sizes = np.array([job.hi - job.lo + (job.hi - job.lo if job.data is None else 0) for job in jobs])
    loads = np.zeros(n_groups)
    groups: list[list[_BlockJob]] = [[] for _ in range(n_groups)]
    for i in np.argsort(-sizes, kind="stable").tolist():
        g = int(np.argmin(loads))
        groups[g].append(jobs[i])
        loads[g] += sizes[i]
    return [g for g in groups if g]


def _working_set_groups(jobs: list[_BlockJob], limit: int) -> list[list[_BlockJob]]:
    """Consecutive runs of jobs whose decoded blocks add up to at most ``limit`` bytes (one job at least)."""
    groups: list[list[_BlockJob]] = []
    current: list[_BlockJob] = []
    held = 0
    for job in jobs:
        codec = job.handle.codec
        assert codec is not None
        size = codec.row_nbytes * codec.block_rows
        if current and held + size > limit:
            groups.append(current)
            current, held = [], 0
        current.append(job)
        held += size
    if current:
        groups.append(current)
    return groups


def _missing_index(codec: ArrayCodec) -> NDArray[np.uint64]:
    """Shard index of a shard that does not exist: every inner chunk missing (fill value)."""
    n_inner = int(np.prod(codec.chunks_per_shard))
    return np.full((n_inner, 2), MISSING_CHUNK, dtype=np.uint64)


def _rows_view(arr: NDArray[Any]) -> NDArray[Any]:
    """``arr`` as a 1-D array of opaque rows, so fancy indexing moves each row with one copy."""
    if arr.ndim == 1:
        return arr
    row_bytes = arr.dtype.itemsize * int(np.prod(arr.shape[1:]))
    return arr.reshape(arr.shape[0], -1).view(np.dtype((np.void, row_bytes))).reshape(arr.shape[0])


def _scatter(out: NDArray[Any], plan: LevelPlan, lo: int, hi: int, block: NDArray[Any], first_row: int) -> None:
    """Copy plan rows ``[lo, hi)`` (all inside one block starting at ``first_row``) to their destinations."""
    rows = plan.rows[lo:hi] - first_row
    dest = plan.dest[lo:hi]
    _rows_view(out)[dest] = np.take(_rows_view(block), rows)
