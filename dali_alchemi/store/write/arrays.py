"""Creating, extending and truncating zarr arrays along dim 0, with explicit chunks and codecs.

Chunks and shards only ever split dim 0; trailing dims stay whole. Every chunk is written, even one
that holds only the fill value (zarr would otherwise leave it implicit, and a chunk deleted by damage
would then read back as zeros undetected); :func:`complete` gives an opened array that behaviour.
Nothing here knows about samples, levels or pointers.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.store.format import layout

if TYPE_CHECKING:
    from collections.abc import Iterable

    from numpy.typing import NDArray

    from dali_alchemi.config import ArrayConfig

__all__ = [
    "WRITE_EVERY_CHUNK", "complete", "create_array", "extend_array", "promise", "truncate_array",
    "write_array"
]


def create_array(group: Any, name: str, shape: tuple[int, ...], dtype: np.dtype[Any], cfg: ArrayConfig) -> Any:
    """Create an array chunked (and optionally sharded) along dim 0 only, with explicit codecs."""
    trailing = tuple(max(1, int(s)) for s in shape[1:])
    row_bytes = max(1, math.prod(trailing)) * dtype.itemsize
    chunks = (cfg.rows_per_chunk(row_bytes), *trailing)
    shards = (cfg.shard_size, *trailing) if cfg.shard_size is not None else None
    with warnings.catch_warnings():  # the "inflate" layout's numcodecs codecs are outside the zarr v3 spec, knowingly
        warnings.filterwarnings("ignore", message="Numcodecs codecs are not in the Zarr version 3 specification")
        return group.create_array(
            name,
            shape=shape,
            dtype=dtype,
            chunks=chunks,
            shards=shards,
            compressors=cfg.codecs or None,
            fill_value=False if dtype == np.bool_ else 0,
            config=WRITE_EVERY_CHUNK,
        )


WRITE_EVERY_CHUNK = {"write_empty_chunks": True}
"""zarr runtime config of every array the writer writes to: no chunk is left implicit."""


def promise(configs: Iterable[ArrayConfig]) -> layout.Integrity:
    """What a store whose every array was created here with ``configs`` promises: every chunk written,
    and crc32c checksums when every one of those configs has ``checksum`` on."""
    checked = all(cfg.checksum for cfg in configs)
    return layout.Integrity(complete_chunks=True, checksums=layout.CHECKSUM_CRC32C if checked else None)


def complete(arr: Any) -> Any:
    """``arr`` (an opened zarr array) set to write every chunk it touches, fill-valued ones included."""
    return arr.with_config(WRITE_EVERY_CHUNK)


def write_array(group: Any, name: str, data: NDArray[Any], cfg: ArrayConfig) -> Any:
    """Create ``name`` in ``group`` (see :func:`create_array`) and fill it with ``data``."""
    arr = create_array(group, name, tuple(data.shape), data.dtype, cfg)
    if data.size:
        arr[...] = data
    return arr


def extend_array(arr: Any, values: NDArray[Any], start: int) -> None:
    """Resize ``arr`` to ``start + len(values)`` rows and write ``values`` there (every chunk written)."""
    new_len = start + values.shape[0]
    arr.resize((new_len, *arr.shape[1:]))
    if values.shape[0]:
        complete(arr)[start:new_len] = values


def truncate_array(arr: Any, rows: int) -> None:
    """Shrink ``arr`` to its first ``rows`` rows (a no-op when it is not longer)."""
    if arr.shape[0] > rows:
        arr.resize((rows, *arr.shape[1:]))
