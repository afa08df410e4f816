"""The DALI internals the loader reaches for still exist in the installed DALI (fails loudly if not)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI cannot be imported")

from nvidia.dali import fn
from nvidia.dali.pipeline import Pipeline

from dali_alchemi.pipeline import dali_private
from dali_alchemi.pipeline.source import standard_exception_pickling

pytestmark = pytest.mark.dali


def _window(info: object) -> list[np.ndarray]:
    if info.iteration >= 2:  # type: ignore[attr-defined]
        raise StopIteration
    return [np.arange(4, dtype=np.int64)]


def test_the_worker_pool_processes_and_shutdown_are_where_dali_private_looks(tmp_path: Path) -> None:
    # As the loader does: a test run earlier in this process may have imported ``distributed``, whose
    # exception reducers DALI's workers could not hand back (the StopIteration that ends the epoch).
    standard_exception_pickling()
    pipe = Pipeline(batch_size=1, num_threads=1, device_id=None, py_num_workers=2, py_start_method="fork")
    with pipe:
        out = fn.external_source(source=_window, batch=True, batch_info=True, parallel=True, prefetch_queue_depth=2)
        pipe.set_outputs(out)
    pipe.build()
    try:
        assert hasattr(pipe, dali_private.POOL_ATTRIBUTE), "DALI's Pipeline no longer has _py_pool"
        assert hasattr(pipe, dali_private.SHUTDOWN_METHOD), "DALI's Pipeline no longer has _shutdown"
        procs = dali_private.worker_processes(pipe)
        assert len(procs) == 2, "DALI's worker pool no longer keeps its processes at pool._processes"
        assert all(p.exitcode is None and p.pid > 0 for p in procs)
        assert not dali_private.workers_hidden(pipe)
        pipe.run()
    finally:
        dali_private.close_pipeline(pipe)
    for proc in procs:
        proc.join(timeout=10)
        assert proc.exitcode is not None


def test_a_pipeline_without_workers_has_none() -> None:
    pipe = Pipeline(batch_size=1, num_threads=1, device_id=None)
    with pipe:
        pipe.set_outputs(fn.external_source(source=_window, batch=True, batch_info=True))
    pipe.build()
    assert dali_private.worker_processes(pipe) == [] and not dali_private.workers_hidden(pipe)
    dali_private.close_pipeline(pipe)
    dali_private.close_pipeline(None)
