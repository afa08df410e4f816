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
def start_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment the process is taken to have started with (what glibc read)."""
    environment: dict[str, str] = {}
    monkeypatch.setattr(worker_malloc, "_start_environment", lambda: environment)
    return environment


@pytest.fixture
def mallopt(monkeypatch: pytest.MonkeyPatch, start_env: dict[str, str]) -> _Recorder:
    recorder = _Recorder()
    monkeypatch.setattr(worker_malloc, "_mallopt", lambda: recorder)
    return recorder


def test_without_the_nannys_variable_nothing_is_changed(mallopt: _Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # set after the start (a nanny's coordinator): glibc never read it
    with plain_malloc():
        pass
    assert mallopt.calls == []


@pytest.mark.parametrize("value", ["lots", str(2**32)])
def test_an_unparsable_or_oversized_variable_changes_nothing(
    mallopt: _Recorder, start_env: dict[str, str], value: str
) -> None:
    start_env["MALLOC_TRIM_THRESHOLD_"] = value
    with plain_malloc():
        pass
    assert mallopt.calls == []


def test_thresholds_glibc_refuses_are_put_back_at_once(
    mallopt: _Recorder, start_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    start_env["MALLOC_TRIM_THRESHOLD_"] = "65536"
    calls = mallopt.calls

    def refuse_large(option: int, value: Any) -> int:  # as a glibc that caps the thresholds below ours
        mallopt(option, value)
        return 0 if int(value.value) > 1 << 20 else 1

    monkeypatch.setattr(worker_malloc, "_mallopt", lambda: refuse_large)
    with plain_malloc():
        assert worker_malloc._restore is None
    assert calls == [(M_MMAP, MMAP_THRESHOLD_BYTES), (M_TRIM, TRIM_THRESHOLD_BYTES), (M_MMAP, 128 << 10),
                              (M_TRIM, 65536)]  # fmt: skip


def test_thresholds_are_raised_within_and_the_environments_put_back(
    mallopt: _Recorder, start_env: dict[str, str]
) -> None:
    start_env["MALLOC_TRIM_THRESHOLD_"] = "65536"
    with plain_malloc():
        assert mallopt.calls == [(M_MMAP, MMAP_THRESHOLD_BYTES), (M_TRIM, TRIM_THRESHOLD_BYTES)]
    assert mallopt.calls[2:] == [(M_MMAP, 128 << 10), (M_TRIM, 65536)]
    start_env["MALLOC_MMAP_THRESHOLD_"] = "262144"
    with plain_malloc():
        pass
    assert mallopt.calls[-2:] == [(M_MMAP, 262144), (M_TRIM, 65536)]


def test_the_last_of_overlapping_tasks_puts_them_back(mallopt: _Recorder, start_env: dict[str, str]) -> None:
    start_env["MALLOC_TRIM_THRESHOLD_"] = "65536"
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


def test_an_error_inside_still_puts_them_back(mallopt: _Recorder, start_env: dict[str, str]) -> None:
    start_env["MALLOC_TRIM_THRESHOLD_"] = "65536"
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
