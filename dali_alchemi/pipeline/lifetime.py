"""Worker processes end with the training process, however it ends.

DALI's worker processes are plain children of the training process. When that process is killed
(SIGTERM from ``timeout``, SLURM, ``docker stop`` or Kubernetes, SIGHUP when its terminal goes,
SIGKILL), nothing tells them: they are re-parented and wait for tasks forever, holding their memory.
Three layers make them go:

1. **In each worker**, as it starts (:func:`arm_worker`): Linux's ``PR_SET_PDEATHSIG`` sends it
   SIGKILL the moment its parent dies, and a watchdog thread ends it within
   :data:`WATCHDOG_INTERVAL_S` of its parent process changing (``os.getppid()``), where prctl is not
   available or not safe to use (it fires when the *thread* that started the worker ends, so it is
   set only when workers are started from the main thread). The worker ignores SIGINT: Ctrl-C reaches
   the whole process group, and the training process, which gets the ``KeyboardInterrupt``, stops the
   workers itself; a worker killed by Ctrl-C in the middle of DALI's queue handshake could leave a
   queue's lock held, and the training process waiting on it for ever. SIGTERM and SIGHUP are reset
   to their default (a forked worker would otherwise inherit the training process's handlers).
2. **In the training process**, SIGTERM and SIGHUP whose handler is still the default first stop the
   workers of every open loader, then take their default action: the process dies by the signal,
   with the exit status it would have had. A handler the program installed itself is left alone.
3. **At interpreter exit** every open loader is closed (each wait bounded) before DALI's exit hooks
   close its pools without a bound and multiprocessing's joins the workers.

Workers are armed when they start: fork-started ones by an ``os.register_at_fork`` hook that is active
only while a pipeline starts its workers (:func:`starting_workers`), spawn-started ones when the
:class:`WorkerGuard` travelling with the source is unpickled in them.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import multiprocessing.util  # noqa: F401  (its exit hook is registered first, so ours runs before it)
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "DEFERRED_SIGNALS", "PARENT_SIGNALS", "SIGNAL_STOP_TIMEOUT_S", "WATCHDOG_INTERVAL_S", "GuardedSource",
    "WorkerGuard", "WorkerOwner", "arm_worker", "register", "starting_workers", "stop_all_workers",
    "unregister"
]


logger = logging.getLogger(__name__)

WATCHDOG_INTERVAL_S = 0.25
"""How often a worker's watchdog thread checks that its parent process is still the one that started it."""

SIGNAL_STOP_TIMEOUT_S = 2.0
"""How long a SIGTERM or SIGHUP waits for the workers it killed to be reaped before the process dies."""

PARENT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals whose default action (terminate) the training process precedes by stopping the workers."""

DEFERRED_SIGNALS = (signal.SIGINT, *PARENT_SIGNALS)
"""Signals whose Python handlers wait while the workers are forked (see :func:`starting_workers`)."""

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any | None:
    """libc's ``prctl``, looked up once in the training process (not in a freshly forked child)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None


_PRCTL = _load_prctl()


# -- the worker side ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WorkerGuard:
    """What a worker needs to end with its parent: the parent's pid, and whether prctl may be used.

    Unpickling a guard in any other process than ``parent_pid`` arms that process (spawn-started
    workers receive the source, and with it the guard, that way).
    """

    parent_pid: int
    deathsig: bool

    @classmethod
    def for_current_thread(cls) -> WorkerGuard:
        """The guard for workers started now by this thread (prctl only from the main thread)."""
        return cls(os.getpid(), deathsig=threading.current_thread() is threading.main_thread())

    def __reduce__(self) -> tuple[Any, tuple[int, bool]]:
        return (_unpickle_guard, (self.parent_pid, self.deathsig))


def _unpickle_guard(parent_pid: int, deathsig: bool) -> WorkerGuard:
    guard = WorkerGuard(parent_pid, deathsig)
    if os.getpid() != parent_pid:
        arm_worker(guard)
    return guard


_armed_pid: int | None = None


def arm_worker(guard: WorkerGuard) -> None:
    """Make this (worker) process end when ``guard.parent_pid`` ends; idempotent per process."""
    global _armed_pid
    if _armed_pid == os.getpid():
        return
    _armed_pid = os.getpid()
    with contextlib.suppress(ValueError):  # signal.signal outside the main thread: keep what there is
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for signum in PARENT_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
    if guard.deathsig and _PRCTL is not None and _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        logger.debug("prctl(PR_SET_PDEATHSIG) failed (errno %d); the watchdog remains", ctypes.get_errno())
    if os.getppid() != guard.parent_pid:  # the parent died before the death signal was set
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(
        target=_watch_parent, args=(guard.parent_pid,), name="dali-alchemi-parent-watchdog", daemon=True
    ).start()


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCHDOG_INTERVAL_S)
    os.kill(os.getpid(), signal.SIGKILL)


_starting: WorkerGuard | None = None


def _arm_forked_child() -> None:
    global _starting
    guard, _starting = _starting, None  # a process the worker forks in turn is not a worker of ours
    if guard is not None:
        arm_worker(guard)


os.register_at_fork(after_in_child=_arm_forked_child)


@contextlib.contextmanager
def starting_workers(guard: WorkerGuard, *, fork: bool) -> Iterator[None]:
    """While a pipeline starts its workers: arm every process forked meanwhile with ``guard``.

    Spawn-started workers are armed by the guard that their source carries instead. With ``fork``,
    the Python-level handlers of SIGINT, SIGTERM and SIGHUP are deferred until the workers have
    started (:func:`_signals_deferred`).
    """
    global _starting
    _starting = guard
    try:
        with _signals_deferred() if fork else contextlib.nullcontext():
            yield
    finally:
        _starting = None
        _exit_hook_last()  # after DALI's exit hooks for this pipeline, so that ours runs before them


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold the Python-level handlers of SIGINT, SIGTERM and SIGHUP, then run them for what arrived.

    A handler that runs while ``os.fork()`` calls its hooks in the parent is lost: Python reports an
    exception raised there (the ``KeyboardInterrupt`` of a Ctrl-C) as "ignored" and carries on, so
    the training loop would go on as if Ctrl-C had not been pressed. Signals whose action is the
    default or ignore are not Python handlers and are left as they are.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # Python runs handlers on the main thread only: this thread's forks are not interrupted
        return
    pending: list[int] = []
    held = {signum: handler for signum in DEFERRED_SIGNALS if callable(handler := signal.getsignal(signum))}
    for signum in held:
        signal.signal(signum, lambda arrived, frame: pending.append(arrived))
    try:
        yield
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)
        for arrived in dict.fromkeys(pending):
            signal.raise_signal(arrived)


class GuardedSource:
    """A parallel external source that carries a :class:`WorkerGuard` to the workers it is pickled to.

    The guard is the first attribute, so a spawn-started worker is armed before the source itself (and
    the reader it reopens) is unpickled.
    """

    def __init__(self, source: Any, guard: WorkerGuard) -> None:
        self.guard = guard
        self.source = source

    def __call__(self, info: Any) -> Any:
        return self.source(info)


# -- the training-process side ---------------------------------------------------------------------
class WorkerOwner(Protocol):
    """What the training process needs of an open loader: stop its workers now, or close it."""

    def kill_workers(self, timeout: float) -> None: ...

    def close(self) -> None: ...


_owners: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # loader -> pid that opened it
_handled: dict[int, int] = {}  # signal -> pid of the process that installed our handler


def _own_owners() -> list[Any]:
    """The open loaders of this process (a forked child's copies belong to its parent)."""
    pid = os.getpid()
    return [owner for owner, opened_by in list(_owners.items()) if opened_by == pid]


def register(owner: WorkerOwner) -> None:
    """Track an open loader, and install the SIGTERM/SIGHUP handlers (main thread, default handlers only)."""
    _owners[owner] = os.getpid()
    _exit_hook_last()
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in PARENT_SIGNALS:
        if _handled.get(signum) == os.getpid():
            continue  # installed once: a handler the program set since then is its choice
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _on_parent_signal)
            _handled[signum] = os.getpid()


def unregister(owner: WorkerOwner) -> None:
    """Stop tracking a closed loader."""
    _owners.pop(owner, None)


def stop_all_workers(timeout: float = SIGNAL_STOP_TIMEOUT_S) -> None:
    """Kill the workers of every open loader of this process, waiting at most ``timeout`` in all."""
    deadline = time.monotonic() + timeout
    for owner in _own_owners():
        try:
            owner.kill_workers(max(0.0, deadline - time.monotonic()))
        except Exception:  # the process is going down: try every loader
            logger.debug("error while stopping a loader's workers", exc_info=True)


def _on_parent_signal(signum: int, frame: Any) -> None:
    if _handled.get(signum) == os.getpid():  # not in a child that inherited the handler by fork
        stop_all_workers()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # the default action: the process ends by this signal


def _close_all_at_exit() -> None:
    for owner in _own_owners():
        try:
            owner.close()
        except Exception:
            logger.debug("error while closing a loader at exit", exc_info=True)


def _exit_hook_last() -> None:
    """(Re-)register the exit hook, so that it runs before every exit hook registered so far.

    Exit hooks run last registered first: ours must close the loaders (every wait bounded) before
    DALI's hooks close its pools and pipelines without a bound, and before multiprocessing's joins the
    workers.
    """
    atexit.unregister(_close_all_at_exit)
    atexit.register(_close_all_at_exit)


_exit_hook_last()
