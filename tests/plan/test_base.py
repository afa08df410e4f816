"""EpochPlan: batches of any size, windows cut from them, and the checks that keep a plan consistent."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dali_alchemi.errors import PlanError
from dali_alchemi.plan import EpochPlan, FixedBatchPlan, Plan
from dali_alchemi.plan.base import window_starts


@given(st.lists(st.integers(1, 9), max_size=25), st.integers(1, 5), st.data())
def test_windows_of_varying_batches_rebuild_every_batch(sizes: list[int], per_window: int, data: st.DataObject) -> None:
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    order = np.random.default_rng(len(sizes)).permutation(int(ptr[-1]) + 3).astype(np.int64)  # 3 unvisited
    plan = EpochPlan(epoch=1, order=order, batch_ptr=ptr)
    assert plan.num_batches == len(sizes)
    first = data.draw(st.integers(0, len(sizes)))
    rebuilt = []
    for w in range(plan.num_windows(per_window, first)):
        window = plan.window(w, per_window, first)
        assert window.num_batches <= per_window and window.batch_bounds[0] == 0
        rebuilt += [window.indices[a:b] for a, b in zip(window.batch_bounds[:-1], window.batch_bounds[1:], strict=True)]
    assert [b.tolist() for b in rebuilt] == [b.tolist() for b in plan.batches(first)]
    assert [len(b) for b in rebuilt] == sizes[first:]


def test_the_first_windows_ramp_up_to_the_window_size() -> None:
    assert window_starts(40, 16, ramp=True).tolist() == [0, 1, 3, 7, 15, 31, 40]  # 1, 2, 4, 8, then 16 batches
    assert window_starts(40, 16).tolist() == [0, 16, 32, 40]  # without the ramp
    assert window_starts(5, 16, ramp=True).tolist() == [0, 1, 3, 5]  # the epoch ends inside the ramp
    assert window_starts(10, 3, ramp=True).tolist() == [0, 1, 3, 6, 9, 10]  # 1, 2, then 3
    assert window_starts(4, 1, ramp=True).tolist() == [0, 1, 2, 3, 4]  # nothing to ramp
    assert window_starts(0, 16, ramp=True).tolist() == [0] == window_starts(0, 4).tolist()  # no batches, no windows
    plan = EpochPlan(epoch=0, order=np.arange(100, dtype=np.int64), batch_ptr=np.arange(0, 101, 10, dtype=np.int64))
    ramped = [plan.window(w, 4, 2, ramp=True).num_batches for w in range(plan.num_windows(4, 2, ramp=True))]
    assert ramped == [1, 2, 4, 1]  # from batch 2
    assert plan.window(2, 4, 2, ramp=True).first_batch == 5 and plan.window(1, 4, 2).first_batch == 6
    for bad in ((3, 0), (-1, 4)):
        with pytest.raises(PlanError, match="batches_per_window >= 1 and num_batches >= 0"):
            window_starts(*bad)


def test_inconsistent_batch_offsets_are_refused() -> None:
    order = np.arange(10, dtype=np.int64)
    with pytest.raises(PlanError, match="starting at 0"):
        EpochPlan(epoch=0, order=order, batch_ptr=np.array([1, 4], dtype=np.int64))
    with pytest.raises(PlanError, match="rise strictly"):
        EpochPlan(epoch=0, order=order, batch_ptr=np.array([0, 4, 4], dtype=np.int64))
    with pytest.raises(PlanError, match="within the epoch's 10 structures"):
        EpochPlan(epoch=0, order=order, batch_ptr=np.array([0, 11], dtype=np.int64))
    empty = EpochPlan(epoch=0, order=order[:0], batch_ptr=np.zeros(1, dtype=np.int64))
    assert empty.num_batches == 0 and empty.num_windows(4) == 0 and empty.batches() == []
    with pytest.raises(IndexError, match="batch 0 out of range"):
        empty.batch(0)


def test_the_fixed_plan_is_a_plan() -> None:
    assert isinstance(FixedBatchPlan(num_samples=3, batch_size=2), Plan)
    assert not isinstance(object(), Plan)
