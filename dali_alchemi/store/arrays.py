"""Creating, extending and truncating zarr arrays along dim 0, with explicit chunks and codecs.

Chunks and shards only ever split dim 0; trailing dims stay whole. Nothing here knows about samples,
levels or pointers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.config import ArrayConfig


def create_array(group: Any, name: str, shape: tuple[int, ...], dtype: np.dtype[Any], cfg: ArrayConfig) -> Any:
    """Create an array chunked (and optionally sharded) along dim 0 only, with explicit codecs."""
    trailing = tuple(max(1, int(s)) for s in shape[1:])
    row_bytes = max(1, math.prod(trailing)) * dtype.itemsize
    chunks = (cfg.rows_per_chunk(row_bytes), *trailing)
    shards = (cfg.shard_size, *trailing) if cfg.shard_size is not None else None
    return group.create_array(
        name,
        shape=shape,
        dtype=dtype,
        chunks=chunks,
        shards=shards,
        compressors=cfg.compressors or None,
        fill_value=False if dtype == np.bool_ else 0,
    )


def write_array(group: Any, name: str, data: NDArray[Any], cfg: ArrayConfig) -> Any:
    """Create ``name`` in ``group`` (see :func:`create_array`) and fill it with ``data``."""
    arr = create_array(group, name, tuple(data.shape), data.dtype, cfg)
    if data.size:
        arr[...] = data
    return arr


def extend_array(arr: Any, values: NDArray[Any], start: int) -> None:
    """Resize ``arr`` to ``start + len(values)`` rows and write ``values`` there."""
    new_len = start + values.shape[0]
    arr.resize((new_len, *arr.shape[1:]))
    if values.shape[0]:
        arr[start:new_len] = values


def truncate_array(arr: Any, rows: int) -> None:
    """Shrink ``arr`` to its first ``rows`` rows (a no-op when it is not longer)."""
    if arr.shape[0] > rows:
        arr.resize((rows, *arr.shape[1:]))
