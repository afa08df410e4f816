"""The writer lock: one writer operation at a time per store, across processes and machines.

Every writer operation (and :func:`~dali_alchemi.store.write.recovery.recover`) holds this lock from before it
reads the journal until after it clears it, so a second writer never rolls back a live writer's
journal and two appends never interleave. The lock names its holder (:class:`LockHolder`: pid, host,
operation, since when), and a second writer waits up to the timeout it chose (default: none), then
gets a :class:`~dali_alchemi.errors.StoreLockedError` naming that holder.

A local store's lock is a file beside it (``.<name>.dali-alchemi-lock``) that appears atomically with
its content (written to a temporary file, then ``os.link``-ed into place, which fails if the lock
exists; on filesystems without hard links an ``O_EXCL`` create), and that the holder also keeps
``flock``-ed where the filesystem supports it. A lock whose holder is dead is taken over: the holder is
dead when it ran on this host and its pid is gone (or is a zombie, or now belongs to a process that
started later, or the host rebooted since), and, where ``flock`` works, nobody holds the file's flock.
The takeover happens under that flock with the path checked to still name the same file, so two
processes taking over one stale lock cannot both win. A lock held on another host is never taken over
automatically (its pid cannot be checked from here, and a filesystem mounted with host-local locks
would make a flock test lie); the error says which file to remove once that process is known gone.

Other stores (object stores, fsspec URLs, in-memory stores) keep the lock under a hidden key at the
store's root. Object stores offer no atomic create through zarr's API, so that lock is best effort:
a writer that starts while another holds it is refused, two that start within one round trip may
both proceed, and the holder detects at release that its lock was overwritten and raises.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from dali_alchemi.errors import ConfigError, StoreLockedError

if TYPE_CHECKING:
    from dali_alchemi.store.format.location import StoreLocation

try:
    import fcntl
except ImportError:  # not on Windows; the lock then relies on the pid check alone
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_KEY", "LOCK_SUFFIX", "LockHolder", "WriterLock"]


logger = logging.getLogger(__name__)

LOCK_SUFFIX = "lock"
"""Suffix of the lock file beside a local store (``.<name>.dali-alchemi-lock``)."""
LOCK_KEY = ".dali-alchemi-lock.json"
"""Key of the lock inside a non-local store."""

_FIRST_POLL_S = 0.01
"""First pause between two tries while waiting for a lock; doubles up to ``_LAST_POLL_S``."""
_LAST_POLL_S = 0.25
"""Longest pause between two tries: a lock released is noticed within this many seconds."""

# errno values meaning "this filesystem has no flock / no hard links" (then fall back, never fail)
_NO_FLOCK = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL}
_NO_LINK = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV, errno.EMLINK}


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _start_time(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc``), to tell a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat[stat.rfind(")") + 2 :]
    return rest[:1] or None


@dataclass(frozen=True, slots=True)
class LockHolder:
    """Who holds a store's writer lock: process ``pid`` on ``host``, running ``operation`` since ``since``.

    ``since`` is seconds since the epoch (UTC). ``boot_id`` and ``start_time`` (from ``/proc`` where there
    is one) tell a rebooted host and a reused pid from the holder; ``token`` is unique per acquisition.
    """

    pid: int
    host: str
    operation: str
    since: float
    token: str
    boot_id: str | None = None
    start_time: int | None = None

    @classmethod
    def me(cls, operation: str) -> LockHolder:
        """This process, about to run ``operation``."""
        pid = os.getpid()
        return cls(
            pid=pid, host=socket.gethostname(), operation=operation, since=time.time(), token=uuid.uuid4().hex,
            boot_id=_boot_id(), start_time=_start_time(pid),
        )  # fmt: skip

    def describe(self) -> str:
        when = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"pid {self.pid} on host {self.host!r} ({self.operation}, since {when})"

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def parse(cls, raw: bytes) -> LockHolder | None:
        """The holder a lock's content names, or ``None`` if it names none (empty, torn or foreign)."""
        try:
            doc = json.loads(raw)
            holder = cls(**doc)
        except (ValueError, TypeError):
            return None
        if not isinstance(holder.pid, int) or not isinstance(holder.host, str) or not isinstance(holder.since, float | int):
            return None
        return holder

    def on_this_host(self) -> bool:
        return self.host == socket.gethostname()

    def is_dead(self) -> bool:
        """Whether the holder is certainly gone; only ever true for a holder on this host."""
        if not self.on_this_host():
            return False
        boot = _boot_id()
        if self.boot_id is not None and boot is not None and boot != self.boot_id:
            return True  # the host rebooted since the lock was taken
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # alive, another user's
        if _state(self.pid) == "Z":
            return True
        started = _start_time(self.pid)
        return self.start_time is not None and started is not None and started != self.start_time


def _flock(fd: int) -> bool | None:
    """Take ``fd``'s flock without waiting: True (taken), False (someone holds it), None (unsupported)."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno in (errno.EAGAIN, errno.EACCES):
            return False
        if err.errno in _NO_FLOCK:
            return None
        raise
    return True


@dataclass(slots=True)
class _Held:
    thread: int
    count: int


_HELD: dict[str, _Held] = {}
"""The locks this process holds, by :func:`_lock_id`: which thread, how many times (re-entrant)."""
_HELD_GUARD = threading.Lock()


class WriterLock:
    """The writer lock of the store at ``loc``, held as a context manager around one operation.

    Re-entrant within one thread (an operation that runs another, like convert writing its store, holds
    it once); another thread of the same process is refused like another process.

    Parameters
    ----------
    loc
        The store.
    operation
        What the holder does, shown to a writer that is refused (``"append"``, ``"recover"``, ...).
    timeout
        Seconds to wait for a held lock before raising; 0 (the default) fails at once.

    Attributes
    ----------
    took_over
        The dead holder whose lock this one replaced, if any: its operation may have left files behind.

    Raises
    ------
    StoreLockedError
        On entry, if another live writer holds the lock and does not release it within ``timeout``.
    """

    def __init__(self, loc: StoreLocation, operation: str, *, timeout: float = 0.0) -> None:
        if not timeout >= 0:
            raise ConfigError(f"lock timeout must be >= 0 seconds, got {timeout}")
        self.loc = loc
        self.operation = operation
        self.timeout = float(timeout)
        self.took_over: LockHolder | None = None
        self._holder: LockHolder | None = None
        self._fd: int | None = None
        self._id = _lock_id(loc)

    @property
    def path(self) -> Path:
        """The lock file beside a local store."""
        assert self.loc.local_root is not None
        root = self.loc.local_root
        return root.with_name(f".{root.name}.dali-alchemi-{LOCK_SUFFIX}")

    # -- acquire and release --------------------------------------------------------------------
    def __enter__(self) -> WriterLock:
        me = threading.get_ident()
        with _HELD_GUARD:
            held = _HELD.get(self._id)
            if held is not None and held.thread == me:
                held.count += 1
                return self
        deadline = time.monotonic() + self.timeout
        pause = _FIRST_POLL_S
        while True:
            holder = LockHolder.me(self.operation)
            busy = self._try_local(holder) if self.loc.local_root is not None else self._try_remote(holder)
            if busy is None:
                self._holder = holder
                break
            if busy == "retry":
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._locked_error(busy)
            time.sleep(min(pause, left))
            pause = min(pause * 2, _LAST_POLL_S)
        with _HELD_GUARD:
            _HELD[self._id] = _Held(thread=me, count=1)
        if self.took_over is not None:
            logger.warning(
                "took over the writer lock of %s from %s, which is gone", self.loc.display, self.took_over.describe()
            )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        with _HELD_GUARD:
            held = _HELD[self._id]
            held.count -= 1
            if held.count:
                return
            del _HELD[self._id]
        if self.loc.local_root is not None:
            self._release_local()
        else:
            self._release_remote(failing=kind is not None)

    def _locked_error(self, holder: LockHolder | str) -> StoreLockedError:
        where = f"; if that process is gone, remove {self.path}" if self.loc.local_root is not None else ""
        if isinstance(holder, LockHolder):
            what = holder.describe()
            if not holder.on_this_host():
                where += " (a holder on another host is never taken over automatically)"
        else:
            what = f"an unknown holder ({holder})"
        waited = f" after waiting {self.timeout:g} s" if self.timeout else ""
        return StoreLockedError(
            f"Store {self.loc.display} is locked by another writer{waited}: {what}; {self.operation} needs it"
            f" (wait for that writer, or pass a lock timeout){where}",
            holder=holder if isinstance(holder, LockHolder) else None,
        )

    # -- a local store: a file beside it ----------------------------------------------------------
    def _try_local(self, holder: LockHolder) -> LockHolder | str | None:
        """Take the lock file: None (taken), ``"retry"`` (try again now), else who or what holds it."""
        path = self.path
        tmp = path.with_name(f"{path.name}.{holder.token}.tmp")
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        try:
            os.write(fd, holder.dumps().encode())
            os.fsync(fd)
            _flock(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            except FileNotFoundError:  # a recovering writer removed it as a leftover
                os.close(fd)
                return "retry"
            except OSError as err:
                if err.errno not in _NO_LINK:
                    raise
                os.close(fd)
                return self._try_exclusive(holder)
            else:
                self._fd = fd
                return None
            os.close(fd)
        finally:
            tmp.unlink(missing_ok=True)
        return self._examine(path)

    def _try_exclusive(self, holder: LockHolder) -> LockHolder | str | None:
        """Without hard links: create the lock file with ``O_EXCL`` (its content follows at once)."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        except FileExistsError:
            return self._examine(self.path)
        _flock(fd)
        os.write(fd, holder.dumps().encode())
        os.fsync(fd)
        self._fd = fd
        return None

    def _examine(self, path: Path) -> LockHolder | str:
        """Who holds the existing lock file; a dead holder's lock is removed (then ``"retry"``)."""
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return "retry"  # released meanwhile
        try:
            raw = os.read(fd, 1 << 16)
            holder = LockHolder.parse(raw)
            if holder is None:
                return f"{path} holds no readable holder: {raw[:200]!r}"
            free = _flock(fd)
            if free is False or not holder.is_dead():
                return holder
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                return "retry"
            if not same:
                return "retry"  # replaced meanwhile
            if free is None:  # no flock: move it aside and make sure it is still the dead holder's
                aside = path.with_name(f"{path.name}.{uuid.uuid4().hex}.stale")
                os.rename(path, aside)
                if LockHolder.parse(aside.read_bytes()) != holder:
                    try:
                        os.link(aside, path)  # a live holder's lock: put it back
                    finally:
                        aside.unlink()
                    return "retry"
                aside.unlink()
            else:
                path.unlink()
            self.took_over = holder
            return "retry"
        finally:
            os.close(fd)

    def _release_local(self) -> None:
        fd, self._fd = self._fd, None
        assert fd is not None
        try:
            if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                self.path.unlink()
            else:
                logger.warning("the writer lock of %s was replaced while this writer held it", self.loc.display)
        except FileNotFoundError:
            logger.warning("the writer lock of %s was removed while this writer held it", self.loc.display)
        finally:
            os.close(fd)

    # -- other stores: a key at the root ---------------------------------------------------------
    def _get(self) -> bytes | None:
        buf = sync(self.loc.store.get(self.loc.key(LOCK_KEY), prototype=default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    def _try_remote(self, holder: LockHolder) -> LockHolder | str | None:
        raw = self._get()
        if raw is not None:
            found = LockHolder.parse(raw)
            if found is None:
                return f"key {LOCK_KEY} holds no readable holder: {raw[:200]!r}"
            if not found.is_dead():
                return found
            self.took_over = found
        buffer = default_buffer_prototype().buffer.from_bytes(holder.dumps().encode())
        sync(self.loc.store.set(self.loc.key(LOCK_KEY), buffer))
        now = self._get()
        mine = None if now is None else LockHolder.parse(now)
        if mine is None or mine.token != holder.token:
            return mine or "retry"
        return None

    def _release_remote(self, *, failing: bool) -> None:
        raw = self._get()
        now = None if raw is None else LockHolder.parse(raw)
        assert self._holder is not None
        if now is not None and now.token == self._holder.token:
            sync(self.loc.store.delete(self.loc.key(LOCK_KEY)))
            return
        if not failing:
            raise StoreLockedError(
                f"Store {self.loc.display}: another writer replaced this writer's lock while it ran"
                f" ({now.describe() if now else 'the lock is gone'}); two writers may have changed the store at"
                " once: run verify",
                holder=now,
            )


def _lock_id(loc: StoreLocation) -> str:
    """One name per store for the re-entrancy table: the resolved path, or the store's URL and prefix."""
    if loc.local_root is not None:
        return str(loc.local_root.parent.resolve() / loc.local_root.name)
    return f"{loc.store}/{loc.prefix}"
