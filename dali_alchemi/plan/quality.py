"""Shuffle quality as numbers: how well an order mixes the store, and how representative its batches are.

:func:`shuffle_quality` asks whether every run of ``batch_size`` consecutive structures is a fair
sample of the whole index range (the case that matters when a store is sorted by composition, source
or energy), normalised so that an order in sequence scores 0 and a full random permutation 1.
:func:`gap_quality` is MosaicML streaming's yardstick (the entropy of the gaps between consecutive
indices), normalised the same way, for comparison with their figures. :func:`batch_ks` measures the
same thing as :func:`shuffle_quality` for any per-structure value and the plan's real batches. All are
vectorised (sorts and ``searchsorted``, no loop per batch or structure).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.errors import MetricInputError

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["QUALITY_BATCH", "REFERENCE_SEED", "batch_ks", "gap_entropy", "gap_quality", "shuffle_quality"]


REFERENCE_SEED = 0
"""Seed of the random permutation the qualities are normalised by (fixed: the figures are deterministic)."""

QUALITY_BATCH = 64
"""Structures per group in :func:`shuffle_quality` by default (the loaders' default batch size)."""


def _indices(name: str, values: NDArray[Any]) -> NDArray[np.int64]:
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise MetricInputError(f"{name} must be a 1-D integer array, got shape {arr.shape} and dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _mean_ks(picked: NDArray[np.float64], ptr: NDArray[np.int64], reference: NDArray[np.float64]) -> float:
    """Mean over batches ``picked[ptr[b]:ptr[b + 1]]`` of ``sup |F_batch - F_reference|`` (sorted ``reference``)."""
    counts = np.diff(ptr)
    batch_of = np.repeat(np.arange(counts.size), counts)
    by = np.lexsort((picked, batch_of))  # by batch, then by value
    v, b = picked[by], batch_of[by]
    new_run = np.ones(v.size, dtype=bool)
    new_run[1:] = (b[1:] != b[:-1]) | (v[1:] != v[:-1])
    run_start = np.flatnonzero(new_run)
    run_of = np.cumsum(new_run) - 1
    run_end = np.append(run_start[1:], v.size)
    start, size = ptr[b], counts[b]
    below = (run_start[run_of] - start) / size  # F_batch just below v
    upto = (run_end[run_of] - start) / size  # F_batch at v
    ref_below = np.searchsorted(reference, v, side="left") / reference.size
    ref_upto = np.searchsorted(reference, v, side="right") / reference.size
    distance = np.maximum(np.abs(upto - ref_upto), np.abs(below - ref_below))
    return float(np.maximum.reduceat(distance, ptr[:-1]).mean())


def _groups(n: int, size: int) -> NDArray[np.int64]:
    return np.append(np.arange(0, n, size, dtype=np.int64), np.int64(n))


def shuffle_quality(order: NDArray[Any], *, batch_size: int = QUALITY_BATCH) -> float:
    """How well ``order`` mixes the store: 0 for indices in sequence, 1 for a full random permutation.

    ``order`` is cut into groups of ``batch_size`` consecutive entries; for each group the
    Kolmogorov-Smirnov distance between its indices and all the indices of ``order`` is taken, and
    averaged over the groups (as :func:`batch_ks` does with the indices as the values). That mean
    ``D`` is then placed between its two references on the same indices: ``D_seq`` for the sorted
    order (each group one narrow slice) and ``D_perm`` for a random permutation (seeded by
    :data:`REFERENCE_SEED`), as ``(D_seq - D) / (D_seq - D_perm)``. So the figure says how much of
    the way from reading in sequence to a full shuffle an order goes, for a store sorted by anything:
    a group drawn from a few places of the store scores low, whatever the gaps between them. Reversed
    or strided orders score 0; a random order of other seeds scores 1 within about 0.01; an order can
    score slightly above 1. Fewer than ``2 * batch_size`` entries score 0 (one group is the whole order).

    Parameters
    ----------
    order
        ``[n]`` integer indices in visiting order (a whole epoch, or one shard's; repeats allowed).
    batch_size
        Entries per group (default :data:`QUALITY_BATCH`).

    Raises
    ------
    MetricInputError
        If ``order`` is not a 1-D integer array, or ``batch_size`` is not a positive integer.
    """
    arr = _indices("order", order)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise MetricInputError(f"batch_size must be a positive integer, got {batch_size!r}")
    if arr.size < 2 * batch_size:
        return 0.0
    reference = np.sort(arr).astype(np.float64)
    ptr = _groups(arr.size, batch_size)
    sequential = _mean_ks(reference, ptr, reference)
    shuffled = _mean_ks(np.random.default_rng(REFERENCE_SEED).permutation(reference), ptr, reference)
    if sequential <= shuffled:
        return 0.0
    return max(0.0, (sequential - _mean_ks(arr.astype(np.float64), ptr, reference)) / (sequential - shuffled))


def gap_entropy(order: NDArray[Any]) -> float:
    """Shannon entropy (nats) of the histogram of ``|order[i + 1] - order[i]|`` (Mosaic's measure)."""
    gaps = np.abs(np.diff(_indices("order", order)))
    if gaps.size == 0:
        return 0.0
    _, counts = np.unique(gaps, return_counts=True)
    p = counts / gaps.size
    return float(-(p * np.log(p)).sum()) + 0.0


def gap_quality(order: NDArray[Any]) -> float:
    """MosaicML streaming's shuffle quality, normalised: 0 for indices in sequence, about 1 for a permutation.

    The entropy of the distribution of index gaps between consecutive entries (as their simulator
    computes it), divided by the same entropy for a random permutation of the same indices (seeded by
    :data:`REFERENCE_SEED`). An order that moves in fixed steps has one gap size and scores 0. It sees
    how far consecutive structures jump, not what a batch holds: a block order whose buffers pool a
    few spans from all over the store already scores above 0.9 (:func:`shuffle_quality` does not).

    Raises
    ------
    MetricInputError
        If ``order`` is not a 1-D integer array.
    """
    arr = _indices("order", order)
    if arr.size < 3:
        return 0.0
    ceiling = gap_entropy(np.random.default_rng(REFERENCE_SEED).permutation(np.sort(arr)))
    return 0.0 if ceiling == 0.0 else gap_entropy(arr) / ceiling


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
    finite = np.isfinite(vals)
    if not finite.all():
        bad = int(np.argmax(~finite))
        raise MetricInputError(f"values must be finite: value {bad} is {vals[bad]}")
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
    return _mean_ks(vals[used], ptr, np.sort(vals))
