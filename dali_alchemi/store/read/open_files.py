"""Files of a local store kept open from one read to the next, each set by the thread that reads them.

A window's raw rows lie in a few shards, most often the ones the last window read (a sequential pass
reads each shard for many windows in a row). Opening and closing each of them once per read cost about
0.1 ms of a 1.3 ms sequential window of 1,024 structures on the 200,000-structure store. Each thread
keeps its own descriptors, so none is ever closed while another thread reads through it; a new store
state (:meth:`OpenFiles.invalidate`) makes every thread close its own and open them afresh at its
next read.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["MAX_OPEN_PER_THREAD", "OpenFiles"]

MAX_OPEN_PER_THREAD = 64
"""Descriptors one thread keeps between reads; past this, it closes them all at the start of its next read."""


class _ThreadFiles:
    """One thread's open files and the store state they were opened in."""

    __slots__ = ("files", "generation")

    def __init__(self, generation: int) -> None:
        self.files: dict[str, int] = {}
        self.generation = generation

    def close(self) -> None:
        for fd in self.files.values():
            os.close(fd)
        self.files.clear()


class OpenFiles:
    """Read-only descriptors of the files under ``root``, by key, kept per thread between reads."""

    def __init__(self, root: Path, max_per_thread: int = MAX_OPEN_PER_THREAD) -> None:
        self.root = root
        self.max_per_thread = max_per_thread
        self._local = threading.local()
        self._all: list[_ThreadFiles] = []  # every thread's set, for close()
        self._lock = threading.Lock()
        self._generation = 0
        self._pid = os.getpid()

    def begin_read(self) -> None:
        """Called by a thread before a read: drops its descriptors of an older state, or too many of them."""
        own = self._own()
        if own.generation != self._generation or len(own.files) > self.max_per_thread:
            own.close()
            own.generation = self._generation

    def get(self, key: str) -> int | None:
        """The open file ``key`` (``None`` where it cannot be opened: the caller's general path says why).

        A file that could not be opened is not remembered: it may be written by the next read.
        """
        own = self._own()
        fd = own.files.get(key)
        if fd is None:
            try:
                fd = own.files[key] = os.open(self.root / key, os.O_RDONLY)
            except OSError:
                return None
        return fd

    def invalidate(self) -> None:
        """A new store state: every thread closes its descriptors at its next :meth:`begin_read`."""
        self._generation += 1

    def close(self) -> None:
        """Close every thread's descriptors (the reader is closing: no read runs)."""
        with self._lock:
            for files in self._all:
                files.close()

    def _own(self) -> _ThreadFiles:
        if self._pid != os.getpid():  # a forked child (one thread): close its copies of the parent's descriptors
            self._lock = threading.Lock()  # the parent's may have been held by one of its threads at the fork
            for files in self._all:
                files.close()
            self._all, self._pid, self._local = [], os.getpid(), threading.local()
        own: _ThreadFiles | None = getattr(self._local, "files", None)
        if own is None:
            own = self._local.files = _ThreadFiles(self._generation)
            with self._lock:
                self._all.append(own)
        return own
