"""MixturePlan: rates and counts per dataset, the three epoch policies, budgets, sharding and determinism."""

from __future__ import annotations

import itertools
import json
import pickle

import numpy as np
import pytest

from dali_alchemi import MixturePlan, PlanError
from dali_alchemi.plan import PadShape, PlanArguments, build_plan, pad_shape
from dali_alchemi.plan.mixture import counts_from_weights, normalise_weights

LENGTHS = (300, 120)
"""A bulk dataset and a smaller one: global indices 0..299 and 300..419."""


def per_dataset(indices: np.ndarray) -> list[int]:
    return np.bincount((np.asarray(indices) >= LENGTHS[0]).astype(np.int64), minlength=2).tolist()


def test_weights_split_every_batch_by_largest_remainder() -> None:
    plan = MixturePlan(lengths=LENGTHS, batch_size=10, weights=(3, 1), seed=1)
    assert plan.counts_per_batch is not None and plan.counts_per_batch.tolist() == [8, 2]  # 7.5/2.5, tie -> first
    epoch = plan.epoch(0)
    assert epoch.num_batches == 42  # dataset_size with replacement: ceil(420 / 10)
    assert {tuple(per_dataset(b)) for b in epoch.batches()} == {(8, 2)}
    default = MixturePlan(lengths=LENGTHS, batch_size=7)  # weights default to the lengths: 5 and 2 of 7
    assert default.counts_per_batch is not None and default.counts_per_batch.tolist() == [5, 2]
    assert counts_from_weights(normalise_weights((1, 1, 1), (5, 5, 5)), 10).tolist() == [4, 3, 3]


def test_samples_per_dataset_counts_or_rates() -> None:
    plan = MixturePlan(lengths=LENGTHS, batch_size=8, samples_per_dataset=(5, 3))
    assert {tuple(per_dataset(b)) for b in plan.epoch(2).batches()} == {(5, 3)}
    rates = MixturePlan(lengths=LENGTHS, batch_size=8, samples_per_dataset=(0.5, 0.5))
    assert rates.counts_per_batch is not None and rates.counts_per_batch.tolist() == [4, 4]
    with pytest.raises(PlanError, match=r"must sum to batch_size: 7 != 8"):
        MixturePlan(lengths=LENGTHS, batch_size=8, samples_per_dataset=(5, 2))
    with pytest.raises(PlanError, match="mutually exclusive"):
        MixturePlan(lengths=LENGTHS, batch_size=8, samples_per_dataset=(5, 3), weights=(1, 1))
    with pytest.raises(PlanError, match="must be non-negative"):
        MixturePlan(lengths=LENGTHS, batch_size=8, weights=(1, -1))
    with pytest.raises(PlanError, match="Expected 2 dataset weights, got 3"):
        MixturePlan(lengths=LENGTHS, batch_size=8, weights=(1, 1, 1))
    with pytest.raises(PlanError, match="Dataset 1 has positive weight but no samples"):
        MixturePlan(lengths=(10, 0), batch_size=4, weights=(1, 1))


@pytest.mark.parametrize(
    ("policy", "replacement", "batches", "draws"),
    [
        ("dataset_size", True, 53, [265, 159]),  # ceil(420 / 8) batches of 5 + 3
        ("dataset_size", False, 40, [200, 120]),  # without replacement: min_size
        ("min_size", True, 40, [200, 120]),  # the smaller dataset is used up after 120 / 3 batches
        ("min_size", False, 40, [200, 120]),
        ("max_size", True, 60, [300, 180]),  # until the larger is used up: the smaller one is oversampled
    ],
)
def test_epoch_policies_set_the_epoch_length_and_the_draws(
    policy: str, replacement: bool, batches: int, draws: list[int]
) -> None:
    plan = MixturePlan(
        lengths=LENGTHS, batch_size=8, samples_per_dataset=(5, 3), epoch_policy=policy, replacement=replacement
    )
    epoch = plan.epoch(0)
    assert epoch.num_batches == batches and plan.draws_per_dataset.tolist() == draws
    assert per_dataset(epoch.order) == draws
    seen = np.bincount(epoch.order, minlength=420)
    for d, (lo, hi) in enumerate(((0, 300), (300, 420))):
        n = LENGTHS[d]
        # Passes over a dataset: every structure once before any repeats.
        assert seen[lo:hi].max() - seen[lo:hi].min() <= 1
        assert seen[lo:hi].max() == -(-draws[d] // n)
        if not replacement:
            assert seen[lo:hi].max() <= 1


def test_policies_that_cannot_hold_are_errors() -> None:
    with pytest.raises(PlanError, match="epoch_policy='max_size' requires replacement=True"):
        MixturePlan(
            lengths=LENGTHS, batch_size=8, samples_per_dataset=(5, 3), epoch_policy="max_size", replacement=False
        )
    with pytest.raises(PlanError, match="replacement=False supports at most 40 complete batches"):
        MixturePlan(lengths=LENGTHS, batch_size=8, samples_per_dataset=(5, 3), num_batches=41, replacement=False)
    with pytest.raises(PlanError, match="epoch_policy must be one of"):
        MixturePlan(lengths=LENGTHS, batch_size=8, epoch_policy="largest")
    with pytest.raises(PlanError, match="mix='batch' needs batch_size"):
        MixturePlan(lengths=LENGTHS)
    with pytest.raises(PlanError, match="samples_per_dataset fixes each batch's counts and needs mix='batch'"):
        MixturePlan(lengths=LENGTHS, batch_size=8, samples_per_dataset=(5, 3), mix="sample")


@pytest.mark.parametrize(
    ("policy", "replacement", "draws"),
    [
        ("dataset_size", True, [210, 210]),  # the total length, split by the rates
        ("min_size", True, [120, 120]),
        ("min_size", False, [120, 120]),
        ("max_size", True, [300, 300]),
    ],
)
def test_sample_mix_draws_per_epoch(policy: str, replacement: bool, draws: list[int]) -> None:
    plan = MixturePlan(
        lengths=LENGTHS, batch_size=16, weights=(1, 1), mix="sample", epoch_policy=policy, replacement=replacement
    )
    epoch = plan.epoch(3)
    assert plan.draws_per_dataset.tolist() == draws and per_dataset(epoch.order) == draws
    assert epoch.num_batches == -(-sum(draws) // 16)
    assert len({tuple(per_dataset(b)) for b in epoch.batches()}) > 1  # the mixture is per structure, not per batch
    with pytest.raises(
        PlanError, match="replacement=False cannot draw 210 samples from dataset 1 with only 120 samples"
    ):
        MixturePlan(lengths=LENGTHS, batch_size=16, weights=(1, 1), mix="sample", replacement=False)


def _sizes(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    atoms = rng.integers(5, 40, size=sum(LENGTHS))
    return atoms, atoms * 6


def test_budget_batches_pack_the_mixture_greedily() -> None:
    n_atoms, n_edges = _sizes()
    plan = MixturePlan(lengths=LENGTHS, weights=(1, 3), n_atoms=n_atoms, n_edges=n_edges, max_atoms=200, seed=5)
    assert plan.mix == "sample" and plan.draws_per_dataset.tolist() == [105, 315]
    epoch = plan.epoch(1)
    batches = epoch.batches()
    assert all(int(n_atoms[b].sum()) <= 200 for b in batches)
    # Greedy: a batch ends only where the next structure would not fit (it is one of the next batch's).
    assert all(int(n_atoms[a].sum()) + int(n_atoms[b].max()) > 200 for a, b in itertools.pairwise(batches))
    for b in batches:  # grouped by dataset within a batch
        assert np.all(np.diff((b >= LENGTHS[0]).astype(int)) >= 0)
    assert len({b.size for b in epoch.batches()}) > 1
    capped = MixturePlan(lengths=LENGTHS, n_atoms=n_atoms, n_edges=n_edges, max_atoms=200, batch_size=3)
    assert max(b.size for b in capped.epoch(0).batches()) == 3
    with pytest.raises(PlanError, match=r"has \d+ atoms, more than max_atoms=30"):
        MixturePlan(lengths=LENGTHS, n_atoms=n_atoms, n_edges=n_edges, max_atoms=30)
    with pytest.raises(PlanError, match="with max_atoms/max_edges use mix='sample'"):
        MixturePlan(lengths=LENGTHS, n_atoms=n_atoms, n_edges=n_edges, max_atoms=200, batch_size=8, mix="batch")


@pytest.mark.parametrize("budget", [False, True])
@pytest.mark.parametrize("shards", [2, 3])
def test_shards_deal_the_global_batches_with_equal_counts(budget: bool, shards: int) -> None:
    n_atoms, n_edges = _sizes(1)
    options = {"n_atoms": n_atoms, "n_edges": n_edges, "max_atoms": 300} if budget else {"batch_size": 8}
    base = MixturePlan(lengths=LENGTHS, weights=(2, 1), seed=9, **options)  # type: ignore[arg-type]
    order, ptr = base.global_batches(4)
    total = ptr.size - 1
    per_shard = -(-total // shards)
    parts = [
        MixturePlan(lengths=LENGTHS, weights=(2, 1), seed=9, shard_id=s, num_shards=shards, **options).epoch(4)  # type: ignore[arg-type]
        for s in range(shards)
    ]
    assert {p.num_batches for p in parts} == {per_shard}
    dealt = np.resize(np.arange(total), per_shard * shards)
    for s, part in enumerate(parts):
        for got, g in zip(part.batches(), dealt[s::shards], strict=True):
            assert np.array_equal(got, order[ptr[g] : ptr[g + 1]])  # whole global batches, round-robin
    firsts = np.concatenate([p.batches()[0] for p in parts])
    assert np.unique(firsts).size == firsts.size  # different shards read different structures
    dropped = MixturePlan(
        lengths=LENGTHS, weights=(2, 1), seed=9, shard_id=0, num_shards=shards, drop_last=True, **options
    )  # type: ignore[arg-type]
    assert dropped.epoch(4).num_batches == total // shards


def test_deterministic_by_seed_and_epoch_and_pickled_into_workers() -> None:
    def make(seed: int = 0) -> MixturePlan:
        return MixturePlan(lengths=LENGTHS, batch_size=8, weights=(1, 1), epoch_policy="max_size", seed=seed)

    a, b = make(), make()
    assert np.array_equal(a.epoch(3).order, b.epoch(3).order)
    assert not np.array_equal(a.epoch(3).order, a.epoch(4).order)
    assert not np.array_equal(a.epoch(3).order, make(seed=1).epoch(3).order)
    clone = pickle.loads(pickle.dumps(a))
    assert np.array_equal(clone.epoch(7).order, a.epoch(7).order) and clone.to_dict() == a.to_dict()
    assert json.loads(json.dumps(a.to_dict()))["kind"] == "mixture"


def test_without_shuffle_each_dataset_is_read_in_order() -> None:
    plan = MixturePlan(lengths=LENGTHS, batch_size=8, samples_per_dataset=(5, 3), shuffle=False)
    batches = plan.epoch(0).batches()
    assert batches[0].tolist() == [0, 1, 2, 3, 4, 300, 301, 302]
    assert batches[40].tolist() == [200, 201, 202, 203, 204, 300, 301, 302]  # the smaller dataset wraps around


def test_build_plan_makes_a_mixture_only_over_several_datasets() -> None:
    args = PlanArguments(batch_size=8, weights=(3, 1), epoch_policy="min_size", seed=2)
    plan = build_plan(None, args, 420, lambda: _sizes(), dataset_lengths=LENGTHS)
    assert isinstance(plan, MixturePlan) and plan.counts_per_batch is not None
    assert plan.counts_per_batch.tolist() == [6, 2] and plan.epoch_policy == "min_size" and plan.seed == 2
    budget = build_plan(
        None, PlanArguments(max_atoms=300, weights=(1, 1)), 420, lambda: _sizes(), dataset_lengths=LENGTHS
    )
    assert isinstance(budget, MixturePlan) and budget.mix == "sample" and budget.max_atoms == 300
    with pytest.raises(PlanError, match="mix several datasets: pass a list of stores"):
        build_plan(None, args, 420, lambda: _sizes())
    padding = PlanArguments(max_atoms=300, max_edges=900, pad=True, weights=(1, 1))
    padded = build_plan(None, padding, 420, lambda: _sizes(), dataset_lengths=LENGTHS)
    assert isinstance(padded, MixturePlan) and (padded.max_atoms, padded.max_edges) == (299, 899)  # a row kept free
    assert pad_shape(padding, padded) == PadShape(
        max_atoms=300, max_edges=900, max_structures=min(299 // 5, 899 // 30) + 1
    )
    with pytest.raises(PlanError, match="pad=True needs max_edges"):
        build_plan(None, PlanArguments(max_atoms=300, pad=True, weights=(1, 1)), 420, lambda: _sizes(), dataset_lengths=LENGTHS)


@pytest.mark.parametrize("mix", ["batch", "sample"])
def test_block_shuffle_draws_each_dataset_a_few_spans_at_a_time(mix: str) -> None:
    bounds = (*range(0, 420, 40), 420)  # spans of 40; the one over 280..320 is cut at the dataset's end
    options = {"lengths": LENGTHS, "batch_size": 10, "weights": (3, 1), "seed": 5, "mix": mix}
    plan = MixturePlan(**options, epoch_policy="min_size", replacement=False, span_bounds=bounds, buffer_spans=2)
    full = MixturePlan(**options, epoch_policy="min_size", replacement=False)
    order, _ = plan.global_batches(0)
    assert per_dataset(order) == per_dataset(full.global_batches(0)[0])  # the same counts as the permutation
    bulk = order[order < LENGTHS[0]]
    assert np.unique(bulk).size == bulk.size  # without replacement: never drawn twice
    edges = np.array([*range(0, 300, 40), 300])  # the bulk dataset's 8 spans
    spans = np.searchsorted(edges, bulk, side="right") - 1
    permuted = full.global_batches(0)[0]
    permuted_spans = np.searchsorted(edges, permuted[permuted < LENGTHS[0]], side="right") - 1
    # its draws go through its spans two at a time (a buffer; at most three where one ends), not all over it
    assert np.unique(spans[:80]).size <= 3 < np.unique(permuted_spans[:80]).size
    assert not np.array_equal(order, plan.global_batches(1)[0])  # a new epoch, a new order
    assert np.array_equal(order, MixturePlan(**options, epoch_policy="min_size", replacement=False,
                                             span_bounds=bounds, buffer_spans=2).global_batches(0)[0])  # fmt: skip
    assert plan.to_dict()["block"] == {"spans_crc32": plan.to_dict()["block"]["spans_crc32"], "num_spans": 11,
                                       "buffer_spans": 2}  # fmt: skip
    with pytest.raises(PlanError, match="span bounds must run from 0 to the 420 samples"):
        MixturePlan(lengths=LENGTHS, batch_size=10, span_bounds=(0, 100))


def test_build_plan_gives_a_mixture_the_block_shuffle() -> None:
    from dali_alchemi.plan import BlockShuffle

    args = PlanArguments(batch_size=8, weights=(1, 1), shuffle=BlockShuffle(span_size=30, buffer_spans=3))
    plan = build_plan(None, args, 420, lambda: _sizes(), dataset_lengths=LENGTHS)
    assert isinstance(plan, MixturePlan) and plan.buffer_spans == 3 and plan.shuffle
    assert plan.span_bounds is not None and plan.span_bounds[:3] == (0, 30, 60) and plan.span_bounds[-1] == 420
