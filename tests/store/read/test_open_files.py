"""Files kept open between reads: one set per thread, dropped on a new store state, closed on close."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import pytest

from dali_alchemi.store.read.open_files import OpenFiles
from tests.processes import fd_is_open


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(name.encode() * 8)
    return tmp_path


def test_a_file_opened_once_is_read_through_the_same_descriptor_at_the_next_read(root: Path) -> None:
    files = OpenFiles(root)
    files.begin_read()
    fd = files.get("a")
    assert fd is not None and os.pread(fd, 2, 0) == b"aa"
    files.begin_read()
    assert files.get("a") == fd
    files.close()
    assert not fd_is_open(fd)


def test_a_new_store_state_closes_the_old_descriptors_at_the_next_read(root: Path) -> None:
    files = OpenFiles(root)
    files.begin_read()
    old = files.get("a")
    assert old is not None
    (root / "a").unlink()
    (root / "a").write_bytes(b"new bytes")  # replaced, as a rewrite replaces a file
    files.invalidate()
    files.begin_read()
    assert not fd_is_open(old)
    fd = files.get("a")
    assert fd is not None and os.pread(fd, 3, 0) == b"new"
    files.close()


def test_a_missing_file_is_none_and_not_remembered(root: Path) -> None:
    files = OpenFiles(root)
    files.begin_read()
    assert files.get("later") is None
    (root / "later").write_bytes(b"xyz")  # written by the next read's time
    fd = files.get("later")
    assert fd is not None and os.pread(fd, 3, 0) == b"xyz"
    assert files.get("no/such/dir") is None
    files.close()


def test_each_thread_reads_through_its_own_descriptors(root: Path) -> None:
    files = OpenFiles(root)
    files.begin_read()
    mine = files.get("a")
    theirs: list[int | None] = []

    def read() -> None:
        files.begin_read()
        theirs.append(files.get("a"))
        files.invalidate()  # another thread's new state never closes this thread's descriptors mid-read

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(timeout=10)
    assert theirs and theirs[0] is not None and theirs[0] != mine
    assert mine is not None and fd_is_open(mine)
    files.close()
    assert not fd_is_open(mine) and not fd_is_open(theirs[0])


def test_a_thread_keeps_at_most_its_bound_between_reads(root: Path) -> None:
    files = OpenFiles(root, max_per_thread=2)
    files.begin_read()
    opened = [files.get(name) for name in ("a", "b", "c")]
    assert all(fd is not None and fd_is_open(fd) for fd in opened)  # within a read, all stay open
    files.begin_read()  # over the bound: all closed
    assert not any(fd_is_open(fd) for fd in opened if fd is not None)
    files.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_opens_its_own_and_leaves_the_parents_alone(root: Path) -> None:
    files = OpenFiles(root)
    files.begin_read()
    parent_fd = files.get("a")
    assert parent_fd is not None
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 when it behaved
        code = 1
        try:
            files.begin_read()
            fd = files.get("a")
            if fd is not None and fd != parent_fd and os.pread(fd, 2, 0) == b"aa":
                files.close()  # closes the child's own, never its copy of the parent's
                if not fd_is_open(fd) and fd_is_open(parent_fd):
                    code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert fd_is_open(parent_fd) and os.pread(parent_fd, 2, 0) == b"aa"
    files.close()
    assert not fd_is_open(parent_fd)


def test_descriptors_of_a_dropped_instance_are_closed(root: Path) -> None:
    files = OpenFiles(root)
    files.begin_read()
    fd = files.get("a")
    assert fd is not None and fd_is_open(fd)
    del files
    gc.collect()
    assert not fd_is_open(fd)
