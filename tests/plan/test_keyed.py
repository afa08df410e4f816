"""The keyed permutation: a bijection of range(n) evaluated at any positions, seeded, uncorrelated."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_alchemi.errors import PlanIndexError
from dali_alchemi.plan import keyed
from dali_alchemi.plan.keyed import keyed_order, keyed_shard
from dali_alchemi.plan.order import shard


@settings(deadline=None, max_examples=60)
@given(st.integers(0, 3000), st.integers(0, 2**40), st.integers(0, 50))
def test_keyed_order_is_a_permutation_fixed_by_seed_and_epoch(n: int, seed: int, epoch: int) -> None:
    order = keyed_order(np.arange(n), n, seed=seed, epoch=epoch)
    assert order.dtype == np.int64
    assert np.array_equal(np.sort(order), np.arange(n))
    assert np.array_equal(order, keyed_order(range(n), n, seed=seed, epoch=epoch))  # a range gives the same


def test_any_positions_give_the_whole_orders_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyed, "KEYED_BLOCK", 7)  # several blocks, and cycle walks inside each
    n = 1001
    whole = keyed_order(np.arange(n), n, seed=5, epoch=2)
    picked = np.array([1000, 3, 3, 0, 517, 999, 12])
    assert np.array_equal(keyed_order(picked, n, seed=5, epoch=2), whole[picked])
    assert np.array_equal(keyed_order(range(200, 300), n, seed=5, epoch=2), whole[200:300])


def test_epochs_seeds_and_streams_differ_and_the_order_is_not_near_the_identity() -> None:
    n = 20_000
    positions = np.arange(n)
    a = keyed_order(positions, n, seed=1, epoch=0)
    for other in (
        keyed_order(positions, n, seed=1, epoch=1),
        keyed_order(positions, n, seed=2, epoch=0),
        keyed_order(positions, n, seed=1, epoch=0, stream=1),
    ):
        assert (a == other).mean() < 0.01
        assert abs(np.corrcoef(a, other)[0, 1]) < 0.05
    assert abs(np.corrcoef(positions, a)[0, 1]) < 0.05  # Spearman's rho: the values are ranks already
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 0.05  # neighbours are unrelated
    assert (np.abs(np.diff(a)) == 1).mean() < 0.01  # no runs of consecutive structures


def test_a_domain_past_32_bits_uses_64_bit_digits() -> None:
    n = 2**33 + 5
    values = keyed_order(np.arange(2000), n, seed=3, epoch=0)
    assert values.min() >= 0 and values.max() < n and np.unique(values).size == 2000
    assert values.max() > 2**32  # spread over the whole domain


@pytest.mark.parametrize(("n", "shards"), [(10, 3), (9, 3), (1, 4), (0, 2), (100, 7), (5, 8)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_keyed_shard_is_the_shard_of_the_whole_order(
    n: int, shards: int, shuffle: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keyed, "KEYED_BLOCK", 4)
    whole = keyed_order(np.arange(n), n, seed=9, epoch=3) if shuffle else np.arange(n)
    parts = [keyed_shard(n, seed=9, epoch=3, shuffle=shuffle, shard_id=r, num_shards=shards) for r in range(shards)]
    for r, part in enumerate(parts):
        assert part.dtype == np.int64
        assert np.array_equal(part, shard(whole, shard_id=r, num_shards=shards))  # DistributedSampler's padding


@pytest.mark.parametrize(("n", "shards", "shard_id"), [(1001, 8, 3), (10, 3, 2), (3, 5, 4), (0, 2, 1), (64, 1, 0)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_a_shard_order_reads_as_the_array_it_stands_for(n: int, shards: int, shard_id: int, shuffle: bool) -> None:
    from dali_alchemi.plan.keyed import ShardOrder

    lazy = ShardOrder(n=n, seed=4, epoch=1, shuffle=shuffle, shard_id=shard_id, num_shards=shards)
    whole = keyed_shard(n, seed=4, epoch=1, shuffle=shuffle, shard_id=shard_id, num_shards=shards)
    assert (lazy.size, lazy.shape, len(lazy), lazy.ndim, lazy.dtype) == (whole.size, whole.shape, whole.size, 1, np.int64)
    materialised = np.asarray(lazy)
    assert materialised.dtype == np.int64 and np.array_equal(materialised, whole)
    assert lazy.tolist() == whole.tolist()
    for key in (slice(None), slice(2, 9), slice(5, 2), slice(-4, None), slice(1, None, 3), slice(None, None, -2)):
        got = lazy[key]
        assert got.dtype == np.int64 and np.array_equal(got, whole[key]), key
    if whole.size:
        picks = np.array([whole.size - 1, 0, -1, whole.size // 2])
        assert np.array_equal(lazy[picks], whole[picks])
        assert lazy[-1] == int(whole[-1]) and lazy[0] == int(whole[0]) and isinstance(lazy[0], int)
    with pytest.raises(PlanIndexError, match=f"out of bounds for a shard order of {whole.size} structures"):
        lazy[whole.size]
    with pytest.raises(PlanIndexError, match="out of bounds"):
        lazy[np.array([whole.size])]


def test_a_keyed_epoch_plan_holds_no_order_array_and_its_windows_are_the_arrays() -> None:
    from dali_alchemi.plan import FixedBatchPlan
    from dali_alchemi.plan.keyed import ShardOrder

    plan = FixedBatchPlan(num_samples=1000, batch_size=7, seed=3, shard_id=1, num_shards=3, permutation="keyed")
    epoch = plan.epoch(2)
    assert isinstance(epoch.order, ShardOrder)
    whole = keyed_shard(1000, seed=3, epoch=2, shuffle=True, shard_id=1, num_shards=3)
    assert np.array_equal(np.concatenate(epoch.batches()), whole[: int(epoch.batch_ptr[-1])])
    window = epoch.window(3, 4)
    lo = int(epoch.batch_ptr[12])
    assert np.array_equal(window.indices, whole[lo : lo + window.indices.size]) and window.indices.size == 28
    drawn = FixedBatchPlan(num_samples=1000, batch_size=7, seed=3, shard_id=1, num_shards=3).epoch(2)
    assert isinstance(drawn.order, np.ndarray)  # below KEYED_MIN_SAMPLES nothing changes
