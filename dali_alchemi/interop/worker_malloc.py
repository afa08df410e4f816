"""Conversion tasks allocate as in a plain process, even on a Dask worker whose nanny tuned ``malloc``.

Dask's nanny starts each worker with ``MALLOC_TRIM_THRESHOLD_=65536`` (its
``distributed.nanny.pre-spawn-environ``), so that freed memory goes back to the system at once. Setting it
also turns off glibc's dynamic thresholds: every allocation above 128 KiB is then a fresh ``mmap``,
page-faulted in and unmapped again when freed. A conversion allocates such arrays for every structure
(the neighbor search's blocks, float32 copies, chunk buffers), and ran 9-11% slower with the variable set
(16 files x 400 EMT frames of 108 Cu atoms, ``--workers 2``: 16.49 and 16.52 s against 15.23 and 14.79 s).

:func:`plain_malloc` raises the two thresholds to where glibc's dynamic rule takes them (32 MiB for
``mmap``, twice that for trimming) while conversion tasks run, and puts back what the environment set once
the last running one ends, then trims the heap as the nanny's setting would have. It changes nothing
unless ``MALLOC_TRIM_THRESHOLD_`` was set when the process started (only then are the thresholds static,
and known, so they can be put back exactly), nor off glibc. The start environment is read from
``/proc/self/environ``, not ``os.environ``: a ``LocalCluster``'s nanny sets the variable in the process that
starts the cluster too, where glibc never read it. Thresholds set through ``GLIBC_TUNABLES`` are not seen.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "plain_malloc"]


MMAP_THRESHOLD_BYTES = 32 << 20
"""``M_MMAP_THRESHOLD`` while conversions run: the most glibc's dynamic rule raises it to on 64-bit machines."""

TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
"""``M_TRIM_THRESHOLD`` while conversions run: twice the ``mmap`` threshold, as glibc's dynamic rule keeps it."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_GLIBC_DEFAULT_MMAP_THRESHOLD = 128 << 10

_lock = threading.Lock()
_running = 0
_restore: tuple[int, int] | None = None


def _start_environment() -> dict[str, str]:
    """The environment this process started with (what glibc read), empty where it cannot be read."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return {}
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def _environment_thresholds() -> tuple[int, int] | None:
    """The static ``(trim, mmap)`` thresholds the start environment set, or ``None`` if glibc's are dynamic."""
    environment = _start_environment()
    trim = environment.get("MALLOC_TRIM_THRESHOLD_")
    if trim is None:
        return None
    try:
        values = int(trim), int(environment.get("MALLOC_MMAP_THRESHOLD_", _GLIBC_DEFAULT_MMAP_THRESHOLD))
    except ValueError:
        return None  # glibc ignores what it cannot parse; so does this
    return values if all(0 <= v < 2**31 for v in values) else None  # what a C int holds


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, loaded once; ``None`` off Linux or on another C library."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _mallopt() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    libc = _glibc()
    return None if libc is None else libc.mallopt


def _set(mallopt: ctypes._CFuncPtr, trim: int, mmap_bytes: int) -> bool:  # type: ignore[name-defined]
    """Set both thresholds; whether glibc took both (``mallopt`` returns 1 on success)."""
    took_mmap = mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(mmap_bytes)) == 1
    return mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(trim)) == 1 and took_mmap


def _trim() -> None:
    """Give freed heap memory back to the system now, as the nanny's setting asks."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(ctypes.c_size_t(0))


@contextmanager
def plain_malloc() -> Iterator[None]:
    """Within: glibc keeps freed memory for reuse as a plain process does; after the last one: as before.

    Nested and concurrent uses (several tasks on one worker's threads) count: the first to enter raises the
    thresholds, the last to leave puts the environment's back.
    """
    global _running, _restore
    with _lock:
        if _running == 0:
            thresholds, mallopt = _environment_thresholds(), _mallopt()
            if thresholds is not None and mallopt is not None:
                if _set(mallopt, TRIM_THRESHOLD_BYTES, MMAP_THRESHOLD_BYTES):
                    _restore = thresholds
                else:  # refused (a 32-bit glibc, say): back to what the environment set
                    _set(mallopt, *thresholds)
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _running == 0 and _restore is not None:
                mallopt = _mallopt()
                assert mallopt is not None
                _set(mallopt, *_restore)
                _restore = None
                _trim()
