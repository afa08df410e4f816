"""RecordedPlan: the batches a sampler yielded, as an epoch plan."""

from __future__ import annotations

import numpy as np
import pytest

from dali_alchemi.errors import PlanError, SampleIndexError
from dali_alchemi.plan import Plan, RecordedPlan


def test_the_recorded_batches_are_the_plan_in_order() -> None:
    plan = RecordedPlan.from_batches([[3, 1, 1], [0], [-1, 2]], num_samples=5, epoch=2)
    assert isinstance(plan, Plan)
    epoch = plan.epoch(2)
    assert [b.tolist() for b in epoch.batches()] == [[3, 1, 1], [0], [4, 2]]  # duplicates kept, -1 is the last
    window = epoch.window(0, 2)
    assert window.indices.tolist() == [3, 1, 1, 0] and window.batch_bounds.tolist() == [0, 3, 4]
    assert plan.to_dict() == {"kind": "recorded", "num_samples": 5, "epoch": 2, "num_batches": 3}
    with pytest.raises(PlanError, match="recorded epoch 2 only, not epoch 3"):
        plan.epoch(3)


def test_nothing_recorded_is_an_empty_epoch() -> None:
    epoch = RecordedPlan.from_batches([], num_samples=4).epoch(0)
    assert epoch.num_batches == 0 and epoch.order.dtype == np.int64


def test_bad_batches_are_refused_with_nvalchemis_messages() -> None:
    with pytest.raises(SampleIndexError, match="Index 7 out of range for reader with 5 samples"):
        RecordedPlan.from_batches([[0, 7]], num_samples=5)
    with pytest.raises(IndexError):
        RecordedPlan.from_batches([[-9]], num_samples=5)
    with pytest.raises(ValueError, match="Cannot create batch from empty data list"):
        RecordedPlan.from_batches([[0], []], num_samples=5)
