"""The chunk geometry a reader reports to the plans and the layout advice, from metadata and pointers only.

What one random structure costs per array (the decoded row block that holds its rows), and where spans
of samples aligned with the core per-atom arrays' chunks start (what ``shuffle="block"`` shuffles). Arrays
the engine reads in place (uncompressed, local) decode no block, so they cost no block and cut no span;
which those are is the engine's call, passed in as ``in_place``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from dali_alchemi import csr
from dali_alchemi.store.format import layout
from dali_alchemi.store.read.rows import IN_PLACE_SPAN_SIZE

if TYPE_CHECKING:
    from dali_alchemi.store.read.snapshot import ArrayHandle, Snapshot
    from dali_alchemi.types import IndexArray

__all__ = ["decoded_block_bytes", "sample_chunk_bounds"]


def decoded_block_bytes(
    snapshot: Snapshot, fields: Sequence[str], in_place: Callable[[ArrayHandle], bool]
) -> dict[str, int]:
    """Decoded bytes of one row block of each of ``fields`` that is read by decoding (not in place).

    On a store far larger than the cache, the block that holds a random structure's rows is decoded
    whole: this is what one structure costs per array.
    """
    handles = [snapshot.handles[name] for name in fields]
    return {
        h.name: min(h.codec.block_rows, h.shape[0]) * h.codec.row_nbytes if h.codec is not None else int(h.array.nbytes)
        for h in handles
        if not in_place(h)
    }


def decoded_blocks_per_pass(snapshot: Snapshot, fields: Sequence[str], in_place: Callable[[ArrayHandle], bool]) -> int:
    """Row blocks that one pass over the store decodes: every block of each of ``fields`` read by this
    reader's decoder (not in place, not through zarr)."""
    return sum(h.codec.n_blocks for h in (snapshot.handles[name] for name in fields) if h.codec is not None and not in_place(h))


def sample_chunk_bounds(snapshot: Snapshot, in_place: Callable[[ArrayHandle], bool]) -> IndexArray:
    """``[S + 1]`` logical sample offsets of spans aligned with the core per-atom arrays' chunks.

    A span starts wherever a row block of any core atom-level array does (a sample straddling two
    blocks goes with the first), so reading a span reads one block of each. When every core atom-level
    array is read in place, spans are :data:`~dali_alchemi.store.read.rows.IN_PLACE_SPAN_SIZE`
    structures; with no core atom-level array, every structure is its own span.
    """
    n = snapshot.n_live
    atom_arrays = [
        h
        for name, h in snapshot.handles.items()
        if h.level == "atom" and snapshot.schema.group_of(name) == layout.CORE_GROUP
    ]
    decoded = [h for h in atom_arrays if not in_place(h)]
    rows = {h.codec.block_rows if h.codec is not None else int(h.array.chunks[0]) for h in decoded}
    if atom_arrays and not decoded:
        return np.append(np.arange(0, n, IN_PLACE_SPAN_SIZE, dtype=np.int64), np.int64(n))
    if not rows:  # no per-atom core array: every structure is its own span
        return np.arange(n + 1, dtype=np.int64)
    starts = [csr.block_sample_starts(snapshot.atoms_ptr, r, snapshot.live) for r in sorted(rows)]
    return np.unique(np.concatenate(starts))
