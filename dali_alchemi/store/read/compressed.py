"""A window's rows as the compressed chunks that hold them, for decoding on the GPU.

DALI's nvCOMP inflate (``fn.decoders.inflate``, ``algorithm="LZ4"``) decodes raw LZ4 blocks on the
device. An array stored as numcodecs LZ4 (:attr:`~dali_alchemi.store.read.codecs.ArrayCodec.inflatable`:
the ``"inflate"`` layout) holds one such block per chunk, after a 4-byte decoded size and before the
optional crc32c; the ``"inflate"`` layout byte-shuffles each chunk by element first (numcodecs'
``shuffle``), which makes LZ4 keep what blosc keeps. So a window's rows of that array need no decoding on
the host: the chunks that hold them are fetched, checked (crc32c, decoded size) and cut down to their
blocks, and the window carries the blocks, their sizes and, per wanted row, where that row lies in the
inflated chunks. The GPU then inflates every chunk to its bytes, undoes the shuffle with one transpose
and takes the rows with one gather (:func:`inflated_rows`).

Each chunk the window touches is sent once, whatever the number of its rows the window wants; a chunk
never written is sent as the compressed fill chunk (or refused, when the store promises every chunk).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numcodecs
import numcodecs.lz4
import numpy as np

from dali_alchemi.csr import concat_aranges
from dali_alchemi.errors import ChunkDecodeError, ConfigError
from dali_alchemi.store.format.protocol import InflatedChunks
from dali_alchemi.store.read.block_reads import fetch_blocks
from dali_alchemi.store.read.codecs import LZ4_HEADER, checked_crc32c

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.codecs import ArrayCodec
    from dali_alchemi.store.read.fetch import ByteFetcher
    from dali_alchemi.store.read.snapshot import Snapshot
    from dali_alchemi.types import IndexArray, Level

__all__ = [
    "MAX_BLOCK_BYTES", "CompressedRows", "CompressedWindow", "KeptBlocks", "compressed_rows",
    "compressed_window", "inflatable_chunks", "inflate_reference", "inflated_rows",
]  # fmt: skip


MAX_BLOCK_BYTES = (1 << 31) - 1
"""Most bytes of one compressed chunk: DALI's inflate takes each chunk's size as int32 (offsets are int64)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompressedRows(InflatedChunks):
    """The rows a window wants of one array, as the raw LZ4 blocks of the chunks holding them.

    Attributes
    ----------
    name, level
        The array and its level.
    blocks
        ``[bytes]`` uint8: every chunk's raw LZ4 block, one after the other (never empty: a window
        that wants no row of the array still carries its first chunk, since DALI refuses an empty input).
    sizes
        ``[chunks]`` int32: the bytes of each block in ``blocks``.
    rows
        ``[rows]`` int64: for each wanted row, in the window's order, its row in the inflated chunks
        seen as one ``[chunks * chunk_rows, *trailing]`` array.
    """

    name: str
    level: Level
    blocks: NDArray[np.uint8]
    sizes: NDArray[np.int32]
    rows: NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class CompressedWindow:
    """A window's compressed rows of each array, and each structure's first atom row in the store (what
    makes the store-global atom indices of ``neighbor_list`` sample-local once inflated)."""

    parts: dict[str, CompressedRows]
    atom_starts: NDArray[np.int64]


def inflatable_chunks(codec: ArrayCodec | None) -> InflatedChunks | None:
    """How an array the GPU route inflates is chunked; ``None`` for an array it leaves to the host.

    It takes arrays with rows and row bytes, stored as LZ4 blocks that end in a crc32c checksum: DALI does
    not check nvCOMP's status per chunk, so a corrupt block would inflate to zeros on the device; the
    host checks every block's checksum before it is sent instead.
    """
    if codec is None or not codec.inflatable or not codec.chunk_checksum or not codec.shape or codec.shape[0] == 0:
        return None
    if codec.row_nbytes == 0:  # a zero-size trailing dim: nothing to inflate
        return None
    return InflatedChunks(chunk_shape=tuple(codec.chunk_shape), dtype=codec.dtype, shuffle=codec.byte_shuffle)


class KeptBlocks:
    """Raw LZ4 blocks already fetched and checked, kept up to ``budget`` bytes: a later window that touches
    their chunks takes them from memory, not from the store, and does not check them again.

    Blocks are kept as they are first read, until the budget is spent; nothing is evicted. The engine
    that owns them drops them when it reads another state of the store.
    """

    def __init__(self, budget: int) -> None:
        self.budget = max(0, int(budget))
        self.used = 0
        self._blocks: dict[tuple[str, int], NDArray[np.uint8]] = {}

    def get(self, name: str, block: int) -> NDArray[np.uint8] | None:
        return self._blocks.get((name, block))

    def keep(self, name: str, block: int, data: NDArray[np.uint8]) -> None:
        """Keep a copy of ``data`` (never a view of a larger read buffer) while the budget allows."""
        if self.used + data.nbytes <= self.budget:
            self._blocks[(name, block)] = data.copy()
            self.used += data.nbytes

    def clear(self) -> None:
        self._blocks.clear()
        self.used = 0


def compressed_rows(
    codec: ArrayCodec,
    level: Level,
    rows: NDArray[np.int64],
    fetcher: ByteFetcher,
    shard_indexes: dict[tuple[str, str], NDArray[np.uint64]],
    kept: KeptBlocks | None = None,
) -> CompressedRows:
    """The chunks of ``codec``'s array holding ``rows`` (store rows, in the window's order), checked and cut.

    ``shard_indexes`` caches the shard indexes already read (shared with the reader's engine); ``kept``
    holds blocks already read and checked, and keeps the ones read here while its budget allows.

    Raises
    ------
    ConfigError
        If the array is not stored as LZ4 blocks DALI can inflate, or is empty.
    ChunkDecodeError
        If a chunk fails its checksum, says it decodes to another size than a chunk, or is missing from
        a store that promises every chunk.
    """
    if not codec.inflatable:
        raise ConfigError(
            f"Array {codec.name!r} is stored as {codec.codec_name}, not as numcodecs LZ4 blocks of whole rows: "
            "DALI cannot inflate it (rewrite the store with layout='inflate')"
        )
    if not codec.shape or codec.shape[0] == 0:
        raise ConfigError(f"Array {codec.name!r} has no rows: there is no chunk to inflate")
    block_rows = codec.block_rows
    wanted = rows // block_rows
    touched = np.zeros(codec.n_blocks, dtype=np.bool_)  # one pass, no sort: a window holds ~10^6 edge rows
    touched[wanted] = True
    touched[0] |= not touched.any()  # DALI refuses an empty input sample: then send the first chunk
    chunks = np.flatnonzero(touched)
    position = np.cumsum(touched, dtype=np.int64) - 1  # a touched chunk's place among those sent
    gather = position[wanted] * block_rows + rows % block_rows
    wanted_blocks = chunks.tolist()
    cut: list[NDArray[np.uint8] | None] = [None if kept is None else kept.get(codec.name, b) for b in wanted_blocks]
    missing = [i for i, block in enumerate(cut) if block is None]
    if missing:
        payloads, _ = fetch_blocks(fetcher, [(codec, wanted_blocks[i]) for i in missing], shard_indexes)
        chunk_bytes = int(np.prod(codec.chunk_shape)) * codec.dtype.itemsize
        for i, (parts, keys) in zip(missing, payloads, strict=True):
            cut[i] = block = _block_of(codec, parts[0], keys[0], chunk_bytes, codec.chunk_checksum)
            if kept is not None and parts[0] is not None:
                kept.keep(codec.name, wanted_blocks[i], block)
    blocks = [block for block in cut if block is not None]
    assert len(blocks) == len(cut)  # every entry kept or just read
    sizes = np.fromiter((b.size for b in blocks), dtype=np.int64, count=len(blocks))
    if sizes.size and int(sizes.max()) > MAX_BLOCK_BYTES:
        raise ConfigError(
            f"Array {codec.name!r}: a chunk of {int(sizes.max())} compressed bytes is more than DALI's inflate takes "
            f"({MAX_BLOCK_BYTES}); rewrite the store with smaller chunks"
        )
    return CompressedRows(
        name=codec.name,
        level=level,
        blocks=np.concatenate(blocks),
        sizes=sizes.astype(np.int32),
        rows=gather,
        chunk_shape=tuple(codec.chunk_shape),
        dtype=codec.dtype,
        shuffle=codec.byte_shuffle,
    )


def compressed_window(
    snapshot: Snapshot,
    physical: IndexArray,
    names: tuple[str, ...],
    fetcher: ByteFetcher,
    shard_indexes: dict[tuple[str, str], NDArray[np.uint64]],
    kept: KeptBlocks | None = None,
) -> CompressedWindow:
    """:func:`compressed_rows` of arrays ``names`` for the samples ``physical`` (store rows, request order)."""
    starts = {"atom": snapshot.atoms_ptr, "edge": snapshot.edges_ptr}
    rows: dict[str, NDArray[np.int64]] = {"system": np.asarray(physical, dtype=np.int64)}
    out: dict[str, CompressedRows] = {}
    for name in names:
        handle = snapshot.handles[name]
        if handle.codec is None:
            raise ConfigError(f"Array {name!r} is read through zarr here: DALI cannot inflate it")
        if handle.level not in rows:
            ptr = starts[handle.level]
            rows[handle.level] = concat_aranges(ptr[physical], ptr[physical + 1] - ptr[physical])
        out[name] = compressed_rows(handle.codec, handle.level, rows[handle.level], fetcher, shard_indexes, kept)
    return CompressedWindow(parts=out, atom_starts=snapshot.atoms_ptr[physical])


def _block_of(codec: ArrayCodec, payload: Any | None, key: str, chunk_bytes: int, checksum: bool) -> NDArray[np.uint8]:
    """One chunk's raw LZ4 block, after its checksum and decoded size were checked."""
    if payload is None:
        if codec.complete:
            raise ChunkDecodeError(
                f"Array {codec.name!r}: chunk {key!r} is missing, but the store promises that every chunk "
                "was written (a deleted or lost file)",
                array=codec.name, chunk=key,
            )  # fmt: skip
        return _fill_block(codec)
    try:
        raw = checked_crc32c(payload) if checksum else np.frombuffer(payload, dtype=np.uint8)
    except ChunkDecodeError as err:
        raise ChunkDecodeError(
            f"Array {codec.name!r}: chunk {key!r} could not be decoded: {err}", array=codec.name, chunk=key
        ) from err
    found = int(raw[: LZ4_HEADER.size].view("<u4")[0]) if raw.size >= LZ4_HEADER.size else None
    if raw.size <= LZ4_HEADER.size or found != chunk_bytes:
        raise ChunkDecodeError(
            f"Array {codec.name!r}: chunk {key!r} could not be decoded: its lz4 header says {found} bytes, "
            f"expected {chunk_bytes} (one chunk of shape {tuple(codec.chunk_shape)})",
            array=codec.name, chunk=key,
        )  # fmt: skip
    return raw[LZ4_HEADER.size :]


_FILL_BLOCKS: dict[tuple[Any, ...], NDArray[np.uint8]] = {}


def _fill_block(codec: ArrayCodec) -> NDArray[np.uint8]:
    """The raw LZ4 block of a chunk at the fill value (what a chunk never written reads as), made once."""
    fill = np.asarray(codec.fill_value).item()
    key = (tuple(codec.chunk_shape), codec.dtype.str, fill, codec.byte_shuffle)
    block = _FILL_BLOCKS.get(key)
    if block is None:
        chunk: Any = np.full(codec.chunk_shape, fill, dtype=codec.dtype)
        if codec.byte_shuffle:
            chunk = numcodecs.Shuffle(elementsize=codec.byte_shuffle).encode(chunk)
        block = _FILL_BLOCKS.setdefault(key, np.frombuffer(numcodecs.LZ4().encode(chunk), np.uint8)[LZ4_HEADER.size :])
    return block


def inflate_reference(part: CompressedRows) -> NDArray[np.uint8]:
    """What DALI's inflate makes of ``part`` on the GPU, inflated on the host: ``[chunks, chunk_bytes]`` bytes.

    Each block gets its decoded-size header back and goes through liblz4; this is the CPU stand-in for
    nvCOMP that tests and machines without a GPU use.
    """
    header = LZ4_HEADER.pack(part.chunk_bytes)
    out = np.empty((part.sizes.size, part.chunk_bytes), dtype=np.uint8)
    ends = np.cumsum(part.sizes.astype(np.int64))
    for i, (start, stop) in enumerate(zip((ends - part.sizes).tolist(), ends.tolist(), strict=True)):
        numcodecs.lz4.decompress(header + part.blocks[start:stop].tobytes(), out[i])
    return out


def inflated_rows(inflated: Any, rows: Any, chunks: InflatedChunks, dtype: Any = None) -> Any:
    """The wanted rows of inflated chunks (``[chunks, chunk_bytes]`` uint8, numpy or torch, C-contiguous).

    The byte shuffle is undone with one transpose per window (byte ``k`` of every element was stored
    together), the bytes are viewed as ``dtype`` (torch's for a tensor; default: ``chunks.dtype``) and
    the rows taken with one gather.
    """
    n, shuffle = inflated.shape[0], chunks.shuffle
    if shuffle > 1:
        inflated = inflated.reshape(n, shuffle, -1).swapaxes(1, 2).reshape(n, -1)
    return inflated.view(chunks.dtype if dtype is None else dtype).reshape(-1, *chunks.trailing)[rows]
