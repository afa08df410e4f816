"""AtomicDataZarrReader: nvalchemi-compatible random access with a packed, chunk-aware fast path.

The reader opens a store as one consistent :class:`~dali_alchemi.store.read.snapshot.Snapshot` (pointers,
masks, levels and one decoder per array, checked against the store's cheap invariants) and reads
through a :class:`~dali_alchemi.store.read.engine.BlockEngine`. :meth:`read_packed` reads a window of
samples with no Python loop per sample: every row block the window needs is fetched and decoded at
most once (concurrently, through a byte-bounded cache shared across calls) and scattered into one flat
array per field. :meth:`read` and :meth:`read_many` are built on it and return what nvalchemi 0.2.0's
reader returns. The reader does no prefetching, no ordering and no device transfers.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi import csr
from dali_alchemi.errors import DeviceError, ReaderClosedError, StoreFormatError
from dali_alchemi.remote_config import FetchConfig
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.indices import checked_indices
from dali_alchemi.store.format.location import StoreLike, StoreLocation, resolve_store
from dali_alchemi.store.format.packed import PackedSamples
from dali_alchemi.store.format.protocol import FieldSpec, as_field_names
from dali_alchemi.store.read import geometry, guards
from dali_alchemi.store.read.cache import DEFAULT_CACHE_BYTES
from dali_alchemi.store.read.compressed import inflatable_chunks
from dali_alchemi.store.read.engine import BlockEngine, ReadStats
from dali_alchemi.store.read.identity import SnapshotIdentity, identify
from dali_alchemi.store.read.mapped_pages import MappedPages
from dali_alchemi.store.read.open_checks import memory_budget
from dali_alchemi.store.read.selection import fields_to_read, narrow_fields
from dali_alchemi.store.read.shared import SharedBlocks
from dali_alchemi.store.read.shared_pointers import pointer_folder
from dali_alchemi.store.read.snapshot import Snapshot, open_snapshot

if TYPE_CHECKING:
    import torch
    from numpy.typing import NDArray

    from dali_alchemi.store.read.compressed import CompressedWindow
    from dali_alchemi.types import CountArray, IndexArray, Level

__all__ = ["AtomicDataZarrReader"]


logger = logging.getLogger(__name__)


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
        Read only these fields (core or custom; one name, or several). ``None`` reads every array, as
        nvalchemi does.
    cache_bytes
        Budget of the decoded-chunk cache shared by every array (default 1 GiB; 0 disables it; a read in
        store order still hands the block it ends inside on to the next, one per array).
    num_threads
        Threads that fetch and decode chunks (default: the core count, clamped to 2..8).
    fetch
        Concurrency, retries, back-off and redirects for stores reached over a network (see
        :class:`~dali_alchemi.config.FetchConfig`); reads that keep failing raise ``RemoteReadError``, a redirect
        to another host ``RemoteRedirectError``, and a server's answer of other bytes than a range asked for
        ``RemoteRangeError`` (one that sends whole files is read, with a ``RangeIgnoredWarning``).
    storage_options
        Passed to fsspec when ``store`` is a URL (credentials, ``endpoint_url`` for S3-compatible
        servers, ...).
    shared_cache
        A folder (best on ``/dev/shm``) through which readers in several processes share decoded
        chunks: a chunk one process decoded is mapped by the others instead of decoded again (see
        :mod:`dali_alchemi.store.read.shared`). The loader sets one up for its worker processes.
    shared_pointers
        Where the decoded pointers and mask are kept once per machine, mapped read-only by every
        process that opens the same state of the store (see
        :mod:`dali_alchemi.store.read.shared_pointers`): ``None`` (default) for local stores of
        2^20 structures or more, in this user's folder on ``/dev/shm``; ``True`` for every local store;
        a folder path to use that folder; ``False`` to read them into this process.

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
        fields: str | Iterable[str] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        num_threads: int | None = None,
        fetch: FetchConfig | None = None,
        storage_options: Mapping[str, Any] | None = None,
        shared_cache: str | os.PathLike[str] | None = None,
        shared_pointers: bool | str | os.PathLike[str] | None = None,
    ) -> None:
        if pin_memory and not _cuda_available():
            raise DeviceError("pin_memory=True needs a CUDA build of torch and a visible GPU")
        self._store_arg = store
        self._options: dict[str, Any] = {
            "pin_memory": pin_memory,
            "fields": None if fields is None else as_field_names(fields),
            "cache_bytes": cache_bytes,
            "num_threads": num_threads,
            "fetch": fetch,
            "storage_options": None if storage_options is None else dict(storage_options),
            "shared_cache": None if shared_cache is None else str(shared_cache),
            "shared_pointers": shared_pointers if shared_pointers in (None, True, False) else str(shared_pointers),
        }
        self._pointers = pointer_folder(shared_pointers)
        self.pin_memory = pin_memory
        # existence is checked in refresh(): an interrupted defragment may have moved the store aside
        self._fetch = fetch or FetchConfig()
        self._location: StoreLocation = resolve_store(
            store, read_only=True, must_exist=False, fetch=self._fetch, storage_options=storage_options
        )
        self._engine = BlockEngine(
            cache_bytes=cache_bytes,
            num_threads=num_threads,
            max_concurrency=self._fetch.max_concurrency,
            shared=None if shared_cache is None else SharedBlocks(shared_cache),
        )
        self._closed = False
        self._pid = os.getpid()
        self._max_read_bytes = memory_budget()
        self._mapped = MappedPages()  # bounds the pages of a big shared pointer copy this process maps
        self.refresh()

    # -- opening ------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read pointers, masks, levels and array metadata, and drop cached chunks.

        Call it after another writer appended, deleted or defragmented. Raises
        :class:`ReaderClosedError` on a closed reader.
        """
        self._check_open()
        snapshot = open_snapshot(self._location, shared=self._pointers)
        self._fields: tuple[str, ...] = fields_to_read(snapshot, self._options["fields"])
        self._snapshot: Snapshot = snapshot
        self._engine.attach(snapshot)
        logger.info(
            "opened %s: %d samples (%d physical), %d atoms, %d edges, %d arrays",
            snapshot.location.display,
            snapshot.n_live,
            snapshot.n_physical,
            int(snapshot.atoms_ptr[-1]),
            int(snapshot.edges_ptr[-1]),
            len(snapshot.handles),
        )

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise ReaderClosedError("This AtomicDataZarrReader is closed; open a new one")

    # -- sizes and names ----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Number of live samples (``True`` entries of ``samples_mask``)."""
        return self._snapshot.n_live

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
    def skipped_fields(self) -> dict[str, str]:
        """Arrays this version cannot interpret (a newer writer's levels) and why; ``fields=[one]`` raises that."""
        return dict(self._snapshot.skipped)

    @property
    def field_levels(self) -> dict[str, Level]:
        """Level of every field the reader returns (custom wins on a name collision, as in nvalchemi)."""
        handles = self._snapshot.handles
        return {name: handles[name].level for name in self._fields}

    @property
    def atoms_ptr(self) -> NDArray[np.int64]:
        """The store's ``[N + 1]`` atom pointer over *physical* samples (read-only view)."""
        view = self._snapshot.atoms_ptr.view()
        view.flags.writeable = False
        return view

    @property
    def edges_ptr(self) -> NDArray[np.int64]:
        """The store's ``[N + 1]`` edge pointer over *physical* samples (read-only view)."""
        view = self._snapshot.edges_ptr.view()
        view.flags.writeable = False
        return view

    @property
    def field_specs(self) -> dict[str, FieldSpec]:
        """Level, dtype and trailing shape of every field the reader returns, in its order."""
        return {
            name: FieldSpec(level=h.level, dtype=h.dtype, trailing=h.shape[1:], inflate=inflatable_chunks(h.codec))
            for name, h in ((name, self._snapshot.handles[name]) for name in self._fields)
        }

    def normalize_indices(self, indices: int | Sequence[int] | NDArray[Any]) -> IndexArray:
        """Logical indices as a non-negative int64 array; negatives count from the end.

        Raises
        ------
        SampleIndexError
            Naming the first out-of-range index as given (never wrapped around) and the reader's length.
        ConfigTypeError
            If the indices are not integers (a ``TypeError``).
        """
        return checked_indices(indices, len(self), what="Index")

    def sample_sizes(self, indices: int | Sequence[int] | NDArray[Any]) -> tuple[CountArray, CountArray]:
        """Atom and edge counts of logical samples, from the cached pointers (no array I/O)."""
        snap = self._snapshot
        physical = snap.physical(self.normalize_indices(indices))
        sizes = guards.counts(snap.atoms_ptr, physical), guards.counts(snap.edges_ptr, physical)
        self._pointers_read(snap, physical)
        return sizes

    def _pointers_read(self, snap: Snapshot, physical: IndexArray) -> None:
        """Count a look-up of ``physical``'s pointers (the pages of a big shared copy are let go when due)."""
        self._mapped.read((snap.atoms_ptr, snap.edges_ptr, snap.samples_mask, snap.live), physical.size)

    @property
    def cache_bytes(self) -> int:
        """Budget of the decoded-chunk cache, in bytes."""
        return int(self._options["cache_bytes"])

    def decoded_block_bytes(self) -> dict[str, int]:
        """Decoded bytes of one row block of each selected array that is read by decoding (not in place):
        what one random structure costs per array on a store far larger than the cache (see
        :func:`~dali_alchemi.store.read.geometry.decoded_block_bytes`). Metadata only, no I/O."""
        return geometry.decoded_block_bytes(self._snapshot, self._fields, self._engine.reads_in_place)

    def decoded_blocks_per_pass(self) -> int:
        """Row blocks one pass over the store decodes (:attr:`ReadStats.blocks_decoded` counts them as they are):
        the blocks of the selected arrays read by decoding. Metadata only, no I/O."""
        return geometry.decoded_blocks_per_pass(self._snapshot, self._fields, self._engine.reads_in_place)

    def sample_chunk_bounds(self) -> IndexArray:
        """``[S + 1]`` logical sample offsets of spans aligned with the core per-atom arrays' chunks, so
        that reading a span reads one block of each (see
        :func:`~dali_alchemi.store.read.geometry.sample_chunk_bounds`). Pointers only, no I/O."""
        return geometry.sample_chunk_bounds(self._snapshot, self._engine.reads_in_place)

    def get_metadata(self, index: int) -> tuple[int, int]:
        """``(num_atoms, num_edges)`` of one sample, as nvalchemi's reader returns it."""
        atoms, edges = self.sample_sizes([index])
        return int(atoms[0]), int(edges[0])

    # -- the packed fast path -----------------------------------------------------------------------
    def read_packed(
        self, indices: int | Sequence[int] | NDArray[Any], *, fields: str | Iterable[str] | None = None
    ) -> PackedSamples:
        """Read a window of samples as one flat array per field, in request order.

        Duplicates and negative indices are allowed. Each row block the window needs is fetched and
        decoded at most once; blocks already in the cache are not fetched at all. ``fields`` narrows
        the reader's own field selection for this call. The returned arrays are new (never views of
        the cache); ``neighbor_list`` holds sample-local atom indices.
        """
        self._check_open()
        self._check_process()
        names = self._fields if fields is None else narrow_fields(fields, self._fields, self._snapshot)
        logical = self.normalize_indices(indices)
        if logical.size > 1 and not bool((logical[1:] > logical[:-1]).all()):  # ascending ones are distinct
            unique, inverse = np.unique(logical, return_inverse=True)
            if unique.size < logical.size:  # repeated samples are read once, then copied into place
                return replace(self._read_unique(unique, names).take(inverse.reshape(-1)), logical_indices=logical)
        return self._read_unique(logical, names)

    def read_compressed(self, indices: Sequence[int] | NDArray[Any], *, fields: Iterable[str]) -> CompressedWindow:
        """A window's rows of ``fields`` as the LZ4 chunks holding them, for DALI's GPU inflate (:mod:`.compressed`)."""
        self._check_open()
        self._check_process()
        names, logical = narrow_fields(tuple(fields), self._fields, self._snapshot), self.normalize_indices(indices)
        window = self._engine.read_compressed(self._snapshot, self._snapshot.physical(logical), names)
        if self._check_unchanged():  # the store grew: its last shards' indexes may be stale, so read afresh
            self._engine.attach(self._snapshot)
            window = self._engine.read_compressed(self._snapshot, self._snapshot.physical(logical), names)
        return window

    def _read_unique(self, logical: IndexArray, names: Sequence[str]) -> PackedSamples:
        """:meth:`read_packed` for distinct indices."""
        snap = self._snapshot
        physical = snap.physical(logical)
        guards.check_read_size(snap, logical, physical, names, budget=self._max_read_bytes, source=self.source)
        # An append rewrites the last shard (and the last partial chunk) of every array: the engine's
        # cached shard indexes may then point at the wrong bytes. A read that fails, or that used
        # shard indexes, while the store grew is read once more from a fresh start (attach() drops the
        # indexes and cached blocks); the rows it indexes have not changed, so the values are exact.
        for retry in (False, True):
            stale_indexes = self._engine.holds_shard_indexes()
            try:
                counted = functools.partial(self._pointers_read, snap, physical)
                rows = self._engine.read(snap, physical, names, pointers_read=counted)
            except StoreFormatError as err:  # e.g. a chunk a defragment rewrote in another layout
                if not self._check_unchanged(cause=err) or retry:
                    raise
            else:
                if not self._check_unchanged() or retry or not (stale_indexes or self._engine.holds_shard_indexes()):
                    break
            snap = self._snapshot  # the same state under the new token: the engine starts afresh
        for name in names:
            if name in layout.ATOM_INDEX_FIELDS and rows.fields[name].size:
                csr.rebase(rows.fields[name], rows.atom_starts, rows.n_edges, sign=-1)
                guards.check_local_indices(
                    name, rows.fields[name], logical, physical, rows.n_atoms, rows.n_edges,
                    atoms_ptr=snap.atoms_ptr, source=self.source,
                )  # fmt: skip
        return PackedSamples(
            logical_indices=logical,
            physical_indices=physical,
            n_atoms=rows.n_atoms,
            n_edges=rows.n_edges,
            fields=rows.fields,
            levels={name: snap.handles[name].level for name in names},
        )

    def _check_unchanged(self, cause: BaseException | None = None) -> bool:
        """:func:`~dali_alchemi.store.read.guards.check_unchanged`; ``True``: the store only grew (the
        snapshot is kept under the new token; the read may have used shard indexes the append rewrote)."""
        grown = guards.check_unchanged(
            self._location, self._snapshot, self._fields, source=self.source, cause=cause, shared=self._pointers
        )
        if grown is not None:
            self._snapshot = grown
        return grown is not None

    def _check_process(self) -> None:
        """After a fork (DALI's default way to start workers), reconnect to a non-local store and serve the
        state the parent served, not whatever the store holds now. (The engine rebuilds its own thread pool
        and fetcher after a fork.)"""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        location = guards.reconnected(
            self._location, self._store_arg, fetch=self._fetch, storage_options=self._options["storage_options"]
        )
        if location is not None:
            identity = identify(self._snapshot, self._fields)
            self._location = location
            self._serve(identity)

    def _serve(self, identity: SnapshotIdentity) -> None:
        """Serve exactly the state a parent reader served (a pickled or forked copy), opening the store afresh
        (:func:`~dali_alchemi.store.read.guards.served_snapshot`: ``StoreChangedError`` if it moved)."""
        self._snapshot = guards.served_snapshot(self._location, identity, source=self.source, shared=self._pointers)
        self._fields = tuple(name for name, *_ in identity.fields)
        self._engine.attach(self._snapshot)

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
        import torch  # here, not at import: converting workers and plain numpy readers never need it

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
        return self._engine.stats()

    def close(self) -> None:
        """Release the cache and threads. Idempotent; later reads raise :class:`ReaderClosedError`."""
        if self._closed:
            return
        self._closed = True
        self._engine.close()

    def __enter__(self) -> AtomicDataZarrReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle the recipe, not the handles: a worker process reopens the store itself, and serves
        # the state this reader serves (or raises), not whatever the store holds by then.
        return (_reopen, (self._store_arg, self._options, identify(self._snapshot, self._fields)))

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} samples, {len(self._fields)} fields"
        return f"AtomicDataZarrReader({self.source!r}, {state})"


def _reopen(store: StoreLike, options: dict[str, Any], identity: SnapshotIdentity | None = None) -> AtomicDataZarrReader:
    reader = AtomicDataZarrReader(store, **options)
    if identity is not None:
        reader._serve(identity)
    return reader


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())
