from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from dali_alchemi.planning import SamplePlan, epoch_order, shard


@given(st.integers(0, 300), st.integers(0, 2**40), st.integers(0, 50))
def test_epoch_order_is_a_seeded_permutation(n: int, seed: int, epoch: int) -> None:
    order = epoch_order(n, seed=seed, epoch=epoch, shuffle=True)
    assert order.dtype == np.int64
    assert np.array_equal(np.sort(order), np.arange(n))
    assert np.array_equal(order, epoch_order(n, seed=seed, epoch=epoch, shuffle=True))


def test_new_epochs_and_seeds_give_new_orders() -> None:
    a = epoch_order(1000, seed=1, epoch=0, shuffle=True)
    assert not np.array_equal(a, epoch_order(1000, seed=1, epoch=1, shuffle=True))
    assert not np.array_equal(a, epoch_order(1000, seed=2, epoch=0, shuffle=True))
    assert np.array_equal(epoch_order(5, seed=1, epoch=3, shuffle=False), np.arange(5))


@pytest.mark.parametrize(("n", "shards"), [(10, 3), (9, 3), (1, 4), (0, 2), (100, 7)])
def test_sharding_pads_like_distributed_sampler(n: int, shards: int) -> None:
    order = np.arange(n, dtype=np.int64)
    parts = [shard(order, shard_id=r, num_shards=shards) for r in range(shards)]
    assert len({len(p) for p in parts}) == 1
    if n:
        for r, part in enumerate(parts):
            sampler = DistributedSampler(range(n), num_replicas=shards, rank=r, shuffle=False)
            assert part.tolist() == list(sampler)
        assert set(np.concatenate(parts).tolist()) == set(range(n))
        assert sum(len(p) for p in parts) - n < shards  # padding is at most one sample per shard


@settings(deadline=None, max_examples=60)
@given(
    n=st.integers(0, 200),
    batch_size=st.integers(1, 17),
    shards=st.integers(1, 4),
    per_window=st.integers(1, 6),
    drop_last=st.booleans(),
)
def test_windows_never_change_the_batches(
    n: int, batch_size: int, shards: int, per_window: int, drop_last: bool
) -> None:
    for shard_id in range(shards):
        plan = SamplePlan(
            num_samples=n,
            batch_size=batch_size,
            seed=3,
            drop_last=drop_last,
            shard_id=shard_id,
            num_shards=shards,
            batches_per_window=per_window,
        )
        batches = plan.batches(epoch=2)
        assert len(batches) == plan.num_batches
        if drop_last:
            assert all(len(b) == batch_size for b in batches)
        else:
            assert all(len(b) == batch_size for b in batches[:-1])
            assert sum(len(b) for b in batches) == plan.samples_per_shard
        order = plan.shard_order(2)
        for first in sorted({0, 1, plan.num_batches // 2, plan.num_batches} & set(range(plan.num_batches + 1))):
            rebuilt = []
            for w in range(plan.num_windows(first)):
                indices, bounds = plan.window(2, w, first, order=order)
                assert len(bounds) - 1 <= per_window
                rebuilt += [indices[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]
            assert [b.tolist() for b in rebuilt] == [b.tolist() for b in batches[first:]]


def test_equal_batch_counts_on_every_shard() -> None:
    counts = {SamplePlan(num_samples=1001, batch_size=64, shard_id=r, num_shards=8).num_batches for r in range(8)}
    assert counts == {2}
    assert SamplePlan(num_samples=1001, batch_size=64, num_shards=8, drop_last=True).num_batches == 1


def test_invalid_plans_are_rejected() -> None:
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        SamplePlan(num_samples=10, batch_size=0)
    with pytest.raises(ValueError, match=r"shard_id must be in \[0, 2\)"):
        SamplePlan(num_samples=10, batch_size=2, shard_id=2, num_shards=2)
    with pytest.raises(ValueError, match="first_batch must be in"):
        SamplePlan(num_samples=10, batch_size=2).num_windows(7)
    with pytest.raises(IndexError, match="window 3 out of range"):
        SamplePlan(num_samples=10, batch_size=2, batches_per_window=2).window(0, 3)


def test_torch_generator_independence() -> None:
    torch.manual_seed(0)
    a = epoch_order(50, seed=9, epoch=1, shuffle=True)
    torch.manual_seed(1)
    np.random.seed(5)
    assert np.array_equal(a, epoch_order(50, seed=9, epoch=1, shuffle=True))
