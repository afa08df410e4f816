"""The layout's limit: every chunk counted once, its bytes and codec named, remote stores refused."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import zarr

from dali_alchemi import AtomicDataZarrReader, ConfigError
from dali_alchemi.bench.http_server import StoreServer
from dali_alchemi.bench.limit import measure_layout_limit
from dali_alchemi.bench.runner import measure_limit
from dali_alchemi.bench.synth import synthetic_config, write_synthetic_store


def _stored_chunks(path: Path, name: str) -> tuple[int, int]:
    """Written inner chunks of array ``name`` and their stored bytes: chunk files, or their shards' indexes."""
    arr = zarr.open_array(path / name, mode="r")
    chunks = nbytes = 0
    for shard in (path / name / "c").rglob("*"):
        if not shard.is_file():
            continue
        data = shard.read_bytes()
        if arr.shards is None:  # one chunk per file
            chunks, nbytes = chunks + 1, nbytes + len(data)
            continue
        n_inner = math.prod(s // c for s, c in zip(arr.shards, arr.chunks, strict=True))
        index = np.frombuffer(data[-(16 * n_inner + 4) : -4], dtype="<u8").reshape(n_inner, 2)
        written = index[:, 0] != np.uint64(2**64 - 1)
        chunks += int(written.sum())
        nbytes += int(index[written, 1].sum())
    return chunks, nbytes


@pytest.fixture(scope="module")
def sharded_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default layout (sharded, blosc and raw arrays) at a small size."""
    return write_synthetic_store(tmp_path_factory.mktemp("limit") / "s.zarr", 200, seed=5)


@pytest.mark.parametrize("which", ["small_store", "sharded_store"])
def test_every_chunk_of_every_field_is_counted_once(which: str, request: pytest.FixtureRequest) -> None:
    small_store: Path = request.getfixturevalue(which)
    limit = measure_layout_limit(small_store)
    with AtomicDataZarrReader(small_store) as reader:
        assert limit.structures == len(reader) and limit.atoms == int(reader.atoms_ptr[-1])
        fields = {f"core/{name}" for name in reader.field_names} | {f"custom/{name}" for name in reader.field_names}
    arrays = {a.name: a for a in limit.arrays}
    assert set(arrays) <= fields and len(arrays) == len(reader.field_names) and not limit.skipped
    for name, figures in arrays.items():
        arr = zarr.open_array(small_store / name, mode="r")
        chunks, nbytes = _stored_chunks(small_store, name)
        assert (figures.chunks, figures.stored_bytes) == (chunks, nbytes), name
        assert figures.decoded_bytes == chunks * math.prod(arr.chunks) * arr.dtype.itemsize, name
        assert figures.decode_s > 0 and figures.crc32c_s > 0 and figures.read_s > 0, name
        assert figures.codec.endswith("+crc32c"), figures.codec
    data = limit.to_dict()
    assert data["stored_bytes"] == sum(a.stored_bytes for a in limit.arrays)
    assert data["structures_per_s"] == pytest.approx(limit.structures / (limit.decode_s + limit.crc32c_s))
    assert data["decode_structures_per_s"] > data["structures_per_s"], "the crc32c checks cost time too"
    assert data["read_structures_per_s"] == pytest.approx(limit.structures / limit.read_s)


@pytest.mark.parametrize(
    ("codec", "checksum", "expected"),
    [("zstd", True, "zstd-1+crc32c"), ("lz4", True, "blosc-lz4+crc32c"), ("none", False, "raw")],
)
def test_codec_names_say_what_the_chunks_hold(tmp_path: Path, codec: str, checksum: bool, expected: str) -> None:
    store = write_synthetic_store(tmp_path / "s.zarr", 40, seed=3, config=synthetic_config(codec, checksum=checksum))
    figures = {a.name: a for a in measure_layout_limit(store).arrays}
    assert figures["core/positions"].codec == expected
    if not checksum:
        assert figures["core/positions"].crc32c_s == 0.0


def test_remote_stores_have_no_limit_row(small_store: Path) -> None:
    with StoreServer(small_store.parent) as server:
        url = server.url + small_store.name
        with pytest.raises(ConfigError, match="local directory store"):
            measure_layout_limit(url)
        rows, figures = measure_limit(url)
    assert figures is None and [(r.loader, r.note) for r in rows] == [
        ("limit", "local stores only"), ("page-cache", "local stores only")
    ]  # fmt: skip
