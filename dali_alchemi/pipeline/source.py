"""The external-source callable: ``(epoch_idx, iteration) -> one window of packed samples``.

A DALI *iteration* here is one *window*: ``batches_per_window`` consecutive training batches of the
plan's epoch, read with **one** call to the reader's packed path. The window goes through DALI as one
sample per output: every field flat (atoms ``[ΣV, *t]``, edges ``[ΣE, *t]``, systems ``[B, *t]``), the
per-structure atom and edge counts and reader indices, and the window's batch bounds, the offsets the
plan chose, which travel with the data to the iterator so nothing downstream re-derives a batch. The
``"blob"`` layout packs every output into one byte buffer instead (one host-to-device copy per window).
Everything is derived from DALI's ``BatchInfo`` and the plan, so the callable is stateless in meaning
(it caches the current epoch's plan) and can run in any DALI worker process; it raises
``StopIteration`` for every iteration past the end of the epoch.

Errors are re-raised with a ``[dali-alchemi:TypeName]`` prefix, because DALI's worker processes
forward only an exception's text; the iterator turns that back into a
:class:`~dali_alchemi.errors.LoaderError` carrying the original type name and message.
"""

from __future__ import annotations

import copyreg
import logging
import os
import re
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.collate import collate_on_host
from dali_alchemi.config import LAYOUTS
from dali_alchemi.errors import ConfigError, LoaderError
from dali_alchemi.store.format.layout import ATOM_INDEX_FIELDS
from dali_alchemi.types import PerLevel

if TYPE_CHECKING:
    from collections.abc import Mapping

    from numpy.typing import NDArray

    from dali_alchemi.pipeline.inflate import InflateRoute
    from dali_alchemi.plan.base import EpochPlan, Plan
    from dali_alchemi.store.format.protocol import FieldSpec, PackedReader
    from dali_alchemi.types import Level

__all__ = [
    "BATCH_BOUNDS", "BATCH_IDX", "BLOB", "BLOB_ALIGN", "BLOB_OUTPUTS", "HEADER", "INDICES", "N_ATOMS",
    "N_EDGES", "READ_AHEAD_CLOSE_TIMEOUT_S", "BlobEntry", "OutputSpec", "ReadAheadSource", "WindowSource",
    "blob_entries", "loader_error", "output_specs", "pack_blob", "source_error"
]


N_ATOMS = "__n_atoms"
N_EDGES = "__n_edges"
INDICES = "__indices"
BATCH_BOUNDS = "__batch_bounds"
BATCH_IDX = "__batch_idx"
BLOB = "__blob"
HEADER = "__header"

logger = logging.getLogger(__name__)

READ_AHEAD_CLOSE_TIMEOUT_S = 5.0
"""How long closing the read-ahead source waits for the read in progress."""

BLOB_ALIGN = 8
"""Byte alignment of every array in a window blob, so each can be viewed with its own dtype."""

_MARKER = re.compile(r"\[dali-alchemi:(?P<type>[A-Za-z_][\w.]*)\] (?P<message>.*?)(?:\n|$)", re.S)


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """One pipeline output: a field (or a count/index array), its dtype, rank and level.

    ``level=None`` marks a per-window array (the batch bounds), which is never placed in a blob.
    """

    name: str
    dtype: np.dtype[Any]
    trailing: tuple[int, ...]
    level: Level | None
    placement: str = "device"  # on a GPU: "device" goes .gpu(), "host" stays, "both" does each
    hint_row_bytes: int | None = None
    """Bytes per row for sizing DALI's shared memory where a row is not ``dtype`` x ``trailing``: a field's
    compressed blocks count as its decoded row bytes, at least what a store-order window sends. A shuffled
    window sends every whole chunk it touches, which can be several times that; DALI's shared memory then
    grows to fit, at the price of a reallocation."""

    @property
    def row_bytes(self) -> int:
        """Bytes one row of this output takes in a window, as far as sizing shared memory goes."""
        if self.hint_row_bytes is not None:
            return self.hint_row_bytes
        return int(np.prod(self.trailing, dtype=np.int64)) * self.dtype.itemsize

    @property
    def is_field(self) -> bool:
        return not self.name.startswith("__")

    @property
    def ndim(self) -> int:
        return 1 + len(self.trailing)


def output_specs(
    field_specs: Mapping[str, FieldSpec], fields: tuple[str, ...], *, host_collation: bool = False
) -> tuple[OutputSpec, ...]:
    """The pipeline outputs for ``fields``: one per field, then counts, indices and the batch bounds.

    With ``host_collation`` the source also emits the per-atom batch index and batch-offset neighbor
    lists (see :func:`~dali_alchemi.collate.collate_on_host`): the CPU path then does that work in the
    worker processes instead of the training process.
    """
    specs = []
    for name in fields:
        spec = field_specs[name]
        specs.append(OutputSpec(name=name, dtype=spec.dtype, trailing=spec.trailing, level=spec.level))
    int64 = np.dtype(np.int64)
    specs += [
        OutputSpec(N_ATOMS, int64, (), "system", "both"),
        OutputSpec(N_EDGES, int64, (), "system", "both"),
        OutputSpec(INDICES, int64, (), "system", "host"),
        OutputSpec(BATCH_BOUNDS, int64, (), None, "host"),
    ]
    if host_collation:
        specs.append(OutputSpec(BATCH_IDX, np.dtype(np.int32), (), "atom"))
    return tuple(specs)


BLOB_OUTPUTS = (
    OutputSpec(BLOB, np.dtype(np.uint8), (), "system", "device"),
    OutputSpec(HEADER, np.dtype(np.int64), (), "system", "host"),
)
"""The pipeline outputs of the ``"blob"`` layout: the window's bytes, and its sizes on the host."""


@dataclass(frozen=True, slots=True)
class BlobEntry:
    """Where one array sits in a window blob."""

    name: str
    offset: int
    rows: int
    trailing: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def nbytes(self) -> int:
        return self.rows * int(np.prod(self.trailing, dtype=np.int64)) * self.dtype.itemsize


def blob_entries(specs: tuple[OutputSpec, ...], structures: int, atoms: int, edges: int) -> tuple[list[BlobEntry], int]:
    """The position of every output in the blob of a window of that size, and the blob's length.

    The source packs and the iterator unpacks with this one function, so they always agree. Per-window
    outputs (the batch bounds) travel in the header, not the blob.
    """
    rows = PerLevel(atom=atoms, edge=edges, system=structures)
    entries, offset = [], 0
    for spec in specs:
        if spec.level is None:
            continue
        entry = BlobEntry(spec.name, offset, rows[spec.level], spec.trailing, spec.dtype)
        entries.append(entry)
        offset += -(-entry.nbytes // BLOB_ALIGN) * BLOB_ALIGN
    return entries, offset


def pack_blob(
    arrays: dict[str, NDArray[Any]],
    specs: tuple[OutputSpec, ...],
    n_atoms: NDArray[np.int64],
    n_edges: NDArray[np.int64],
    indices: NDArray[np.int64],
    batch_bounds: NDArray[np.int64],
) -> tuple[list[NDArray[Any]], list[NDArray[Any]]]:
    """One window as a byte blob of every output (device side) and a header of sizes (host side).

    The header is ``[B, V, E, n_atoms (B), n_edges (B), indices (B), batch bounds (b + 1)]`` int64, so
    the host knows every size, the blob's layout and where each batch ends without reading device memory.
    """
    structures, atoms, edges = int(n_atoms.size), int(n_atoms.sum()), int(n_edges.sum())
    entries, total = blob_entries(specs, structures, atoms, edges)
    blob = np.empty(total, dtype=np.uint8)
    for entry in entries:
        blob[entry.offset : entry.offset + entry.nbytes] = (
            np.ascontiguousarray(arrays[entry.name]).reshape(-1).view(np.uint8)
        )
    header = np.concatenate(
        [np.array([structures, atoms, edges], dtype=np.int64), n_atoms, n_edges, indices, batch_bounds]
    )
    return [blob], [header]


def standard_exception_pickling() -> None:
    """Drop the exception reducers other libraries registered process-wide (``tblib``, which
    ``distributed`` installs when imported), so a DALI worker pickles exceptions (``StopIteration`` at
    the end of every epoch) as Python does: DALI's restricted unpickler refuses any other global, and
    a worker forked from a process that imported ``distributed`` could otherwise hand back no window."""
    for kind, reducer in list(copyreg.dispatch_table.items()):
        if isinstance(kind, type) and issubclass(kind, BaseException):
            if str(getattr(reducer, "__module__", "")).startswith("tblib"):
                del copyreg.dispatch_table[kind]


def source_error(err: BaseException) -> RuntimeError:
    """An exception whose text carries ``err``'s type name and message through DALI."""
    return RuntimeError(f"[dali-alchemi:{type(err).__name__}] {err}")


def loader_error(err: BaseException) -> LoaderError:
    """Turn an exception raised by a DALI pipeline back into a :class:`LoaderError` with the original type."""
    for candidate in (err, err.__cause__, err.__context__):
        if candidate is None:
            continue
        if isinstance(candidate, LoaderError):
            return candidate
        match = _MARKER.search(str(candidate))
        if match:
            kind, message = match.group("type"), match.group("message").strip()
            return LoaderError(f"{kind}: {message}", original_type=kind)
    return LoaderError(f"{type(err).__name__}: {err}", original_type=type(err).__name__)


class WindowSource:
    """Reads window ``iteration`` of epoch ``start_epoch + epoch_idx`` of ``plan`` as one packed read.

    The first epoch this source produces may resume at ``start_batch``; later ones start at 0.
    Pickling drops the cached epoch plan; the reader pickles as a recipe and reopens in the worker.
    """

    def __init__(
        self,
        reader: PackedReader,
        plan: Plan,
        specs: tuple[OutputSpec, ...],
        *,
        batches_per_window: int,
        start_epoch: int = 0,
        start_batch: int = 0,
        layout: str = "window",
        route: InflateRoute | None = None,
    ) -> None:
        if layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if (layout == "inflate") != (route is not None):
            raise ConfigError("layout='inflate' and an inflate route go together")
        self.layout = layout
        self.route = route
        self.reader = reader
        self.plan = plan
        self.specs = specs
        self.fields = tuple(spec.name for spec in specs if spec.is_field)
        self.batches_per_window = batches_per_window
        self.start_epoch = start_epoch
        self.start_batch = start_batch
        self._epoch_plan: EpochPlan | None = None
        self._owner_pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_epoch_plan"] = None
        return state

    def epoch_of(self, epoch_idx: int) -> tuple[int, int]:
        """The epoch and its first batch for DALI's ``epoch_idx``."""
        return self.start_epoch + epoch_idx, self.start_batch if epoch_idx == 0 else 0

    def epoch_plan(self, epoch: int) -> EpochPlan:
        """The plan of ``epoch`` (computed once per epoch and process)."""
        if self._epoch_plan is None or self._epoch_plan.epoch != epoch:
            self._epoch_plan = self.plan.epoch(epoch)
        return self._epoch_plan

    def num_windows(self, epoch_idx: int) -> int:
        """Windows in DALI epoch ``epoch_idx``."""
        epoch, first_batch = self.epoch_of(epoch_idx)
        return self.epoch_plan(epoch).num_windows(self.batches_per_window, first_batch, ramp=True)

    def read_window(self, epoch_idx: int, iteration: int) -> tuple[list[NDArray[Any]], ...]:
        """One window as a tuple of outputs, each a list with one array (one DALI sample).

        Every epoch ramps its windows up (1, 2, 4, ... batches, :func:`~dali_alchemi.plan.base.window_starts`):
        nothing is read ahead across an epoch's end, so its first batch waits for one batch's reads only.
        """
        epoch, first_batch = self.epoch_of(epoch_idx)
        epoch_plan = self.epoch_plan(epoch)
        if iteration >= epoch_plan.num_windows(self.batches_per_window, first_batch, ramp=True):
            raise StopIteration
        window = epoch_plan.window(iteration, self.batches_per_window, first_batch, ramp=True)
        if self.route is not None:
            return self.route.read(self.reader, window)
        packed = self.reader.read_packed(window.indices, fields=self.fields)
        arrays: dict[str, NDArray[Any]] = {
            **packed.fields,
            N_ATOMS: packed.n_atoms,
            N_EDGES: packed.n_edges,
            INDICES: packed.logical_indices,
            BATCH_BOUNDS: window.batch_bounds,
        }
        if any(spec.name == BATCH_IDX for spec in self.specs):
            index_fields = {name: packed.fields[name] for name in self.fields if name in ATOM_INDEX_FIELDS}
            arrays[BATCH_IDX] = collate_on_host(index_fields, packed.n_atoms, packed.n_edges, window.batch_bounds)
        if self.layout == "blob":
            return pack_blob(
                arrays, self.specs, packed.n_atoms, packed.n_edges, packed.logical_indices, window.batch_bounds
            )
        return tuple([arrays[spec.name]] for spec in self.specs)

    def __call__(self, info: Any) -> tuple[list[NDArray[Any]], ...]:
        if os.getpid() != self._owner_pid:  # a DALI worker process: once per process
            standard_exception_pickling()
            self._owner_pid = os.getpid()
        try:
            return self.read_window(info.epoch_idx, info.iteration)
        except StopIteration:
            raise
        except Exception as err:
            raise source_error(err) from err


class ReadAheadSource:
    """In-process prefetching around a :class:`WindowSource`: reads the next ``depth`` windows on a thread.

    DALI calls a non-parallel source on the thread that runs the pipeline; this wrapper hands it a
    window read in the background, so reading overlaps the training step. Results are kept alive for
    ``keep_alive`` calls because the pipeline shares their buffers (``no_copy=True``).
    """

    def __init__(self, source: WindowSource, *, depth: int = 2, keep_alive: int = 4) -> None:
        if depth < 1:
            raise ConfigError(f"read-ahead depth must be >= 1, got {depth}")
        self.source = source
        self.depth = depth
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dali-alchemi-readahead")
        self._pending: dict[tuple[int, int], Future[tuple[list[NDArray[Any]], ...]]] = {}
        self._alive: deque[Any] = deque(maxlen=keep_alive)
        self._lock = threading.Lock()

    def _submit(self, key: tuple[int, int]) -> None:
        if key not in self._pending and key[1] < self.source.num_windows(key[0]):
            self._pending[key] = self._executor.submit(self.source.read_window, *key)

    def __call__(self, info: Any) -> tuple[list[NDArray[Any]], ...]:
        key = (info.epoch_idx, info.iteration)
        with self._lock:
            for stale in [k for k in self._pending if k[0] < key[0] or (k[0] == key[0] and k[1] < key[1])]:
                self._pending.pop(stale).cancel()
            if key[1] >= self.source.num_windows(key[0]):
                raise StopIteration
            self._submit(key)
            future = self._pending.pop(key)
            for ahead in range(1, self.depth + 1):
                self._submit((key[0], key[1] + ahead))
        try:
            result = future.result()
        except Exception as err:
            raise source_error(err) from err
        self._alive.append(result)
        return result

    def close(self, timeout: float = READ_AHEAD_CLOSE_TIMEOUT_S) -> None:
        """Cancel pending reads and stop the thread, waiting at most ``timeout`` for a read in progress."""
        with self._lock:
            running = [future for future in self._pending.values() if not future.cancel()]
            self._pending.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
        if running and wait(running, timeout=timeout).not_done:
            logger.warning("a read-ahead read did not finish within %.1f s; leaving it behind", timeout)
        self._alive.clear()
