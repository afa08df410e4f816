"""MultiReader: the reader contract, routing over the members, the shared fields and mismatched ones."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dali_alchemi import (
    AtomicDataZarrReader,
    AtomicDataZarrWriter,
    ConfigError,
    FieldMismatchError,
    MultiReader,
    PackedSamples,
    ReaderClosedError,
    SampleIndexError,
    UnknownFieldError,
)
from dali_alchemi.bench.synth import synthetic_samples, write_synthetic_store
from dali_alchemi.loader_inputs import open_source
from dali_alchemi.testing.reader import PackedReaderTests


def _expected(paths: tuple[Path, ...]) -> PackedSamples:
    """Every structure of the members in global order, read member by member, with the two added fields."""
    parts = []
    for d, path in enumerate(paths):
        with AtomicDataZarrReader(path) as r:
            packed = r.read_packed(np.arange(len(r)))
        added = {"dataset_id": np.full(len(packed), d, dtype=np.int64), "dataset_index": np.arange(len(packed))}
        parts.append((packed, added))
    first = parts[0][0]
    names = [*first.fields, "dataset_id", "dataset_index"]
    fields = {n: np.concatenate([p.fields[n] if n in p.fields else a[n] for p, a in parts]) for n in names}
    levels = {**first.levels, "dataset_id": "system", "dataset_index": "system"}
    n_atoms = np.concatenate([p.n_atoms for p, _ in parts])
    return PackedSamples.from_fields(fields, levels, n_atoms, np.concatenate([p.n_edges for p, _ in parts]))  # type: ignore[arg-type]


class TestMultiReaderContract(PackedReaderTests):
    """Two stores of different sizes behind one index pass the reader contract."""

    paths: tuple[Path, ...] = ()

    @pytest.fixture(autouse=True)
    def _stores(self, small_store: Path, other_store: Path) -> None:
        type(self).paths = (small_store, other_store)

    def make_reader(self) -> MultiReader:
        return MultiReader(list(self.paths))

    def expected(self) -> PackedSamples:
        return _expected(self.paths)


@pytest.fixture()
def multi(small_store: Path, other_store: Path) -> Any:
    with MultiReader([small_store, other_store]) as reader:
        yield reader


def test_offsets_lengths_and_index_mapping(multi: MultiReader) -> None:
    assert multi.lengths == (300, 120) and len(multi) == 420
    assert multi.offsets.tolist() == [0, 300, 420]
    ids, local = multi.to_local([0, 299, 300, 419, -1])
    assert ids.tolist() == [0, 0, 1, 1, 1] and local.tolist() == [0, 299, 0, 119, 119]
    assert multi.to_global(ids, local).tolist() == [0, 299, 300, 419, 419]
    with pytest.raises(SampleIndexError, match=r"Index 420 out of range for MultiReader with 420 samples"):
        multi.read_packed([3, 420])
    with pytest.raises(SampleIndexError, match=r"dataset_index 120 out of range for dataset 1 .*other\.zarr.* 120"):
        multi.to_global(1, 120)


@pytest.mark.parametrize(
    "huge", [np.array([2**64 - 1], dtype=np.uint64), np.array([2**63], dtype=np.uint64), [2**70]], ids=str
)
def test_huge_indices_are_out_of_range_never_wrapped(multi: MultiReader, huge: Any) -> None:
    value = int(np.asarray(huge, dtype=object).reshape(-1)[0])
    with pytest.raises(SampleIndexError, match=rf"Index {value} out of range for MultiReader with 420 samples"):
        multi.read_packed(huge)
    with pytest.raises(SampleIndexError, match=rf"Index {value} out of range"):
        multi.to_local(huge)
    with pytest.raises(SampleIndexError, match=rf"dataset_id {value} out of range for MultiReader with 2 stores"):
        multi.to_global(huge, 0)
    with pytest.raises(SampleIndexError, match=rf"dataset_index {value} out of range"):
        multi.to_global(0, huge)


def test_a_mixed_window_is_routed_per_member_and_comes_back_in_request_order(
    multi: MultiReader, small_store: Path, other_store: Path
) -> None:
    order = np.array([305, 2, 419, 2, 300, 150, -3, 305, 0], dtype=np.int64)
    got = multi.read_packed(order)
    assert got.logical_indices.tolist() == [305, 2, 419, 2, 300, 150, 417, 305, 0]
    assert got.fields["dataset_id"].tolist() == [1, 0, 1, 0, 1, 0, 1, 1, 0]
    assert got.fields["dataset_index"].tolist() == [5, 2, 119, 2, 0, 150, 117, 5, 0]
    with AtomicDataZarrReader(small_store) as a, AtomicDataZarrReader(other_store) as b:
        members = (a, b)
        for k, (d, i) in enumerate(zip(got.fields["dataset_id"], got.fields["dataset_index"], strict=True)):
            sample, _ = members[d].read(int(i))  # the member's own per-sample read
            mine = got.take(np.array([k]))
            for name, tensor in sample.items():
                want = tensor.numpy().reshape(mine.fields[name].shape)
                np.testing.assert_array_equal(mine.fields[name], want, err_msg=f"{k} {name}")
    n_atoms, n_edges = multi.sample_sizes(order)
    assert n_atoms.tolist() == got.n_atoms.tolist() and n_edges.tolist() == got.n_edges.tolist()


def test_a_window_from_one_member_and_an_empty_window(multi: MultiReader) -> None:
    got = multi.read_packed([310, 301], fields=["energy", "dataset_index"])
    assert list(got.fields) == ["energy", "dataset_index"] and got.fields["dataset_index"].tolist() == [10, 1]
    empty = multi.read_packed(np.zeros(0, dtype=np.int64), fields=["positions", "dataset_id"])
    assert empty.fields["positions"].shape == (0, 3) and empty.fields["dataset_id"].shape == (0,)
    only_ids = multi.read_packed([0, 300], fields=["dataset_id"])
    assert (
        only_ids.fields["dataset_id"].tolist() == [0, 1]
        and only_ids.n_atoms.tolist() == multi.sample_sizes([0, 300])[0].tolist()
    )
    one_name = multi.read_packed([0, 300], fields="energy")  # a string is one field, not its letters
    assert list(one_name.fields) == ["energy"]


def test_fields_default_to_those_every_member_shares(small_store: Path, other_store: Path) -> None:
    narrow = AtomicDataZarrReader(other_store, fields=["energy", "positions", "atomic_numbers"])
    with MultiReader([small_store, narrow]) as multi:
        assert list(multi.field_specs) == ["atomic_numbers", "energy", "positions", "dataset_id", "dataset_index"]
        spec = multi.field_specs["dataset_id"]
        assert (spec.level, spec.dtype, spec.trailing) == ("system", np.dtype(np.int64), ())
        assert set(multi.read_packed([0, 301]).fields) == set(multi.field_specs)
    assert len(narrow.read_packed([0]).fields) == 3  # a reader passed in is left open
    narrow.close()
    with pytest.raises(UnknownFieldError, match=r"Unknown fields \['forces'\]: missing from dataset 1"):
        MultiReader([small_store, AtomicDataZarrReader(other_store, fields=["energy"])], fields=["forces", "energy"])
    with MultiReader([small_store, other_store], fields=["forces", "dataset_id"]) as multi:
        assert list(multi.field_specs) == ["forces", "dataset_id"]


def _custom_store(path: Path, key: str, values: np.ndarray, level: str) -> Path:
    writer = AtomicDataZarrWriter(path)
    writer.write(synthetic_samples(12, seed=4, min_atoms=3, max_atoms=6).split())
    writer.add_custom(key, values, level)
    return path


def test_a_field_with_another_level_or_dtype_names_the_field_and_both_stores(tmp_path: Path) -> None:
    with AtomicDataZarrReader(_custom_store(tmp_path / "probe.zarr", "tag", np.zeros(12), "system")) as probe:
        atoms = int(probe.sample_sizes(np.arange(12))[0].sum())
    system = _custom_store(tmp_path / "sys.zarr", "tag", np.arange(12, dtype=np.int32), "system")
    atom = _custom_store(tmp_path / "atom.zarr", "tag", np.arange(atoms, dtype=np.int32), "atom")
    wide = _custom_store(tmp_path / "wide.zarr", "tag", np.arange(12, dtype=np.int64), "system")
    with pytest.raises(
        FieldMismatchError,
        match=r"field 'tag' differs.*level system in dataset 0 .*sys\.zarr.* but atom in dataset 1 .*atom\.zarr",
    ):
        MultiReader([system, atom])
    with pytest.raises(
        FieldMismatchError,
        match=r"field 'tag' differs.*dtype int32 in dataset 0 .*sys\.zarr.* but int64 in dataset 1 .*wide\.zarr",
    ):
        MultiReader([system, wide])
    assert isinstance(FieldMismatchError("x"), ValueError)


def test_bad_arguments_and_closing(small_store: Path, other_store: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="non-empty list"):
        MultiReader([])
    with pytest.raises(ConfigError, match="names= has 1 entries for 2 members"):
        MultiReader([small_store, other_store], names=["a"])
    multi = MultiReader([small_store, other_store], names=["bulk", "special"])
    assert repr(multi) == "MultiReader({'bulk': 300, 'special': 120}, 13 fields)"
    clone = pickle.loads(pickle.dumps(multi))
    multi.close()
    multi.close()
    with pytest.raises(ReaderClosedError, match="MultiReader is closed"):
        multi.read_packed([0])
    assert clone.read_packed([419]).fields["dataset_index"].tolist() == [119]  # the copy reopened its members
    clone.close()
    single, owned = open_source(small_store, fields=None, cache_bytes=None)
    assert isinstance(single, AtomicDataZarrReader) and owned
    single.close()
    several, owned = open_source(
        (small_store, write_synthetic_store(tmp_path / "x.zarr", 3)), fields=None, cache_bytes=None
    )
    assert isinstance(several, MultiReader) and owned and several.lengths == (300, 3)
    several.close()


def test_runs_and_scattered_windows_read_the_same(
    multi: MultiReader, small_store: Path, other_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dali_alchemi.store.read.multi as module

    few_runs = np.concatenate([np.arange(0, 10), np.arange(300, 305), np.arange(10, 20), [419]])
    scattered = np.random.default_rng(3).permutation(420)[:200]
    repeats = np.array([301, 5, 301, 7, 5, 400])
    with AtomicDataZarrReader(small_store) as a, AtomicDataZarrReader(other_store) as b:
        for window in (few_runs, scattered, repeats):
            member = (window >= 300).astype(np.int64)
            got = multi.read_packed(window)
            monkeypatch.setattr(module, "MAX_RUN_COPIES", 0)  # force the scatter path
            PackedReaderTests.assert_packed_equal(multi.read_packed(window), got)
            monkeypatch.undo()
            want = np.empty(window.size, dtype=object)
            for d, reader in enumerate((a, b)):  # each member read on its own, then compared structure by structure
                where = np.flatnonzero(member == d)
                for k, (sample, _) in zip(where.tolist(), reader.read_many(window[where] - 300 * d), strict=True):
                    want[k] = sample
            for k in range(window.size):
                mine = got.take(np.array([k]))
                for name, tensor in want[k].items():
                    np.testing.assert_array_equal(mine.fields[name], tensor.numpy().reshape(mine.fields[name].shape))
