"""Files of a local store kept open from one read to the next, each set by the thread that reads them.

A window's rows lie in a few shards of each array, most often the ones the last window read (a sequential
pass reads each shard for many windows in a row); the lean reads take both raw rows and compressed chunks
through these files. Opening and closing each of them once per read cost about
0.1 ms of a 1.3-1.5 ms sequential window of 1,024 structures on the 200,000-structure store, and a metadata
round trip per file on a network file system. Each thread keeps its own descriptors, so none is ever
closed while another thread reads through it; a new store state (:meth:`OpenFiles.invalidate`) makes
every thread close its own and open them afresh at its next read.
"""

from __future__ import annotations

import os
import threading
import weakref
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


class _ProcessFiles:
    """Every thread's open files in the process that opened them."""

    __slots__ = ("pid", "sets")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.sets: list[_ThreadFiles] = []

    def close(self) -> None:
        """Close them, in the process that opened them only: a forked child's copies are left alone, for
        their numbers may have been closed and reused there by anyone."""
        if os.getpid() == self.pid:
            for files in self.sets:
                files.close()
        self.sets.clear()


class OpenFiles:
    """Read-only descriptors of the files under ``root``, by key, kept per thread between reads.

    Closed by :meth:`close`, or when the instance is dropped.
    """

    def __init__(self, root: Path, max_per_thread: int = MAX_OPEN_PER_THREAD) -> None:
        self.root = root
        self.max_per_thread = max_per_thread
        self._generation = 0
        self._lock = threading.Lock()
        self._start_process()

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
            self._process.close()

    def _start_process(self) -> None:
        self._local = threading.local()
        self._process = _ProcessFiles()
        weakref.finalize(self, self._process.close)  # a reader dropped without close() leaks no descriptor

    def _own(self) -> _ThreadFiles:
        if self._process.pid != os.getpid():  # a forked child (one thread): start afresh, the parent's set aside
            self._lock = threading.Lock()  # the parent's may have been held by one of its threads at the fork
            self._start_process()
        own: _ThreadFiles | None = getattr(self._local, "files", None)
        if own is None:
            own = self._local.files = _ThreadFiles(self._generation)
            with self._lock:
                self._process.sets.append(own)
        return own
