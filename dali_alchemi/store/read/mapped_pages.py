"""How much of a big shared pointer copy one reading process keeps mapped.

A :mod:`~dali_alchemi.store.read.shared_pointers` copy is mapped read-only by every rank of a machine.
On a store far bigger than memory's share of one process, shuffled reads would in time map every page
of it into each rank; :class:`MappedPages` lets go of them every :data:`MAPPED_BYTES` or so.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["FAULT_BYTES", "MAPPED_BYTES", "MappedPages"]


MAPPED_BYTES = 64 << 20
"""Bytes of a big shared pointer copy a reading process keeps mapped, about (see :class:`MappedPages`)."""

FAULT_BYTES = 64 << 10
"""What one page fault on a mapped file maps at most: the page and its neighbours (Linux's fault-around)."""


class MappedPages:
    """Keeps the pages a process has mapped of big shared pointer copies near :data:`MAPPED_BYTES`.

    Each structure read looks up two pointer entries; on a copy far bigger than memory's share of one
    process (1.87 GB at 110 M structures) shuffled reads soon map every page of it, each fault mapping
    :data:`FAULT_BYTES`. Every page then counts in the process's PSS, and wholly so once the other
    processes that shared it (the other ranks) are done. After reads that may have mapped
    :data:`MAPPED_BYTES`, the pages are unmapped (``MADV_DONTNEED``; the copy keeps them, the next read
    faults them back in). Copies of at most :data:`MAPPED_BYTES` stay mapped.
    """

    def __init__(self) -> None:
        self._faults = 0

    def read(self, arrays: Iterable[NDArray[Any] | None], structures: int) -> None:
        """Count a read of ``structures`` structures through ``arrays``; unmap their big copies' pages when due."""
        self._faults += 2 * structures  # an atoms_ptr and an edges_ptr entry of each
        if self._faults * FAULT_BYTES < MAPPED_BYTES:
            return
        self._faults = 0
        for mapping in _big_mappings(arrays):
            mapping.madvise(mmap.MADV_DONTNEED)


def _big_mappings(arrays: Iterable[NDArray[Any] | None]) -> list[mmap.mmap]:
    """The distinct memory maps of more than :data:`MAPPED_BYTES` that ``arrays`` view."""
    found: dict[int, mmap.mmap] = {}
    for array in arrays:
        base: Any = array
        while isinstance(base, np.ndarray):
            base = base.base
        if isinstance(base, memoryview):
            base = base.obj
        if isinstance(base, mmap.mmap) and not base.closed and len(base) > MAPPED_BYTES:
            found[id(base)] = base
    return list(found.values())
