"""A new store written whole (the writer's ``write``): the samples checked, then every array written.

A local store is built in a staging directory beside its path and renamed into place, so it never
exists half-written; any other store (a URL, a zarr ``Store``, a ``dict``) is written where it is.
The caller holds the writer lock and has checked that nothing is at the store's path.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from dali_alchemi.errors import SampleDataError
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.journal import CREATE_PREFIX, sibling
from dali_alchemi.store.format.location import StoreLocation, open_group
from dali_alchemi.store.write.arrays import promise, write_array
from dali_alchemi.store.write.encode import Samples, checked_disk, to_packed

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.config import ArrayConfig, WriteConfig
    from dali_alchemi.store.format.packed import PackedSamples
    from dali_alchemi.types import Level

__all__ = ["build_store", "checked_new_samples", "create_store", "root_attributes"]


def checked_new_samples(
    samples: Samples,
    levels: Mapping[str, str] | None,
    custom: Collection[str],
    *,
    allow_nonfinite: bool | frozenset[str],
) -> tuple[PackedSamples, dict[str, NDArray[Any]]]:
    """The samples of a new store packed, and the arrays they put on disk; all checked before anything is written.

    Raises
    ------
    SampleDataError
        If there are no samples, none has an atom-level field, they break the reader's rules, or
        ``custom`` names a field they lack or one that must stay core.
    """
    packed = to_packed(samples, levels)
    if len(packed) == 0:
        raise SampleDataError("No data provided to write.")
    if "atom" not in packed.levels.values():
        raise SampleDataError("Samples need at least one atom-level field (e.g. atomic_numbers, positions)")
    disk = checked_disk(packed, 0, allow_nonfinite=allow_nonfinite)
    unknown = sorted(set(custom) - set(packed.fields))
    if unknown:
        raise SampleDataError(f"custom= names fields the samples do not have: {unknown}")
    clash = sorted(set(custom) & (layout.ATOM_INDEX_FIELDS | {"atomic_numbers", "positions"}))
    if clash:
        raise SampleDataError(f"{clash} must stay core fields")
    return packed, disk


def create_store(
    loc: StoreLocation,
    packed: PackedSamples,
    disk: Mapping[str, NDArray[Any]],
    config: WriteConfig,
    custom: frozenset[str],
    phase: Callable[[str], None],
) -> None:
    """Write the new store at ``loc``: staged and renamed into place when local, else where it is.

    ``phase`` hears ``staged`` (local stores only) once the staged store is complete. A failure
    leaves no staging directory behind.
    """
    build_store(loc, lambda root: _write_new(root, packed, disk, config, custom), phase)


def build_store(loc: StoreLocation, fill: Callable[[Any], None], phase: Callable[[str], None]) -> None:
    """Have ``fill`` write every group, array and attribute of a new store into an empty group.

    A local store is filled in a staging directory beside its path, which ``phase`` hears as ``staged``
    and which is then renamed into place; a failure removes it. Any other store is filled where it is.
    """
    local = loc.local_root
    if local is None:
        fill(open_group(loc, mode="a"))  # "w" would clear the store, the writer lock with it
        return
    staging = sibling(loc, f"{CREATE_PREFIX}{uuid.uuid4().hex[:8]}")
    try:
        fill(zarr.open_group(str(staging), mode="w"))
        phase("staged")
        os.rename(staging, local)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def root_attributes(
    num_samples: int, levels: Mapping[str, Level], custom: Collection[str], configs: list[ArrayConfig]
) -> dict[str, Any]:
    """The root attributes of a new store: its schema and what its arrays' configs promise."""
    schema = layout.StoreSchema(
        num_samples=num_samples,
        core={k: v for k, v in levels.items() if k not in custom},
        custom={k: v for k, v in levels.items() if k in custom},
    )
    return {**schema.to_attributes(), **promise(configs).to_attributes()}


def _write_new(
    root: Any, packed: PackedSamples, disk: Mapping[str, NDArray[Any]], config: WriteConfig, custom: frozenset[str]
) -> None:
    """Every group, array and attribute of a new store into the empty group ``root``."""
    meta = root.create_group(layout.META_GROUP)
    groups = {
        layout.CORE_GROUP: root.create_group(layout.CORE_GROUP),
        layout.CUSTOM_GROUP: root.create_group(layout.CUSTOM_GROUP),
    }
    atoms_ptr, edges_ptr = packed.atoms_ptr, packed.edges_ptr
    meta_arrays = {
        layout.ATOMS_PTR: atoms_ptr,
        layout.EDGES_PTR: edges_ptr,
        layout.SAMPLES_MASK: np.ones(len(packed), dtype=np.bool_),
        layout.ATOMS_MASK: np.ones(int(atoms_ptr[-1]), dtype=np.bool_),
        layout.EDGES_MASK: np.ones(int(edges_ptr[-1]), dtype=np.bool_),
    }
    configs = []
    for name, values in meta_arrays.items():
        configs.append(config.for_array(layout.META_GROUP, name, values))
        write_array(meta, name, values, configs[-1])
    for group, target in groups.items():
        arrays = {name: values for name, values in disk.items() if (name in custom) == (group == layout.CUSTOM_GROUP)}
        for name, cfg in config.for_arrays(group, arrays).items():
            configs.append(cfg)
            write_array(target, name, arrays[name], cfg)
    root.attrs.update(root_attributes(len(packed), packed.levels, custom, configs))
