"""Fetching the chunk payloads of row blocks: shard indexes first, then every payload in one batch.

A row block (:class:`~dali_alchemi.store.codecs.ArrayCodec`) is one or more inner chunks. For an
unsharded array each is a whole stored object; for a sharded one it is a byte range of a shard, found
in the shard's index, which is fetched once and kept by the caller. All requests of one call go to
the :class:`~dali_alchemi.store.fetch.ByteFetcher` together, so a remote store serves them
concurrently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.store.codecs import MISSING_CHUNK
from dali_alchemi.store.fetch import ByteRequest

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.codecs import ArrayCodec
    from dali_alchemi.store.fetch import ByteFetcher

ShardIndexes = dict[tuple[str, str], "NDArray[np.uint64]"]
"""Parsed shard indexes by ``(array name, shard key)``."""


def fetch_block_payloads(
    fetcher: ByteFetcher, blocks: list[tuple[ArrayCodec, int]], shard_indexes: ShardIndexes
) -> tuple[list[tuple[list[Any | None], list[str]]], int]:
    """Every chunk payload of ``blocks`` (``None`` for a chunk never written) with its key, per block.

    Shard indexes missing from ``shard_indexes`` are fetched first, together, and added to it. Returns
    the payloads and the number of payload requests made (shard indexes not counted).
    """
    locations = [codec.chunks_of_block(block) for codec, block in blocks]
    # Sharded arrays: make sure every needed shard index is known, fetching the missing ones together.
    index_requests: dict[tuple[str, str], tuple[ArrayCodec, ByteRequest]] = {}
    for (codec, _), locs in zip(blocks, locations, strict=True):
        if not codec.sharded:
            continue
        for _, loc in locs:
            ikey = (codec.name, loc.key)
            if ikey not in shard_indexes and ikey not in index_requests:
                request = (
                    ByteRequest(loc.key, suffix=codec.index_nbytes)
                    if codec.index_at_end
                    else ByteRequest(loc.key, start=0, stop=codec.index_nbytes)
                )
                index_requests[ikey] = (codec, request)
    if index_requests:
        raw = fetcher.fetch([req for _, req in index_requests.values()])
        for (ikey, (codec, _)), payload in zip(index_requests.items(), raw, strict=True):
            if payload is None:
                shard_indexes[ikey] = _missing_index(codec)
            else:
                shard_indexes[ikey] = codec.parse_shard_index(ikey[1], payload)
    requests: list[ByteRequest | None] = []
    for (codec, _), locs in zip(blocks, locations, strict=True):
        for _, loc in locs:
            if not codec.sharded:
                requests.append(ByteRequest(loc.key))
                continue
            index = shard_indexes[(codec.name, loc.key)]
            span = codec.shard_payload_range(index, loc.inner_index)
            requests.append(None if span is None else ByteRequest(loc.key, start=span[0], stop=span[1]))
    present = [r for r in requests if r is not None]
    fetched = iter(fetcher.fetch(present))
    result: list[tuple[list[Any | None], list[str]]] = []
    wanted = iter(requests)
    for locs in locations:
        chunk_payloads = [None if next(wanted) is None else next(fetched) for _ in locs]
        result.append((chunk_payloads, [loc.key for _, loc in locs]))
    return result, len(present)


def _missing_index(codec: ArrayCodec) -> NDArray[np.uint64]:
    """Shard index of a shard that does not exist: every inner chunk missing (fill value)."""
    n_inner = int(np.prod(codec.chunks_per_shard))
    return np.full((n_inner, 2), MISSING_CHUNK, dtype=np.uint64)
