"""From DALI outputs to :class:`~dali_alchemi.batch.Batch` objects, with no per-sample Python work.

Each pipeline output is a ragged list of samples; it is viewed as one flat tensor without a copy
(``as_reshaped_tensor`` then DLPack), and :func:`~dali_alchemi.batch.collate` cuts the window into
Batches whose tensors are views of it. ``batch_ptr``, ``batch_idx`` and the neighbor-list offsets are
computed on the output's device (or were computed by the source, on the CPU path).

The pipeline runs on a *runner* thread that hands finished windows to the consumer through a small
queue, so DALI's work overlaps the training step. The consumer waits with a timeout and checks that
DALI's worker processes are alive: DALI itself can block forever when a worker dies, so a killed
worker becomes a :class:`~dali_alchemi.errors.LoaderError` within a fraction of a second. No reading
and no planning happen here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dali_alchemi.batch import Batch, collate
from dali_alchemi.errors import LoaderError
from dali_alchemi.pipeline.dali_private import worker_processes, workers_hidden
from dali_alchemi.pipeline.inflate import ATOM_STARTS, ROWS, assemble
from dali_alchemi.pipeline.source import (
    BATCH_BOUNDS,
    BATCH_IDX,
    BLOB,
    HEADER,
    INDICES,
    N_ATOMS,
    N_EDGES,
    OutputSpec,
    blob_entries,
    loader_error,
)

if TYPE_CHECKING:
    from dali_alchemi.pipeline.build import PipelineOutputs
    from dali_alchemi.pipeline.inflate import InflateRoute
    from dali_alchemi.types import Level

__all__ = ["STOP_TIMEOUT_S", "WORKER_POLL_S", "Handoff", "WindowIterator", "dead_worker"]


logger = logging.getLogger(__name__)

WORKER_POLL_S = 0.2
"""How often a waiting consumer checks DALI's worker processes."""

STOP_TIMEOUT_S = 3.0
"""How long :meth:`WindowIterator.stop` waits for the runner thread to finish the window it is in."""

_END = object()


class Handoff:
    """A bounded hand-off of windows from the runner thread to the consumer that Ctrl-C cannot wedge.

    The consumer is usually the main thread, where a ``KeyboardInterrupt`` lands between any two
    bytecodes. ``queue.Queue`` and ``threading.Event`` are Python code around a lock: an interrupt
    between their acquire and release leaves the lock held (the next ``get``, the one :meth:`drain`
    makes on the way out, then deadlocks) or released twice (``RuntimeError: release unlocked lock``).
    Here every operation is a single call into C (``SimpleQueue``), which an interrupt leaves intact.
    ``capacity`` windows at most wait in it, each holding one slot.
    """

    def __init__(self, capacity: int) -> None:
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._slots: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(capacity):
            self._slots.put(None)

    def put(self, item: Any, timeout: float) -> bool:
        """Hand ``item`` over once a slot is free; ``False`` when none freed up within ``timeout`` seconds."""
        try:
            self._slots.get(timeout=timeout)
        except queue.Empty:
            return False
        self._items.put(item)
        return True

    def get(self, timeout: float) -> Any:
        """The next item, freeing its slot; raises ``queue.Empty`` after ``timeout`` seconds without one."""
        item = self._items.get(timeout=timeout)
        self._slots.put(None)
        return item

    def drain(self) -> None:
        """Drop every waiting item, so that a runner blocked on a full hand-off can see it should stop."""
        while True:
            try:
                self._items.get_nowait()
            except queue.Empty:
                return
            self._slots.put(None)

_TORCH_DTYPES: dict[Any, torch.dtype] = {
    np.dtype(t): torch.from_numpy(np.zeros(1, dtype=t)).dtype
    for t in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64)
}


def _flat_view(tensor_list: Any, trailing: tuple[int, ...]) -> torch.Tensor:
    """A DALI TensorList's samples, concatenated on dim 0, as one torch tensor (zero-copy when contiguous)."""
    rows = sum(int(shape[0]) for shape in tensor_list.shape())
    return torch.from_dlpack(tensor_list.as_reshaped_tensor([rows, *trailing]))


@functools.cache
def _warn_unwatched() -> None:
    logger.warning(
        "cannot see DALI's worker processes (its private pool layout changed); a killed worker may hang "
        "the loader instead of raising LoaderError"
    )


def dead_worker(pipe: Any) -> str | None:
    """A description of the first DALI worker that has exited, or ``None`` while all are alive."""
    for proc in worker_processes(pipe):
        code = proc.exitcode
        if code is not None:
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            return f"DALI worker process {proc.pid} exited unexpectedly ({how})"
    return None


class WindowIterator:
    """Iterates one epoch of a built pipeline, yielding each window as a list of Batches.

    Raises :class:`~dali_alchemi.errors.LoaderError` (with the original exception's type name and
    message) when the source or a worker failed, and when a worker process died. Stops at the end of
    the epoch; the caller then resets the pipeline. After a dead worker, or a runner thread that did
    not stop in time, :attr:`broken` is set: the pipeline is wedged inside DALI and must be abandoned,
    not reused or shut down.
    """

    def __init__(
        self, pipe: Any, outputs: PipelineOutputs, specs: tuple[OutputSpec, ...], device: torch.device,
        route: InflateRoute | None = None,
    ) -> None:  # fmt: skip
        self.pipe = pipe
        self.outputs = outputs
        self.specs = specs  # what the window holds; with the blob layout, what the blob holds
        self.route = route  # the inflate layout's fields, inflated on the device
        self.trailing = {spec.name: spec.trailing for spec in specs}
        self.levels: dict[str, Level] = {spec.name: spec.level for spec in specs if spec.is_field and spec.level}
        if route is not None:
            self.trailing.update({f.name: (f.chunk_bytes,) for f in route.inflated})  # an inflated output: chunk bytes
            self.levels.update({f.name: f.level for f in route.inflated})
            self.levels = {name: self.levels[name] for name in route.fields}
        self.device = device
        self.broken = False
        self._handoff = Handoff(capacity=2)
        self._stopping = False  # a plain flag, not an Event: setting it cannot be interrupted halfway
        self._thread: threading.Thread | None = None
        self._stream = torch.cuda.current_stream(device) if device.type == "cuda" else None

    # -- the runner thread --------------------------------------------------------------------------
    def _produce(self) -> None:
        try:
            if self._stream is not None:
                torch.cuda.set_device(self.device)
            with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
                while not self._stopping:
                    try:
                        raw = tuple(self.pipe.run(self._stream) if self._stream is not None else self.pipe.run())
                    except StopIteration:
                        self._put(_END)
                        return
                    self._put(self._to_batches(raw))
        except BaseException as err:  # handed to the consumer, which raises it
            self._put(err)

    def _put(self, item: Any) -> None:
        while not self._stopping:
            if self._handoff.put(item, timeout=WORKER_POLL_S):
                return

    # -- the consumer -------------------------------------------------------------------------------
    def windows(self) -> Iterator[list[Batch]]:
        """Yield each window of the epoch as a list of Batches."""
        if workers_hidden(self.pipe):
            _warn_unwatched()
        self._thread = threading.Thread(target=self._produce, name="dali-alchemi-pipeline", daemon=True)
        self._thread.start()
        try:
            while True:
                item = self._next()
                if item is _END:
                    return
                yield item
        finally:
            self.stop()

    def _next(self) -> Any:
        while True:
            try:
                item = self._handoff.get(timeout=WORKER_POLL_S)
            except queue.Empty:
                problem = dead_worker(self.pipe)
                if problem is None and self._thread is not None and not self._thread.is_alive():
                    problem = "the pipeline thread stopped without a result"
                if problem is not None:
                    self.broken = True
                    raise LoaderError(problem, original_type="WorkerDied") from None
                continue
            if isinstance(item, BaseException):
                problem = dead_worker(self.pipe)
                if problem is not None:  # DALI's own error only says that receiving was interrupted
                    raise LoaderError(f"{problem}: {item}", original_type="WorkerDied") from item
                raise loader_error(item) from item
            return item

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Stop the runner thread, waiting at most ``timeout`` seconds; whether the pipeline is still usable.

        A runner that does not finish in time is stuck inside DALI (a worker died holding one of its
        locks, say): :attr:`broken` is set and the pipeline must be abandoned, not reused or shut down.
        """
        self._stopping = True
        self._handoff.drain()  # unblock a runner waiting to put
        if self._thread is not None and not self.broken:
            try:
                self._thread.join(timeout)
            except RuntimeError:  # start() was interrupted: the thread never runs, or sees the stop flag first
                pass
            if self._thread.is_alive():
                logger.warning("the pipeline thread did not stop within %.1f s; abandoning its pipeline", timeout)
                self.broken = True
        return not self.broken

    def _to_batches(self, raw: tuple[Any, ...]) -> list[Batch]:
        n_device = len(self.outputs.device_names)
        on_device = dict(zip(self.outputs.device_names, raw[:n_device], strict=True))
        on_host = dict(zip(self.outputs.host_names, raw[n_device:], strict=True)) or on_device
        if BLOB in on_device:
            flat, host = self._unpack_blob(on_device[BLOB], on_host[HEADER])
        else:
            flat = {name: _flat_view(on_device[name], self.trailing[name]) for name in on_device}
            host = {name: _flat_view(on_host[name], ()).numpy() for name in (N_ATOMS, N_EDGES, INDICES, BATCH_BOUNDS)}
            if self.route is not None:
                flat.update(assemble(
                    flat, {f.name: flat[ROWS + f.name] for f in self.route.inflated}, self.route,
                    n_atoms=flat[N_ATOMS], n_edges=flat[N_EDGES], atom_starts=flat.get(ATOM_STARTS),
                    host_n_edges=host[N_EDGES], sample_indices=host[INDICES],
                ))  # fmt: skip
        return collate(
            fields={name: flat[name] for name in self.levels},
            levels=self.levels,
            n_atoms=flat[N_ATOMS],
            n_edges=flat[N_EDGES],
            host_n_atoms=host[N_ATOMS],
            host_n_edges=host[N_EDGES],
            batch_bounds=host[BATCH_BOUNDS],
            sample_indices=host[INDICES],
            batch_idx=flat.get(BATCH_IDX),
        )

    def _unpack_blob(self, blob: Any, header: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Typed zero-copy views of every array in a window blob, and the host copies of the sizes."""
        sizes = _flat_view(header, ()).numpy()
        structures, atoms, edges = (int(v) for v in sizes[:3])
        host = {
            N_ATOMS: sizes[3 : 3 + structures],
            N_EDGES: sizes[3 + structures : 3 + 2 * structures],
            INDICES: sizes[3 + 2 * structures : 3 + 3 * structures],
            BATCH_BOUNDS: sizes[3 + 3 * structures :],
        }
        data = _flat_view(blob, ())
        entries, _ = blob_entries(self.specs, structures, atoms, edges)
        flat = {
            e.name: data[e.offset : e.offset + e.nbytes].view(_TORCH_DTYPES[e.dtype]).view(e.rows, *e.trailing)
            for e in entries
        }
        return flat, host
