"""The read threads and the fetcher that reads on them, rebuilt in a process forked from their owner.

Threads do not survive ``fork`` (DALI's default worker start): a child that inherits a started pool
would wait forever on threads that are not there. So the pool remembers the process that started it
and, asked for its executor in another one, starts fresh threads there (the parent's stay untouched)
and a fresh fetcher to read on them. The fetcher also follows the store's location, which a
defragment may move: :meth:`ReadPool.attach` drops it, and the next ask builds it anew.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from zarr.storage import LocalStore

from dali_alchemi.store.read.fetch import ByteFetcher, LocalFetcher, StoreFetcher

if TYPE_CHECKING:
    from zarr.abc.store import Store

__all__ = ["ReadPool"]


class ReadPool:
    """``num_threads`` threads that fetch and decode blocks, and the fetcher of the attached store.

    ``max_concurrency`` bounds the requests in flight at once to a non-local store.
    """

    def __init__(self, num_threads: int, max_concurrency: int) -> None:
        self.num_threads = num_threads
        self._max_concurrency = max_concurrency
        self._store: Store | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pid = -1
        self._lock = threading.Lock()
        self._fetcher: ByteFetcher | None = None

    @property
    def pid(self) -> int:
        """The process whose threads the pool holds (-1: none started yet)."""
        return self._pid

    def attach(self, store: Store) -> None:
        """Fetch from ``store`` from now on (the threads are kept; the fetcher is rebuilt when next asked)."""
        self._store = store
        self._fetcher = None

    def executor(self) -> ThreadPoolExecutor:
        """This process's thread pool: started on first use, and again in a forked child."""
        with self._lock:
            if self._executor is None or self._pid != os.getpid():
                self._executor = ThreadPoolExecutor(self.num_threads, thread_name_prefix="dali-alchemi-read")
                self._pid = os.getpid()
                self._fetcher = None
            if self._fetcher is None:
                self._fetcher = self._make_fetcher(self._executor)
            return self._executor

    def fetcher(self) -> ByteFetcher:
        """The fetcher for this process and store (built with the thread pool it reads on)."""
        self.executor()
        assert self._fetcher is not None
        return self._fetcher

    def close(self) -> None:
        """Stop this process's threads (a parent's, inherited by a fork, are not ours to stop)."""
        if self._executor is not None and self._pid == os.getpid():
            self._executor.shutdown(wait=True)
        self._executor = None

    def _make_fetcher(self, executor: ThreadPoolExecutor) -> ByteFetcher:
        """Direct file reads for a local directory, the store's own async reads otherwise.

        Chunk keys are paths from the root of the zarr store (a StorePath's prefix included), so a
        local fetcher reads relative to that root, not to the group the reader opened.
        """
        assert self._store is not None, "attach() a store first"
        if isinstance(self._store, LocalStore):
            return LocalFetcher(Path(self._store.root), executor)
        return StoreFetcher(self._store, max_concurrency=self._max_concurrency)
