"""BlockShufflePlan: exactly once per epoch, seeded, buffers of spans, sharding by runs, elastic resume."""

from __future__ import annotations

import itertools
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_alchemi import AtomicDataZarrReader, MultiReader
from dali_alchemi.errors import ConfigTypeError, PlanError
from dali_alchemi.interop.read_many import ReadManyAdapter
from dali_alchemi.plan import (
    BlockShuffle,
    BlockShufflePlan,
    BudgetPlan,
    ElasticPlan,
    PlanArguments,
    build_plan,
    restore,
    store_chunking,
)
from dali_alchemi.plan.block import DEFAULT_SPAN_SIZE
from dali_alchemi.plan.spans import fixed_spans
from dali_alchemi.store.read.cache import DEFAULT_CACHE_BYTES


def _plan(n: int = 1000, span: int = 37, buffer_spans: int = 3, **kwargs: Any) -> BlockShufflePlan:
    kwargs.setdefault("batch_size", 16)
    return BlockShufflePlan(span_bounds=fixed_spans(n, span), buffer_spans=buffer_spans, **kwargs)


def _shards(plan: BlockShufflePlan, num_shards: int) -> list[BlockShufflePlan]:
    from dataclasses import replace

    return [replace(plan, shard_id=r, num_shards=num_shards) for r in range(num_shards)]


@pytest.mark.parametrize("permutation", ["drawn", "keyed"])
def test_every_structure_exactly_once_per_epoch_in_buffers_of_whole_spans(permutation: str) -> None:
    span, k, buffers = 37, 3, 9
    n = span * k * buffers
    plan = _plan(n, span, k, permutation=permutation)
    order = plan.epoch(0).order
    assert np.array_equal(np.sort(order), np.arange(n))
    # the order is buffer after buffer, and each buffer is exactly k whole spans
    for chunk in order.reshape(buffers, k * span):
        spans, counts = np.unique(chunk // span, return_counts=True)
        assert spans.size == k and np.all(counts == span)


def test_structures_inside_a_buffer_are_shuffled_not_left_in_order() -> None:
    order = _plan(2000, 100, 4).epoch(0).order
    steps = np.diff(order)
    assert (steps == 1).mean() < 0.05  # a buffer read in sequence would step by one almost everywhere


@pytest.mark.parametrize("permutation", ["drawn", "keyed"])
def test_same_seed_same_order_new_epoch_or_seed_new_order(permutation: str) -> None:
    a, b = _plan(seed=3, permutation=permutation).epoch(2), _plan(seed=3, permutation=permutation).epoch(2)
    assert np.array_equal(a.order, b.order) and np.array_equal(a.batch_ptr, b.batch_ptr)
    assert not np.array_equal(a.order, _plan(seed=3, permutation=permutation).epoch(3).order)
    assert not np.array_equal(a.order, _plan(seed=4, permutation=permutation).epoch(2).order)


def test_a_keyed_block_order_draws_the_same_spans_and_shuffles_each_buffer_alone() -> None:
    drawn, keyed = _plan(2000, 50, 4, seed=6), _plan(2000, 50, 4, seed=6, permutation="keyed")
    a, b = drawn.global_order(1), keyed.global_order(1)
    buffers_a = [set(chunk.tolist()) for chunk in a.reshape(10, 200)]
    buffers_b = [set(chunk.tolist()) for chunk in b.reshape(10, 200)]
    assert buffers_a == buffers_b  # the same span order, so the same buffers ...
    assert not np.array_equal(a, b)  # ... shuffled by other generators
    assert keyed.to_dict()["permutation"] == "keyed" and "permutation" not in drawn.to_dict()
    assert (np.abs(np.diff(b)) == 1).mean() < 0.05
    with pytest.raises(PlanError, match=r"different plan: permutation=None \(loader has 'keyed'\)"):
        restore(keyed, {"epoch": 1, "batch": 2, "plan": drawn.to_dict()})


@pytest.mark.parametrize("budgeted", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_keyed_shards_take_their_runs_of_the_whole_orders_batches(
    budgeted: bool, drop_last: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dali_alchemi.csr import concat_aranges
    from dali_alchemi.plan import budget as budget_module
    from dali_alchemi.plan.block import deal
    from dali_alchemi.plan.budget import pack_greedy

    monkeypatch.setattr(budget_module, "STREAM_BLOCK", 11)  # packing crosses blocks and buffers
    n = 700
    n_atoms = np.random.default_rng(1).integers(1, 30, size=n)
    budget = BudgetPlan(n_atoms=n_atoms, n_edges=2 * n_atoms, max_atoms=120, shuffle=False) if budgeted else None
    for shards in (1, 3, 8):
        for r in range(shards):
            plan = BlockShufflePlan(
                span_bounds=fixed_spans(n, 23), buffer_spans=3, batch_size=None if budgeted else 9, budget=budget,
                seed=2, drop_last=drop_last, shard_id=r, num_shards=shards, permutation="keyed",
            )  # fmt: skip
            order, ptr = plan.global_batches(3)
            if budgeted:
                assert np.array_equal(
                    ptr, pack_greedy(n_atoms[order], None, max_atoms=120, max_edges=None, max_structures=None)
                )
            mine = deal(np.arange(ptr.size - 1), shards, drop_last)[r]
            expected = order[concat_aranges(ptr[mine], ptr[mine + 1] - ptr[mine])]
            assert np.array_equal(plan.epoch(3).order, expected)


@pytest.mark.parametrize("num_shards", [1, 2, 3, 5])
def test_shards_are_disjoint_runs_that_cover_the_store_with_equal_counts(num_shards: int) -> None:
    n, span, k = 1003, 41, 2
    plans = _shards(_plan(n, span, k), num_shards)
    epochs = [p.epoch(1) for p in plans]
    assert len({e.num_batches for e in epochs}) == 1
    everything = np.concatenate([e.order for e in epochs])
    assert set(everything.tolist()) == set(range(n))
    total_batches = int(plans[0].global_batches(1)[1].size - 1)
    padding = epochs[0].num_batches * num_shards - total_batches
    assert 0 <= padding < num_shards
    assert everything.size - n <= padding * 16  # only the wrap-around batches repeat structures
    # shards read disjoint spans, except the buffers cut where one shard's run ends and the next begins
    spans = [set((e.order // span).tolist()) for e in epochs[: num_shards if not padding else num_shards - 1]]
    shared = sum(len(a & b) for i, a in enumerate(spans) for b in spans[i + 1 :])
    assert shared <= 2 * k * (num_shards - 1)


def test_drop_last_truncates_instead_of_repeating() -> None:
    plans = _shards(_plan(1003, 41, 2, drop_last=True), 3)
    epochs = [p.epoch(0) for p in plans]
    everything = np.concatenate([e.order for e in epochs])
    assert np.unique(everything).size == everything.size
    assert all(np.diff(e.batch_ptr).min() == 16 for e in epochs)


def test_budget_batches_hold_the_budget_and_every_structure_once() -> None:
    rng = np.random.default_rng(0)
    n_atoms = rng.integers(1, 40, size=500)
    budget = BudgetPlan(n_atoms=n_atoms, n_edges=n_atoms * 3, max_atoms=200, shuffle=False)
    plan = BlockShufflePlan(span_bounds=fixed_spans(500, 50), buffer_spans=2, budget=budget)
    epoch = plan.epoch(0)
    assert np.array_equal(np.sort(epoch.order), np.arange(500))
    per_batch = np.add.reduceat(n_atoms[epoch.order], epoch.batch_ptr[:-1])
    assert per_batch.max() <= 200 and per_batch.mean() > 150


def _consume(plans: list[BlockShufflePlan], epoch: int, batches: int) -> list[np.ndarray]:
    return [p.epoch(epoch).order[: int(p.epoch(epoch).batch_ptr[batches])] for p in plans]


@pytest.mark.parametrize("permutation", ["drawn", "keyed"])
@pytest.mark.parametrize(("before", "after", "stop"), [(2, 3, 7), (4, 2, 3), (3, 3, 5), (1, 4, 10)])
def test_elastic_resume_across_shard_counts_skips_and_repeats_nothing(
    before: int, after: int, stop: int, permutation: str
) -> None:
    n, epoch = 1000, 4
    base = _plan(n, 37, 3, seed=11, permutation=permutation)
    old = _shards(base, before)
    seen = _consume(old, epoch, stop)
    states = [{"epoch": epoch, "batch": stop, "plan": p.to_dict()} for p in old]
    json.dumps(states)  # a checkpoint is plain data
    resumed = []
    for rank in range(after):
        plan, e, b = restore(_shards(base, after)[rank], states[(rank + 1) % before])  # any rank's file will do
        assert (e, b) == (epoch, 0) and isinstance(plan, BlockShufflePlan)
        resumed.append(plan)
    assert len({p.epoch(epoch).num_batches for p in resumed}) == 1
    rest = [p.epoch(epoch).order for p in resumed]
    everything = np.concatenate(seen + rest)
    counts = np.bincount(everything, minlength=n)
    assert counts.min() == 1  # no structure skipped
    remaining = resumed[0].undelivered(epoch, int(base.global_batches(epoch)[1].size - 1)).size
    padding = resumed[0].epoch(epoch).num_batches * after - remaining
    assert int((counts - 1).sum()) <= padding * 16  # and none twice, apart from the wrap-around batches
    if padding == 0:
        assert counts.max() == 1
    # the next epoch is an ordinary one on the new shard count
    nxt = np.concatenate([p.epoch(epoch + 1).order for p in resumed])
    fresh = np.concatenate([p.epoch(epoch + 1).order for p in _shards(base, after)])
    assert np.array_equal(nxt, fresh)


@pytest.mark.parametrize("permutation", ["drawn", "keyed"])
def test_two_resumes_in_one_epoch_chain_their_checkpoints(permutation: str) -> None:
    n, epoch = 1200, 0
    base = _plan(n, 50, 2, batch_size=10, permutation=permutation)
    first = _shards(base, 2)
    seen = _consume(first, epoch, 9)
    second = [restore(p, {"epoch": epoch, "batch": 9, "plan": first[0].to_dict()})[0] for p in _shards(base, 3)]
    seen += _consume(second, epoch, 6)
    third = [restore(p, {"epoch": epoch, "batch": 6, "plan": second[1].to_dict()})[0] for p in _shards(base, 4)]
    assert third[0].resume is not None and third[0].resume.segments == ((2, 9), (3, 6))
    copy = pickle.loads(pickle.dumps(third[2]))  # plans travel to DALI's worker processes
    assert np.array_equal(copy.epoch(epoch).order, third[2].epoch(epoch).order)
    seen += [p.epoch(epoch).order for p in third]
    counts = np.bincount(np.concatenate(seen), minlength=n)
    assert counts.min() == 1 and counts.max() == 1


def test_resume_on_the_same_shard_keeps_the_position_and_the_end_of_an_epoch_moves_on() -> None:
    plans = _shards(_plan(), 2)
    state = {"epoch": 1, "batch": 4, "plan": plans[1].to_dict()}
    assert restore(plans[1], state) == (plans[1], 1, 4)
    end = plans[0].epoch(1).num_batches
    plan, epoch, batch = restore(_shards(_plan(), 3)[0], {"epoch": 1, "batch": end, "plan": plans[0].to_dict()})
    assert (epoch, batch) == (2, 0) and plan.resume is None


def test_resume_refuses_another_order_or_an_impossible_position() -> None:
    state = {"epoch": 0, "batch": 3, "plan": _plan(seed=1).to_dict()}
    with pytest.raises(PlanError, match=r"different plan: seed=1 \(loader has 2\)"):
        restore(_plan(seed=2), state)
    with pytest.raises(PlanError, match="spans_crc32"):
        restore(_plan(span=40, seed=1), state)
    with pytest.raises(PlanError, match="each of those shards had"):
        restore(_shards(_plan(seed=1), 2)[0], {**state, "batch": 10_000})


@pytest.mark.parametrize(
    ("entries", "error", "message"),
    [
        ({"num_shards": 1.5}, ConfigTypeError, r"state_dict\['plan'\]\['num_shards'\] must be an int, got 1.5"),
        ({"num_shards": 0}, PlanError, r"state_dict\['plan'\]\['num_shards'\] must be >= 1, got 0"),
        ({"shard_id": True}, ConfigTypeError, r"state_dict\['plan'\]\['shard_id'\] must be an int, got True \(bool\)"),
        ({"shard_id": 2}, PlanError, r"state_dict\['plan'\]\['shard_id'\] is 2, outside its 2 shards"),
        (
            {"resume": {"epoch": 0.5, "segments": []}},
            ConfigTypeError,
            r"\['resume'\]\['epoch'\] must be an int, got 0.5",
        ),
        ({"resume": {"epoch": 0, "segments": [[2, True]]}}, ConfigTypeError, r"a batch count .* got True \(bool\)"),
        ({"resume": {"epoch": 0, "segments": [[0, 3]]}}, PlanError, r"a num_shards .* must be >= 1, got 0"),
        ({"resume": {"epoch": 0}}, PlanError, r"malformed resume entry \{'epoch': 0\}"),
    ],
)
def test_resume_refuses_malformed_elastic_entries(
    entries: dict[str, Any], error: type[Exception], message: str
) -> None:
    saved = {**_shards(_plan(seed=1), 2)[0].to_dict(), **entries}
    with pytest.raises(error, match=message):
        restore(_shards(_plan(seed=1), 3)[0], {"epoch": 0, "batch": 3, "plan": saved})


@settings(deadline=None, max_examples=60)
@given(
    spans=st.lists(st.integers(1, 40), max_size=30),
    buffer_spans=st.integers(1, 6),
    batch_size=st.integers(1, 17),
    num_shards=st.integers(1, 4),
    seed=st.integers(0, 2**40),
)
def test_block_order_is_a_permutation_for_any_spans_and_sizes(
    spans: list[int], buffer_spans: int, batch_size: int, num_shards: int, seed: int
) -> None:
    bounds = np.concatenate(([0], np.cumsum(spans))).astype(np.int64)
    n = int(bounds[-1])
    plan = BlockShufflePlan(span_bounds=bounds, buffer_spans=buffer_spans, batch_size=batch_size, seed=seed)
    assert np.array_equal(np.sort(plan.global_order(5)), np.arange(n))
    epochs = [p.epoch(5) for p in _shards(plan, num_shards)]
    assert len({e.num_batches for e in epochs}) == 1
    assert set(np.concatenate([e.order for e in epochs]).tolist()) == set(range(n))


def test_plan_validates_its_settings() -> None:
    with pytest.raises(PlanError, match="increase strictly"):
        BlockShufflePlan(span_bounds=np.array([0, 5, 5, 9]), buffer_spans=1, batch_size=4)
    with pytest.raises(PlanError, match="from 0"):
        BlockShufflePlan(span_bounds=np.array([1, 5]), buffer_spans=1, batch_size=4)
    with pytest.raises(PlanError, match="buffer_spans must be a positive integer"):
        _plan(buffer_spans=0)
    with pytest.raises(PlanError, match="exactly one of batch_size and budget"):
        BlockShufflePlan(span_bounds=fixed_spans(10, 2), buffer_spans=1)
    with pytest.raises(PlanError, match=r"shard_id must be in \[0, 2\)"):
        _plan(shard_id=2, num_shards=2)
    with pytest.raises(PlanError, match="span_size must be a positive integer or None"):
        BlockShuffle(span_size=0)


def _build(reader: Any, shuffle: Any, **kwargs: Any) -> Any:
    fields = tuple(reader.field_specs)
    return build_plan(
        None, PlanArguments(shuffle=shuffle, shard_id=0, num_shards=1, **kwargs), len(reader),
        lambda: reader.sample_sizes(np.arange(len(reader))), lambda: store_chunking(reader, fields),
    )  # fmt: skip


def test_build_plan_picks_the_plan_by_shuffle_and_names_the_choices(reader: AtomicDataZarrReader) -> None:
    assert _build(reader, True).to_dict()["kind"] == "fixed" and _build(reader, "global").shuffle is True
    assert _build(reader, False).shuffle is False and _build(reader, "sequential").shuffle is False
    block = _build(reader, "block")
    assert isinstance(block, BlockShufflePlan) and isinstance(block, ElasticPlan)
    assert np.array_equal(block.span_bounds, reader.sample_chunk_bounds())
    budget = _build(reader, "block", max_atoms=300)
    assert budget.budget is not None and budget.budget.max_atoms == 300 and budget.batch_size is None
    padded = _build(reader, "block", max_atoms=300, max_edges=5000, pad=True)
    assert padded.budget.max_atoms == 299
    explicit = _build(reader, BlockShuffle(span_size=25, buffer_spans=2))
    assert explicit.buffer_spans == 2 and np.array_equal(explicit.span_bounds, fixed_spans(len(reader), 25))
    with pytest.raises(PlanError, match="shuffle must be one of True, False, 'global', 'sequential', 'block'"):
        _build(reader, "blocks")


def test_default_buffer_fills_half_the_cache(small_store: Path) -> None:
    with (
        AtomicDataZarrReader(small_store, cache_bytes=1 << 30) as big,
        AtomicDataZarrReader(small_store, cache_bytes=20_000) as small,
    ):
        assert _build(big, "block").buffer_spans >= _build(big, "block").num_spans  # the whole store fits
        spans = small.sample_chunk_bounds()
        per_span = store_chunking(small, tuple(small.field_specs))
        n_atoms, n_edges = small.sample_sizes(np.arange(len(small)))
        nbytes = n_atoms * per_span.atom_bytes + n_edges * per_span.edge_bytes + per_span.system_bytes
        expected = max(1, int(0.5 * 20_000 // (nbytes.sum() / (spans.size - 1))))
        assert _build(small, "block").buffer_spans == expected


class _PlainReader:
    """A reader without the chunk capability: the block plan falls back to fixed-size spans."""

    def __init__(self, inner: AtomicDataZarrReader) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    @property
    def field_specs(self) -> Any:
        return self.inner.field_specs

    def sample_sizes(self, indices: Any) -> Any:
        return self.inner.sample_sizes(indices)


def test_a_reader_without_chunk_bounds_gets_fixed_spans(reader: AtomicDataZarrReader) -> None:
    plan = _build(_PlainReader(reader), "block")
    assert np.array_equal(plan.span_bounds, fixed_spans(len(reader), DEFAULT_SPAN_SIZE))


def test_sample_chunk_bounds_follow_the_atom_blocks(reader: AtomicDataZarrReader) -> None:
    bounds = reader.sample_chunk_bounds()
    first_atom = reader.atoms_ptr[:-1]
    block = first_atom // 97  # the small store's core chunks are 97 rows
    assert bounds[0] == 0 and bounds[-1] == len(reader) and np.all(np.diff(bounds) > 0)
    expected = np.flatnonzero(np.diff(block)) + 1
    assert np.array_equal(bounds[1:-1], expected)
    for lo, hi in itertools.pairwise(bounds):
        assert np.unique(block[lo:hi]).size == 1


def test_block_plan_over_several_stores_follows_each_members_chunks_and_the_smallest_cache(
    small_store: Path, other_store: Path
) -> None:
    with (
        AtomicDataZarrReader(small_store, cache_bytes=20_000) as first,
        AtomicDataZarrReader(other_store, cache_bytes=1 << 30) as second,
        MultiReader([first, second]) as multi,
    ):
        want = np.concatenate([first.sample_chunk_bounds()[:-1], second.sample_chunk_bounds() + len(first)])
        assert np.array_equal(multi.sample_chunk_bounds(), want)
        assert multi.cache_bytes == 20_000 and store_chunking(multi, ("positions",)).cache_bytes == 20_000
        plan = _build(multi, "block")
        assert np.array_equal(plan.span_bounds, want)
        assert plan.buffer_spans < plan.num_spans  # sized for the 20 kB cache, not the default 1 GiB
    with (
        AtomicDataZarrReader(small_store) as first,
        MultiReader([first, ReadManyAdapter(second_reader := AtomicDataZarrReader(other_store))]) as multi,
    ):
        try:
            plan = _build(multi, "block")
            # the member without chunk bounds gets fixed spans of its own, none crossing into it
            tail = fixed_spans(len(second_reader), DEFAULT_SPAN_SIZE) + len(first)
            assert np.array_equal(plan.span_bounds, np.concatenate([first.sample_chunk_bounds()[:-1], tail]))
            assert multi.cache_bytes == min(first.cache_bytes, DEFAULT_CACHE_BYTES)
        finally:
            second_reader.close()
