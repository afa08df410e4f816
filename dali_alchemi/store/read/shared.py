"""Decoded row blocks shared by the processes of one machine, as files in a shared-memory folder.

With DALI worker processes every process has its own decoded-block cache, so a chunk that two
workers both need is decoded twice. A :class:`SharedBlocks` folder (on ``/dev/shm``) lets the first
process that needs a block decode it and publish it; the others map the published file read-only, so
the pages exist once on the machine and count once in the processes' proportional memory (PSS).

Protocol, per block (``array name``, ``block``):

- a published block is the file ``NAME.BLOCK``, written beside and renamed in, so it is whole or absent;
  its decoded bytes are followed by a trailer holding their crc32, which every process checks when it
  maps the block: a block whose bytes changed in the folder is removed and decoded again from the
  store, never returned;
- a process about to decode one creates ``NAME.BLOCK.claim`` exclusively (``O_EXCL``) holding its pid;
  the others wait for the file instead of decoding it too; the claim is removed once it is published;
- a claim whose process is gone (killed worker), or a wait longer than ``wait_s``, ends the wait, and
  the waiter decodes the block itself: a stuck peer costs a decode, never a hang;
- a publisher removes its file when its own cache evicts the block (mapped copies stay valid in the
  processes that hold them), so the folder never holds more than the processes' caches.

Only the folder's path crosses a fork or a pickle; the folder belongs to whoever created it (the loader
removes it on close). Stores change under a reader only through a refresh, which gives a new snapshot:
its blocks live in a sub-folder of their own (:meth:`SharedBlocks.scoped`), named by the store's
content (see :func:`snapshot_token`), so a folder kept across runs never serves the blocks of a
store that was rewritten at the same path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import struct
import tempfile
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import numpy as np

from dali_alchemi.store.format import layout
from dali_alchemi.store.read.host import pid_alive, shared_memory_root

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.format.location import StoreLocation
    from dali_alchemi.store.read.snapshot import Snapshot

__all__ = [
    "POLL_S",
    "WAIT_S",
    "SharedBlocks",
    "make_shared_folder",
    "remove_shared_folder",
    "snapshot_token",
]


logger = logging.getLogger(__name__)

_TRAILER = struct.Struct("<4sI")
"""After a published block's bytes: a magic tag and the crc32 of those bytes."""
_MAGIC = b"dab1"

WAIT_S = 60.0
"""Longest wait for a block another process claimed before decoding it here."""

POLL_S = 0.0005
"""Interval between checks while waiting for another process's block."""


class SharedBlocks:
    """One folder of published decoded blocks, shared by every process given its path."""

    def __init__(self, directory: str | os.PathLike[str], *, wait_s: float = WAIT_S) -> None:
        self.directory = Path(directory)
        self.wait_s = wait_s

    def scoped(self, token: str) -> SharedBlocks:
        """The sub-folder for one snapshot of a store (created if needed)."""
        sub = self.directory / quote(token, safe="")
        sub.mkdir(parents=True, exist_ok=True)
        return SharedBlocks(sub, wait_s=self.wait_s)

    def _path(self, name: str, block: int) -> Path:
        return self.directory / f"{quote(name, safe='')}.{block}"

    def open(
        self, name: str, block: int, dtype: np.dtype[Any], shape: tuple[int, ...], *, verify: bool = True
    ) -> NDArray[Any] | None:
        """The published block mapped read-only, or ``None`` if it is not (or no longer) there.

        The mapped bytes are checked against the crc32 their publisher recorded (``verify``; one pass
        over the block, once per process, as it then stays in the process's cache). A block that fails
        the check, or has another size, is removed from the folder (logged) and ``None`` returned, so
        the caller decodes it from the store.
        """
        path = self._path(name, block)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return None
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if expected == 0:
            return None
        if size != expected + _TRAILER.size:
            return None  # not this block (a caller's other shape), or a file no publisher wrote
        try:
            with open(path, "rb") as fh:
                fh.seek(expected)
                magic, crc = _TRAILER.unpack(fh.read(_TRAILER.size))
            data = np.memmap(path, dtype=dtype, mode="r", shape=shape)
        except (FileNotFoundError, ValueError, struct.error):
            return None
        if verify and (magic != _MAGIC or zlib.crc32(data.data) != crc):
            self._reject(path, "its bytes do not match the crc32 its publisher recorded")
            return None
        return np.ndarray(shape, dtype=dtype, buffer=data)  # a plain read-only array over the mapping

    def _reject(self, path: Path, why: str) -> None:
        logger.warning("shared block %s is damaged (%s): removed, decoded again from the store", path, why)
        path.unlink(missing_ok=True)

    def claim(self, name: str, block: int) -> bool:
        """Claim the decode of a block: ``True`` if this process should decode and publish it.

        ``False`` when another process holds the claim or has published the block already.
        """
        claim = f"{self._path(name, block)}.claim"
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            if self._claim_is_stale(claim):
                Path(claim).unlink(missing_ok=True)
                return self.claim(name, block)
            return False
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
        if self._path(name, block).exists():  # published between the caller's look and this claim
            self.release(name, block)
            return False
        return True

    def _claim_is_stale(self, claim: str) -> bool:
        try:
            text = Path(claim).read_text()
        except FileNotFoundError:
            return False
        return bool(text) and text.isdigit() and not pid_alive(int(text))

    def publish(self, name: str, block: int, data: NDArray[Any]) -> NDArray[Any]:
        """Write a decoded block, end this process's claim, and return the published (mapped) copy."""
        path = self._path(name, block)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            raw = np.ascontiguousarray(data).data.cast("B")
            with open(temporary, "wb") as fh:
                fh.write(raw)
                fh.write(_TRAILER.pack(_MAGIC, zlib.crc32(raw)))
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
            self.release(name, block)
        mapped = self.open(name, block, data.dtype, data.shape, verify=False)  # this process wrote it
        return data if mapped is None else mapped

    def release(self, name: str, block: int) -> None:
        """End this process's claim on a block without publishing it (its decode failed)."""
        Path(f"{self._path(name, block)}.claim").unlink(missing_ok=True)

    def wait(self, name: str, block: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> NDArray[Any] | None:
        """The block another process claimed, once published; ``None`` if its claim ended without it."""
        deadline = time.monotonic() + self.wait_s
        claim = f"{self._path(name, block)}.claim"
        while True:
            data = self.open(name, block, dtype, shape)
            if data is not None:
                return data
            if not os.path.exists(claim) or self._claim_is_stale(claim) or time.monotonic() > deadline:
                return self.open(name, block, dtype, shape)
            time.sleep(POLL_S)

    def discard(self, name: str, block: int) -> None:
        """Remove a published block (its publisher's cache let it go)."""
        self._path(name, block).unlink(missing_ok=True)


def make_shared_folder() -> str:
    """A new, empty folder for :class:`SharedBlocks` on shared memory (its creator removes it)."""
    return tempfile.mkdtemp(prefix="dali-alchemi-blocks-", dir=shared_memory_root())


def remove_shared_folder(path: str | os.PathLike[str]) -> None:
    """Remove a folder made by :func:`make_shared_folder`, and every block still in it."""
    shutil.rmtree(path, ignore_errors=True)


def snapshot_token(snapshot: Snapshot) -> str:
    """A name for one state of a store, under which processes share its decoded blocks.

    It covers the location, sample counts and arrays (shapes and dtypes), and also the state's
    token (the bytes of the root and atom-pointer ``zarr.json``, which every delete, defragment,
    ``add_custom`` and ``repair`` changes) and which custom fields were replaced: a block decoded from
    one state is then never mapped by a reader of another, even when counts and shapes are the same.
    For a local store it also covers the identity of those two files on disk (device, inode, change
    time, size): a store written again at the same path, with the same shapes and byte-identical
    metadata but new values, gets new files and so a new name, and a ``shared_cache`` folder kept
    across runs never serves the old store's blocks.
    """
    arrays = ";".join(f"{n}:{h.shape}:{h.dtype}" for n, h in sorted(snapshot.handles.items()))
    rewritten = ";".join(f"{n}:{g}" for n, g in sorted(snapshot.rewritten.items()))
    text = f"{snapshot.location!r}|{snapshot.n_physical}|{int(snapshot.atoms_ptr[-1])}|{int(snapshot.edges_ptr[-1])}"
    text += f"|{_file_identity(snapshot.location)}"
    digest = hashlib.blake2b(f"{text}|{arrays}|{rewritten}|".encode() + snapshot.token, digest_size=8)
    return digest.hexdigest()


def _file_identity(loc: StoreLocation) -> str:
    """Device, inode, change time and size of a local store's root and ``meta/atoms_ptr`` ``zarr.json``."""
    root = loc.local_root
    if root is None:
        return "-"
    parts = []
    for path in (root / "zarr.json", root / layout.META_GROUP / layout.ATOMS_PTR / "zarr.json"):
        try:
            st = path.stat()
        except OSError:
            parts.append("missing")
            continue
        parts.append(f"{st.st_dev}:{st.st_ino}:{st.st_ctime_ns}:{st.st_size}")
    return ",".join(parts)
