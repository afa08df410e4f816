"""The chunk-block engine: read the rows of a window from a snapshot's arrays, block by block.

A window of a few runs of samples from a local store (a read in store order, or the runs that cover a
block-order window) is read the lean way first (:mod:`dali_alchemi.store.read.contiguous`: a range per
run and array, no plan per block, the raw arrays' files kept open from read to read by
:mod:`dali_alchemi.store.read.open_files`); what that leaves goes the general way below.

For each level the window's rows are planned: as ranges when the window is a few runs of consecutive
samples (:mod:`dali_alchemi.store.read.spans`: a sequential or block-order window), else row by row
(:mod:`dali_alchemi.store.read.gather`: a shuffled window). Each array is routed
(:mod:`dali_alchemi.store.read.routes`) to the way its rows are read: through zarr (arrays the engine
cannot decode), in place (:mod:`dali_alchemi.store.read.rows`: uncompressed arrays of a local store too
big for the cache), with one take from an array held whole ("resident"), or block by block. Every row
block the plan touches is then fetched and decoded at most once per call by the decoder
(:mod:`dali_alchemi.store.read.decoder`, which owns the cache and the thread pool), in groups that bound
the decoded bytes one read holds; the blocks of a span plan from a local store go a leaner way
(:mod:`dali_alchemi.store.read.span_blocks`) when they fit that bound. An array that fits in a quarter
of the cache is read whole once reads have touched a quarter of its blocks, and kept whole: later reads
take its rows with one take.

Threads do not survive ``fork`` (DALI's default worker start), so the pool and its fetcher are rebuilt in
a new process (:mod:`dali_alchemi.store.read.pool`). Reconnecting to a non-local store after a fork is the
reader's job: it owns the store argument, and hands the engine the snapshot it reopened.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.storage import LocalStore

from dali_alchemi.csr import concat_aranges
from dali_alchemi.errors import ConfigError
from dali_alchemi.store.read.cache import CacheStats
from dali_alchemi.store.read.compressed import CompressedWindow, KeptBlocks, compressed_window
from dali_alchemi.store.read.contiguous import RunReader
from dali_alchemi.store.read.decoder import INLINE_ROWS, BlockDecoder, errors_of
from dali_alchemi.store.read.fetch import LocalFetcher
from dali_alchemi.store.read.gather import (
    Plan,
    block_jobs,
    plan_rows,
    plan_system_rows,
    reorder_rows,
    rows_view,
    working_set_groups,
)
from dali_alchemi.store.read.open_files import OpenFiles
from dali_alchemi.store.read.results import ReadStats, RowsRead
from dali_alchemi.store.read.routes import Router
from dali_alchemi.store.read.rows import RowReader, reads_rows
from dali_alchemi.store.read.scratch import ScratchRows
from dali_alchemi.store.read.snapshot import read_through_zarr
from dali_alchemi.store.read.span_blocks import decode_span_jobs, takes_span_job
from dali_alchemi.store.read.spans import SpanPlan, blocks_holding, covering_runs, rows_in_request_order, sample_runs
from dali_alchemi.types import PerLevel

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.cache import BlockCache
    from dali_alchemi.store.read.codecs import ArrayCodec
    from dali_alchemi.store.read.routes import Routes
    from dali_alchemi.store.read.shared import SharedBlocks
    from dali_alchemi.store.read.snapshot import ArrayHandle, Snapshot
    from dali_alchemi.types import IndexArray, Level, PtrArray

__all__ = ["DEFAULT_WORKING_SET_BYTES", "BlockEngine", "ReadStats", "RowsRead", "default_threads"]


MIN_THREADS, MAX_THREADS = 2, 8
"""Bounds of the default thread count (the core count): decoding overlaps I/O even on one core, and
more than 8 threads only contend for memory bandwidth."""

DEFAULT_WORKING_SET_BYTES = 64 << 20
"""Decoded bytes one read holds beyond the cache, by default (at least one row block): reads that touch
more blocks than this decode them in groups, so a window never decodes the whole store at once."""


def default_threads() -> int:
    """The default thread count: the core count, clamped to ``MIN_THREADS .. MAX_THREADS``."""
    return max(MIN_THREADS, min(MAX_THREADS, os.cpu_count() or MIN_THREADS))


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
        A folder of decoded blocks shared with other processes (:mod:`dali_alchemi.store.read.shared`): a block
        another process published is mapped, not decoded, one it is decoding waited for, and blocks decoded
        here published. ``None``: this process's cache only.
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
        self.working_set_bytes = working_set_bytes or DEFAULT_WORKING_SET_BYTES
        self.num_threads = num_threads or default_threads()
        self.decoder = BlockDecoder(
            cache_bytes=cache_bytes, num_threads=self.num_threads, max_concurrency=max_concurrency, shared=shared
        )
        self._snapshot: Snapshot | None = None
        self._verified: dict[str, NDArray[np.bool_]] = {}
        self._in_place = False
        self._files_read = 0
        self._files_mapped = 0
        self._packed_reads = 0
        self._samples_read = 0
        self._router = Router(self.decoder)
        self._scratch = ScratchRows()  # the rows of covering runs, kept from window to window
        self._open_files: OpenFiles | None = None  # the raw arrays' files, kept open from read to read
        # Checked LZ4 blocks for the GPU's inflate, within a quarter of the cache budget (they are compressed).
        self._kept_blocks = KeptBlocks(self.cache.capacity_bytes // 4)

    @property
    def cache(self) -> BlockCache:
        """The decoded-block cache (the decoder's)."""
        return self.decoder.cache

    # -- state --------------------------------------------------------------------------------------
    def attach(self, snapshot: Snapshot) -> None:
        """Read from ``snapshot`` from now on: drop the blocks, shard indexes and fetcher of the last one."""
        self._snapshot = snapshot
        self.decoder.attach(snapshot)
        self._router.reset()
        self._kept_blocks.clear()
        self._verified = {}
        if self._open_files is not None:
            self._open_files.invalidate()
        raw = [h.codec for h in snapshot.handles.values() if h.codec is not None and reads_rows(h.codec)]
        raw_bytes = sum(codec.row_nbytes * codec.shape[0] for codec in raw)
        self._in_place = isinstance(snapshot.location.store, LocalStore) and raw_bytes > self.cache.capacity_bytes // 2

    def holds_shard_indexes(self) -> bool:
        """Whether shard indexes are cached (an append rewrites the last shard's, so they may be stale)."""
        return bool(self.decoder.shard_indexes)

    def stats(self) -> ReadStats:
        """Counters of packed reads, samples, chunk payloads fetched and cache behaviour so far."""
        return ReadStats(
            packed_reads=self._packed_reads,
            samples_read=self._samples_read,
            chunks_fetched=self.decoder.chunks_fetched,
            blocks_decoded=self.decoder.blocks_decoded,
            files_read=self._files_read,
            files_mapped=self._files_mapped,
            cache=CacheStats(**{f.name: getattr(self.cache.stats, f.name) for f in fields(CacheStats)}),
        )

    def close(self) -> None:
        """Drop the cache, close the files kept open and stop this process's threads."""
        self.decoder.close()
        if self._open_files is not None:
            self._open_files.close()

    def reads_in_place(self, handle: ArrayHandle) -> bool:
        """Whether ``handle``'s rows are read in place instead of through the cache.

        They are for an uncompressed array of a local directory store, once the store's uncompressed
        arrays would fill more than half the cache: below that, keeping their blocks (or whole arrays)
        decoded in the cache is faster still (docs/bigger-than-memory.md).
        """
        return self._in_place and handle.codec is not None and reads_rows(handle.codec)

    # -- reading ------------------------------------------------------------------------------------
    def read(
        self,
        snapshot: Snapshot,
        physical: IndexArray,
        names: Sequence[str],
        *,
        pointers_read: Callable[[], None] | None = None,
    ) -> RowsRead:
        """Rows of distinct ``physical`` samples (request order) of arrays ``names``, one array each.

        Atom-index fields come back as stored (store-global); the caller re-bases them.
        ``pointers_read`` is called once the snapshot's pointers are no longer looked at, before any
        chunk is read (the reader then lets go of the pointer pages it mapped).
        """
        if snapshot is not self._snapshot:
            self.attach(snapshot)
        handles = snapshot.handles
        atoms_ptr, edges_ptr = snapshot.atoms_ptr, snapshot.edges_ptr
        atom_starts, edge_starts = atoms_ptr[physical], edges_ptr[physical]
        n_atoms, n_edges = atoms_ptr[physical + 1] - atom_starts, edges_ptr[physical + 1] - edge_starts
        runs, order = sample_runs(physical), None
        if runs is None:  # shuffled: maybe dense in a few stretches (a block shuffle's window), read sorted
            order = np.argsort(physical, kind="stable")
            runs = covering_runs(physical[order])
        plans: PerLevel[Plan]
        if runs is not None:  # a few runs of consecutive samples: planned by ranges, copied by slices
            plans = PerLevel(
                atom=SpanPlan.of(*runs, atoms_ptr), edge=SpanPlan.of(*runs, edges_ptr), system=SpanPlan.of(*runs, None)
            )
        else:
            assert order is not None
            plans = PerLevel(
                atom=plan_rows(atoms_ptr, physical, order)[0],
                edge=plan_rows(edges_ptr, physical, order)[0],
                system=plan_system_rows(physical, order),
            )
        if pointers_read is not None:
            pointers_read()
        covered = runs is not None and order is not None  # rows read in store order, then taken from
        with self._scratch.lend() if covered else nullcontext() as scratch:
            outputs: dict[str, NDArray[Any]] = {}
            for name in names:
                handle = handles[name]
                shape = (plans[handle.level].total, *handle.shape[1:])
                outputs[name] = (
                    np.empty(shape, handle.dtype) if scratch is None else scratch.empty(name, shape, handle.dtype)
                )

            def request_rows(level: Level) -> NDArray[np.int64]:
                if level == "atom":
                    return concat_aranges(atom_starts, n_atoms)
                if level == "edge":
                    return concat_aranges(edge_starts, n_edges)
                return physical

            left = names
            if runs is not None:  # a few runs (in store order, or covering the window): the lean way first
                starts = PerLevel(atom=atom_starts, edge=edge_starts, system=physical)
                counts = PerLevel(atom=n_atoms, edge=n_edges, system=None)
                wanted = None if order is None else blocks_holding(starts, counts)
                left = self._read_runs(snapshot, names, *runs, outputs, wanted)
            last = None if runs is None or order is not None else int(runs[1][-1])  # in store order: where it ends
            ends = None if last is None else PerLevel(atom=int(atoms_ptr[last]), edge=int(edges_ptr[last]), system=last)
            self._gather(handles, left, plans, outputs, request_rows, ends)
            if covered:  # runs read in store order: one take per array, the window's rows (out of the scratch)
                assert runs is not None
                pointers: PerLevel[PtrArray | None] = PerLevel(atom=atoms_ptr, edge=edges_ptr, system=None)
                positions: dict[Level, NDArray[np.int64]] = {}
                for name in names:
                    level = handles[name].level
                    if level not in positions:
                        positions[level] = rows_in_request_order(*runs, physical, pointers[level])
                    outputs[name] = reorder_rows(outputs[name], positions[level])
        self._packed_reads += 1
        self._samples_read += int(physical.size)
        return RowsRead(fields=outputs, n_atoms=n_atoms, n_edges=n_edges, atom_starts=atom_starts)

    def read_compressed(self, snapshot: Snapshot, physical: IndexArray, names: tuple[str, ...]) -> CompressedWindow:
        """The chunks holding the rows of ``physical`` of arrays ``names``, as raw LZ4 blocks for DALI's GPU
        inflate (:func:`~dali_alchemi.store.read.compressed.compressed_window`): fetched, never decoded."""
        if snapshot is not self._snapshot:
            self.attach(snapshot)
        fetcher = self.decoder.pool.fetcher()
        window = compressed_window(snapshot, physical, names, fetcher, self.decoder.shard_indexes, self._kept_blocks)
        self._packed_reads += 1
        self._samples_read += int(physical.size)
        return window

    def _gather(
        self,
        handles: Mapping[str, ArrayHandle],
        names: Sequence[str],
        plans: PerLevel[Plan],
        outputs: dict[str, NDArray[Any]],
        request_rows: Callable[[Level], NDArray[np.int64]],
        ends: PerLevel[int] | None = None,
    ) -> None:
        """Fill ``outputs``: route each array, then read the routes in place, whole, and block by block.

        Arrays held whole in the cache (*resident*) are read with one take in request order. The other
        arrays' block jobs are decoded in groups of about ``working_set_bytes``
        (:func:`~dali_alchemi.store.read.gather.working_set_groups`): each group's missing blocks are
        fetched, then decoded and scattered on the thread pool (each block's rows go to disjoint output rows),
        and the group is released before the next begins. So one read holds at most the cache plus one
        group of decoded blocks, however many blocks of the store it touches. An array that fits in a
        quarter of the cache, once reads have touched a quarter of its blocks, is read whole and kept
        as one resident array for later calls (:mod:`~dali_alchemi.store.read.routes` decides). ``ends``: where a
        read in store order ends, per level; the last block of each array is handed on to the next read.
        """
        if not names:  # the lean reads took every array (a window in store order)
            return
        in_place = self._row_reader()
        routes = self._router.route(handles, names, plans, in_place is not None)
        for handle, plan in routes.through_zarr:
            outputs[handle.name][plan.dest_rows] = read_through_zarr(handle, plan.rows)

        def take(item: tuple[str, NDArray[Any]]) -> None:
            name, whole = item
            plan = plans[handles[name].level]
            if isinstance(plan, SpanPlan):
                plan.take(outputs[name], whole)
                return
            rows = request_rows(handles[name].level)
            np.take(rows_view(whole), rows, out=rows_view(outputs[name]))

        reading: list[Future[None]] = []
        if routes.in_place:
            assert in_place is not None
            reading = self._read_in_place(in_place, routes.in_place, outputs)
        try:
            self._read_whole(routes)
            self._read_blocks(routes, outputs, take, ends)
        finally:  # the rows read in place, on the pool beside the blocks, are in before anything returns
            errors = errors_of(reading)
        if errors:
            raise errors[0]
        if in_place is not None:
            self._files_read += in_place.files_read
            self._files_mapped += in_place.files_mapped

    def _read_in_place(
        self, reader: RowReader, arrays: list[tuple[str, ArrayCodec, Plan]], outputs: dict[str, NDArray[Any]]
    ) -> list[Future[None]]:
        """Read the rows of uncompressed arrays in place: on this thread when they are few, else one array
        per pool task, returned unfinished so that the blocks are decoded on the pool meanwhile."""
        for _, codec, plan in arrays:  # every array's rows located, and shard indexes read, before the first read
            if isinstance(plan, SpanPlan):
                reader.prepare_spans(codec, plan.segments(codec.block_rows))
            else:
                reader.prepare(codec, plan.rows)

        def read(item: tuple[str, ArrayCodec, Plan]) -> None:
            name, codec, plan = item
            if isinstance(plan, SpanPlan):
                reader.read_spans(codec, plan.segments(codec.block_rows), outputs[name])
                return
            rows_view(outputs[name])[plan.dest] = rows_view(reader.read(codec, plan.rows))

        if len(arrays) == 1 or sum(plan.total for _, _, plan in arrays) <= INLINE_ROWS:
            for item in arrays:
                read(item)
            return []
        pool = self.decoder.pool.executor()
        return [pool.submit(read, item) for item in arrays]

    def _read_whole(self, routes: Routes) -> None:
        """Read the arrays routed whole, now resident; one with a bad chunk is read by its blocks from now on."""
        wholes = self.decoder.read_whole([handle for handle, *_ in routes.whole])
        for (handle, plan, blocks, bounds), whole in zip(routes.whole, wholes, strict=True):
            if whole is None:  # a chunk of it is bad: read the blocks asked for, which may be fine
                self._router.not_whole(handle.name)
                routes.jobs += block_jobs(handle, plan, blocks, bounds)
            else:
                routes.resident.append((handle.name, whole))

    def _read_blocks(
        self,
        routes: Routes,
        outputs: dict[str, NDArray[Any]],
        take: Callable[[tuple[str, NDArray[Any]]], None],
        ends: PerLevel[int] | None,
    ) -> None:
        """Decode the block jobs group by group (the resident takes with the last), then stitch what was read whole.

        The blocks of span plans from a local store go the lean way (:mod:`~dali_alchemi.store.read.span_blocks`)
        when they fit the working set; the rest through the decoder's groups.
        """
        jobs = routes.jobs
        fetcher = self.decoder.pool.fetcher() if jobs else None
        if isinstance(fetcher, LocalFetcher) and not self.decoder.shares_blocks:
            spans = [job for job in jobs if takes_span_job(job)]
            if spans:
                left = decode_span_jobs(self.decoder, fetcher, spans, outputs, self.working_set_bytes, ends)
                jobs = left + [job for job in jobs if not takes_span_job(job)]
        groups = working_set_groups(jobs, self.working_set_bytes)
        last: dict[str, tuple[int, NDArray[Any] | None, ArrayHandle]] = {}  # each array's last block, in store order
        for k, group in enumerate(groups):
            self.decoder.decode_group(group, outputs, routes.resident if k == len(groups) - 1 else [], take)
            for job in group if ends is not None else ():
                if job.block >= last.get(job.handle.name, (-1,))[0]:
                    last[job.handle.name] = (job.block, job.data, job.handle)
            for job in group:  # release the group's decoded blocks (the cache keeps what fits)
                job.data = job.payloads = None
        for name, (block, data, handle) in last.items():
            assert ends is not None and handle.codec is not None
            self.decoder.hand_on(name, block, data, ends[handle.level], handle.codec, self.working_set_bytes)
        if not groups and routes.resident:
            self.decoder.decode_group([], outputs, routes.resident, take)
        for name in routes.to_stitch:
            self.decoder.stitch(name, [job.block for job in routes.jobs if job.handle.name == name])

    def _read_runs(
        self,
        snapshot: Snapshot,
        names: Sequence[str],
        first: NDArray[np.int64],
        stop: NDArray[np.int64],
        outputs: dict[str, NDArray[Any]],
        wanted_blocks: Callable[[Level, int], list[int]] | None,
    ) -> Sequence[str]:
        """Read sample runs ``[first[k], stop[k])`` one after the other the lean way (:mod:`.contiguous`); returns
        the names left to :meth:`_gather`. ``wanted_blocks``: ``None`` for runs that are the window in store
        order, else (runs covering a shuffled window) the blocks holding the window's rows, per level and chunking."""
        fetcher = self.decoder.pool.fetcher()
        if not isinstance(fetcher, LocalFetcher) or self.decoder.shares_blocks:
            return names
        if self._open_files is None or self._open_files.root != fetcher.root:
            self._open_files = OpenFiles(fetcher.root)
        reader = RunReader(
            self.decoder, fetcher, self._router, self._in_place, self._verified, self.working_set_bytes,
            in_store_order=wanted_blocks is None, files=self._open_files,
        )  # fmt: skip
        atoms_ptr, edges_ptr = snapshot.atoms_ptr, snapshot.edges_ptr
        bounds: dict[Level, tuple[NDArray[np.int64], NDArray[np.int64]]] = {
            "atom": (atoms_ptr[first], atoms_ptr[stop]),
            "edge": (edges_ptr[first], edges_ptr[stop]),
            "system": (first, stop),
        }
        try:
            return reader.read(snapshot.handles, names, bounds, outputs, wanted_blocks)
        finally:
            self._files_read += reader.files_read

    def _row_reader(self) -> RowReader | None:
        """A reader of uncompressed rows in place, when this store's are read so (``None`` otherwise)."""
        if not self._in_place:
            return None
        assert self._snapshot is not None
        store = self._snapshot.location.store
        assert isinstance(store, LocalStore)
        return RowReader(Path(store.root), self.decoder.pool.fetcher(), self.decoder.shard_indexes, self._verified)
