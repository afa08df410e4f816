"""The byte reads of an array's row blocks: shard indexes loaded once, then one read per stored inner
chunk, as :class:`~dali_alchemi.store.read.fetch.ByteRequest` objects a fetcher serves in one go.

:class:`~dali_alchemi.store.read.codecs.ArrayCodec` knows where each chunk lives; this module turns the
blocks a read wants into the requests, and the fetched bytes into each block's payloads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.store.read.codecs import MISSING_CHUNK, ArrayCodec
from dali_alchemi.store.read.fetch import ByteFetcher, ByteRequest

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["BlockPayloads", "BlockRequests", "block_requests", "fetch_blocks", "load_shard_indexes", "read_blocks"]


BlockPayloads = tuple[list[Any | None], list[str]]
"""What :func:`fetch_blocks` gives per row block: each inner chunk's bytes (``None``: not stored) and key."""

BlockRequests = tuple[list[ByteRequest | None], list[str]]
"""What :func:`block_requests` gives per row block: each inner chunk's read (``None``: not stored) and key."""


def _locations(codec: ArrayCodec, block: int) -> list[tuple[str, int]]:
    """``(object key, inner index)`` of every inner chunk of a row block (one, built directly, when whole-row)."""
    if codec._whole_rows:
        per_shard = codec.chunks_per_shard[0]
        first = block // per_shard if codec.sharded else block
        key = codec._row_keys.get(first)
        if key is None:
            key = codec._row_keys.setdefault(first, codec._key((first, *codec._zeros)))
        return [(key, block % per_shard)]
    return [(loc.key, loc.inner_index) for _, loc in codec.chunks_of_block(block)]


def load_shard_indexes(
    fetcher: ByteFetcher,
    shards: Sequence[tuple[ArrayCodec, str]],
    shard_indexes: dict[tuple[str, str], NDArray[np.uint64]],
) -> None:
    """Fetch, in one batch, and parse the indexes of the ``(array, shard key)`` pairs not in ``shard_indexes``.

    A shard that was never written gets an index of missing inner chunks.

    Raises
    ------
    ChunkDecodeError
        If a shard index is corrupt.
    """
    wanted: dict[tuple[str, str], tuple[ArrayCodec, ByteRequest]] = {}
    for codec, key in shards:
        ikey = (codec.name, key)
        if ikey not in shard_indexes and ikey not in wanted:
            request = (
                ByteRequest(key, suffix=codec.index_nbytes)
                if codec.index_at_end
                else ByteRequest(key, start=0, stop=codec.index_nbytes)
            )
            wanted[ikey] = (codec, request)
    if not wanted:
        return
    raw = fetcher.fetch([request for _, request in wanted.values()])
    for (ikey, (codec, _)), payload in zip(wanted.items(), raw, strict=True):
        shard_indexes[ikey] = codec.missing_index() if payload is None else codec.parse_shard_index(ikey[1], payload)


def block_requests(
    fetcher: ByteFetcher,
    blocks: Sequence[tuple[ArrayCodec, int]],
    shard_indexes: dict[tuple[str, str], NDArray[np.uint64]],
) -> list[BlockRequests]:
    """The reads of every chunk payload of the given row blocks, fetching the shard indexes they need.

    ``shard_indexes`` caches the shard indexes already read, by ``(array name, shard key)``; the
    missing ones are fetched together in one batch and added. Requests of consecutive inner chunks
    of a shard come out as adjacent byte ranges, which a local fetcher reads with one ``pread``.

    Raises
    ------
    ChunkDecodeError
        If a shard index is corrupt.
    """
    locations = [_locations(codec, block) for codec, block in blocks]
    load_shard_indexes(
        fetcher,
        [(codec, key) for (codec, _), locs in zip(blocks, locations, strict=True) if codec.sharded for key, _ in locs],
        shard_indexes,
    )
    # Each shard's index is read once per call for just the inner chunks wanted (one numpy take per
    # shard): converting a whole 1,024-entry index to Python ints per call cost more than the decoding.
    wanted: dict[tuple[str, str], list[int]] = {}
    for (codec, _), locs in zip(blocks, locations, strict=True):
        if codec.sharded:
            for key, inner in locs:
                wanted.setdefault((codec.name, key), []).append(inner)
    entries: dict[tuple[str, str], Iterator[list[int]]] = {
        ikey: iter(shard_indexes[ikey][np.asarray(inners, dtype=np.intp)].tolist()) for ikey, inners in wanted.items()
    }
    result: list[BlockRequests] = []
    for (codec, _), locs in zip(blocks, locations, strict=True):
        keys = [key for key, _ in locs]
        if not codec.sharded:
            result.append(([ByteRequest(key) for key in keys], keys))
            continue
        requests: list[ByteRequest | None] = []
        for key, _ in locs:
            offset, nbytes = next(entries[(codec.name, key)])
            missing = offset == MISSING_CHUNK and nbytes == MISSING_CHUNK
            requests.append(None if missing else ByteRequest(key, offset, offset + nbytes))
        result.append((requests, keys))
    return result


def read_blocks(fetcher: ByteFetcher, wanted: Sequence[BlockRequests]) -> tuple[list[BlockPayloads], int]:
    """Fetch the requests of :func:`block_requests` in one batch: payloads per block, and how many were read."""
    present = [r for requests, _ in wanted for r in requests if r is not None]
    fetched = iter(fetcher.fetch(present))
    result: list[BlockPayloads] = [
        ([None if r is None else next(fetched) for r in requests], keys) for requests, keys in wanted
    ]
    return result, len(present)


def fetch_blocks(
    fetcher: ByteFetcher,
    blocks: Sequence[tuple[ArrayCodec, int]],
    shard_indexes: dict[tuple[str, str], NDArray[np.uint64]],
) -> tuple[list[BlockPayloads], int]:
    """Fetch every chunk payload of the given row blocks in one concurrent batch (two for shards).

    ``shard_indexes`` caches the shard indexes already read (see :func:`block_requests`). Returns the
    payloads per block and the number of chunk payloads fetched.

    Raises
    ------
    ChunkDecodeError
        If a shard index is corrupt.
    """
    return read_blocks(fetcher, block_requests(fetcher, blocks, shard_indexes))
