"""Reading an array whole: each stored object (shard or chunk) with one read, its chunks decoded in place.

An array that fits a quarter of the cache is kept whole ("resident") once reads have touched a quarter
of its blocks (the routes decide, the decoder holds it). Reading it block by block would cost, per
small inner chunk, a job, a cache entry, a scatter and a copy into the stitched array: about 60 µs
each, against 5-10 µs of decoding.
Here each shard object is fetched once and every inner chunk is decoded straight into its rows of
the new array, through the same codec chain (checksums, blosc frame checks, missing chunks) as a
block read, so corrupt or missing chunks raise the same errors. Blocks earlier reads already decoded
(and checked) are copied, not decoded again, so an array goes whole without decoding a chunk twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.store.read.block_reads import load_shard_indexes
from dali_alchemi.store.read.codecs import MISSING_CHUNK
from dali_alchemi.store.read.fetch import ByteRequest

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.codecs import ArrayCodec
    from dali_alchemi.store.read.fetch import ByteFetcher

__all__ = ["read_whole", "reads_whole"]


def reads_whole(codec: ArrayCodec) -> bool:
    """Whether :func:`read_whole` applies: an array whose inner chunks hold whole rows."""
    return codec._one_chunk


def read_whole(
    codec: ArrayCodec,
    fetcher: ByteFetcher,
    shard_indexes: dict[tuple[str, str], NDArray[np.uint64]],
    decoded: Mapping[int, NDArray[Any]] | None = None,
) -> tuple[NDArray[Any], int]:
    """The whole of ``codec``'s array (read-only) and the number of inner chunks read.

    Each stored object (a shard, or a chunk of an unsharded array) is fetched once, all in one batch.
    ``shard_indexes`` caches shard indexes by ``(array name, shard key)``, as for block reads.
    ``decoded`` holds row blocks already decoded, by block number: they are copied in, not decoded.

    Raises
    ------
    ChunkDecodeError
        If a shard index or an inner chunk is corrupt or truncated, or a chunk the store promises is
        missing.
    """
    assert reads_whole(codec), "read_whole needs an array of whole-row inner chunks"
    n_rows, rows, per_object = codec.shape[0], codec.block_rows, codec.chunks_per_shard[0]
    whole = np.empty(codec.shape, dtype=codec.dtype)
    keys = [codec.shard_key(first) for first in range(-(-codec.n_blocks // per_object))]
    if codec.sharded:
        load_shard_indexes(fetcher, [(codec, key) for key in keys], shard_indexes)
    objects = fetcher.fetch([ByteRequest(key) for key in keys])
    read = 0
    for first, (key, data) in enumerate(zip(keys, objects, strict=True)):
        view = None if data is None else memoryview(data)
        entries = shard_indexes[(codec.name, key)].tolist() if codec.sharded else None
        for inner in range(min(per_object, codec.n_blocks - first * per_object)):
            payload: Any = view
            if entries is not None and view is not None:
                offset, nbytes = entries[inner]
                missing = offset == MISSING_CHUNK and nbytes == MISSING_CHUNK
                payload = None if missing else view[offset : offset + nbytes]
            read += payload is not None
            block = first * per_object + inner
            lo = block * rows
            hi = min(lo + rows, n_rows)
            if decoded is not None and block in decoded:
                whole[lo:hi] = decoded[block][: hi - lo]
            elif hi - lo == rows:
                codec._decode_one(payload, key, codec.chunk_shape, whole[lo:hi])
            else:  # the last, partly filled chunk
                whole[lo:hi] = codec._decode_one(payload, key, codec.chunk_shape, None)[: hi - lo]
    whole.flags.writeable = False
    return whole, read
