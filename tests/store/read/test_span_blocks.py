"""Blocks of span plans read the lean way: decoded once, every damage caught, the working set kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, ChunkDecodeError
from dali_alchemi.errors import ConfigError
from dali_alchemi.store.read.decoder import BlockDecoder

_general_decode = BlockDecoder.decode_group


def _no_general_decode(self: BlockDecoder, jobs: list[object], *args: object) -> None:
    if jobs:
        raise AssertionError("a span window's blocks went through the general decoder")
    _general_decode(self, jobs, *args)  # type: ignore[arg-type]  # the takes of arrays held whole


def test_span_blocks_are_decoded_once_and_then_served_from_the_cache(
    sharded_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(BlockDecoder, "decode_group", _no_general_decode)
    with AtomicDataZarrReader(sharded_store, cache_bytes=1 << 30, fields=["positions", "energy"]) as reader:
        reader.read_packed(np.arange(0, 300))
        first = reader.stats()
        per_pass = reader.decoded_blocks_per_pass()
        assert first.blocks_decoded == per_pass > 0
        assert first.chunks_fetched == per_pass  # one chunk per block
        reader.read_packed(np.arange(0, 300))
        assert reader.stats().blocks_decoded == per_pass  # the second pass decodes nothing


@pytest.mark.parametrize("store", ["small_store", "sharded_store"])
def test_a_corrupt_compressed_chunk_read_by_spans_names_the_chunk(
    request: pytest.FixtureRequest, store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store.zarr"
    shutil.copytree(request.getfixturevalue(store), path)
    victim = path / "core" / "positions" / "c" / "0" / "0"
    data = bytearray(victim.read_bytes())
    data[20] ^= 0xFF  # inside the first chunk's frame: its crc32c no longer matches
    victim.write_bytes(bytes(data))
    monkeypatch.setattr(BlockDecoder, "decode_group", _no_general_decode)
    with AtomicDataZarrReader(path, cache_bytes=0, fields=["positions"]) as reader:
        with pytest.raises(ChunkDecodeError, match=r"'core/positions': chunk 'core/positions/c/0/0'.*crc32c"):
            reader.read_packed(np.arange(0, 40))
        assert reader.read_packed(np.arange(250, 300)).fields["positions"].shape[1] == 3  # far chunks still read


def test_a_lost_compressed_chunk_read_by_spans_is_an_error_in_a_complete_store(
    small_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store.zarr"
    shutil.copytree(small_store, path)
    (path / "core" / "positions" / "c" / "0" / "0").unlink()
    monkeypatch.setattr(BlockDecoder, "decode_group", _no_general_decode)
    with AtomicDataZarrReader(path, cache_bytes=0, fields=["positions"]) as reader:
        with pytest.raises(ChunkDecodeError, match=r"'core/positions/c/0/0' is missing, but the store promises"):
            reader.read_packed(np.arange(0, 40))


def test_span_blocks_beyond_the_working_set_go_through_the_bounded_groups(
    small_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups: list[int] = []

    def counted(self: BlockDecoder, jobs: list[object], *args: object) -> None:
        groups.append(len(jobs))
        _general_decode(self, jobs, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(BlockDecoder, "decode_group", counted)
    with AtomicDataZarrReader(small_store, cache_bytes=0) as reader:
        reader._engine.working_set_bytes = 1  # every block is a group of its own
        bounded = reader.read_packed(np.arange(0, 300), fields=["positions"]).fields["positions"]
    assert len(groups) > 1 and set(groups) <= {0, 1}
    groups.clear()
    with AtomicDataZarrReader(small_store, cache_bytes=0) as reader:
        lean = reader.read_packed(np.arange(0, 300), fields=["positions"]).fields["positions"]
    assert not any(groups)  # within the working set: the lean way
    np.testing.assert_array_equal(lean, bounded)


def test_blocks_a_window_covers_whole_are_decoded_into_it_when_the_cache_cannot_keep_them(small_store: Path) -> None:
    cache_bytes = 8 << 10  # smaller than the positions array (~100 KB decoded): its blocks would not last a pass
    with AtomicDataZarrReader(small_store, cache_bytes=cache_bytes, fields=["positions"]) as reader:
        got = reader.read_packed(np.arange(10, 290)).fields["positions"]
        stats = reader.stats()
    with AtomicDataZarrReader(small_store, cache_bytes=0, fields=["positions"]) as reader:
        reader._engine.working_set_bytes = 1  # the general decoder, block by block
        want = reader.read_packed(np.arange(10, 290)).fields["positions"]
    np.testing.assert_array_equal(got, want)
    assert stats.blocks_decoded > 2
    assert stats.cache.entries <= 2  # only the two blocks the window cuts were cached


def test_decoding_into_the_output_takes_only_full_one_chunk_blocks(small_store: Path) -> None:
    with AtomicDataZarrReader(small_store, fields=["positions"]) as reader:
        codec = reader._snapshot.handles["positions"].codec
        assert codec is not None and codec.one_chunk_blocks
        with pytest.raises(ConfigError, match="is not one full chunk"):
            codec.decode_block_into(0, None, "k", np.empty((codec.block_rows - 1, 3), dtype=codec.dtype))
        last = codec.n_blocks - 1  # a short last block is never decoded into the output
        with pytest.raises(ConfigError, match=f"block {last} is not one full chunk"):
            codec.decode_block_into(last, None, "k", np.empty((codec.block_rows, 3), dtype=codec.dtype))
