from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.storage import LocalStore, MemoryStore, StorePath

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, ReaderClosedError, SampleIndexError
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig

N_SMALL = 300


@pytest.fixture(scope="module")
def reader(small_store: Path) -> AtomicDataZarrReader:
    with AtomicDataZarrReader(small_store) as r:
        yield r


@pytest.fixture(scope="module")
def truth() -> list[dict[str, np.ndarray]]:
    """The synthetic samples the small store was written from (same seed and sizes)."""
    return synthetic_samples(N_SMALL, seed=7, min_atoms=10, max_atoms=40).split()


def _check_sample(sample: dict[str, torch.Tensor], want: dict[str, np.ndarray]) -> None:
    assert set(sample) == set(want)
    for key, value in want.items():
        got = sample[key].numpy()
        assert got.dtype == value.dtype, key
        assert got.shape == value.shape, key
        assert np.array_equal(got, value), key


def test_len_fields_and_levels(reader: AtomicDataZarrReader) -> None:
    assert len(reader) == N_SMALL
    assert len(reader.field_names) == 11
    assert reader.field_levels["neighbor_list"] == "edge"
    assert reader.get_metadata(0) == tuple(int(c[0]) for c in reader.sample_sizes([0]))


def test_read_returns_what_was_written(reader: AtomicDataZarrReader, truth: list) -> None:
    for i in (0, 1, 150, N_SMALL - 1):
        sample, meta = reader.read(i)
        _check_sample(sample, truth[i])
        assert meta == {"index": i, "source_file": reader.source, "physical_index": str(i)}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-N_SMALL, N_SMALL - 1), min_size=0, max_size=40))
def test_read_many_equals_per_sample_reads(reader: AtomicDataZarrReader, truth: list, indices: list[int]) -> None:
    many = reader.read_many(indices)
    assert len(many) == len(indices)
    for (sample, meta), index in zip(many, indices, strict=True):
        expected_index = index % N_SMALL
        assert meta["index"] == expected_index
        single, _ = reader.read(index)
        for key in sample:
            assert torch.equal(sample[key], single[key])
        _check_sample(sample, truth[expected_index])


def test_read_packed_is_flat_and_in_request_order(reader: AtomicDataZarrReader, truth: list) -> None:
    order = [17, 3, 250, 3, -1]
    packed = reader.read_packed(order)
    assert packed.logical_indices.tolist() == [17, 3, 250, 3, N_SMALL - 1]
    wanted = [truth[i % N_SMALL] for i in order]
    assert packed.n_atoms.tolist() == [w["positions"].shape[0] for w in wanted]
    assert packed.n_edges.tolist() == [w["neighbor_list"].shape[0] for w in wanted]
    for key in ("positions", "neighbor_list", "energy", "cell"):
        expected = np.concatenate([w[key] for w in wanted])
        assert np.array_equal(packed.fields[key], expected), key
    assert packed.fields["energy"].shape == (5, 1)
    assert packed.fields["cell"].shape == (5, 3, 3)


def test_each_block_is_fetched_once_per_call_and_cached(small_store: Path) -> None:
    with AtomicDataZarrReader(small_store, cache_bytes=1 << 30) as r:
        everything = np.arange(N_SMALL)
        r.read_packed(np.concatenate([everything, everything[::-1]]))
        first = r.stats()
        # every chunk of every data array exactly once, although each sample was requested twice
        blocks = sum(h.codec.n_blocks for h in r._snapshot.handles.values())
        assert first.chunks_fetched == blocks
        # every block of every array was touched, so each array is now held whole ("resident")
        assert r.stats().cache.entries == len(r._snapshot.handles)
        order = np.random.default_rng(0).permutation(N_SMALL)
        again = r.read_packed(order)
        assert r.stats().chunks_fetched == blocks  # the second window came from the cache
        assert r.stats().cache.hits == len(r._snapshot.handles)
    with AtomicDataZarrReader(small_store, cache_bytes=0) as cold:
        expected = cold.read_packed(order)
    for name in expected.fields:
        assert np.array_equal(again.fields[name], expected.fields[name]), name


def test_arrays_too_large_for_the_cache_stay_in_blocks(small_store: Path) -> None:
    with AtomicDataZarrReader(small_store, cache_bytes=300_000) as r:
        r.read_packed(np.arange(N_SMALL))
        big = [name for name, h in r._snapshot.handles.items() if h.codec.row_nbytes * h.shape[0] > 300_000 // 4]
        assert big and all(r._engine.cache.peek((name, -1)) is None for name in big)
        order = np.random.default_rng(1).permutation(N_SMALL)
        got = r.read_packed(order)
    with AtomicDataZarrReader(small_store, cache_bytes=0) as cold:
        expected = cold.read_packed(order)
    for name in expected.fields:
        assert np.array_equal(got.fields[name], expected.fields[name]), name


def test_cache_is_bounded(small_store: Path) -> None:
    budget = 200_000
    with AtomicDataZarrReader(small_store, cache_bytes=budget) as r:
        for start in range(0, N_SMALL, 50):
            r.read_packed(np.arange(start, start + 50))
        stats = r.stats().cache
        assert 0 < stats.nbytes <= budget
        assert stats.evictions > 0
    with AtomicDataZarrReader(small_store, cache_bytes=0) as r:
        r.read_packed([0, 1])
        once = r.stats().chunks_fetched
        r.read_packed([N_SMALL - 2, N_SMALL - 1])  # ends with the store: no block is handed on to the next read
        before = r.stats().chunks_fetched
        r.read_packed([0, 1])
        assert r.stats().cache.nbytes == 0
        assert once >= 11
        assert r.stats().chunks_fetched - before == once  # nothing kept: every chunk fetched again


def test_fields_projection(small_store: Path, truth: list) -> None:
    with AtomicDataZarrReader(small_store, fields=["positions", "energy"]) as r:
        sample, _ = r.read(4)
        assert set(sample) == {"positions", "energy"}
        assert r.field_names == ("positions", "energy")
        assert r.read_packed([1, 2], fields=["energy"]).fields.keys() == {"energy"}
        energy_blocks = r._snapshot.handles["energy"].codec.n_blocks
        # one block of positions, and energy's: one each, or all of them (a read that touches a quarter
        # of a small array's blocks reads the array whole)
        assert 2 <= r.stats().chunks_fetched <= 2 + energy_blocks + 1
        with pytest.raises(KeyError, match="forces"):
            r.read_packed([1], fields=["forces"])
    with pytest.raises(KeyError, match=r"Unknown fields \['nope'\]"):
        AtomicDataZarrReader(small_store, fields=["nope"])


def test_a_single_field_name_is_one_field(small_store: Path) -> None:
    with AtomicDataZarrReader(small_store, fields="positions") as r:
        assert r.field_names == ("positions",)
        assert set(r.read(0)[0]) == {"positions"}
    with AtomicDataZarrReader(small_store) as r:
        assert r.read_packed([0, 1], fields="energy").fields.keys() == {"energy"}


def test_sharded_store_reads_the_same(sharded_store: Path, reader: AtomicDataZarrReader) -> None:
    order = np.random.default_rng(3).integers(-N_SMALL, N_SMALL, 200)
    with AtomicDataZarrReader(sharded_store, cache_bytes=0) as sharded:
        a, b = sharded.read_packed(order), reader.read_packed(order)
        for key in a.fields:
            assert np.array_equal(a.fields[key], b.fields[key]), key


def test_index_errors_name_index_and_length(reader: AtomicDataZarrReader) -> None:
    with pytest.raises(SampleIndexError, match=f"Index {N_SMALL} out of range for reader with {N_SMALL} samples"):
        reader.read(N_SMALL)
    with pytest.raises(IndexError, match=f"Index -{N_SMALL + 1} out of range"):
        reader.read_many([0, -N_SMALL - 1])
    with pytest.raises(TypeError, match="must be integers"):
        reader.read_many([0.5])
    with pytest.raises(TypeError, match="got dtype bool"):
        reader.read_packed(np.array([True, False]))
    assert reader.read_many([]) == []


@pytest.mark.parametrize(
    "given",
    [np.array([2**64 - 1], np.uint64), np.array([2**63], np.uint64), [2**64], [2**70], [-(2**70)]],
    ids=["uint64-max", "2**63", "2**64", "2**70", "-2**70"],
)
def test_indices_beyond_int64_are_out_of_range_as_given_never_wrapped(reader: AtomicDataZarrReader, given) -> None:
    value = int(np.asarray(given).reshape(-1)[0])
    with pytest.raises(SampleIndexError, match=f"^Index {value} out of range for reader with {N_SMALL} samples$"):
        reader.read_many(given)
    with pytest.raises(SampleIndexError, match=f"^Index {value} out of range"):
        reader.sample_sizes(given)


def test_unsigned_indices_in_range_read_as_their_value(reader: AtomicDataZarrReader) -> None:
    packed = reader.read_packed(np.array([5, N_SMALL - 1], np.uint64))
    assert packed.logical_indices.tolist() == [5, N_SMALL - 1]
    assert packed.logical_indices.dtype == np.int64


def test_closed_reader_raises(small_store: Path) -> None:
    r = AtomicDataZarrReader(small_store)
    r.close()
    r.close()
    with pytest.raises(ReaderClosedError):
        r.read(0)
    with pytest.raises(ReaderClosedError):
        r.refresh()


def test_pickle_reopens_with_the_same_options(small_store: Path) -> None:
    r = AtomicDataZarrReader(small_store, fields=["positions"], cache_bytes=1234)
    again = pickle.loads(pickle.dumps(r))
    assert again.field_names == ("positions",)
    assert again._engine.cache.capacity_bytes == 1234
    assert torch.equal(again.read(3)[0]["positions"], r.read(3)[0]["positions"])


def test_pin_memory_needs_cuda(small_store: Path) -> None:
    if torch.cuda.is_available():
        assert AtomicDataZarrReader(small_store, pin_memory=True).read(0)[0]["positions"].is_pinned()
    else:
        with pytest.raises(RuntimeError, match="pin_memory=True needs a CUDA"):
            AtomicDataZarrReader(small_store, pin_memory=True)


def test_opens_every_kind_of_store(tmp_path: Path) -> None:
    samples = synthetic_samples(5, seed=1).split()
    memory = MemoryStore()
    AtomicDataZarrWriter(memory).write(samples)
    AtomicDataZarrWriter("memory://dali-alchemi-test/url.zarr").write(samples)
    local = tmp_path / "sub"
    AtomicDataZarrWriter(StorePath(LocalStore(tmp_path), "sub")).write(samples)
    for store in (
        memory,
        "memory://dali-alchemi-test/url.zarr",
        local,
        str(local),
        LocalStore(local),
        f"file://{local}",
        StorePath(LocalStore(tmp_path), "sub"),  # chunk keys then carry the prefix
    ):
        with AtomicDataZarrReader(store) as r:
            assert len(r) == 5
            _check_sample(r.read(2)[0], samples[2])


def test_soft_deleted_samples_are_skipped(tmp_path: Path) -> None:
    samples = synthetic_samples(6, seed=2).split()
    writer = AtomicDataZarrWriter(tmp_path / "s.zarr")
    writer.write(samples)
    reader = AtomicDataZarrReader(tmp_path / "s.zarr")
    writer.delete([1, 4])
    assert len(reader) == 6  # a snapshot until refresh()
    reader.refresh()
    assert len(reader) == 4
    got = reader.read_many([0, 1, 2, 3, -1])
    assert [m["physical_index"] for _, m in got] == ["0", "2", "3", "5", "5"]
    _check_sample(got[2][0], samples[3])


def test_zero_edge_and_one_atom_samples(tmp_path: Path) -> None:
    samples = [
        {
            "atomic_numbers": np.array([1]),
            "positions": np.zeros((1, 3), np.float32),
            "neighbor_list": np.zeros((0, 2), np.int64),
            "energy": np.ones((1, 1), np.float32),
        },
        {
            "atomic_numbers": np.array([6, 8]),
            "positions": np.ones((2, 3), np.float32),
            "neighbor_list": np.array([[0, 1], [1, 0]]),
            "energy": np.zeros((1, 1), np.float32),
        },
    ]
    AtomicDataZarrWriter(tmp_path / "s.zarr").write(samples)
    with AtomicDataZarrReader(tmp_path / "s.zarr") as r:
        packed = r.read_packed([1, 0, 0])
        assert packed.n_atoms.tolist() == [2, 1, 1]
        assert packed.n_edges.tolist() == [2, 0, 0]
        assert packed.fields["neighbor_list"].tolist() == [[0, 1], [1, 0]]
        assert r.read(0)[0]["neighbor_list"].shape == (0, 2)


def test_unsupported_codec_falls_back_to_zarr(tmp_path: Path, truth: list) -> None:
    """An array whose codec chain the fast decoder does not know is still read, through zarr."""
    path = tmp_path / "t.zarr"
    AtomicDataZarrWriter(path).write(truth[:20])
    group = zarr.open_group(path / "core", mode="r+")
    positions = group["positions"][...]
    del group["positions"]
    from zarr.codecs import TransposeCodec

    arr = group.create_array(
        "positions",
        shape=positions.shape,
        dtype=positions.dtype,
        chunks=(50, 3),
        filters=[TransposeCodec(order=(1, 0))],
    )
    arr[...] = positions
    with AtomicDataZarrReader(path) as r:
        assert r._snapshot.handles["positions"].codec is None
        for i in (0, 7, 19):
            assert np.array_equal(r.read(i)[0]["positions"].numpy(), truth[i]["positions"])


def test_split_trailing_chunks_and_missing_chunks(tmp_path: Path, truth: list) -> None:
    """nvalchemi's auto-chunking can split trailing dims, and all-fill chunks may be absent."""
    path = tmp_path / "t.zarr"
    AtomicDataZarrWriter(path).write(truth[:30])
    group = zarr.open_group(path / "core", mode="r+")
    for name, chunks in (("positions", (41, 1)), ("cell", (7, 2, 2)), ("atom_categories", (64,))):
        values = group[name][...]
        del group[name]
        arr = group.create_array(
            name, shape=values.shape, dtype=values.dtype, chunks=chunks, config={"write_empty_chunks": False}
        )
        arr[...] = values
    assert not (path / "core" / "atom_categories" / "c").exists()  # all zeros: no chunk written
    root = zarr.open_group(path, mode="r+")
    del root.attrs["dali_alchemi"]  # as a store written elsewhere: no promise that every chunk exists
    with AtomicDataZarrReader(path) as r:
        packed = r.read_packed(np.arange(30)[::-1])
        for name in ("positions", "cell", "atom_categories"):
            assert np.array_equal(packed.fields[name], np.concatenate([truth[i][name] for i in range(29, -1, -1)])), (
                name
            )


def test_sample_chunk_bounds_are_logical_and_follow_every_atom_array(tmp_path: Path) -> None:
    config = WriteConfig(core=ArrayConfig(chunk_size=64), custom=ArrayConfig(chunk_size=13))
    samples = synthetic_samples(40, seed=3).split()
    writer = AtomicDataZarrWriter(tmp_path / "s.zarr", config)
    writer.write(samples)
    writer.delete([0, 7, 8, 39])
    with AtomicDataZarrReader(tmp_path / "s.zarr", cache_bytes=12345) as reader:
        assert reader.cache_bytes == 12345
        bounds = reader.sample_chunk_bounds()
        assert bounds[0] == 0 and bounds[-1] == len(reader) == 36 and np.all(np.diff(bounds) > 0)
        physical = np.array([i for i in range(40) if i not in (0, 7, 8, 39)])
        block = reader.atoms_ptr[physical] // 64  # every core atom array has 64-row chunks
        expected = np.concatenate(([0], np.flatnonzero(np.diff(block)) + 1, [36]))
        assert bounds.tolist() == expected.tolist()


def test_sample_chunk_bounds_of_a_sharded_store_follow_its_inner_chunks(sharded_store: Path) -> None:
    with AtomicDataZarrReader(sharded_store) as reader:
        block = reader.atoms_ptr[:-1] // 64  # 64-row inner chunks in 256-row shards
        expected = np.concatenate(([0], np.flatnonzero(np.diff(block)) + 1, [len(reader)]))
        assert reader.sample_chunk_bounds().tolist() == expected.tolist()


def test_a_read_bigger_than_the_memory_budget_is_refused_naming_its_largest_sample(small_store: Path) -> None:
    from dali_alchemi.errors import ReadTooLargeError

    with AtomicDataZarrReader(small_store, cache_bytes=0) as reader:
        everything = reader.read_packed(np.arange(len(reader)))
        stored = sum(values.nbytes for values in everything.fields.values())
        reader._max_read_bytes = 10 * stored  # the whole store fits: any read goes ahead
        assert len(reader.read_packed(np.arange(len(reader)))) == len(reader)
        reader._max_read_bytes = stored // 2  # it does not: half the store is too much, a window is not
        assert len(reader.read_packed(np.arange(10))) == 10
        with pytest.raises(ReadTooLargeError, match=rf"reading {len(reader)} samples needs .* GiB.*the largest, sample \d+"):
            reader.read_packed(np.arange(len(reader)))
