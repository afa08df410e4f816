from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from dali_alchemi.csr import exclusive_cumsum
from dali_alchemi.store.read.gather import BlockJob, LevelPlan, contiguous_groups, plan_rows, rows_view, scatter


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


def _job(rows: int, cached: bool, block_rows: int = 10, row_nbytes: int = 4) -> BlockJob:
    handle = SimpleNamespace(codec=SimpleNamespace(block_rows=block_rows, row_nbytes=row_nbytes))
    plan = LevelPlan(rows=np.zeros(0, np.int64), dest=np.zeros(0, np.int64), total=0)
    data = np.zeros(1) if cached else None
    return BlockJob(handle=handle, block=0, plan=plan, lo=0, hi=rows, data=data)  # type: ignore[arg-type]


def test_contiguous_groups_keep_job_order_and_balance_bytes() -> None:
    few = [_job(5, False), _job(9, True)]
    assert contiguous_groups(few, 4) == [[few[0]], [few[1]]]
    rng = np.random.default_rng(3)
    jobs = [_job(int(r), bool(c)) for r, c in zip(rng.integers(1, 30, 50), rng.integers(0, 2, 50), strict=True)]
    groups = contiguous_groups(jobs, 5)
    assert [j for g in groups for j in g] == jobs  # consecutive runs, in order, each job once
    assert 1 < len(groups) <= 5 and all(groups)

    def cost(group: list[BlockJob]) -> int:  # decoding a block costs its 10 rows; scattering, each row
        return sum(j.hi - j.lo + (10 if j.data is None else 0) for j in group)

    costs = [cost(g) for g in groups]
    assert max(costs) - min(costs) <= 2 * max(cost([j]) for j in jobs)


def test_scatter_moves_rows_of_a_block_to_their_destinations() -> None:
    block = np.arange(24, dtype=np.float32).reshape(8, 3)
    plan = LevelPlan(rows=np.array([17, 19, 20], np.int64), dest=np.array([2, 0, 1], np.int64), total=3)
    out = np.zeros((3, 3), np.float32)
    scatter(out, plan, 0, 3, block, 16, 16)
    assert out.tolist() == [block[3].tolist(), block[4].tolist(), block[1].tolist()]
    assert rows_view(out).shape == (3,) and rows_view(out).dtype.itemsize == 12
