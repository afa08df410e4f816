"""Row planning for a windowed read: which rows of which row blocks go where in the output.

Pure numpy over pointer arrays; no zarr, no I/O. A window of samples (physical indices, in request
order) becomes, per level, the global rows to read sorted by position in the store together with
their destination in the request-ordered output. Sorted rows make every row block a contiguous slice
of the plan, so each block is decoded once and scattered with one fancy-index assignment.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.csr import concat_aranges
from dali_alchemi.store.read.spans import SpanPlan

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.fetch import ByteRequest
    from dali_alchemi.store.read.snapshot import ArrayHandle
    from dali_alchemi.types import CountArray, IndexArray, PtrArray

__all__ = [
    "BlockJob",
    "LevelPlan",
    "Plan",
    "balanced_groups",
    "block_jobs",
    "block_layout",
    "contiguous_groups",
    "every_block",
    "plan_rows",
    "plan_system_rows",
    "reorder_rows",
    "rows_view",
    "scatter",
    "working_set_groups",
]


@dataclass(frozen=True, slots=True)
class LevelPlan:
    """Rows of one level (atom, edge or system) for a window, sorted by row.

    ``rows[k]`` is a global row of the store; ``dest[k]`` its position in the output, which is in
    request order. ``total`` is the output length.
    """

    rows: NDArray[np.int64]
    dest: NDArray[np.int64]
    total: int

    @property
    def dest_rows(self) -> NDArray[np.int64]:
        """Each row's position in the output (:attr:`dest`; the name a span plan shares)."""
        return self.dest

    def blocks(self, block_rows: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Row blocks the plan touches (ascending) and the ``[len + 1]`` bounds of each block's slice."""
        if self.rows.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
        block_of_row = self.rows // block_rows
        change = np.empty(block_of_row.size, dtype=np.bool_)
        change[0] = True
        np.not_equal(block_of_row[1:], block_of_row[:-1], out=change[1:])
        starts = np.flatnonzero(change)
        bounds = np.empty(starts.size + 1, dtype=np.int64)
        bounds[:-1] = starts
        bounds[-1] = block_of_row.size
        return block_of_row[starts], bounds


Plan = LevelPlan | SpanPlan
"""A level's rows for a window: row by row, or as ranges (:mod:`dali_alchemi.store.read.spans`)."""


def plan_rows(ptr: PtrArray, physical: IndexArray, order: IndexArray) -> tuple[LevelPlan, CountArray]:
    """Plan the rows of samples ``physical`` (request order) under CSR pointer ``ptr``.

    ``order`` is a stable argsort of ``physical``. Returns the plan and each sample's row count.
    """
    starts = ptr[physical]
    counts = ptr[physical + 1] - starts
    dest_starts = np.cumsum(counts) - counts
    rows = concat_aranges(starts[order], counts[order])
    dest = concat_aranges(dest_starts[order], counts[order])
    return LevelPlan(rows=rows, dest=dest, total=int(counts.sum())), counts


def plan_system_rows(physical: IndexArray, order: IndexArray) -> LevelPlan:
    """Plan of system-level rows: one row per sample, its physical index."""
    return LevelPlan(rows=physical[order], dest=order.astype(np.int64, copy=False), total=int(physical.size))


@dataclass(slots=True)
class BlockJob:
    """One row block of one array in a read: where its rows go, and its data, payloads or reads."""

    handle: ArrayHandle
    block: int
    plan: Plan
    lo: int
    hi: int
    data: NDArray[Any] | None
    payloads: tuple[list[Any | None], list[str]] | None = None
    requests: tuple[list[ByteRequest | None], list[str]] | None = None  # reads still to do, and chunk keys

    @property
    def rows(self) -> int:
        """Output rows the job fills (its rows, or the rows of its segments)."""
        if isinstance(self.plan, SpanPlan):
            codec = self.handle.codec
            assert codec is not None
            return self.plan.segment_rows(self.lo, self.hi, codec.block_rows)
        return self.hi - self.lo


def block_layout(job: BlockJob) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """Dtype and shape of a job's decoded block."""
    codec = job.handle.codec
    assert codec is not None
    return codec.dtype, codec.block_shape(job.block)


def balanced_groups(jobs: list[BlockJob], n_groups: int) -> list[list[BlockJob]]:
    """Split jobs into at most ``n_groups`` lists of similar row counts (greedy, largest first)."""
    if len(jobs) <= n_groups:
        return [[job] for job in jobs]
    sizes = [job.rows * (1 if job.data is not None else 2) for job in jobs]
    loads = [(0, g) for g in range(n_groups)]  # a heap of (load, group): the lightest group on top
    groups: list[list[BlockJob]] = [[] for _ in range(n_groups)]
    for i in sorted(range(len(jobs)), key=lambda k: -sizes[k]):
        load, g = heapq.heappop(loads)
        groups[g].append(jobs[i])
        heapq.heappush(loads, (load + sizes[i], g))
    return [g for g in groups if g]


def contiguous_groups(jobs: list[BlockJob], n_groups: int) -> list[list[BlockJob]]:
    """Split jobs into at most ``n_groups`` consecutive runs of similar cost, keeping their order.

    A job costs its block's bytes when it must be decoded, plus the bytes of the rows it scatters.
    Consecutive jobs are mostly neighbouring blocks of one array, whose chunks lie side by side in a
    shard, so a run's reads merge into few ``pread`` calls.
    """
    if len(jobs) <= n_groups:
        return [[job] for job in jobs]
    costs = np.empty(len(jobs), dtype=np.int64)
    for k, job in enumerate(jobs):
        codec = job.handle.codec
        assert codec is not None
        costs[k] = (job.rows + (codec.block_rows if job.data is None else 0)) * codec.row_nbytes + 1
    cum = np.cumsum(costs)
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, n_groups) / n_groups, side="right").tolist()
    bounds = [0, *cuts, len(jobs)]
    return [jobs[a:b] for a, b in pairwise(bounds) if b > a]


def working_set_groups(jobs: list[BlockJob], limit: int) -> list[list[BlockJob]]:
    """Consecutive runs of jobs whose decoded blocks add up to at most ``limit`` bytes (one job at least)."""
    groups: list[list[BlockJob]] = []
    current: list[BlockJob] = []
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


_ROW_DTYPES: dict[int, np.dtype[Any]] = {}
"""Opaque row dtypes by row size in bytes (building a ``np.dtype`` costs microseconds; there are few sizes)."""


def rows_view(arr: NDArray[Any]) -> NDArray[Any]:
    """``arr`` as a 1-D array of opaque rows, so fancy indexing moves each row with one copy."""
    if arr.ndim == 1:
        return arr
    n = arr.shape[0]
    row_bytes = arr.dtype.itemsize * math.prod(arr.shape[1:])
    row = _ROW_DTYPES.get(row_bytes)
    if row is None:
        row = _ROW_DTYPES.setdefault(row_bytes, np.dtype((np.void, row_bytes)))
    return arr.reshape(n, math.prod(arr.shape[1:])).view(row).reshape(n)  # no -1: an empty array has no rows to infer


def reorder_rows(arr: NDArray[Any], rows: NDArray[np.int64]) -> NDArray[Any]:
    """``arr[rows]`` along the first axis as a new array, each row moved with one copy (:func:`rows_view`)."""
    return rows_view(arr)[rows].view(arr.dtype).reshape((rows.size, *arr.shape[1:]))


def scatter(
    out: NDArray[Any], plan: Plan, lo: int, hi: int, block: NDArray[Any], first_row: int, block_rows: int
) -> None:
    """Copy the plan's entries ``[lo, hi)`` of one ``block_rows``-row block (starting at row ``first_row``)
    to their destinations: rows of a row plan, segments of a span plan (:meth:`SpanPlan.scatter`)."""
    if isinstance(plan, SpanPlan):
        plan.scatter(out, lo, hi, block, first_row, block_rows)
        return
    rows = plan.rows[lo:hi] - first_row
    rows_view(out)[plan.dest[lo:hi]] = rows_view(block)[rows]


def block_jobs(
    handle: ArrayHandle, plan: Plan, blocks: NDArray[np.int64], bounds: NDArray[np.int64]
) -> list[BlockJob]:
    """One job per row block ``blocks[k]``, for plan entries (rows, or segments) ``bounds[k]:bounds[k + 1]``."""
    return [
        BlockJob(handle, block, plan, int(bounds[k]), int(bounds[k + 1]), None)
        for k, block in enumerate(blocks.tolist())
    ]


def every_block(
    blocks: NDArray[np.int64], bounds: NDArray[np.int64], n_blocks: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """All ``n_blocks`` blocks of an array, with empty row slices for those the read does not need.

    ``blocks``/``bounds`` are a plan's touched blocks and their slices (:meth:`LevelPlan.blocks`);
    a job with an empty slice decodes its block (into the cache) and scatters nothing.
    """
    if blocks.size == n_blocks:
        return blocks, bounds
    every = np.arange(n_blocks, dtype=np.int64)
    starts = np.full(n_blocks + 1, 0, dtype=np.int64)
    starts[blocks] = bounds[:-1]
    starts[n_blocks] = bounds[-1]
    touched = np.zeros(n_blocks + 1, dtype=np.bool_)
    touched[blocks] = True
    touched[n_blocks] = True
    # a block the read skips gets the slice start of the next touched block (an empty slice)
    nxt = np.flatnonzero(touched)
    starts = starts[nxt[np.searchsorted(nxt, np.arange(n_blocks + 1))]]
    return every, starts
