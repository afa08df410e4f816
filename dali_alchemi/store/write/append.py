"""Samples added at the end of a store (the writer's ``append``): checked against it, then its rows extended.

Every check runs before anything is written. The rows are then extended under an
:class:`~dali_alchemi.store.format.journal.AppendOp` journal in an order that keeps the old state
valid until ``samples_mask`` grows (the commit point): the data arrays, the masks, the pointers,
``samples_mask``, the attributes. Recovery rolls back an append the journal shows unfinished
(:mod:`dali_alchemi.store.write.recovery`). The caller holds the writer lock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.errors import SampleDataError
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.journal import AppendOp, clear_journal, write_journal
from dali_alchemi.store.write.arrays import extend_array
from dali_alchemi.store.write.encode import Samples, checked_disk, field_names, to_packed

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.format.location import StoreLocation
    from dali_alchemi.store.format.packed import PackedSamples
    from dali_alchemi.store.read.open_checks import MetaInfo

__all__ = ["NewRows", "append_rows", "checked_new_rows"]


@dataclass(frozen=True, slots=True)
class NewRows:
    """Samples to append, checked against the store.

    Attributes
    ----------
    packed
        The new samples.
    disk
        Their rows as they go to disk (``neighbor_list`` store-global), per field.
    arrays
        The store's array that each field extends.
    """

    packed: PackedSamples
    disk: dict[str, NDArray[Any]]
    arrays: dict[str, Any]


def checked_new_rows(
    root: Any,
    meta: MetaInfo,
    samples: Samples,
    levels: Mapping[str, str] | None,
    *,
    allow_nonfinite: bool | frozenset[str],
) -> NewRows | None:
    """Check ``samples`` against the store open as ``root`` (checked as ``meta``); ``None`` if there are none.

    Raises
    ------
    SampleDataError
        If fields are missing or extra, a field's level differs from the store's, the rows break the
        reader's rules, or their shapes or dtypes do not fit the stored arrays.
    """
    store_levels = meta.schema.field_levels
    given = set(field_names(samples))
    missing, extra = sorted(set(store_levels) - given), sorted(given - set(store_levels))
    if missing or extra:
        raise SampleDataError(
            f"Appended samples must have exactly the store's fields: missing {missing}, unexpected {extra} "
            f"(add new fields to existing samples with add_custom first)"
        )
    packed = to_packed(samples, {**store_levels, **(levels or {})})
    if len(packed) == 0:
        return None
    for name, level in packed.levels.items():
        if level != store_levels[name]:
            raise SampleDataError(
                f"Field {name!r} is {store_levels[name]!r} in the store but {level!r} in the new samples"
            )
    disk = checked_disk(packed, int(meta.atoms_ptr[-1]), allow_nonfinite=allow_nonfinite)
    arrays = {name: root[f"{meta.schema.group_of(name)}/{name}"] for name in disk}
    for name, values in disk.items():
        arr = arrays[name]
        if tuple(arr.shape[1:]) != values.shape[1:]:
            raise SampleDataError(
                f"Field {name!r}: new rows have trailing shape {values.shape[1:]}, the store holds {tuple(arr.shape[1:])}"
            )
        if not np.can_cast(values.dtype, arr.dtype, casting="same_kind"):
            raise SampleDataError(f"Field {name!r}: new rows have dtype {values.dtype}, the store holds {arr.dtype}")
    return NewRows(packed=packed, disk=disk, arrays=arrays)


def append_rows(loc: StoreLocation, root: Any, meta: MetaInfo, rows: NewRows, phase: Callable[[str], None]) -> None:
    """Extend the store at ``loc`` (open as ``root``, checked as ``meta``) by ``rows``, crash-safely.

    ``phase`` hears ``journal``, ``data``, ``masks``, ``pointers``, ``samples_mask`` and ``attributes``;
    the journal is cleared at the end.
    """
    packed, disk, arrays = rows.packed, rows.disk, rows.arrays
    atom_base, edge_base, n_old = int(meta.atoms_ptr[-1]), int(meta.edges_ptr[-1]), meta.n_physical
    write_journal(loc, AppendOp(samples=n_old, atoms=atom_base, edges=edge_base))
    phase("journal")
    for name, values in disk.items():
        extend_array(arrays[name], values.astype(arrays[name].dtype, copy=False), meta.rows[packed.levels[name]])
    phase("data")
    meta_group = root[layout.META_GROUP]
    extend_array(meta_group[layout.ATOMS_MASK], np.ones(int(packed.n_atoms.sum()), np.bool_), atom_base)
    extend_array(meta_group[layout.EDGES_MASK], np.ones(int(packed.n_edges.sum()), np.bool_), edge_base)
    phase("masks")
    extend_array(meta_group[layout.ATOMS_PTR], packed.atoms_ptr[1:] + atom_base, n_old + 1)
    extend_array(meta_group[layout.EDGES_PTR], packed.edges_ptr[1:] + edge_base, n_old + 1)
    phase("pointers")
    extend_array(meta_group[layout.SAMPLES_MASK], np.ones(len(packed), np.bool_), n_old)
    phase("samples_mask")
    schema = layout.StoreSchema(num_samples=n_old + len(packed), core=meta.schema.core, custom=meta.schema.custom)
    root.attrs.update(schema.to_attributes())
    phase("attributes")
    clear_journal(loc)
