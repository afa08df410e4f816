from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.storage import MemoryStore

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, Batch, SampleDataError, SampleIndexError
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.errors import FieldLevelError, StoreNotFoundError


def _sample(n_atoms: int, n_edges: int, seed: int, **extra: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sample = {
        "atomic_numbers": rng.integers(1, 20, n_atoms),
        "positions": rng.standard_normal((n_atoms, 3), dtype=np.float32),
        "neighbor_list": rng.integers(0, n_atoms, (n_edges, 2)),
        "shifts": rng.standard_normal((n_edges, 3), dtype=np.float32),
        "energy": rng.standard_normal((1, 1), dtype=np.float32),
        "cell": rng.standard_normal((1, 3, 3), dtype=np.float32),
        "pbc": np.array([[True, False, True]]),
    }
    sample.update(extra)
    return sample


def _assert_reads_back(path: Path | str, samples: list[dict[str, np.ndarray]]) -> None:
    with AtomicDataZarrReader(path) as reader:
        assert len(reader) == len(samples)
        for (got, _), want in zip(reader.read_many(range(len(samples))), samples, strict=True):
            assert set(got) == set(want)
            for key, value in want.items():
                assert got[key].numpy().dtype == np.asarray(value).dtype, key
                assert np.array_equal(got[key].numpy(), value), key


def test_write_creates_the_nvalchemi_layout(tmp_path: Path) -> None:
    samples = [_sample(3, 2, 0), _sample(4, 3, 1)]
    AtomicDataZarrWriter(tmp_path / "s.zarr").write(samples)
    root = zarr.open_group(tmp_path / "s.zarr", mode="r")
    assert root.metadata.zarr_format == 3
    assert sorted(name for name, _ in root.groups()) == ["core", "custom", "meta"]
    assert sorted(root["meta"].array_keys()) == ["atoms_mask", "atoms_ptr", "edges_mask", "edges_ptr", "samples_mask"]
    assert root["meta/atoms_ptr"][...].tolist() == [0, 3, 7]
    assert root["meta/edges_ptr"][...].tolist() == [0, 2, 5]
    assert root.attrs["num_samples"] == 2
    assert root.attrs["fields"]["core"]["neighbor_list"] == "edge"
    assert root["core/energy"].shape == (2, 1) and root["core/cell"].shape == (2, 3, 3)
    # store-global on disk: sample 1's local indices are offset by sample 0's 3 atoms
    assert np.array_equal(root["core/neighbor_list"][2:], samples[1]["neighbor_list"] + 3)
    # chunks keep trailing dims whole
    assert root["core/positions"].chunks[1:] == (3,)
    assert root["core/cell"].chunks[1:] == (3, 3)
    _assert_reads_back(tmp_path / "s.zarr", samples)


def test_write_refuses_existing_stores(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        AtomicDataZarrWriter(tmp_path / "empty").write([_sample(2, 1, 0)])
    memory = MemoryStore()
    AtomicDataZarrWriter(memory).write([_sample(2, 1, 0)])
    with pytest.raises(FileExistsError):
        AtomicDataZarrWriter(memory).write([_sample(2, 1, 0)])
    with pytest.raises(ValueError, match="No data provided"):
        AtomicDataZarrWriter(tmp_path / "new").write(synthetic_samples(3).take(np.zeros(0, np.int64)))
    with pytest.raises(ValueError, match="No samples"):
        AtomicDataZarrWriter(tmp_path / "new").write([])


def test_torch_tensors_and_batches_are_accepted(tmp_path: Path) -> None:
    samples = [_sample(3, 2, 0), _sample(5, 0, 1)]
    as_torch = [{k: torch.from_numpy(v) for k, v in s.items()} for s in samples]
    AtomicDataZarrWriter(tmp_path / "a.zarr").write(as_torch)
    AtomicDataZarrWriter(tmp_path / "b.zarr").write(Batch.from_samples(samples))
    _assert_reads_back(tmp_path / "a.zarr", samples)
    _assert_reads_back(tmp_path / "b.zarr", samples)


def test_unknown_fields_need_levels(tmp_path: Path) -> None:
    samples = [_sample(3, 2, 0, tag=np.array([[7]]), charge_per_atom=np.ones(3))]
    with pytest.raises(FieldLevelError, match=r"'tag'|'charge_per_atom'"):
        AtomicDataZarrWriter(tmp_path / "s.zarr").write(samples)
    AtomicDataZarrWriter(tmp_path / "s.zarr").write(samples, levels={"tag": "system", "charge_per_atom": "atom"})
    _assert_reads_back(tmp_path / "s.zarr", samples)


def test_inconsistent_samples_are_rejected_with_the_sample_named(tmp_path: Path) -> None:
    bad_rows = _sample(3, 2, 0)
    bad_rows["positions"] = np.zeros((4, 3), np.float32)
    with pytest.raises(SampleDataError, match="Sample 0: field 'positions' has 4 rows but 'atomic_numbers' has 3"):
        AtomicDataZarrWriter(tmp_path / "a.zarr").write([bad_rows])
    missing = _sample(3, 2, 1)
    del missing["energy"]
    with pytest.raises(SampleDataError, match="Sample 1 has fields"):
        AtomicDataZarrWriter(tmp_path / "b.zarr").write([_sample(2, 1, 0), missing])
    out_of_range = _sample(3, 2, 0)
    out_of_range["neighbor_list"] = np.array([[0, 1], [2, 3]])
    with pytest.raises(SampleDataError, match=r"Sample 0: neighbor_list holds \[2, 3\] but the sample has 3 atoms"):
        AtomicDataZarrWriter(tmp_path / "c.zarr").write([out_of_range])
    assert not (tmp_path / "c.zarr").exists()  # nothing half-written


def test_system_squeeze_matches_nvalchemi(tmp_path: Path) -> None:
    samples = [_sample(2, 1, i, dipole_like=np.ones((1, 1, 4), np.float32)) for i in range(3)]
    AtomicDataZarrWriter(tmp_path / "s.zarr").write(samples, levels={"dipole_like": "system"})
    assert zarr.open_array(tmp_path / "s.zarr" / "core" / "dipole_like", mode="r").shape == (3, 4)
    with AtomicDataZarrReader(tmp_path / "s.zarr") as reader:
        assert reader.read(1)[0]["dipole_like"].shape == (1, 4)


def test_append_rebases_neighbor_lists_and_extends_everything(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    first = [_sample(3, 2, 0), _sample(4, 3, 1)]
    writer = AtomicDataZarrWriter(path)
    writer.write(first)
    writer.add_custom("tag", np.array([10, 11]), "system")
    writer.add_custom("charge", np.arange(7, dtype=np.float32), "atom")
    new = _sample(2, 1, 2, tag=np.array([12]), charge=np.array([7.0, 8.0], np.float32))
    new["neighbor_list"] = np.array([[0, 1]])
    writer.append([new])
    root = zarr.open_group(path, mode="r")
    assert root["core/neighbor_list"][-1].tolist() == [7, 8]  # local [0, 1] after 7 atoms
    assert root["meta/atoms_ptr"][...].tolist() == [0, 3, 7, 9]
    assert root["meta/samples_mask"].shape == (3,) and root["meta/atoms_mask"].shape == (9,)
    assert root.attrs["num_samples"] == 3
    with AtomicDataZarrReader(path) as reader:
        sample, _ = reader.read(2)
        assert sample["neighbor_list"].tolist() == [[0, 1]]
        assert sample["tag"].tolist() == [12]
        assert sample["charge"].tolist() == [7.0, 8.0]
    writer.append([])  # nothing to do


def test_append_requires_the_stores_fields(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    writer = AtomicDataZarrWriter(path)
    with pytest.raises(StoreNotFoundError):
        writer.append([_sample(2, 1, 0)])
    writer.write([_sample(2, 1, 0)])
    writer.add_custom("tag", np.array([1]), "system")
    with pytest.raises(SampleDataError, match=r"missing \['tag'\]"):
        writer.append([_sample(2, 1, 1)])
    with pytest.raises(SampleDataError, match=r"unexpected \['extra'\]"):
        writer.append([_sample(2, 1, 1, tag=np.array([2]), extra=np.ones(2))])
    wrong_shape = _sample(2, 1, 1, tag=np.array([[2, 3]]))
    with pytest.raises(SampleDataError, match="Field 'tag': new rows have trailing shape"):
        writer.append([wrong_shape])
    wrong_dtype = _sample(2, 1, 1, tag=np.array([2.5]))
    with pytest.raises(SampleDataError, match="Field 'tag': new rows have dtype float64"):
        writer.append([wrong_dtype])
    wrong_cell = _sample(2, 1, 1, tag=np.array([2]))
    wrong_cell["cell"] = np.ones((1, 2, 2), np.float32)
    with pytest.raises(SampleDataError, match=r"Field 'cell' has shape \(1, 2, 2\); expected \[rows, 3, 3\]"):
        writer.append([wrong_cell])
    with AtomicDataZarrReader(path) as reader:
        assert len(reader) == 1  # failed appends left the store as it was


def test_add_custom_checks_level_and_length(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    writer = AtomicDataZarrWriter(path)
    with pytest.raises(FileNotFoundError):
        writer.add_custom("tag", np.arange(2), "system")
    writer.write([_sample(3, 2, 0), _sample(4, 3, 1)])
    with pytest.raises(ValueError, match="Invalid level 'graph'"):
        writer.add_custom("tag", np.arange(2), "graph")
    with pytest.raises(ValueError, match=r"Data shape\[0\]=3 does not match expected size=2 for level=system"):
        writer.add_custom("tag", np.arange(3), "system")
    with pytest.raises(ValueError, match="expected size=5 for level=edge"):
        writer.add_custom("w", np.arange(4), "edge")
    with pytest.raises(ValueError, match="already a core field"):
        writer.add_custom("positions", np.zeros((7, 3)), "atom")
    writer.add_custom("w", torch.arange(5.0), "edge")
    writer.add_custom("w", np.arange(5, dtype=np.int16), "edge")  # replacing is allowed
    with AtomicDataZarrReader(path) as reader:
        assert reader.field_levels["w"] == "edge"
        assert reader.read(1)[0]["w"].tolist() == [2, 3, 4]
        assert reader.read(1)[0]["w"].dtype == torch.int16


def test_delete_zeroes_data_and_masks_but_keeps_pointers(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    writer = AtomicDataZarrWriter(path)
    samples = [_sample(3, 2, 0), _sample(4, 3, 1), _sample(2, 2, 2)]
    writer.write(samples)
    writer.delete([1])
    writer.delete(torch.tensor([1]))  # again: nothing changes
    with pytest.raises(SampleIndexError, match="Physical index 3 out of range for a store with 3 samples"):
        writer.delete([3])
    with pytest.raises(SampleIndexError, match=f"Physical index {2**64 - 1} out of range for a store with 3"):
        writer.delete(np.array([2**64 - 1], np.uint64))  # not wrapped around to -1, nor to sample 2
    with pytest.raises(SampleIndexError, match="Physical index -1 out of range"):
        writer.delete([-1])
    with pytest.raises(TypeError, match="a mask is not accepted"):
        writer.delete(np.array([True, False, True]))
    with pytest.raises(TypeError, match="integer physical indices"):
        writer.delete([0.5])
    root = zarr.open_group(path, mode="r")
    assert root["meta/samples_mask"][...].tolist() == [True, False, True]
    assert root["meta/atoms_mask"][...].tolist() == [True] * 3 + [False] * 4 + [True] * 2
    assert root["meta/edges_mask"][...].tolist() == [True] * 2 + [False] * 3 + [True] * 2
    assert root["meta/atoms_ptr"][...].tolist() == [0, 3, 7, 9]
    assert not root["core/positions"][3:7].any()
    assert root.attrs["num_samples"] == 3
    _assert_reads_back(path, [samples[0], samples[2]])


def test_defragment_streams_rebases_and_applies_a_new_config(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    samples = synthetic_samples(50, seed=4, min_atoms=2, max_atoms=9).split()
    writer = AtomicDataZarrWriter(path, WriteConfig(core=ArrayConfig(chunk_size=16)))
    writer.write(samples)
    writer.add_custom("tag", np.arange(50), "system")
    deleted = {0, 3, 4, 17, 49}
    writer.delete(sorted(deleted))
    writer.defragment(WriteConfig(core=ArrayConfig(chunk_size=32, shard_size=64)), window=7)
    live = [i for i in range(50) if i not in deleted]
    expected = [{**samples[i], "tag": np.array([i])} for i in live]
    _assert_reads_back(path, expected)
    root = zarr.open_group(path, mode="r")
    assert root["core/positions"].shards == (64, 3)
    assert root.attrs["num_samples"] == 45
    assert root["meta/samples_mask"][...].all()
    assert [p.name for p in tmp_path.iterdir()] == ["s.zarr"]  # no staging left behind


def test_defragment_of_everything_deleted_leaves_an_empty_readable_store(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    writer = AtomicDataZarrWriter(path)
    writer.write([_sample(3, 2, 0), _sample(2, 0, 1)])
    writer.delete([0, 1])
    writer.defragment()
    with AtomicDataZarrReader(path) as reader:
        assert len(reader) == 0
        assert reader.field_levels["neighbor_list"] == "edge"
        assert reader.read_many([]) == []
        with pytest.raises(IndexError):
            reader.read(0)
    writer.append([_sample(2, 1, 5)])
    with AtomicDataZarrReader(path) as reader:
        assert len(reader) == 1


# -- round trip property -------------------------------------------------------------------------
@st.composite
def sample_lists(draw: st.DrawFn) -> list[dict[str, np.ndarray]]:
    n = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**16))
    with_custom = draw(st.booleans())
    out = []
    for i in range(n):
        n_atoms = draw(st.integers(1, 5))
        n_edges = draw(st.integers(0, 6))
        extra = {}
        if with_custom:
            extra = {
                "q": np.full(n_atoms, i, np.float32),
                "w": np.arange(n_edges, dtype=np.int32),
                "tag": np.array([[i, -i]]),
            }
        out.append(_sample(n_atoms, n_edges, seed + i, **extra))
    return out


LEVELS = {"q": "atom", "w": "edge", "tag": "system"}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=sample_lists(), second=sample_lists(), data=st.data())
def test_round_trip_with_appends_deletes_and_defragment(first: list, second: list, data: st.DataObject) -> None:
    if ("q" in first[0]) != ("q" in second[0]):
        second = (
            [{k: v for k, v in s.items() if k in first[0]} for s in second]
            if "q" not in first[0]
            else [
                {
                    **s,
                    "q": np.zeros(len(s["atomic_numbers"]), np.float32),
                    "w": np.zeros(len(s["neighbor_list"]), np.int32),
                    "tag": np.array([[0, 0]]),
                }
                for s in second
            ]
        )
    chunk = data.draw(st.integers(1, 8))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "s.zarr"
        writer = AtomicDataZarrWriter(
            path, WriteConfig(core=ArrayConfig(chunk_size=chunk), custom=ArrayConfig(chunk_size=chunk))
        )
        writer.write(first, levels=LEVELS)
        writer.append(second, levels=LEVELS)
        everything = first + second
        _assert_reads_back(path, everything)
        doomed = data.draw(st.sets(st.integers(0, len(everything) - 1)))
        writer.delete(sorted(doomed))
        kept = [s for i, s in enumerate(everything) if i not in doomed]
        _assert_reads_back(path, kept)
        writer.defragment(window=data.draw(st.integers(1, 5)))
        _assert_reads_back(path, kept)


# -- the writer refuses what its reader refuses, before anything is written -------------------------
def _nothing_beside(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


BAD_WRITES = {
    "float atomic_numbers": ({"atomic_numbers": np.array([1.0, 6.0])}, None, "dtype float64, which cannot hold atomic_numbers"),
    "positions (5, 2)": ({"positions": np.zeros((2, 2), np.float32)}, None, r"'positions' has shape \(2, 2\); expected \[rows, 3\]"),
    "neighbor_list (4, 3)": ({"neighbor_list": np.zeros((1, 3), np.int64)}, None, r"'neighbor_list' has shape \(1, 3\); expected \[edges, 2\]"),
    "a/b": ({"a/b": np.zeros(2)}, {"a/b": "atom"}, "contains a path separator"),
    "zarr.json": ({"zarr.json": np.zeros(2)}, {"zarr.json": "atom"}, "is reserved by zarr"),
    "NUL": ({"a\x00b": np.zeros(2)}, {"a\x00b": "atom"}, "control character"),
    "300 characters": ({"x" * 300: np.zeros(2)}, {"x" * 300: "atom"}, "longer than 255 bytes"),
    "..": ({"..": np.zeros(2)}, {"..": "atom"}, "starts with '.'"),
    "NaN positions": ({"positions": np.array([[0, 0, 0], [np.nan, 0, 0]], np.float32)}, None, r"'positions': row 1 \(sample 0\)"),
    "inf energy": ({"energy": np.array([[np.inf]], np.float32)}, None, r"'energy': row 0 holds .*inf.*allow_nonfinite=True"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_WRITES))
def test_write_refuses_what_the_reader_refuses_before_writing(tmp_path: Path, case: str) -> None:
    fields, levels, message = BAD_WRITES[case]
    path = tmp_path / "s.zarr"
    with pytest.raises(SampleDataError, match=message):
        AtomicDataZarrWriter(path).write([_sample(2, 1, 0, **fields)], levels=levels)
    assert not path.exists() and _nothing_beside(path) == []


@pytest.mark.parametrize("case", ["float atomic_numbers", "positions (5, 2)", "neighbor_list (4, 3)", "NaN positions"])
def test_append_refuses_what_the_reader_refuses_before_writing(tmp_path: Path, case: str) -> None:
    fields, _, message = BAD_WRITES[case]
    path = tmp_path / "s.zarr"
    AtomicDataZarrWriter(path).write([_sample(2, 1, 0)])
    before = {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    with pytest.raises(SampleDataError, match=message):
        AtomicDataZarrWriter(path).append([_sample(2, 1, 1, **fields)])
    after = {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    assert after == before and _nothing_beside(path) == []


@pytest.mark.parametrize("key", ["..", ".", "a/b", "zarr.json", "a\x00b", "x" * 300, ""])
def test_add_custom_refuses_names_that_are_no_array(tmp_path: Path, key: str) -> None:
    path = tmp_path / "s.zarr"
    AtomicDataZarrWriter(path).write([_sample(2, 1, 0)])
    with pytest.raises(SampleDataError, match="Field name"):
        AtomicDataZarrWriter(path).add_custom(key, np.zeros(1), "system")
    assert _nothing_beside(path) == [] and len(AtomicDataZarrReader(path)) == 1


def test_add_custom_refuses_bad_arrays_and_nonfinite_values(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    AtomicDataZarrWriter(path).write([_sample(2, 1, 0), _sample(3, 1, 1)])
    with pytest.raises(SampleDataError, match=r"'charge': row 3 \(sample 1\) holds nan"):
        AtomicDataZarrWriter(path).add_custom("charge", np.array([0, 0, 0, np.nan, 0], np.float32), "atom")
    with pytest.raises(SampleDataError, match="cannot hold forces"):
        AtomicDataZarrWriter(path).add_custom("forces", np.zeros((5, 3), np.int32), "atom")
    assert _nothing_beside(path) == [] and "charge" not in AtomicDataZarrReader(path).field_names


def test_nonfinite_values_are_stored_when_allowed(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    sample = _sample(2, 1, 0, energy=np.array([[np.nan]], np.float32))
    AtomicDataZarrWriter(path, allow_nonfinite=True).write([sample])
    AtomicDataZarrWriter(path, allow_nonfinite={"charge"}).add_custom("charge", np.array([np.inf, 1.0]), "atom")
    with pytest.raises(SampleDataError, match="'energy'"):  # only the fields named may
        AtomicDataZarrWriter(path, allow_nonfinite={"charge"}).append([dict(sample, charge=np.zeros(2))])
    tensors, _ = AtomicDataZarrReader(path)[0]
    assert torch.isnan(tensors["energy"]).all() and torch.isinf(tensors["charge"][0])
