"""Buffers kept from one read to the next, for rows that are read only to be taken from.

A window read as the runs that cover it (:func:`~dali_alchemi.store.read.spans.covering_runs`) holds
about twice its own rows until they are taken to request order, and then lets them go. Fresh arrays of
that size every window are fresh pages: whenever glibc hands the freed memory back to the kernel between
windows, each page is faulted in again on the next (measured on a block-order window of 1,024 structures:
about 1,900 faults and 2 ms of a 9-11 ms window). Kept buffers are faulted in once.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["MAX_KEPT_BYTES", "RowBuffers", "ScratchRows"]

MAX_KEPT_BYTES = 64 << 20
"""Most bytes one set of buffers keeps between reads; rows beyond that get a fresh array each read."""


class RowBuffers:
    """One read's buffers, one per field name; what they hand out is valid until the set is given back."""

    def __init__(self, buffers: dict[str, NDArray[np.uint8]], max_kept_bytes: int) -> None:
        self._buffers = buffers
        self._max_kept_bytes = max_kept_bytes

    def empty(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> NDArray[Any]:
        """An uninitialised ``shape`` array of ``dtype`` in ``name``'s buffer (grown when too small)."""
        nbytes = math.prod(shape) * dtype.itemsize
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < nbytes:
            self._buffers.pop(name, None)
            kept = sum(b.size for b in self._buffers.values())
            if kept + nbytes > self._max_kept_bytes:
                return np.empty(shape, dtype=dtype)
            buffer = self._buffers[name] = np.empty(nbytes, dtype=np.uint8)
        return buffer[:nbytes].view(dtype).reshape(shape)


class ScratchRows:
    """Sets of :class:`RowBuffers` lent to reads and kept between them.

    Thread-safe: each read borrows a set of its own, so reads running at once never share a buffer. A
    borrower must copy out what it returns before the set goes back (:meth:`lend` ends).
    """

    def __init__(self, max_kept_bytes: int = MAX_KEPT_BYTES) -> None:
        self.max_kept_bytes = max_kept_bytes
        self._free: list[dict[str, NDArray[np.uint8]]] = []
        self._lock = threading.Lock()

    @contextmanager
    def lend(self) -> Iterator[RowBuffers]:
        """A set of buffers for the ``with`` block, given back (and kept) when it ends."""
        with self._lock:
            buffers = self._free.pop() if self._free else {}
        try:
            yield RowBuffers(buffers, self.max_kept_bytes)
        finally:
            with self._lock:
                self._free.append(buffers)

    @property
    def kept_bytes(self) -> int:
        """Bytes held in the sets not lent out now."""
        with self._lock:
            return sum(b.size for buffers in self._free for b in buffers.values())
