"""CSR arithmetic on pointer and count arrays, shared by the store, the Batch and the pipeline.

A window of samples is described by per-sample counts (``n_atoms``, ``n_edges``) or their CSR pointers
(``atoms_ptr = [0, c0, c0 + c1, ...]``). Everything here is pure numpy over those arrays, with no Python
loop per sample: building pointers, expanding row ranges, re-basing atom-index fields (``neighbor_list``)
by a per-sample offset, and finding the first index that falls outside its own sample. Every module that
does one of these things calls the function here, so the rule is written once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import CountArray, PtrArray

__all__ = ["block_sample_starts", "concat_aranges", "exclusive_cumsum", "first_out_of_range", "per_row", "rebase"]


def exclusive_cumsum(counts: NDArray[np.int64]) -> PtrArray:
    """CSR pointer ``[0, c0, c0 + c1, ...]`` (int64, length ``len(counts) + 1``)."""
    ptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr


def concat_aranges(starts: NDArray[np.int64], counts: NDArray[np.int64]) -> NDArray[np.int64]:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])`` without a Python loop."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(counts) - counts
    return np.repeat(starts - offsets, counts) + np.arange(total, dtype=np.int64)


def per_row(values: NDArray[Any], per_sample: NDArray[Any], counts: CountArray) -> NDArray[Any]:
    """``per_sample`` repeated ``counts`` times, in ``values``' dtype and shaped to broadcast against it."""
    expanded = np.repeat(per_sample, counts).astype(values.dtype, copy=False)
    return expanded.reshape((-1,) + (1,) * (values.ndim - 1))


def rebase(values: NDArray[Any], offsets: NDArray[Any], n_edges: CountArray, *, sign: int = 1) -> NDArray[Any]:
    """Add ``sign * offsets[i]`` to every row of sample ``i`` of an edge-level atom-index field, *in place*.

    ``values`` is ``[ΣE, *t]`` with the rows of each sample consecutive (``n_edges`` rows each). This one
    rule turns store-global indices into sample-local ones (``sign=-1``, offsets ``atoms_ptr[i]``),
    sample-local ones into batch-local ones (offsets: each sample's first atom in its batch) and back.
    Returns ``values``.
    """
    if values.size and not values.flags.c_contiguous:  # a view: its rows cannot be walked column by column
        shift = per_row(values, offsets, n_edges)
        if sign < 0:
            values -= shift
        else:
            values += shift
    elif values.size:
        # Flat passes: each sample's offset repeated over all its values (a row's columns included), since a
        # strided pass per column or a broadcast over the rows costs 2-3 times as much. A group of samples at
        # a time keeps the repeated offsets small: a temporary the size of a window's values is mapped afresh
        # by the allocator on every call, and faulting its pages in cost more than the pass itself.
        op = np.subtract if sign < 0 else np.add
        width = values.size // values.shape[0]
        flat, shifts = values.reshape(-1), offsets.astype(values.dtype, copy=False)
        counts = np.asarray(n_edges) * width
        ends = np.cumsum(counts)
        cuts = np.searchsorted(ends, np.arange(REBASE_GROUP, int(ends[-1]), REBASE_GROUP), side="right")
        first = 0
        for last in [*np.unique(cuts).tolist(), len(counts)]:  # once per group of samples
            lo, hi = (int(ends[first - 1]) if first else 0), (int(ends[last - 1]) if last else 0)
            if hi > lo:
                piece = flat[lo:hi]
                op(piece, np.repeat(shifts[first:last], counts[first:last]), out=piece)
            first = last
    return values


REBASE_GROUP = 1 << 15
"""Values :func:`rebase` shifts in one pass, about (whole samples): its temporary stays this size."""


def first_out_of_range(values: NDArray[Any], n_atoms: CountArray, n_edges: CountArray) -> tuple[int, int] | None:
    """The first edge row whose sample-local atom index is outside ``[0, n_atoms)`` of its sample.

    Returns ``(edge_row, sample)`` positions in the window, or ``None`` when every index is in range.
    Each sample's largest index is taken in one pass over the values (a negative one, seen unsigned, is
    larger than any count), so no per-row limit is built.
    """
    if values.size == 0:
        return None
    width = values.size // values.shape[0]
    if values.dtype.kind == "i":
        flat = values.reshape(-1).view(np.dtype(f"u{values.dtype.itemsize}"))
    else:
        flat = values.reshape(-1)
    has_edges = np.flatnonzero(n_edges > 0)
    edge_starts = np.cumsum(n_edges) - n_edges
    largest = np.maximum.reduceat(flat, edge_starts[has_edges] * width)
    if values.dtype.kind == "i":
        over = largest >= n_atoms[has_edges].astype(flat.dtype)
    else:
        over = (largest >= n_atoms[has_edges]) | (np.minimum.reduceat(flat, edge_starts[has_edges] * width) < 0)
    if not over.any():
        return None
    sample = int(has_edges[np.argmax(over)])
    lo = int(edge_starts[sample])
    rows = values[lo : lo + int(n_edges[sample])].reshape(int(n_edges[sample]), -1)
    bad = ((rows < 0) | (rows >= n_atoms[sample])).any(axis=1)
    return lo + int(np.argmax(bad)), sample


_WINDOW = 1 << 22
"""Samples :func:`block_sample_starts` looks at in one step (its temporaries stay this size)."""


def block_sample_starts(ptr: PtrArray, block_rows: int, samples: NDArray[np.int64] | None) -> NDArray[np.int64]:
    """Positions in ``samples`` (sorted sample indices; ``None``: every sample of ``ptr``) where a new row
    block of ``block_rows`` rows begins.

    A sample belongs to the block its first row is in, so a sample straddling two blocks goes with the
    first. Returns a sorted, unique int64 array that starts with 0 and ends with ``samples.size``.
    """
    n = ptr.size - 1 if samples is None else samples.size
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    parts: list[Any] = [[0]]
    previous = None
    for lo in range(0, n, _WINDOW):
        hi = min(lo + _WINDOW, n)
        block = (ptr[lo:hi] if samples is None else ptr[samples[lo:hi]]) // block_rows
        if previous is not None and block[0] != previous:
            parts.append([lo])
        parts.append(np.flatnonzero(np.diff(block)) + 1 + lo)
        previous = block[-1]
    parts.append([n])
    return np.concatenate(parts).astype(np.int64)
