"""Missing and corrupted chunks: stores written here checksum and write every chunk, and say so.

Each damage a disk, a copy or a person can do (a chunk file deleted, a mask chunk lost, an array
directory or its zarr.json removed, bytes flipped) must fail loudly, never read as zeros.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, ChunkDecodeError, ConfigError, StoreFormatError
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.store.format.layout import Integrity, parse_integrity
from tests.store.conftest import CONFIG, N


def _promise(attrs: Any) -> dict[str, Any]:
    """The chunk promise in the root attributes (the writer's generation counter shares the entry)."""
    state = attrs["dali_alchemi"]
    return {k: state[k] for k in ("complete_chunks", "checksums")}


def _read_all(path: Path) -> None:
    with AtomicDataZarrReader(path, cache_bytes=0) as reader:
        reader.read_packed(np.arange(len(reader)))


def _flip(chunk: Path, n: int = 64, at: int = 20) -> None:
    raw = bytearray(chunk.read_bytes())
    assert len(raw) > at + n, f"{chunk} is too small to flip {n} bytes"
    for i in range(at, at + n):
        raw[i] ^= 0xFF
    chunk.write_bytes(bytes(raw))


def _codecs(path: Path, array: str) -> list[str]:
    doc = json.loads((path / array / "zarr.json").read_text())
    codecs = doc["codecs"]
    if codecs[0]["name"] == "sharding_indexed":
        codecs = codecs[0]["configuration"]["codecs"]
    return [c["name"] for c in codecs]


def test_the_store_records_its_promise_and_checksums_every_array(store: Path) -> None:
    root = zarr.open_group(store, mode="r")
    attrs = root.attrs.asdict()
    assert _promise(attrs) == {"complete_chunks": True, "checksums": "crc32c"}
    assert set(attrs) == {"num_samples", "fields", "dali_alchemi"}  # nvalchemi's attributes as they were
    for group in ("meta", "core"):
        for name in root[group].array_keys():
            assert _codecs(store, f"{group}/{name}")[-1] == "crc32c", f"{group}/{name}"


def test_a_deleted_data_chunk_is_an_error_not_zeros(store: Path) -> None:
    (store / "core" / "positions" / "c" / "0" / "0").unlink()
    with AtomicDataZarrReader(store) as reader:
        with pytest.raises(ChunkDecodeError, match=r"'core/positions'.*'core/positions/c/0/0' is missing") as err:
            reader.read(0)
        assert (err.value.array, err.value.chunk) == ("core/positions", "core/positions/c/0/0")
        assert reader.read(N - 1)[0]["positions"].shape[1] == 3  # other chunks still read


def test_a_deleted_samples_mask_chunk_fails_at_open(store: Path) -> None:
    (store / "meta" / "samples_mask" / "c" / "0").unlink()
    with pytest.raises(ChunkDecodeError, match=r"'meta/samples_mask/c/0' is missing"):
        AtomicDataZarrReader(store)


@pytest.mark.parametrize("damage", ["directory", "zarr.json"])
def test_a_field_listed_but_absent_fails_at_open(store: Path, damage: str) -> None:
    if damage == "directory":
        shutil.rmtree(store / "core" / "forces")
        field = "forces"
    else:
        (store / "core" / "positions" / "zarr.json").unlink()
        field = "positions"
    with pytest.raises(StoreFormatError, match=rf"field '{field}' is listed .* array core/{field} is missing"):
        AtomicDataZarrReader(store)


@pytest.mark.parametrize("reader_path", ["fast", "zarr"])
def test_flipped_bytes_fail_the_checksum(store: Path, reader_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _flip(store / "core" / "forces" / "c" / "1" / "0")
    if reader_path == "zarr":  # arrays the fast decoder cannot take are read through zarr, which checks too
        from dali_alchemi.errors import UnsupportedCodecError
        from dali_alchemi.store.read import snapshot

        class _Refuse:
            def __init__(self, **_: object) -> None:
                raise UnsupportedCodecError("forced for the test")

        monkeypatch.setattr(snapshot, "ArrayCodec", _Refuse)
    with AtomicDataZarrReader(store, cache_bytes=0) as reader:
        with pytest.raises((ChunkDecodeError, ValueError), match="checksum"):
            reader.read_packed(np.arange(len(reader)), fields=["forces"])
        reader.read_packed(np.arange(len(reader)), fields=["positions"])  # undamaged arrays still read


def test_sharded_stores_checksum_their_inner_chunks(tmp_path: Path) -> None:
    path = tmp_path / "sharded.zarr"
    config = WriteConfig(core=ArrayConfig(chunk_size=64, shard_size=256))
    AtomicDataZarrWriter(path, config).write(synthetic_samples(N, seed=4))
    doc = json.loads((path / "core" / "forces" / "zarr.json").read_text())["codecs"][0]["configuration"]
    assert [c["name"] for c in doc["codecs"]][-1] == "crc32c"
    assert [c["name"] for c in doc["index_codecs"]] == ["bytes", "crc32c"]
    _flip(path / "core" / "forces" / "c" / "0" / "0", at=100)  # inside the first inner chunk
    with AtomicDataZarrReader(path, cache_bytes=0) as reader, pytest.raises(ChunkDecodeError, match="checksum"):
        reader.read_packed(np.arange(len(reader)), fields=["forces"])
    (path / "core" / "positions" / "c" / "0" / "0").unlink()  # a whole shard
    with AtomicDataZarrReader(path, cache_bytes=0) as reader, pytest.raises(ChunkDecodeError, match="is missing"):
        reader.read_packed([0], fields=["positions"])


def test_all_zero_chunks_are_written_and_stay_written(tmp_path: Path) -> None:
    path = tmp_path / "zeros.zarr"
    samples = synthetic_samples(N, seed=4)
    samples.fields["forces"][:] = 0.0  # every forces chunk holds only the fill value
    writer = AtomicDataZarrWriter(path, CONFIG)
    writer.write(samples)
    n_chunks = -(-int(samples.atoms_ptr[-1]) // 64)
    assert len(list((path / "core" / "forces" / "c").iterdir())) == n_chunks
    writer.add_custom("zeros", np.zeros(N, np.float32), "system")
    assert (path / "custom" / "zeros" / "c" / "0").is_file()
    assert _codecs(path, "custom/zeros")[-1] == "crc32c"
    writer.append(_with_zeros(synthetic_samples(8, seed=5)))
    writer.delete(np.arange(0, 16))  # zeroes every row of the first samples and their mask chunk
    assert (path / "meta" / "samples_mask" / "c" / "0").is_file()  # all False now, still written
    first_atoms = -(-int(samples.atoms_ptr[16]) // 64)
    for k in range(first_atoms):
        assert (path / "core" / "positions" / "c" / str(k) / "0").is_file()
    with AtomicDataZarrReader(path) as reader:
        assert len(reader) == N + 8 - 16
        reader.read_packed(np.arange(len(reader)))
    writer.defragment()
    assert _promise(zarr.open_group(path, mode="r").attrs) == {"complete_chunks": True, "checksums": "crc32c"}
    assert _codecs(path, "custom/zeros")[-1] == "crc32c"
    assert len(list((path / "core" / "forces" / "c").iterdir())) >= 1
    _read_all(path)


def _with_zeros(samples: object) -> list[dict[str, np.ndarray]]:
    parts = samples.split()  # type: ignore[attr-defined]
    for part in parts:
        part["zeros"] = np.zeros((1,), np.float32)
    return parts


def test_checksum_off_is_recorded_and_nothing_is_verified(tmp_path: Path) -> None:
    path = tmp_path / "plain.zarr"
    AtomicDataZarrWriter(path, WriteConfig(core=ArrayConfig(checksum=False))).write(synthetic_samples(N, seed=4))
    root = zarr.open_group(path, mode="r")
    assert _promise(root.attrs) == {"complete_chunks": True, "checksums": None}
    assert "crc32c" not in _codecs(path, "core/forces")
    assert _codecs(path, "meta/atoms_ptr")[-1] == "crc32c"  # meta keeps its own default
    writer = AtomicDataZarrWriter(path)
    writer.add_custom("tag", np.arange(N, dtype=np.int32), "system")  # checksummed, but the store's promise stays
    assert zarr.open_group(path, mode="r").attrs["dali_alchemi"]["checksums"] is None


def test_an_unchecksummed_custom_array_withdraws_the_checksum_promise(store: Path) -> None:
    AtomicDataZarrWriter(store, WriteConfig(custom=ArrayConfig(checksum=False))).add_custom(
        "tag", np.arange(N, dtype=np.int32), "system"
    )
    assert _promise(zarr.open_group(store, mode="r").attrs) == {"complete_chunks": True, "checksums": None}


def test_a_store_written_elsewhere_promises_nothing(store: Path) -> None:
    root = zarr.open_group(store, mode="r+")
    del root.attrs["dali_alchemi"]
    (store / "core" / "positions" / "c" / "0" / "0").unlink()
    with AtomicDataZarrReader(store) as reader:  # as nvalchemi writes: an absent chunk is the fill value
        assert np.all(reader.read(0)[0]["positions"].numpy() == 0.0)


def test_array_config_checksum_round_trips_and_crc32c_is_no_compressor() -> None:
    config = ArrayConfig(checksum=False, chunk_size=8)
    assert ArrayConfig.from_dict(config.to_dict()).to_dict() == config.to_dict()
    assert config.to_dict()["checksum"] is False and ArrayConfig().to_dict()["checksum"] is True
    assert [type(c).__name__ for c in ArrayConfig().codecs] == ["BloscCodec", "Crc32cCodec"]
    with pytest.raises(ConfigError, match="use checksum=True"):
        ArrayConfig.from_dict({"compressors": [{"name": "crc32c"}]})
    with pytest.raises(ConfigError, match="checksum must be True or False"):
        ArrayConfig(checksum="yes")  # type: ignore[arg-type]


def test_the_integrity_attribute_is_parsed_strictly() -> None:
    assert parse_integrity({}, store="s") == Integrity()
    assert parse_integrity({"dali_alchemi": {"complete_chunks": True, "checksums": "crc32c"}}, store="s") == Integrity(
        complete_chunks=True, checksums="crc32c"
    )
    for bad in ({"complete_chunks": "yes"}, {"checksums": "md5"}, [1]):
        with pytest.raises(StoreFormatError, match="root attribute 'dali_alchemi'"):
            parse_integrity({"dali_alchemi": bad}, store="s")


def _swap(a: Path, b: Path) -> None:
    first, second = a.read_bytes(), b.read_bytes()
    a.write_bytes(second)
    b.write_bytes(first)


@pytest.mark.parametrize("sharded", [False, True])
def test_swapped_chunks_of_one_array_read_as_each_other_as_documented(tmp_path: Path, sharded: bool) -> None:
    """A checksum covers a chunk's bytes, not its place: two whole chunks (or shards) of an array swapped
    read back swapped (docs/guarantees.md, "Data on disk"). Where pointers or neighbor lists then disagree,
    reads and ``verify`` catch it (the next test)."""
    from dali_alchemi.store.check.verify import verify_store

    path = tmp_path / "s.zarr"
    config = WriteConfig(core=ArrayConfig(chunk_size=64, shard_size=128 if sharded else None))
    AtomicDataZarrWriter(path, config).write(synthetic_samples(N, seed=4))
    rows = 128 if sharded else 64
    with AtomicDataZarrReader(path) as reader:
        before = reader.read_packed(np.arange(N)).fields["positions"]
    chunks = path / "core" / "positions" / "c"
    _swap(chunks / "0" / "0", chunks / "1" / "0")  # two chunks, or two shards of two chunks each
    with AtomicDataZarrReader(path) as reader:
        after = reader.read_packed(np.arange(N)).fields["positions"]
    assert np.array_equal(after[:rows], before[rows : 2 * rows])
    assert np.array_equal(after[rows : 2 * rows], before[:rows])
    assert np.array_equal(after[2 * rows :], before[2 * rows :])
    assert verify_store(str(path)).ok  # positions have nothing to be checked against


def test_swapped_neighbor_list_chunks_are_caught_where_indices_leave_their_structure(store: Path) -> None:
    from dali_alchemi.store.check.verify import verify_store

    chunks = store / "core" / "neighbor_list" / "c"
    _swap(chunks / "0" / "0", chunks / "1" / "0")
    with AtomicDataZarrReader(store) as reader:
        with pytest.raises(StoreFormatError, match=r"neighbor_list of sample 0 .*outside its atom rows"):
            reader.read_packed(np.arange(N))
    report = verify_store(str(store))
    assert not report.ok
    assert {p.chunk for p in report.problems} >= {"core/neighbor_list/c/0/0", "core/neighbor_list/c/1/0"}


def test_flipped_neighbor_list_bytes_fail_the_checksum_naming_the_chunk(store: Path) -> None:
    _flip(store / "core" / "neighbor_list" / "c" / "1" / "0", n=8)
    with AtomicDataZarrReader(store, cache_bytes=0) as reader:
        with pytest.raises(ChunkDecodeError, match="crc32c checksum mismatch") as info:
            reader.read_packed(np.arange(N))
    assert (info.value.array, info.value.chunk) == ("core/neighbor_list", "core/neighbor_list/c/1/0")


def _bad_index(path: Path, sample: int, offset: int) -> None:
    """Rewrite ``neighbor_list`` with one index of ``sample`` moved by ``offset``, through the array's own codecs
    (what a flip that still decodes does to a store without checksums)."""
    root = zarr.open_group(path, mode="r+")
    edges_ptr = root["meta/edges_ptr"][:]
    values = root["core/neighbor_list"][:]
    values[edges_ptr[sample], 0] += offset
    root["core/neighbor_list"][:] = values


@pytest.mark.parametrize(("sample", "offset"), [(0, 25), (3, -60), (3, 1 << 40)])
def test_an_index_flipped_outside_its_structure_in_an_unchecksummed_store_is_refused(
    nv_fixture: Path, tmp_path: Path, sample: int, offset: int
) -> None:
    """nvalchemi 0.2.0's stores carry no checksums: a changed index must never reach another structure's atoms."""
    path = tmp_path / "nv.zarr"
    shutil.copytree(nv_fixture / "nv_basic.zarr", path)
    _bad_index(path, sample, offset)
    with AtomicDataZarrReader(path) as reader:
        for _ in range(3):  # block reads, then the array read whole
            with pytest.raises(StoreFormatError, match=f"neighbor_list of sample {sample} .*outside its atom rows"):
                reader.read_packed(np.arange(len(reader)))
        with pytest.raises(StoreFormatError, match=f"neighbor_list of sample {sample} ") as info:
            reader.read(sample)
        assert f"its chunk was damaged instead: `dali-alchemi verify {path}` checks every chunk" in str(info.value)
        reader.read(sample + 1)  # the other structures still read


@pytest.mark.parametrize("cache_bytes", [0, 1 << 24])
def test_a_flipped_byte_of_a_raw_unchecksummed_neighbor_list_is_refused(tmp_path: Path, cache_bytes: int) -> None:
    path = tmp_path / "raw.zarr"
    config = WriteConfig(core=ArrayConfig(chunk_size=64, compressors=(), checksum=False))
    AtomicDataZarrWriter(path, config).write(synthetic_samples(N, seed=4))
    chunk = path / "core" / "neighbor_list" / "c" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[8 * 2 * 5 + 6] ^= 0x01  # a high byte of row 5's first index: 2**48 atoms further
    chunk.write_bytes(bytes(raw))
    with AtomicDataZarrReader(path, cache_bytes=cache_bytes) as reader:
        with pytest.raises(StoreFormatError, match=r"neighbor_list of sample 0 \(physical 0\) holds \[28147497671"):
            reader.read_packed(np.arange(N))
