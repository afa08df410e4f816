"""AtomicDataZarrReader: nvalchemi-compatible random access with a packed, chunk-aware fast path.

The reader opens a store once, checks its cheap invariants (pointer shapes and order, mask lengths,
array lengths and dtypes against the levels), and keeps the pointers, the logical-to-physical map and
one :class:`~dali_alchemi.store.codecs.ArrayCodec` per array. :meth:`read_packed` reads a window of
samples with no Python loop per sample: every row block the window needs is fetched and decoded at
most once (concurrently, through a byte-bounded cache shared across calls) and scattered into one flat
array per field. :meth:`read` and :meth:`read_many` are built on it and return what nvalchemi 0.2.0's
reader returns. The reader does no prefetching, no ordering and no device transfers.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import zarr
from zarr.errors import BaseZarrError, ZarrUserWarning
from zarr.storage import LocalStore, MemoryStore

from dali_alchemi import csr
from dali_alchemi.config import FetchConfig
from dali_alchemi.csr import concat_aranges
from dali_alchemi.errors import (
    DeviceError,
    ReaderClosedError,
    ReadTooLargeError,
    SampleIndexError,
    StoreFormatError,
    StoreNotFoundError,
    UnknownFieldError,
    UnsupportedCodecError,
)
from dali_alchemi.store import layout
from dali_alchemi.store.cache import DEFAULT_CACHE_BYTES, BlockCache, CacheStats
from dali_alchemi.store.codecs import MISSING_CHUNK, ArrayCodec
from dali_alchemi.store.fetch import ByteFetcher, ByteRequest, LocalFetcher, StoreFetcher
from dali_alchemi.store.gather import LevelPlan, plan_rows, plan_system_rows
from dali_alchemi.store.journal import ReadView, interpret, read_journal, sibling
from dali_alchemi.store.location import StoreLike, StoreLocation, resolve_store
from dali_alchemi.store.packed import PackedSamples
from dali_alchemi.store.protocol import FieldSpec
from dali_alchemi.store.validate import (
    MetaInfo,
    check_chunk_size,
    check_data_array,
    check_meta,
    memory_budget,
    open_root,
)
from dali_alchemi.types import PerLevel

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import CountArray, IndexArray, Level

logger = logging.getLogger(__name__)

LOAD_ATTEMPTS = 3
"""Times a reader re-reads a store whose metadata a concurrent writer changed while it was opened."""

RESIDENT = -1
"""Cache key (in place of a block index) of an array held whole: read with one take, no scatter."""

INLINE_ROWS = 1 << 15
"""Reads of at most this many rows, all cached, are copied on the calling thread (no pool hand-off)."""


MIN_THREADS, MAX_THREADS = 2, 8
"""Bounds of the default thread count (the core count): decoding overlaps I/O even on one core, and
more than 8 threads only contend for memory bandwidth."""

TASKS_PER_THREAD = 4
"""Block jobs are grouped into this many tasks per thread, so uneven blocks still balance."""


def _default_threads() -> int:
    return max(MIN_THREADS, min(MAX_THREADS, os.cpu_count() or MIN_THREADS))


@dataclass(frozen=True, slots=True)
class _ArrayHandle:
    """One data array: where it lives, its level, and how to decode it (``codec=None``: via zarr)."""

    name: str
    level: Level
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    codec: ArrayCodec | None
    array: Any  # the zarr array, used for the fallback path


@dataclass(frozen=True, slots=True)
class ReadStats:
    """Counters for tests and benchmarks: packed reads, chunk payloads fetched, cache behaviour."""

    packed_reads: int
    samples_read: int
    chunks_fetched: int
    cache: CacheStats


class AtomicDataZarrReader:
    """Read samples of an nvalchemi 0.2.0 Zarr store.

    Parameters
    ----------
    store
        A local path, a URL fsspec understands (``memory://``, ``http://``, ``s3://``...), a zarr
        ``Store``/``StorePath``, or a ``dict`` used as in-memory storage.
    pin_memory
        Return pinned tensors from :meth:`read`/:meth:`read_many` (one pinned copy per field per call).
        Needs CUDA; raises ``RuntimeError`` at construction otherwise.
    fields
        Read only these fields (core or custom). ``None`` reads every array, as nvalchemi does.
    cache_bytes
        Budget of the decoded-chunk cache shared by every array (default 1 GiB; 0 disables it).
    num_threads
        Threads that fetch and decode chunks (default: the core count, clamped to 2..8).
    fetch
        Concurrency, retries and back-off for stores reached over a network (see
        :class:`~dali_alchemi.config.FetchConfig`); reads that keep failing raise ``RemoteReadError``.
    storage_options
        Passed to fsspec when ``store`` is a URL (credentials, ``endpoint_url`` for S3-compatible
        servers, ...).

    Raises
    ------
    StoreNotFoundError
        If a local path does not exist (also a ``FileNotFoundError``).
    StoreFormatError
        If the store is not a zarr v3 group or its layout is inconsistent (also a ``ValueError``).
    """

    def __init__(
        self,
        store: StoreLike,
        *,
        pin_memory: bool = False,
        fields: Iterable[str] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        num_threads: int | None = None,
        fetch: FetchConfig | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if pin_memory and not torch.cuda.is_available():
            raise DeviceError("pin_memory=True needs a CUDA build of torch and a visible GPU")
        self._store_arg = store
        self._options: dict[str, Any] = {
            "pin_memory": pin_memory,
            "fields": None if fields is None else tuple(fields),
            "cache_bytes": cache_bytes,
            "num_threads": num_threads,
            "fetch": fetch,
            "storage_options": None if storage_options is None else dict(storage_options),
        }
        self.pin_memory = pin_memory
        # existence is checked in refresh(): an interrupted defragment may have moved the store aside
        self._fetch = fetch or FetchConfig()
        self._location: StoreLocation = resolve_store(
            store, read_only=True, must_exist=False, fetch=self._fetch, storage_options=storage_options
        )
        self._cache = BlockCache(cache_bytes)
        self._num_threads = num_threads or _default_threads()
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid = -1
        self._executor_lock = threading.Lock()
        self._fetcher: ByteFetcher | None = None
        self._closed = False
        self._pid = os.getpid()
        self._packed_reads = 0
        self._samples_read = 0
        self._chunks_fetched = 0
        self._shard_indexes: dict[tuple[str, str], NDArray[np.uint64]] = {}
        self._max_read_bytes = memory_budget()
        self.refresh()

    # -- opening ------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read pointers, masks, levels and array metadata, and drop cached chunks.

        Call it after another writer appended, deleted or defragmented. Raises
        :class:`ReaderClosedError` on a closed reader.
        """
        self._check_open()
        loc, meta, handles = self._load_consistent()
        self._schema = meta.schema
        self._atoms_ptr = meta.atoms_ptr
        self._edges_ptr = meta.edges_ptr
        self._samples_mask = meta.samples_mask
        self._active: IndexArray = np.flatnonzero(meta.samples_mask).astype(np.int64)
        levels = {name: handle.level for name, handle in handles.items()}
        self._fetcher = None  # follows the location, which a defragment may have moved
        self._handles = handles
        self._levels = levels
        requested = self._options["fields"]
        if requested is not None:
            unknown = sorted(set(requested) - set(handles))
            if unknown:
                raise UnknownFieldError(
                    f"Unknown fields {unknown} for store {loc.display}; available: {sorted(handles)}"
                )
            self._fields: tuple[str, ...] = tuple(requested)
        else:
            self._fields = tuple(handles)
        self._cache.clear()
        self._shard_indexes.clear()
        logger.info(
            "opened %s: %d samples (%d physical), %d atoms, %d edges, %d arrays",
            loc.display,
            len(self._active),
            meta.n_physical,
            int(meta.atoms_ptr[-1]),
            int(meta.edges_ptr[-1]),
            len(handles),
        )

    def _load_consistent(self) -> tuple[StoreLocation, MetaInfo, dict[str, _ArrayHandle]]:
        """Load the store's metadata as one consistent state while a writer may be working.

        A writer can start or finish an operation between reading the journal and reading the arrays;
        then the journal is read again and the load retried, so the result is the old or the new
        state, never a mix of the two.
        """
        for attempt in range(LOAD_ATTEMPTS):
            op = read_journal(self._location)
            view = interpret(op)
            loc = _effective_location(self._location, view)
            try:
                with warnings.catch_warnings():
                    # a journal inside a non-local store is a foreign key to zarr's group listing
                    warnings.simplefilter("ignore", ZarrUserWarning)
                    root = open_root(loc)
                    meta = check_meta(root, store=loc.display, view=view)
                    handles = self._open_arrays(root, meta, loc, view)
            except (StoreFormatError, BaseZarrError, KeyError, TypeError, json.JSONDecodeError) as err:
                if attempt + 1 < LOAD_ATTEMPTS and read_journal(self._location) != op:
                    continue  # a write started or finished under us: read again
                if isinstance(err, StoreFormatError):
                    raise
                raise StoreFormatError(
                    f"Store {loc.display}: unreadable metadata: {type(err).__name__}: {err}"
                ) from err
            if read_journal(self._location) == op:
                self._read_location = loc
                return loc, meta, handles
        raise StoreFormatError(f"Store {self._location.display} kept changing while it was opened; try again")

    def _open_arrays(self, root: Any, meta: MetaInfo, loc: StoreLocation, view: ReadView) -> dict[str, _ArrayHandle]:
        """Check every core and custom array and prepare its decoder.

        A custom array that an unfinished ``add_custom`` is writing is not part of the store yet; if it
        replaces an older array, that older one (possibly moved aside) is read instead.
        """
        expected_rows = PerLevel(atom=int(meta.atoms_ptr[-1]), edge=int(meta.edges_ptr[-1]), system=meta.n_physical)
        arrays: list[tuple[str, str, Any, dict[str, Level]]] = []
        for group_name, recorded in ((layout.CORE_GROUP, meta.schema.core), (layout.CUSTOM_GROUP, meta.schema.custom)):
            if group_name not in meta.groups:
                continue
            for name, arr in sorted(root[group_name].arrays()):
                arrays.append((group_name, name, arr, recorded))
        key = view.hidden_custom
        if key is not None:
            arrays = [a for a in arrays if not (a[0] == layout.CUSTOM_GROUP and a[1] == key)]
            if view.replaced_level is not None:
                moved = (
                    sibling(self._location, view.moved_aside)
                    if self._location.local_root is not None and view.moved_aside is not None
                    else None
                )
                old = (
                    zarr.open_array(str(moved), mode="r")
                    if moved is not None and moved.exists()
                    else root[f"{layout.CUSTOM_GROUP}/{key}"]
                )
                arrays.append((layout.CUSTOM_GROUP, key, old, {key: view.replaced_level}))
        handles: dict[str, _ArrayHandle] = {}
        for group_name, name, arr, recorded in arrays:
            level = check_data_array(
                arr, name=name, group=group_name, recorded=recorded, expected_rows=expected_rows,
                store=loc.display, growing=meta.growing,
            )  # fmt: skip
            check_chunk_size(arr, name=f"{group_name}/{name}", store=loc.display)
            codec: ArrayCodec | None = None
            if arr.store_path.store is loc.store:  # arrays moved aside are read through zarr
                try:
                    codec = ArrayCodec(name=f"{group_name}/{name}", path=arr.store_path.path, metadata=arr.metadata)
                except UnsupportedCodecError as err:
                    logger.info("array %s/%s read through zarr: %s", group_name, name, err)
            handles[name] = _ArrayHandle(
                name=name, level=level, shape=tuple(arr.shape), dtype=np.dtype(arr.dtype), codec=codec, array=arr
            )
        return handles

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise ReaderClosedError("This AtomicDataZarrReader is closed; open a new one")

    # -- sizes and names ----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Number of live samples (``True`` entries of ``samples_mask``)."""
        return int(self._active.size)

    @property
    def store(self) -> StoreLike:
        """The store argument this reader was opened with."""
        return self._store_arg

    @property
    def source(self) -> str:
        """A display name of the store (its path or URL)."""
        return self._location.display

    @property
    def field_names(self) -> tuple[str, ...]:
        """The fields this reader returns (all arrays, or the ``fields=`` selection), in store order."""
        return self._fields

    @property
    def field_levels(self) -> dict[str, Level]:
        """Level of every field the reader returns (custom wins on a name collision, as in nvalchemi)."""
        return {name: self._levels[name] for name in self._fields}

    @property
    def atoms_ptr(self) -> NDArray[np.int64]:
        """The store's ``[N + 1]`` atom pointer over *physical* samples (read-only view)."""
        view = self._atoms_ptr.view()
        view.flags.writeable = False
        return view

    @property
    def edges_ptr(self) -> NDArray[np.int64]:
        """The store's ``[N + 1]`` edge pointer over *physical* samples (read-only view)."""
        view = self._edges_ptr.view()
        view.flags.writeable = False
        return view

    @property
    def field_specs(self) -> dict[str, FieldSpec]:
        """Level, dtype and trailing shape of every field the reader returns, in its order."""
        return {
            name: FieldSpec(level=h.level, dtype=h.dtype, trailing=h.shape[1:])
            for name, h in ((name, self._handles[name]) for name in self._fields)
        }

    def normalize_indices(self, indices: int | Sequence[int] | NDArray[Any]) -> IndexArray:
        """Logical indices as a non-negative int64 array; negatives count from the end.

        Raises
        ------
        SampleIndexError
            Naming the first out-of-range index and the reader's length.
        TypeError
            If the indices are not integers.
        """
        arr = np.asarray(indices)
        if arr.dtype == np.bool_ or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise TypeError(f"Sample indices must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64, copy=False).reshape(-1)
        n = len(self)
        bad = (arr < -n) | (arr >= n)
        if bad.any():
            first = int(arr[np.argmax(bad)])
            raise SampleIndexError(f"Index {first} out of range for reader with {n} samples")
        return np.where(arr < 0, arr + n, arr)

    def sample_sizes(self, indices: int | Sequence[int] | NDArray[Any]) -> tuple[CountArray, CountArray]:
        """Atom and edge counts of logical samples, from the cached pointers (no array I/O)."""
        physical = self._active[self.normalize_indices(indices)]
        return (
            self._atoms_ptr[physical + 1] - self._atoms_ptr[physical],
            self._edges_ptr[physical + 1] - self._edges_ptr[physical],
        )

    def get_metadata(self, index: int) -> tuple[int, int]:
        """``(num_atoms, num_edges)`` of one sample, as nvalchemi's reader returns it."""
        atoms, edges = self.sample_sizes([index])
        return int(atoms[0]), int(edges[0])

    # -- the packed fast path -----------------------------------------------------------------------
    def read_packed(
        self, indices: int | Sequence[int] | NDArray[Any], *, fields: Iterable[str] | None = None
    ) -> PackedSamples:
        """Read a window of samples as one flat array per field, in request order.

        Duplicates and negative indices are allowed. Each row block the window needs is fetched and
        decoded at most once; blocks already in the cache are not fetched at all. ``fields`` narrows
        the reader's own field selection for this call. The returned arrays are new (never views of
        the cache); ``neighbor_list`` holds sample-local atom indices.
        """
        self._check_open()
        self._check_process()
        names = self._fields if fields is None else self._select(fields)
        logical = self.normalize_indices(indices)
        unique, inverse = np.unique(logical, return_inverse=True)
        if unique.size < logical.size:
            # Repeated samples are read once and then copied into place.
            packed = self._read_unique(unique, names)
            return replace(packed.take(inverse.reshape(-1)), logical_indices=logical)
        return self._read_unique(logical, names)

    def _read_unique(self, logical: IndexArray, names: Sequence[str]) -> PackedSamples:
        """:meth:`read_packed` for distinct indices: sorted rows are then non-decreasing per level."""
        physical = self._active[logical]
        self._check_read_size(logical, physical, names)
        order = np.argsort(physical, kind="stable")
        atom_plan, n_atoms = plan_rows(self._atoms_ptr, physical, order)
        edge_plan, n_edges = plan_rows(self._edges_ptr, physical, order)
        plans: dict[Level, LevelPlan] = {
            "atom": atom_plan,
            "edge": edge_plan,
            "system": plan_system_rows(physical, order),
        }
        outputs: dict[str, NDArray[Any]] = {}
        for name in names:
            handle = self._handles[name]
            outputs[name] = np.empty((plans[handle.level].total, *handle.shape[1:]), dtype=handle.dtype)
        counts: dict[Level, NDArray[np.int64]] = {"atom": n_atoms, "edge": n_edges}
        ptrs: dict[Level, NDArray[np.int64]] = {"atom": self._atoms_ptr, "edge": self._edges_ptr}

        def request_rows(level: Level) -> NDArray[np.int64]:
            if level == "system":
                return physical
            return concat_aranges(ptrs[level][physical], counts[level])

        self._gather(names, plans, outputs, request_rows)
        for name in names:
            if name in layout.ATOM_INDEX_FIELDS and outputs[name].size:
                csr.rebase(outputs[name], self._atoms_ptr[physical], n_edges, sign=-1)
                self._check_local_indices(name, outputs[name], logical, physical, n_atoms, n_edges)
        self._packed_reads += 1
        self._samples_read += int(logical.size)
        return PackedSamples(
            logical_indices=logical,
            physical_indices=physical,
            n_atoms=n_atoms,
            n_edges=n_edges,
            fields=outputs,
            levels={name: self._levels[name] for name in names},
        )

    def _check_read_size(self, logical: IndexArray, physical: IndexArray, names: Sequence[str]) -> None:
        """Refuse, before allocating anything, a read whose output could not fit in memory."""
        counts = {
            "atom": self._atoms_ptr[physical + 1] - self._atoms_ptr[physical],
            "edge": self._edges_ptr[physical + 1] - self._edges_ptr[physical],
        }
        row_bytes = {"atom": 16, "edge": 16, "system": 0}  # the row plan: source and destination indices
        for name in names:
            handle = self._handles[name]
            row_bytes[handle.level] += int(np.prod(handle.shape[1:], dtype=np.int64)) * handle.dtype.itemsize
        per_sample = counts["atom"] * row_bytes["atom"] + counts["edge"] * row_bytes["edge"] + row_bytes["system"]
        if int(per_sample.sum(dtype=np.float64)) <= self._max_read_bytes:
            return
        worst = int(np.argmax(per_sample))
        raise ReadTooLargeError(
            f"Store {self.source}: reading {len(logical)} samples needs {per_sample.sum(dtype=np.float64) / 2**30:,.1f} GiB, "
            f"more than half of this machine's memory; the largest, sample {int(logical[worst])} (physical "
            f"{int(physical[worst])}), claims {int(counts['atom'][worst]):,} atoms and {int(counts['edge'][worst]):,} edges"
        )

    def _check_local_indices(
        self, name: str, values: NDArray[Any], logical: IndexArray, physical: IndexArray,
        n_atoms: CountArray, n_edges: CountArray,
    ) -> None:  # fmt: skip
        """Every re-based index must point inside its own sample; a store that says otherwise is corrupt."""
        bad = csr.first_out_of_range(values, n_atoms, n_edges)
        if bad is None:
            return
        edge, sample = bad
        raise StoreFormatError(
            f"Store {self.source}: {name} of sample {int(logical[sample])} (physical {int(physical[sample])}) holds "
            f"{(values[edge] + self._atoms_ptr[physical[sample]]).tolist()}, outside its atom rows "
            f"[{int(self._atoms_ptr[physical[sample]])}, {int(self._atoms_ptr[physical[sample] + 1])})"
        )

    def _select(self, fields: Iterable[str]) -> tuple[str, ...]:
        names = tuple(fields)
        unknown = sorted(set(names) - set(self._fields))
        if unknown:
            raise UnknownFieldError(f"Unknown fields {unknown}; this reader returns {list(self._fields)}")
        if not names:
            raise ValueError("fields must name at least one field")
        return names

    def _check_process(self) -> None:
        """After a fork (DALI's default way to start workers), reconnect to a non-local store.

        Connections to remote stores belong to the parent's event loop and are unusable in a forked
        child, so the child opens its own: from the URL again, or from a pickled copy of the store.
        """
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        if self._location.local_root is not None or isinstance(self._location.store, MemoryStore):
            return
        arg = self._store_arg
        fresh = pickle.loads(pickle.dumps(arg)) if not isinstance(arg, (str, os.PathLike)) else arg
        self._location = resolve_store(
            fresh, read_only=True, must_exist=False, fetch=self._fetch, storage_options=self._options["storage_options"]
        )
        self.refresh()

    def _pool(self) -> ThreadPoolExecutor:
        # Threads do not survive fork (DALI's default worker start): rebuild the pool in a new process.
        with self._executor_lock:
            if self._executor is None or self._executor_pid != os.getpid():
                self._executor = ThreadPoolExecutor(self._num_threads, thread_name_prefix="dali-alchemi-read")
                self._executor_pid = os.getpid()
                self._fetcher = None
            if self._fetcher is None:
                self._fetcher = self._make_fetcher(self._executor)
            return self._executor

    def _io_fetcher(self) -> ByteFetcher:
        """The fetcher for this process and location (built with the thread pool it reads on)."""
        self._pool()
        assert self._fetcher is not None
        return self._fetcher

    def _make_fetcher(self, executor: ThreadPoolExecutor) -> ByteFetcher:
        """Direct file reads for a local directory, the store's own async reads otherwise.

        Chunk keys are paths from the root of the zarr store (a StorePath's prefix included), so a
        local fetcher reads relative to that root, not to the group the reader opened.
        """
        store = self._read_location.store
        if isinstance(store, LocalStore):
            return LocalFetcher(Path(store.root), executor)
        return StoreFetcher(store, max_concurrency=self._fetch.max_concurrency)

    def _gather(
        self,
        names: Sequence[str],
        plans: dict[Level, LevelPlan],
        outputs: dict[str, NDArray[Any]],
        request_rows: Callable[[Level], NDArray[np.int64]],
    ) -> None:
        """Fill ``outputs``.

        Arrays held whole in the cache (*resident*) are read with one take in request order. For the
        others, the blocks missing from the cache are fetched in one concurrent batch, then every block
        is decoded and scattered on the thread pool (each block's rows go to disjoint output rows). An
        array whose every block this call touched, and that fits in a quarter of the cache, is then
        stitched into one resident array for later calls.
        """
        block_plans: dict[tuple[Level, int], tuple[NDArray[np.int64], NDArray[np.int64]]] = {}
        jobs: list[_BlockJob] = []
        resident: list[tuple[str, NDArray[Any]]] = []
        to_stitch: list[str] = []
        for name in names:
            handle = self._handles[name]
            plan = plans[handle.level]
            if plan.total == 0:
                continue
            if handle.codec is None:
                outputs[name][plan.dest] = handle.array.get_orthogonal_selection((plan.rows,))
                continue
            whole = self._cache.get((name, RESIDENT)) if self._cache.peek((name, RESIDENT)) is not None else None
            if whole is not None:
                resident.append((name, whole))
                continue
            key = (handle.level, handle.codec.block_rows)
            if key not in block_plans:
                block_plans[key] = plan.blocks(handle.codec.block_rows)
            blocks, bounds = block_plans[key]
            for k, block in enumerate(blocks.tolist()):
                cached = self._cache.get((name, block))
                jobs.append(_BlockJob(handle, block, plan, int(bounds[k]), int(bounds[k + 1]), cached))
            nbytes = handle.codec.row_nbytes * handle.shape[0]
            if blocks.size == handle.codec.n_blocks and nbytes <= self._cache.capacity_bytes // 4:
                to_stitch.append(name)
        missing = [job for job in jobs if job.data is None]
        if missing:
            fetched = self._fetch_blocks([(job.handle.codec, job.block) for job in missing])  # type: ignore[misc]
            for job, payloads in zip(missing, fetched, strict=True):
                job.payloads = payloads

        def run(group: list[_BlockJob]) -> None:
            for job in group:
                codec = job.handle.codec
                assert codec is not None
                if job.data is None:
                    job.data = codec.decode_block(job.block, *job.payloads)  # type: ignore[misc]
                    self._cache.put((job.handle.name, job.block), job.data)
                _scatter(outputs[job.handle.name], job.plan, job.lo, job.hi, job.data, job.block * codec.block_rows)

        def take(item: tuple[str, NDArray[Any]]) -> None:
            name, whole = item
            rows = request_rows(self._handles[name].level)
            np.take(_rows_view(whole), rows, out=_rows_view(outputs[name]))

        rows = sum(job.hi - job.lo for job in jobs) + sum(outputs[name].shape[0] for name, _ in resident)
        if not missing and rows <= INLINE_ROWS:
            run(jobs)  # small and cached: a thread hand-off would cost more than the copies
            for item in resident:
                take(item)
        else:
            pool = self._pool()
            tasks = [pool.submit(run, group) for group in _balanced_groups(jobs, self._num_threads * TASKS_PER_THREAD)]
            tasks += [pool.submit(take, item) for item in resident]
            for task in tasks:
                task.result()
        for name in to_stitch:
            self._stitch(name, [job for job in jobs if job.handle.name == name])

    def _stitch(self, name: str, jobs: list[_BlockJob]) -> None:
        """Replace an array's cached blocks by one resident copy of the whole array."""
        blocks = sorted(((job.block, job.data) for job in jobs), key=lambda item: item[0])
        if any(data is None for _, data in blocks) or [b for b, _ in blocks] != list(range(len(blocks))):
            return
        whole = np.concatenate([data for _, data in blocks], axis=0)  # type: ignore[misc]
        for block, _ in blocks:
            self._cache.pop((name, block))
        self._cache.put((name, RESIDENT), whole)

    def _fetch_blocks(self, blocks: list[tuple[ArrayCodec, int]]) -> list[tuple[list[Any | None], list[str]]]:
        """Fetch every chunk payload of the given row blocks in one concurrent batch (two for shards)."""
        fetcher = self._io_fetcher()
        locations = [codec.chunks_of_block(block) for codec, block in blocks]
        # Sharded arrays: make sure every needed shard index is known, fetching the missing ones together.
        index_requests: dict[tuple[str, str], tuple[ArrayCodec, ByteRequest]] = {}
        for (codec, _), locs in zip(blocks, locations, strict=True):
            if not codec.sharded:
                continue
            for _, loc in locs:
                ikey = (codec.name, loc.key)
                if ikey not in self._shard_indexes and ikey not in index_requests:
                    request = (
                        ByteRequest(loc.key, suffix=codec.index_nbytes)
                        if codec.index_at_end
                        else ByteRequest(loc.key, start=0, stop=codec.index_nbytes)
                    )
                    index_requests[ikey] = (codec, request)
        if index_requests:
            raw = fetcher.fetch([req for _, req in index_requests.values()])
            for (ikey, (codec, _)), payload in zip(index_requests.items(), raw, strict=True):
                if payload is None:
                    self._shard_indexes[ikey] = _missing_index(codec)
                else:
                    self._shard_indexes[ikey] = codec.parse_shard_index(ikey[1], payload)
        requests: list[ByteRequest | None] = []
        for (codec, _), locs in zip(blocks, locations, strict=True):
            for _, loc in locs:
                if not codec.sharded:
                    requests.append(ByteRequest(loc.key))
                    continue
                index = self._shard_indexes[(codec.name, loc.key)]
                span = codec.shard_payload_range(index, loc.inner_index)
                requests.append(None if span is None else ByteRequest(loc.key, start=span[0], stop=span[1]))
        present = [r for r in requests if r is not None]
        fetched = iter(fetcher.fetch(present))
        self._chunks_fetched += len(present)
        result: list[tuple[list[Any | None], list[str]]] = []
        wanted = iter(requests)
        for locs in locations:
            chunk_payloads = [None if next(wanted) is None else next(fetched) for _ in locs]
            result.append((chunk_payloads, [loc.key for _, loc in locs]))
        return result

    # -- nvalchemi-compatible API -------------------------------------------------------------------
    def read_many(self, indices: Sequence[int] | NDArray[Any]) -> list[tuple[dict[str, torch.Tensor], dict[str, Any]]]:
        """Read samples in request order as nvalchemi's reader does: ``[(tensors, metadata), ...]``.

        Tensors are CPU tensors in the stored dtype (pinned with ``pin_memory=True``); atom and edge
        tensors of one call are views into one block per field. System fields keep nvalchemi's leading
        1 (energy ``[1, 1]``, cell ``[1, 3, 3]``). ``neighbor_list`` is sample-local. Metadata is
        ``{"index": int, "source_file": str, "physical_index": str}`` (a string, as in nvalchemi).
        """
        logical = self.normalize_indices(indices)
        if logical.size == 0:
            return []
        packed = self.read_packed(logical)
        blocks = {name: torch.from_numpy(arr) for name, arr in packed.fields.items()}
        if self.pin_memory:
            blocks = {name: t.pin_memory() for name, t in blocks.items()}
        samples = replace(packed, fields=blocks).split()  # type: ignore[arg-type]  # tensors slice like arrays
        metadata = (
            {"index": index, "source_file": self.source, "physical_index": str(phys)}
            for index, phys in zip(packed.logical_indices.tolist(), packed.physical_indices.tolist(), strict=True)
        )
        return list(zip(samples, metadata, strict=True))  # type: ignore[arg-type]

    def read(self, index: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """One sample: ``(tensors, metadata)`` as in :meth:`read_many`."""
        return self.read_many([index])[0]

    def __getitem__(self, index: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return self.read(index)

    # -- bookkeeping --------------------------------------------------------------------------------
    def stats(self) -> ReadStats:
        """Counters of packed reads, samples, chunk payloads fetched and cache behaviour so far."""
        return ReadStats(
            packed_reads=self._packed_reads,
            samples_read=self._samples_read,
            chunks_fetched=self._chunks_fetched,
            cache=CacheStats(**{f: getattr(self._cache.stats, f) for f in CacheStats.__slots__}),
        )

    def close(self) -> None:
        """Release the cache and threads. Idempotent; later reads raise :class:`ReaderClosedError`."""
        if self._closed:
            return
        self._closed = True
        self._cache.clear()
        if self._executor is not None and self._executor_pid == os.getpid():
            self._executor.shutdown(wait=True)
        self._executor = None

    def __enter__(self) -> AtomicDataZarrReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle the recipe, not the handles: a worker process reopens the store itself.
        return (_reopen, (self._store_arg, self._options))

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} samples, {len(self._fields)} fields"
        return f"AtomicDataZarrReader({self.source!r}, {state})"


@dataclass(slots=True)
class _BlockJob:
    """One row block of one array in a read: where its rows go, and its data or payloads."""

    handle: _ArrayHandle
    block: int
    plan: LevelPlan
    lo: int
    hi: int
    data: NDArray[Any] | None
    payloads: tuple[list[Any | None], list[str]] | None = None


def _balanced_groups(jobs: list[_BlockJob], n_groups: int) -> list[list[_BlockJob]]:
    """Split jobs into at most ``n_groups`` lists of similar row counts (greedy, largest first)."""
    if len(jobs) <= n_groups:
        return [[job] for job in jobs]
    sizes = np.array([job.hi - job.lo + (job.hi - job.lo if job.data is None else 0) for job in jobs])
    loads = np.zeros(n_groups)
    groups: list[list[_BlockJob]] = [[] for _ in range(n_groups)]
    for i in np.argsort(-sizes, kind="stable").tolist():
        g = int(np.argmin(loads))
        groups[g].append(jobs[i])
        loads[g] += sizes[i]
    return [g for g in groups if g]


def _effective_location(loc: StoreLocation, view: ReadView) -> StoreLocation:
    """Where to read: the store itself, or, in the instant a defragment swaps directories, the new one."""
    if loc.local_root is None or loc.local_root.exists():
        return loc
    if not view.fallback_dirs:
        raise StoreNotFoundError(f"Zarr store does not exist at {loc.display}")
    for candidate in (sibling(loc, suffix) for suffix in view.fallback_dirs):
        if candidate.exists():
            return StoreLocation(
                store=LocalStore(candidate, read_only=True), prefix="", display=loc.display, local_root=candidate
            )
    raise StoreNotFoundError(f"Zarr store does not exist at {loc.display} (an interrupted defragment left no copy)")


def _reopen(store: StoreLike, options: dict[str, Any]) -> AtomicDataZarrReader:
    return AtomicDataZarrReader(store, **options)


def _missing_index(codec: ArrayCodec) -> NDArray[np.uint64]:
    """Shard index of a shard that does not exist: every inner chunk missing (fill value)."""
    n_inner = int(np.prod(codec.chunks_per_shard))
    return np.full((n_inner, 2), MISSING_CHUNK, dtype=np.uint64)


def _rows_view(arr: NDArray[Any]) -> NDArray[Any]:
    """``arr`` as a 1-D array of opaque rows, so fancy indexing moves each row with one copy."""
    if arr.ndim == 1:
        return arr
    row_bytes = arr.dtype.itemsize * int(np.prod(arr.shape[1:]))
    return arr.reshape(arr.shape[0], -1).view(np.dtype((np.void, row_bytes))).reshape(arr.shape[0])


def _scatter(out: NDArray[Any], plan: LevelPlan, lo: int, hi: int, block: NDArray[Any], first_row: int) -> None:
    """Copy plan rows ``[lo, hi)`` (all inside one block starting at ``first_row``) to their destinations."""
    rows = plan.rows[lo:hi] - first_row
    dest = plan.dest[lo:hi]
    _rows_view(out)[dest] = np.take(_rows_view(block), rows)
