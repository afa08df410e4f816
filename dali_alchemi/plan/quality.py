"""Shuffle quality as numbers: how random an order is, and how representative its batches are.

:func:`shuffle_quality` follows MosaicML streaming's yardstick (the entropy of the gaps between
consecutive indices), normalised so that an order in sequence scores 0 and a full random permutation
of the same indices about 1. :func:`batch_ks` asks the question that matters for a store sorted by
some property (composition, source, energy): how far each batch's distribution of a value is from
the whole store's. Both are vectorised (sorts and ``searchsorted``, no loop per batch or structure).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.errors import MetricInputError

if TYPE_CHECKING:
    from numpy.typing import NDArray

REFERENCE_SEED = 0
"""Seed of the random permutation that :func:`shuffle_quality` normalises by (fixed: the figure is
deterministic)."""


def _indices(name: str, values: NDArray[Any]) -> NDArray[np.int64]:
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise MetricInputError(f"{name} must be a 1-D integer array, got shape {arr.shape} and dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def gap_entropy(order: NDArray[Any]) -> float:
    """Shannon entropy (nats) of the histogram of ``|order[i + 1] - order[i]|`` (Mosaic's measure)."""
    gaps = np.abs(np.diff(_indices("order", order)))
    if gaps.size == 0:
        return 0.0
    _, counts = np.unique(gaps, return_counts=True)
    p = counts / gaps.size
    return float(-(p * np.log(p)).sum()) + 0.0


def shuffle_quality(order: NDArray[Any]) -> float:
    """How shuffled ``order`` is: 0 for indices in sequence, about 1 for a full random permutation.

    The figure is the entropy of the distribution of index gaps between consecutive entries (the
    measure MosaicML streaming's simulator uses), divided by the same entropy for a random permutation
    of the same indices (seeded by :data:`REFERENCE_SEED`, so the result is deterministic). An order
    that moves in fixed steps (sequential, or a strided shard) has one gap size and scores 0; a block
    shuffle whose buffers hold ``k`` of ``n`` structures scores roughly ``log k / log n``. Like
    Mosaic's, it is a coarse yardstick: it sees the gaps, not which structures share a batch (see
    :func:`batch_ks` for that). It can exceed 1 slightly.

    Parameters
    ----------
    order
        ``[n]`` integer indices in visiting order (a whole epoch, or one shard's; repeats allowed).

    Raises
    ------
    MetricInputError
        If ``order`` is not a 1-D integer array.
    """
    arr = _indices("order", order)
    if arr.size < 3:
        return 0.0
    reference = np.random.default_rng(REFERENCE_SEED).permutation(np.sort(arr))
    ceiling = gap_entropy(reference)
    return 0.0 if ceiling == 0.0 else abs(gap_entropy(arr)) / ceiling


def batch_ks(values: NDArray[Any], order: NDArray[Any], batch_ptr: NDArray[Any]) -> float:
    """Mean over batches of the Kolmogorov-Smirnov distance between a batch's values and the store's.

    For each batch ``b`` (``order[batch_ptr[b]:batch_ptr[b + 1]]``) the statistic is
    ``sup_x |F_b(x) - F(x)|``, with ``F_b`` the empirical distribution of ``values`` over the batch and
    ``F`` over every structure of ``values``; the result is its mean over the batches. A batch that
    represents the whole store scores near 0 (about ``1 / sqrt(batch size)`` by chance); the batches of
    a store sorted by that value, read in sequence, each sit at one point ``c`` of the store's
    distribution and score ``max(c, 1 - c)``, 0.75 on average. Exact with ties.

    Parameters
    ----------
    values
        ``[N]`` one finite number per structure of the store (an energy, a size, a source id).
    order
        ``[n]`` integer indices into ``values`` (an epoch plan's ``order``).
    batch_ptr
        ``[B + 1]`` offsets into ``order``: 0, strictly increasing, at most ``n``.

    Raises
    ------
    MetricInputError
        If the arrays do not fit together: naming the array and what was expected.
    """
    vals = np.asarray(values)
    if vals.ndim != 1 or not np.issubdtype(vals.dtype, np.number):
        raise MetricInputError(f"values must be a 1-D numeric array, got shape {vals.shape} and dtype {vals.dtype}")
    vals = vals.astype(np.float64, copy=False)
    if not np.isfinite(vals).all():
        raise MetricInputError(
            f"values must be finite: value {int(np.argmax(~np.isfinite(vals)))} is {vals[~np.isfinite(vals)][0]}"
        )
    idx = _indices("order", order)
    ptr = _indices("batch_ptr", batch_ptr)
    if ptr.size < 1 or ptr[0] != 0 or (ptr.size > 1 and (np.diff(ptr).min() < 1 or ptr[-1] > idx.size)):
        raise MetricInputError(
            f"batch_ptr must start at 0, rise strictly and end within the order's {idx.size} entries, "
            f"got {ptr[:5].tolist()}{'...' if ptr.size > 5 else ''}"
        )
    if ptr.size == 1:
        raise MetricInputError("batch_ptr holds no batch")
    used = idx[: int(ptr[-1])]
    if used.size and (int(used.min()) < 0 or int(used.max()) >= vals.size):
        bad = int(used[np.argmax((used < 0) | (used >= vals.size))])
        raise MetricInputError(f"order holds index {bad}, outside the {vals.size} values")
    reference = np.sort(vals)
    counts = np.diff(ptr)
    batch_of = np.repeat(np.arange(counts.size), counts)
    picked = vals[used]
    by = np.lexsort((picked, batch_of))  # by batch, then by value
    v, b = picked[by], batch_of[by]
    new_run = np.ones(v.size, dtype=bool)
    new_run[1:] = (b[1:] != b[:-1]) | (v[1:] != v[:-1])
    run_start = np.flatnonzero(new_run)
    run_of = np.cumsum(new_run) - 1
    run_end = np.append(run_start[1:], v.size)
    start, size = ptr[b], counts[b]
    below = (run_start[run_of] - start) / size  # F_b just below v
    upto = (run_end[run_of] - start) / size  # F_b at v
    ref_below = np.searchsorted(reference, v, side="left") / reference.size
    ref_upto = np.searchsorted(reference, v, side="right") / reference.size
    distance = np.maximum(np.abs(upto - ref_upto), np.abs(below - ref_below))
    return float(np.maximum.reduceat(distance, ptr[:-1]).mean())
