"""BudgetPlan: greedy batches under atom and edge budgets, equal counts per shard, exactly once per epoch."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_alchemi.errors import PlanError
from dali_alchemi.plan import BudgetPlan, Plan, pack_greedy


def _sizes(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_atoms = rng.integers(1, 60, size=n)
    return n_atoms, n_atoms * rng.integers(0, 12, size=n)


@settings(deadline=None, max_examples=80)
@given(
    atoms=st.lists(st.integers(0, 30), max_size=60),
    max_atoms=st.integers(30, 120),
    max_edges=st.one_of(st.none(), st.integers(60, 300)),
    cap=st.one_of(st.none(), st.integers(1, 9)),
)
def test_greedy_batches_respect_every_budget_and_are_maximal(
    atoms: list[int], max_atoms: int, max_edges: int | None, cap: int | None
) -> None:
    n_atoms = np.array(atoms, dtype=np.int64)
    n_edges = 2 * n_atoms
    ptr = pack_greedy(n_atoms, n_edges, max_atoms=max_atoms, max_edges=max_edges, max_structures=cap)
    assert ptr[0] == 0 and ptr[-1] == len(atoms) and (np.diff(ptr) >= 1).all()
    for lo, hi in zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True):
        assert n_atoms[lo:hi].sum() <= max_atoms
        assert max_edges is None or n_edges[lo:hi].sum() <= max_edges
        assert cap is None or hi - lo <= cap
        if hi < len(atoms):  # greedy: the next structure would have broken a budget
            grown = slice(lo, hi + 1)
            assert (
                n_atoms[grown].sum() > max_atoms
                or (max_edges is not None and n_edges[grown].sum() > max_edges)
                or (cap is not None and hi + 1 - lo > cap)
            )


@pytest.mark.parametrize("shards", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shards_get_equal_counts_and_every_structure_once_apart_from_whole_repeated_batches(
    shards: int, drop_last: bool
) -> None:
    n_atoms, n_edges = _sizes(1000)
    plans = [
        BudgetPlan(
            n_atoms=n_atoms, n_edges=n_edges, max_atoms=512, seed=5, shard_id=r, num_shards=shards, drop_last=drop_last
        )
        for r in range(shards)
    ]
    epochs = [p.epoch(3) for p in plans]
    assert len({e.num_batches for e in epochs}) == 1
    order, ptr = plans[0].global_batches(3)
    batches = {tuple(order[a:b].tolist()) for a, b in itertools.pairwise(ptr.tolist())}
    seen = np.concatenate([e.order[: e.batch_ptr[-1]] for e in epochs])
    for e in epochs:
        for batch in e.batches():
            assert tuple(batch.tolist()) in batches  # whole global batches, dealt as they are
            assert n_atoms[batch].sum() <= 512
    counts = np.bincount(seen, minlength=1000)
    total = int(ptr.size - 1)
    if drop_last:
        assert counts.max() == 1 and epochs[0].num_batches == total // shards
    else:
        assert counts.min() == 1  # nobody is skipped
        repeated = epochs[0].num_batches * shards - total
        assert 0 <= repeated < shards  # at most shards-1 batches repeat, whole


def test_deterministic_by_seed_and_epoch() -> None:
    n_atoms, n_edges = _sizes(500)
    plan = BudgetPlan(n_atoms=n_atoms, n_edges=n_edges, max_atoms=300, max_edges=900, seed=1)
    again = BudgetPlan(n_atoms=n_atoms, n_edges=n_edges, max_atoms=300, max_edges=900, seed=1)
    assert np.array_equal(plan.epoch(2).order, again.epoch(2).order)
    assert np.array_equal(plan.epoch(2).batch_ptr, again.epoch(2).batch_ptr)
    assert not np.array_equal(plan.epoch(2).order, plan.epoch(3).order)
    ordered = BudgetPlan(n_atoms=n_atoms, n_edges=n_edges, max_atoms=300, shuffle=False)
    assert ordered.epoch(0).order.tolist() == list(range(500))
    assert isinstance(plan, Plan)


def test_a_structure_over_budget_is_named_unless_it_may_stand_alone() -> None:
    n_atoms = np.array([10, 700, 20, 30, 650])
    with pytest.raises(PlanError, match=r"structure 1 has 700 atoms, more than max_atoms=512 \(2 structure"):
        BudgetPlan(n_atoms=n_atoms, n_edges=np.zeros(5, np.int64), max_atoms=512)
    with pytest.raises(PlanError, match="structure 2 has 90 edges, more than max_edges=80"):
        BudgetPlan(n_atoms=n_atoms, n_edges=np.array([1, 2, 90, 3, 4]), max_edges=80, oversized="error")
    alone = BudgetPlan(n_atoms=n_atoms, n_edges=np.zeros(5, np.int64), max_atoms=512, shuffle=False, oversized="alone")
    assert [b.tolist() for b in alone.epoch(0).batches()] == [[0], [1], [2, 3], [4]]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_atoms": 0}, "max_atoms must be a positive integer"),
        ({"max_atoms": 2.5}, "max_atoms must be a positive integer"),
        ({"max_edges": True}, "max_edges must be a positive integer"),
        ({}, "needs max_atoms, max_edges or both"),
        ({"max_atoms": 10, "oversized": "skip"}, "oversized must be one of"),
        ({"max_atoms": 10, "max_structures": -1}, "max_structures must be a positive integer"),
    ],
)
def test_bad_budgets_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        BudgetPlan(n_atoms=np.ones(3, np.int64), n_edges=np.ones(3, np.int64), **options)  # type: ignore[arg-type]


def test_to_dict_is_plain_data_that_tells_stores_apart() -> None:
    n_atoms, n_edges = _sizes(50)
    plan = BudgetPlan(n_atoms=n_atoms, n_edges=n_edges, max_atoms=100)
    other = BudgetPlan(n_atoms=n_atoms[::-1].copy(), n_edges=n_edges[::-1].copy(), max_atoms=100)
    assert json.loads(json.dumps(plan.to_dict())) == plan.to_dict()
    assert plan.to_dict()["kind"] == "budget" and plan.to_dict() != other.to_dict()


def test_pad_reserves_a_row_and_names_the_users_budget() -> None:
    from dali_alchemi.plan import PlanArguments, build_plan

    sizes = (np.array([5, 11, 3]), np.array([4, 4, 4]))
    with pytest.raises(
        PlanError, match=r"structure 1 has 11 atoms; with pad=True a batch holds at most max_atoms - 1 = 10"
    ):
        build_plan(None, PlanArguments(max_atoms=11, max_edges=50, pad=True), 3, lambda: sizes)
    with pytest.raises(PlanError, match="oversized= must be 'error'"):
        build_plan(None, PlanArguments(max_atoms=20, max_edges=50, pad=True, oversized="alone"), 3, lambda: sizes)
    plan = build_plan(None, PlanArguments(max_atoms=12, max_edges=50, pad=True), 3, lambda: sizes)
    assert isinstance(plan, BudgetPlan) and plan.max_atoms == 11 and plan.max_edges == 49


def test_numpy_integers_are_integers() -> None:
    plan = BudgetPlan(
        n_atoms=np.ones(4), n_edges=np.ones(4), max_atoms=2, shard_id=np.int64(1), num_shards=2, seed=np.int64(3)
    )
    assert plan.epoch(0).num_batches == 1


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("block", [1, 6, 1 << 21])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_packed_block_by_block_are_the_whole_orders_batches_dealt(
    shuffle: bool, block: int, drop_last: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dali_alchemi.plan import budget
    from dali_alchemi.plan.budget import deal_batches

    monkeypatch.setattr(budget, "STREAM_BLOCK", block)  # batches cross block ends, and outgrow a block
    n_atoms, n_edges = _sizes(300, seed=2)
    for shards in (1, 3, 8):
        for r in range(shards):
            plan = BudgetPlan(
                n_atoms=n_atoms, n_edges=n_edges, max_atoms=150, max_edges=700, seed=4, shard_id=r, num_shards=shards,
                drop_last=drop_last, shuffle=shuffle, permutation="keyed",
            )  # fmt: skip
            order, ptr = plan.global_batches(2)
            if shuffle:
                assert np.array_equal(np.sort(order), np.arange(300))
            expected = deal_batches(2, order, ptr, shard_id=r, num_shards=shards, drop_last=drop_last)
            got = plan.epoch(2)
            assert np.array_equal(got.order, expected.order) and np.array_equal(got.batch_ptr, expected.batch_ptr)


def test_a_keyed_order_packs_fresh_batches_each_epoch_and_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    from dali_alchemi.plan import order

    n_atoms, n_edges = _sizes(2000)
    plan = BudgetPlan(n_atoms=n_atoms, n_edges=n_edges, max_atoms=300, seed=1, permutation="keyed")
    first, again = (
        plan.epoch(0),
        BudgetPlan(n_atoms=n_atoms, n_edges=n_edges, max_atoms=300, seed=1, permutation="keyed").epoch(0),
    )
    assert np.array_equal(first.order, again.order) and np.array_equal(first.batch_ptr, again.batch_ptr)
    assert not np.array_equal(first.order, plan.epoch(1).order)
    assert abs(np.corrcoef(np.arange(2000), first.order)[0, 1]) < 0.1
    assert plan.to_dict()["permutation"] == "keyed"
    drawn = BudgetPlan(n_atoms=n_atoms, n_edges=n_edges, max_atoms=300, seed=1)
    assert "permutation" not in drawn.to_dict()  # the identity saved before keyed orders existed
    monkeypatch.setattr(order, "KEYED_MIN_SAMPLES", 2000)
    assert BudgetPlan(n_atoms=n_atoms, n_edges=n_edges, max_atoms=300).permutation == "keyed"


def test_compact_sizes_are_kept_and_checksummed_as_int32() -> None:
    n_atoms, n_edges = _sizes(100)
    small = BudgetPlan(n_atoms=n_atoms.astype(np.uint16), n_edges=n_edges.astype(np.uint16), max_atoms=100)
    wide = BudgetPlan(n_atoms=n_atoms, n_edges=n_edges, max_atoms=100)
    assert small.n_atoms.dtype == np.uint16 and wide.n_atoms.dtype == np.int32  # int64 is narrowed, uint16 kept
    assert small.fingerprint() == wide.fingerprint()
    import zlib

    old = zlib.crc32(n_edges.astype(np.int32).tobytes(), zlib.crc32(n_atoms.astype(np.int32).tobytes()))
    assert wide.fingerprint() == f"{old:08x}"  # the checksum saved states hold, unchanged
    with pytest.raises(PlanError, match="n_atoms and n_edges must be non-negative: n_atoms of structure 1 is -1"):
        BudgetPlan(n_atoms=np.array([1, -1], np.int16), n_edges=np.ones(2, np.int16), max_atoms=5)
    with pytest.raises(PlanError, match="n_edges of structure 0 is -3"):
        BudgetPlan(n_atoms=np.ones(2), n_edges=np.array([-3.0, 1.0]), max_atoms=5)
