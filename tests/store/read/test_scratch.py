"""Buffers kept between reads: reused by the next read, never shared by two at once, bounded."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dali_alchemi.store.read.scratch import MAX_KEPT_BYTES, ScratchRows


def test_an_array_is_handed_out_with_the_shape_and_dtype_asked_for() -> None:
    with ScratchRows().lend() as buffers:
        rows = buffers.empty("positions", (7, 3), np.dtype(np.float32))
        assert rows.shape == (7, 3) and rows.dtype == np.float32 and rows.flags.c_contiguous
        rows[:] = np.arange(21, dtype=np.float32).reshape(7, 3)  # writable
        assert buffers.empty("energy", (0,), np.dtype(np.float64)).shape == (0,)


def test_the_next_read_reuses_the_memory_of_the_last() -> None:
    scratch = ScratchRows()
    with scratch.lend() as buffers:
        first = buffers.empty("positions", (100, 3), np.dtype(np.float64))
    assert scratch.kept_bytes == 100 * 3 * 8
    with scratch.lend() as buffers:
        smaller = buffers.empty("positions", (50, 3), np.dtype(np.float32))  # fits: the same bytes
        assert np.shares_memory(first, smaller)
        bigger = buffers.empty("positions", (200, 3), np.dtype(np.float64))  # grown
        assert not np.shares_memory(first, bigger)
    assert scratch.kept_bytes == 200 * 3 * 8


def test_reads_at_once_never_share_a_buffer() -> None:
    scratch = ScratchRows()
    with scratch.lend() as one, scratch.lend() as two:
        a = one.empty("positions", (10, 3), np.dtype(np.float64))
        b = two.empty("positions", (10, 3), np.dtype(np.float64))
        assert not np.shares_memory(a, b)
    got: list[np.ndarray] = []
    barrier = threading.Barrier(4)

    def borrow() -> None:
        with scratch.lend() as buffers:
            got.append(buffers.empty("positions", (10, 3), np.dtype(np.float64)))
            barrier.wait(timeout=10)  # all four hold a set at once

    threads = [threading.Thread(target=borrow) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(got) == 4
    assert not any(np.shares_memory(got[i], got[j]) for i in range(4) for j in range(i + 1, 4))


def test_rows_beyond_the_bound_get_a_fresh_array_that_is_not_kept() -> None:
    scratch = ScratchRows(max_kept_bytes=1000)
    with scratch.lend() as buffers:
        small = buffers.empty("energy", (100,), np.dtype(np.float64))  # 800 bytes: kept
        big = buffers.empty("positions", (100, 3), np.dtype(np.float64))  # 2,400 more: over the bound
        assert big.shape == (100, 3) and not np.shares_memory(small, big)
    assert scratch.kept_bytes == 800
    with scratch.lend() as buffers:
        assert not np.shares_memory(big, buffers.empty("positions", (100, 3), np.dtype(np.float64)))
    assert MAX_KEPT_BYTES >= 16 << 20  # a block-order window of 1,024 structures fits


def test_a_set_is_given_back_when_the_read_fails() -> None:
    scratch = ScratchRows()
    with pytest.raises(RuntimeError, match="boom"), scratch.lend() as buffers:
        buffers.empty("positions", (10, 3), np.dtype(np.float64))
        raise RuntimeError("boom")
    assert scratch.kept_bytes == 240
