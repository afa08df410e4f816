"""The CSR helpers against the per-sample loops they replace."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dali_alchemi.csr import block_sample_starts, concat_aranges, exclusive_cumsum, first_out_of_range, rebase


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 6)), max_size=30))
def test_concat_aranges_matches_the_loop(pairs: list[tuple[int, int]]) -> None:
    starts = np.array([s for s, _ in pairs], dtype=np.int64)
    counts = np.array([c for _, c in pairs], dtype=np.int64)
    expected = np.concatenate([np.arange(s, s + c) for s, c in pairs]) if pairs else np.zeros(0)
    assert concat_aranges(starts, counts).tolist() == expected.tolist()


def test_exclusive_cumsum_is_a_pointer() -> None:
    ptr = exclusive_cumsum(np.array([3, 0, 2], dtype=np.int64))
    assert ptr.dtype == np.int64 and ptr.tolist() == [0, 3, 3, 5]
    assert exclusive_cumsum(np.zeros(0, dtype=np.int64)).tolist() == [0]


@given(st.lists(st.integers(0, 4), min_size=1, max_size=12), st.integers(-1, 1).filter(bool))
def test_rebase_shifts_each_sample_by_its_offset_in_place(n_edges: list[int], sign: int) -> None:
    counts = np.array(n_edges, dtype=np.int64)
    values = np.arange(2 * counts.sum(), dtype=np.int32).reshape(-1, 2)
    offsets = np.arange(counts.size, dtype=np.int64) * 100
    expected = values.copy()
    row = 0
    for i, c in enumerate(n_edges):
        expected[row : row + c] += sign * offsets[i]
        row += c
    out = rebase(values, offsets, counts, sign=sign)
    assert out is values and out.dtype == np.int32
    assert values.tolist() == expected.tolist()


def test_first_out_of_range_names_the_edge_and_its_sample() -> None:
    n_atoms = np.array([3, 2, 4], dtype=np.int64)
    n_edges = np.array([2, 0, 3], dtype=np.int64)
    values = np.array([[0, 2], [1, 0], [3, 0], [0, 4], [1, 1]])
    assert first_out_of_range(values, n_atoms, n_edges) == (3, 2)
    values[3, 1] = 3
    assert first_out_of_range(values, n_atoms, n_edges) is None
    values[0, 0] = -1
    assert first_out_of_range(values, n_atoms, n_edges) == (0, 0)
    assert first_out_of_range(np.zeros((0, 2), dtype=np.int64), n_atoms, np.zeros(3, dtype=np.int64)) is None


def test_block_sample_starts_puts_a_straddling_sample_with_its_first_block() -> None:
    ptr = np.array([0, 3, 9, 10, 14, 20, 21], dtype=np.int64)  # samples start at rows 0, 3, 9, 10, 14, 20
    assert block_sample_starts(ptr, 10, np.arange(6)).tolist() == [0, 3, 5, 6]
    assert block_sample_starts(ptr, 10, np.array([0, 2, 5])).tolist() == [0, 2, 3]  # rows 0, 9, 20
    assert block_sample_starts(ptr, 10, np.zeros(0, dtype=np.int64)).tolist() == [0]


@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4)), min_size=1, max_size=15),
    st.sampled_from([np.int64, np.int32, np.uint32]),
    st.data(),
)
def test_first_out_of_range_matches_the_loop(
    samples: list[tuple[int, int]], dtype: type[np.integer], data: st.DataObject
) -> None:
    n_atoms = np.array([a for a, _ in samples], dtype=np.int64)
    n_edges = np.array([e for _, e in samples], dtype=np.int64)
    low = 0 if dtype == np.uint32 else -2
    values = np.array(
        data.draw(st.lists(st.integers(low, 6), min_size=2 * int(n_edges.sum()), max_size=2 * int(n_edges.sum()))),
        dtype=dtype,
    ).reshape(-1, 2)
    expected = None
    row = 0
    for i, (atoms, edges) in enumerate(samples):  # the loop the one pass replaces
        for r in range(row, row + edges):
            if expected is None and any(v < 0 or v >= atoms for v in values[r].tolist()):
                expected = (r, i)
        row += edges
    assert first_out_of_range(values, n_atoms, n_edges) == expected


@pytest.mark.parametrize("trailing", [(), (3,), (2, 2)])
def test_rebase_shifts_every_column_of_each_row(trailing: tuple[int, ...]) -> None:
    counts = np.array([2, 0, 3], dtype=np.int64)
    values = np.arange(int(counts.sum()) * int(np.prod(trailing, dtype=np.int64)), dtype=np.int64).reshape(-1, *trailing)
    expected = values + np.repeat([10, 20, 30], counts).reshape((-1,) + (1,) * len(trailing))
    assert rebase(values, np.array([10, 20, 30]), counts).tolist() == expected.tolist()


@pytest.mark.parametrize("group", [1, 3, 5, 1 << 15])
def test_rebase_in_groups_of_samples_equals_one_pass(group: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import dali_alchemi.csr as csr_module

    monkeypatch.setattr(csr_module, "REBASE_GROUP", group)
    counts = np.array([0, 2, 7, 0, 1, 3, 0], dtype=np.int64)  # a sample bigger than a group, empty ones between
    offsets = np.arange(counts.size, dtype=np.int64) * 1000
    values = np.arange(2 * int(counts.sum()), dtype=np.int32).reshape(-1, 2)
    expected = values - np.repeat(offsets, counts)[:, None].astype(np.int32)
    assert rebase(values, offsets, counts, sign=-1).tolist() == expected.tolist()


def test_rebase_of_a_view_shifts_the_view_in_place() -> None:
    base = np.zeros((4, 3), dtype=np.int64)
    view = base[:, :2]  # not contiguous: rows are walked through the view
    rebase(view, np.array([5, 7]), np.array([1, 3]), sign=1)
    assert base.tolist() == [[5, 5, 0], [7, 7, 0], [7, 7, 0], [7, 7, 0]]
