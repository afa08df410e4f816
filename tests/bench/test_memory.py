"""bench/memory.py: the PSS of the process tree counts workers, and shared pages once."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

from dali_alchemi.bench.memory import MB, TreeMemorySampler, children, process_pss, tree_pss
from tests.processes import HANG_S, wait_until

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux /proc")


def _hold(nbytes: int, ready: object, done: object) -> None:
    data = np.ones(nbytes, dtype=np.uint8)  # written: private pages of the child
    ready.set()  # type: ignore[attr-defined]
    done.wait(HANG_S)  # type: ignore[attr-defined]
    del data


def _touch_shared(ready: object, done: object) -> None:
    total = int(_SHARED.sum())  # read only: the parent's pages stay shared (copy on write)
    assert total > 0
    ready.set()  # type: ignore[attr-defined]
    done.wait(HANG_S)  # type: ignore[attr-defined]


_SHARED = np.zeros(0, dtype=np.uint8)


@pytest.mark.timeout(60)
def test_a_childs_private_memory_is_counted_and_shared_pages_once() -> None:
    global _SHARED
    ctx = multiprocessing.get_context("fork")
    before, processes = tree_pss()
    assert before > 0 and processes >= 1 and process_pss(os.getpid()) > 0
    ready, done = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold, args=(64 * MB, ready, done))
    child.start()
    try:
        assert ready.wait(HANG_S)
        assert child.pid in children(os.getpid())
        with_child, count = tree_pss()
        assert count >= processes + 1
        assert process_pss(child.pid) > 60 * MB  # the child's 64 MB are its own
        # and part of the tree, which grows by most of them (the parent's own PSS moves by a few MB
        # between two samples: the collector, pages the fork made shared)
        assert with_child - before > 40 * MB
    finally:
        done.set()
        child.join(20)

    _SHARED = np.ones(128 * MB, dtype=np.uint8)  # touched by the parent before the fork
    own, _ = tree_pss()
    ready, done = ctx.Event(), ctx.Event()
    reader = ctx.Process(target=_touch_shared, args=(ready, done))
    reader.start()
    try:
        assert ready.wait(HANG_S)
        shared, _ = tree_pss()
        rss_sum = sum(_rss(pid) for pid in (os.getpid(), reader.pid))
        assert shared - own < 40 * MB  # the 128 MB are split between the two, not counted twice
        assert rss_sum - own > 100 * MB  # what a sum of RSS would have said
    finally:
        done.set()
        reader.join(20)
        _SHARED = np.zeros(0, dtype=np.uint8)


def _rss(pid: int | None) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def test_the_sampler_keeps_the_start_and_the_peak() -> None:
    with TreeMemorySampler(interval=0.01) as memory:
        block = np.ones(48 * MB, dtype=np.uint8)
        held_from = memory.samples
        assert wait_until(lambda: memory.samples >= held_from + 2), "the sampler thread took no sample"
        del block  # at least one whole sample saw it
    assert memory.start_mb > 0 and memory.peak_processes >= 1
    assert memory.peak_mb - memory.start_mb > 40
    assert memory.samples >= held_from + 3  # and the last one, at the end
