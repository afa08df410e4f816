"""Crash recovery: finishing or rolling back the operation a killed writer left half-done.

The journal (:mod:`dali_alchemi.store.format.journal`) says which operation was in progress. An append, or an
add_custom that had not committed, is rolled back to the old state; a delete is completed (it is
idempotent, and readers already see its new state); a defragment whose swap had begun is completed,
and so is a repair whose swap had begun (one that had not is rolled back: its staged array removed).
Whatever a killed writer left beside a local store (staging directories, copies moved aside) is then
removed, and the journal cleared. Every writer operation runs :func:`recover` first.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.csr import concat_aranges
from dali_alchemi.errors import StoreFormatError
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.journal import (
    CREATE_PREFIX,
    DEFRAGMENT_NEW,
    DEFRAGMENT_OLD,
    JOURNAL_SUFFIX,
    REPAIR_NEW,
    REPAIR_OLD,
    AddCustomOp,
    AppendOp,
    DefragmentOp,
    DeleteOp,
    OpState,
    RepairOp,
    clear_journal,
    previous_suffix,
    read_journal,
    sibling,
    siblings,
    staging_suffix,
)
from dali_alchemi.store.format.location import StoreLocation, open_group
from dali_alchemi.store.read.open_checks import MetaInfo, check_meta
from dali_alchemi.store.write.arrays import complete, truncate_array
from dali_alchemi.store.write.lock import LOCK_SUFFIX
from dali_alchemi.types import PerLevel

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["apply_delete", "finish_repair_swap", "recover", "remove_partial_files", "remove_staging"]


logger = logging.getLogger(__name__)


def _no_phase(name: str) -> None:
    pass


def recover(loc: StoreLocation, phase: Callable[[str], None] = _no_phase) -> str | None:
    """Finish or roll back an operation that a killed writer left half-done; returns its name.

    An append, or an add_custom that had not committed, is rolled back (the store returns to its old
    state); a delete is completed; a defragment is completed if its directory swap had begun, and
    rolled back (its staged copy removed) if not. Staging directories that a killed writer left
    beside a local store are removed. ``phase`` hears the steps of a delete being completed.

    Raises
    ------
    StoreFormatError
        If the journal is malformed or names an unknown operation.
    """
    op = read_journal(loc)
    if op is None:
        remove_staging(loc)
        return None
    logger.warning("recovering an interrupted %s on %s", op.OP, loc.display)
    if isinstance(op, DefragmentOp):
        _finish_defragment(loc)
    elif isinstance(op, AppendOp):
        _roll_back_append(loc, op)
    elif isinstance(op, AddCustomOp):
        if op.state is not OpState.COMMITTED:
            _roll_back_add_custom(loc, op)
    elif isinstance(op, RepairOp):
        if op.state is OpState.SWAPPING:
            finish_repair_swap(loc, op.key)
    elif isinstance(op, DeleteOp):
        root = open_group(loc, mode="r+")
        meta = check_meta(root, store=loc.display)
        beyond = [p for p in op.physical if p >= meta.n_physical]
        if beyond:
            raise StoreFormatError(
                f"Store {loc.display}: the write journal of 'delete' names samples {beyond[:5]} of a store with "
                f"{meta.n_physical} samples; nothing was changed"
            )
        apply_delete(root, meta, np.asarray(op.physical, dtype=np.int64), phase)
    remove_staging(loc)
    remove_partial_files(loc)
    clear_journal(loc)
    return op.OP


def apply_delete(root: Any, meta: MetaInfo, physical: NDArray[np.int64], phase: Callable[[str], None]) -> None:
    """Clear the masks of ``physical`` samples and zero their data (idempotent, so recovery repeats it)."""
    rows = PerLevel(
        atom=concat_aranges(meta.atoms_ptr[physical], np.diff(meta.atoms_ptr)[physical]),
        edge=concat_aranges(meta.edges_ptr[physical], np.diff(meta.edges_ptr)[physical]),
        system=physical,
    )
    meta_group = root[layout.META_GROUP]
    # complete(): a chunk that becomes all False or all zeros is rewritten, not deleted (zarr's default)
    complete(meta_group[layout.SAMPLES_MASK]).set_orthogonal_selection((physical,), False)
    phase("samples_mask")
    for mask, level_rows in ((layout.ATOMS_MASK, rows.atom), (layout.EDGES_MASK, rows.edge)):
        if level_rows.size:
            complete(meta_group[mask]).set_orthogonal_selection((level_rows,), False)
    phase("masks")
    for name, level in meta.schema.field_levels.items():
        arr = complete(root[f"{meta.schema.group_of(name)}/{name}"])
        if rows[level].size:
            arr.set_orthogonal_selection((rows[level],), np.zeros((), dtype=arr.dtype))
    phase("data")


def _roll_back_append(loc: StoreLocation, op: AppendOp) -> None:
    """Truncate every array to the sizes it had before an interrupted append."""
    root = open_group(loc, mode="r+")
    schema = layout.parse_schema(root.attrs.asdict(), store=loc.display)
    _check_append_record(loc, root, op, schema.num_samples)
    rows = op.rows
    for name, level in schema.field_levels.items():
        group = schema.group_of(name)
        if group in root and name in root[group]:
            truncate_array(root[f"{group}/{name}"], rows[level])
    meta = root[layout.META_GROUP]
    n = op.samples
    for name, length in (
        (layout.SAMPLES_MASK, n), (layout.ATOMS_PTR, n + 1), (layout.EDGES_PTR, n + 1),
        (layout.ATOMS_MASK, op.atoms), (layout.EDGES_MASK, op.edges),
    ):  # fmt: skip
        truncate_array(meta[name], length)
    root.attrs.update(layout.StoreSchema(num_samples=n, core=schema.core, custom=schema.custom).to_attributes())


def _check_append_record(loc: StoreLocation, root: Any, op: AppendOp, num_samples: int) -> None:
    """Refuse an append record whose old state is not a prefix of the store (before anything is truncated).

    An interrupted append extends every array and leaves the first ``samples + 1`` pointers as they
    were, and the root's ``num_samples`` is the old count until its last step (then the new one, which
    the pointers hold).
    """
    meta = root[layout.META_GROUP]
    atoms_ptr, edges_ptr = meta[layout.ATOMS_PTR], meta[layout.EDGES_PTR]
    n = op.samples
    problem = None
    if n + 1 > min(atoms_ptr.shape[0], edges_ptr.shape[0]):
        problem = f"{n} old samples, but the pointers hold {atoms_ptr.shape[0] - 1}"
    elif (int(atoms_ptr[n]), int(edges_ptr[n])) != (op.atoms, op.edges):
        problem = (
            f"{op.atoms} atoms and {op.edges} edges before sample {n}, but the pointers say "
            f"{int(atoms_ptr[n])} and {int(edges_ptr[n])}"
        )
    elif num_samples not in (-1, n, atoms_ptr.shape[0] - 1):
        problem = f"{n} old samples, but the store records {num_samples}"
    if problem is not None:
        raise StoreFormatError(
            f"Store {loc.display}: the write journal of 'append' does not fit the store ({problem}); nothing was "
            f"rolled back"
        )


def _roll_back_add_custom(loc: StoreLocation, op: AddCustomOp) -> None:
    """Put back the custom array (and its level) that an interrupted add_custom was replacing."""
    key, previous = op.key, op.previous
    root = open_group(loc, mode="r+")
    local = loc.local_root
    if local is not None:
        target = local / layout.CUSTOM_GROUP / key
        old = sibling(loc, previous_suffix(key))
        if old.exists():
            shutil.rmtree(target, ignore_errors=True)
            os.rename(old, target)
        elif previous is None:
            shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(sibling(loc, staging_suffix(key)), ignore_errors=True)
    elif previous is None and layout.CUSTOM_GROUP in root and key in root[layout.CUSTOM_GROUP]:
        del root[layout.CUSTOM_GROUP][key]
    schema = layout.parse_schema(root.attrs.asdict(), store=loc.display)
    custom = dict(schema.custom)
    if previous is None:
        custom.pop(key, None)
    else:
        custom[key] = previous
    root.attrs.update(
        layout.StoreSchema(num_samples=schema.num_samples, core=schema.core, custom=custom).to_attributes()
    )


def _finish_defragment(loc: StoreLocation) -> None:
    """Complete an interrupted directory swap (the staged store is complete once journaled)."""
    assert loc.local_root is not None
    staging, retired = sibling(loc, DEFRAGMENT_NEW), sibling(loc, DEFRAGMENT_OLD)
    if not loc.local_root.exists():
        os.rename(staging if staging.exists() else retired, loc.local_root)
    # the store in place is current now; whatever remains beside it is removed with the staging


def finish_repair_swap(loc: StoreLocation, key: str, phase: Callable[[str], None] = _no_phase) -> None:
    """Move a repair's rewritten core array into place (complete once the swap is journaled).

    The swap is two renames: the old array aside, the rewritten one in. Whichever of them a killed
    writer did not do is done here; the old array is removed with the other leftovers.
    """
    assert loc.local_root is not None
    staged, target = sibling(loc, REPAIR_NEW), loc.local_root / layout.CORE_GROUP / key
    if staged.exists():
        if target.exists():
            os.rename(target, sibling(loc, REPAIR_OLD))
            phase("retired")
        os.rename(staged, target)
        phase("swapped")


def remove_staging(loc: StoreLocation) -> None:
    """Delete what a killed writer left beside a local store (never the journal, the lock or the store).

    That is its staging directories and copies moved aside, and also what a killed conversion left
    beside the store it was building there (``..<name>.dali-alchemi-create-*``: that store's own
    staging and lock). Called under the writer lock, so none of it belongs to a live writer.
    """
    if loc.local_root is None:
        return
    journal, lock = sibling(loc, JOURNAL_SUFFIX), sibling(loc, LOCK_SUFFIX)
    nested = loc.local_root.parent.glob(f"..{loc.local_root.name}.dali-alchemi-{CREATE_PREFIX}*")
    for path in [*siblings(loc), *sorted(nested)]:
        if path in (journal, lock):
            continue
        if path.is_symlink():  # never what a writer leaves: remove the link, not what it points to
            path.unlink(missing_ok=True)
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def remove_partial_files(loc: StoreLocation) -> None:
    """Delete the ``*.partial`` files inside a local store: chunks zarr was writing when a writer was killed.

    zarr's local store writes each object to ``<key>.<random>.partial`` and renames it into place, so
    such a file is never part of the store; only a crashed writer leaves one (walks the whole store,
    which is why it runs only when an interrupted operation is recovered).
    """
    if loc.local_root is None or not loc.local_root.is_dir():
        return
    for path in loc.local_root.rglob("*.partial"):
        if path.is_file():
            path.unlink(missing_ok=True)
