"""AtomicDataZarrWriter: create, extend, soft-delete and compact nvalchemi 0.2.0 stores.

The writer owns the pointer arrays and masks, and keeps every data array consistent with them:
``neighbor_list`` is stored store-global (``local + atoms_ptr[i]``) on write and append, and re-based
whenever rows move (defragment), which fixes the reference implementation's defects listed in the
store-format notes. Arrays are always created with explicit chunk shapes that keep trailing dims whole.
The writer never reads through a reader's cache and never holds a whole store in memory when
compacting it.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import zarr
from zarr.storage import StorePath

from dali_alchemi.batch import Batch, pack_samples
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.errors import SampleDataError, SampleIndexError, StoreNotFoundError
from dali_alchemi.packed import PackedSamples
from dali_alchemi.store import layout
from dali_alchemi.store.gather import concat_aranges
from dali_alchemi.store.location import StoreLike, StoreLocation, resolve_store
from dali_alchemi.store.validate import MetaInfo, check_meta, open_root

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import Level

logger = logging.getLogger(__name__)

DEFAULT_DEFRAGMENT_WINDOW = 8192
"""Samples copied per step by :meth:`AtomicDataZarrWriter.defragment`."""

Samples = Sequence[Mapping[str, Any]] | Batch | PackedSamples


def create_array(group: Any, name: str, shape: tuple[int, ...], dtype: np.dtype[Any], cfg: ArrayConfig) -> Any:
    """Create an array chunked (and optionally sharded) along dim 0 only, with explicit codecs."""
    trailing = tuple(max(1, int(s)) for s in shape[1:])
    row_bytes = max(1, math.prod(trailing)) * dtype.itemsize
    chunks = (cfg.rows_per_chunk(row_bytes), *trailing)
    shards = (cfg.shard_size, *trailing) if cfg.shard_size is not None else None
    return group.create_array(
        name,
        shape=shape,
        dtype=dtype,
        chunks=chunks,
        shards=shards,
        compressors=cfg.compressors or None,
        fill_value=False if dtype == np.bool_ else 0,
    )


def write_array(group: Any, name: str, data: NDArray[Any], cfg: ArrayConfig) -> Any:
    """Create ``name`` in ``group`` (see :func:`create_array`) and fill it with ``data``."""
    arr = create_array(group, name, tuple(data.shape), data.dtype, cfg)
    if data.size:
        arr[...] = data
    return arr


def _squeeze_system(arr: NDArray[Any]) -> NDArray[Any]:
    # nvalchemi's writer squeezes dim 1 of stacked system fields while it is 1 and ndim > 2, so a
    # per-sample (1, 1, k) is stored as (N, k). Kept for bit-for-bit compatible stores.
    while arr.ndim > 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    return arr


def _to_packed(samples: Samples, levels: Mapping[str, str] | None) -> PackedSamples:
    if isinstance(samples, PackedSamples):
        return samples
    if isinstance(samples, Batch):
        packed = samples.to_packed()
        if levels:
            for name, level in levels.items():
                if name in packed.levels and layout.check_level(level, what=f"field {name!r}") != packed.levels[name]:
                    raise SampleDataError(
                        f"Field {name!r} is {packed.levels[name]!r} in the Batch but levels= says {level!r}"
                    )
        return packed
    if isinstance(samples, Mapping):
        raise TypeError("samples must be a sequence of {field: array} mappings or a Batch, not a single mapping")
    return pack_samples(samples, levels=levels)


def _field_names(samples: Samples) -> list[str]:
    if isinstance(samples, (Batch, PackedSamples)):
        return list(samples.fields)
    return [k for k in samples[0] if k not in layout.NON_DATA_KEYS] if len(samples) else []


def _check_neighbor_list(packed: PackedSamples) -> None:
    """Every ``neighbor_list`` entry must be a valid local atom index of its own sample."""
    for name in layout.ATOM_INDEX_FIELDS & set(packed.fields):
        values = packed.fields[name]
        if not np.issubdtype(values.dtype, np.integer):
            raise SampleDataError(f"Field {name!r} has dtype {values.dtype}; expected integer atom indices")
        if values.size == 0:
            continue
        limit = np.repeat(packed.n_atoms, packed.n_edges).reshape((-1,) + (1,) * (values.ndim - 1))
        bad = (values < 0) | (values >= limit)
        if bad.any():
            edge = int(np.argmax(bad.reshape(bad.shape[0], -1).any(axis=1)))
            sample = int(np.searchsorted(np.cumsum(packed.n_edges), edge, side="right"))
            raise SampleDataError(
                f"Sample {sample}: {name} holds {values[edge].tolist()} but the sample has "
                f"{int(packed.n_atoms[sample])} atoms (indices must be sample-local, in [0, n_atoms))"
            )


def _global_index(packed: PackedSamples, name: str, atom_base: int) -> NDArray[Any]:
    """Sample-local atom indices -> store-global ones (``local + atoms_ptr[i]``)."""
    values = packed.fields[name]
    offsets = np.repeat(packed.atoms_ptr[:-1] + atom_base, packed.n_edges).astype(values.dtype)
    return values + offsets.reshape((-1,) + (1,) * (values.ndim - 1))


def _disk_arrays(packed: PackedSamples, atom_base: int) -> dict[str, NDArray[Any]]:
    """The arrays as they go to disk: global neighbor lists, squeezed system fields."""
    out: dict[str, NDArray[Any]] = {}
    for name, values in packed.fields.items():
        if name in layout.ATOM_INDEX_FIELDS:
            values = _global_index(packed, name, atom_base)
        elif packed.levels[name] == "system":
            values = _squeeze_system(values)
        out[name] = np.ascontiguousarray(values)
    return out


class AtomicDataZarrWriter:
    """Write nvalchemi 0.2.0 stores.

    Parameters
    ----------
    store
        Where the store lives: a path, a URL, a zarr ``Store`` or ``StorePath``, or a ``dict``.
    config
        Codecs, chunk and shard sizes (a :class:`~dali_alchemi.config.WriteConfig` or a plain mapping).
        Defaults keep trailing dims whole and target 1 MiB chunks.
    """

    def __init__(self, store: StoreLike, config: WriteConfig | Mapping[str, Any] | None = None) -> None:
        self._location: StoreLocation = resolve_store(store, read_only=False, must_exist=False)
        if config is None:
            config = WriteConfig()
        elif isinstance(config, Mapping):
            config = WriteConfig.from_dict(config)
        self.config: WriteConfig = config

    # -- helpers ------------------------------------------------------------------------------------
    def _exists(self) -> bool:
        loc = self._location
        if loc.local_root is not None:
            return loc.local_root.exists()
        try:
            root = zarr.open_group(store=StorePath(loc.store, loc.prefix), mode="r")
        except (FileNotFoundError, zarr.errors.BaseZarrError, KeyError):
            return False
        return any(True for _ in root.keys())

    def _open(self) -> tuple[Any, MetaInfo]:
        if not self._exists():
            raise StoreNotFoundError(f"Zarr store does not exist at {self._location.display}")
        open_root(self._location)  # checks that it is a zarr v3 group
        root = zarr.open_group(store=StorePath(self._location.store, self._location.prefix), mode="r+")
        return root, check_meta(root, store=self._location.display)

    # -- write --------------------------------------------------------------------------------------
    def write(self, samples: Samples, *, levels: Mapping[str, str] | None = None) -> None:
        """Create the store from ``samples`` (dicts of numpy arrays or torch tensors, or a Batch).

        Per-sample shapes follow nvalchemi: atom fields ``[V, *t]``, edge fields ``[E, *t]``, system
        fields ``[1, *t]``; ``neighbor_list`` is sample-local. Fields outside nvalchemi's key sets need
        ``levels={name: "atom"|"edge"|"system"}``.

        Raises
        ------
        FileExistsError
            If the store exists (for a local path: anything at that path, an empty directory too).
        ValueError
            If there are no samples, or they are inconsistent (:class:`SampleDataError`).
        """
        if self._exists():
            raise FileExistsError(f"Zarr store already exists at {self._location.display}")
        packed = _to_packed(samples, levels)
        if len(packed) == 0:
            raise ValueError("No data provided to write.")
        if "atom" not in packed.levels.values():
            raise SampleDataError("Samples need at least one atom-level field (e.g. atomic_numbers, positions)")
        _check_neighbor_list(packed)
        self._write_new(self._location, packed, self.config)

    def _write_new(self, loc: StoreLocation, packed: PackedSamples, config: WriteConfig) -> None:
        root = zarr.open_group(store=StorePath(loc.store, loc.prefix), mode="w")
        meta = root.create_group(layout.META_GROUP)
        core = root.create_group(layout.CORE_GROUP)
        root.create_group(layout.CUSTOM_GROUP)
        atoms_ptr, edges_ptr = packed.atoms_ptr, packed.edges_ptr
        meta_arrays = {
            layout.ATOMS_PTR: atoms_ptr,
            layout.EDGES_PTR: edges_ptr,
            layout.SAMPLES_MASK: np.ones(len(packed), dtype=np.bool_),
            layout.ATOMS_MASK: np.ones(int(atoms_ptr[-1]), dtype=np.bool_),
            layout.EDGES_MASK: np.ones(int(edges_ptr[-1]), dtype=np.bool_),
        }
        for name, values in meta_arrays.items():
            write_array(meta, name, values, config.for_array(layout.META_GROUP, name))
        for name, values in _disk_arrays(packed, 0).items():
            write_array(core, name, values, config.for_array(layout.CORE_GROUP, name))
        schema = layout.StoreSchema(num_samples=len(packed), core=dict(packed.levels))
        root.attrs.update(schema.to_attributes())

    # -- append -------------------------------------------------------------------------------------
    def append(self, samples: Samples, *, levels: Mapping[str, str] | None = None) -> None:
        """Add samples at the end, extending every core and custom array and the pointers and masks.

        The new samples must carry exactly the store's fields (core and custom), with trailing shapes
        and dtypes the store can hold; ``neighbor_list`` is stored re-based to store-global indices.
        An empty sequence does nothing.

        Raises
        ------
        FileNotFoundError
            If the store does not exist.
        SampleDataError
            If fields are missing or extra, or shapes or dtypes do not fit the stored arrays.
        """
        if not isinstance(samples, (Batch, PackedSamples)) and len(samples) == 0:
            return
        root, meta = self._open()
        store_levels = meta.schema.field_levels
        given = set(_field_names(samples))
        missing, extra = sorted(set(store_levels) - given), sorted(given - set(store_levels))
        if missing or extra:
            raise SampleDataError(
                f"Appended samples must have exactly the store's fields: missing {missing}, unexpected {extra} "
                f"(add new fields to existing samples with add_custom first)"
            )
        packed = _to_packed(samples, {**store_levels, **(levels or {})})
        if len(packed) == 0:
            return
        for name, level in packed.levels.items():
            if level != store_levels[name]:
                raise SampleDataError(
                    f"Field {name!r} is {store_levels[name]!r} in the store but {level!r} in the new samples"
                )
        _check_neighbor_list(packed)
        atom_base, edge_base, n_old = int(meta.atoms_ptr[-1]), int(meta.edges_ptr[-1]), meta.n_physical
        disk = _disk_arrays(packed, atom_base)
        arrays = {name: root[f"{meta.schema.group_of(name)}/{name}"] for name in disk}
        for name, values in disk.items():
            arr = arrays[name]
            if tuple(arr.shape[1:]) != values.shape[1:]:
                raise SampleDataError(
                    f"Field {name!r}: new rows have trailing shape {values.shape[1:]}, the store holds {tuple(arr.shape[1:])}"
                )
            if not np.can_cast(values.dtype, arr.dtype, casting="same_kind"):
                raise SampleDataError(
                    f"Field {name!r}: new rows have dtype {values.dtype}, the store holds {arr.dtype}"
                )
        # Data first, then masks, then pointers, then num_samples: readers size everything from the
        # pointers, so until they are extended the new rows are invisible.
        bases = {"atom": atom_base, "edge": edge_base, "system": n_old}
        for name, values in disk.items():
            _extend(arrays[name], values.astype(arrays[name].dtype, copy=False), bases[packed.levels[name]])
        meta_group = root[layout.META_GROUP]
        _extend(meta_group[layout.ATOMS_MASK], np.ones(int(packed.n_atoms.sum()), np.bool_), atom_base)
        _extend(meta_group[layout.EDGES_MASK], np.ones(int(packed.n_edges.sum()), np.bool_), edge_base)
        _extend(meta_group[layout.SAMPLES_MASK], np.ones(len(packed), np.bool_), n_old)
        _extend(meta_group[layout.ATOMS_PTR], packed.atoms_ptr[1:] + atom_base, n_old + 1)
        _extend(meta_group[layout.EDGES_PTR], packed.edges_ptr[1:] + edge_base, n_old + 1)
        schema = layout.StoreSchema(num_samples=n_old + len(packed), core=meta.schema.core, custom=meta.schema.custom)
        root.attrs.update(schema.to_attributes())

    # -- custom arrays ------------------------------------------------------------------------------
    def add_custom(self, key: str, data: NDArray[Any] | torch.Tensor, level: str) -> None:
        """Store ``data`` as ``custom/<key>``, one row per atom, edge or physical sample.

        Raises
        ------
        FieldLevelError
            If ``level`` is not ``atom``, ``edge`` or ``system`` (a ``ValueError``).
        FileNotFoundError
            If the store does not exist.
        SampleDataError
            If ``data.shape[0]`` is not the physical size of that level (deleted samples included), or
            ``key`` is already a core field (a ``ValueError``).
        """
        checked: Level = layout.check_level(level, what=f"custom array {key!r}")
        root, meta = self._open()
        values = data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
        expected = {"atom": int(meta.atoms_ptr[-1]), "edge": int(meta.edges_ptr[-1]), "system": meta.n_physical}[
            checked
        ]
        if values.ndim == 0 or values.shape[0] != expected:
            got = values.shape[0] if values.ndim else "a scalar"
            raise SampleDataError(f"Data shape[0]={got} does not match expected size={expected} for level={checked}")
        if key in meta.schema.core:
            raise SampleDataError(
                f"{key!r} is already a core field of this store; choose another name for the custom array"
            )
        custom = (
            root[layout.CUSTOM_GROUP] if layout.CUSTOM_GROUP in meta.groups else root.create_group(layout.CUSTOM_GROUP)
        )
        if key in meta.schema.custom or key in custom:
            del custom[key]
        write_array(custom, key, np.ascontiguousarray(values), self.config.for_array(layout.CUSTOM_GROUP, key))
        schema = layout.StoreSchema(
            num_samples=meta.n_physical, core=meta.schema.core, custom={**meta.schema.custom, key: checked}
        )
        root.attrs.update(schema.to_attributes())

    # -- delete -------------------------------------------------------------------------------------
    def delete(self, indices: Sequence[int] | NDArray[Any] | torch.Tensor) -> None:
        """Soft-delete samples by *physical* index (nvalchemi semantics); their data is zeroed.

        The pointers are unchanged; readers must :meth:`~AtomicDataZarrReader.refresh`. Deleting an
        already deleted sample does nothing. Raises :class:`SampleIndexError` for an out-of-range index.
        """
        physical = np.unique(
            np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices, dtype=np.int64).reshape(-1)
        )
        if physical.size == 0:
            return
        root, meta = self._open()
        n = meta.n_physical
        bad = (physical < 0) | (physical >= n)
        if bad.any():
            raise SampleIndexError(
                f"Physical index {int(physical[np.argmax(bad)])} out of range for a store with {n} samples"
            )
        rows = {
            "atom": concat_aranges(meta.atoms_ptr[physical], np.diff(meta.atoms_ptr)[physical]),
            "edge": concat_aranges(meta.edges_ptr[physical], np.diff(meta.edges_ptr)[physical]),
            "system": physical,
        }
        for name, level in meta.schema.field_levels.items():
            arr = root[f"{meta.schema.group_of(name)}/{name}"]
            if rows[level].size:
                arr.set_orthogonal_selection((rows[level],), np.zeros((), dtype=arr.dtype))
        meta_group = root[layout.META_GROUP]
        for mask, level in ((layout.ATOMS_MASK, "atom"), (layout.EDGES_MASK, "edge"), (layout.SAMPLES_MASK, "system")):
            if rows[level].size:
                meta_group[mask].set_orthogonal_selection((rows[level],), False)

    # -- defragment ---------------------------------------------------------------------------------
    def defragment(
        self, config: WriteConfig | Mapping[str, Any] | None = None, *, window: int = DEFAULT_DEFRAGMENT_WINDOW
    ) -> None:
        """Drop soft-deleted samples for good, streaming ``window`` samples at a time.

        The live samples are copied in order into a new store (with ``config``, or the writer's), with
        ``neighbor_list`` re-based, and the new store then replaces the old one. Deleting every sample
        leaves a valid, empty, readable store that keeps its fields. Memory use is bounded by one
        window, never the whole store.
        """
        from dali_alchemi.store.reader import AtomicDataZarrReader

        if config is None:
            new_config = self.config
        elif isinstance(config, Mapping):
            new_config = WriteConfig.from_dict(config)
        else:
            new_config = config
        if window < 1:
            raise ValueError(f"window must be >= 1 sample, got {window}")
        root, meta = self._open()
        loc = self._location
        if loc.local_root is None:
            raise NotImplementedError(
                "defragment() rewrites local directory stores only; copy the store to a local path first"
            )
        staging = loc.local_root.with_name(f".{loc.local_root.name}.defrag-{uuid.uuid4().hex[:8]}")
        reader = AtomicDataZarrReader(str(loc.local_root), cache_bytes=64 << 20)
        try:
            self._copy_live(reader, root, meta, staging, new_config, window)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        finally:
            reader.close()
        del root
        _swap_directories(loc.local_root, staging)
        self.config = new_config
        logger.info("defragmented %s: %d -> %d samples", loc.display, meta.n_physical, int(meta.samples_mask.sum()))

    def _copy_live(
        self, reader: Any, root: Any, meta: MetaInfo, staging: Path, config: WriteConfig, window: int
    ) -> None:
        live = np.flatnonzero(meta.samples_mask)
        n_atoms = np.diff(meta.atoms_ptr)[live]
        n_edges = np.diff(meta.edges_ptr)[live]
        atoms_ptr = np.concatenate([[0], np.cumsum(n_atoms)]).astype(np.int64)
        edges_ptr = np.concatenate([[0], np.cumsum(n_edges)]).astype(np.int64)
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
        for name, values in meta_arrays.items():
            write_array(new_meta, name, values, config.for_array(layout.META_GROUP, name))
        totals = {"atom": int(atoms_ptr[-1]), "edge": int(edges_ptr[-1]), "system": int(live.size)}
        targets: dict[str, Any] = {}
        for name, level in meta.schema.field_levels.items():
            group = meta.schema.group_of(name)
            old = root[f"{group}/{name}"]
            targets[name] = create_array(
                groups[group], name, (totals[level], *old.shape[1:]), np.dtype(old.dtype), config.for_array(group, name)
            )
        for start in range(0, live.size, window):
            stop = min(start + window, live.size)
            packed = reader.read_packed(np.arange(start, stop))
            bounds = {
                "atom": (atoms_ptr[start], atoms_ptr[stop]),
                "edge": (edges_ptr[start], edges_ptr[stop]),
                "system": (start, stop),
            }
            for name, values in _disk_arrays(packed, int(atoms_ptr[start])).items():
                lo, hi = bounds[meta.schema.field_levels[name]]
                if hi > lo:
                    targets[name][int(lo) : int(hi)] = values
        schema = layout.StoreSchema(num_samples=int(live.size), core=meta.schema.core, custom=meta.schema.custom)
        new_root.attrs.update(schema.to_attributes())


def _extend(arr: Any, values: NDArray[Any], start: int) -> None:
    """Resize ``arr`` to ``start + len(values)`` rows and write ``values`` there."""
    new_len = start + values.shape[0]
    arr.resize((new_len, *arr.shape[1:]))
    if values.shape[0]:
        arr[start:new_len] = values


def _swap_directories(target: Path, staging: Path) -> None:
    """Replace directory ``target`` by ``staging`` (two renames, then removal of the old tree)."""
    retired = target.with_name(f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.rename(target, retired)
    os.rename(staging, target)
    shutil.rmtree(retired, ignore_errors=True)
