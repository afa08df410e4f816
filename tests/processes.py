"""What the process-level tests share: bounded waits that only tell a hang, and this test's own resources.

The suite runs beside other jobs, so a test never asserts how long something took and never looks at
machine-wide state: it waits for an event with a bound far above any normal duration (``HANG_S``), and it
checks only the processes and shared-memory segments that it started itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

HANG_S = 60.0
"""How long a wait lasts before it counts as a hang (normal waits take well under a second when idle)."""


def wait_until(done: Callable[[], bool], timeout: float = HANG_S) -> bool:
    """Poll ``done`` until it holds or ``timeout`` seconds pass; whether it held."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process, whoever its parent is now."""
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("\nState:\t")[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def children(pid: int | None = None) -> list[int]:
    """The live direct children of ``pid`` (default: this process)."""
    parent = os.getpid() if pid is None else pid
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        if f"\nPPid:\t{parent}\n" in text and alive(int(entry)):
            kids.append(int(entry))
    return kids


def shm_mappings(pids: Iterable[int]) -> set[str]:
    """The shared-memory objects (``/dev/shm/NAME``, by device and inode) that these processes map."""
    found = set()
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                found.add(f"{parts[3]} {parts[4]} {parts[5].split()[0]}")
    return found


def shm_names(segments: Iterable[str]) -> set[str]:
    """The ``/dev/shm`` entry names of ``shm_mappings`` results."""
    return {segment.rsplit("/", 1)[1] for segment in segments}


def fd_is_open(fd: int) -> bool:
    """Whether descriptor ``fd`` is open in this process."""
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
