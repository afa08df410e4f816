from __future__ import annotations

import numpy as np
import pytest
from zarr.codecs import BloscCodec, ZstdCodec

from dali_alchemi.config import DEFAULT_CHUNK_BYTES, ArrayConfig, WriteConfig


def test_shard_must_be_a_multiple_of_chunk() -> None:
    with pytest.raises(ValueError, match=r"shard_size \(10\) must be a multiple of chunk_size \(4\)"):
        ArrayConfig(chunk_size=4, shard_size=10)
    with pytest.raises(ValueError, match="needs an explicit chunk_size"):
        ArrayConfig(shard_size=8)
    with pytest.raises(ValueError, match="positive integer"):
        ArrayConfig(chunk_size=0)


def test_override_replaces_the_group_config() -> None:
    config = WriteConfig(core=ArrayConfig(chunk_size=4, shard_size=8), field_overrides={"energy": {"chunk_size": 2}})
    assert config.for_array("core", "positions").shard_size == 8
    energy = config.for_array("core", "energy")
    assert (energy.chunk_size, energy.shard_size) == (2, None)


def test_auto_rows_target_the_default_chunk_bytes() -> None:
    assert ArrayConfig().rows_per_chunk(12) == 262144 == 2 ** int(np.log2(DEFAULT_CHUNK_BYTES // 12))
    assert ArrayConfig().rows_per_chunk(DEFAULT_CHUNK_BYTES * 2) == 1
    assert ArrayConfig(chunk_size=7).rows_per_chunk(12) == 7


def test_dict_round_trip() -> None:
    config = WriteConfig(
        core=ArrayConfig(compressors=(BloscCodec(cname="lz4", clevel=3),), chunk_size=64, shard_size=128),
        field_overrides={"neighbor_list": ArrayConfig(compressors=(), chunk_size=32)},
    )
    again = WriteConfig.from_dict(config.to_dict())
    assert again.to_dict() == config.to_dict()
    assert isinstance(again.core.compressors[0], BloscCodec)
    assert WriteConfig.from_dict({"core": {"compressors": [ZstdCodec(level=3).to_dict()]}}).core.compressors == (
        ZstdCodec(level=3),
    )


def test_unknown_keys_and_codecs_are_rejected() -> None:
    with pytest.raises(ValueError, match="Unknown WriteConfig keys"):
        WriteConfig.from_dict({"cores": {}})
    with pytest.raises(ValueError, match="Unsupported compressor 'lzma'"):
        ArrayConfig.from_dict({"compressors": [{"name": "lzma"}]})


def test_the_default_layout_keeps_raw_what_the_disk_budget_allows() -> None:
    from dali_alchemi.config import DISK_BUDGET, FAST_SMALL_CHUNK_CODEC, default_array_configs

    rng = np.random.default_rng(0)
    n = 400_000  # many 128 KiB chunks per array, so a raw array's partly filled last chunk is small beside it
    arrays = {
        "positions": rng.standard_normal((n, 3)).astype(np.float32),  # barely compresses
        "atomic_numbers": rng.integers(1, 20, n),  # int64 of 19 values: shrinks about 10x
        "labels": np.zeros(n, dtype=np.int64),  # shrinks to nothing
    }
    configs = default_array_configs("core", arrays)
    assert configs["positions"].compressors == ()
    assert configs["labels"].compressors == (FAST_SMALL_CHUNK_CODEC,)  # the largest saving goes first
    # raw positions (4.8 MB) and numbers (3.2 MB) would exceed 1.2x of all compressed (~4.7 MB): numbers too
    assert configs["atomic_numbers"].compressors and DISK_BUDGET == 1.2
    # 128 KiB inner chunks (a power of two of rows) in shards of 32 MiB
    assert configs["positions"].chunk_size == 8192 and configs["positions"].shard_size == 8192 * 256
    assert configs["atomic_numbers"].chunk_size == 16384 and configs["atomic_numbers"].shard_size == 16384 * 256
    assert default_array_configs("meta", {"atoms_ptr": np.arange(10)})["atoms_ptr"] == ArrayConfig()
    # alone, an array that barely compresses is raw and one that shrinks is compressed
    assert WriteConfig().for_array("core", "forces", arrays["positions"]).compressors == ()
    assert WriteConfig().for_array("core", "z", arrays["atomic_numbers"]).compressors


def test_the_default_layout_picks_the_fast_codec_unless_the_dense_one_keeps_half() -> None:
    from dali_alchemi.config import DENSE_SMALL_CHUNK_CODEC, FAST_SMALL_CHUNK_CODEC, default_array_configs

    rng = np.random.default_rng(0)
    # periodic shifts of a crystal, mostly zero: zstd with bit shuffle keeps about 4x fewer bytes
    shifts = rng.choice(np.array([-1, 0, 1], dtype=np.float32), size=(100_000, 3), p=[0.1, 0.8, 0.1])
    # sorted atom pairs: zstd keeps only about 1.5x fewer bytes, not worth its 5x slower decode
    pairs = np.sort(rng.integers(0, 100_000, (100_000, 2)), axis=0)
    assert default_array_configs("core", {"shifts": shifts})["shifts"].compressors == (DENSE_SMALL_CHUNK_CODEC,)
    assert default_array_configs("core", {"pairs": pairs})["pairs"].compressors == (FAST_SMALL_CHUNK_CODEC,)
    assert FAST_SMALL_CHUNK_CODEC.cname.value == "blosclz" and FAST_SMALL_CHUNK_CODEC.shuffle.value == "shuffle"


def test_the_disk_budget_is_measured_against_the_compressed_layout() -> None:
    from dali_alchemi.config import (
        COMPRESSED_ARRAYS,
        COMPRESSED_CODEC,
        DISK_BUDGET,
        compressed_ratio,
        default_array_configs,
    )

    rng = np.random.default_rng(1)
    # smooth floats: 4 MiB lz4 chunks keep far fewer bytes than raw, so the budget has them compressed
    smooth = np.cumsum(rng.integers(-2, 3, (200_000, 3)), axis=0).astype(np.float32)
    noise = rng.standard_normal((200_000, 3)).astype(np.float32)
    configs = default_array_configs("core", {"smooth": smooth, "noise": noise})
    assert configs["smooth"].compressors and configs["noise"].compressors == ()
    reference = sum(
        a.nbytes * compressed_ratio(a, COMPRESSED_CODEC, COMPRESSED_ARRAYS.rows_per_chunk(12))
        for a in (smooth, noise)
    )
    assert noise.nbytes <= DISK_BUDGET * reference  # what stays raw fits the budget


def test_the_inflate_layout_is_the_default_with_lz4_blocks_for_what_it_compresses() -> None:
    from zarr.codecs.numcodecs import LZ4, Shuffle

    from dali_alchemi.config import INFLATE_CODECS, default_array_configs, layout_config

    rng = np.random.default_rng(0)
    n = 400_000
    arrays = {"positions": rng.standard_normal((n, 3)).astype(np.float32), "labels": np.zeros(n, dtype=np.int64)}
    default = WriteConfig().for_arrays("core", arrays)
    inflate = layout_config("inflate").for_arrays("core", arrays)
    assert inflate["positions"] == default["positions"] and inflate["positions"].compressors == ()  # raw stays raw
    assert inflate["labels"].compressors == INFLATE_CODECS
    assert [type(c) for c in INFLATE_CODECS] == [Shuffle, LZ4]  # shuffled by element, then raw LZ4 blocks
    assert inflate["labels"].chunk_size == default["labels"].chunk_size == 16384  # the same 128 KiB chunks
    assert inflate["labels"].codecs[-1].to_dict() == {"name": "crc32c"}  # checksummed like every array
    meta = default_array_configs("meta", {"atoms_ptr": np.arange(10)}, codecs=INFLATE_CODECS)
    assert meta["atoms_ptr"] == ArrayConfig()
    again = WriteConfig.from_dict(layout_config("inflate").to_dict())
    assert again.compressed_codecs == INFLATE_CODECS
    assert [c["name"] for c in again.to_dict()["compressed_codecs"]] == ["numcodecs.shuffle", "numcodecs.lz4"]
    with pytest.raises(TypeError, match="compressed_codecs must be zarr bytes-to-bytes compressors"):
        WriteConfig(compressed_codecs=("lz4",))  # type: ignore[arg-type]
