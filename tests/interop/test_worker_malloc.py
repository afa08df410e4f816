"""plain_malloc: glibc's thresholds raised while conversions run, the environment's put back after the last."""

from __future__ import annotations

import platform
import subprocess
import sys
import threading
from typing import Any

import pytest

from dali_alchemi.interop import worker_malloc
from dali_alchemi.interop.worker_malloc import MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES, plain_malloc

M_TRIM, M_MMAP = -1, -3


class _Recorder:
    """Stands in for glibc's ``mallopt``: records ``(option, value)`` pairs."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, option: int, value: Any) -> int:
        self.calls.append((option, int(getattr(value, "value", value))))
        return 1


@pytest.fixture
def mallopt(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    recorder = _Recorder()
    monkeypatch.setattr(worker_malloc, "_mallopt", lambda: recorder)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    return recorder


def test_without_the_nannys_variable_nothing_is_changed(mallopt: _Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with plain_malloc():
        pass
    assert mallopt.calls == []


def test_an_unparsable_variable_changes_nothing(mallopt: _Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "lots")
    with plain_malloc():
        pass
    assert mallopt.calls == []


def test_thresholds_are_raised_within_and_the_environments_put_back(
    mallopt: _Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    with plain_malloc():
        assert mallopt.calls == [(M_MMAP, MMAP_THRESHOLD_BYTES), (M_TRIM, TRIM_THRESHOLD_BYTES)]
    assert mallopt.calls[2:] == [(M_MMAP, 128 << 10), (M_TRIM, 65536)]
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "262144")
    with plain_malloc():
        pass
    assert mallopt.calls[-2:] == [(M_MMAP, 262144), (M_TRIM, 65536)]


def test_the_last_of_overlapping_tasks_puts_them_back(mallopt: _Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    first_in, second_done = threading.Event(), threading.Event()
    seen: list[int] = []

    def first() -> None:
        with plain_malloc():
            first_in.set()
            second_done.wait(10)
            seen.append(len(mallopt.calls))  # the second left, this one still runs: not put back yet

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(10)
    with plain_malloc():
        pass
    second_done.set()
    thread.join(10)
    assert seen == [2]
    assert mallopt.calls == [(M_MMAP, MMAP_THRESHOLD_BYTES), (M_TRIM, TRIM_THRESHOLD_BYTES), (M_MMAP, 128 << 10),
                             (M_TRIM, 65536)]  # fmt: skip


def test_an_error_inside_still_puts_them_back(mallopt: _Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    with pytest.raises(KeyError), plain_malloc():
        raise KeyError("in the task")
    assert mallopt.calls[-2:] == [(M_MMAP, 128 << 10), (M_TRIM, 65536)]
    assert worker_malloc._running == 0


_REAL = r"""
import ctypes, numpy as np
from dali_alchemi.interop.worker_malloc import plain_malloc

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info

def mapped_while_held(nbytes):
    before = libc.mallinfo2().hblks
    block = np.empty(nbytes, np.uint8)
    return libc.mallinfo2().hblks - before

print(mapped_while_held(1 << 20), end=" ")
with plain_malloc():
    print(mapped_while_held(1 << 20), end=" ")
print(mapped_while_held(16 << 20))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_under_the_nannys_setting_a_megabyte_is_mapped_outside_and_not_within() -> None:
    env = {"MALLOC_TRIM_THRESHOLD_": "65536", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", _REAL], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "0", "1"]  # 16 MiB after: mapped again, so the thresholds came back
