"""Rows of uncompressed arrays read in place: the same values as decoding, and every damage still caught."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import google_crc32c
import numpy as np
import pytest
import zarr

from dali_alchemi import AtomicDataZarrReader, ChunkDecodeError
from dali_alchemi.bench.synth import write_synthetic_store
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.store.read import row_io, spans
from dali_alchemi.store.read import rows as rows_module
from dali_alchemi.store.read.rows import IN_PLACE_SPAN_SIZE
from tests.packed import assert_same_packed

RAW = {  # besides the session's raw_store: 97-row chunks, checksummed
    "plain": WriteConfig(core=ArrayConfig(compressors=(), chunk_size=97, checksum=False)),
    "sharded-crc32c": WriteConfig(core=ArrayConfig(compressors=(), chunk_size=64, shard_size=256)),
    "sharded-plain": WriteConfig(core=ArrayConfig(compressors=(), chunk_size=64, shard_size=256, checksum=False)),
}


@pytest.fixture(scope="module")
def raw_stores(tmp_path_factory: pytest.TempPathFactory, raw_store: Path) -> dict[str, Path]:
    """The 300 structures of ``small_store``, uncompressed, in each layout of :data:`RAW` and ``raw_store``'s."""
    root = tmp_path_factory.mktemp("raw")
    stores = {
        name: write_synthetic_store(root / f"{name}.zarr", 300, seed=7, min_atoms=10, max_atoms=40, config=config)
        for name, config in RAW.items()
    }
    return {"crc32c": raw_store, **stores}


@pytest.fixture()
def raw_copy(raw_stores: dict[str, Path], tmp_path: Path) -> Path:
    path = tmp_path / "raw.zarr"
    shutil.copytree(raw_stores["crc32c"], path)
    return path


@pytest.mark.parametrize("layout", ["crc32c", *sorted(RAW)])
@pytest.mark.parametrize("order", ["shuffled", "sequential", "duplicates"])
def test_in_place_rows_equal_the_decoded_ones(
    raw_stores: dict[str, Path], reader: AtomicDataZarrReader, layout: str, order: str
) -> None:
    rng = np.random.default_rng(5)
    indices = {
        "shuffled": rng.permutation(300)[:180],
        "sequential": np.arange(40, 260),
        "duplicates": np.array([7, 299, 7, 0, -1, 150, 151, 150]),
    }[order]
    with AtomicDataZarrReader(raw_stores[layout], cache_bytes=0) as raw:
        assert_same_packed(raw.read_packed(indices), reader.read_packed(indices))
        stats = raw.stats()
    assert stats.chunks_fetched == 0 and stats.blocks_decoded == 0  # core arrays: nothing decoded
    assert stats.files_read > 0


@pytest.fixture()
def row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shuffled windows read row by row, never as the runs covering them (what these tests are about)."""
    monkeypatch.setattr(spans, "MAX_OVER_READ", 0)


@pytest.mark.usefixtures("row_by_row")
def test_scattered_rows_are_mapped_and_clustered_rows_are_read(
    raw_stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(row_io, "MAX_GAP_BYTES", 0)  # only adjacent rows cluster
    monkeypatch.setattr(row_io, "MAX_RUNS", 2)
    with AtomicDataZarrReader(raw_stores["plain"], cache_bytes=0) as raw:
        raw.read_packed(np.arange(0, 100))  # one run per file
        assert raw.stats().files_mapped == 0 and raw.stats().files_read > 0
        raw.read_packed(np.arange(0, 300, 2))  # every other structure: runs apart in each file
        assert raw.stats().files_mapped > 0


@pytest.mark.usefixtures("row_by_row")
def test_both_ways_of_reading_a_file_agree(raw_stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    indices = np.random.default_rng(2).permutation(300)[:120]
    results = []
    for max_runs in (0, 10_000):  # every file mapped; every file read by clusters
        monkeypatch.setattr(row_io, "MAX_RUNS", max_runs)
        for layout in ("crc32c", "sharded-plain"):
            with AtomicDataZarrReader(raw_stores[layout], cache_bytes=0) as raw:
                raw.read_packed(np.arange(300))  # verify every checksum first: then the cluster path may run
                results.append(raw.read_packed(indices))
                mapped = raw.stats().files_mapped
            if layout == "sharded-plain":  # nothing to verify: the setting alone picks the way
                assert (mapped > 0) == (max_runs == 0)
    for other in results[1:]:
        assert_same_packed(other, results[0])


def test_spans_of_a_store_read_in_place_do_not_follow_chunks(raw_stores: dict[str, Path], small_store: Path) -> None:
    with AtomicDataZarrReader(raw_stores["crc32c"], cache_bytes=0) as raw, AtomicDataZarrReader(small_store) as decoded:
        spans = raw.sample_chunk_bounds()
        np.testing.assert_array_equal(spans, np.append(np.arange(0, 300, IN_PLACE_SPAN_SIZE), 300))
        assert not np.array_equal(decoded.sample_chunk_bounds(), spans)


def test_a_store_that_fits_half_the_cache_is_kept_decoded_instead(
    raw_stores: dict[str, Path], small_store: Path
) -> None:
    raw_bytes = sum(
        zarr.open_array(raw_stores["crc32c"] / "core" / name, mode="r").nbytes
        for name in zarr.open_group(raw_stores["crc32c"] / "core", mode="r").array_keys()
    )
    indices = np.random.default_rng(4).permutation(300)
    with AtomicDataZarrReader(raw_stores["crc32c"], cache_bytes=2 * raw_bytes + 1) as cached:
        first = cached.read_packed(indices)
        second = cached.read_packed(indices)
        stats = cached.stats()
        spans = cached.sample_chunk_bounds()
    assert stats.files_read == 0 and stats.blocks_decoded > 0 and stats.cache.hits > 0  # through the cache
    with AtomicDataZarrReader(small_store) as decoded:
        np.testing.assert_array_equal(spans, decoded.sample_chunk_bounds())  # spans follow chunks again
        assert_same_packed(first, decoded.read_packed(indices))
    assert_same_packed(second, first)
    with AtomicDataZarrReader(raw_stores["crc32c"], cache_bytes=2 * raw_bytes - 1024) as in_place:
        in_place.read_packed(indices)
        assert in_place.stats().files_read > 0 and in_place.stats().chunks_fetched == 0


def test_each_chunk_checksum_is_verified_once_per_reader(raw_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hashed: list[int] = []
    real = google_crc32c.value

    def counting(data: object) -> int:
        hashed.append(len(memoryview(data).cast("B")))  # type: ignore[arg-type]
        return real(data)  # type: ignore[no-any-return]

    monkeypatch.setattr(rows_module, "google_crc32c", SimpleNamespace(value=counting))  # this module's hashes only
    with AtomicDataZarrReader(raw_copy, fields=["positions"], cache_bytes=0) as raw:
        raw.read_packed(np.arange(300))
        first = len(hashed)
        raw.read_packed(np.random.default_rng(3).permutation(300))
    n_chunks = len(list((raw_copy / "core" / "positions" / "c").iterdir()))
    assert first == n_chunks and len(hashed) == n_chunks  # the second epoch hashed nothing
    assert set(hashed) == {97 * 12}  # whole chunks, without their checksum


def test_a_flipped_byte_fails_the_checksum(raw_copy: Path) -> None:
    chunk = raw_copy / "core" / "positions" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[20] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with AtomicDataZarrReader(raw_copy, cache_bytes=0) as raw:
        raw.read_packed(np.arange(0, 2))  # chunk 0 is intact
        with pytest.raises(ChunkDecodeError, match=r"positions.*chunk 1.*crc32c checksum mismatch") as info:
            raw.read_packed(np.arange(300))
    assert info.value.array == "core/positions" and info.value.chunk == "core/positions/c/1/0"


def test_a_truncated_chunk_is_an_error_naming_it(raw_copy: Path) -> None:
    chunk = raw_copy / "core" / "forces" / "c" / "2" / "0"
    chunk.write_bytes(chunk.read_bytes()[:100])
    with AtomicDataZarrReader(raw_copy, cache_bytes=0) as raw:
        with pytest.raises(
            ChunkDecodeError, match=r"forces.*chunk 2 in 'core/forces/c/2/0' holds 100 bytes, expected 1168"
        ):
            raw.read_packed(np.arange(300))


def test_a_truncated_inner_chunk_is_an_error(raw_stores: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "sharded.zarr"
    shutil.copytree(raw_stores["sharded-plain"], path)
    shard = path / "core" / "positions" / "c" / "0" / "0"
    shard.write_bytes(shard.read_bytes()[: 64 * 12 + 10])  # the index at the end is gone with the rest
    with AtomicDataZarrReader(path, cache_bytes=0) as raw, pytest.raises(ChunkDecodeError, match="positions"):
        raw.read_packed(np.arange(300))


def test_a_missing_chunk_is_an_error_where_every_chunk_was_promised(raw_copy: Path) -> None:
    (raw_copy / "core" / "positions" / "c" / "0" / "0").unlink()
    with AtomicDataZarrReader(raw_copy, cache_bytes=0) as raw:
        with pytest.raises(ChunkDecodeError, match=r"positions.*chunk 0 .* is missing, but the store promises"):
            raw.read_packed(np.arange(3))


def test_a_missing_chunk_reads_as_the_fill_value_in_a_store_written_elsewhere(raw_copy: Path) -> None:
    root = zarr.open_group(raw_copy, mode="r+")
    del root.attrs["dali_alchemi"]
    (raw_copy / "core" / "positions" / "c" / "1" / "0").unlink()
    with AtomicDataZarrReader(raw_copy, cache_bytes=0) as raw:
        packed = raw.read_packed(np.arange(300))
        ptr = np.concatenate([[0], np.cumsum(packed.n_atoms)])
    positions = packed.fields["positions"]
    np.testing.assert_array_equal(positions[97:194], 0.0)  # the lost chunk's rows
    assert np.abs(positions[:97]).sum() > 0 and np.abs(positions[194:]).sum() > 0
    assert ptr[-1] == positions.shape[0]


def _rewrite_shard(shard: Path, n_inner: int, order: list[int], *, index_edit: dict[int, int] | None = None) -> None:
    """Store shard ``shard``'s inner chunks in file order ``order`` (the format allows any), re-indexed."""
    data = shard.read_bytes()
    index = np.frombuffer(data[-(16 * n_inner + 4) : -4], dtype="<u8").reshape(n_inner, 2)
    chunks = [data[o : o + n] for o, n in index.tolist()]
    body, new = b"", np.zeros((n_inner, 2), dtype="<u8")
    for k in order:
        new[k] = (len(body), len(chunks[k]))
        body += chunks[k]
    for k, offset in (index_edit or {}).items():
        new[k, 0] = offset
    raw = new.tobytes()
    shard.write_bytes(body + raw + np.uint32(google_crc32c.value(raw)).tobytes())


@pytest.mark.parametrize("layout", ["sharded-plain", "sharded-crc32c"])
def test_inner_chunks_stored_out_of_order_read_right_every_time(
    raw_stores: dict[str, Path], reader: AtomicDataZarrReader, tmp_path: Path, layout: str
) -> None:
    path = tmp_path / "permuted.zarr"
    shutil.copytree(raw_stores[layout], path)
    _rewrite_shard(path / "core" / "positions" / "c" / "0" / "0", 4, [1, 0, 3, 2])
    indices = np.arange(0, 12)
    want = reader.read_packed(indices).fields["positions"]
    with AtomicDataZarrReader(path, cache_bytes=0) as raw:
        for _ in range(2):  # the second read finds the chunks verified and may read them by clusters
            np.testing.assert_array_equal(raw.read_packed(indices).fields["positions"], want)


def test_a_shard_index_pointing_past_any_file_is_an_error(raw_stores: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "index.zarr"
    shutil.copytree(raw_stores["sharded-plain"], path)
    _rewrite_shard(path / "core" / "positions" / "c" / "0" / "0", 4, [0, 1, 2, 3], index_edit={1: 2**64 - 2**40})
    for cache in (0, 1 << 30):  # read in place, and decoded
        with AtomicDataZarrReader(path, cache_bytes=cache) as raw:
            with pytest.raises(
                ChunkDecodeError, match=r"shard index of 'core/positions/c/0/0' is corrupt: inner chunk 1"
            ):
                raw.read_packed(np.arange(12))


def test_a_chunk_file_with_bytes_added_is_an_error(raw_copy: Path) -> None:
    chunk = raw_copy / "core" / "positions" / "c" / "1" / "0"
    chunk.write_bytes(chunk.read_bytes() + bytes(8))
    with AtomicDataZarrReader(raw_copy, cache_bytes=0) as raw:
        with pytest.raises(
            ChunkDecodeError, match=r"chunk 1 in 'core/positions/c/1/0' holds 1176 bytes, expected 1168"
        ):
            raw.read_packed(np.arange(300))


def test_a_directory_in_place_of_a_chunk_is_an_error(raw_copy: Path) -> None:
    chunk = raw_copy / "core" / "positions" / "c" / "1" / "0"
    chunk.unlink()
    chunk.mkdir()
    with AtomicDataZarrReader(raw_copy, cache_bytes=0) as raw:
        with pytest.raises(ChunkDecodeError, match=r"'core/positions/c/1/0' is not a regular file"):
            raw.read_packed(np.arange(300))


def test_a_shuffled_read_checks_each_inner_chunk_by_reading_it_and_names_a_corrupt_one(
    raw_stores: dict[str, Path], tmp_path: Path
) -> None:
    path = tmp_path / "sharded.zarr"
    shutil.copytree(raw_stores["sharded-crc32c"], path)
    shard = path / "core" / "positions" / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(data[-(4 * 16 + 4) : -4]), dtype="<u8").reshape(4, 2)  # 4 inner chunks of 64 rows
    data[int(index[1, 0]) + 20] ^= 0xFF  # a byte of inner chunk 1 (atoms 64-127)
    shard.write_bytes(bytes(data))
    with AtomicDataZarrReader(path, fields=["positions"], cache_bytes=0) as raw:
        ptr = raw.atoms_ptr
        in_chunk_0 = int(np.searchsorted(ptr, 10, side="right") - 1)
        in_chunk_1 = int(np.searchsorted(ptr, 100, side="right") - 1)
        far = [290, 150, 220]  # other shards, scattered: rows are taken one by one, not as spans
        packed = raw.read_packed(np.array([*far, in_chunk_0]))
        assert raw.stats().files_mapped == 0  # unchecked chunks are read with a request each, never mapped
        start = int(ptr[in_chunk_0])
        want = zarr.open_group(str(path), mode="r")["core/positions"][start : int(ptr[in_chunk_0 + 1])]
        np.testing.assert_array_equal(packed.fields["positions"][-want.shape[0] :], want)
        with pytest.raises(ChunkDecodeError, match=r"positions.*chunk 1 in 'core/positions/c/0/0'.*crc32c checksum"):
            raw.read_packed(np.array([*far, in_chunk_1]))


def test_a_shuffled_read_announces_the_chunks_it_will_check_and_only_those(
    raw_stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    announced: list[tuple[str, list[int], int]] = []

    def record(path: str, offsets: np.ndarray, nbytes: int) -> None:
        announced.append((Path(path).relative_to(raw_stores["sharded-crc32c"]).as_posix(), offsets.tolist(), nbytes))

    monkeypatch.setattr(rows_module, "advise_will_need", record)
    with AtomicDataZarrReader(raw_stores["sharded-crc32c"], fields=["positions"], cache_bytes=0) as raw:
        first = raw.read_packed(np.array([290, 3, 150, 220]))
        by_file = {key: (offsets, nbytes) for key, offsets, nbytes in announced}
        assert set(by_file) <= {f"core/positions/c/{s}/0" for s in range(40)} and len(by_file) >= 3
        assert {nbytes for _, nbytes in by_file.values()} == {64 * 12 + 4}  # a whole chunk and its checksum
        assert sum(len(offsets) for offsets, _ in by_file.values()) == raw._engine._verified["core/positions"].sum()
        announced.clear()
        again = raw.read_packed(np.array([290, 3, 150, 220]))
        assert announced == []  # chunks checked before are not announced again
    np.testing.assert_array_equal(first.fields["positions"], again.fields["positions"])
    row_io.advise_will_need(str(tmp_path / "absent"), np.array([0]), 10)  # a hint: nothing to open is no error


@pytest.mark.parametrize("seed", range(6))
def test_side_by_side_runs_say_which_chunk_ranges_one_read_can_take(seed: int) -> None:
    stored, n = 10, 12
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(n) < 0.15, 7, stored)  # a few of another length
    offsets = np.cumsum(lengths) - lengths
    offsets[rng.random(n) < 0.15] += 3  # a few not right after the one before
    index = np.stack([offsets, lengths], axis=1).astype(np.uint64)
    index[rng.random(n) < 0.1] = np.iinfo(np.uint64).max  # a few never written
    starts, ends = row_io.side_by_side_runs(index, stored)
    assert starts == index[:, 0].astype(np.int64).tolist()
    entries = index.astype(np.int64)
    for c0 in range(n):
        for c1 in range(c0 + 1, n + 1):
            plain = bool((entries[c0:c1, 1] == stored).all() and (np.diff(entries[c0:c1, 0]) == stored).all())
            assert (ends[c0] >= c1) == plain, (c0, c1)
