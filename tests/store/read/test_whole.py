"""Arrays read whole, shard by shard: the same values and the same errors as block reads."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import zarr

from dali_alchemi.bench.synth import write_synthetic_store
from dali_alchemi.errors import ChunkDecodeError
from dali_alchemi.store.format.location import resolve_store
from dali_alchemi.store.read.fetch import LocalFetcher
from dali_alchemi.store.read.snapshot import open_snapshot
from dali_alchemi.store.read.whole import read_whole, reads_whole


@pytest.fixture(scope="module")
def default_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,000 structures in the default layout: raw and compressed arrays, sharded, last chunks partly filled."""
    return write_synthetic_store(tmp_path_factory.mktemp("whole") / "s.zarr", 2000, seed=3, min_atoms=5, max_atoms=30)


def _codecs(path: Path) -> dict[str, object]:
    snap = open_snapshot(resolve_store(path, read_only=True, must_exist=True))
    return {name: h.codec for name, h in snap.handles.items() if h.codec is not None and reads_whole(h.codec)}


def _fetcher(path: Path) -> LocalFetcher:
    return LocalFetcher(path, ThreadPoolExecutor(2))


def test_every_array_reads_whole_as_zarr_reads_it(default_store: Path) -> None:
    codecs = _codecs(default_store)
    assert {"positions", "atomic_numbers", "neighbor_list", "energy"} <= set(codecs)
    compressed = [c for c in codecs.values() if not c.uncompressed]  # type: ignore[attr-defined]
    assert compressed and len(compressed) < len(codecs)  # both kinds are exercised
    group = zarr.open_group(str(default_store), mode="r")
    for name, codec in codecs.items():
        indexes: dict = {}
        whole, read = read_whole(codec, _fetcher(default_store), indexes)  # type: ignore[arg-type]
        want = group[codec.path][...]  # type: ignore[attr-defined]
        assert whole.dtype == want.dtype and whole.shape == want.shape, name
        np.testing.assert_array_equal(whole, want, err_msg=name)
        assert read == codec.n_blocks and not whole.flags.writeable, name  # type: ignore[attr-defined]
    assert any(c.shape[0] % c.block_rows for c in codecs.values())  # type: ignore[attr-defined]  # a partial last chunk


def test_blocks_already_decoded_are_copied_not_decoded_again(default_store: Path) -> None:
    codec = _codecs(default_store)["positions"]
    want = zarr.open_group(str(default_store), mode="r")[codec.path][...]  # type: ignore[attr-defined]
    rows, last = codec.block_rows, codec.n_blocks - 1  # type: ignore[attr-defined]
    marked = {1: np.full((rows, 3), -7.0, dtype=want.dtype), last: np.full((rows, 3), 9.0, dtype=want.dtype)}
    whole, read = read_whole(codec, _fetcher(default_store), {}, marked)  # type: ignore[arg-type]
    assert read == codec.n_blocks  # type: ignore[attr-defined]  # the shards are still read once each
    assert (whole[rows : 2 * rows] == -7.0).all() and (whole[last * rows :] == 9.0).all()  # the given blocks, cut
    np.testing.assert_array_equal(whole[:rows], want[:rows])
    np.testing.assert_array_equal(whole[2 * rows : last * rows], want[2 * rows : last * rows])


def test_a_corrupt_inner_chunk_names_its_array_and_shard(default_store: Path, tmp_path: Path) -> None:
    path = tmp_path / "corrupt.zarr"
    shutil.copytree(default_store, path)
    codec = _codecs(path)["positions"]
    key = codec.shard_key(0)  # type: ignore[attr-defined]
    shard = bytearray((path / key).read_bytes())
    shard[100] ^= 0xFF  # inside the first inner chunk: its crc32c no longer matches
    (path / key).write_bytes(bytes(shard))
    with pytest.raises(ChunkDecodeError, match=rf"Array 'core/positions': chunk '{key}' could not be decoded: crc32c"):
        read_whole(codec, _fetcher(path), {})  # type: ignore[arg-type]


def test_a_truncated_shard_is_an_error_not_short_rows(default_store: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.zarr"
    shutil.copytree(default_store, path)
    codec = _codecs(path)["atomic_numbers"]
    key = codec.shard_key(0)  # type: ignore[attr-defined]
    indexes: dict = {}
    read_whole(codec, _fetcher(path), indexes)  # type: ignore[arg-type]  # index read, then the data cut
    data = (path / key).read_bytes()
    (path / key).write_bytes(data[: len(data) // 2])
    with pytest.raises(ChunkDecodeError, match="Array 'core/atomic_numbers'"):
        read_whole(codec, _fetcher(path), indexes)  # type: ignore[arg-type]
