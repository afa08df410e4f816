"""store/read/cache.py: a byte-bounded LRU of decoded blocks with counters."""

from __future__ import annotations

import numpy as np
import pytest

from dali_alchemi.store.read.cache import BlockCache, CacheStats


def _block(nbytes: int, fill: int = 0) -> np.ndarray:
    return np.full(nbytes, fill, dtype=np.uint8)


def test_get_counts_hits_and_misses_and_returns_the_block() -> None:
    cache = BlockCache(1000)
    cache.put(("a", 0), _block(100, 1))
    got = cache.get(("a", 0))
    assert got is not None and got.nbytes == 100 and got[0] == 1
    assert cache.get(("a", 1)) is None
    assert cache.get(("b", 0)) is None
    assert cache.stats == CacheStats(hits=1, misses=2, evictions=0, nbytes=100, entries=1)


def test_least_recently_used_blocks_are_evicted_first_to_stay_in_budget() -> None:
    cache = BlockCache(300)
    for block in range(3):
        cache.put(("a", block), _block(100, block))
    assert cache.get(("a", 0)) is not None  # 0 is now the most recently used; 1 the least
    cache.put(("a", 3), _block(100, 3))
    assert cache.peek(("a", 1)) is None
    assert [cache.peek(("a", b)) is not None for b in (0, 2, 3)] == [True, True, True]
    cache.put(("b", 0), _block(250))  # needs room for 250 of 300 bytes: evicts 2, 0 and 3 in that order
    assert [cache.peek(("a", b)) for b in (0, 2, 3)] == [None, None, None]
    assert cache.stats.evictions == 4
    assert (cache.stats.nbytes, cache.stats.entries) == (250, 1)


def test_peek_changes_neither_recency_nor_counters() -> None:
    cache = BlockCache(200)
    cache.put(("a", 0), _block(100))
    cache.put(("a", 1), _block(100))
    before = CacheStats(**{k: getattr(cache.stats, k) for k in CacheStats.__slots__})
    assert cache.peek(("a", 0)) is not None and cache.peek(("z", 9)) is None
    assert cache.stats == before
    cache.put(("a", 2), _block(100))  # 0 is still the least recently used
    assert cache.peek(("a", 0)) is None and cache.peek(("a", 1)) is not None


def test_replacing_a_key_keeps_one_entry_and_its_new_size() -> None:
    cache = BlockCache(1000)
    cache.put(("a", 0), _block(100))
    cache.put(("a", 0), _block(40, 7))
    assert (cache.stats.nbytes, cache.stats.entries, cache.stats.evictions) == (40, 1, 0)
    got = cache.peek(("a", 0))
    assert got is not None and got.nbytes == 40 and got[0] == 7


def test_blocks_become_read_only_and_oversized_blocks_are_never_kept() -> None:
    cache = BlockCache(100)
    block = _block(60)
    cache.put(("a", 0), block)
    assert not block.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        block[0] = 1
    cache.put(("a", 1), _block(101))
    assert cache.peek(("a", 1)) is None and cache.peek(("a", 0)) is not None  # nothing evicted for it
    assert (cache.stats.nbytes, cache.stats.evictions) == (60, 0)


def test_capacity_zero_keeps_nothing_and_still_counts_misses() -> None:
    cache = BlockCache(0)
    cache.put(("a", 0), _block(1))
    cache.put(("a", 1), np.zeros(0, np.uint8))  # an empty block fits a zero budget
    assert cache.get(("a", 0)) is None
    assert cache.stats.misses == 1 and cache.stats.nbytes == 0
    assert cache.stats.entries == 1


def test_pop_and_clear_drop_entries_but_keep_the_counters() -> None:
    cache = BlockCache(1000)
    for block in range(4):
        cache.put(("a", block), _block(10))
    cache.get(("a", 0))
    cache.get(("a", 9))
    cache.pop(("a", 1))
    cache.pop(("a", 1))  # absent: nothing happens
    assert (cache.stats.nbytes, cache.stats.entries) == (30, 3)
    cache.clear()
    assert cache.stats == CacheStats(hits=1, misses=1, evictions=0, nbytes=0, entries=0)
    assert cache.get(("a", 0)) is None


def test_a_negative_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="cache capacity must be >= 0 bytes, got -1"):
        BlockCache(-1)
