"""Shuffle-quality metrics: the gap entropy normalised to [sequential 0, permutation ~1], and batch KS."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dali_alchemi.errors import MetricInputError
from dali_alchemi.plan import BlockShufflePlan, batch_ks, shuffle_quality
from dali_alchemi.plan.quality import gap_entropy, gap_quality
from dali_alchemi.plan.spans import fixed_spans


def _ks_reference(values: np.ndarray, order: np.ndarray, ptr: np.ndarray) -> float:
    """The KS distance batch by batch, evaluated on every distinct value (slow, obviously right)."""
    grid = np.unique(values)
    whole = np.searchsorted(np.sort(values), grid, side="right") / values.size
    whole_below = np.searchsorted(np.sort(values), grid, side="left") / values.size
    out = []
    for lo, hi in itertools.pairwise(ptr):
        batch = np.sort(values[order[lo:hi]])
        mine = np.searchsorted(batch, grid, side="right") / batch.size
        mine_below = np.searchsorted(batch, grid, side="left") / batch.size
        out.append(max(np.abs(mine - whole).max(), np.abs(mine_below - whole_below).max()))
    return float(np.mean(out))


def test_sequential_is_zero_a_permutation_about_one_and_block_in_between() -> None:
    n = 50_000
    for quality in (shuffle_quality, gap_quality):
        assert quality(np.arange(n)) == 0.0
        assert quality(np.arange(n)[::-1]) == 0.0
        assert quality(np.arange(0, 3 * n, 3)) == 0.0  # a strided shard is a sequence too
        for seed in (1, 2):
            assert quality(np.random.default_rng(seed).permutation(n)) == pytest.approx(1.0, abs=0.02)
    few = BlockShufflePlan(span_bounds=fixed_spans(n, 100), buffer_spans=4, batch_size=64).epoch(0).order
    many = BlockShufflePlan(span_bounds=fixed_spans(n, 100), buffer_spans=64, batch_size=64).epoch(0).order
    one = BlockShufflePlan(span_bounds=fixed_spans(n, 2000), buffer_spans=1, batch_size=64).epoch(0).order
    assert 0.0 < shuffle_quality(one) < 0.1 < shuffle_quality(few) < 0.7 < shuffle_quality(many) < 0.99
    # the gap entropy rates a buffer of a few spans from all over the store almost as a full shuffle
    assert gap_quality(few) > 0.85 > shuffle_quality(few)


def test_shuffle_quality_measures_groups_of_batch_size() -> None:
    n = 4096
    # pairs of consecutive indices, the pairs in random order: poor for groups of 2, fine for groups of 512
    pairs = (np.random.default_rng(0).permutation(n // 2)[:, None] * 2 + np.arange(2)).reshape(-1)
    assert shuffle_quality(pairs, batch_size=2) < 0.5 < 0.9 < shuffle_quality(pairs, batch_size=512)
    assert shuffle_quality(np.arange(100), batch_size=64) == 0.0  # a single group is the whole order
    with pytest.raises(MetricInputError, match="batch_size must be a positive integer"):
        shuffle_quality(np.arange(10), batch_size=0)


def test_gap_entropy_counts_gap_sizes() -> None:
    assert gap_entropy(np.array([0, 1, 2, 3])) == 0.0
    assert gap_entropy(np.array([0, 1, 3, 4, 6])) == pytest.approx(np.log(2))  # gaps 1, 2, 1, 2
    assert gap_quality(np.array([4, 2])) == 0.0


def test_batch_ks_matches_a_direct_computation_with_ties() -> None:
    rng = np.random.default_rng(3)
    values = rng.integers(0, 20, size=600).astype(np.float64)
    order = rng.permutation(600)
    ptr = np.array([0, 1, 7, 30, 31, 100, 599])
    assert batch_ks(values, order, ptr) == pytest.approx(_ks_reference(values, order, ptr), abs=1e-12)


def test_batch_ks_separates_sequential_block_and_global_on_a_sorted_store() -> None:
    n, bs = 20_000, 64
    energy = np.sort(np.random.default_rng(0).normal(size=n))
    ptr = np.minimum(np.arange(-(-n // bs) + 1) * bs, n)
    sequential = batch_ks(energy, np.arange(n), ptr)
    shuffled = batch_ks(energy, np.random.default_rng(1).permutation(n), ptr)
    block = BlockShufflePlan(span_bounds=fixed_spans(n, 200), buffer_spans=10, batch_size=bs).epoch(0)
    blocked = batch_ks(energy, block.order, block.batch_ptr)
    assert sequential == pytest.approx(0.75, abs=0.01)  # each batch sits at one point of the distribution
    assert shuffled < 0.2 < blocked < sequential


def test_bad_inputs_name_the_array() -> None:
    with pytest.raises(MetricInputError, match="order must be a 1-D integer array"):
        shuffle_quality(np.array([0.5, 1.5, 2.5]))
    values = np.arange(10.0)
    with pytest.raises(MetricInputError, match="batch_ptr must start at 0"):
        batch_ks(values, np.arange(10), np.array([0, 5, 5, 10]))
    with pytest.raises(MetricInputError, match="order holds index 12, outside the 10 values"):
        batch_ks(values, np.array([0, 12]), np.array([0, 2]))
    with pytest.raises(MetricInputError, match="values must be finite: value 3 is nan"):
        batch_ks(np.array([0, 1, 2, np.nan]), np.arange(4), np.array([0, 4]))
    with pytest.raises(MetricInputError, match="holds no batch"):
        batch_ks(values, np.arange(10), np.array([0]))
