"""Decoding of zarr v3 chunks without zarr's per-chunk machinery.

zarr-python spends about half a millisecond of Python per chunk; a shuffled window touches hundreds of
chunks, so the reader decodes chunk bytes itself with numcodecs (which releases the GIL). This module
turns an array's zarr metadata into an :class:`ArrayCodec` that knows where each chunk's bytes live (a
whole object, or a byte range inside a shard) and how to decode them. Codec chains it does not know are
reported as unsupported, and the reader then falls back to zarr for that array.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import google_crc32c
import numcodecs
import numcodecs.blosc
import numcodecs.lz4
import numpy as np
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, ZstdCodec
from zarr.codecs.numcodecs import LZ4 as NumcodecsLZ4
from zarr.codecs.numcodecs import Shuffle as NumcodecsShuffle

from dali_alchemi.errors import ChunkDecodeError, ConfigError, UnsupportedCodecError

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["LZ4_HEADER", "MISSING_CHUNK", "ArrayCodec", "ChunkLocation", "checked_crc32c"]


MISSING_CHUNK = (1 << 64) - 1
"""Shard index entry (offset and length) of an inner chunk that was never written."""

_BLOSC_SIZES = struct.Struct("<III")
"""The three uint32 sizes of a blosc1 frame header (at byte 4): decoded, block and compressed bytes."""

_blosc_decompress = numcodecs.blosc.decompress
_lz4_decompress = numcodecs.lz4.decompress

LZ4_HEADER = struct.Struct("<I")
"""numcodecs' LZ4 chunk: this uint32 (the decoded size), then one raw LZ4 block (what nvCOMP inflates)."""


class _CheckedBlosc:
    """Blosc decoding that first checks the frame's own sizes against the payload.

    c-blosc trusts the compressed size written in the frame header, so a truncated frame would make
    it read past the end of the buffer; the check turns that into a clean error. The header is read
    with :func:`struct.unpack_from` and the frame handed to numcodecs' ``decompress`` directly: per
    small chunk, numpy views and the codec wrapper cost as much as the decompression itself.
    """

    def decode(self, buf: Any, out: Any = None) -> Any:
        size = buf.nbytes if isinstance(buf, (np.ndarray, memoryview)) else len(buf)
        if size < 16:
            raise ChunkDecodeError(f"blosc frame of {size} bytes is shorter than its 16-byte header")
        # Blosc1 header: version, versionlz, flags, typesize, then uint32 nbytes, blocksize, cbytes.
        nbytes, _, cbytes = _BLOSC_SIZES.unpack_from(buf, 4)
        if cbytes != size:
            raise ChunkDecodeError(f"blosc frame says {cbytes} compressed bytes but the payload has {size}")
        if out is not None and nbytes != out.nbytes:
            raise ChunkDecodeError(f"blosc frame decodes to {nbytes} bytes, expected {out.nbytes}")
        return _blosc_decompress(buf, out)


class _CheckedLZ4:
    """numcodecs' LZ4 decoding that first checks the chunk's decoded size against ``out``.

    The payload is a 4-byte little-endian decoded size followed by one raw LZ4 block; liblz4's safe
    decoder never reads past the block, and numcodecs raises when the block decodes to another size.
    """

    def decode(self, buf: Any, out: Any = None) -> Any:
        size = buf.nbytes if isinstance(buf, (np.ndarray, memoryview)) else len(buf)
        if size < LZ4_HEADER.size + 1:
            raise ChunkDecodeError(f"lz4 chunk of {size} bytes is shorter than its header and one block byte")
        (nbytes,) = LZ4_HEADER.unpack_from(buf, 0)
        if out is not None and nbytes != out.nbytes:
            raise ChunkDecodeError(f"lz4 chunk decodes to {nbytes} bytes, expected {out.nbytes}")
        return _lz4_decompress(buf, out)


@dataclass(frozen=True, slots=True)
class _Unshuffle:
    """numcodecs' byte shuffle undone: byte ``k`` of every element was stored together, for each ``k``."""

    elementsize: int

    def decode(self, buf: Any, out: Any = None) -> Any:
        return numcodecs.Shuffle(elementsize=self.elementsize).decode(buf, out)


def _compressor(codec: Any) -> Any:
    """numcodecs decoder for one zarr v3 bytes-to-bytes codec (``None`` for crc32c, handled apart)."""
    if isinstance(codec, NumcodecsLZ4):
        return _CheckedLZ4()
    elementsize = codec.codec_config.get("elementsize") if isinstance(codec, NumcodecsShuffle) else None
    if isinstance(elementsize, int):
        return _Unshuffle(elementsize)
    if isinstance(codec, ZstdCodec):
        return numcodecs.Zstd()
    if isinstance(codec, BloscCodec):
        return _CheckedBlosc()
    if isinstance(codec, GzipCodec):
        return numcodecs.GZip()
    raise UnsupportedCodecError(f"codec {type(codec).__name__}")


def _chain_name(codecs: tuple[Any, ...]) -> str:
    """A short name of a chunk codec chain: ``blosc-lz4+crc32c``, ``zstd-1``, ``raw`` (the ``bytes`` serializer alone)."""
    names = []
    for codec in codecs[1:]:
        if isinstance(codec, BloscCodec):
            names.append(f"blosc-{getattr(codec.cname, 'value', codec.cname)}")
        elif isinstance(codec, ZstdCodec):
            names.append(f"zstd-{codec.level}")
        elif isinstance(codec, Crc32cCodec):
            names.append("crc32c")
        elif isinstance(codec, NumcodecsLZ4):
            names.append("lz4")
        else:
            names.append(type(codec).__name__.removesuffix("Codec").lower())
    if not names or names == ["crc32c"]:
        names.insert(0, "raw")
    return "+".join(names)


def checked_crc32c(payload: Any) -> NDArray[np.uint8]:
    """``payload`` without its trailing crc32c (zarr's ``crc32c`` codec: the last 4 bytes are the checksum of
    the rest), as a view, once the checksum matched; a ``ChunkDecodeError`` when it does not."""
    raw = np.frombuffer(payload, dtype=np.uint8)
    if raw.size < 4:
        raise ChunkDecodeError("payload shorter than its crc32c checksum")
    if google_crc32c.value(raw[:-4]) != int.from_bytes(raw[-4:].tobytes(), "little"):
        raise ChunkDecodeError("crc32c checksum mismatch")
    return raw[:-4]


_EXACT = (_CheckedBlosc, _CheckedLZ4)
"""Decoders whose header gives the decoded size, checked against ``out`` before decoding into it."""


@dataclass(frozen=True, slots=True)
class _Chain:
    """A ``bytes`` serializer followed by bytes-to-bytes codecs, decoded in reverse order."""

    stored_dtype: np.dtype[Any]
    steps: tuple[Any, ...]  # numcodecs decoders, or "crc32c", in *encoding* order
    decoders: tuple[Any, ...] = field(init=False, repr=False, compare=False)  # ``steps`` reversed, once

    def __post_init__(self) -> None:
        object.__setattr__(self, "decoders", tuple(reversed(self.steps)))

    @classmethod
    def from_codecs(cls, codecs: tuple[Any, ...], dtype: np.dtype[Any]) -> _Chain:
        if not codecs or not isinstance(codecs[0], BytesCodec):
            raise UnsupportedCodecError("first codec is not 'bytes'")
        endian = codecs[0].endian
        stored = dtype.newbyteorder("<" if endian is None or endian.value == "little" else ">")
        steps = tuple("crc32c" if isinstance(codec, Crc32cCodec) else _compressor(codec) for codec in codecs[1:])
        return cls(stored_dtype=stored, steps=steps)

    def decode(self, payload: Any, shape: tuple[int, ...], out: NDArray[Any] | None) -> NDArray[Any]:
        """Decode ``payload`` into an array of ``shape``; into ``out`` (C-contiguous, native) when given.

        When the last codec is blosc and ``out`` has the expected size, the frame is decoded straight
        into ``out`` and ``out`` returned without further views (the common case for small inner
        chunks); other codecs decode into a buffer of their own, whose size is checked, then copied.
        """
        data: Any = payload
        decoders = self.decoders
        last = len(decoders) - 1
        expected = math.prod(shape) * self.stored_dtype.itemsize
        for pos, step in enumerate(decoders):
            if isinstance(step, str):
                data = checked_crc32c(data)
            elif pos == last and out is not None and self.stored_dtype == out.dtype and isinstance(step, _EXACT):
                # Only blosc and lz4 decode straight into ``out``: their headers say how many bytes they hold,
                # checked against ``out``. numcodecs' zstd and gzip fill a larger ``out`` only in part
                # and say nothing, which would leave rows of uninitialised memory in the block.
                data = step.decode(data, out=out)
                if data is out and out.nbytes == expected:
                    return out
            else:
                data = step.decode(data)
        raw = data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
        if raw.size != expected:
            raise ChunkDecodeError(f"decoded {raw.size} bytes, expected {expected} for chunk shape {shape}")
        arr = raw.view(self.stored_dtype).reshape(shape)
        if not self.stored_dtype.isnative:
            arr = arr.astype(self.stored_dtype.newbyteorder("="))
        if out is None:
            return arr
        if arr.ctypes.data != out.ctypes.data:
            out[...] = arr
        return out


@dataclass(frozen=True, slots=True)
class ChunkLocation:
    """Where one inner chunk's bytes live: a whole stored object, or a byte range inside a shard."""

    key: str  # the object holding the bytes: the chunk itself, or its shard
    inner_index: int = 0  # for sharded arrays, the flat index of the inner chunk inside its shard


class ArrayCodec:
    """Chunk addressing and decoding for one zarr v3 array, built once from its metadata.

    The read unit is an *inner* chunk (for sharded arrays, a chunk inside a shard). A *row block* is the
    set of chunks sharing a first chunk coordinate: rows ``[b * block_rows, (b + 1) * block_rows)`` with
    every trailing dim whole, which is what the reader caches. ``rows`` reads the array as if it held
    only its first ``rows`` rows: an unfinished append has grown its metadata, and the chunks past its
    old state may not be written yet.
    """

    def __init__(self, *, name: str, path: str, metadata: Any, complete: bool = False, rows: int | None = None) -> None:
        self.name = name
        self.path = path
        self.complete = complete  # the store promises every chunk: a missing one is an error, not fill
        self.shape: tuple[int, ...] = tuple(int(s) for s in metadata.shape)
        if rows is not None and self.shape and rows < self.shape[0]:
            # an unfinished append's old state: the metadata has grown, the chunks past ``rows`` may not exist
            self.shape = (rows, *self.shape[1:])
        self.dtype: np.dtype[Any] = np.dtype(metadata.dtype.to_native_dtype()).newbyteorder("=")
        self.fill_value = metadata.fill_value
        self._key_encoding = metadata.chunk_key_encoding
        grid_shape = tuple(int(s) for s in metadata.chunk_grid.chunk_shape)
        codecs = tuple(metadata.codecs)
        self.sharded = len(codecs) == 1 and isinstance(codecs[0], ShardingCodec)
        if self.sharded:
            sharding: ShardingCodec = codecs[0]
            self.chunk_shape = tuple(int(s) for s in sharding.chunk_shape)
            self.shard_shape = grid_shape
            self._chain = _Chain.from_codecs(tuple(sharding.codecs), self.dtype)
            self.codec_name = _chain_name(tuple(sharding.codecs))
            index_codecs = tuple(sharding.index_codecs)
            self._index_chain = _Chain.from_codecs(index_codecs, np.dtype(np.uint64))
            self.chunks_per_shard = tuple(s // c for s, c in zip(self.shard_shape, self.chunk_shape, strict=True))
            n_inner = math.prod(self.chunks_per_shard)
            checksum = sum(4 for c in index_codecs[1:] if isinstance(c, Crc32cCodec))
            if any(not isinstance(c, (BytesCodec, Crc32cCodec)) for c in index_codecs):
                raise UnsupportedCodecError("compressed shard index")
            self.index_nbytes = 16 * n_inner + checksum
            self.index_at_end = sharding.index_location.value == "end"
        else:
            self.chunk_shape = grid_shape
            self.shard_shape = grid_shape
            self._chain = _Chain.from_codecs(codecs, self.dtype)
            self.codec_name = _chain_name(codecs)
            self.chunks_per_shard = tuple(1 for _ in grid_shape)
            self.index_nbytes = 0
            self.index_at_end = True
        if any(s == 0 for s in self.chunk_shape):
            raise UnsupportedCodecError("zero-sized chunk shape")
        self.block_rows = self.chunk_shape[0] if self.shape else 1
        trailing = self.shape[1:]
        self.trailing_grid = tuple(math.ceil(s / c) for s, c in zip(trailing, self.chunk_shape[1:], strict=True))
        self.row_nbytes = int(math.prod(trailing)) * self.dtype.itemsize
        self._whole_rows = all(g == 1 for g in self.trailing_grid)
        # A row block is exactly one chunk (trailing dims whole and equal to the array's): decoded in place.
        self._one_chunk = self._whole_rows and self.chunk_shape[1:] == self.shape[1:]
        self._zeros = tuple(0 for _ in self.trailing_grid)
        self._row_keys: dict[int, str] = {}  # object key by first chunk coordinate (whole-row chunks)

    # -- addressing ---------------------------------------------------------------------------------
    @property
    def n_blocks(self) -> int:
        """Number of row blocks along dim 0."""
        return math.ceil(self.shape[0] / self.block_rows) if self.shape else 0

    def block_shape(self, block: int) -> tuple[int, ...]:
        """Shape of row block ``block`` clipped to the array (the last block may be short)."""
        rows = min(self.block_rows, self.shape[0] - block * self.block_rows)
        return (rows, *self.shape[1:])

    def _key(self, coords: tuple[int, ...]) -> str:
        return f"{self.path}/{self._key_encoding.encode_chunk_key(coords)}"

    def chunks_of_block(self, block: int) -> list[tuple[tuple[int, ...], ChunkLocation]]:
        """Every inner chunk of row block ``block``: its chunk coordinates and where its bytes live."""
        if self._whole_rows:  # trailing dims whole (what the writer makes): one chunk per block
            coords = (block, *self._zeros)
            first = block // self.chunks_per_shard[0] if self.sharded else block
            key = self._row_keys.get(first)
            if key is None:
                key = self._row_keys.setdefault(first, self._key((first, *self._zeros)))
            return [(coords, ChunkLocation(key=key, inner_index=block % self.chunks_per_shard[0]))]
        result: list[tuple[tuple[int, ...], ChunkLocation]] = []
        for trailing in np.ndindex(*self.trailing_grid) if self.trailing_grid else [()]:
            coords = (block, *trailing)
            if not self.sharded:
                result.append((coords, ChunkLocation(key=self._key(coords))))
                continue
            shard = tuple(c // n for c, n in zip(coords, self.chunks_per_shard, strict=True))
            inner = tuple(c % n for c, n in zip(coords, self.chunks_per_shard, strict=True))
            flat = int(np.ravel_multi_index(inner, self.chunks_per_shard))
            key = self._key(shard)
            result.append((coords, ChunkLocation(key=key, inner_index=flat)))
        return result

    def shard_key(self, first: int) -> str:
        """Key of the object holding row blocks ``first * chunks_per_shard[0] ...`` (a chunk, or a shard)."""
        key = self._row_keys.get(first)
        if key is None:
            key = self._row_keys.setdefault(first, self._key((first, *self._zeros)))
        return key

    @property
    def one_chunk_blocks(self) -> bool:
        """Whether each row block is one chunk (trailing dims whole and unsplit): a block is one decode."""
        return self._one_chunk

    @property
    def stored_dtype(self) -> np.dtype[Any]:
        """The dtype of the stored bytes (its byte order as written)."""
        return self._chain.stored_dtype

    @property
    def uncompressed(self) -> bool:
        """Whether chunks are raw rows: the ``bytes`` serializer, at most followed by ``crc32c``."""
        return all(isinstance(step, str) for step in self._chain.steps)

    @property
    def compressor(self) -> Any | None:
        """The decoder of the chunks' compression step (blosc, zstd or gzip); ``None`` for raw rows."""
        steps = [step for step in self._chain.steps if not isinstance(step, str)]
        return steps[-1] if steps else None

    @property
    def inflatable(self) -> bool:
        """Whether every chunk is one row block stored as numcodecs LZ4 (a decoded-size header, then one raw
        LZ4 block), of native-order rows, at most byte-shuffled by element before and checksummed after:
        what DALI's nvCOMP inflate decodes on the GPU as stored (:mod:`~dali_alchemi.store.read.compressed`)."""
        steps = list(self._chain.steps)
        if steps and isinstance(steps[0], _Unshuffle) and steps[0].elementsize == self.dtype.itemsize:
            steps.pop(0)
        return (
            bool(steps) and isinstance(steps[0], _CheckedLZ4) and steps[1:] in ([], ["crc32c"])
            and self._chain.stored_dtype.isnative and self._one_chunk
        )  # fmt: skip

    @property
    def byte_shuffle(self) -> int:
        """The element size of the byte shuffle applied before compression (numcodecs' ``shuffle``); 0: none."""
        first = self._chain.steps[0] if self._chain.steps else None
        return first.elementsize if isinstance(first, _Unshuffle) else 0

    @property
    def chunk_checksum(self) -> bool:
        """Whether each (inner) chunk ends with a ``crc32c`` checksum."""
        return "crc32c" in self._chain.steps

    # -- decoding -----------------------------------------------------------------------------------
    def parse_shard_index(self, key: str, payload: Any) -> NDArray[np.uint64]:
        """Decode a shard index read from the end (or start) of shard ``key``: ``[n_inner, 2]`` offsets/lengths."""
        try:
            index = self._index_chain.decode(payload, (math.prod(self.chunks_per_shard), 2), None)
        except Exception as err:  # numcodecs raises several types; all mean corrupt bytes
            raise ChunkDecodeError(
                f"Array {self.name!r}: shard index of {key!r} is corrupt: {err}", array=self.name, chunk=key
            ) from err
        offsets, lengths = index[:, 0], index[:, 1]
        written = (offsets != MISSING_CHUNK) | (lengths != MISSING_CHUNK)
        limit = np.uint64(1 << 62)  # no file is this large; larger entries would overflow offset arithmetic
        bad = written & ((offsets >= limit) | (lengths >= limit))
        if bad.any():
            at = int(np.argmax(bad))
            raise ChunkDecodeError(
                f"Array {self.name!r}: shard index of {key!r} is corrupt: inner chunk {at} has offset "
                f"{int(offsets[at])} and length {int(lengths[at])}",
                array=self.name, chunk=key,
            )  # fmt: skip
        return index

    def missing_index(self) -> NDArray[np.uint64]:
        """Shard index of a shard that does not exist: every inner chunk missing."""
        return np.full((math.prod(self.chunks_per_shard), 2), MISSING_CHUNK, dtype=np.uint64)

    def shard_payload_range(self, index: NDArray[np.uint64], inner: int) -> tuple[int, int] | None:
        """Byte range ``(start, stop)`` of inner chunk ``inner``, or ``None`` if it was never written.

        A range past the end of the shard reads short, and the decoder then reports the chunk as
        truncated.
        """
        offset, nbytes = int(index[inner, 0]), int(index[inner, 1])
        if offset == MISSING_CHUNK and nbytes == MISSING_CHUNK:
            return None
        return offset, offset + nbytes

    def decode_block(self, block: int, payloads: list[Any | None], keys: list[str]) -> NDArray[Any]:
        """Assemble row block ``block`` from its inner chunks' payloads (``None`` = never written).

        Returns a new, read-only array of :meth:`block_shape`.
        """
        if self._one_chunk and (block + 1) * self.block_rows <= self.shape[0]:  # a full block: one chunk
            out = np.empty(self.chunk_shape, dtype=self.dtype)
            self._decode_one(payloads[0], keys[0], self.chunk_shape, out)  # straight into the block
            out.flags.writeable = False
            return out
        shape = self.block_shape(block)
        out = np.empty(shape, dtype=self.dtype)
        if self._one_chunk and shape[0] == self.chunk_shape[0]:
            self._decode_one(payloads[0], keys[0], tuple(self.chunk_shape), out)
        else:
            for (coords, _), payload, key in zip(self.chunks_of_block(block), payloads, keys, strict=True):
                chunk = self._decode_one(payload, key, tuple(self.chunk_shape), None)
                dst = tuple(
                    slice(c * n, min((c + 1) * n, s))
                    for c, n, s in zip(coords[1:], self.chunk_shape[1:], self.shape[1:], strict=True)
                )
                src = (slice(0, shape[0]), *(slice(0, d.stop - d.start) for d in dst))
                out[(slice(None), *dst)] = chunk[src]
        out.flags.writeable = False
        return out

    def decode_block_into(self, block: int, payload: Any | None, key: str, out: NDArray[Any]) -> NDArray[Any]:
        """Decode full row block ``block``, one chunk (:attr:`one_chunk_blocks`), straight into ``out``.

        ``out`` is C-contiguous, of the block's shape and :attr:`dtype` (rows of a window's output); it is
        returned. Raises as :meth:`decode_block` does.
        """
        if not self._one_chunk or out.shape != tuple(self.chunk_shape) or (block + 1) * self.block_rows > self.shape[0]:
            raise ConfigError(f"Array {self.name!r}: block {block} is not one full chunk of shape {self.chunk_shape}")
        return self._decode_one(payload, key, self.chunk_shape, out)

    def _decode_one(
        self, payload: Any | None, key: str, shape: tuple[int, ...], out: NDArray[Any] | None
    ) -> NDArray[Any]:
        if payload is None:
            if self.complete:
                raise ChunkDecodeError(
                    f"Array {self.name!r}: chunk {key!r} is missing, but the store promises that every chunk "
                    f"was written (a deleted or lost file); it would read as the fill value {np.asarray(self.fill_value).item()!r}",
                    array=self.name, chunk=key,
                )  # fmt: skip
            if out is None:
                return np.full(shape, self.fill_value, dtype=self.dtype)
            out[...] = self.fill_value
            return out
        try:
            return self._chain.decode(payload, shape, out)
        except Exception as err:  # numcodecs raises several types; all mean corrupt or truncated bytes
            raise ChunkDecodeError(
                f"Array {self.name!r}: chunk {key!r} could not be decoded: {err}", array=self.name, chunk=key
            ) from err
