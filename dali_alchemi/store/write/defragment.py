"""Defragment: drop soft-deleted samples for good by streaming the live ones into a new store.

The live samples are read ``window`` at a time through a reader and written in order into a new
store beside the old one (``neighbor_list`` re-based to the new atom offsets). Once the copy is
complete it is journaled, and the directories are swapped with two renames: the old store moves
aside, the copy moves into place, and the old one is deleted. A reader that looks in between reads
the copy (:func:`~dali_alchemi.store.format.journal.interpret`); a writer killed in between has the swap
finished by recovery. Memory use is bounded by one window, never the whole store.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from dali_alchemi.csr import exclusive_cumsum
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.generation import bumped
from dali_alchemi.store.format.journal import (
    DEFRAGMENT_NEW,
    DEFRAGMENT_OLD,
    DefragmentOp,
    clear_journal,
    sibling,
    write_journal,
)
from dali_alchemi.store.read.reader import AtomicDataZarrReader
from dali_alchemi.store.write.arrays import create_array, promise, write_array
from dali_alchemi.store.write.encode import disk_arrays
from dali_alchemi.types import PerLevel

if TYPE_CHECKING:
    from dali_alchemi.config import WriteConfig
    from dali_alchemi.store.format.location import StoreLocation
    from dali_alchemi.store.read.open_checks import MetaInfo

__all__ = ["DEFAULT_DEFRAGMENT_WINDOW", "DEFRAGMENT_CACHE_BYTES", "copy_live", "defragment"]


DEFAULT_DEFRAGMENT_WINDOW = 8192
"""Samples copied per step by :meth:`~dali_alchemi.store.write.writer.AtomicDataZarrWriter.defragment`."""

DEFRAGMENT_CACHE_BYTES = 64 << 20
"""Decoded-chunk cache while defragmenting: enough for the blocks two windows share, never the store."""


def defragment(
    loc: StoreLocation, root: Any, meta: MetaInfo, config: WriteConfig, window: int, phase: Callable[[str], None]
) -> None:
    """Replace the local store at ``loc`` (open as ``root``, checked as ``meta``) by a compacted copy.

    ``phase`` hears each step: ``copied-window`` (per window), ``staged``, ``journal``, ``retired``
    (the old store moved aside) and ``swapped`` (the copy in place).
    """
    assert loc.local_root is not None, "defragment() rewrites local directory stores only"
    staging = sibling(loc, DEFRAGMENT_NEW)
    retired = sibling(loc, DEFRAGMENT_OLD)
    shutil.rmtree(staging, ignore_errors=True)
    reader = AtomicDataZarrReader(str(loc.local_root), cache_bytes=DEFRAGMENT_CACHE_BYTES)
    try:
        copy_live(reader, root, meta, staging, config, window, phase)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        reader.close()
    phase("staged")
    write_journal(loc, DefragmentOp())
    phase("journal")
    os.rename(loc.local_root, retired)
    phase("retired")
    os.rename(staging, loc.local_root)
    phase("swapped")
    shutil.rmtree(retired, ignore_errors=True)
    clear_journal(loc)


def copy_live(
    reader: AtomicDataZarrReader,
    root: Any,
    meta: MetaInfo,
    staging: Path,
    config: WriteConfig,
    window: int,
    phase: Callable[[str], None],
) -> None:
    """Stream the live samples of ``root`` into a new store at ``staging``, ``window`` at a time."""
    live = np.flatnonzero(meta.samples_mask)
    atoms_ptr = exclusive_cumsum(np.diff(meta.atoms_ptr)[live])
    edges_ptr = exclusive_cumsum(np.diff(meta.edges_ptr)[live])
    new_root = zarr.open_group(str(staging), mode="w")
    new_meta = new_root.create_group(layout.META_GROUP)
    groups = {
        layout.CORE_GROUP: new_root.create_group(layout.CORE_GROUP),
        layout.CUSTOM_GROUP: new_root.create_group(layout.CUSTOM_GROUP),
    }
    meta_arrays = {
        layout.ATOMS_PTR: atoms_ptr,
        layout.EDGES_PTR: edges_ptr,
        layout.SAMPLES_MASK: np.ones(live.size, dtype=np.bool_),
        layout.ATOMS_MASK: np.ones(int(atoms_ptr[-1]), dtype=np.bool_),
        layout.EDGES_MASK: np.ones(int(edges_ptr[-1]), dtype=np.bool_),
    }
    configs = [config.for_array(layout.META_GROUP, name, values) for name, values in meta_arrays.items()]
    for (name, values), cfg in zip(meta_arrays.items(), configs, strict=True):
        write_array(new_meta, name, values, cfg)
    totals = PerLevel(atom=int(atoms_ptr[-1]), edge=int(edges_ptr[-1]), system=int(live.size))
    targets: dict[str, Any] = {}
    for group, target in groups.items():
        olds = {name: root[f"{group}/{name}"] for name in meta.schema.field_levels if meta.schema.group_of(name) == group}
        for name, cfg in config.for_arrays(group, olds).items():
            configs.append(cfg)
            shape = (totals[meta.schema.field_levels[name]], *olds[name].shape[1:])
            targets[name] = create_array(target, name, shape, np.dtype(olds[name].dtype), cfg)
    for start in range(0, live.size, window):
        stop = min(start + window, live.size)
        packed = reader.read_packed(np.arange(start, stop))
        bounds = PerLevel(
            atom=(int(atoms_ptr[start]), int(atoms_ptr[stop])),
            edge=(int(edges_ptr[start]), int(edges_ptr[stop])),
            system=(start, stop),
        )
        for name, values in disk_arrays(packed, int(atoms_ptr[start])).items():
            lo, hi = bounds[meta.schema.field_levels[name]]
            if hi > lo:
                targets[name][lo:hi] = values
        phase("copied-window")
    schema = layout.StoreSchema(num_samples=int(live.size), core=meta.schema.core, custom=meta.schema.custom)
    attributes = {**schema.to_attributes(), **bumped(root.attrs.asdict())}
    new_root.attrs.update({**attributes, **promise(configs).to_attributes(attributes)})
