"""A byte-bounded LRU cache of decoded row blocks, shared by every array of one reader.

Later windows of a shuffled epoch touch the same chunks as earlier ones; keeping decoded blocks lets
them skip both the fetch and the decode. Entries are read-only numpy arrays, so a caller cannot
corrupt the cache through a returned view.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dali_alchemi.errors import ConfigError

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["DEFAULT_CACHE_BYTES", "BlockCache", "BlockKey", "CacheStats"]


DEFAULT_CACHE_BYTES = 1 << 30
"""Default decoded-chunk cache: 1 GiB per reader (per worker process when workers are used)."""

BlockKey = tuple[str, int]


@dataclass(slots=True)
class CacheStats:
    """Counters since the cache was created (``clear()`` keeps them; ``nbytes``/``entries`` are current)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    nbytes: int = 0
    entries: int = 0


class BlockCache:
    """LRU of decoded blocks keyed by ``(array name, block index)``, bounded by total bytes.

    A block larger than the whole budget is never kept. ``capacity_bytes=0`` disables caching.
    ``on_evict`` is called with the key of every block the cache lets go (evicted, cleared, or not
    kept at all), after the cache's lock is released; :meth:`pop` does not call it.
    """

    def __init__(
        self, capacity_bytes: int = DEFAULT_CACHE_BYTES, on_evict: Callable[[BlockKey], None] | None = None
    ) -> None:
        if capacity_bytes < 0:
            raise ConfigError(f"cache capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.on_evict = on_evict
        self._entries: OrderedDict[BlockKey, NDArray[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = CacheStats()

    def get(self, key: BlockKey) -> NDArray[Any] | None:
        """The cached block, marked most recently used, or ``None``."""
        with self._lock:
            block = self._entries.get(key)
            if block is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return block

    def peek(self, key: BlockKey) -> NDArray[Any] | None:
        """The cached block, without counting a hit or miss or changing its recency."""
        with self._lock:
            return self._entries.get(key)

    def pop(self, key: BlockKey) -> None:
        """Drop one entry if present."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.stats.nbytes -= int(old.nbytes)
                self.stats.entries = len(self._entries)

    def put(self, key: BlockKey, block: NDArray[Any]) -> None:
        """Insert ``block`` (made read-only) and evict least recently used blocks over the budget."""
        size = int(block.nbytes)
        if size > self.capacity_bytes:
            if self.on_evict is not None:
                self.on_evict(key)
            return
        block.flags.writeable = False
        gone: list[BlockKey] = []
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.stats.nbytes -= int(old.nbytes)
            self._entries[key] = block
            self.stats.nbytes += size
            while self.stats.nbytes > self.capacity_bytes:
                evicted_key, evicted = self._entries.popitem(last=False)
                self.stats.nbytes -= int(evicted.nbytes)
                self.stats.evictions += 1
                gone.append(evicted_key)
            self.stats.entries = len(self._entries)
        if self.on_evict is not None:
            for evicted_key in gone:
                self.on_evict(evicted_key)

    def clear(self) -> None:
        """Drop every entry (counters other than size are kept)."""
        with self._lock:
            gone = list(self._entries)
            self._entries.clear()
            self.stats.nbytes = 0
            self.stats.entries = 0
        if self.on_evict is not None:
            for key in gone:
                self.on_evict(key)
