"""Block jobs of span plans from a local store: read, decoded and copied with the least Python per block.

A span plan (:mod:`~dali_alchemi.store.read.spans`) touches runs of neighbouring blocks of each array (a
sequential or block-order window), whose chunks lie side by side in their shards. Each pool task takes
runs of blocks (one task per :data:`THREADS_PER_TASK` threads): one ``pread`` per shard for the chunks
the cache lacks, then per block one decode (:meth:`~dali_alchemi.store.read.codecs.ArrayCodec.decode_block`,
which checks crc32c, lengths and missing chunks as on every other path) into the cache, or straight into
the window where it holds the whole block and the cache could not keep it, and one slice copy per segment.
No byte request, chunk location or job state is built per block. Everything else (other stores, a folder
shared with other processes, chunks split along trailing dims, row plans) goes through the general
decoder (:mod:`~dali_alchemi.store.read.decoder`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.store.read.block_reads import load_shard_indexes
from dali_alchemi.store.read.codecs import MISSING_CHUNK
from dali_alchemi.store.read.decoder import errors_of
from dali_alchemi.store.read.fetch import ByteRequest
from dali_alchemi.store.read.spans import SpanPlan

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.codecs import ArrayCodec
    from dali_alchemi.store.read.decoder import BlockDecoder
    from dali_alchemi.store.read.fetch import LocalFetcher
    from dali_alchemi.store.read.gather import BlockJob
    from dali_alchemi.types import Level, PerLevel

__all__ = ["THREADS_PER_TASK", "decode_span_jobs", "takes_span_job"]


THREADS_PER_TASK = 2
"""Pool threads per task of span blocks (one task, on the calling thread, below four threads). About half
of a block's work here is Python, which holds the GIL: on 2 cores, decode tasks on both pool threads ran a
sequential 16 MiB-cache read at 70-75k structures/s, one task (the raw arrays' reads on the pool beside
it) at 89-97k, as fast as a pool of one thread."""


def takes_span_job(job: BlockJob) -> bool:
    """Whether ``job`` can go this way: a span plan's block of an array whose blocks are single chunks."""
    codec = job.handle.codec
    return isinstance(job.plan, SpanPlan) and codec is not None and codec.one_chunk_blocks


@dataclass(slots=True)
class _Run:
    """Consecutive jobs of one array: their blocks, segment bounds, and decoded blocks (``None``: to read)."""

    name: str
    level: Level
    codec: ArrayCodec
    plan: SpanPlan
    out: NDArray[Any]
    blocks: list[int]
    bounds: list[tuple[int, int]]
    data: list[NDArray[Any] | None]
    ranges: list[tuple[int, int] | None]  # byte range of each block to read in its shard (None: never written)
    stream: bool  # the array outgrows the cache: a block the window covers whole is decoded into it
    direct: set[int] = field(default_factory=set)  # the blocks decoded straight into the output (nothing to copy)


def decode_span_jobs(
    decoder: BlockDecoder,
    fetcher: LocalFetcher,
    jobs: list[BlockJob],
    outputs: dict[str, NDArray[Any]],
    working_set_bytes: int,
    ends: PerLevel[int] | None = None,
) -> list[BlockJob]:
    """Read ``jobs`` (each :func:`takes_span_job`, in array then block order) into ``outputs``.

    Returns the jobs left for the general decoder: all of them when the blocks to decode would hold more
    than ``working_set_bytes`` (that decoder reads them in bounded groups). ``ends``: where a read in store
    order ends, per level: each array's last block is handed on to the next read (``decoder.hand_on``).
    """
    runs: list[_Run] = []
    for name, group in groupby(jobs, key=lambda job: job.handle.name):
        run_jobs = list(group)
        codec = run_jobs[0].handle.codec
        assert codec is not None and isinstance(run_jobs[0].plan, SpanPlan)
        blocks = [job.block for job in run_jobs]
        data = [decoder.carried_block(name, block) for block in blocks]
        data = [decoder.cache.get((name, block)) if d is None else d for block, d in zip(blocks, data, strict=True)]
        stream = codec.row_nbytes * codec.shape[0] > decoder.cache.capacity_bytes
        runs.append(_Run(name, run_jobs[0].handle.level, codec, run_jobs[0].plan, outputs[name], blocks,
                         [(job.lo, job.hi) for job in run_jobs], data, [], stream))  # fmt: skip
    missing = sum(run.codec.block_rows * run.codec.row_nbytes for run in runs for d in run.data if d is None)
    if missing > working_set_bytes:
        return jobs
    for run in runs:
        run.ranges = _byte_ranges(decoder, run)
    decoder.blocks_decoded += sum(d is None for run in runs for d in run.data)
    decoder.chunks_fetched += sum(r is not None for run in runs for d, r in zip(run.data, run.ranges, strict=True) if d is None)
    n_tasks = max(1, decoder.pool.num_threads // THREADS_PER_TASK)
    pieces = _pieces(runs, n_tasks)
    tasks = [pieces[k::n_tasks] for k in range(min(n_tasks, len(pieces)))]
    pool = decoder.pool.executor()  # even one task: this thread waits, so no more threads run than the pool's
    errors = errors_of([pool.submit(_finish_all, decoder, fetcher, task) for task in tasks])
    if errors:
        raise errors[0]
    if ends is not None:
        for run in runs:  # (a block decoded straight into the output is the output's: not handed on)
            last = len(run.blocks) - 1
            block = None if last in run.direct else run.data[last]
            decoder.hand_on(run.name, run.blocks[last], block, ends[run.level], run.codec, working_set_bytes)
    return []


def _byte_ranges(decoder: BlockDecoder, run: _Run) -> list[tuple[int, int] | None]:
    """Where each block of ``run`` the cache lacks lies in its shard (whole files for unsharded arrays)."""
    codec = run.codec
    todo = [k for k, d in enumerate(run.data) if d is None]
    ranges: list[tuple[int, int] | None] = [None] * len(run.blocks)
    if not todo:
        return ranges
    if not codec.sharded:
        for k in todo:
            ranges[k] = (0, -1)  # the whole file
        return ranges
    per_shard = codec.chunks_per_shard[0]
    blocks = np.asarray([run.blocks[k] for k in todo], dtype=np.int64)
    shards = blocks // per_shard
    keys = {int(s): codec.shard_key(int(s)) for s in np.unique(shards).tolist()}
    load_shard_indexes(decoder.pool.fetcher(), [(codec, key) for key in keys.values()], decoder.shard_indexes)
    for shard, key in keys.items():  # once per shard
        mine = np.flatnonzero(shards == shard)
        entries = decoder.shard_indexes[(codec.name, key)][blocks[mine] - shard * per_shard].tolist()
        for at, (offset, nbytes) in zip(mine.tolist(), entries, strict=True):
            if not (offset == MISSING_CHUNK and nbytes == MISSING_CHUNK):
                ranges[todo[at]] = (offset, offset + nbytes)
    return ranges


def _pieces(runs: list[_Run], n_pieces: int) -> list[tuple[_Run, int, int]]:
    """Split the runs into at most about ``n_pieces`` consecutive pieces of similar cost (never across arrays)."""
    costs = [
        [
            run.plan.segment_rows(lo, hi, run.codec.block_rows) + (run.codec.block_rows if d is None else 0)
            for (lo, hi), d in zip(run.bounds, run.data, strict=True)
        ]
        for run in runs
    ]
    total = sum(sum(c) for c in costs) or 1
    target = max(total / n_pieces, 1.0)
    pieces: list[tuple[_Run, int, int]] = []
    for run, cost in zip(runs, costs, strict=True):
        start, held = 0, 0
        for k, c in enumerate(cost):
            held += c
            if held >= target and k + 1 < len(cost):
                pieces.append((run, start, k + 1))
                start, held = k + 1, 0
        pieces.append((run, start, len(cost)))
    return pieces


def _finish_all(decoder: BlockDecoder, fetcher: LocalFetcher, pieces: list[tuple[_Run, int, int]]) -> None:
    """One task: :func:`_finish` each of ``pieces`` in turn."""
    for piece in pieces:
        _finish(decoder, fetcher, *piece)


def _finish(decoder: BlockDecoder, fetcher: LocalFetcher, run: _Run, first: int, stop: int) -> None:
    """One task: read and decode the blocks ``[first, stop)`` of ``run`` the cache lacks, then copy every segment."""
    plan, block_rows = run.plan, run.codec.block_rows
    _read_and_decode(decoder, fetcher, run, [k for k in range(first, stop) if run.data[k] is None])
    for k in range(first, stop):
        lo, hi = run.bounds[k]
        if hi > lo and k not in run.direct:
            data = run.data[k]
            assert data is not None
            plan.scatter(run.out, lo, hi, data, run.blocks[k] * block_rows, block_rows)


def _read_and_decode(decoder: BlockDecoder, fetcher: LocalFetcher, run: _Run, todo: list[int]) -> None:
    """Decode blocks ``todo`` of ``run`` into ``run.data`` and the cache, reading their chunks on this thread
    (neighbouring chunks of a shard with one ``pread``)."""
    codec = run.codec
    keys = [codec.shard_key(run.blocks[k] // codec.chunks_per_shard[0]) for k in todo]
    requests = [
        None if r is None else ByteRequest(key) if r[1] < 0 else ByteRequest(key, r[0], r[1])
        for key, r in zip(keys, (run.ranges[k] for k in todo), strict=True)
    ]
    fetched = iter(fetcher.read([r for r in requests if r is not None]))
    segments = run.plan.segments(codec.block_rows) if run.stream else None
    for k, key, request in zip(todo, keys, requests, strict=True):
        payload = None if request is None else next(fetched)
        lo, hi = run.bounds[k]
        if segments is not None and hi == lo + 1 and segments.rows_before[hi] - segments.rows_before[lo] == codec.block_rows:
            # the window holds the whole block, and the cache could not keep it for a later pass: no copy
            dest = int(segments.dest[lo])
            run.data[k] = codec.decode_block_into(run.blocks[k], payload, key, run.out[dest : dest + codec.block_rows])
            run.direct.add(k)
            continue
        data = codec.decode_block(run.blocks[k], [payload], [key])
        decoder.cache.put((run.name, run.blocks[k]), data)
        run.data[k] = data
