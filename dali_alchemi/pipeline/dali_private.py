"""Every use of DALI's private attributes, in one place.

DALI 2.4 gives no public handle on the worker processes of a parallel external source, and
``Pipeline`` has no public way to stop them and free their shared memory before garbage collection.
The loader needs both: to notice a killed worker (DALI itself would block forever) and to close a
pipeline deterministically. This module is the only one that reaches into DALI's internals;
``tests/pipeline/test_dali_private.py`` fails loudly when an installed DALI no longer has them.
"""

from __future__ import annotations

from typing import Any

POOL_ATTRIBUTE = "_py_pool"
"""``Pipeline._py_pool``: the worker pool of the parallel external source (``None`` without one)."""

PROCESSES_PATH = ("pool", "_processes")
"""``_py_pool.pool._processes``: the pool's ``multiprocessing.Process`` objects."""

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


def close_pipeline(pipe: Any | None) -> None:
    """Stop the pipeline's worker processes, free its shared memory and release its buffers."""
    if pipe is None:
        return
    pool = worker_pool(pipe)
    if pool is not None:
        pool.close()
    shutdown = getattr(pipe, SHUTDOWN_METHOD, None)
    if shutdown is not None:
        shutdown()
