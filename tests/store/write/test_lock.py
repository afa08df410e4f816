"""The writer lock: one writer operation at a time per store, a named holder, dead holders taken over.

Writers run as real (forked) processes; they are synchronised with pipes and events, never with sleeps,
and every wait is bounded only to turn a hang into a failure.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, StoreLockedError
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.store.format.journal import read_journal
from dali_alchemi.store.format.location import resolve_store
from dali_alchemi.store.write.lock import LockHolder, WriterLock

CONFIG = WriteConfig(core=ArrayConfig(chunk_size=128), meta=ArrayConfig(chunk_size=16))
BASE = synthetic_samples(30, seed=1, min_atoms=4, max_atoms=20)
EXTRA = {name: synthetic_samples(10, seed=seed, min_atoms=4, max_atoms=20) for name, seed in (("a", 2), ("b", 3))}
HANG_S = 120
"""How long a test waits for a child before calling it hung (never reached when things work)."""

FORK = multiprocessing.get_context("fork")


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store.zarr"
    AtomicDataZarrWriter(path, CONFIG).write(BASE)
    return path


def _lock_file(path: Path) -> Path:
    return path.with_name(f".{path.name}.dali-alchemi-lock")


def _energies(path: Path) -> np.ndarray:
    reader = AtomicDataZarrReader(path)
    return np.sort(reader.read_packed(np.arange(len(reader))).fields["energy"].ravel())


# -- children ---------------------------------------------------------------------------------------
def _hold(path: str, operation: str, held: Connection, release: Connection) -> None:
    """Hold the lock of ``path`` until told to release it (or die holding it, if told "die")."""
    lock = WriterLock(resolve_store(path, read_only=False, must_exist=False), operation)
    lock.__enter__()
    held.send(os.getpid())
    if release.recv() == "die":
        os._exit(0)  # the lock file stays, naming a dead pid
    lock.__exit__(None, None, None)
    os._exit(0)


def _append_blocked_at(path: str, phase_name: str, reached: Connection, go: Connection) -> None:
    """Append EXTRA["a"], pausing after ``phase_name`` until told to go on."""
    writer = AtomicDataZarrWriter(path, CONFIG)

    def on_phase(name: str) -> None:
        if name == phase_name:
            reached.send(name)
            go.recv()

    writer.on_phase = on_phase
    writer.append(EXTRA["a"])
    os._exit(0)


def _run_op(path: str, op: str, start: Any, results: Any) -> None:
    """Wait for ``start``, then run ``op`` on ``path`` with a generous lock timeout; report how it went."""
    writer = AtomicDataZarrWriter(path, CONFIG, lock_timeout=HANG_S)
    start.wait(HANG_S)
    try:
        if op == "append-a" or op == "append-b":
            writer.append(EXTRA[op[-1]])
        elif op == "defragment":
            writer.defragment()
        elif op == "add_custom":
            writer.add_custom("tag", np.arange(len(AtomicDataZarrReader(path)), dtype=np.int32), "system")
        elif op == "delete":
            writer.delete([0, 1])
        results.put((op, "ok"))
    except BaseException as err:  # reported to the test, which fails on it
        results.put((op, f"{type(err).__name__}: {err}"))
    results.close()
    results.join_thread()  # os._exit would drop what the queue has not sent yet
    os._exit(0)


def _start(target: Any, *args: Any) -> multiprocessing.process.BaseProcess:
    proc = FORK.Process(target=target, args=args)
    proc.start()
    return proc


def _finish(proc: multiprocessing.process.BaseProcess) -> None:
    proc.join(HANG_S)
    assert proc.exitcode == 0, f"child exited with {proc.exitcode}"


# -- two writers at once ----------------------------------------------------------------------------
@pytest.mark.parametrize("trial", range(3))
def test_two_appending_processes_at_once_both_land(store: Path, trial: int) -> None:
    start, results = FORK.Event(), FORK.Queue()
    procs = [_start(_run_op, str(store), op, start, results) for op in ("append-a", "append-b")]
    start.set()
    outcomes = dict(results.get(timeout=HANG_S) for _ in procs)  # a hang fails here, with a message
    for proc in procs:
        _finish(proc)
    assert outcomes == {"append-a": "ok", "append-b": "ok"}
    reader = AtomicDataZarrReader(store)
    assert len(reader) == 50
    expected = np.sort(np.concatenate([s.fields["energy"].ravel() for s in (BASE, *EXTRA.values())]))
    assert np.array_equal(_energies(store), expected)
    assert not _lock_file(store).exists()


@pytest.mark.stress
@pytest.mark.parametrize("trial", range(30))
def test_two_appending_processes_at_once_both_land_many_times(store: Path, trial: int) -> None:
    test_two_appending_processes_at_once_both_land(store, trial)


@pytest.mark.parametrize("other", ["defragment", "add_custom", "delete"])
def test_an_append_and_another_operation_at_once_leave_a_store_that_opens(store: Path, other: str) -> None:
    start, results = FORK.Event(), FORK.Queue()
    procs = [_start(_run_op, str(store), op, start, results) for op in ("append-a", other)]
    start.set()
    outcomes = dict(results.get(timeout=HANG_S) for _ in procs)  # a hang fails here, with a message
    for proc in procs:
        _finish(proc)
    # add_custom sized its array before the append ran or after: either it landed or it was refused cleanly
    assert outcomes[other] == "ok" or outcomes[other].startswith("SampleDataError"), outcomes
    appended = outcomes["append-a"] == "ok"
    if other == "add_custom" and not appended:  # add_custom took the lock first: the samples lack its field
        assert outcomes["append-a"].startswith("SampleDataError: Appended samples must have exactly"), outcomes
        assert outcomes[other] == "ok", outcomes
    else:
        assert appended, outcomes
    reader = AtomicDataZarrReader(store)
    deleted = 2 if other == "delete" else 0
    assert len(reader) == (40 if appended else 30) - deleted
    reader.read_packed(np.arange(len(reader)))  # every array agrees with the pointers


# -- a held lock --------------------------------------------------------------------------------------
def test_a_second_writer_is_refused_at_once_naming_the_holder(store: Path) -> None:
    held_r, held_w = FORK.Pipe(duplex=False)
    release_r, release_w = FORK.Pipe(duplex=False)
    proc = _start(_hold, str(store), "append", held_w, release_r)
    pid = held_r.recv()
    try:
        with pytest.raises(StoreLockedError) as caught:
            AtomicDataZarrWriter(store).append(EXTRA["a"])
        message = str(caught.value)
        assert f"pid {pid}" in message and socket.gethostname() in message and "(append, since " in message
        holder = caught.value.holder
        assert isinstance(holder, LockHolder) and holder.pid == pid and holder.operation == "append"
        assert len(AtomicDataZarrReader(store)) == 30  # nothing was written
    finally:
        release_w.send("release")
        _finish(proc)
    AtomicDataZarrWriter(store).append(EXTRA["a"])
    assert len(AtomicDataZarrReader(store)) == 40


def test_a_writer_with_a_timeout_waits_for_the_holder(store: Path) -> None:
    held_r, held_w = FORK.Pipe(duplex=False)
    release_r, release_w = FORK.Pipe(duplex=False)
    proc = _start(_hold, str(store), "delete", held_w, release_r)
    held_r.recv()
    done: list[BaseException | None] = []

    def append() -> None:
        try:
            AtomicDataZarrWriter(store, lock_timeout=HANG_S).append(EXTRA["a"])
            done.append(None)
        except BaseException as err:
            done.append(err)

    waiter = threading.Thread(target=append)
    waiter.start()
    release_w.send("release")
    waiter.join(HANG_S)
    _finish(proc)
    assert done == [None]
    assert len(AtomicDataZarrReader(store)) == 40


def test_recover_does_not_roll_back_a_live_writers_journal(store: Path) -> None:
    reached_r, reached_w = FORK.Pipe(duplex=False)
    go_r, go_w = FORK.Pipe(duplex=False)
    proc = _start(_append_blocked_at, str(store), "data", reached_w, go_r)
    assert reached_r.recv() == "data"
    loc = resolve_store(store, read_only=False, must_exist=True)
    try:
        with pytest.raises(StoreLockedError, match=r"\(append, since"):
            AtomicDataZarrWriter(store).recover()
        assert read_journal(loc) is not None  # the live writer's journal is untouched
    finally:
        go_w.send("go")
        _finish(proc)
    assert read_journal(loc) is None
    assert len(AtomicDataZarrReader(store)) == 40


def test_a_dead_holders_lock_is_taken_over(store: Path) -> None:
    held_r, held_w = FORK.Pipe(duplex=False)
    release_r, release_w = FORK.Pipe(duplex=False)
    proc = _start(_hold, str(store), "append", held_w, release_r)
    pid = held_r.recv()
    release_w.send("die")
    _finish(proc)
    assert json.loads(_lock_file(store).read_text())["pid"] == pid  # left behind by the dead holder
    AtomicDataZarrWriter(store).append(EXTRA["a"])
    assert len(AtomicDataZarrReader(store)) == 40
    assert not _lock_file(store).exists()


def test_a_writer_killed_mid_append_is_rolled_back_by_the_next(store: Path) -> None:
    reached_r, reached_w = FORK.Pipe(duplex=False)
    go_r, _ = FORK.Pipe(duplex=False)
    proc = _start(_append_blocked_at, str(store), "data", reached_w, go_r)
    assert reached_r.recv() == "data"
    os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
    proc.join(HANG_S)
    assert AtomicDataZarrWriter(store).recover() == "append"
    assert len(AtomicDataZarrReader(store)) == 30
    assert not _lock_file(store).exists()


def test_a_lock_held_on_another_host_is_never_taken_over(store: Path) -> None:
    holder = LockHolder(pid=1, host="elsewhere.example", operation="defragment", since=0.0, token="x")
    _lock_file(store).write_text(holder.dumps())
    with pytest.raises(StoreLockedError) as caught:
        AtomicDataZarrWriter(store).delete([0])
    message = str(caught.value)
    assert "pid 1 on host 'elsewhere.example' (defragment, since 1970-01-01 00:00:00 UTC)" in message
    assert str(_lock_file(store)) in message and "another host" in message
    assert len(AtomicDataZarrReader(store)) == 30 and _lock_file(store).exists()


def test_an_unreadable_lock_is_reported_not_removed(store: Path) -> None:
    _lock_file(store).write_text("{not json")
    with pytest.raises(StoreLockedError, match="holds no readable holder"):
        AtomicDataZarrWriter(store).delete([0])
    assert _lock_file(store).read_text() == "{not json"


# -- in one process -----------------------------------------------------------------------------------
def test_the_lock_is_reentrant_in_a_thread_and_refuses_another_thread(store: Path) -> None:
    loc = resolve_store(store, read_only=False, must_exist=True)
    refused: list[BaseException] = []
    with WriterLock(loc, "convert"):
        AtomicDataZarrWriter(store).append(EXTRA["a"])  # nested: the same thread holds it
        thread = threading.Thread(target=lambda: refused.append(_refusal(store)))
        thread.start()
        thread.join(HANG_S)
        assert _lock_file(store).exists()
    assert not _lock_file(store).exists()
    assert len(refused) == 1 and isinstance(refused[0], StoreLockedError)
    assert f"pid {os.getpid()}" in str(refused[0]) and "(convert, since" in str(refused[0])


def _refusal(store: Path) -> BaseException:
    try:
        AtomicDataZarrWriter(store).delete([0])
    except BaseException as err:
        return err
    raise AssertionError("a second thread was let in")


def test_an_in_memory_store_is_locked_under_its_hidden_key() -> None:
    data: dict[str, Any] = {}
    AtomicDataZarrWriter(data, CONFIG).write(BASE)
    loc = resolve_store(data, read_only=False, must_exist=True)
    refused: list[BaseException] = []
    with WriterLock(loc, "defragment"):
        assert ".dali-alchemi-lock.json" in data
        thread = threading.Thread(target=lambda: refused.append(_memory_refusal(data)))
        thread.start()
        thread.join(HANG_S)
    assert ".dali-alchemi-lock.json" not in data
    assert len(refused) == 1 and isinstance(refused[0], StoreLockedError), refused
    AtomicDataZarrWriter(data, CONFIG).append(EXTRA["a"])
    assert len(AtomicDataZarrReader(data)) == 40 and ".dali-alchemi-lock.json" not in data


def _memory_refusal(data: dict[str, Any]) -> BaseException:
    try:
        AtomicDataZarrWriter(data).delete([0])
    except BaseException as err:
        return err
    raise AssertionError("a second thread was let in")


def test_a_negative_timeout_is_refused(store: Path) -> None:
    with pytest.raises(ValueError, match="lock_timeout"):
        AtomicDataZarrWriter(store, lock_timeout=-1)
