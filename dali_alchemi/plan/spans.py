"""Spans, the units of the block shuffle: runs of consecutive structures aligned with the store's row
blocks, where they come from (:func:`store_chunking`), how they are checked and cut, and the block
order built from them (spans shuffled, then the structures of each buffer of spans).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.csr import concat_aranges, exclusive_cumsum
from dali_alchemi.errors import PlanError
from dali_alchemi.store.format.protocol import ChunkedReader
from dali_alchemi.store.read.cache import DEFAULT_CACHE_BYTES

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.format.protocol import PackedReader
    from dali_alchemi.types import IndexArray

__all__ = [
    "BUFFER_CACHE_FRACTION",
    "KeyedBlockOrder",
    "StoreChunking",
    "block_order",
    "check_span_bounds",
    "default_buffer_spans",
    "fixed_spans",
    "local_spans",
    "store_chunking",
]


BUFFER_CACHE_FRACTION = 0.5
"""Share of the decoded-chunk cache one buffer's structures may fill by default: the other half holds
the start of the next buffer (a window can straddle two) and the small arrays the reader keeps whole."""


@dataclass(frozen=True, slots=True)
class StoreChunking:
    """What the block shuffle's default sizes come from: the reader's chunk spans, bytes and cache.

    ``span_bounds`` is ``None`` for a reader without :class:`~dali_alchemi.store.format.protocol.ChunkedReader`;
    ``atom_bytes``/``edge_bytes``/``system_bytes`` are the decoded bytes of one row of each level over
    the fields read.
    """

    span_bounds: IndexArray | None
    atom_bytes: int
    edge_bytes: int
    system_bytes: int
    cache_bytes: int


def store_chunking(reader: PackedReader, fields: Sequence[str]) -> StoreChunking:
    """The :class:`StoreChunking` of ``reader`` when reading ``fields`` (pointers and metadata only)."""
    specs = reader.field_specs
    row = {
        level: sum(specs[f].row_nbytes for f in fields if specs[f].level == level)
        for level in ("atom", "edge", "system")
    }
    if isinstance(reader, ChunkedReader):
        bounds: IndexArray | None = np.asarray(reader.sample_chunk_bounds(), dtype=np.int64)
        cache = int(reader.cache_bytes)
    else:
        bounds, cache = None, DEFAULT_CACHE_BYTES
    return StoreChunking(
        span_bounds=bounds,
        atom_bytes=row["atom"],
        edge_bytes=row["edge"],
        system_bytes=row["system"],
        cache_bytes=cache,
    )


def check_span_bounds(bounds: NDArray[Any], num_samples: int) -> IndexArray:
    """``bounds`` as int64 span offsets, checked: 1-D, from 0 to ``num_samples``, strictly increasing.

    Raises
    ------
    PlanError
        Naming what is wrong.
    """
    b = np.asarray(bounds)
    if b.ndim != 1 or b.size < 1 or (b.size and not np.issubdtype(b.dtype, np.integer)):
        raise PlanError(f"span bounds must be a 1-D integer array, got shape {b.shape} and dtype {b.dtype}")
    b = b.astype(np.int64)
    if int(b[0]) != 0 or int(b[-1]) != num_samples:
        raise PlanError(f"span bounds must run from 0 to the {num_samples} samples, got {int(b[0])} .. {int(b[-1])}")
    steps = np.diff(b)
    if steps.size and int(steps.min()) < 1:
        bad = int(np.argmax(steps < 1))
        raise PlanError(f"span bounds must increase strictly: span {bad} is [{int(b[bad])}, {int(b[bad + 1])})")
    return b


def fixed_spans(num_samples: int, span_size: int) -> IndexArray:
    """Offsets of spans of ``span_size`` structures (the last one may be short)."""
    return np.append(np.arange(0, num_samples, span_size, dtype=np.int64), np.int64(num_samples))


def block_order(span_bounds: IndexArray, buffer_spans: int, rng: np.random.Generator) -> IndexArray:
    """The structures of ``span_bounds`` in block order: spans shuffled, then each buffer shuffled inside."""
    spans = rng.permutation(span_bounds.size - 1)
    starts = span_bounds[:-1][spans]
    lengths = np.diff(span_bounds)[spans]
    structures = concat_aranges(starts, lengths)
    edges = np.append(exclusive_cumsum(lengths)[::buffer_spans], structures.size).tolist()
    for lo, hi in itertools.pairwise(edges):  # once per buffer: an in-place shuffle, linear in its size
        rng.shuffle(structures[lo:hi])
    return structures


class KeyedBlockOrder:
    """A block order whose buffers are shuffled each by a generator of its own, keyed by its number.

    :func:`block_order` shuffles the buffers one after the other from one stream, so a buffer's order
    needs every buffer before it. Here the span order is drawn as there (from ``rng``, the same
    spans in the same order), but buffer ``k`` is shuffled by a generator seeded by ``key + [k]``:
    any run of the order, :meth:`values`, is built from the buffers it touches alone.
    """

    def __init__(self, span_bounds: IndexArray, buffer_spans: int, rng: np.random.Generator, key: list[int]) -> None:
        self._spans = rng.permutation(span_bounds.size - 1)
        self._starts = span_bounds[:-1][self._spans]
        self._lengths = np.diff(span_bounds)[self._spans]
        self._buffer_spans = buffer_spans
        offsets = exclusive_cumsum(self._lengths)
        self.buffer_offsets: IndexArray = np.append(offsets[:-1:buffer_spans], offsets[-1])
        """``[B + 1]`` positions where each buffer of the order starts, then the structure count."""
        self._key = key
        self._last: tuple[int, IndexArray] | None = None  # the buffer built last (runs often share one)

    def buffer(self, k: int) -> IndexArray:
        """The structures of buffer ``k`` in their shuffled order."""
        if self._last is not None and self._last[0] == k:
            return self._last[1]
        cut = slice(k * self._buffer_spans, (k + 1) * self._buffer_spans)
        structures = concat_aranges(self._starts[cut], self._lengths[cut])
        np.random.Generator(np.random.PCG64(np.random.SeedSequence([*self._key, k]))).shuffle(structures)
        self._last = (k, structures)
        return structures

    def values(self, start: int, stop: int, out: IndexArray | None = None) -> IndexArray:
        """The order at positions ``[start, stop)``, written into ``out`` when given (``stop - start`` long)."""
        offsets = self.buffer_offsets
        result = np.empty(stop - start, dtype=np.int64) if out is None else out
        k = int(np.searchsorted(offsets, start, side="right")) - 1
        while k < offsets.size - 1 and int(offsets[k]) < stop:
            lo, hi = max(start, int(offsets[k])), min(stop, int(offsets[k + 1]))
            result[lo - start : hi - start] = self.buffer(k)[lo - int(offsets[k]) : hi - int(offsets[k])]
            k += 1
        return result


def local_spans(span_bounds: IndexArray, start: int, stop: int) -> IndexArray:
    """The spans of ``span_bounds`` cut to structures ``[start, stop)``, as offsets from ``start``."""
    inside = span_bounds[(span_bounds > start) & (span_bounds < stop)]
    return np.concatenate([[0], inside - start, [stop - start]]).astype(np.int64)


def default_buffer_spans(span_bounds: IndexArray, structure_bytes: NDArray[np.int64], cache_bytes: int) -> int:
    """Spans whose decoded bytes, on average, fill :data:`BUFFER_CACHE_FRACTION` of ``cache_bytes`` (>= 1)."""
    spans = span_bounds.size - 1
    if spans == 0:
        return 1
    mean_span = float(structure_bytes.sum(dtype=np.float64)) / spans
    return max(1, int(BUFFER_CACHE_FRACTION * cache_bytes // max(mean_span, 1.0)))
