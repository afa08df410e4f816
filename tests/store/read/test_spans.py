"""Span plans: windows of a few runs read by ranges, with the same rows as the row plan and every damage caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from dali_alchemi import AtomicDataZarrReader, ChunkDecodeError
from dali_alchemi.csr import exclusive_cumsum
from dali_alchemi.store.read import spans
from dali_alchemi.store.read.gather import plan_rows, reorder_rows
from dali_alchemi.store.read.rows import RowReader
from dali_alchemi.store.read.spans import (
    MAX_GAP,
    MAX_OVER_READ,
    MIN_MEAN_RUN,
    SpanPlan,
    blocks_holding,
    covering_runs,
    rows_in_request_order,
    sample_runs,
)
from dali_alchemi.types import PerLevel


def test_sample_runs_of_sequential_block_and_scattered_windows() -> None:
    first, stop = sample_runs(np.arange(40, 140))  # type: ignore[misc]
    assert first.tolist() == [40] and stop.tolist() == [140]
    block = np.concatenate([np.arange(300, 340), np.arange(0, 40), np.arange(100, 164)])
    first, stop = sample_runs(block)  # type: ignore[misc]
    assert first.tolist() == [300, 0, 100] and stop.tolist() == [340, 40, 164]
    assert first.dtype == np.int64 and stop.dtype == np.int64
    scattered = np.random.default_rng(0).permutation(1000)[:100]
    assert sample_runs(scattered) is None  # runs far shorter than MIN_MEAN_RUN
    assert sample_runs(np.zeros(0, dtype=np.int64)) is None
    first, stop = sample_runs(np.arange(5, 5 + MIN_MEAN_RUN - 1))  # type: ignore[misc]
    assert first.tolist() == [5] and stop.tolist() == [5 + MIN_MEAN_RUN - 1]  # one run, however short
    assert sample_runs(np.array([0, 1, 5, 6])) is None  # two runs shorter than MIN_MEAN_RUN


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(0, 9), min_size=1, max_size=60),
    data=st.data(),
    block_rows=st.integers(1, 13),
)
def test_span_plan_copies_the_rows_of_the_row_plan(counts: list[int], data: st.DataObject, block_rows: int) -> None:
    n = len(counts)
    ptr = exclusive_cumsum(np.asarray(counts, dtype=np.int64))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=5)))
    pieces = [np.arange(a, b) for a, b in zip([0, *cuts], [*cuts, n], strict=True) if b > a]
    order = data.draw(st.permutations(range(len(pieces))))
    physical = np.concatenate([pieces[k] for k in order]).astype(np.int64)
    first = np.array([pieces[k][0] for k in order], dtype=np.int64)
    stop = np.array([pieces[k][-1] + 1 for k in order], dtype=np.int64)

    plan = SpanPlan.of(first, stop, ptr)
    rows_plan, got_counts = plan_rows(ptr, physical, np.argsort(physical, kind="stable"))
    assert plan.total == rows_plan.total == int(got_counts.sum())
    np.testing.assert_array_equal(plan.rows, rows_plan.rows)
    np.testing.assert_array_equal(plan.dest_rows, rows_plan.dest)

    values = np.arange(int(ptr[-1]), dtype=np.int64) * 10  # row r of the store holds 10 r
    want = np.empty(rows_plan.total, dtype=np.int64)
    want[rows_plan.dest] = values[rows_plan.rows]
    blocks, bounds = plan.blocks(block_rows)
    assert np.all(np.diff(blocks) > 0)
    got = np.full(plan.total, -1, dtype=np.int64)
    for k, block in enumerate(blocks.tolist()):  # every block's segments from its decoded rows alone
        first_row = block * block_rows
        block_data = values[first_row : first_row + block_rows]
        plan.scatter(got, int(bounds[k]), int(bounds[k + 1]), block_data, first_row, block_rows)
    np.testing.assert_array_equal(got, want)
    assert plan.segment_rows(0, int(bounds[-1]), block_rows) == plan.total
    taken = np.full(plan.total, -1, dtype=np.int64)
    plan.take(taken, values)
    np.testing.assert_array_equal(taken, want)


def test_rows_read_in_store_order_go_back_to_request_order() -> None:
    ptr = exclusive_cumsum(np.array([4, 1, 1, 0, 1, 2, 9, 3], dtype=np.int64))  # rows of samples 0..7
    physical = np.array([7, 5, 2, 4])  # request order
    first, stop = np.array([2, 4]), np.array([3, 8])  # read as samples 2 | 4, 5, 6, 7 (6 read through)
    rows = rows_in_request_order(first, stop, physical, ptr)
    # the read's rows: sample 2 (row 0), 4 (1), 5 (2, 3), 6 (4..12), 7 (13, 14, 15)
    assert rows.tolist() == [13, 14, 15, 2, 3, 0, 1]
    assert rows_in_request_order(first, stop, physical, None).tolist() == [4, 2, 0, 1]  # one row a sample
    exact = rows_in_request_order(np.array([5, 7]), np.array([6, 8]), np.array([7, 5]), ptr)  # runs of the window itself
    assert exact.tolist() == [2, 3, 4, 0, 1]
    read = np.arange(32, dtype=np.float32).reshape(16, 2)
    taken = reorder_rows(read, rows)
    assert taken.dtype == np.float32 and taken.shape == (7, 2)
    assert taken.tolist() == read[rows].tolist()
    assert reorder_rows(np.arange(16), rows).tolist() == rows.tolist()
    assert reorder_rows(np.zeros((0, 2)), np.zeros(0, dtype=np.int64)).shape == (0, 2)  # a level with no rows


def test_covering_runs_read_through_short_gaps_within_bounds() -> None:
    assert covering_runs(np.zeros(0, dtype=np.int64)) is None
    first, stop = covering_runs(np.array([3, 4, 5, 9, 10]))  # type: ignore[misc]
    assert first.tolist() == [3] and stop.tolist() == [11]  # a gap of 3 read through
    assert first.dtype == np.int64 and stop.dtype == np.int64
    far = np.concatenate([np.arange(0, 100, 2), np.arange(1000, 1100, 2)])  # two dense stretches
    first, stop = covering_runs(far)  # type: ignore[misc]
    assert first.tolist() == [0, 1000] and stop.tolist() == [99, 1099]
    for gap, runs in ((MAX_GAP, 1), (MAX_GAP + 1, 2)):  # samples left out between two dense stretches
        both = np.concatenate([np.arange(0, 100), np.arange(100 + gap, 200 + gap)])
        first, stop = covering_runs(both)  # type: ignore[misc]
        assert first.size == runs and int(stop[-1]) == 200 + gap
    apart = np.arange(0, 200 * (MAX_GAP + 2), MAX_GAP + 2)
    assert covering_runs(apart) is None  # runs of one sample each: read row by row
    sparse = np.arange(0, 1000, MAX_GAP)  # read through, but MAX_GAP times the samples asked for
    assert MAX_GAP > MAX_OVER_READ and covering_runs(sparse) is None
    first, stop = covering_runs(np.arange(0, 1000, MAX_OVER_READ))  # type: ignore[misc]
    assert first.tolist() == [0] and stop.tolist() == [1000 - MAX_OVER_READ + 1]  # the limit itself is allowed


def test_blocks_holding_a_window_are_the_blocks_of_its_own_rows() -> None:
    starts = PerLevel(atom=np.array([40, 5, 70]), edge=np.array([0, 0, 30]), system=np.array([9, 0, 30]))
    counts = PerLevel(atom=np.array([3, 0, 12]), edge=np.array([0, 0, 1]), system=None)
    blocks = blocks_holding(starts, counts)
    assert blocks("atom", 10) == [4, 7, 8]  # rows 40..42 and 70..81; the empty sample at 5 holds none
    assert blocks("atom", 100) == [0]
    assert blocks("edge", 10) == [3]
    assert blocks("system", 10) == [0, 3]


def test_system_rows_are_one_per_sample() -> None:
    plan = SpanPlan.of(np.array([5, 0]), np.array([8, 2]), None)
    assert plan.total == 5
    assert plan.starts.tolist() == [0, 5] and plan.stops.tolist() == [2, 8] and plan.dest.tolist() == [3, 0]
    assert plan.rows.tolist() == [0, 1, 5, 6, 7] and plan.dest_rows.tolist() == [3, 4, 0, 1, 2]


WINDOWS = {
    "sequential": np.arange(20, 260),
    "spans": np.concatenate([np.arange(200, 264), np.arange(0, 48), np.arange(120, 180)]),
    "tail": np.arange(236, 300),
    "shuffled spans": np.random.default_rng(4).permutation(np.concatenate([np.arange(200, 264), np.arange(0, 48)])),
}


def _read_by_rows(path: Path, indices: np.ndarray, cache_bytes: int, monkeypatch: pytest.MonkeyPatch) -> object:
    with monkeypatch.context() as m:
        m.setattr(spans, "MIN_MEAN_RUN", 10**9)  # no window is read by spans
        with AtomicDataZarrReader(path, cache_bytes=cache_bytes) as reader:
            return reader.read_packed(indices)


@pytest.mark.parametrize(
    ("store", "cache_bytes"),
    [("small_store", 0), ("small_store", 1 << 30), ("sharded_store", 0), ("raw_store", 0)],
)  # compressed blocks decoded, compressed arrays held whole, shards, raw arrays read in place
@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_span_windows_read_what_row_windows_read(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, store: str, window: str, cache_bytes: int
) -> None:
    path: Path = request.getfixturevalue(store)
    indices = WINDOWS[window]
    want = _read_by_rows(path, indices, cache_bytes, monkeypatch)
    with AtomicDataZarrReader(path, cache_bytes=cache_bytes) as reader:
        for _ in range(2):  # cold, then whatever the cache kept
            got = reader.read_packed(indices)
            for name, expected in want.fields.items():  # type: ignore[attr-defined]
                actual = got.fields[name]
                assert actual.dtype == expected.dtype and actual.shape == expected.shape, name
                np.testing.assert_array_equal(actual, expected, err_msg=name)
            np.testing.assert_array_equal(got.n_atoms, want.n_atoms)  # type: ignore[attr-defined]
            np.testing.assert_array_equal(got.n_edges, want.n_edges)  # type: ignore[attr-defined]


def _no_row_reads(*_: object) -> None:
    raise AssertionError("a span window was read row by row")


def _raw_copy(raw_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of ``raw_store`` to damage, read with row-by-row reads forbidden (so by spans)."""
    path = tmp_path / "raw.zarr"
    shutil.copytree(raw_store, path)
    monkeypatch.setattr(RowReader, "read", _no_row_reads)
    return path


def test_a_corrupt_raw_chunk_read_by_spans_names_the_chunk(
    raw_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _raw_copy(raw_store, tmp_path, monkeypatch)
    victim = path / "core" / "positions" / "c" / "0" / "0"
    data = bytearray(victim.read_bytes())
    data[0] ^= 0xFF  # the first row's first byte: the chunk's crc32c no longer matches
    victim.write_bytes(bytes(data))
    with AtomicDataZarrReader(path, cache_bytes=0) as reader:
        with pytest.raises(ChunkDecodeError, match=r"'core/positions': chunk 0 in 'core/positions/c/0/0'.*crc32c"):
            reader.read_packed(np.arange(0, 64), fields=["positions"])
        reader.read_packed(np.arange(200, 264), fields=["positions"])  # other chunks still read


def test_a_lost_raw_chunk_read_by_spans_is_an_error_in_a_complete_store(
    raw_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _raw_copy(raw_store, tmp_path, monkeypatch)
    (path / "core" / "positions" / "c" / "1" / "0").unlink()
    with AtomicDataZarrReader(path, cache_bytes=0) as reader:
        with pytest.raises(ChunkDecodeError, match=r"chunk 1 .*is missing, but the store promises"):
            reader.read_packed(np.arange(0, 64), fields=["positions"])


def test_a_truncated_raw_chunk_read_by_spans_is_a_length_error(
    raw_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _raw_copy(raw_store, tmp_path, monkeypatch)
    victim = path / "core" / "positions" / "c" / "0" / "0"
    victim.write_bytes(victim.read_bytes()[:-100])
    with AtomicDataZarrReader(path, cache_bytes=0) as reader:
        with pytest.raises(ChunkDecodeError, match=r"chunk 0 in 'core/positions/c/0/0' holds \d+ bytes, expected"):
            reader.read_packed(np.arange(0, 64), fields=["positions"])
