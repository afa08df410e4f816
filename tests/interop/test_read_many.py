"""ReadManyAdapter: a reader with only nvalchemi's ``read_many`` contract, in both loaders.

The readers here are written as an nvalchemi user writes a custom ``Reader`` (per-structure dicts of
CPU tensors, system fields with a leading 1, sample-local neighbor lists), in memory and without
importing nvalchemi.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from dali_alchemi import Batch, FieldLevelError, PackedSamples, plain_dataloader
from dali_alchemi.errors import NotAReaderError, ReaderClosedError, ReaderOutputError, SampleIndexError
from dali_alchemi.interop.read_many import ReadManyAdapter, as_packed_reader
from dali_alchemi.testing.reader import PackedReaderTests


def _structures(n: int = 53, seed: int = 3) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        atoms, edges = int(rng.integers(1, 9)), int(rng.integers(0, 14))
        out.append(
            {
                "atomic_numbers": torch.from_numpy(rng.integers(1, 9, size=atoms)),
                "positions": torch.from_numpy(rng.normal(size=(atoms, 3)).astype(np.float32)),
                "neighbor_list": torch.from_numpy(rng.integers(0, atoms, size=(edges, 2))),
                "shifts": torch.from_numpy(rng.normal(size=(edges, 3)).astype(np.float32)),
                "energy": torch.from_numpy(rng.normal(size=(1, 1))),
                "cell": torch.eye(3).reshape(1, 3, 3) * float(rng.uniform(2, 5)),
            }
        )
    return out


class SampleReader:
    """An nvalchemi-style reader: ``_load_sample`` per structure, ``read_many`` over it; no sizes API."""

    def __init__(self, structures: list[dict[str, torch.Tensor]]) -> None:
        self.structures = structures
        self.pin_memory = False
        self.calls: list[list[int]] = []
        self.closed = 0

    def _load_sample(self, index: int) -> dict[str, torch.Tensor]:
        return {k: None if v is None else v.clone() for k, v in self.structures[index].items()}

    def read_many(self, indices: Sequence[int]) -> list[tuple[dict[str, torch.Tensor], dict[str, Any]]]:
        self.calls.append(list(indices))
        return [(self._load_sample(i), {"index": i}) for i in indices]

    def __len__(self) -> int:
        return len(self.structures)

    def close(self) -> None:
        self.closed += 1


class SizedReader(SampleReader):
    """The same, with nvalchemi's ``get_metadata`` (atoms, edges) and ``field_levels``."""

    field_levels: ClassVar[dict[str, str]] = {"tag": "atom"}

    def __init__(self, structures: list[dict[str, torch.Tensor]]) -> None:
        super().__init__(structures)
        self.metadata_calls = 0

    def get_metadata(self, index: int) -> tuple[int, int]:
        self.metadata_calls += 1
        s = self.structures[index]
        return int(s["atomic_numbers"].shape[0]), int(s["neighbor_list"].shape[0])


def _expected(structures: list[dict[str, torch.Tensor]]) -> PackedSamples:
    return PackedSamples.from_samples(structures)


class TestAdapterOverSampleReader(PackedReaderTests):
    def make_reader(self) -> ReadManyAdapter:
        return ReadManyAdapter(SampleReader(_structures()))

    def expected(self) -> PackedSamples:
        return _expected(_structures())


class TestAdapterOverSizedReader(PackedReaderTests):
    def make_reader(self) -> ReadManyAdapter:
        return ReadManyAdapter(SizedReader(_structures()))

    def expected(self) -> PackedSamples:
        return _expected(_structures())


def test_sizes_come_from_get_metadata_once_and_are_remembered() -> None:
    inner = SizedReader(_structures())
    adapter = ReadManyAdapter(inner)
    reads = len(inner.calls)  # the probe of structure 0
    atoms, edges = adapter.sample_sizes(np.arange(53))
    want = _expected(_structures())
    assert atoms.tolist() == want.n_atoms.tolist() and edges.tolist() == want.n_edges.tolist()
    assert inner.metadata_calls == 53 and len(inner.calls) == reads  # no data read for sizes
    adapter.sample_sizes(np.arange(53)[::-1])
    assert inner.metadata_calls == 53


def test_sizes_from_get_metadata_must_match_the_data() -> None:
    class Lying(SizedReader):
        def get_metadata(self, index: int) -> tuple[int, int]:
            atoms, edges = super().get_metadata(index)
            return (atoms + 1, edges) if index == 6 else (atoms, edges)

    adapter = ReadManyAdapter(Lying(_structures()))
    adapter.sample_sizes(np.arange(53))
    adapter.read_packed([5, 7])
    with pytest.raises(
        ReaderOutputError, match=r"Sample 6: get_metadata gave \d+ atoms and \d+ edges, read_many returned"
    ):
        adapter.read_packed([5, 6])


def test_sizes_without_get_metadata_are_read_once_and_windows_teach_them() -> None:
    inner = SampleReader(_structures())
    adapter = ReadManyAdapter(inner)
    adapter.read_packed([4, 9])
    inner.calls.clear()
    atoms, _ = adapter.sample_sizes([9, 4, 10, 11])
    assert inner.calls == [[10, 11]]  # 4 and 9 were remembered from the window read
    assert atoms.tolist() == _expected(_structures()).n_atoms[[9, 4, 10, 11]].tolist()
    adapter.sample_sizes([9, 4, 10, 11])
    assert inner.calls == [[10, 11]]


def test_window_is_one_read_many_and_neighbor_lists_stay_local() -> None:
    inner = SampleReader(_structures())
    adapter = ReadManyAdapter(inner)
    inner.calls.clear()
    order = np.array([7, 2, 7, 40], dtype=np.int64)
    packed = adapter.read_packed(order)
    assert inner.calls == [[7, 2, 7, 40]]
    want = _expected(_structures()).take(order)
    np.testing.assert_array_equal(packed.fields["neighbor_list"], want.fields["neighbor_list"])
    assert packed.fields["energy"].shape == (4, 1) and packed.fields["cell"].shape == (4, 3, 3)
    batch = Batch.from_packed(packed)  # the Batch offsets them to the batch's atom rows
    first = int(packed.n_atoms[0])
    n0 = int(packed.n_edges[0])
    np.testing.assert_array_equal(
        batch.neighbor_list[n0 : n0 + 2].numpy(), want.fields["neighbor_list"][n0 : n0 + 2] + first
    )


def test_levels_from_the_reader_and_from_the_caller() -> None:
    structures = _structures(6)
    for s in structures:
        s["tag"] = torch.zeros(s["atomic_numbers"].shape[0], dtype=torch.int32)
        s["weight"] = torch.ones(1, 1)
    with pytest.raises(FieldLevelError, match="'weight'"):
        ReadManyAdapter(SizedReader(structures))  # tag's level comes from the reader, weight's from nowhere
    adapter = ReadManyAdapter(SizedReader(structures), levels={"weight": "system"})
    specs = adapter.field_specs
    assert specs["tag"].level == "atom" and specs["weight"].level == "system"
    assert specs["tag"].dtype == np.int32 and specs["weight"].trailing == (1,)


@pytest.mark.parametrize(
    ("break_it", "phrase"),
    [
        (lambda s: s.pop("positions"), "Sample 5 has no field 'positions'"),
        (lambda s: s.update(energy=None), "Sample 5 has no field 'energy'"),
        (lambda s: s.update(positions=s["positions"][:-1]), "Sample 5: its atom-level fields disagree"),
        (lambda s: s.update(positions=s["positions"].double()), "Sample 5: field 'positions' is float64"),
        (lambda s: s.update(positions=s["positions"][:, :2]), "Sample 5: field 'positions' has shape"),
        (lambda s: s.update(energy=torch.zeros(2, 1, dtype=torch.float64)), "Sample 5: system field 'energy'"),
        (lambda s: s["neighbor_list"].fill_(100), "Sample 5: neighbor_list row 0 holds \\[100, 100\\], outside its"),
    ],
)
def test_bad_samples_are_named(break_it: Any, phrase: str) -> None:
    structures = _structures(8, seed=11)
    structures[5]["neighbor_list"] = torch.zeros((3, 2), dtype=torch.int64)
    structures[5]["shifts"] = torch.zeros((3, 3))
    break_it(structures[5])
    adapter = ReadManyAdapter(SampleReader(structures))
    adapter.read_packed([0, 1])
    with pytest.raises(ReaderOutputError, match=phrase):
        adapter.read_packed([1, 5])


def test_contract_errors() -> None:
    with pytest.raises(NotAReaderError, match="needs read_many"):
        ReadManyAdapter(object())

    class Short(SampleReader):
        def read_many(self, indices: Sequence[int]) -> list[tuple[dict[str, torch.Tensor], dict[str, Any]]]:
            return super().read_many(indices)[:-1]

    with pytest.raises(ReaderOutputError, match="returned 0 samples for 1 indices"):
        ReadManyAdapter(Short(_structures(3)))

    class Objects(SampleReader):  # as nvalchemi's Dataset.read_many, which returns AtomicData objects
        def read_many(self, indices: Sequence[int]) -> list[tuple[Any, dict[str, Any]]]:
            return [(object(), {"index": i}) for i in indices]

    with pytest.raises(ReaderOutputError, match="returned object samples, not dicts of tensors"):
        ReadManyAdapter(Objects(_structures(3)))
    inner = SampleReader(_structures(3))
    adapter = ReadManyAdapter(inner)
    with pytest.raises(SampleIndexError, match="Index 3 out of range for reader with 3 samples"):
        adapter.read_packed([0, 3])
    adapter.close()
    adapter.close()
    assert inner.closed == 1
    with pytest.raises(ReaderClosedError):
        adapter.read_packed([0])


@pytest.mark.parametrize(
    "huge", [np.array([2**64 - 1], dtype=np.uint64), np.array([2**63], dtype=np.uint64), [2**70]], ids=str
)
def test_huge_indices_are_out_of_range_never_wrapped(huge: Any) -> None:
    adapter = ReadManyAdapter(SampleReader(_structures(3)))
    value = int(np.asarray(huge, dtype=object).reshape(-1)[0])
    with pytest.raises(SampleIndexError, match=rf"Index {value} out of range for reader with 3 samples"):
        adapter.read_packed(huge)
    with pytest.raises(SampleIndexError, match=rf"Index {value} out of range"):
        adapter.sample_sizes(huge)


def test_as_packed_reader_wraps_only_read_many_readers(small_store: Any, reader: Any) -> None:
    assert as_packed_reader(str(small_store)) == str(small_store)
    assert as_packed_reader(reader) is reader
    wrapped = as_packed_reader(SampleReader(_structures(4)))
    assert isinstance(wrapped, ReadManyAdapter) and len(wrapped) == 4


@pytest.mark.parametrize(
    "make", [pytest.param("dali", marks=pytest.mark.dali), pytest.param("dali-w2", marks=pytest.mark.dali), "plain"]
)
@pytest.mark.parametrize("budget", [False, True])
def test_both_loaders_read_an_nvalchemi_style_reader(make: str, budget: bool) -> None:
    structures = _structures()
    inner = SizedReader(structures)
    options: dict[str, Any] = {"seed": 4, **({"max_atoms": 30} if budget else {"batch_size": 8})}
    if make == "plain":
        loader: Any = plain_dataloader(inner, num_workers=0, batched=True, **options)
    else:
        from dali_alchemi import DALIDataLoader  # imports DALI: only in the dali-marked cases

        workers = 2 if make == "dali-w2" else 0
        loader = DALIDataLoader(inner, device="cpu", num_workers=workers, batches_per_window=3, **options)
    want = _expected(structures)
    try:
        batches = list(loader)
        planned = list(loader.plan.epoch(0).batches())
        assert len(batches) == len(planned) and sum(b.num_graphs for b in batches) == 53
        for batch, indices in zip(batches, planned, strict=True):
            ref = Batch.from_packed(want.take(indices))
            assert batch.sample_indices.tolist() == indices.tolist()
            for name in ref.fields:
                assert batch[name].dtype == ref[name].dtype and torch.equal(batch[name], ref[name]), name
            assert torch.equal(batch.batch_ptr, ref.batch_ptr)
            if budget:
                assert batch.num_nodes <= 30
    finally:
        loader.close()
    assert inner.closed == 0  # the loader does not close a reader it was given


def test_read_many_readers_can_be_members_of_several_stores() -> None:
    first, second = _structures(20, seed=5), _structures(13, seed=6)
    assert [type(m) for m in as_packed_reader([SampleReader(first), SizedReader(second)])] == [ReadManyAdapter] * 2
    loader = plain_dataloader(
        [SampleReader(first), SizedReader(second)], batch_size=8, shuffle=False, num_workers=0, batched=True
    )
    try:
        batches = list(loader)
    finally:
        loader.close()
    want = _expected(first + second)
    ids = torch.cat([b.dataset_id for b in batches])
    assert ids.tolist() == [0] * 20 + [1] * 13
    assert torch.cat([b.dataset_index for b in batches]).tolist() == list(range(20)) + list(range(13))
    positions = torch.cat([b["positions"] for b in batches])
    assert torch.equal(positions, torch.from_numpy(want.fields["positions"]))
