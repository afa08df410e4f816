"""Decoded pointers and masks kept once per machine, as read-only maps of a file in a shared-memory folder.

Every process that opens a store needs its ``atoms_ptr``, ``edges_ptr`` and ``samples_mask`` decoded
(17 bytes per structure: 1.9 GB at 110 M), and, when samples are deleted, the physical index of
each live one (8 bytes more each). Eight ranks of one machine sharding one store held eight copies.
A :class:`SharedPointers` folder (on ``/dev/shm``) holds one decoded copy per state of a store; the
first process to open that state decodes it chunk by chunk straight into the file (no second copy in
its memory), the others map the file read-only, so its pages count once in the processes'
proportional memory (PSS), and a later open maps it in milliseconds.

Protocol, as for :mod:`~dali_alchemi.store.read.shared` blocks:

- a copy is the file ``STORE-STATE.ptrs``: ``STORE`` names the store's path, ``STATE`` its content
  (:func:`content_key`); it is written beside (``.PID.tmp``) and renamed in, so it is whole or absent;
- it ends in a table of the crc32c of every :data:`~dali_alchemi.store.read.pointers.SEGMENT_ROWS`
  entries of each array, the key it was built for and a checksum of both; every process checks the
  whole file against the table when it maps it, and a copy that fails is removed (logged) and built
  again from the store, never used;
- a process about to build one creates ``STORE-STATE.ptrs.claim`` exclusively (``O_EXCL``) holding its
  pid; the others wait for the file; a claim whose process is gone, or a wait past ``wait_s``, ends the
  wait and the waiter builds the copy itself;
- publishing a state removes the copies of the store's other states (processes that map them keep
  their pages until they let them go), so the folder holds one copy per store path.

The key covers the meta arrays' ``zarr.json``, the identity of every file of theirs (device, inode,
size, modification and change times) and how the journal says to read them. A file changed in the
last :data:`RACY_S` seconds could change again without its times moving (their resolution is a clock
tick), so its bytes are hashed into the key too. A store written again at the same path, deleted from
by another tool or moved in by a defragment thus gets another key, and no process maps pointers of a
state that is not the store's. Only local stores are shared this way; other stores are read into
each process's memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import stat
import struct
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np
from zarr.storage import LocalStore

from dali_alchemi.errors import StoreFormatError
from dali_alchemi.store.format import layout
from dali_alchemi.store.read import pointers
from dali_alchemi.store.read.host import pid_alive, shared_memory_root
from dali_alchemi.store.read.pointers import META_ORDER, READ_ROWS, SegmentCrcs

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.format.journal import ReadView
    from dali_alchemi.store.read.pointers import MetaSink

__all__ = [
    "MIN_SAMPLES", "POLL_S", "RACY_S", "WAIT_S", "PointerCopy", "PointersChanged", "SharedPointers",
    "content_key", "default_folder", "pointer_folder", "store_id",
]  # fmt: skip


logger = logging.getLogger(__name__)

MIN_SAMPLES = 1 << 20
"""Physical samples from which a reader shares its pointers by default (17 MB of them)."""

RACY_S = 2.0
"""A file changed less than this long ago has its bytes hashed into the key, not only its times."""

WAIT_S = 120.0
"""Longest wait for a copy another process is building before building it here."""

POLL_S = 0.005
"""Interval between looks for a copy another process is building."""

_FOOTER = struct.Struct("<8sqqqq16sI")
"""magic, samples, live samples (-1: none deleted), segment rows, table entries, key, crc32c of table and footer."""
_MAGIC = b"daptr001"
_ACTIVE = "active"


class PointersChanged(StoreFormatError):
    """The meta arrays changed while a copy of them was built: the open reads the store again."""


class _Unusable(OSError):
    """The folder could not take a copy (full, read-only, not ours): the pointers are read privately."""


@dataclass(frozen=True, slots=True)
class PointerCopy:
    """One state's decoded meta arrays, mapped read-only from a shared copy, and their segment checksums."""

    arrays: Mapping[str, NDArray[Any]]
    """``atoms_ptr``, ``edges_ptr``, ``samples_mask`` and, when samples are deleted, ``active``."""
    crcs: Mapping[str, NDArray[np.uint32]]
    path: Path


def default_folder() -> Path | None:
    """This user's folder of shared pointer copies on ``/dev/shm`` (made when first used); ``None`` without ``/dev/shm``."""
    root = shared_memory_root()
    return None if root is None else Path(root) / f"dali-alchemi-pointers-{os.getuid()}"


def _usable(folder: Path) -> None:
    """Make ``folder`` if needed and check that it is a folder of this user's (never trust one another user made)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError as err:
        raise _Unusable(f"cannot use {folder}: {err}") from err
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise _Unusable(f"{folder} is not a folder of this user's")


def pointer_folder(option: bool | str | os.PathLike[str] | None) -> SharedPointers | None:
    """What a reader's ``shared_pointers`` option means: ``None`` (the default) shares the pointers of
    local stores of :data:`MIN_SAMPLES` samples or more through :func:`default_folder`; ``True`` those of
    every local store; a folder, those of every local store through that folder; ``False``, none."""
    if option is False:
        return None
    if option is None or option is True:
        folder = default_folder()
        if folder is None:
            return None
        return SharedPointers(folder, min_samples=MIN_SAMPLES if option is None else 0)
    return SharedPointers(option, min_samples=0)


def _offsets(n: int) -> dict[str, int]:
    atoms = 0
    edges = 8 * (n + 1)
    mask = 16 * (n + 1)
    active = mask + -(-n // 8) * 8
    return {layout.ATOMS_PTR: atoms, layout.EDGES_PTR: edges, layout.SAMPLES_MASK: mask, _ACTIVE: active}


class _CopyWriter:
    """A :class:`~dali_alchemi.store.read.pointers.MetaSink` writing one copy file with ``pwrite`` (a full folder
    is an ``OSError``, never a fault in a mapping), each piece on a thread while the next is decoded (at most
    one in flight; a failed write raises at the next piece or at :meth:`finish`)."""

    def __init__(self, path: Path, n: int) -> None:
        self.path, self.n = path, n
        self.fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        self.offsets = _offsets(n)
        self.crcs = {name: SegmentCrcs() for name in (*META_ORDER, _ACTIVE)}
        self.live, self.any_deleted = 0, False
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="dali-alchemi-pointer-copy")
        self._in_flight: Future[None] | None = None

    def _write(self, offset: int, values: NDArray[Any]) -> None:
        self._wait()
        self._in_flight = self._writer.submit(self._pwrite, np.ascontiguousarray(values).reshape(-1).view(np.uint8).data, offset)

    def _pwrite(self, view: memoryview, offset: int) -> None:
        while view.nbytes:
            written = os.pwrite(self.fd, view, offset)
            view, offset = view[written:], offset + written

    def _wait(self) -> None:
        pending, self._in_flight = self._in_flight, None
        if pending is not None:
            pending.result()  # the write's error, if any

    def mask(self, start: int, values: NDArray[np.bool_]) -> None:
        self._write(self.offsets[layout.SAMPLES_MASK] + start, values)
        self.crcs[layout.SAMPLES_MASK].update(values)
        live_count = int(np.count_nonzero(values))  # an index of the live samples only once one is deleted
        if not self.any_deleted and live_count < values.size:
            self.any_deleted = True  # the samples before this piece were all live: their physical index is their own
            self.live = 0
            for lo in range(0, start, READ_ROWS):
                self._active(np.arange(lo, min(lo + READ_ROWS, start), dtype=np.int64))
        if self.any_deleted:
            self._active(np.flatnonzero(values).astype(np.int64) + start)
        else:
            self.live += live_count

    def _active(self, physical: NDArray[np.int64]) -> None:
        self._write(self.offsets[_ACTIVE] + 8 * self.live, physical)
        self.crcs[_ACTIVE].update(physical)
        self.live += physical.size

    def pointer(self, name: str, start: int, values: NDArray[np.int64]) -> None:
        self._write(self.offsets[name] + 8 * start, values)
        self.crcs[name].update(values)

    def finish(self, key: bytes) -> None:
        names = (*META_ORDER, _ACTIVE) if self.any_deleted else META_ORDER
        table = np.concatenate([self.crcs[name].finish() for name in names]).astype("<u4").tobytes()
        end = self.offsets[_ACTIVE] + (8 * self.live if self.any_deleted else 0)
        fields = (_MAGIC, self.n, self.live if self.any_deleted else -1, pointers.SEGMENT_ROWS, len(table) // 4, key)
        packed = _FOOTER.pack(*fields, 0)[:-4]
        crc = google_crc32c.value(table + packed)
        self._write(end, np.frombuffer(table + packed + struct.pack("<I", crc), dtype=np.uint8))
        self._wait()
        fd, self.fd = self.fd, -1
        os.close(fd)  # a close error is the folder's: the copy is not published

    def abandon(self) -> None:
        """Close the file if :meth:`finish` did not, and remove it unless it was renamed into place."""
        with contextlib.suppress(OSError):  # the copy is removed either way
            self._wait()
        self._writer.shutdown()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.path.unlink(missing_ok=True)


def _segments(entries: int) -> int:
    return -(-entries // pointers.SEGMENT_ROWS)


def _bytes_match(fd: int, offset: int, nbytes: int, crcs: NDArray[np.uint32], dtype: np.dtype[Any]) -> bool:
    """Whether the ``nbytes`` at ``offset`` have the segment checksums ``crcs``, read through ``fd``.

    Read with ``pread`` into one segment's buffer, not through the mapping: a mapped page that was read
    counts in the process's PSS, so verifying through the mapping made every rank that opened the store
    account for the whole copy (1.87 GB at 110 M structures) until the other ranks mapped it too.
    """
    segment = pointers.SEGMENT_ROWS * dtype.itemsize
    buffer = np.empty(min(segment, nbytes), dtype=np.uint8)
    for j, at in enumerate(range(0, nbytes, segment)):
        size = min(segment, nbytes - at)
        if os.preadv(fd, [buffer[:size].data], offset + at) != size or j >= crcs.size:
            return False
        if google_crc32c.value(buffer[:size]) != int(crcs[j]):
            return False
    return crcs.size == -(-nbytes // segment)


def _map(path: Path, n: int, key: bytes, *, verify: bool) -> PointerCopy | None:
    """The copy at ``path`` mapped read-only, or ``None`` if it is absent, another state's, or damaged (removed)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < _FOOTER.size:
            _reject(path, "it is shorter than its footer")
            return None
        raw = os.pread(fd, _FOOTER.size, size - _FOOTER.size)
        magic, count, live, seg_rows, entries, stored_key, crc = _FOOTER.unpack(raw)
        if magic != _MAGIC or count != n or seg_rows != pointers.SEGMENT_ROWS or stored_key != key:
            _reject(path, "its footer names another state or format")
            return None
        offsets = _offsets(n)
        end = offsets[_ACTIVE] + (8 * live if live >= 0 else 0)
        if size != end + 4 * entries + _FOOTER.size:
            _reject(path, "its size does not match its footer")
            return None
        table = os.pread(fd, 4 * entries, end)
        if google_crc32c.value(table + raw[:-4]) != crc:
            _reject(path, "its checksum table does not match its footer")
            return None
        counts = {
            layout.ATOMS_PTR: (n + 1, np.int64),
            layout.EDGES_PTR: (n + 1, np.int64),
            layout.SAMPLES_MASK: (n, np.bool_),
        }
        if live >= 0:
            counts[_ACTIVE] = (live, np.int64)
        crcs: dict[str, NDArray[np.uint32]] = {}
        all_crcs = np.frombuffer(table, dtype="<u4")
        at = 0
        for name, (entries_of, _) in counts.items():
            crcs[name] = all_crcs[at : at + _segments(entries_of)]
            at += _segments(entries_of)
        if at != all_crcs.size:
            _reject(path, "its checksum table has the wrong length")
            return None
        if verify:
            for name, (entries_of, dtype) in counts.items():
                if not _bytes_match(fd, offsets[name], entries_of * np.dtype(dtype).itemsize, crcs[name], np.dtype(dtype)):
                    _reject(path, f"its {name} bytes do not match the crc32c its builder recorded")
                    return None
        mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    arrays: dict[str, NDArray[Any]] = {
        name: np.frombuffer(mapping, dtype=dtype, count=entries_of, offset=offsets[name])
        for name, (entries_of, dtype) in counts.items()
    }
    return PointerCopy(arrays=arrays, crcs=crcs, path=path)


def _reject(path: Path, why: str) -> None:
    logger.warning("shared pointer copy %s is damaged (%s): removed, read again from the store", path, why)
    path.unlink(missing_ok=True)
    return None


class SharedPointers:
    """One folder of decoded pointer copies, shared by every process given its path.

    ``min_samples``: stores with fewer physical samples are read into each process's memory instead.
    """

    def __init__(self, directory: str | os.PathLike[str], *, min_samples: int = 0, wait_s: float = WAIT_S) -> None:
        self.directory = Path(directory)
        self.min_samples = min_samples
        self.wait_s = wait_s

    def load(
        self, store_id: str, key: bytes, key_of: Callable[[], bytes | None], n: int, fill: Callable[[MetaSink], None]
    ) -> PointerCopy | None:
        """The copy of the state ``key`` names: mapped if published, else built with ``fill`` and published.

        ``store_id`` names the store (:func:`store_id`); ``key_of`` computes the key again, after a build, to
        see that the store did not change under it. ``None`` (logged): the folder cannot take the copy (full,
        read-only, not this user's), and the caller reads the pointers itself.

        Raises
        ------
        StoreFormatError
            Whatever ``fill`` raises for a damaged store (nothing is published), and, as its subclass
            :class:`PointersChanged`, a key that changed while the copy was built (the store changed under it).
        """
        try:
            return self._load(store_id, key, key_of, n, fill)
        except OSError as err:  # the folder's, or the store's (then reading it privately raises it again)
            logger.warning("pointers read into this process, not shared through %s: %s", self.directory, err)
            return None

    def _load(
        self, store_id: str, key: bytes, key_of: Callable[[], bytes | None], n: int, fill: Callable[[MetaSink], None]
    ) -> PointerCopy:
        _usable(self.directory)
        path = self.directory / f"{store_id}-{key.hex()}.ptrs"
        claim = Path(f"{path}.claim")
        deadline = time.monotonic() + self.wait_s
        while True:
            copy = _map(path, n, key, verify=True)
            if copy is not None:
                return copy
            owned = self._claim(claim)
            if owned or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        try:
            return self._build(store_id, path, key, key_of, n, fill)
        finally:
            if owned:
                claim.unlink(missing_ok=True)

    def _claim(self, claim: Path) -> bool:
        """Claim the build (``True``), or ``False`` while a live process holds the claim."""
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            try:
                text = claim.read_text()
            except FileNotFoundError:
                return False
            if text.isdigit() and not pid_alive(int(text)):
                claim.unlink(missing_ok=True)  # its builder is gone
            return False
        except OSError as err:
            raise _Unusable(f"cannot claim {claim}: {err}") from err
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
        return True

    def _build(
        self,
        store_id: str,
        path: Path,
        key: bytes,
        key_of: Callable[[], bytes | None],
        n: int,
        fill: Callable[[MetaSink], None],
    ) -> PointerCopy:
        copy = _map(path, n, key, verify=True)  # published while this process took the claim
        if copy is not None:
            return copy
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            free = os.statvfs(self.directory)
            if free.f_bavail * free.f_frsize < 17 * (n + 1):
                raise _Unusable(f"{self.directory} has no room for {17 * (n + 1):,} bytes")
            writer = _CopyWriter(temporary, n)
        except OSError as err:
            raise _Unusable(str(err)) from err
        try:
            fill(writer)
            writer.finish(key)
            if key_of() != key:
                raise PointersChanged("the meta arrays changed while they were read")
            os.replace(temporary, path)
        except OSError as err:
            raise _Unusable(str(err)) from err
        finally:
            writer.abandon()
        for other in self.directory.glob(f"{store_id}-*.ptrs"):
            if other != path:
                other.unlink(missing_ok=True)  # an older state of this store
        mapped = _map(path, n, key, verify=False)  # this process wrote it
        if mapped is None:
            raise _Unusable(f"{path} vanished right after it was published")
        return mapped


def store_id(root: Path) -> str:
    """A short name for a store path, shared by every state of it."""
    return hashlib.blake2b(os.fsencode(os.path.abspath(root)), digest_size=8).hexdigest()


def content_key(arrays: Mapping[str, Any], n: int, view: ReadView, *, complete: bool) -> bytes | None:
    """The key of the state of a local store's meta arrays, read as ``view`` says; ``None`` if not local."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{_MAGIC!r}|{n}|{complete}|{view.rows!r}|{sorted(set(view.deleted))!r}".encode())
    now = time.time_ns()
    racy = int(RACY_S * 1e9)
    for name in (layout.SAMPLES_MASK, *META_ORDER[:2]):
        store = arrays[name].store_path.store
        if not isinstance(store, LocalStore):
            return None
        folder = Path(store.root) / arrays[name].store_path.path
        for directory, subdirs, files in os.walk(folder):
            subdirs.sort()
            for file in sorted(files):
                path = os.path.join(directory, file)
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                digest.update(f"{os.path.relpath(path, folder)}:{st.st_dev}:{st.st_ino}:{st.st_size}:".encode())
                digest.update(f"{st.st_mtime_ns}:{st.st_ctime_ns}|".encode())
                if file == "zarr.json" or max(st.st_mtime_ns, st.st_ctime_ns) > now - racy:
                    try:
                        digest.update(Path(path).read_bytes())
                    except FileNotFoundError:
                        digest.update(b"gone")
    return digest.digest()
