"""Checking a whole store: every chunk decoded once, checksums, pointers, masks and neighbor lists.

Opening a store checks only its cheap invariants, and a reader decodes only the chunks it reads, so
damage in a chunk nobody has read yet stays hidden until training reaches it. :func:`verify_store`
is the check to run before a long job: it decodes every chunk of every array once (checking crc32c
checksums where the arrays carry them, and refusing missing chunks where the store promises every
chunk), then checks the pointers (start at 0, monotone, matching every array's length), the masks
(``atoms_mask``/``edges_mask`` agree with ``samples_mask``) and the neighbor lists (every index of a
live structure inside that structure's atom rows). It reports every problem it finds, with the
array, chunk key and structure where they apply, in a :class:`VerifyReport`; it prints nothing.
An array whose recorded level only a newer writer knows is forward compatible, not damaged: it is
listed in :attr:`VerifyReport.skipped` and left out of every check, as the reader leaves it out.

Memory: the pointers and ``samples_mask`` (17 bytes per structure) plus the blocks being decoded;
every other array is streamed block by block.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.codecs import Crc32cCodec, ShardingCodec
from zarr.storage import LocalStore

from dali_alchemi.errors import ChunkDecodeError, ConfigError, StoreFormatError, UnsupportedCodecError
from dali_alchemi.store.check.consistency import (
    Findings,
    OnBlock,
    Problem,
    mask_check,
    neighbor_check,
    owners,
    pointer_ok,
)
from dali_alchemi.store.check.inventory import fits_on_disk, group_arrays, store_groups
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.journal import read_journal
from dali_alchemi.store.format.location import StoreLike, StoreLocation, resolve_store, zarr_error_text
from dali_alchemi.store.read.block_reads import fetch_blocks
from dali_alchemi.store.read.codecs import ArrayCodec
from dali_alchemi.store.read.engine import default_threads
from dali_alchemi.store.read.fetch import ByteFetcher, LocalFetcher, StoreFetcher
from dali_alchemi.store.read.open_checks import check_chunk_size, holds_root_metadata, memory_budget, open_root
from dali_alchemi.store.read.snapshot import KEPT_CHANGING, open_snapshot

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "BLOCKS_PER_THREAD", "DEFAULT_MAX_PROBLEMS", "Progress", "VerifyReport",
    "verify_store"
]


DEFAULT_MAX_PROBLEMS = 100
"""Problems listed one by one in a report; the rest are only counted."""

BLOCKS_PER_THREAD = 4
"""Row blocks fetched together per decoding thread (bounds memory to a few blocks per thread)."""

Progress = Callable[[int, int], None]
"""Called with (chunks done, chunks in all) as the check goes."""


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify_store` found; ``ok`` when it found nothing wrong."""

    store: str
    samples: int
    """Physical structures (soft-deleted ones included); -1 when the pointers could not be read."""
    live: int
    arrays: int
    chunks: int
    """Chunks decoded (inner chunks, for sharded arrays)."""
    implicit_chunks: int
    """Chunks not stored and read as the fill value (only where the store does not promise every chunk)."""
    bytes_decoded: int
    seconds: float
    complete_chunks: bool
    checksums: str | None
    unchecksummed: tuple[str, ...]
    """Arrays whose chunks carry no checksum (corruption there is detected only if it breaks decoding)."""
    problems: tuple[Problem, ...]
    problems_left_out: int = 0
    """Problems found beyond ``max_problems``, counted but not listed."""
    skipped: tuple[str, ...] = ()
    """Why arrays were left unchecked: each has a level a newer writer recorded and this version cannot
    interpret (the reader opens such a store with a warning and leaves them out), so it is no problem."""

    @property
    def ok(self) -> bool:
        """Whether no problem was found."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``dali-alchemi verify --json`` prints)."""
        out = asdict(self)
        out["ok"] = self.ok
        out["unchecksummed"] = list(self.unchecksummed)
        out["skipped"] = list(self.skipped)
        return out


def _has_crc32c(metadata: Any) -> bool:
    codecs = tuple(getattr(metadata, "codecs", ()))
    if len(codecs) == 1 and isinstance(codecs[0], ShardingCodec):
        codecs = tuple(codecs[0].codecs)
    return any(isinstance(c, Crc32cCodec) for c in codecs)


_Decoded = tuple["NDArray[Any] | None", str, int, ChunkDecodeError | None]
"""A block's rows (``None`` when they did not decode), its first chunk key, its chunks read as fill
value, and the error."""


class _Walker:
    """Decodes every chunk of one array after another, on a thread pool, recording what fails."""

    def __init__(self, store: Any, complete: bool, findings: Findings, threads: int, progress: Progress | None):
        self.complete = complete
        self.findings = findings
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="dali-alchemi-verify")
        self.batch = threads * BLOCKS_PER_THREAD
        self.fetcher: ByteFetcher = (
            LocalFetcher(Path(store.root), self.pool) if isinstance(store, LocalStore) else StoreFetcher(store)
        )
        self.progress = progress
        self.done = self.total = self.implicit = self.nbytes = 0
        self.n_samples = -1  # known once samples_mask decoded: system rows then name structures

    def chunks_of(self, arr: Any) -> int:
        shape, chunks = tuple(arr.shape), tuple(arr.chunks)
        return int(np.prod([-(-s // c) for s, c in zip(shape, chunks, strict=True)])) if shape else 1

    def walk(self, name: str, arr: Any, on_block: OnBlock | None = None, ptr: NDArray[np.int64] | None = None) -> bool:
        """Decode every chunk of ``arr``; return whether they all decoded (and were all present).

        ``ptr`` (the pointer of the array's level, or ``None`` for system rows) names the structures
        whose rows a bad chunk holds.
        """
        n_chunks = self.chunks_of(arr)
        try:
            codec = ArrayCodec(name=name, path=arr.store_path.path, metadata=arr.metadata, complete=self.complete)
        except UnsupportedCodecError:
            return self._walk_zarr(name, arr, n_chunks, on_block)
        clean = True
        indexes: dict[tuple[str, str], NDArray[np.uint64]] = {}
        for start in range(0, codec.n_blocks, self.batch):
            blocks = [(codec, b) for b in range(start, min(start + self.batch, codec.n_blocks))]
            fetched = self._fetch(codec, blocks, indexes)
            jobs = [(block, payloads) for (_, block), payloads in zip(blocks, fetched, strict=True)]
            results = list(self.pool.map(lambda job: self._decode(codec, *job), jobs))
            for (_, block), (data, key, missing, err) in zip(blocks, results, strict=True):
                self.implicit += missing
                if err is not None:
                    kind = "missing-chunk" if "is missing" in str(err) else "corrupt-chunk"
                    first = block * codec.block_rows
                    last = first + codec.block_shape(block)[0] - 1
                    where, sample = owners(first, last, ptr, self.n_samples)
                    self.findings.add(kind, f"{err}{where}", array=codec.name, chunk=err.chunk, sample=sample)
                if data is None:
                    clean = False
                    continue
                self.nbytes += data.nbytes
                if on_block is not None:
                    on_block(block * codec.block_rows, data, key)
            self._advance(sum(len(codec.chunks_of_block(b)) for _, b in blocks))
        return clean

    def _fetch(self, codec: ArrayCodec, blocks: list[tuple[ArrayCodec, int]], indexes: dict[Any, Any]) -> list[Any]:
        try:
            return fetch_blocks(self.fetcher, blocks, indexes)[0]
        except (ChunkDecodeError, OSError):
            pass  # a corrupt shard index (or a failing read) somewhere in the batch: go block by block
        out: list[Any] = []
        for item in blocks:
            try:
                out.append(fetch_blocks(self.fetcher, [item], indexes)[0][0])
            except ChunkDecodeError as err:
                self.findings.add("corrupt-chunk", str(err), array=codec.name, chunk=err.chunk)
                out.append(None)
            except OSError as err:
                self.findings.add("corrupt-chunk", f"Array {codec.name!r}: block {item[1]} could not be read: {err}",
                                  array=codec.name)  # fmt: skip
                out.append(None)
        return out

    def _decode(self, codec: ArrayCodec, block: int, fetched: Any) -> _Decoded:
        """On a pool thread: decode one block; failures are returned, and recorded by the caller."""
        key = codec.chunks_of_block(block)[0][1].key
        if fetched is None:
            return None, key, 0, None
        payloads, keys = fetched
        missing = 0 if self.complete else sum(p is None for p in payloads)
        try:
            return codec.decode_block(block, payloads, keys), key, missing, None
        except ChunkDecodeError as err:
            return None, key, missing, err

    def _walk_zarr(self, name: str, arr: Any, n_chunks: int, on_block: OnBlock | None) -> bool:
        """Arrays the fast decoder does not take: zarr decodes them (and checks crc32c; missing chunks read
        as the fill value there)."""
        rows = int(arr.chunks[0]) if arr.shape else 1
        clean = True
        for first in range(0, int(arr.shape[0]) if arr.shape else 1, rows):
            try:
                data = np.asarray(arr[first : first + rows] if arr.shape else arr[...])
            except Exception as err:  # codecs raise many types; all mean the stored bytes are unusable
                self.findings.add("corrupt-chunk", f"Array {name!r}: rows from {first} could not be decoded: "
                                  f"{zarr_error_text(err)}", array=name, chunk=f"rows {first}..{first + rows}")  # fmt: skip
                clean = False
                continue
            self.nbytes += data.nbytes
            if on_block is not None:
                on_block(first, data, f"{arr.store_path.path}@{first}")
        self._advance(n_chunks)
        return clean

    def _advance(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)


def verify_store(
    store: StoreLike,
    *,
    max_problems: int = DEFAULT_MAX_PROBLEMS,
    num_threads: int | None = None,
    progress: Progress | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> VerifyReport:
    """Decode every chunk of ``store`` once and check it whole; see the module docstring.

    Whatever makes :class:`~dali_alchemi.store.read.reader.AtomicDataZarrReader` refuse to open the store is
    a problem too: the same open-time checks run here (a dtype or shape a field cannot have is reported
    for every such array, not only the first).

    Raises
    ------
    StoreNotFoundError
        If there is nothing at ``store``.
    StoreFormatError
        If ``store`` holds no store at all: no ``zarr.json`` at its root (an empty or unrelated folder) or a
        plain file, or if a writer changed the store at every attempt to open it (no finding: verify it
        again once the writer is done). Every finding in a store is a :class:`Problem` of the report.
    """
    if max_problems < 1:
        raise ConfigError(f"max_problems must be >= 1, got {max_problems}")
    loc = resolve_store(store, read_only=True, must_exist=True, storage_options=storage_options)
    started = time.perf_counter()
    found = Findings(limit=max_problems)
    try:
        op = read_journal(loc)
        if op is not None:
            found.add("journal", f"an interrupted {op.OP} is recorded beside the store: run "
                      "AtomicDataZarrWriter(store).recover() (or any writer operation), then verify again")  # fmt: skip
    except StoreFormatError as err:
        found.add("journal", str(err))
    try:
        root = open_root(loc)
        attributes = root.attrs.asdict()
        schema = layout.parse_schema(attributes, store=loc.display)
        integrity = layout.parse_integrity(attributes, store=loc.display)
    except StoreFormatError as err:
        if not holds_root_metadata(loc):
            raise  # no store here at all (a plain file, an empty or unrelated folder): nothing to check
        found.add("format", str(err))
        return _report(loc.display, found, started, samples=-1, live=0, arrays=0, walker=None,
                       integrity=layout.Integrity(), unchecksummed=())  # fmt: skip
    groups = store_groups(root, loc.display, found)
    arrays: dict[str, Any] = {}
    for group_name in (layout.META_GROUP, layout.CORE_GROUP, layout.CUSTOM_GROUP):
        if group_name in groups:
            group = groups[group_name]
            if group is not None:  # else its zarr.json is unreadable, and reported
                arrays.update(group_arrays(loc, group, group_name, found))
        elif group_name != layout.CUSTOM_GROUP:
            found.add("format", f"Store {loc.display} is missing the {group_name!r} group", array=group_name)
    # Arrays of a level only a newer writer knows: forward compatible, not damaged; left out of every check.
    skipped = tuple(
        layout.unknown_level_message(loc.display, key, level) + "; not checked"
        for key, level in schema.unknown_levels.items()
        if arrays.pop(key, None) is not None
    )
    listed = [f"{layout.META_GROUP}/{name}" for name in layout.META_ARRAYS]
    listed += [f"{layout.CORE_GROUP}/{name}" for name in schema.core]
    listed += [f"{layout.CUSTOM_GROUP}/{name}" for name in schema.custom]
    for path in listed:
        if path not in arrays:
            found.add("missing-array", f"array {path} is missing (listed in the root 'fields' attribute, or a "
                      "meta array every store has): its directory or its zarr.json is gone", array=path)  # fmt: skip
    unchecksummed = tuple(path for path, arr in arrays.items() if not _has_crc32c(arr.metadata))
    if integrity.checksums is not None:
        for path in unchecksummed:
            found.add("no-checksum", f"array {path} carries no crc32c checksum, but the store promises one per chunk",
                      array=path)  # fmt: skip
    for path, arr in list(arrays.items()):
        try:
            check_chunk_size(arr, name=path, store=loc.display)
        except StoreFormatError as err:
            found.add("format", str(err), array=path)
            del arrays[path]
            continue
        if not fits_on_disk(loc, path, arr, integrity.complete_chunks, found):
            del arrays[path]
    walker = _Walker(loc.store, integrity.complete_chunks, found, num_threads or default_threads(), progress)
    walker.total = sum(walker.chunks_of(arr) for arr in arrays.values())
    try:
        samples, live = _check(loc.display, schema, arrays, walker, found)
    finally:
        walker.pool.shutdown(wait=True)
    _reader_refusal(loc, found)
    return _report(loc.display, found, started, samples=samples, live=live, arrays=len(arrays), walker=walker,
                   integrity=integrity, unchecksummed=unchecksummed, skipped=skipped)  # fmt: skip


def _check(
    store: str, schema: layout.StoreSchema, arrays: dict[str, Any], walker: _Walker, found: Findings
) -> tuple[int, int]:
    """Decode the meta arrays whole and check them, then stream every other array; (samples, live)."""
    meta: dict[str, NDArray[Any]] = {}
    for name in (layout.SAMPLES_MASK, layout.ATOMS_PTR, layout.EDGES_PTR):
        path = f"{layout.META_GROUP}/{name}"
        arr = arrays.get(path)
        if arr is None:
            continue
        if len(arr.shape) != 1 or 17 * int(arr.shape[0]) > memory_budget():
            found.add("shape", f"meta/{name} has shape {tuple(arr.shape)}; expected 1-D and readable; not decoded",
                      array=path)  # fmt: skip
            continue
        parts: list[NDArray[Any]] = []
        if walker.walk(path, arr, lambda _first, data, _key, parts=parts: parts.append(data)):  # type: ignore[misc]
            meta[name] = np.concatenate(parts) if parts else np.zeros(0, arr.dtype)
    mask = meta.get(layout.SAMPLES_MASK)
    if mask is None:
        _walk_rest(arrays, walker, {})
        return -1, 0
    n, live = int(mask.size), int(np.count_nonzero(mask))
    walker.n_samples = n
    if mask.dtype != np.bool_:
        found.add("mask", f"meta/samples_mask has dtype {mask.dtype}; expected bool", array="meta/samples_mask")
    if schema.num_samples not in (-1, n):
        found.add("format", f"root attribute num_samples is {schema.num_samples} but meta/samples_mask has {n} entries")
    ptrs: dict[str, NDArray[np.int64]] = {}
    for name in (layout.ATOMS_PTR, layout.EDGES_PTR):
        ptr = meta.get(name)
        if ptr is not None and pointer_ok(name, ptr, n, found):
            ptrs[name] = ptr.astype(np.int64)
    rows: dict[str, int] = {"system": n}
    if layout.ATOMS_PTR in ptrs:
        rows["atom"] = int(ptrs[layout.ATOMS_PTR][-1])
    if layout.EDGES_PTR in ptrs:
        rows["edge"] = int(ptrs[layout.EDGES_PTR][-1])
    checks: dict[str, OnBlock] = {}
    unwalked: set[str] = set()
    mask_bool = mask.astype(np.bool_)
    for mask_name, ptr_name in ((layout.ATOMS_MASK, layout.ATOMS_PTR), (layout.EDGES_MASK, layout.EDGES_PTR)):
        if ptr_name in ptrs:
            checks[f"meta/{mask_name}"] = mask_check(f"meta/{mask_name}", ptrs[ptr_name], mask_bool, found)
    if layout.ATOMS_PTR in ptrs and layout.EDGES_PTR in ptrs:
        for name in layout.ATOM_INDEX_FIELDS:
            path = f"{schema.group_of(name)}/{name}"
            checks[path] = neighbor_check(path, ptrs[layout.ATOMS_PTR], ptrs[layout.EDGES_PTR], mask_bool, found)
    levels: dict[str, str | None] = {}
    for path, arr in arrays.items():
        group, name = path.split("/", 1)
        if group == layout.META_GROUP:
            expected = {layout.ATOMS_MASK: rows.get("atom"), layout.EDGES_MASK: rows.get("edge")}.get(name)
            level = {layout.ATOMS_MASK: "atom", layout.EDGES_MASK: "edge"}.get(name)
        else:
            recorded = schema.core if group == layout.CORE_GROUP else schema.custom
            level = recorded.get(name) or layout.default_level(name)
            if level is None:
                found.add("format", f"array {path} has no level in the 'fields' attribute and is not a known "
                          "AtomicData field", array=path)  # fmt: skip
            expected = None if level is None else rows.get(level)
        levels[path] = level
        unfit = None if group == layout.META_GROUP else layout.field_array_problem(name, arr.dtype, tuple(arr.shape))
        if unfit is not None:  # the reader's rule for well-known fields: it refuses such an array when it opens
            kind = "dtype" if unfit.startswith("has dtype") else "shape"
            found.add(kind, f"array {path} {unfit}; the reader refuses it", array=path)
        if expected is not None and (not arr.shape or int(arr.shape[0]) != expected):
            found.add("shape", f"array {path} has shape {tuple(arr.shape)}; expected {expected} rows (from the "
                      "pointers); its chunks are not decoded", array=path)  # fmt: skip
            unwalked.add(path)  # its claimed rows, not the pointers, would bound the walk
            checks.pop(path, None)
    level_ptr = {"atom": ptrs.get(layout.ATOMS_PTR), "edge": ptrs.get(layout.EDGES_PTR)}
    owners = {path: level_ptr.get(level or "") for path, level in levels.items()}
    walker.total -= sum(walker.chunks_of(arrays[path]) for path in unwalked)
    _walk_rest({p: a for p, a in arrays.items() if p not in unwalked}, walker, checks, owners)
    return n, live


def _reader_refusal(loc: StoreLocation, found: Findings) -> None:
    """Open the store as the reader does (its open-time checks, the write journal read as it reads it); if
    it refuses, that is a problem, unless a problem found already names the same array or says the same."""
    try:
        open_snapshot(loc)
    except (ValueError, TypeError, KeyError) as err:  # StoreFormatError and ChunkDecodeError are ValueErrors
        message = str(err)
        if message.endswith(KEPT_CHANGING):  # a writer is at work: no finding about the store, verify again later
            raise
        said = message.removeprefix(f"Store {loc.display}").removeprefix(":").strip()  # what, without where
        for p in found.problems:
            named = p.array is not None and re.search(rf"(?<![\w/]){re.escape(p.array)}(?![\w/])", message)
            if named or said in p.message or p.message in message:
                return
        found.add("open", f"AtomicDataZarrReader refuses to open this store: {type(err).__name__}: {message}")


def _walk_rest(
    arrays: dict[str, Any],
    walker: _Walker,
    checks: dict[str, OnBlock],
    owners: dict[str, NDArray[np.int64] | None] | None = None,
) -> None:
    skip = {f"{layout.META_GROUP}/{n}" for n in (layout.SAMPLES_MASK, layout.ATOMS_PTR, layout.EDGES_PTR)}
    for path, arr in arrays.items():
        if path not in skip:
            walker.walk(path, arr, checks.get(path), (owners or {}).get(path))


def _report(store: str, found: Findings, started: float, *, samples: int, live: int, arrays: int,
            walker: _Walker | None, integrity: layout.Integrity, unchecksummed: tuple[str, ...],
            skipped: tuple[str, ...] = ()) -> VerifyReport:  # fmt: skip
    return VerifyReport(
        store=store, samples=samples, live=live, arrays=arrays,
        chunks=walker.done if walker else 0, implicit_chunks=walker.implicit if walker else 0,
        bytes_decoded=walker.nbytes if walker else 0, seconds=time.perf_counter() - started,
        complete_chunks=integrity.complete_chunks, checksums=integrity.checksums, unchecksummed=unchecksummed,
        problems=tuple(found.problems), problems_left_out=found.left_out, skipped=skipped,
    )  # fmt: skip
