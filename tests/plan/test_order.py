"""Seeded epoch orders, DistributedSampler-style sharding and the default shard."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from dali_alchemi.plan import epoch_order, resolve_shard, shard
from dali_alchemi.plan.order import resolve_permutation, shard_order


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


def test_torch_generator_independence() -> None:
    torch.manual_seed(0)
    a = epoch_order(50, seed=9, epoch=1, shuffle=True)
    torch.manual_seed(1)
    np.random.seed(5)
    assert np.array_equal(a, epoch_order(50, seed=9, epoch=1, shuffle=True))


def test_resolve_shard_explicit_default_and_half_given() -> None:
    assert resolve_shard(2, 5) == (2, 5)
    assert resolve_shard(None, None) == (0, 1)  # no process group here
    with pytest.raises(ValueError, match="must be given together"):
        resolve_shard(1, None)


def test_permutation_choices_auto_by_size_and_unknown_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from dali_alchemi.errors import PlanError
    from dali_alchemi.plan import order

    assert order.KEYED_MIN_SAMPLES == 2**23
    assert resolve_permutation("auto", 2**23 - 1, True) == "drawn"
    assert resolve_permutation("auto", 2**23, True) == "keyed"
    assert resolve_permutation("keyed", 10, False) == "drawn"  # no shuffle: arange either way
    assert resolve_permutation("keyed", 10, True) == "keyed"
    monkeypatch.setattr(order, "KEYED_MIN_SAMPLES", 100)
    assert resolve_permutation("auto", 100, True) == "keyed"
    with pytest.raises(PlanError, match=r"permutation must be one of \('auto', 'drawn', 'keyed'\), got 'feistel'"):
        resolve_permutation("feistel", 10, True)


@pytest.mark.parametrize(("n", "shards"), [(10, 3), (1, 4), (0, 2), (100, 7)])
def test_shard_order_of_a_drawn_permutation_is_the_padded_shard_as_before(n: int, shards: int) -> None:
    for r in range(shards):
        padded = shard(epoch_order(n, seed=4, epoch=2, shuffle=True), shard_id=r, num_shards=shards)
        got = shard_order(n, seed=4, epoch=2, shuffle=True, shard_id=r, num_shards=shards, permutation="drawn")
        assert got.dtype == np.int64 and np.array_equal(got, padded)
        ordered = shard_order(n, seed=4, epoch=2, shuffle=False, shard_id=r, num_shards=shards, permutation="drawn")
        assert np.array_equal(ordered, shard(np.arange(n), shard_id=r, num_shards=shards))
