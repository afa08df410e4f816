"""store/read/host.py: where shared memory is, and whether a process that claimed work still lives."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dali_alchemi.store.read import host


def test_a_live_process_is_alive_and_an_ended_one_is_not() -> None:
    assert host.pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not host.pid_alive(child.pid)  # reaped: its pid names no process (until reused)


def test_shared_memory_is_dev_shm_when_writable_else_none(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    assert host.shared_memory_root() == expected
    monkeypatch.setattr(host.os.path, "isdir", lambda path: False)
    assert host.shared_memory_root() is None
