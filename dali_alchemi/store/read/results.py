"""What the chunk-block engine hands back: a read's rows, and the counters of every read so far."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from dali_alchemi.store.read.cache import CacheStats
    from dali_alchemi.types import CountArray

__all__ = ["ReadStats", "RowsRead"]


@dataclass(frozen=True, slots=True)
class ReadStats:
    """Counters for tests and benchmarks: packed reads, chunk payloads fetched, cache behaviour."""

    packed_reads: int
    samples_read: int
    chunks_fetched: int
    blocks_decoded: int
    cache: CacheStats
    files_read: int = 0
    """Files whose rows were read in place (uncompressed arrays of a local store), counted once per read."""
    files_mapped: int = 0
    """Of those, the ones whose rows were too scattered for a read per cluster, and were mapped instead."""


@dataclass(frozen=True, slots=True)
class RowsRead:
    """What :meth:`BlockEngine.read` returns: one flat array per field, and per-sample row counts."""

    fields: dict[str, NDArray[Any]]
    n_atoms: CountArray
    n_edges: CountArray
    atom_starts: NDArray[np.int64]
    """Each sample's first atom row in the store (what re-bases its atom indices)."""
