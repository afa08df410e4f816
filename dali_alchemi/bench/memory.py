"""Memory as a user measures it: the proportional set size (PSS) of the whole process tree.

A training job's footprint is the main process plus every worker it started (DALI's worker processes,
torch DataLoader workers). Summing each process's RSS counts the pages they share (a forked worker's
copy-on-write pages, shared libraries, shared-memory buffers) once per process; PSS splits each shared
page between the processes that map it, so the tree's PSS counts it once. Linux only: read from
``/proc/PID/smaps_rollup`` (``VmRSS`` from ``/proc/PID/status`` where that is missing), 0 elsewhere.
"""

from __future__ import annotations

import os
import threading

__all__ = ["MB", "SAMPLE_INTERVAL_S", "TreeMemorySampler", "children", "process_pss", "tree_pss"]


SAMPLE_INTERVAL_S = 0.1
"""How often the tree is sampled during a run (each sample reads two small files per process)."""

MB = 2**20


def _kib_field(path: str, key: str) -> int | None:
    """The ``key: N kB`` line of a /proc file, in bytes; ``None`` if the file or the line is missing."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def process_pss(pid: int) -> int:
    """PSS of one process in bytes (its RSS where PSS is unavailable; 0 if it is gone)."""
    for path, key in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        value = _kib_field(path, key)
        if value is not None:
            return value
    return 0


def children(pid: int) -> list[int]:
    """Direct children of ``pid``, from ``/proc/PID/task/*/children`` (no scan of every process)."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids += [int(k) for k in fh.read().split()]
        except OSError:
            continue
    return kids


def tree_pss(pid: int | None = None) -> tuple[int, int]:
    """PSS in bytes of ``pid`` (default: this process) and all its descendants, and how many processes."""
    total, count, stack = 0, 0, [os.getpid() if pid is None else pid]
    while stack:
        current = stack.pop()
        size = process_pss(current)
        if size:
            total += size
            count += 1
        stack.extend(children(current))
    return total, count


class TreeMemorySampler:
    """Samples this process tree's PSS on a thread while a block runs; keeps the start and the peak.

    ``start_bytes`` is the tree when the block begins, ``peak_bytes`` the largest sample (the start and
    the end included), ``peak_processes`` the most processes seen in one sample, and ``samples`` how many
    samples were taken (a run shorter than ``interval`` has only its start and end).
    """

    def __init__(self, interval: float = SAMPLE_INTERVAL_S) -> None:
        self.interval = interval
        self.start_bytes, self.peak_processes = tree_pss()
        self.peak_bytes = self.start_bytes
        self.samples = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dali-alchemi-memory", daemon=True)

    def _sample(self) -> None:
        size, count = tree_pss()
        self.peak_bytes = max(self.peak_bytes, size)
        self.peak_processes = max(self.peak_processes, count)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def start_mb(self) -> float:
        return self.start_bytes / MB

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / MB
