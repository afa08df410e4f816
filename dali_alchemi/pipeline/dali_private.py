"""Every use of DALI's private attributes, in one place.

DALI 2.4 gives no public handle on the worker processes of a parallel external source, and
``Pipeline`` has no public way to stop them and free their shared memory before garbage collection.
The loader needs both: to notice a killed worker (DALI itself would block forever) and to close a
pipeline deterministically. This module is the only one that reaches into DALI's internals;
``tests/pipeline/test_dali_private.py`` fails loudly when an installed DALI no longer has them.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

__all__ = [
    "CLOSE_TIMEOUT_S", "OBSERVER_PATH", "POOL_ATTRIBUTE", "PROCESSES_PATH", "SHUTDOWN_METHOD",
    "close_pipeline", "disarm_pool", "kill_workers", "worker_pool", "worker_processes", "workers_hidden"
]


logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0
"""How long closing a pipeline waits for DALI to stop its workers before killing them."""

POOL_ATTRIBUTE = "_py_pool"
"""``Pipeline._py_pool``: the worker pool of the parallel external source (``None`` without one)."""

PROCESSES_PATH = ("pool", "_processes")
"""``_py_pool.pool._processes``: the pool's ``multiprocessing.Process`` objects."""

OBSERVER_PATH = ("pool", "_observer")
"""``_py_pool.pool._observer``: DALI's thread that stops the workers; ``None`` makes the pool's ``close()`` a no-op."""

SHUTDOWN_METHOD = "_shutdown"
"""``Pipeline._shutdown()``: releases the pipeline's executor and buffers now rather than at collection."""


def worker_pool(pipe: Any) -> Any | None:
    """The pipeline's worker pool, or ``None`` (no parallel source, or DALI's layout changed)."""
    return getattr(pipe, POOL_ATTRIBUTE, None)


def worker_processes(pipe: Any) -> list[Any]:
    """The multiprocessing.Process objects of a pipeline's parallel external source (empty without one)."""
    node: Any = worker_pool(pipe)
    for name in PROCESSES_PATH:
        node = getattr(node, name, None)
    return list(node or [])


def workers_hidden(pipe: Any) -> bool:
    """Whether the pipeline has workers that this module cannot see (DALI's private layout changed)."""
    return bool(getattr(pipe, "py_num_workers", 0)) and worker_pool(pipe) is not None and not worker_processes(pipe)


def kill_workers(pipe: Any | None, timeout: float) -> None:
    """SIGKILL every live worker process of the pipeline and reap them, waiting at most ``timeout`` in all.

    Safe to call from a signal handler and while another thread is stuck inside DALI: it touches only
    the processes, none of DALI's queues or locks.
    """
    procs = [proc for proc in worker_processes(pipe) if proc.exitcode is None]
    for proc in procs:
        try:
            proc.kill()
        except (OSError, ValueError):  # already reaped, or the Process object was closed
            continue
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.join(max(0.0, deadline - time.monotonic()))
        except (OSError, ValueError, AssertionError):
            continue


def disarm_pool(pipe: Any | None) -> None:
    """Make the pool's ``close()`` return at once, for a pool whose own stopping thread is stuck.

    DALI closes the pool again when the pipeline is collected and at interpreter exit; that close
    would wait for the stuck thread for ever.
    """
    node: Any = worker_pool(pipe)
    for name in OBSERVER_PATH[:-1]:
        node = getattr(node, name, None)
    if node is not None and hasattr(node, OBSERVER_PATH[-1]):
        setattr(node, OBSERVER_PATH[-1], None)


def _close_pool(pool: Any) -> None:
    try:
        pool.close()
    except Exception:  # reported, then the workers are checked and killed like a pool that hangs
        logger.warning("DALI's worker pool failed to close", exc_info=True)


def close_pipeline(pipe: Any | None, timeout: float = CLOSE_TIMEOUT_S) -> bool:
    """Stop the pipeline's worker processes, free its shared memory and release its buffers.

    DALI stops its workers through their queues; when that does not finish within ``timeout`` (a
    worker died holding a queue's lock, say), the workers are killed instead and the pipeline is not
    shut down (returns ``False``: the caller keeps it referenced and never uses it again). The shared
    memory goes with the last process that maps it, so it is freed either way.
    """
    if pipe is None:
        return True
    pool = worker_pool(pipe)
    if pool is not None:
        closer = threading.Thread(target=_close_pool, args=(pool,), name="dali-alchemi-close", daemon=True)
        closer.start()
        closer.join(timeout)
        if closer.is_alive():
            logger.warning("DALI did not stop its worker processes within %.1f s; killing them", timeout)
            kill_workers(pipe, timeout)
            disarm_pool(pipe)
            return False
    shutdown = getattr(pipe, SHUTDOWN_METHOD, None)
    if shutdown is not None:
        shutdown()
    return True
