"""Whether a store's layout suits the way a shuffled loader will read it, and what to do if not.

A random structure of a store far larger than the decoded-chunk cache costs the decode of the whole
row block that holds its rows, for every array read by decoding. With blocks of megabytes (4 MiB
chunks: this project's former default, and what nvalchemi writes) a shuffled epoch decodes each block
hundreds of times, and the block shuffle's buffers hold one span each (batches barely mixed). Rewriting
the store to the default layout (raw float arrays read in place, the others in small chunks) fixes
both; this module says so, once per store and process.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import numpy as np

from dali_alchemi.errors import SlowLayoutWarning

__all__ = ["LARGE_BLOCK_BYTES", "slow_layout_advice", "warn_if_slow_layout"]


LARGE_BLOCK_BYTES = 1 << 20
"""A decoded row block at least this large, in a store larger than the cache, makes random reads slow."""

_warned: set[str] = set()
_warned_lock = threading.Lock()


def slow_layout_advice(reader: Any) -> str | None:
    """Why shuffled reads of ``reader``'s store will be slow and how to fix it, or ``None`` if they will not.

    Only this project's reader (with ``decoded_block_bytes``) is judged; the fields it reads must
    outgrow its cache and some of them be decoded in blocks of :data:`LARGE_BLOCK_BYTES` or more.
    """
    blocks = getattr(reader, "decoded_block_bytes", None)
    if blocks is None or not hasattr(reader, "cache_bytes"):
        return None
    large = {name: size for name, size in blocks().items() if size >= LARGE_BLOCK_BYTES}
    if not large:
        return None
    n_atoms, n_edges = reader.sample_sizes(np.arange(len(reader), dtype=np.int64))
    rows = {"atom": int(n_atoms.sum()), "edge": int(n_edges.sum()), "system": len(reader)}
    specs = reader.field_specs
    decoded = sum(spec.row_nbytes * rows[spec.level] for spec in specs.values())
    cache = int(reader.cache_bytes)
    if decoded <= cache:
        return None
    worst = max(large, key=large.__getitem__)
    return (
        f"this store ({decoded / 2**20:,.0f} MiB decoded) is {decoded / max(cache, 1):,.0f}x the reader's cache "
        f"({cache / 2**20:,.0f} MiB) and {len(large)} of its arrays are decoded in blocks of 1 MiB or more "
        f"({worst!r}: {large[worst] / 2**20:.1f} MiB), so a shuffled epoch decodes each block many times and "
        "block-shuffle batches are barely mixed. Rewrite it once to the default layout, "
        "`dali-alchemi rewrite SRC DST` (measured on a store of 200,000 structures that nvalchemi wrote, "
        "80x a 16 MiB cache: global order about 10x faster, block-shuffle quality 0.02 -> 0.90), "
        "or give the loader a larger cache_bytes."
    )


def warn_if_slow_layout(reader: Any, where: str) -> None:
    """Issue a :class:`~dali_alchemi.errors.SlowLayoutWarning` for ``reader``'s store, once per store and process."""
    advice = slow_layout_advice(reader)
    if advice is None:
        return
    key = str(getattr(reader, "source", id(reader)))
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(f"{where}: {advice}", SlowLayoutWarning, stacklevel=3)
