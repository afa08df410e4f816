"""Turning samples into what goes on disk, and checking them on the way.

Samples arrive as per-sample mappings, a PackedSamples, or anything that packs itself (a Batch);
they leave as one array per field with store-global neighbor lists and nvalchemi's system-field
squeeze applied. Pure numpy; no zarr, and nothing from above the store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi import csr
from dali_alchemi.errors import ConfigTypeError, SampleDataError
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.packed import PackedSamples, SupportsPacked

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "Samples", "check_disk", "check_field_name", "check_neighbor_list", "check_stored", "checked_disk",
    "disk_arrays", "field_names", "global_index", "squeeze_system", "to_packed"
]


Samples = Sequence[Mapping[str, Any]] | PackedSamples | SupportsPacked


def squeeze_system(arr: NDArray[Any]) -> NDArray[Any]:
    # nvalchemi's writer squeezes dim 1 of stacked system fields while it is 1 and ndim > 2, so a
    # per-sample (1, 1, k) is stored as (N, k). Kept for bit-for-bit compatible stores.
    while arr.ndim > 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    return arr


def to_packed(samples: Samples, levels: Mapping[str, str] | None) -> PackedSamples:
    if isinstance(samples, PackedSamples):
        return samples
    if isinstance(samples, SupportsPacked):
        packed = samples.to_packed()
        if levels:
            for name, level in levels.items():
                if name in packed.levels and layout.check_level(level, what=f"field {name!r}") != packed.levels[name]:
                    raise SampleDataError(
                        f"Field {name!r} is {packed.levels[name]!r} in the Batch but levels= says {level!r}"
                    )
        return packed
    if isinstance(samples, Mapping):
        raise ConfigTypeError("samples must be a sequence of {field: array} mappings or a Batch, not a single mapping")
    return PackedSamples.from_samples(samples, levels=levels)


def field_names(samples: Samples) -> list[str]:
    if isinstance(samples, (PackedSamples, SupportsPacked)):
        return list(to_packed(samples, None).fields)
    return [k for k in samples[0] if k not in layout.NON_DATA_KEYS] if len(samples) else []


def check_neighbor_list(packed: PackedSamples) -> None:
    """Every ``neighbor_list`` entry must be a valid local atom index of its own sample."""
    for name in layout.ATOM_INDEX_FIELDS & set(packed.fields):
        values = packed.fields[name]
        if not np.issubdtype(values.dtype, np.integer):
            raise SampleDataError(f"Field {name!r} has dtype {values.dtype}; expected integer atom indices")
        if values.ndim != 2 or values.shape[1] != 2:
            raise SampleDataError(f"Field {name!r} has shape {values.shape}; expected [edges, 2] atom index pairs")
        if values.size == 0:
            continue
        bad = csr.first_out_of_range(values, packed.n_atoms, packed.n_edges)
        if bad is not None:
            edge, sample = bad
            raise SampleDataError(
                f"Sample {sample}: {name} holds {values[edge].tolist()} but the sample has "
                f"{int(packed.n_atoms[sample])} atoms (indices must be sample-local, in [0, n_atoms))"
            )


def check_field_name(name: object) -> None:
    """Refuse a field name that could not be an array of the store (:func:`~dali_alchemi.store.format.layout.field_name_problem`)."""
    problem = layout.field_name_problem(name)
    if problem is not None:
        raise SampleDataError(f"Field name {name!r} {problem}; use a plain name (letters, digits, '_', '-')")


def check_stored(
    name: str, values: NDArray[Any], *, allow_nonfinite: bool, rows_ptr: NDArray[np.int64] | None = None
) -> None:
    """Refuse an array the reader would refuse, or non-finite floats unless ``allow_nonfinite``.

    The same rules as the reader's (:func:`~dali_alchemi.store.format.layout.field_array_problem`), applied to
    ``values`` as they will be stored. ``rows_ptr`` (the level's CSR pointers) lets the message name
    the sample of the first non-finite row. Vectorised: one ``isfinite`` pass per float field.
    """
    check_field_name(name)
    problem = layout.field_array_problem(name, values.dtype, values.shape)
    if problem is not None:
        raise SampleDataError(f"Field {name!r} {problem}")
    if allow_nonfinite or values.dtype.kind not in "fc" or values.size == 0:
        return
    finite = np.isfinite(values)
    if finite.all():
        return
    flat = int(np.argmin(finite.reshape(len(values), -1).all(axis=1)))
    where = f"row {flat}"
    if rows_ptr is not None:
        where += f" (sample {int(np.searchsorted(rows_ptr, flat, side='right')) - 1})"
    raise SampleDataError(
        f"Field {name!r}: {where} holds {values[flat].tolist()!r}, not finite (NaN or inf); "
        f"nothing was written. Pass allow_nonfinite=True to the writer to store such values (nvalchemi stores "
        f"them silently)"
    )


def check_disk(
    packed: PackedSamples, disk: Mapping[str, NDArray[Any]], *, allow_nonfinite: bool | frozenset[str]
) -> None:
    """:func:`check_stored` for every array of a write or append, before any is written.

    ``allow_nonfinite``: for every field (a bool), or the names of the fields that may hold NaN and inf.
    """
    ptrs = {"atom": packed.atoms_ptr, "edge": packed.edges_ptr, "system": None}
    for name, values in disk.items():
        allowed = allow_nonfinite if isinstance(allow_nonfinite, bool) else name in allow_nonfinite
        check_stored(name, values, allow_nonfinite=allowed, rows_ptr=ptrs[packed.levels[name]])


def global_index(packed: PackedSamples, name: str, atom_base: int) -> NDArray[Any]:
    """Sample-local atom indices -> store-global ones (``local + atoms_ptr[i]``)."""
    return csr.rebase(packed.fields[name].copy(), packed.atoms_ptr[:-1] + atom_base, packed.n_edges)


def disk_arrays(packed: PackedSamples, atom_base: int) -> dict[str, NDArray[Any]]:
    """The arrays as they go to disk: global neighbor lists, squeezed system fields."""
    out: dict[str, NDArray[Any]] = {}
    for name, values in packed.fields.items():
        if name in layout.ATOM_INDEX_FIELDS:
            values = global_index(packed, name, atom_base)
        elif packed.levels[name] == "system":
            values = squeeze_system(values)
        out[name] = np.ascontiguousarray(values)
    return out


def checked_disk(
    packed: PackedSamples, atom_base: int, *, allow_nonfinite: bool | frozenset[str]
) -> dict[str, NDArray[Any]]:
    """The arrays ``packed`` puts on disk, checked by the reader's rules before any is written.

    Shared by a write (``atom_base`` 0) and an append (the store's atom count), so both refuse the same
    samples. ``allow_nonfinite``: as for :func:`check_disk`.
    """
    for name in packed.fields:
        check_field_name(name)
    check_neighbor_list(packed)
    disk = disk_arrays(packed, atom_base)
    check_disk(packed, disk, allow_nonfinite=allow_nonfinite)
    return disk
