"""Span planning for a windowed read: the window's rows as a few ranges, not one entry per row.

A sequential window, or a block-order window of spans, is a few runs of consecutive samples, so each
level's rows are a few ranges of consecutive rows. :class:`SpanPlan` keeps them as ranges: split at
the row blocks of a chunking, they become *segments* (a block, the rows of it to copy, and where they go
in the output), one or two per block touched. Reading a segment is then one slice copy, and planning
costs per block, not per row, which is what lets a read that misses the cache run near the codec's speed
(a row plan, :class:`~dali_alchemi.store.read.gather.LevelPlan`, spends more on its index arrays than
the decode). A window whose samples are a few runs in shuffled order (a block shuffle's buffer) is read by spans
in store order and put in request order with one take per array. A window that samples a few stretches
of the store densely (a block shuffle's window, which takes part of a buffer of spans) is read as the
runs that cover those stretches, through the short gaps between its samples, and its own rows are then
taken from them with the same one take per array: a few long ranges cost less than hundreds of short
ones, whose per-run planning and copies cost more than the rows read through. A window of scattered
samples (a full shuffle) keeps the row plan.

Pure numpy over pointer arrays; no zarr, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.csr import concat_aranges

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import IndexArray, Level, PerLevel, PtrArray

__all__ = [
    "MAX_GAP",
    "MAX_OVER_READ",
    "MIN_MEAN_RUN",
    "Segments",
    "SpanPlan",
    "blocks_holding",
    "covering_runs",
    "rows_in_request_order",
    "sample_runs",
]


MIN_MEAN_RUN = 8
"""Samples per run, on average, from which a window is read by spans: below it (a full shuffle's
scattered samples) the per-segment copies cost more than one fancy-index take per block."""


def sample_runs(physical: IndexArray) -> tuple[NDArray[np.int64], NDArray[np.int64]] | None:
    """Runs of consecutive samples in ``physical`` (distinct, request order): ``(first, stop)`` per run.

    ``None`` when there are several runs, shorter than :data:`MIN_MEAN_RUN` samples on average (one run,
    however short, is one range per array).
    """
    if physical.size == 0:
        return None
    breaks = np.flatnonzero(np.diff(physical) != 1) + 1
    if breaks.size and (breaks.size + 1) * MIN_MEAN_RUN > physical.size:
        return None
    first = physical[np.concatenate(([0], breaks))]
    last = physical[np.concatenate((breaks - 1, [physical.size - 1]))]
    return first.astype(np.int64, copy=False), last.astype(np.int64) + 1


MAX_GAP = 32
"""Samples between two requested ones that a covering run reads through (:func:`covering_runs`)."""

MAX_OVER_READ = 4
"""At most this many samples covered per sample requested (:func:`covering_runs`)."""


def covering_runs(ordered: IndexArray) -> tuple[NDArray[np.int64], NDArray[np.int64]] | None:
    """Runs of consecutive samples that cover ``ordered`` (distinct samples, ascending): ``(first, stop)`` per run.

    A run goes on through gaps of up to :data:`MAX_GAP` samples between requested ones, so samples
    that lie densely in a few stretches of the store are covered by a few runs. ``None`` when the runs
    would cover more than :data:`MAX_OVER_READ` samples per sample requested, or are still shorter than
    :data:`MIN_MEAN_RUN` on average: the window is then read row by row. Samples that are already runs
    are covered by exactly those runs.
    """
    if ordered.size == 0:
        return None
    breaks = np.flatnonzero(np.diff(ordered) > MAX_GAP + 1) + 1
    first = ordered[np.concatenate(([0], breaks))].astype(np.int64, copy=False)
    stop = ordered[np.concatenate((breaks - 1, [ordered.size - 1]))].astype(np.int64) + 1
    covered = int((stop - first).sum())
    if covered > MAX_OVER_READ * ordered.size or first.size * MIN_MEAN_RUN > max(covered, MIN_MEAN_RUN):
        return None
    return first, stop


def rows_in_request_order(
    first: NDArray[np.int64], stop: NDArray[np.int64], physical: IndexArray, ptr: PtrArray | None
) -> NDArray[np.int64]:
    """Where each row of the samples ``physical`` (request order) lies in a read of runs ``[first[k], stop[k])``.

    The runs (ascending, disjoint, covering every sample of ``physical``) were read in store order, one
    after the other, each sample's rows as CSR pointer ``ptr`` gives them (``None``: one row per sample).
    Returns, for each output row in request order, its row in that read.
    """
    run = np.searchsorted(first, physical, side="right") - 1
    if ptr is None:
        run_rows = stop - first
        sample_start, counts = physical, np.ones(physical.size, dtype=np.int64)
        run_start = first
    else:
        run_start, run_rows = ptr[first], ptr[stop] - ptr[first]
        sample_start, counts = ptr[physical], ptr[physical + 1] - ptr[physical]
    before = np.cumsum(run_rows) - run_rows
    return concat_aranges(before[run] + (sample_start - run_start[run]), counts)


@dataclass(frozen=True, slots=True)
class Segments:
    """A span plan split at the row blocks of one chunking: segment ``k`` copies rows
    ``[start[k], start[k] + count[k])`` of the store, all in block ``block[k]``, to output rows from ``dest[k]``.

    Segments are sorted by ``start``, so each block's are consecutive (at most one per run).
    """

    block: NDArray[np.int64]
    start: NDArray[np.int64]
    count: NDArray[np.int64]
    dest: NDArray[np.int64]
    rows_before: list[int]
    """``[len + 1]`` rows of the segments before segment ``k`` (Python ints: read once per block job)."""
    _files: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict, compare=False, repr=False)

    def files(self, blocks_per_file: int) -> tuple[list[int], list[int]]:
        """The files the segments lie in (``blocks_per_file`` blocks each, ascending), and the ``[len + 1]``
        bounds of each file's segments (computed once per file size)."""
        found = self._files.get(blocks_per_file)
        if found is None:
            file_of = self.block // blocks_per_file
            bounds = [*np.flatnonzero(np.diff(file_of, prepend=-1)).tolist(), int(file_of.size)]
            found = self._files.setdefault(blocks_per_file, (file_of[bounds[:-1]].tolist(), bounds))
        return found


@dataclass(frozen=True, slots=True)
class SpanPlan:
    """Rows of one level for a window, as ranges sorted by their first row.

    Range ``k`` is the store's rows ``[starts[k], stops[k])``, going to output rows from ``dest[k]``
    (the output is in request order). ``total`` is the output length. ``rows`` and ``dest_rows`` give the
    same plan row by row, for the routes that read rows one by one (arrays read through zarr).
    """

    starts: NDArray[np.int64]
    stops: NDArray[np.int64]
    dest: NDArray[np.int64]
    total: int
    _segments: dict[int, Segments] = field(default_factory=dict, compare=False, repr=False)
    _rows: list[NDArray[np.int64]] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def of(cls, first: NDArray[np.int64], stop: NDArray[np.int64], ptr: PtrArray | None) -> SpanPlan:
        """The plan of sample runs ``[first[k], stop[k])`` (request order) under CSR pointer ``ptr``.

        ``ptr=None`` plans system-level rows: one row per sample.
        """
        starts, stops = (first, stop) if ptr is None else (ptr[first], ptr[stop])
        counts = stops - starts
        dest = np.cumsum(counts) - counts
        order = np.argsort(starts, kind="stable")
        return cls(starts=starts[order], stops=stops[order], dest=dest[order], total=int(counts.sum()))

    @property
    def rows(self) -> NDArray[np.int64]:
        """Every row of the plan, ascending (computed once)."""
        if not self._rows:
            self._rows.append(concat_aranges(self.starts, self.stops - self.starts))
            self._rows.append(concat_aranges(self.dest, self.stops - self.starts))
        return self._rows[0]

    @property
    def dest_rows(self) -> NDArray[np.int64]:
        """Each row of :attr:`rows`' position in the output."""
        self.rows  # noqa: B018  # computes both
        return self._rows[1]

    def segments(self, block_rows: int) -> Segments:
        """The plan split at every ``block_rows``-row block (computed once per chunking)."""
        found = self._segments.get(block_rows)
        if found is not None:
            return found
        nonempty = self.stops > self.starts
        starts, stops, dest = self.starts[nonempty], self.stops[nonempty], self.dest[nonempty]
        first_block, last_block = starts // block_rows, (stops - 1) // block_rows
        per_run = last_block - first_block + 1
        block = concat_aranges(first_block, per_run)
        run = np.repeat(np.arange(starts.size), per_run)
        start = np.maximum(starts[run], block * block_rows)
        stop = np.minimum(stops[run], (block + 1) * block_rows)
        count = stop - start
        rows_before = [0, *np.cumsum(count).tolist()]
        found = Segments(
            block=block, start=start, count=count, dest=(dest[run] + (start - starts[run])).astype(np.int64), rows_before=rows_before
        )
        return self._segments.setdefault(block_rows, found)

    def blocks(self, block_rows: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Row blocks the plan touches (ascending) and the ``[len + 1]`` bounds of each block's segments."""
        block = self.segments(block_rows).block
        if block.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
        change = np.empty(block.size, dtype=np.bool_)
        change[0] = True
        np.not_equal(block[1:], block[:-1], out=change[1:])
        starts = np.flatnonzero(change)
        return block[starts], np.append(starts, block.size).astype(np.int64, copy=False)

    def segment_rows(self, lo: int, hi: int, block_rows: int) -> int:
        """Rows that segments ``[lo, hi)`` of the ``block_rows`` chunking copy."""
        rows_before = self.segments(block_rows).rows_before
        return rows_before[hi] - rows_before[lo]

    def scatter(self, out: NDArray[Any], lo: int, hi: int, data: NDArray[Any], first_row: int, block_rows: int) -> None:
        """Copy segments ``[lo, hi)`` of the ``block_rows`` chunking (all in one block, whose first row is
        ``first_row``) from the block ``data`` to their places in ``out``."""
        seg = self.segments(block_rows)
        for start, count, dest in zip(
            seg.start[lo:hi].tolist(), seg.count[lo:hi].tolist(), seg.dest[lo:hi].tolist(), strict=True
        ):  # one or two per block
            out[dest : dest + count] = data[start - first_row : start - first_row + count]

    def take(self, out: NDArray[Any], whole: NDArray[Any]) -> None:
        """Copy the plan's rows of an array held whole into ``out``: one slice per range."""
        for start, stop, dest in zip(self.starts.tolist(), self.stops.tolist(), self.dest.tolist(), strict=True):
            out[dest : dest + stop - start] = whole[start:stop]


def blocks_holding(
    starts: PerLevel[NDArray[np.int64]], counts: PerLevel[NDArray[np.int64] | None]
) -> Callable[[Level, int], list[int]]:
    """For a window whose samples' rows start at ``starts`` with ``counts`` rows each (``None``: one), the
    ``block_rows``-row blocks of a level that hold those rows, ascending (computed once per chunking)."""
    found: dict[tuple[Level, int], list[int]] = {}

    def blocks(level: Level, block_rows: int) -> list[int]:
        key = (level, block_rows)
        if key not in found:
            first, count = starts[level], counts[level]
            if count is None:
                held = np.unique(first // block_rows)
            else:
                first, count = first[count > 0], count[count > 0]
                lo, hi = first // block_rows, (first + count - 1) // block_rows
                held = np.unique(concat_aranges(lo, hi - lo + 1))
            found[key] = held.tolist()
        return found[key]

    return blocks
