from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from dali_alchemi.csr import exclusive_cumsum
from dali_alchemi.store.gather import plan_rows


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
