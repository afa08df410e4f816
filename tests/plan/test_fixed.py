"""FixedBatchPlan: fixed-size batches, sharded like DistributedSampler, windows that never change a batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_alchemi.errors import PlanError
from dali_alchemi.plan import FixedBatchPlan


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
        plan = FixedBatchPlan(
            num_samples=n, batch_size=batch_size, seed=3, drop_last=drop_last, shard_id=shard_id, num_shards=shards
        )
        epoch_plan = plan.epoch(2)
        batches = epoch_plan.batches()
        assert len(batches) == plan.num_batches == epoch_plan.num_batches
        if drop_last:
            assert all(len(b) == batch_size for b in batches)
        else:
            assert all(len(b) == batch_size for b in batches[:-1])
            assert sum(len(b) for b in batches) == plan.samples_per_shard
        for first in sorted({0, 1, plan.num_batches // 2, plan.num_batches} & set(range(plan.num_batches + 1))):
            rebuilt = []
            for w in range(epoch_plan.num_windows(per_window, first)):
                window = epoch_plan.window(w, per_window, first)
                indices, bounds = window.indices, window.batch_bounds
                assert len(bounds) - 1 <= per_window and window.first_batch == first + w * per_window
                rebuilt += [indices[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]
            assert [b.tolist() for b in rebuilt] == [b.tolist() for b in batches[first:]]


def test_equal_batch_counts_on_every_shard() -> None:
    counts = {FixedBatchPlan(num_samples=1001, batch_size=64, shard_id=r, num_shards=8).num_batches for r in range(8)}
    assert counts == {2}
    assert FixedBatchPlan(num_samples=1001, batch_size=64, num_shards=8, drop_last=True).num_batches == 1


def test_invalid_plans_are_rejected() -> None:
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        FixedBatchPlan(num_samples=10, batch_size=0)
    with pytest.raises(ValueError, match=r"shard_id must be in \[0, 2\)"):
        FixedBatchPlan(num_samples=10, batch_size=2, shard_id=2, num_shards=2)
    with pytest.raises(ValueError, match="first_batch must be in"):
        FixedBatchPlan(num_samples=10, batch_size=2).epoch(0).num_windows(1, 7)
    with pytest.raises(IndexError, match="window 3 out of range"):
        FixedBatchPlan(num_samples=10, batch_size=2).epoch(0).window(3, 2)
    with pytest.raises(PlanError, match="seed must be a non-negative integer"):
        FixedBatchPlan(num_samples=10, batch_size=2, seed=-1)


def test_to_dict_names_the_kind_and_every_setting() -> None:
    plan = FixedBatchPlan(num_samples=10, batch_size=3, seed=4, shard_id=1, num_shards=2)
    assert plan.to_dict() == {
        "kind": "fixed", "num_samples": 10, "batch_size": 3, "shuffle": True, "seed": 4, "drop_last": False,
        "shard_id": 1, "num_shards": 2,
    }  # fmt: skip
    assert plan.epoch(1).batch_ptr.tolist() == [0, 3, 5]


@pytest.mark.parametrize(("n", "shards"), [(1001, 8), (10, 3), (3, 5), (0, 2)])
def test_a_keyed_order_visits_every_structure_once_padded_like_distributed_sampler(n: int, shards: int) -> None:
    plans = [
        FixedBatchPlan(num_samples=n, batch_size=7, seed=2, shard_id=r, num_shards=shards, permutation="keyed")
        for r in range(shards)
    ]
    epochs = [p.epoch(4) for p in plans]
    assert len({e.num_batches for e in epochs}) == 1 and len({e.order.size for e in epochs}) == 1
    interleaved = np.stack([e.order for e in epochs], axis=1).reshape(-1)  # back to the padded global order
    assert np.array_equal(np.sort(interleaved[:n]), np.arange(n))  # every structure exactly once
    assert np.array_equal(interleaved[n:], interleaved[: interleaved.size - n])  # padding wraps to the start
    again = FixedBatchPlan(num_samples=n, batch_size=7, seed=2, shard_id=0, num_shards=shards, permutation="keyed")
    assert np.array_equal(again.epoch(4).order, epochs[0].order)
    if n > 100:
        assert not np.array_equal(plans[0].epoch(5).order, epochs[0].order)
        assert abs(np.corrcoef(np.arange(n), interleaved[:n])[0, 1]) < 0.1  # far from the identity


def test_auto_keys_large_datasets_and_the_identity_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from dali_alchemi.plan import order, restore

    drawn = FixedBatchPlan(num_samples=1000, batch_size=10, seed=1)
    assert drawn.permutation == "drawn" and "permutation" not in drawn.to_dict()
    monkeypatch.setattr(order, "KEYED_MIN_SAMPLES", 1000)
    keyed = FixedBatchPlan(num_samples=1000, batch_size=10, seed=1)
    assert keyed.permutation == "keyed" and keyed.to_dict()["permutation"] == "keyed"
    assert FixedBatchPlan(num_samples=1000, batch_size=10, shuffle=False).permutation == "drawn"
    # a state saved with the drawn order (as every state before keyed orders) is refused, not resumed elsewhere
    with pytest.raises(PlanError, match=r"different plan: permutation=None \(loader has 'keyed'\)"):
        restore(keyed, {"epoch": 0, "batch": 2, "plan": drawn.to_dict()})
    assert restore(keyed, {"epoch": 0, "batch": 2, "plan": keyed.to_dict()}) == (keyed, 0, 2)
    with pytest.raises(PlanError, match="permutation must be one of"):
        FixedBatchPlan(num_samples=10, batch_size=2, permutation="random")
