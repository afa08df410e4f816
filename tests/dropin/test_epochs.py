"""EpochFolderPlan: epochs recorded by the training process, read back by any process from the folder."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from dali_alchemi.errors import PlanError
from dali_alchemi.plan import EpochPlan, Plan

pytest.importorskip("nvalchemi.data.datapipes", reason="nvalchemi-toolkit is not installed")
from dali_alchemi.nvalchemi._epochs import EpochFolderPlan


def test_recorded_epochs_are_read_back_by_a_copy_and_old_ones_dropped(tmp_path: Path) -> None:
    plan = EpochFolderPlan(str(tmp_path), num_samples=10)
    assert isinstance(plan, Plan)
    copy = pickle.loads(pickle.dumps(plan))  # what a DALI worker holds
    for epoch in range(4):
        order = np.arange(epoch, epoch + 5, dtype=np.int64) % 10
        plan.record(EpochPlan(epoch=epoch, order=order, batch_ptr=np.array([0, 2, 5], dtype=np.int64)))
        got = copy.epoch(epoch)
        assert got.epoch == epoch and got.order.tolist() == order.tolist() and got.batch_ptr.tolist() == [0, 2, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-2.npz", "epoch-3.npz"]
    with pytest.raises(PlanError, match="epoch 0 was not recorded"):
        copy.epoch(0)
    assert plan.to_dict() == {"kind": "sampler", "num_samples": 10}
