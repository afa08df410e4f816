"""The contract every loader of this project meets, written once (in the spirit of zarr's ``StoreTests``).

:class:`LoaderContract` holds the assertions; ``tests/pipeline/test_loader.py`` (the DALI loader) and
``tests/baseline/test_torch_loader.py`` (the plain DataLoader) subclass it and say only how to build
their loader. The reference is the simplest correct thing: the reader's per-sample reads collated by
:meth:`Batch.from_samples`, batch by batch as the plan says.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pytest
import torch

from dali_alchemi import (
    AtomicDataZarrReader,
    AtomicDataZarrWriter,
    Batch,
    ConfigTypeError,
    PlanError,
    StoreChangedError,
    UnknownFieldError,
    unpad_batch,
)
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.plan import EpochPlan, Plan

N = 300
"""Structures in the shared ``small_store``."""


def reference_batches(reader: AtomicDataZarrReader, plan: Plan, epoch: int, first_batch: int = 0) -> list[Batch]:
    """The plan's batches of ``epoch``, read one sample at a time and collated by ``Batch.from_samples``."""
    return [
        Batch.from_samples(
            [sample for sample, _ in reader.read_many(indices)], levels=reader.field_levels, sample_indices=indices
        )
        for indices in plan.epoch(epoch).batches(first_batch)
    ]


def assert_batches_equal(got: list[Batch], want: list[Batch]) -> None:
    """Same batches: fields (values and dtypes), batch vectors and pointers, counts and store indices."""
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert set(a.fields) == set(b.fields), k
        for name in b.fields:
            assert a[name].dtype == b[name].dtype, (k, name)
            assert torch.equal(a[name].cpu(), b[name]), (k, name)
        assert torch.equal(a.batch_idx.cpu(), b.batch_idx) and torch.equal(a.batch_ptr.cpu(), b.batch_ptr)
        assert a.num_nodes_list == b.num_nodes_list and a.num_edges_list == b.num_edges_list
        assert np.array_equal(a.sample_indices, b.sample_indices), k


@dataclass(frozen=True, slots=True)
class CyclingSizesPlan:
    """A plan whose batch sizes cycle through ``sizes``: proves nobody downstream assumes one batch size."""

    num_samples: int
    sizes: tuple[int, ...] = (7, 13, 1, 20)
    seed: int = 0

    def epoch(self, epoch: int) -> EpochPlan:
        order = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples).astype(np.int64)
        sizes = np.resize(np.array(self.sizes, dtype=np.int64), self.num_samples)
        ptr = np.concatenate([[0], np.cumsum(sizes)])
        ptr = np.append(ptr[ptr < self.num_samples], self.num_samples).astype(np.int64)
        return EpochPlan(epoch=epoch, order=order, batch_ptr=ptr)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "cycling", **asdict(self)}


MALFORMED_STATES: list[tuple[str, Any, type[Exception], str]] = [
    ("none", None, ConfigTypeError, r"needs the dict a loader's state_dict\(\) returned .*got None \(NoneType\)"),
    ("list", [0, 0], ConfigTypeError, r"got \[0, 0\] \(list\)"),
    ("float epoch", {"epoch": 1.5}, ConfigTypeError, r"state_dict\['epoch'\] must be an int, got 1.5 \(float\)"),
    ("bool epoch", {"epoch": True}, ConfigTypeError, r"state_dict\['epoch'\] must be an int, got True \(bool\)"),
    ("none epoch", {"epoch": None}, ConfigTypeError, r"state_dict\['epoch'\] must be an int, got None"),
    ("str batch", {"batch": "3"}, ConfigTypeError, r"state_dict\['batch'\] must be an int, got '3' \(str\)"),
    ("negative epoch", {"epoch": -1}, PlanError, r"state_dict\['epoch'\] must be >= 0, got -1"),
    ("batch past the epoch", {"batch": 11}, PlanError, r"state_dict\['batch'\] is 11, outside epoch 0's 10 batches"),
    ("missing plan", {"plan": None}, ConfigTypeError, r"state_dict\['plan'\] must be a dict .*got None"),
    ("no plan", "drop plan", PlanError, r"entries are \['epoch', 'batch', 'plan'\]; this one has missing \['plan'\]"),
    ("unknown entry", {"step": 3}, PlanError, r"this one has unknown \['step'\]"),
]
"""Malformed ``state_dict`` forms: ``(name, the state or the entries changed, error, message)``."""


class LoaderContract:
    """Assertions shared by every loader; subclasses implement :meth:`make_loader` (and maybe :meth:`close`)."""

    def make_loader(self, source: Any, **options: Any) -> Any:
        """A loader over ``source`` (a reader or a store) with ``options`` (plan and field arguments)."""
        raise NotImplementedError

    def close(self, loader: Any) -> None:
        loader.close()

    def epochs(self, loader: Any, epochs: range) -> list[list[Batch]]:
        out = []
        for epoch in epochs:
            loader.set_epoch(epoch)
            out.append(list(loader))
        return out

    def test_batches_equal_the_reference_over_epochs(self, reader: AtomicDataZarrReader) -> None:
        loader = self.make_loader(reader, batch_size=16, seed=11)
        try:
            assert len(loader) == 19
            for epoch, got in zip(range(2), self.epochs(loader, range(2)), strict=True):
                assert_batches_equal(got, reference_batches(reader, loader.plan, epoch))
                indices = np.concatenate([b.sample_indices for b in got])
                assert np.array_equal(np.sort(indices), np.arange(N))  # every index exactly once
                assert [b.num_graphs for b in got] == [16] * 18 + [12]  # the partial last batch is kept
                assert {
                    (type(b.sample_indices), b.sample_indices.dtype, b.sample_indices.device.type) for b in got
                } == {(torch.Tensor, torch.int64, "cpu")}
        finally:
            self.close(loader)

    def test_batches_of_varying_size_follow_the_plan(self, reader: AtomicDataZarrReader) -> None:
        plan = CyclingSizesPlan(num_samples=N, seed=3)
        loader = self.make_loader(reader, plan=plan)
        try:
            assert len(loader) == plan.epoch(0).num_batches == 30
            for epoch, got in zip(range(2), self.epochs(loader, range(2)), strict=True):
                assert [b.num_graphs for b in got] == [7, 13, 1, 20] * 7 + [7, 6]
                assert_batches_equal(got, reference_batches(reader, plan, epoch))
        finally:
            self.close(loader)

    @pytest.mark.parametrize("shards", [2, 3])
    def test_shards_are_disjoint_cover_the_store_and_have_equal_counts(
        self, reader: AtomicDataZarrReader, shards: int
    ) -> None:
        parts, lengths = [], set()
        for shard_id in range(shards):
            loader = self.make_loader(reader, batch_size=25, shard_id=shard_id, num_shards=shards, seed=4)
            try:
                lengths.add(len(loader))
                parts.append(np.concatenate([b.sample_indices for b in loader]))
            finally:
                self.close(loader)
        padding = int(np.ceil(N / shards)) * shards - N
        assert len(lengths) == 1
        assert set(np.concatenate(parts).tolist()) == set(range(N))
        assert sum(p.size for p in parts) == N + padding

    def test_fields_narrow_what_is_read_from_a_reader_or_a_store(
        self, reader: AtomicDataZarrReader, small_store: Any
    ) -> None:
        for source in (reader, small_store):
            loader = self.make_loader(source, batch_size=40, fields=["positions", "energy", "neighbor_list"])
            try:
                for batch in loader:
                    assert set(batch.fields) == {"positions", "energy", "neighbor_list"}
            finally:
                self.close(loader)
        loader = self.make_loader(reader, batch_size=100, fields="energy")  # one name is one field
        try:
            assert [set(b.fields) for b in loader] == [{"energy"}] * 3
        finally:
            self.close(loader)
        with pytest.raises(UnknownFieldError, match=r"Unknown fields \['nope'\]"):
            self.make_loader(reader, fields=["nope"])

    def test_system_fields_only_keep_the_atom_and_edge_counts(self, reader: AtomicDataZarrReader) -> None:
        loader = self.make_loader(reader, batch_size=8, shuffle=False, fields="energy")
        try:
            got = [next(iter(loader))]
        finally:
            self.close(loader)
        n_atoms, n_edges = reader.sample_sizes(np.arange(8))
        want = Batch.from_samples(
            [{"energy": s["energy"]} for s, _ in reader.read_many(list(range(8)))],
            levels=reader.field_levels,
            sample_indices=np.arange(8),
        )
        assert got[0].num_nodes_list == n_atoms.tolist() and got[0].num_edges_list == n_edges.tolist()
        assert got[0].num_nodes == int(n_atoms.sum()) > 0 and got[0].num_edges == int(n_edges.sum()) > 0
        assert torch.equal(got[0]["energy"].cpu(), want["energy"])
        assert np.array_equal(got[0].sample_indices, np.arange(8))

    @pytest.mark.parametrize("shards", [1, 2])
    def test_budget_batches_respect_the_budget_once_per_epoch_with_equal_counts(
        self, reader: AtomicDataZarrReader, shards: int
    ) -> None:
        seen, lengths = [], set()
        for shard_id in range(shards):
            loader = self.make_loader(reader, max_atoms=400, max_edges=2000, shard_id=shard_id, num_shards=shards)
            try:
                lengths.add(len(loader))
                batches = list(loader)
                assert len(batches) == len(loader)
                assert all(b.num_nodes <= 400 and b.num_edges <= 2000 for b in batches)
                assert len({b.num_graphs for b in batches}) > 1  # sized by atoms, not a fixed count
                assert_batches_equal(batches, reference_batches(reader, loader.plan, 0))
                seen.append(np.concatenate([b.sample_indices for b in batches]))
            finally:
                self.close(loader)
        assert len(lengths) == 1
        counts = np.bincount(np.concatenate(seen), minlength=N)
        assert counts.min() == 1  # every structure; repeats only from whole padding batches
        with pytest.raises(PlanError, match="more than max_atoms=30"):
            self.make_loader(reader, max_atoms=30)
        with pytest.raises(PlanError, match="max_atoms must be a positive integer"):
            self.make_loader(reader, max_atoms=-5)

    def test_padded_batches_have_one_shape_and_hold_the_plans_batches(self, reader: AtomicDataZarrReader) -> None:
        loader = self.make_loader(reader, max_atoms=401, max_edges=2001, pad=True, seed=2)
        try:
            batches = list(loader)
            shapes = {(b.num_nodes, b.num_edges, b.num_graphs) for b in batches}
            assert len(shapes) == 1 and next(iter(shapes))[:2] == (401, 2001)
            assert {tuple(b.positions.shape) for b in batches} == {(401, 3)}
            real = [unpad_batch(b) for b in batches]
            assert_batches_equal(real, reference_batches(reader, loader.plan, 0))
            for padded, part in zip(batches, real, strict=True):
                assert padded.padding is not None
                assert int(padded.padding.structure_mask.sum()) == part.num_graphs
                assert int(padded.padding.num_real_structures) == part.num_graphs
                assert (padded.sample_indices[part.num_graphs :] == -1).all()
            seen = np.concatenate([b.sample_indices for b in real])
            assert np.array_equal(np.sort(seen), np.arange(N))
        finally:
            self.close(loader)
        with pytest.raises(PlanError, match="pad=True needs max_edges"):
            self.make_loader(reader, max_atoms=400, pad=True)

    @pytest.mark.parametrize(
        ("change", "error", "message"), [s[1:] for s in MALFORMED_STATES], ids=[s[0] for s in MALFORMED_STATES]
    )
    def test_a_malformed_state_is_refused_naming_the_entry(
        self, reader: AtomicDataZarrReader, change: Any, error: type[Exception], message: str
    ) -> None:
        loader = self.make_loader(reader, batch_size=30, seed=1)
        try:
            state = loader.state_dict()
            if change == "drop plan":
                bad: Any = {key: value for key, value in state.items() if key != "plan"}
            else:
                bad = {**state, **change} if isinstance(change, dict) else change
            with pytest.raises(error, match=message):
                loader.load_state_dict(bad)
            assert loader.state_dict() == state  # the position did not move
        finally:
            self.close(loader)

    def test_a_reader_refreshed_to_another_length_is_refused_at_the_next_iteration(self, tmp_path: Any) -> None:
        store = tmp_path / "growing.zarr"
        AtomicDataZarrWriter(store).write(synthetic_samples(10, seed=1, min_atoms=3, max_atoms=6).split())
        with AtomicDataZarrReader(store) as reader:
            loader = self.make_loader(reader, batch_size=2, shuffle=False)
            try:
                assert [b.num_graphs for b in loader] == [2] * 5
                AtomicDataZarrWriter(store).append(synthetic_samples(10, seed=2, min_atoms=3, max_atoms=6).split())
                reader.refresh()
                with pytest.raises(StoreChangedError, match=r"now has 20 samples, but this \w+'s plan was made for 10"):
                    next(iter(loader))
            finally:
                self.close(loader)

    def test_a_plan_excludes_the_arguments_that_build_one(self, reader: AtomicDataZarrReader) -> None:
        with pytest.raises(PlanError, match="mutually exclusive with batch_size, shard_id"):
            self.make_loader(reader, plan=CyclingSizesPlan(num_samples=N), batch_size=8, shard_id=0, num_shards=1)
        with pytest.raises(PlanError, match="made for 299 samples, but the reader has 300"):
            self.make_loader(reader, plan=CyclingSizesPlan(num_samples=N - 1))
        with pytest.raises(TypeError, match=r"must implement dali_alchemi\.plan\.Plan"):
            self.make_loader(reader, plan=[1, 2, 3])
