"""Open-time checks of a store: the cheap invariants, with errors that name the array and the problem.

Everything here reads only metadata plus the pointer arrays and ``samples_mask`` (one int64 and one
bool per sample), so opening a large store stays fast. Chunk contents are checked lazily, when the
reader decodes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.errors import BaseZarrError
from zarr.storage import StorePath

from dali_alchemi.errors import StoreFormatError
from dali_alchemi.store import layout

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.location import StoreLocation
    from dali_alchemi.types import Level


@dataclass(frozen=True, slots=True)
class MetaInfo:
    """What the ``meta`` group and root attributes say: pointers, mask and schema, all checked."""

    schema: layout.StoreSchema
    atoms_ptr: NDArray[np.int64]
    edges_ptr: NDArray[np.int64]
    samples_mask: NDArray[np.bool_]
    groups: frozenset[str]

    @property
    def n_physical(self) -> int:
        """Physical samples (soft-deleted ones included)."""
        return int(self.samples_mask.size)


def open_root(loc: StoreLocation) -> Any:
    """Open the store's root group read-only; not a zarr v3 group -> :class:`StoreFormatError`."""
    try:
        root = zarr.open_group(store=StorePath(loc.store, loc.prefix), mode="r")
    except (BaseZarrError, FileNotFoundError, KeyError, ValueError, TypeError) as err:
        raise StoreFormatError(f"Store {loc.display} is not a zarr group: {err}") from err
    version = root.metadata.zarr_format
    if version != 3:
        raise StoreFormatError(f"Store {loc.display} is zarr format {version}; expected zarr format 3")
    return root


def _read_meta_array(meta: Any, name: str, store: str) -> Any:
    try:
        return meta[name]
    except KeyError as err:
        raise StoreFormatError(f"Store {store}: missing array meta/{name}") from err


def _check_pointer(ptr: NDArray[Any], name: str, n: int, store: str) -> NDArray[np.int64]:
    if ptr.ndim != 1 or ptr.size != n + 1:
        raise StoreFormatError(
            f"Store {store}: meta/{name} has shape {ptr.shape}; expected ({n + 1},) for {n} samples in samples_mask"
        )
    if not np.issubdtype(ptr.dtype, np.integer):
        raise StoreFormatError(f"Store {store}: meta/{name} has dtype {ptr.dtype}; expected an integer pointer")
    ptr = ptr.astype(np.int64, copy=False)
    if ptr[0] != 0:
        raise StoreFormatError(f"Store {store}: meta/{name} starts at {int(ptr[0])}; expected 0")
    steps = np.diff(ptr)
    if (steps < 0).any():
        at = int(np.argmax(steps < 0))
        raise StoreFormatError(
            f"Store {store}: meta/{name} is not monotonic: entry {at + 1} ({int(ptr[at + 1])}) < entry {at} ({int(ptr[at])})"
        )
    return ptr


def check_meta(root: Any, *, store: str) -> MetaInfo:
    """Check groups, root attributes, pointers and masks; return the pointers and mask as numpy arrays."""
    groups = frozenset(name for name, _ in root.groups())
    for required in (layout.META_GROUP, layout.CORE_GROUP):
        if required not in groups:
            raise StoreFormatError(f"Store {store} is missing the {required!r} group")
    schema = layout.parse_schema(root.attrs.asdict(), store=store)
    meta = root[layout.META_GROUP]
    arrays = {name: _read_meta_array(meta, name, store) for name in layout.META_ARRAYS}
    mask_arr = arrays[layout.SAMPLES_MASK]
    if len(mask_arr.shape) != 1:
        raise StoreFormatError(f"Store {store}: meta/samples_mask has shape {mask_arr.shape}; expected 1-D")
    if mask_arr.dtype != np.bool_:
        raise StoreFormatError(f"Store {store}: meta/samples_mask has dtype {mask_arr.dtype}; expected bool")
    n = int(mask_arr.shape[0])
    for name in (layout.ATOMS_PTR, layout.EDGES_PTR):
        if tuple(arrays[name].shape) != (n + 1,):
            raise StoreFormatError(
                f"Store {store}: meta/{name} has shape {tuple(arrays[name].shape)}; "
                f"expected ({n + 1},) for {n} samples in samples_mask"
            )
    samples_mask = np.asarray(mask_arr[...], dtype=np.bool_)
    atoms_ptr = _check_pointer(np.asarray(arrays[layout.ATOMS_PTR][...]), layout.ATOMS_PTR, n, store)
    edges_ptr = _check_pointer(np.asarray(arrays[layout.EDGES_PTR][...]), layout.EDGES_PTR, n, store)
    for mask_name, ptr, what in ((layout.ATOMS_MASK, atoms_ptr, "atoms"), (layout.EDGES_MASK, edges_ptr, "edges")):
        shape = tuple(arrays[mask_name].shape)
        if shape != (int(ptr[-1]),):
            raise StoreFormatError(
                f"Store {store}: meta/{mask_name} has shape {shape}; expected ({int(ptr[-1])},) for the {what} in the pointers"
            )
    if schema.num_samples not in (-1, n):
        raise StoreFormatError(
            f"Store {store}: root attribute num_samples is {schema.num_samples} but meta/samples_mask has {n} entries"
        )
    return MetaInfo(schema=schema, atoms_ptr=atoms_ptr, edges_ptr=edges_ptr, samples_mask=samples_mask, groups=groups)


def check_data_array(
    arr: Any,
    *,
    name: str,
    group: str,
    recorded: dict[str, Level],
    expected_rows: dict[str, int],
    store: str,
) -> Level:
    """Check one core/custom array against its level and the pointers; return its level."""
    level = recorded.get(name) or layout.default_level(name)
    if level is None:
        raise StoreFormatError(
            f"Store {store}: array {group}/{name} has no level in the 'fields' attribute and is not a known AtomicData field"
        )
    shape = tuple(arr.shape)
    if not shape:
        raise StoreFormatError(f"Store {store}: array {group}/{name} is 0-dimensional; expected one row per {level}")
    if shape[0] != expected_rows[level]:
        what = {"atom": "atoms (atoms_ptr[-1])", "edge": "edges (edges_ptr[-1])", "system": "samples (samples_mask)"}[
            level
        ]
        raise StoreFormatError(
            f"Store {store}: array {group}/{name} has {shape[0]} rows; expected {expected_rows[level]} {what}"
        )
    kinds = layout.EXPECTED_DTYPE_KINDS.get(name)
    dtype = np.dtype(arr.dtype)
    if kinds is not None and dtype.kind not in kinds:
        raise StoreFormatError(f"Store {store}: array {group}/{name} has dtype {dtype}, which cannot hold {name}")
    trailing = layout.EXPECTED_TRAILING_SHAPES.get(name)
    if trailing is not None and shape[1:] != trailing:
        raise StoreFormatError(
            f"Store {store}: array {group}/{name} has shape {shape}; expected [rows, {', '.join(map(str, trailing))}]"
        )
    return level
