"""A custom array added or replaced (the writer's ``add_custom``): the array checked, then written crash-safely.

Under an :class:`~dali_alchemi.store.format.journal.AddCustomOp` journal, the array goes to
``custom/<key>`` one of two ways:

- **staged** (local directory stores): it is written whole beside the store, then moved in with
  renames (an array it replaces is moved aside first, and kept until the commit);
- **in place** (any other store): it is written where it goes, replacing the old one.

The ``fields`` attribute that names it is the commit point: recovery rolls back an add_custom that
had not committed (:mod:`dali_alchemi.store.write.recovery`). The caller holds the writer lock.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from dali_alchemi.errors import SampleDataError
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.generation import bumped
from dali_alchemi.store.format.journal import (
    AddCustomOp,
    OpState,
    clear_journal,
    previous_suffix,
    sibling,
    staging_suffix,
    write_journal,
)
from dali_alchemi.store.format.packed import as_numpy
from dali_alchemi.store.write.arrays import write_array
from dali_alchemi.store.write.encode import check_stored

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from numpy.typing import NDArray

    from dali_alchemi.config import ArrayConfig, WriteConfig
    from dali_alchemi.store.format.location import StoreLocation
    from dali_alchemi.store.read.open_checks import MetaInfo
    from dali_alchemi.types import Level

__all__ = ["checked_custom", "write_custom"]


def checked_custom(
    key: str,
    data: NDArray[Any] | torch.Tensor,
    level: Level,
    meta: MetaInfo,
    *,
    allow_nonfinite: bool | frozenset[str],
) -> NDArray[Any]:
    """``data`` as a host array, checked to fit ``custom/<key>`` at ``level`` of the store ``meta`` describes.

    ``allow_nonfinite``: for every field (a bool), or the names of the fields that may hold NaN and inf.

    Raises
    ------
    SampleDataError
        If ``data.shape[0]`` is not the physical size of that level (deleted samples included),
        ``key`` is already a core field, the array breaks the rules the reader checks, or it holds
        NaN or inf that ``allow_nonfinite`` does not allow.
    """
    values = as_numpy(data)
    expected = meta.rows[level]
    if values.ndim == 0 or values.shape[0] != expected:
        got = values.shape[0] if values.ndim else "a scalar"
        raise SampleDataError(f"Data shape[0]={got} does not match expected size={expected} for level={level}")
    if key in meta.schema.core:
        raise SampleDataError(f"{key!r} is already a core field of this store; choose another name for the custom array")
    ptr = {"atom": meta.atoms_ptr, "edge": meta.edges_ptr, "system": None}[level]
    allowed = allow_nonfinite if isinstance(allow_nonfinite, bool) else key in allow_nonfinite
    check_stored(key, values, allow_nonfinite=allowed, rows_ptr=ptr)
    return values


def write_custom(
    loc: StoreLocation,
    root: Any,
    meta: MetaInfo,
    key: str,
    values: NDArray[Any],
    level: Level,
    config: WriteConfig,
    phase: Callable[[str], None],
) -> None:
    """Store ``values`` as ``custom/<key>`` at ``level`` of the store at ``loc`` (open as ``root``), crash-safely.

    ``values`` were checked by :func:`checked_custom`. ``phase`` hears ``journal``, then ``staged``
    and ``moved-previous`` (local stores, the latter when an array is replaced), ``moved-new`` and
    ``fields``; the journal is cleared at the end.
    """
    previous = meta.schema.custom.get(key)
    journal = AddCustomOp(key=key, level=level, previous=previous, state=OpState.STAGING)
    write_journal(loc, journal)
    phase("journal")
    root.attrs.update(bumped(root.attrs.asdict(), rewritten=key if previous is not None else None))
    values = np.ascontiguousarray(values)
    cfg = config.for_array(layout.CUSTOM_GROUP, key, values)
    local = loc.local_root
    if local is None:
        _write_in_place(root, key, values, cfg)
        phase("moved-new")
    else:
        _write_staged(loc, local / layout.CUSTOM_GROUP / key, journal, values, cfg, phase)
    schema = layout.StoreSchema(
        num_samples=meta.n_physical, core=meta.schema.core, custom={**meta.schema.custom, key: level}
    )
    attributes = schema.to_attributes()
    if meta.integrity.checksums is not None and not cfg.checksum:  # the new array breaks that promise
        promise_now = layout.Integrity(complete_chunks=meta.integrity.complete_chunks)
        attributes.update(promise_now.to_attributes(root.attrs.asdict()))
    root.attrs.update(attributes)
    phase("fields")
    write_journal(loc, journal.with_state(OpState.COMMITTED))
    _finish(loc, key)


def _write_in_place(root: Any, key: str, values: NDArray[Any], cfg: ArrayConfig) -> None:
    """Write ``custom/<key>`` straight into a store that is not a local directory, replacing any old one."""
    custom = root.require_group(layout.CUSTOM_GROUP)
    if key in custom:
        del custom[key]
    write_array(custom, key, values, cfg)


def _write_staged(
    loc: StoreLocation,
    target: Path,
    journal: AddCustomOp,
    values: NDArray[Any],
    cfg: ArrayConfig,
    phase: Callable[[str], None],
) -> None:
    """Write the array beside the local store, then rename it to ``target`` (the array it replaces moved aside first)."""
    key = journal.key
    staging = sibling(loc, staging_suffix(key))
    shutil.rmtree(staging, ignore_errors=True)
    write_array(zarr.open_group(str(staging), mode="w"), key, values, cfg)
    phase("staged")
    write_journal(loc, journal.with_state(OpState.SWAPPING))
    target.parent.mkdir(exist_ok=True)
    if journal.previous is not None and target.exists():
        os.rename(target, sibling(loc, previous_suffix(key)))
        phase("moved-previous")
    os.rename(staging / key, target)
    shutil.rmtree(staging, ignore_errors=True)
    phase("moved-new")


def _finish(loc: StoreLocation, key: str) -> None:
    """Remove what a committed add_custom left beside a local store (the old array, the staging), then the journal."""
    if loc.local_root is not None:
        shutil.rmtree(sibling(loc, previous_suffix(key)), ignore_errors=True)
        shutil.rmtree(sibling(loc, staging_suffix(key)), ignore_errors=True)
    clear_journal(loc)
