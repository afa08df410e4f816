from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from dali_alchemi.store.gather import concat_aranges, exclusive_cumsum, plan_rows


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 6)), max_size=30))
def test_concat_aranges_matches_the_loop(pairs: list[tuple[int, int]]) -> None:
    starts = np.array([s for s, _ in pairs], dtype=np.int64)
    counts = np.array([c for _, c in pairs], dtype=np.int64)
    expected = np.concatenate([np.arange(s, s + c) for s, c in pairs]) if pairs else np.zeros(0)
    assert concat_aranges(starts, counts).tolist() == expected.tolist()


@given(st.lists(st.integers(0, 5), min_size=1, max_size=20), st.data())
def test_plan_rows_sorted_and_scatter_to_request_order(counts: list[int], data: st.DataObject) -> None:
    ptr = exclusive_cumsum(np.array(counts, dtype=np.int64))
    n = len(counts)
    physical = np.array(data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n)), dtype=np.int64)
    order = np.argsort(physical, kind="stable")
    plan, got_counts = plan_rows(ptr, physical, order)
    assert got_counts.tolist() == [counts[p] for p in physical]
    assert (np.diff(plan.rows) >= 0).all()
    out = np.empty(plan.total, dtype=np.int64)
    out[plan.dest] = plan.rows
    expected = [r for p in physical for r in range(ptr[p], ptr[p + 1])]
    assert out.tolist() == expected
    blocks, bounds = plan.blocks(3)
    assert len(set(blocks.tolist())) == len(blocks)
    for k, b in enumerate(blocks):
        assert (plan.rows[bounds[k] : bounds[k + 1]] // 3 == b).all()
