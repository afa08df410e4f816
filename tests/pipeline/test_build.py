"""build_pipeline: one batch-aware external source, outputs named in order, on the CPU without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI cannot be imported")

from dali_alchemi import AtomicDataZarrReader, FixedBatchPlan
from dali_alchemi.pipeline.build import build_pipeline
from dali_alchemi.pipeline.dali_private import close_pipeline
from dali_alchemi.pipeline.iterator import WindowIterator
from dali_alchemi.pipeline.source import INDICES, WindowSource, output_specs
from tests.loader_contract import assert_batches_equal, reference_batches

pytestmark = pytest.mark.dali


@pytest.mark.parametrize("workers", [0, 1])
def test_a_cpu_pipeline_yields_each_window_once_then_stops(reader: AtomicDataZarrReader, workers: int) -> None:
    plan = FixedBatchPlan(num_samples=len(reader), batch_size=50, shuffle=False)
    specs = output_specs(reader.field_specs, ("positions", "energy"))
    source = WindowSource(reader, plan, specs, batches_per_window=2)
    pipe, outputs = build_pipeline(
        source, specs, device_id=None, num_workers=workers, start_method="fork", queue_depth=2,
        bytes_per_window=1 << 20,
    )  # fmt: skip
    try:
        assert outputs.names == tuple(s.name for s in specs) and outputs.host_names == ()
        windows = []
        with pytest.raises(StopIteration):
            for _ in range(10):
                windows.append(pipe.run())  # noqa: PERF401 (run() raises StopIteration at the end)
        assert len(windows) == 4  # 6 batches: windows of 1 (the ramp), then 2
        index = outputs.names.index(INDICES)
        got = np.concatenate([np.asarray(w[index].as_tensor()).reshape(-1) for w in windows])
        assert got.tolist() == list(range(300))
    finally:
        close_pipeline(pipe)


def test_the_iterator_cuts_windows_where_the_plan_says(reader: AtomicDataZarrReader) -> None:
    plan = FixedBatchPlan(num_samples=len(reader), batch_size=32, seed=9)
    specs = output_specs(reader.field_specs, tuple(reader.field_specs), host_collation=True)
    source = WindowSource(reader, plan, specs, batches_per_window=3)
    pipe, outputs = build_pipeline(
        source, specs, device_id=None, num_workers=0, start_method="fork", queue_depth=2, bytes_per_window=1 << 20
    )
    try:
        windows = list(WindowIterator(pipe, outputs, specs, torch.device("cpu")).windows())
        assert [len(w) for w in windows] == [1, 2, 3, 3, 1]  # a ramp of 1 and 2 batches, then 3 per window
        assert_batches_equal([b for w in windows for b in w], reference_batches(reader, plan, 0))
    finally:
        close_pipeline(pipe)
