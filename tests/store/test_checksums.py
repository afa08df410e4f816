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
