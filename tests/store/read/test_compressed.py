"""store/read/compressed.py: a window's rows as the raw LZ4 blocks of the chunks holding them."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec
from zarr.codecs.numcodecs import LZ4, Shuffle
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import MemoryStore

from dali_alchemi import AtomicDataZarrReader
from dali_alchemi.errors import ChunkDecodeError, ConfigError
from dali_alchemi.store.format.protocol import InflatedChunks
from dali_alchemi.store.read.codecs import ArrayCodec
from dali_alchemi.store.read.compressed import (
    CompressedRows,
    KeptBlocks,
    compressed_rows,
    inflate_reference,
    inflated_rows,
)
from dali_alchemi.store.read.fetch import StoreFetcher


def _inflatable(reader: AtomicDataZarrReader) -> tuple[str, ...]:
    return tuple(name for name, spec in reader.field_specs.items() if spec.inflate is not None)


@pytest.mark.parametrize(
    "indices",
    [np.random.default_rng(3).permutation(300)[:70], np.arange(40, 140), np.array([5, 5, 299, 0, 5]), np.array([17])],
    ids=["shuffled", "sequential", "repeated", "one"],
)
def test_inflated_rows_are_what_the_host_reads(inflate_store: Path, reader: AtomicDataZarrReader, indices: Any) -> None:
    with AtomicDataZarrReader(inflate_store) as r:
        names = _inflatable(r)
        assert set(names) >= {"atomic_numbers", "positions", "neighbor_list", "energy", "cell"}
        for n in names:
            spec = r.field_specs[n]
            assert spec.inflate == InflatedChunks(chunk_shape=(64, *spec.trailing), dtype=spec.dtype, shuffle=spec.dtype.itemsize)
        window = r.read_compressed(indices, fields=names)
        host = reader.read_packed(indices, fields=names)
        assert np.array_equal(window.atom_starts, reader.atoms_ptr[host.physical_indices])
        for name in names:
            part = window.parts[name]
            values = _rows(part)
            expected = host.fields[name]
            if name == "neighbor_list":  # stored store-global; the loader makes them sample-local on the GPU
                expected = expected + np.repeat(window.atom_starts, host.n_edges)[:, None]
            assert values.dtype == expected.dtype and np.array_equal(values, expected), name
            assert part.sizes.dtype == np.int32 and part.rows.dtype == np.int64
            assert int(part.sizes.sum()) == part.blocks.size


def test_each_chunk_a_window_touches_is_sent_once(inflate_store: Path) -> None:
    with AtomicDataZarrReader(inflate_store) as r:
        ptr = r.atoms_ptr
        window = r.read_compressed(np.arange(0, 300, 2), fields=("atomic_numbers", "energy"))
        atoms = np.concatenate([np.arange(ptr[i], ptr[i + 1]) for i in range(0, 300, 2)])
        assert window.parts["atomic_numbers"].sizes.size == np.unique(atoms // 64).size
        assert window.parts["energy"].sizes.size == 5  # structures 0..298 lie in chunks 0..4 of 64 rows


def _rows(part: CompressedRows) -> np.ndarray:
    """The wanted rows, with liblz4 standing in for nvCOMP."""
    return inflated_rows(inflate_reference(part), part.rows, part)


def _lz4() -> LZ4:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: numcodecs' codecs are outside the zarr v3 spec
        return LZ4()


def _shuffle() -> Shuffle:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Shuffle()


def _memory_array(values: np.ndarray, compressors: list[Any], chunks: int) -> tuple[ArrayCodec, MemoryStore, Any]:
    store = MemoryStore()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arr = zarr.open_group(store, mode="w").create_array(
            "x", shape=values.shape, dtype=values.dtype, chunks=(chunks, *values.shape[1:]), compressors=compressors,
            fill_value=-7,
        )  # fmt: skip
    return ArrayCodec(name="core/x", path=arr.store_path.path, metadata=arr.metadata), store, arr


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_chunk_never_written_inflates_to_the_fill_value(shuffled: bool) -> None:
    values = np.arange(36, dtype=np.int64).reshape(12, 3)
    codec, store, arr = _memory_array(values, [_shuffle(), _lz4()] if shuffled else [_lz4()], chunks=4)
    assert codec.inflatable and codec.byte_shuffle == (8 if shuffled else 0)
    arr[:4] = values[:4]  # chunks 1 and 2 are never written
    part = compressed_rows(codec, "atom", np.arange(12), StoreFetcher(store), {})
    got = _rows(part)
    assert np.array_equal(got[:4], values[:4]) and (got[4:] == -7).all()


def test_a_window_that_wants_no_row_still_sends_one_chunk() -> None:
    codec, store, arr = _memory_array(np.ones((8, 2), np.float32), [_lz4()], chunks=4)
    arr[:] = 1.0
    part = compressed_rows(codec, "edge", np.zeros(0, dtype=np.int64), StoreFetcher(store), {})
    assert part.sizes.size == 1 and part.rows.size == 0  # DALI refuses an empty input sample
    assert _rows(part).shape == (0, 2)


def test_a_chunk_whose_header_is_not_a_chunk_is_refused() -> None:
    values = np.arange(24, dtype=np.int32).reshape(8, 3)
    codec, store, arr = _memory_array(values, [_lz4()], chunks=4)
    arr[:] = values
    good = sync(store.get("x/c/1/0", prototype=default_buffer_prototype()))
    assert good is not None
    sync(store.set("x/c/1/0", default_buffer_prototype().buffer.from_bytes((5).to_bytes(4, "little") + good.to_bytes()[4:])))
    with pytest.raises(ChunkDecodeError, match=r"Array 'core/x': chunk 'x/c/1/0'.*lz4 header says 5 bytes, expected 48"):
        compressed_rows(codec, "atom", np.arange(8), StoreFetcher(store), {})


def test_only_lz4_blocks_of_whole_rows_can_be_inflated(reader: AtomicDataZarrReader) -> None:
    codec, store, arr = _memory_array(np.ones((8, 2), np.float32), [BloscCodec()], chunks=4)
    arr[:] = 1.0
    with pytest.raises(ConfigError, match=r"Array 'core/x' is stored as blosc-zstd.*layout='inflate'"):
        compressed_rows(codec, "atom", np.arange(8), StoreFetcher(store), {})
    assert all(spec.inflate is None for spec in reader.field_specs.values())  # the blosc store
    with pytest.raises(ConfigError, match=r"Array 'core/atomic_numbers' is stored as blosc-lz4"):
        reader.read_compressed([0, 1], fields=["atomic_numbers"])


def test_a_corrupt_chunk_fails_its_checksum(inflate_store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.zarr"
    shutil.copytree(inflate_store, copy)
    shard = copy / "core" / "atomic_numbers" / "c" / "0"
    data = bytearray(shard.read_bytes())
    data[20] ^= 0xFF  # inside the first inner chunk (the shard index is at the end)
    shard.write_bytes(bytes(data))
    with AtomicDataZarrReader(copy) as r:
        with pytest.raises(ChunkDecodeError, match=r"atomic_numbers.*crc32c checksum mismatch"):
            r.read_compressed([0, 1, 2], fields=["atomic_numbers"])


def test_a_missing_chunk_of_a_complete_store_is_an_error(inflate_store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.zarr"
    shutil.copytree(inflate_store, copy)
    (copy / "core" / "positions" / "c" / "0" / "0").unlink()  # the first shard: the first 256 atoms
    with AtomicDataZarrReader(copy) as r:
        with pytest.raises(ChunkDecodeError, match=r"positions.*is missing, but the store promises"):
            r.read_compressed([0], fields=["positions"])


class _CountingFetcher:
    def __init__(self, inner: StoreFetcher) -> None:
        self.inner, self.requests = inner, 0

    def fetch(self, requests: Any) -> list[Any]:
        self.requests += len(requests)
        return self.inner.fetch(requests)


def test_checked_blocks_are_kept_within_their_budget_and_not_read_again() -> None:
    values = np.arange(48, dtype=np.int64).reshape(16, 3)
    codec, store, arr = _memory_array(values, [_lz4()], chunks=4)
    arr[:] = values
    fetcher = _CountingFetcher(StoreFetcher(store))
    first = compressed_rows(codec, "atom", np.arange(16), fetcher, {}, KeptBlocks(budget=1 << 20))
    kept = KeptBlocks(budget=1 << 20)
    compressed_rows(codec, "atom", np.arange(8), fetcher, {}, kept)  # chunks 0 and 1 read and kept
    read = fetcher.requests
    again = compressed_rows(codec, "atom", np.arange(16), fetcher, {}, kept)
    assert fetcher.requests == read + 2  # only chunks 2 and 3 were read
    assert np.array_equal(again.blocks, first.blocks) and np.array_equal(_rows(again), values)
    assert kept.used == int(again.sizes.sum())
    small = KeptBlocks(budget=int(first.sizes[0]))  # room for one block only
    compressed_rows(codec, "atom", np.arange(16), fetcher, {}, small)
    assert small.used == int(first.sizes[0]) and small.get("core/x", 0) is not None and small.get("core/x", 1) is None
    small.clear()
    assert small.used == 0 and small.get("core/x", 0) is None


def test_only_checksummed_lz4_arrays_go_to_the_gpu(tmp_path: Path) -> None:
    from dali_alchemi.bench.synth import write_synthetic_store
    from dali_alchemi.config import INFLATE_CODECS, ArrayConfig, WriteConfig

    config = WriteConfig(core=ArrayConfig(compressors=INFLATE_CODECS, chunk_size=64, shard_size=256, checksum=False))
    path = write_synthetic_store(tmp_path / "unchecked.zarr", 40, seed=7, config=config)
    with AtomicDataZarrReader(path) as r:
        # DALI does not check nvCOMP's status per chunk: without a checksum the host could not vouch for a block
        assert all(spec.inflate is None for spec in r.field_specs.values())
        assert r.read_packed([0, 1]).n_atoms.size == 2  # the host still reads them
