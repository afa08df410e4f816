"""WindowSource: one packed read per window of the plan, the plan's batch bounds carried along."""

from __future__ import annotations

import pickle
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, FixedBatchPlan
from dali_alchemi.pipeline.source import (
    BATCH_BOUNDS,
    BATCH_IDX,
    INDICES,
    N_ATOMS,
    N_EDGES,
    ReadAheadSource,
    WindowSource,
    blob_entries,
    loader_error,
    output_specs,
    source_error,
)
from tests.processes import HANG_S


def _source(reader: AtomicDataZarrReader, **options: object) -> WindowSource:
    plan = FixedBatchPlan(num_samples=len(reader), batch_size=16, seed=3)
    specs = output_specs(reader.field_specs, ("positions", "energy", "neighbor_list"), host_collation=True)
    return WindowSource(reader, plan, specs, batches_per_window=4, **options)  # type: ignore[arg-type]


def test_a_window_is_the_plans_batches_with_their_bounds(reader: AtomicDataZarrReader) -> None:
    source = _source(reader)
    outputs = dict(zip((s.name for s in source.specs), source.read_window(0, 3), strict=True))
    window = source.plan.epoch(0).window(3, 4, ramp=True)  # windows of 1, 2, 4, 4, 4 and 4 of the 19 batches
    assert all(len(arrays) == 1 for arrays in outputs.values())  # one DALI sample per output
    assert outputs[INDICES][0].tolist() == window.indices.tolist()
    assert outputs[BATCH_BOUNDS][0].tolist() == [0, 16, 32, 48, 64]
    n_atoms, n_edges = reader.sample_sizes(window.indices)
    assert outputs[N_ATOMS][0].tolist() == n_atoms.tolist() and outputs[N_EDGES][0].tolist() == n_edges.tolist()
    assert outputs["positions"][0].shape == (int(n_atoms.sum()), 3)
    batch_idx = outputs[BATCH_IDX][0]
    assert batch_idx.dtype == np.int32 and batch_idx.max() == 15  # graph index within each batch
    assert source.num_windows(0) == 6


def test_the_resumed_epoch_starts_at_its_batch_and_later_ones_at_zero(reader: AtomicDataZarrReader) -> None:
    source = _source(reader, start_epoch=2, start_batch=6)
    assert source.epoch_of(0) == (2, 6) and source.epoch_of(1) == (3, 0)
    indices = dict(zip((s.name for s in source.specs), source.read_window(0, 0), strict=True))[INDICES][0]
    assert indices.tolist() == source.plan.epoch(2).batches(6)[0].tolist()  # a resumed epoch ramps up again
    assert source.num_windows(0) == 5 and source.num_windows(1) == 6  # 13 batches: 1, 2, 4, 4, 2; every epoch ramps


def test_every_iteration_past_the_end_stops(reader: AtomicDataZarrReader) -> None:
    source = _source(reader)
    for iteration in (6, 7, 50):
        with pytest.raises(StopIteration):
            source(SimpleNamespace(epoch_idx=0, iteration=iteration))


def test_pickling_drops_the_cached_epoch(reader: AtomicDataZarrReader) -> None:
    source = _source(reader)
    source.read_window(0, 0)
    clone = pickle.loads(pickle.dumps(source))
    assert clone._epoch_plan is None and source._epoch_plan is not None
    try:
        assert [a[0].tolist() for a in clone.read_window(0, 0)][:2] == [a[0].tolist() for a in source.read_window(0, 0)][:2]
    finally:
        clone.reader.close()


def test_blob_layout_entries_are_aligned_and_skip_per_window_outputs(reader: AtomicDataZarrReader) -> None:
    source = _source(reader, layout="blob")
    blob, header = source.read_window(0, 3)  # a window of 4 batches
    entries, total = blob_entries(source.specs, 64, int(header[0][1]), int(header[0][2]))
    assert blob[0].size == total and all(e.offset % 8 == 0 for e in entries)
    assert BATCH_BOUNDS not in {e.name for e in entries}
    assert header[0][-5:].tolist() == [0, 16, 32, 48, 64]  # the batch bounds end the header


def test_errors_keep_their_type_name_through_dali() -> None:
    wrapped = source_error(ValueError("disk on fire"))
    assert str(wrapped) == "[dali-alchemi:ValueError] disk on fire"
    back = loader_error(Exception(f"Exception traceback received from worker thread: {wrapped}"))
    assert back.original_type == "ValueError" and str(back) == "ValueError: disk on fire"
    with pytest.raises(ValueError, match="layout must be one of"):
        WindowSource(None, None, (), batches_per_window=1, layout="batch")  # type: ignore[arg-type]


class _SlowWindows:
    """Stands in for a WindowSource whose reads wait until released (a stalled disk or network)."""

    def __init__(self) -> None:
        self.reading, self.release = threading.Event(), threading.Event()

    def num_windows(self, epoch_idx: int) -> int:
        return 10

    def read_window(self, epoch_idx: int, iteration: int) -> tuple[list[np.ndarray], ...]:
        self.reading.set()
        self.release.wait(HANG_S)
        return ([np.full(1, iteration)],)


@pytest.mark.timeout(30)
def test_closing_the_read_ahead_does_not_wait_for_a_stalled_read() -> None:
    windows = _SlowWindows()
    source = ReadAheadSource(windows, depth=2)  # type: ignore[arg-type]
    results: list[object] = []
    caller = threading.Thread(target=lambda: results.append(source(SimpleNamespace(epoch_idx=0, iteration=0))))
    caller.start()
    assert windows.reading.wait(HANG_S), "window 0 was never read"
    source.close(timeout=0.2)
    assert caller.is_alive() and not windows.release.is_set()  # close() returned while the read still stalls
    windows.release.set()
    caller.join(5)
    assert [r[0][0].tolist() for r in results] == [[0]]  # type: ignore[index]  # the read in progress still ends


def test_a_worker_drops_tblibs_exception_reducers_that_dalis_unpickler_refuses() -> None:
    import copyreg

    from dali_alchemi.pipeline.source import standard_exception_pickling

    class Refused(Exception):
        pass

    def reducer(err: BaseException) -> tuple[object, tuple[object, ...]]:
        return Refused, ()

    reducer.__module__ = "tblib.pickling_support"  # what ``import distributed`` registers for every exception
    copyreg.pickle(Refused, reducer)
    copyreg.pickle(complex, copyreg.dispatch_table[complex])  # others are kept
    standard_exception_pickling()
    assert Refused not in copyreg.dispatch_table
    assert complex in copyreg.dispatch_table
