"""Applying a repair (:mod:`dali_alchemi.store.check.repair_plan`): in place, crash-safely, or into a repaired copy.

- **In place** (local directory stores): the array ``core/neighbor_list`` is copied beside the store,
  the copy is rewritten, and it is swapped in with two renames under a :class:`RepairOp` journal. A
  reader sees the old array until the swap begins and the rewritten one from then on; a writer killed
  before the swap leaves the store as it was, one killed during it has the swap finished by recovery.
- **Into a copy** (``out=DIR``, for stores the user cannot write: read-only or remote ones): every
  object of the store is copied byte for byte into a new directory beside ``DIR`` (chunks are never
  re-encoded), the copy is repaired, and it is renamed to ``DIR`` when complete.

Only the edge-row blocks that hold a changed sample are rewritten, a window of storage blocks at a time.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.chunk_grids import RegularChunkGrid
from zarr.core.sync import sync
from zarr.storage import LocalStore

from dali_alchemi.errors import RepairError, StoreExistsError, StoreFormatError, UnsupportedStoreError
from dali_alchemi.store.check.repair_plan import NEIGHBOR_LIST, RepairPlan, infer
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.generation import bumped
from dali_alchemi.store.format.journal import (
    CREATE_PREFIX,
    REPAIR_NEW,
    OpState,
    RepairOp,
    clear_journal,
    read_journal,
    sibling,
    write_journal,
)
from dali_alchemi.store.format.location import StoreLocation, open_group, resolve_store
from dali_alchemi.store.read.open_checks import MetaInfo, check_meta, open_root
from dali_alchemi.store.write.arrays import complete
from dali_alchemi.store.write.lock import WriterLock
from dali_alchemi.store.write.recovery import finish_repair_swap, recover, remove_staging
from dali_alchemi.store.write.refusals import roll_back, told_as_refused

__all__ = [
    "COPY_CONCURRENCY", "REWRITE_WINDOW_ROWS", "RepairReport", "check_in_place", "repair_copy",
    "repair_in_place", "repair_store", "rewrite", "run_repair"
]


REWRITE_WINDOW_ROWS = 1 << 21
"""Edge rows rewritten per step (at least one storage block)."""
COPY_CONCURRENCY = 32
"""Objects fetched at once when copying a store."""


@dataclass(frozen=True, slots=True)
class RepairReport:
    """The outcome of a repair: what was found (``plan``), and where the result is.

    ``applied`` is False for a dry run and when nothing needed to change; ``written_to`` is the
    repaired store (the store itself, or the copy), or ``None`` when nothing was written.
    """

    plan: RepairPlan
    applied: bool
    written_to: str | None


def _phase_none(name: str) -> None:
    pass


def rewrite(src: Any, dst: Any, plan: RepairPlan) -> int:
    """Write ``src`` rows plus each sample's offset into ``dst`` where a sample changes; returns rows written.

    Works a window of whole storage blocks (shards, else chunks) at a time, so every block written is
    written once, entirely.
    """
    changed = plan.changed
    if changed.size == 0:
        return 0
    e_ptr = plan.edges_ptr
    block = int((dst.shards or dst.chunks)[0])
    first, last = e_ptr[changed] // block, (e_ptr[changed + 1] - 1) // block
    n_blocks = -(-int(e_ptr[-1]) // block)
    marks = np.zeros(n_blocks + 1, np.int64)
    np.add.at(marks, first, 1)
    np.add.at(marks, last + 1, -1)
    touched = np.flatnonzero(np.cumsum(marks[:-1]) > 0)
    per_window = max(1, REWRITE_WINDOW_ROWS // block)
    # runs of consecutive touched blocks, cut every per_window blocks
    cuts = np.flatnonzero((np.diff(touched) != 1) | (np.arange(1, touched.size) % per_window == 0)) + 1
    info = np.iinfo(np.dtype(dst.dtype)) if np.issubdtype(np.dtype(dst.dtype), np.integer) else None
    written = 0
    for run in np.split(touched, cuts):
        lo, hi = int(run[0]) * block, min(int(run[-1] + 1) * block, int(e_ptr[-1]))
        values = np.asarray(src[lo:hi]).astype(np.int64)
        sample = np.searchsorted(e_ptr, np.arange(lo, hi, dtype=np.int64), side="right") - 1
        values += plan.offsets[sample].reshape((-1,) + (1,) * (values.ndim - 1))
        if info is not None and (values.min() < info.min or values.max() > info.max):
            raise RepairError(f"Store {plan.store}: re-based neighbor_list values do not fit its dtype {dst.dtype}")
        dst[lo:hi] = values.astype(dst.dtype)
        written += hi - lo
    return written


def repair_in_place(
    loc: StoreLocation, root: Any, meta: MetaInfo, plan: RepairPlan, phase: Callable[[str], None]
) -> None:
    """Rewrite the local store's ``core/neighbor_list`` per ``plan``, crash-safely (see the module docstring).

    ``phase`` hears ``journal``, ``staged``, ``swapping``, ``retired``, ``swapped`` and ``committed``.
    """
    assert loc.local_root is not None, "repair rewrites local directory stores in place"
    group = meta.schema.group_of(NEIGHBOR_LIST)
    if group != layout.CORE_GROUP:
        raise RepairError(
            f"Store {loc.display}: neighbor_list is a custom array here; repair rewrites core/neighbor_list"
        )
    target = loc.local_root / group / NEIGHBOR_LIST
    staged = sibling(loc, REPAIR_NEW)
    op = RepairOp(key=NEIGHBOR_LIST, samples=int(plan.changed.size), state=OpState.STAGING)
    write_journal(loc, op)
    phase("journal")
    shutil.rmtree(staged, ignore_errors=True)
    try:
        shutil.copytree(target, staged)
        rewrite(root[f"{group}/{NEIGHBOR_LIST}"], complete(zarr.open_array(str(staged), mode="r+")), plan)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        clear_journal(loc)  # nothing of the store changed
        raise
    phase("staged")
    root.attrs.update(bumped(root.attrs.asdict(), rewritten=NEIGHBOR_LIST))  # open readers see the swap coming
    write_journal(loc, op.with_state(OpState.SWAPPING))
    phase("swapping")
    finish_repair_swap(loc, NEIGHBOR_LIST, phase)
    write_journal(loc, op.with_state(OpState.COMMITTED))
    phase("committed")
    remove_staging(loc)
    clear_journal(loc)


def check_in_place(loc: StoreLocation) -> None:
    """Refuse an in-place repair of a store that is not a local directory (before anything is locked)."""
    if loc.local_root is None:
        raise UnsupportedStoreError(
            f"repair rewrites local directory stores in place; {loc.display} is not one: "
            f"write a repaired copy with out=DIR (dali-alchemi repair STORE --out DIR)"
        )


def run_repair(
    loc: StoreLocation, root: Any, meta: MetaInfo, *, dry_run: bool, prefer: str | None = None,
    phase: Callable[[str], None] = _phase_none,
) -> RepairReport:  # fmt: skip
    """Infer the repair of the store open as ``root`` (checked as ``meta``) and apply it in place.

    ``dry_run`` only infers. A store that needs nothing is left untouched. ``prefer``: see
    :func:`~dali_alchemi.store.check.repair_plan.infer`.
    """
    if not dry_run:
        check_in_place(loc)
    plan = infer(root, meta, store=loc.display, prefer=prefer)
    if dry_run:
        return RepairReport(plan=plan, applied=False, written_to=None)
    plan.check()
    if plan.changed.size == 0:
        return RepairReport(plan=plan, applied=False, written_to=None)
    repair_in_place(loc, root, meta, plan, phase)
    return RepairReport(plan=plan, applied=True, written_to=loc.display)


# -- a repaired copy -----------------------------------------------------------------------------
def _object_keys(root: Any) -> list[str]:
    """Every object of a zarr v3 store, from its metadata: group and array documents and chunk keys."""
    keys = ["zarr.json"]
    for path, member in root.members(max_depth=None):
        keys.append(f"{path}/zarr.json")
        if isinstance(member, zarr.Array):
            grid = member.metadata.chunk_grid
            if not isinstance(grid, RegularChunkGrid):
                raise UnsupportedStoreError(f"array {path} has a {type(grid).__name__}; only regular grids are copied")
            counts = [-(-int(s) // int(c)) for s, c in zip(member.shape, grid.chunk_shape, strict=True)]
            encode = member.metadata.encode_chunk_key
            keys.extend(f"{path}/{encode(coords)}" for coords in product(*(range(n) for n in counts)))
    return keys


async def _copy_objects(loc: StoreLocation, keys: list[str], dest: LocalStore) -> None:
    proto = default_buffer_prototype()
    semaphore = asyncio.Semaphore(COPY_CONCURRENCY)

    async def one(key: str) -> None:
        async with semaphore:
            buf = await loc.store.get(loc.key(key), prototype=proto)
            if buf is not None:  # a chunk never written reads as its fill value
                await dest.set(key, buf)

    await asyncio.gather(*(one(k) for k in keys))


def repair_copy(
    loc: StoreLocation, out: Path, phase: Callable[[str], None] = _phase_none, *, prefer: str | None = None
) -> RepairReport:
    """Copy the store at ``loc`` (any kind, read-only is enough) to the new directory ``out``, repaired.

    Raises
    ------
    StoreExistsError
        If anything exists at ``out``.
    StoreFormatError
        If the source has an unfinished write operation (a writer must finish it first).
    RepairError
        If the neighbor lists cannot be repaired (nothing is left at ``out``).
    """
    if out.exists():
        raise StoreExistsError(f"{out} already exists; repair --out writes a new store")
    if read_journal(loc) is not None:
        raise StoreFormatError(
            f"Store {loc.display} has an unfinished write operation; open it with a writer to finish it first"
        )
    root = open_root(loc)
    meta = check_meta(root, store=loc.display)
    plan = infer(root, meta, store=loc.display, prefer=prefer)
    plan.check()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.dali-alchemi-{CREATE_PREFIX}{uuid.uuid4().hex[:8]}")
    try:
        sync(_copy_objects(loc, _object_keys(root), LocalStore(staging)))
        phase("copied")
        copy = open_group(resolve_store(staging, read_only=False, must_exist=True), mode="r+")
        group = meta.schema.group_of(NEIGHBOR_LIST)
        if plan.changed.size:
            arr = copy[f"{group}/{NEIGHBOR_LIST}"]
            rewrite(arr, complete(arr), plan)  # blocks are read before they are written
        phase("staged")
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    phase("done")
    return RepairReport(plan=plan, applied=True, written_to=str(out))


def repair_store(
    store: Any, *, out: str | os.PathLike[str] | None = None, dry_run: bool = False, prefer: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> RepairReport:  # fmt: skip
    """Repair the neighbor lists of ``store`` in place, into a copy at ``out``, or report only (``dry_run``).

    A dry run and a copy need only read access (any path, URL or zarr Store); an in-place repair
    first finishes or rolls back an interrupted write, as every writer operation does. ``prefer``
    settles ambiguous samples the way the user knows the store was grown
    (:func:`~dali_alchemi.store.check.repair_plan.infer`).

    Raises
    ------
    AmbiguousRepairError, RepairError
        If some samples cannot be repaired (not for a dry run, which lists them in its plan).
    UnsupportedStoreError
        For an in-place repair of a store that is not a local directory.
    StoreWriteError
        If the operating system refuses a write (a full disk, a read-only file system, no permission), after
        an in-place repair is rolled back; a copy leaves nothing at ``out``.
    """
    if out is None and not dry_run:
        loc = resolve_store(store, read_only=False, must_exist=True, storage_options=storage_options)
        check_in_place(loc)
        with told_as_refused(loc, "repair", lambda: "The store was not changed."), WriterLock(loc, "repair"):
            with told_as_refused(loc, "repair", lambda: roll_back(loc, "repair")):
                recover(loc)
                open_root(loc)  # a zarr v3 group
                root = open_group(loc, mode="r+")
                return run_repair(loc, root, check_meta(root, store=loc.display), dry_run=False, prefer=prefer)
    loc = resolve_store(store, read_only=True, must_exist=True, storage_options=storage_options)
    if out is not None and not dry_run:
        left = f"Nothing was left at {Path(out).absolute()}; the store was only read."
        with told_as_refused(loc, f"repair to {Path(out).absolute()}", lambda: left):
            return repair_copy(loc, Path(out), prefer=prefer)
    if read_journal(loc) is not None:
        raise StoreFormatError(
            f"Store {loc.display} has an unfinished write operation; open it with a writer to finish it first"
        )
    root = open_root(loc)
    plan = infer(root, check_meta(root, store=loc.display), store=loc.display, prefer=prefer)
    return RepairReport(plan=plan, applied=False, written_to=None)
