"""Fetching chunk bytes from a store, many at a time.

A :class:`ByteFetcher` turns a list of :class:`ByteRequest` (a key, optionally a byte range or suffix)
into their payloads in one call, running the requests concurrently. Local directory stores are read
with plain file I/O on a thread pool; every other zarr store (memory, fsspec, object stores) goes
through its asynchronous ``get`` on zarr's event loop, with bounded concurrency. The fetcher knows
nothing about codecs or arrays.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from zarr.abc.store import OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from dali_alchemi.errors import ChunkDecodeError, ConfigError

__all__ = [
    "INLINE_READS",
    "MERGE_BYTES",
    "MERGE_GAP",
    "READ_TASKS",
    "ByteFetcher",
    "ByteRequest",
    "KeptFiles",
    "LocalFetcher",
    "StoreFetcher",
]


INLINE_READS = 2
"""At most this many local reads are done on the calling thread (a pool hand-off costs more)."""

READ_TASKS = 16
"""Local reads of one fetch are split into at most this many tasks on the pool (thousands of small
inner chunks would otherwise cost a task each)."""

MERGE_GAP = 4 << 10
"""Consecutive ranges of one local file at most this many bytes apart are read with one ``pread``."""

MERGE_BYTES = 4 << 20
"""A merged local read spans at most this many bytes."""


@dataclass(frozen=True, slots=True)
class ByteRequest:
    """One object to read: bytes ``[start, stop)`` (``stop=None``: to the end), or its last ``suffix`` bytes."""

    key: str
    start: int = 0
    stop: int | None = None
    suffix: int | None = None


class KeptFiles(Protocol):
    """Descriptors kept open by their owner, by key (``None`` where the file cannot be opened)."""

    def get(self, key: str) -> int | None: ...


class ByteFetcher(Protocol):
    """Reads many objects of one store concurrently; a missing object gives ``None``."""

    def fetch(self, requests: Sequence[ByteRequest]) -> list[Any | None]: ...


def _directory_error(key: str) -> ChunkDecodeError:
    """A directory where a chunk (or shard) file belongs: damage, named with its array and chunk key."""
    array = key.split("/c/")[0] if "/c/" in key else key
    return ChunkDecodeError(
        f"Array {array!r}: chunk {key} is a directory, not a chunk file; the store is damaged there",
        array=array, chunk=key,
    )  # fmt: skip


class LocalFetcher:
    """Reads objects of a local directory store with ``pread`` on a thread pool."""

    def __init__(self, root: Path, executor: Executor) -> None:
        self.root = root
        self._executor = executor

    def _read(self, request: ByteRequest) -> bytes | memoryview | None:
        return self.read([request])[0]

    def read(self, requests: Sequence[ByteRequest], kept: KeptFiles | None = None) -> list[bytes | memoryview | None]:
        """Read requests in order on the calling thread, opening each object once.

        Inner chunks of a shard share a file, and a run of consecutive requests for nearby ranges of
        one file (gaps of at most :data:`MERGE_GAP` bytes, :data:`MERGE_BYTES` in all) is read with one
        ``pread``; its payloads are then ``memoryview`` slices of that read. A range past the end of
        the file reads short (or empty), exactly as a separate read would. ``kept``: files kept open from
        read to read (:class:`~dali_alchemi.store.read.open_files.OpenFiles`), read through and left open.
        """
        out: list[bytes | memoryview | None] = []
        fds: dict[str, int | None] = {}
        try:
            i, n = 0, len(requests)
            while i < n:
                request = requests[i]
                key = request.key
                if key not in fds:
                    try:
                        if kept is None:
                            fds[key] = os.open(os.path.join(self.root, key), os.O_RDONLY)
                        else:
                            fds[key] = kept.get(key)
                    except (FileNotFoundError, NotADirectoryError):
                        fds[key] = None
                    except IsADirectoryError:  # where opening a directory read-only fails
                        fds[key] = None
                        raise _directory_error(key) from None
                    fd_opened = fds[key]
                    if fd_opened is not None and stat.S_ISDIR(os.fstat(fd_opened).st_mode):
                        raise _directory_error(key)
                fd = fds[key]
                i += 1
                if fd is None:
                    out.append(None)
                elif request.suffix is not None:
                    size = os.fstat(fd).st_size
                    start = max(0, size - request.suffix)
                    out.append(os.pread(fd, size - start, start))
                elif request.stop is None:
                    stop = os.fstat(fd).st_size
                    out.append(os.pread(fd, max(0, stop - request.start), request.start))
                else:
                    j, start, stop = i, request.start, request.stop
                    while j < n:  # extend the run while the next range is of this file and close by
                        nxt = requests[j]
                        if (
                            nxt.key != key or nxt.suffix is not None or nxt.stop is None or nxt.start < stop or nxt.stop < nxt.start
                            or nxt.start - stop > MERGE_GAP or nxt.stop - start > MERGE_BYTES
                        ):  # fmt: skip
                            break
                        stop = nxt.stop
                        j += 1
                    if j == i:
                        out.append(os.pread(fd, max(0, stop - start), start))
                        continue
                    whole = memoryview(os.pread(fd, stop - start, start))
                    # Every request of the run has a stop (checked when the run was built).
                    out.extend(whole[r.start - start : max(r.start, r.stop or 0) - start] for r in requests[i - 1 : j])
                    i = j
        finally:
            for fd in fds.values() if kept is None else ():
                if fd is not None:
                    os.close(fd)
        return out

    def fetch(self, requests: Sequence[ByteRequest]) -> list[Any | None]:
        if len(requests) <= INLINE_READS:
            return [self._read(r) for r in requests]
        # Contiguous runs of requests, a few per thread: one task (and one open per file) per run.
        size = max(1, -(-len(requests) // READ_TASKS))
        runs = [requests[i : i + size] for i in range(0, len(requests), size)]
        return [payload for run in self._executor.map(self.read, runs) for payload in run]


class StoreFetcher:
    """Reads objects of any zarr store through its async ``get``, at most ``max_concurrency`` at once."""

    def __init__(self, store: Store, *, max_concurrency: int = 32) -> None:
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.store = store
        self.max_concurrency = max_concurrency

    async def _get_one(self, request: ByteRequest, gate: asyncio.Semaphore) -> Any | None:
        byte_range: Any = None
        if request.suffix is not None:
            byte_range = SuffixByteRequest(request.suffix)
        elif request.stop is not None:
            byte_range = RangeByteRequest(request.start, request.stop)
        elif request.start:
            byte_range = OffsetByteRequest(request.start)
        async with gate:
            buf = await self.store.get(request.key, prototype=default_buffer_prototype(), byte_range=byte_range)
        return None if buf is None else buf.as_numpy_array()

    async def _get_all(self, requests: Sequence[ByteRequest]) -> list[Any | None]:
        gate = asyncio.Semaphore(self.max_concurrency)
        return list(await asyncio.gather(*(self._get_one(r, gate) for r in requests)))

    def fetch(self, requests: Sequence[ByteRequest]) -> list[Any | None]:
        if not requests:
            return []
        return sync(self._get_all(requests))
