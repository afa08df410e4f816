"""store/read/codecs.py: decoding zarr v3 chunk bytes without zarr, and refusing what it cannot decode."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, TransposeCodec, ZstdCodec
from zarr.codecs.numcodecs import LZ4
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import MemoryStore

from dali_alchemi.errors import ChunkDecodeError, StoreFormatError, UnsupportedCodecError
from dali_alchemi.store.read.codecs import MISSING_CHUNK, ArrayCodec

VALUES = np.arange(30, dtype=np.float32).reshape(10, 3) * 1.5 - 4


def _array(name: str = "x", values: np.ndarray = VALUES, **kwargs: Any) -> tuple[Any, MemoryStore]:
    store = MemoryStore()
    group = zarr.open_group(store, mode="w")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's note on sharding combined with other codecs
        arr = group.create_array(name, shape=values.shape, dtype=values.dtype, **kwargs)
    arr[...] = values
    return arr, store


def _codec(arr: Any) -> ArrayCodec:
    return ArrayCodec(name=f"core/{arr.basename}", path=arr.store_path.path, metadata=arr.metadata)


def _raw(store: MemoryStore, key: str) -> bytes | None:
    buf = sync(store.get(key, prototype=default_buffer_prototype()))
    return None if buf is None else buf.to_bytes()


def _block(codec: ArrayCodec, store: MemoryStore, block: int) -> np.ndarray:
    keys = [loc.key for _, loc in codec.chunks_of_block(block)]
    return codec.decode_block(block, [_raw(store, k) for k in keys], keys)


@pytest.mark.parametrize(
    "compressors",
    [
        None, [BloscCodec()], [BloscCodec(cname="zstd", clevel=5)], [ZstdCodec(level=3)], [GzipCodec()], [Crc32cCodec()],
        "lz4",
    ],
    ids=["raw", "blosc-lz4", "blosc-zstd", "zstd", "gzip", "crc32c", "numcodecs-lz4"],
)
def test_every_block_decodes_to_the_stored_rows(compressors: list[Any] | str | None) -> None:
    if compressors == "lz4":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr: numcodecs' codecs are outside the zarr v3 spec
            compressors = [LZ4(), Crc32cCodec()]
    arr, store = _array(chunks=(4, 3), compressors=compressors)
    codec = _codec(arr)
    assert (codec.n_blocks, codec.block_rows, codec.row_nbytes, codec.sharded) == (3, 4, 12, False)
    assert [codec.block_shape(b) for b in range(3)] == [(4, 3), (4, 3), (2, 3)]  # the last block is short
    blocks = [_block(codec, store, b) for b in range(3)]
    for block in blocks:
        assert block.dtype == np.float32 and not block.flags.writeable
    assert np.array_equal(np.concatenate(blocks), VALUES)


def test_big_endian_chunks_decode_to_native_values() -> None:
    values = np.arange(12, dtype=">i4").reshape(6, 2) - 5
    arr, store = _array(values=values, chunks=(4, 2), serializer=BytesCodec(endian="big"), compressors=None)
    codec = _codec(arr)
    block = _block(codec, store, 0)
    assert block.dtype == np.dtype("int32") and block.dtype.isnative
    assert block.tolist() == values[:4].tolist()


def test_chunks_that_split_trailing_dims_are_assembled_into_one_block() -> None:
    arr, store = _array(chunks=(4, 2), compressors=[ZstdCodec()])
    codec = _codec(arr)
    assert [loc.key for _, loc in codec.chunks_of_block(2)] == ["x/c/2/0", "x/c/2/1"]
    assert np.array_equal(_block(codec, store, 2), VALUES[8:])


def test_a_missing_chunk_reads_as_the_fill_value() -> None:
    arr, _ = _array(chunks=(4, 3), compressors=[BloscCodec()], fill_value=7.5)
    codec = _codec(arr)
    block = codec.decode_block(1, [None], ["x/c/1/0"])
    assert block.shape == (4, 3) and block.dtype == np.float32
    assert (block == 7.5).all()
    split, _ = _array(chunks=(4, 2), compressors=None, fill_value=-1.0)
    split_codec = _codec(split)
    keys = [loc.key for _, loc in split_codec.chunks_of_block(0)]
    payload = split_codec.decode_block(0, [None, None], keys)
    assert payload.shape == (4, 3) and (payload == -1).all()


@pytest.mark.parametrize("compressors", [[BloscCodec()], [ZstdCodec()], [GzipCodec()], [Crc32cCodec()], None])
def test_corrupted_and_truncated_payloads_name_the_array_and_the_chunk(compressors: list[Any] | None) -> None:
    arr, store = _array(chunks=(4, 3), compressors=compressors)
    codec = _codec(arr)
    good = _raw(store, "x/c/1/0")
    assert good is not None
    truncated = good[:-5]
    with pytest.raises(ChunkDecodeError, match=r"^Array 'core/x': chunk 'x/c/1/0' could not be decoded: ") as info:
        codec.decode_block(1, [truncated], ["x/c/1/0"])
    assert isinstance(info.value, StoreFormatError)
    if compressors is not None:  # raw bytes carry no structure to corrupt, only a length
        corrupted = good[:8] + bytes(b ^ 0x5A for b in good[8:])
        with pytest.raises(ChunkDecodeError, match=r"chunk 'x/c/1/0' could not be decoded"):
            codec.decode_block(1, [corrupted], ["x/c/1/0"])


def test_a_blosc_frame_that_claims_more_bytes_than_it_has_is_refused() -> None:
    arr, store = _array(chunks=(4, 3), compressors=[BloscCodec()])
    good = _raw(store, "x/c/0/0")
    assert good is not None
    with pytest.raises(ChunkDecodeError, match=r"blosc frame says \d+ compressed bytes but the payload has"):
        _codec(arr).decode_block(0, [good + b"\0" * 4], ["x/c/0/0"])
    with pytest.raises(ChunkDecodeError, match="shorter than its 16-byte header"):
        _codec(arr).decode_block(0, [good[:10]], ["x/c/0/0"])


def test_an_lz4_chunk_whose_header_disagrees_with_the_chunk_is_refused() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arr, store = _array(chunks=(4, 3), compressors=[LZ4()])
    codec = _codec(arr)
    assert codec.codec_name == "lz4" and codec.inflatable
    good = _raw(store, "x/c/0/0")
    assert good is not None and int.from_bytes(good[:4], "little") == 4 * 3 * 4
    with pytest.raises(ChunkDecodeError, match=r"lz4 chunk decodes to 96 bytes, expected 48"):
        codec.decode_block(0, [(96).to_bytes(4, "little") + good[4:]], ["x/c/0/0"])
    with pytest.raises(ChunkDecodeError, match="shorter than its header"):
        codec.decode_block(0, [good[:4]], ["x/c/0/0"])
    with pytest.raises(ChunkDecodeError, match=r"chunk 'x/c/0/0' could not be decoded"):
        codec.decode_block(0, [good[:-3]], ["x/c/0/0"])  # a truncated block


def test_a_crc32c_mismatch_is_a_decode_error() -> None:
    arr, store = _array(chunks=(4, 3), compressors=[Crc32cCodec()])
    good = _raw(store, "x/c/0/0")
    assert good is not None
    flipped = bytes([good[0] ^ 1]) + good[1:]
    with pytest.raises(ChunkDecodeError, match="crc32c checksum mismatch"):
        _codec(arr).decode_block(0, [flipped], ["x/c/0/0"])


def test_sharded_chunks_are_byte_ranges_found_through_the_shard_index() -> None:
    arr, store = _array(chunks=(2, 3), shards=(4, 3), compressors=[ZstdCodec()])
    codec = _codec(arr)
    assert codec.sharded and codec.chunks_per_shard == (2, 1) and codec.block_rows == 2
    assert codec.index_at_end and codec.index_nbytes == 16 * 2 + 4  # offsets and lengths, then a crc32c
    assert [(loc.key, loc.inner_index) for _, loc in codec.chunks_of_block(3)] == [("x/c/1/0", 1)]
    shard = _raw(store, "x/c/1/0")
    assert shard is not None
    index = codec.parse_shard_index("x/c/1/0", shard[-codec.index_nbytes :])
    assert index.shape == (2, 2) and index.dtype == np.uint64
    for inner, block in ((0, 2), (1, 3)):
        span = codec.shard_payload_range(index, inner)
        assert span is not None
        got = codec.decode_block(block, [shard[span[0] : span[1]]], ["x/c/1/0"])
        assert np.array_equal(got, VALUES[2 * block : 2 * block + 2])


def test_an_unwritten_inner_chunk_has_no_byte_range_and_a_corrupt_index_is_named() -> None:
    arr, store = _array(chunks=(2, 3), shards=(4, 3), compressors=None)
    codec = _codec(arr)
    missing = np.full((2, 2), MISSING_CHUNK, dtype=np.uint64)
    assert codec.shard_payload_range(missing, 1) is None
    shard = _raw(store, "x/c/0/0")
    assert shard is not None
    tail = bytearray(shard[-codec.index_nbytes :])
    tail[0] ^= 0xFF
    with pytest.raises(ChunkDecodeError, match=r"Array 'core/x': shard index of 'x/c/0/0' is corrupt"):
        codec.parse_shard_index("x/c/0/0", bytes(tail))


def test_codec_chains_the_decoder_does_not_know_are_unsupported() -> None:
    transposed, _ = _array(chunks=(4, 3), filters=[TransposeCodec(order=(1, 0))])
    with pytest.raises(UnsupportedCodecError, match="first codec is not 'bytes'"):
        _codec(transposed)
    index_compressed, _ = _array(
        serializer=ShardingCodec(chunk_shape=(2, 3), index_codecs=[BytesCodec(), ZstdCodec()]),
        chunks=(4, 3),
        compressors=None,
    )
    with pytest.raises(UnsupportedCodecError, match="compressed shard index"):
        _codec(index_compressed)
    numcodecs_zarr3 = pytest.importorskip("zarr.codecs.numcodecs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's note that numcodecs codecs are outside the v3 spec
        bz2 = numcodecs_zarr3.BZ2()
    other, _ = _array(chunks=(4, 3), compressors=[bz2])
    with pytest.raises(UnsupportedCodecError, match="codec BZ2"):
        _codec(other)
    assert issubclass(UnsupportedCodecError, NotImplementedError)


@pytest.mark.parametrize(
    "compressors",
    [None, [BloscCodec()], [ZstdCodec(level=3)], [GzipCodec()], [Crc32cCodec()], [BloscCodec(), Crc32cCodec()]],
    ids=["raw", "blosc-lz4", "zstd", "gzip", "crc32c", "blosc-crc32c"],
)
def test_payloads_sliced_from_a_merged_read_decode_like_bytes(compressors: list[Any] | None) -> None:
    arr, store = _array(chunks=(4, 3), compressors=compressors)
    codec = _codec(arr)
    good = _raw(store, "x/c/1/0")
    assert good is not None
    merged = memoryview(b"head" + good + b"tail")  # what a local read of neighbouring ranges hands out
    got = codec.decode_block(1, [merged[4 : 4 + len(good)]], ["x/c/1/0"])
    assert got.dtype == np.float32 and not got.flags.writeable
    assert np.array_equal(got, VALUES[4:8])
    with pytest.raises(ChunkDecodeError, match=r"^Array 'core/x': chunk 'x/c/1/0' could not be decoded: "):
        codec.decode_block(1, [merged[4 : len(good)]], ["x/c/1/0"])  # cut short, as at the end of a file
    with pytest.raises(ChunkDecodeError, match=r"chunk 'x/c/1/0' could not be decoded"):
        codec.decode_block(1, [merged[4:4]], ["x/c/1/0"])  # wholly past the end: empty


def test_the_last_short_block_and_a_wrong_sized_blosc_frame() -> None:
    arr, store = _array(chunks=(4, 3), compressors=[BloscCodec()])
    codec = _codec(arr)
    assert np.array_equal(_block(codec, store, 2), VALUES[8:])  # rows 8-9 of a 4-row chunk
    other, other_store = _array(values=np.arange(15, dtype=np.float32).reshape(5, 3), chunks=(5, 3),
                                compressors=[BloscCodec()])  # fmt: skip
    wrong = _raw(other_store, "x/c/0/0")  # a valid frame of 5 rows where 4 are expected
    assert wrong is not None and _codec(other).decode_block(0, [wrong], ["x/c/0/0"]).shape == (5, 3)
    with pytest.raises(ChunkDecodeError, match=r"blosc frame decodes to 60 bytes, expected 48"):
        codec.decode_block(0, [wrong], ["x/c/0/0"])


@pytest.mark.parametrize("compressor", [ZstdCodec(level=3), GzipCodec()], ids=["zstd", "gzip"])
def test_a_valid_frame_of_too_few_bytes_is_refused_not_left_half_filled(compressor: Any) -> None:
    arr, _ = _array(chunks=(4, 3), compressors=[compressor])
    _, small_store = _array(values=VALUES[:1], chunks=(1, 3), compressors=[compressor])
    short = _raw(small_store, "x/c/0/0")  # a good frame of one row where a block of four is expected
    assert short is not None
    with pytest.raises(ChunkDecodeError, match=r"chunk 'x/c/0/0' could not be decoded: decoded 12 bytes, expected 48"):
        _codec(arr).decode_block(0, [short], ["x/c/0/0"])
