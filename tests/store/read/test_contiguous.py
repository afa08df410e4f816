"""Windows in store order, and the runs covering block-order windows, read the lean way: the same values as the
general path, every damage still caught."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from dali_alchemi import AtomicDataZarrReader, ChunkDecodeError
from dali_alchemi.bench.synth import write_synthetic_store
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.store.read import spans
from dali_alchemi.store.read.codecs import ArrayCodec
from dali_alchemi.store.read.decoder import BlockDecoder
from dali_alchemi.store.read.rows import RowReader
from tests.packed import assert_same_packed
from tests.processes import fd_is_open

_general_decode = BlockDecoder.decode_group
_general_spans = RowReader.read_spans


@pytest.fixture(scope="module")
def raw_sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 structures, core arrays raw and checksummed in shards of 4 chunks of 64 rows (read in place)."""
    config = WriteConfig(core=ArrayConfig(compressors=(), chunk_size=64, shard_size=256))
    path = tmp_path_factory.mktemp("contiguous") / "raw.zarr"
    return write_synthetic_store(path, 300, seed=7, min_atoms=10, max_atoms=40, config=config)


@pytest.fixture()
def general_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records each array the general path decodes or reads in place."""
    calls: list[str] = []

    def decode_group(self: BlockDecoder, jobs: list[object], *args: object) -> None:
        calls.extend(job.handle.name for job in jobs)  # type: ignore[attr-defined]
        _general_decode(self, jobs, *args)  # type: ignore[arg-type]

    def read_spans(self: RowReader, codec: object, *args: object) -> None:
        calls.append(codec.name)  # type: ignore[attr-defined]
        _general_spans(self, codec, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(BlockDecoder, "decode_group", decode_group)
    monkeypatch.setattr(RowReader, "read_spans", read_spans)
    return calls


def _general(path: Path, window: np.ndarray, cache_bytes: int) -> object:
    """``window`` read through the general path: requested backwards, then put back in order."""
    with AtomicDataZarrReader(path, cache_bytes=cache_bytes) as reader:
        return reader.read_packed(window[::-1]).take(np.arange(window.size)[::-1])


@pytest.mark.parametrize("store", ["sharded_store", "raw_sharded"])
@pytest.mark.parametrize("cache_bytes", [0, 16 << 10, 1 << 30])
def test_windows_in_store_order_equal_the_general_path_without_going_through_it(
    request: pytest.FixtureRequest, store: str, cache_bytes: int, general_calls: list[str]
) -> None:
    path = request.getfixturevalue(store)
    windows = [np.arange(0, 70), np.arange(70, 71), np.arange(71, 230), np.arange(230, 300), np.arange(5, 295)]
    with AtomicDataZarrReader(path, cache_bytes=cache_bytes) as reader:
        got = [reader.read_packed(window) for window in windows]
        stats = reader.stats()
    lean_calls = list(general_calls)
    for window, packed in zip(windows, got, strict=True):
        want = _general(path, window, cache_bytes)
        assert_same_packed(packed, want)
    assert lean_calls == []  # no array of a window in store order went the general way
    assert stats.files_mapped == 0
    if store == "raw_sharded" and cache_bytes < (1 << 30):
        assert stats.files_read > 0  # the raw arrays were read in place
    if cache_bytes == 0:
        assert stats.cache.entries == 0


def test_a_corrupt_byte_of_a_raw_chunk_outside_the_window_is_still_caught(raw_sharded: Path, tmp_path: Path) -> None:
    path = tmp_path / "store.zarr"
    shutil.copytree(raw_sharded, path)
    shard = path / "core" / "positions" / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(data[-(4 * 16 + 4) : -4]), dtype="<u8").reshape(4, 2)
    data[int(index[1, 0]) + 63 * 12] ^= 0xFF  # the last row of inner chunk 1 (atom 127)
    shard.write_bytes(bytes(data))
    with AtomicDataZarrReader(path, fields=["positions"], cache_bytes=0) as reader:
        ptr = reader.atoms_ptr
        first = int(np.searchsorted(ptr, 64, side="right"))  # the first structure starting in chunk 1
        stop = int(np.searchsorted(ptr, 110, side="right") - 1)  # structures ending before atom 110
        assert ptr[stop] < 127 and stop > first
        with pytest.raises(ChunkDecodeError, match=r"positions.*chunk 1 in 'core/positions/c/0/0'.*crc32c checksum"):
            reader.read_packed(np.arange(first, stop))
        assert reader.read_packed(np.arange(0, 3)).fields["positions"].shape[1] == 3  # chunk 0 still reads


def test_a_lost_raw_shard_read_in_store_order_is_named(raw_sharded: Path, tmp_path: Path) -> None:
    path = tmp_path / "store.zarr"
    shutil.copytree(raw_sharded, path)
    (path / "core" / "forces" / "c" / "1" / "0").unlink()
    with AtomicDataZarrReader(path, fields=["forces"], cache_bytes=0) as reader:
        with pytest.raises(ChunkDecodeError, match=r"forces.*'core/forces/c/1/0'.*missing, but the store promises"):
            reader.read_packed(np.arange(0, 300))


def test_a_sequential_pass_with_a_big_cache_still_keeps_small_arrays_whole(sharded_store: Path) -> None:
    with AtomicDataZarrReader(sharded_store, cache_bytes=1 << 30) as reader:
        for start in range(0, 300, 30):
            reader.read_packed(np.arange(start, start + 30))
        resident = [name for name in reader._snapshot.handles if reader._engine.decoder.resident(name) is not None]
        decoded = reader.stats().blocks_decoded
        reader.read_packed(np.arange(0, 300))
        assert reader.stats().blocks_decoded == decoded  # the second pass decodes nothing
    assert {"positions", "neighbor_list", "energy"} <= set(resident)


@pytest.fixture(scope="module")
def big_chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 structures whose core arrays are compressed in unsharded chunks of 2,048 rows (as nvalchemi
    writes them: a chunk a file, one block of every array bigger than a small cache)."""
    config = WriteConfig(core=ArrayConfig(chunk_size=2048))
    path = tmp_path_factory.mktemp("contiguous") / "big.zarr"
    return write_synthetic_store(path, 300, seed=5, min_atoms=10, max_atoms=40, config=config)


@pytest.fixture(scope="module")
def split_trailing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``big_chunks``'s store with every core array of trailing dims rechunked one column a chunk, zstd, as
    nvalchemi's automatic chunking stores them: a block is several chunks, so the general path reads it."""
    config = WriteConfig(core=ArrayConfig(chunk_size=2048))
    path = tmp_path_factory.mktemp("contiguous") / "split.zarr"
    write_synthetic_store(path, 300, seed=5, min_atoms=10, max_atoms=40, config=config)
    core = zarr.open_group(path / "core", mode="r+")
    for name in list(core.array_keys()):
        array = core[name]
        if array.ndim < 2:
            continue
        data, attrs = array[...], dict(array.attrs)
        names = json.loads((path / "core" / name / "zarr.json").read_text()).get("dimension_names")
        zarr.create_array(
            store=str(path / "core"), name=name, shape=array.shape, chunks=(array.chunks[0], *[1] * (array.ndim - 1)),
            dtype=array.dtype, compressors=zarr.codecs.ZstdCodec(level=1), fill_value=array.fill_value,
            attributes=attrs, dimension_names=names, overwrite=True, config={"write_empty_chunks": True},
        )[...] = data  # fmt: skip
    return path


@pytest.fixture(scope="module")
def implicit_chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``big_chunks``'s store with ``atom_categories`` never written (all fill, as nvalchemi leaves an array of
    zeros) and no promise of complete chunks: the lean reader leaves that array to the general path."""
    config = WriteConfig(core=ArrayConfig(chunk_size=2048))
    path = tmp_path_factory.mktemp("contiguous") / "implicit.zarr"
    write_synthetic_store(path, 300, seed=5, min_atoms=10, max_atoms=40, config=config)
    root = json.loads((path / "zarr.json").read_text())
    root["attributes"]["dali_alchemi"]["complete_chunks"] = False
    (path / "zarr.json").write_text(json.dumps(root))
    shutil.rmtree(path / "core" / "atom_categories" / "c")
    return path


@pytest.mark.parametrize(
    ("store", "cache_bytes"),
    [
        ("sharded_store", 0),
        ("sharded_store", 16 << 10),
        ("big_chunks", 0),
        ("split_trailing", 0),
        ("implicit_chunks", 0),
    ],
)
def test_a_pass_in_store_order_decodes_each_block_once_whatever_the_cache(
    request: pytest.FixtureRequest, store: str, cache_bytes: int
) -> None:
    """(At a cache of a few blocks, an array small enough to be kept whole is evicted by the blocks streaming
    through and read whole again: that is the cache's policy, not what this checks.)"""
    path = request.getfixturevalue(store)
    with AtomicDataZarrReader(path, cache_bytes=cache_bytes) as reader:
        got = [reader.read_packed(np.arange(start, min(start + 7, 300))) for start in range(0, 300, 7)]
        decoded, per_pass = reader.stats().blocks_decoded, reader.decoded_blocks_per_pass()
    assert per_pass > 0 and decoded == per_pass  # windows of 7 cut blocks: each cut one is handed on, not decoded again
    want = _general(path, np.arange(300), 0)
    for name, expected in want.fields.items():  # type: ignore[attr-defined]
        np.testing.assert_array_equal(np.concatenate([packed.fields[name] for packed in got]), expected, err_msg=name)


def test_a_block_handed_on_is_dropped_when_the_next_read_is_elsewhere(big_chunks: Path) -> None:
    with AtomicDataZarrReader(big_chunks, cache_bytes=0) as reader:
        reader.read_packed(np.arange(0, 20))
        first = reader.stats().blocks_decoded
        carried = dict(reader._engine.decoder.carried)
        assert carried and all(block == 0 for block, _ in carried.values())  # each array ends inside its block 0
        reader.read_packed(np.arange(280, 300))  # ends with the store: nothing handed on
        assert reader._engine.decoder.carried == {}
        reader.read_packed(np.arange(20, 40))
        assert reader.stats().blocks_decoded - first > 0  # block 0 decoded again: it was not kept


def _dense_windows() -> list[np.ndarray]:
    """Shuffled windows dense in a few stretches of a 300-structure store (as a block order's are)."""
    rng = np.random.default_rng(11)
    one = rng.permutation(np.arange(40, 160))[:90]
    two = rng.permutation(np.concatenate([np.arange(220, 290), np.arange(10, 60)]))[:80]
    ends = rng.permutation(np.concatenate([np.arange(288, 300), np.arange(0, 12), np.arange(145, 157)]))  # store's ends
    return [one, two, ends, rng.permutation(300)]


def _by_rows(path: Path, window: np.ndarray, cache_bytes: int) -> object:
    """``window`` read row by row: the general path, never as the runs covering it."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(spans, "MAX_OVER_READ", 0)
        with AtomicDataZarrReader(path, cache_bytes=cache_bytes) as reader:
            return reader.read_packed(window)


@pytest.mark.parametrize("store", ["sharded_store", "raw_sharded"])
@pytest.mark.parametrize("cache_bytes", [0, 16 << 10, 1 << 30])
def test_dense_shuffled_windows_read_as_covering_runs_equal_the_row_by_row_read(
    request: pytest.FixtureRequest, store: str, cache_bytes: int, general_calls: list[str]
) -> None:
    path = request.getfixturevalue(store)
    windows = _dense_windows()
    assert all(spans.covering_runs(np.sort(window)) is not None for window in windows)
    with AtomicDataZarrReader(path, cache_bytes=cache_bytes) as reader:
        got = [reader.read_packed(window) for window in windows + windows]  # cold, then what the cache kept
        stats = reader.stats()
        kept = [b for buffers in reader._engine._scratch._free for b in buffers.values()]
    lean_calls = list(general_calls)
    assert kept  # the covering runs were read into buffers kept from window to window
    for window, packed in zip(windows + windows, got, strict=True):  # checked after all were read: none overwritten
        assert not any(np.shares_memory(a, b) for a in packed.fields.values() for b in kept)
        want = _by_rows(path, window, cache_bytes)
        assert_same_packed(packed, want)
    assert lean_calls == []  # every array of every window went the lean way
    assert stats.files_mapped == 0


def test_covering_runs_decode_only_the_blocks_holding_the_windows_rows(
    sharded_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[tuple[str, int]] = []
    decode_block = ArrayCodec.decode_block

    def record(self: ArrayCodec, block: int, *args: object) -> object:
        decoded.append((self.name, block))
        return decode_block(self, block, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ArrayCodec, "decode_block", record)
    window = np.random.default_rng(2).permutation(np.r_[100:110, 130:142])  # read as the run 100..141, through 110..129
    assert spans.covering_runs(np.sort(window)) is not None
    with AtomicDataZarrReader(sharded_store, fields=["positions"], cache_bytes=0) as reader:  # by blocks, never whole
        packed = reader.read_packed(window)
        codec = reader._snapshot.handles["positions"].codec
        ptr = reader.atoms_ptr
    assert codec is not None
    rows = np.concatenate([np.arange(ptr[i], ptr[i + 1]) for i in window])
    wanted = set((rows // codec.block_rows).tolist())
    through = set(range(int(ptr[100]) // codec.block_rows, int(ptr[142] - 1) // codec.block_rows + 1))
    assert wanted < through  # the run reads through blocks that hold none of the window's rows
    assert sorted(block for name, block in decoded if name == "core/positions") == sorted(wanted)  # each once, no other
    assert packed.fields["positions"].shape == (rows.size, 3)


def test_a_corrupt_raw_chunk_in_a_covering_run_is_named(raw_sharded: Path, tmp_path: Path) -> None:
    path = tmp_path / "store.zarr"
    shutil.copytree(raw_sharded, path)
    shard = path / "core" / "positions" / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(data[-(4 * 16 + 4) : -4]), dtype="<u8").reshape(4, 2)
    data[int(index[1, 0]) + 5 * 12] ^= 0xFF  # a row of inner chunk 1
    shard.write_bytes(bytes(data))
    window = np.random.default_rng(3).permutation(np.arange(0, 60))[:45]
    assert spans.covering_runs(np.sort(window)) is not None
    with AtomicDataZarrReader(path, fields=["positions"], cache_bytes=0) as reader:
        with pytest.raises(ChunkDecodeError, match=r"positions.*chunk 1 in 'core/positions/c/0/0'.*crc32c checksum"):
            reader.read_packed(window)


def test_raw_files_stay_open_from_read_to_read_and_close_with_the_reader(
    raw_sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dali_alchemi.store.read import open_files

    opened: list[int] = []
    real_open = os.open

    def counting_open(path: object, flags: int, *args: object) -> int:
        fd = real_open(path, flags, *args)  # type: ignore[arg-type]
        if "/c/" in str(path):  # a chunk or shard (each read also reads the store's token)
            opened.append(fd)
        return fd

    monkeypatch.setattr(open_files.os, "open", counting_open)
    reader = AtomicDataZarrReader(raw_sharded, cache_bytes=0)
    first = reader.read_packed(np.arange(0, 60))
    n_first = len(opened)
    assert n_first > 0  # the raw arrays' shards
    again = reader.read_packed(np.arange(0, 60))
    assert len(opened) == n_first  # the same shards: nothing opened again
    for name, values in first.fields.items():
        np.testing.assert_array_equal(again.fields[name], values, err_msg=name)
    reader.close()
    assert not any(fd_is_open(fd) for fd in opened)


def test_compressed_shards_stay_open_from_read_to_read_in_store_order(
    sharded_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dali_alchemi.store.read import fetch, open_files

    opened: list[str] = []
    fetched: list[object] = []
    real_open, real_read = os.open, fetch.LocalFetcher.read

    def counting_open(path: object, flags: int, *args: object) -> int:
        if "/c/" in str(path):  # a chunk or shard (each read also reads the store's token)
            opened.append(str(path))
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    def counting_read(self: fetch.LocalFetcher, requests: list[fetch.ByteRequest], kept: object = None) -> list[object]:
        if kept is None:  # a read that opens and closes its files
            fetched.extend(requests)
        return real_read(self, requests, kept)  # type: ignore[arg-type, return-value]

    monkeypatch.setattr(open_files.os, "open", counting_open)  # (the one os module: every open counts)
    monkeypatch.setattr(fetch.LocalFetcher, "read", counting_read)
    with AtomicDataZarrReader(sharded_store, cache_bytes=0, num_threads=1) as reader:  # one set of kept files
        reader.read_packed(np.arange(0, 60))  # reads the shard indexes through the fetcher, once
        assert any("neighbor_list" in path for path in opened)
        assert all(request.suffix is not None for request in fetched)  # indexes only: chunks through kept files
        opened.clear()
        fetched.clear()
        second = reader.read_packed(np.arange(0, 60))  # the same shards: nothing opened or fetched again
        assert opened == [] and fetched == []
    assert_same_packed(second, _general(sharded_store, np.arange(0, 60), 0))


def test_a_compressed_shard_truncated_between_reads_in_store_order_is_named(
    sharded_store: Path, tmp_path: Path
) -> None:
    path = tmp_path / "store.zarr"
    shutil.copytree(sharded_store, path)
    shard = path / "core" / "neighbor_list" / "c" / "0" / "0"  # rows 0-255: structures 0-3
    with AtomicDataZarrReader(path, cache_bytes=0) as reader:
        reader.read_packed(np.arange(0, 1))  # the shard's index is read and kept, and the file stays open
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])
        with pytest.raises(ChunkDecodeError, match=r"core/neighbor_list") as caught:
            reader.read_packed(np.arange(1, 4))
    assert "core/neighbor_list/c/0/0" in str(caught.value)


def test_a_compressed_shard_removed_under_a_reader_is_read_as_it_was_or_named_missing(
    sharded_store: Path, tmp_path: Path
) -> None:
    path = tmp_path / "store.zarr"
    shutil.copytree(sharded_store, path)
    with AtomicDataZarrReader(path, cache_bytes=0) as reader:
        reader.read_packed(np.arange(0, 1))
        (path / "core" / "neighbor_list" / "c" / "0" / "0").unlink()
        try:  # a thread that holds the shard open reads it as it was; one that does not finds it missing
            got = reader.read_packed(np.arange(1, 4))
        except ChunkDecodeError as err:
            assert "core/neighbor_list/c/0/0" in str(err) and "is missing" in str(err)
        else:
            assert_same_packed(got, _general(sharded_store, np.arange(1, 4), 0))
