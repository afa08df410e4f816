"""A new store written part by part (the writer's ``write`` given an iterator of parts), in bounded memory.

Each part (a :class:`~dali_alchemi.store.format.packed.PackedSamples`, a list of per-sample dicts, a
Batch) is checked as a one-shot write checks its samples, against the store it extends (its
``neighbor_list`` stored store-global from the atoms before it), and must hold the fields of the
first part with the same levels, dtypes and trailing shapes. Every array, the pointers and masks
too, is written in whole shards (whole chunks when unsharded) as they fill: rows wait in a buffer
only until their shard is complete, each shard is encoded once, and the last, partial one is written
at the end. So memory holds one part plus at most one shard per array, whatever the number of
structures, and the store is byte for byte the one-shot write of the same structures when the layout
chosen from the first part (below) is the one the whole would get.

The layout is decided from the first part: :meth:`~dali_alchemi.config.WriteConfig.for_arrays` probes
the first :data:`~dali_alchemi.config.SAMPLE_BYTES` of each array to pick codecs, and the default
layout's disk budget weighs the arrays by their sizes in that part. A first part of at least that
many bytes per array, with atoms, edges and structures in the proportions of the whole, gets the
one-shot write's layout. A local store is staged beside its path and renamed into place at the end
(:func:`~dali_alchemi.store.write.create.build_store`), so a failed or killed write leaves nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import numpy as np

from dali_alchemi.errors import SampleDataError
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.packed import PackedSamples, SupportsPacked
from dali_alchemi.store.write.arrays import create_array
from dali_alchemi.store.write.create import build_store, checked_new_samples, create_store, root_attributes
from dali_alchemi.store.write.encode import Samples, checked_disk, to_packed

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.config import ArrayConfig, WriteConfig
    from dali_alchemi.store.format.location import StoreLocation
    from dali_alchemi.types import Level

__all__ = ["Parts", "ShardedColumn", "is_parts", "stream_store", "write_new_store"]


Parts = Iterable[Samples]
"""Parts of a new store, each samples as one write takes them (an iterator or a generator of them)."""


def is_parts(samples: object) -> TypeGuard[Parts]:
    """Whether ``samples`` is an iterable of parts (an iterator, a generator) rather than one set of samples.

    A sequence (a list of per-sample dicts), a PackedSamples, a Batch and a mapping are one set.
    """
    one_set = (Sequence, Mapping, PackedSamples, SupportsPacked, np.ndarray)
    return isinstance(samples, Iterable) and not isinstance(samples, one_set)


class ShardedColumn:
    """Rows of one zarr array written in whole shards (whole chunks when unsharded) as they arrive.

    ``push`` buffers rows until at least one shard is complete, then writes every complete shard in
    one assignment (each encoded once, never read back); ``finish`` writes the partial last shard. The
    array grows as shards are written, so its metadata always names only written rows.
    """

    def __init__(self, arr: Any) -> None:
        self.arr = arr
        self.unit = int(arr.shards[0] if arr.shards is not None else arr.chunks[0])
        self.written = 0
        self._pending: list[NDArray[Any]] = []
        self._pending_rows = 0

    def push(self, values: NDArray[Any]) -> None:
        """Add ``values`` (rows in order) and write the shards they complete."""
        if not len(values):
            return
        self._pending.append(values)
        self._pending_rows += len(values)
        whole = self._pending_rows // self.unit * self.unit
        if whole:
            block = self._pending[0] if len(self._pending) == 1 else np.concatenate(self._pending)
            self._write(block[:whole])
            rest = block[whole:]
            self._pending = [rest.copy()] if len(rest) else []  # a copy: the part itself is not kept
            self._pending_rows = len(rest)

    def finish(self) -> None:
        """Write the rows still buffered (the last, partial shard)."""
        if self._pending_rows:
            self._write(np.concatenate(self._pending))
        self._pending, self._pending_rows = [], 0

    def _write(self, rows: NDArray[Any]) -> None:
        end = self.written + len(rows)
        self.arr.resize((end, *self.arr.shape[1:]))
        self.arr[self.written : end] = rows
        self.written = end


def write_new_store(
    loc: StoreLocation,
    samples: Samples | Parts,
    levels: Mapping[str, str] | None,
    custom: Collection[str],
    config: WriteConfig,
    allow_nonfinite: bool | frozenset[str],
    phase: Callable[[str], None],
) -> None:
    """The writer's ``write``: one set of samples checked and written whole, an iterator of parts streamed.

    Raises
    ------
    SampleDataError
        If there are no samples, or they (or two parts) are inconsistent; nothing is written.
    """
    if is_parts(samples):
        stream_store(loc, samples, levels, custom, config, allow_nonfinite, phase)
        return
    one = cast("Samples", samples)
    packed, disk = checked_new_samples(one, levels, custom, allow_nonfinite=allow_nonfinite)
    create_store(loc, packed, disk, config, frozenset(custom), phase)


def stream_store(
    loc: StoreLocation,
    parts: Parts,
    levels: Mapping[str, str] | None,
    custom: Collection[str],
    config: WriteConfig,
    allow_nonfinite: bool | frozenset[str],
    phase: Callable[[str], None],
) -> None:
    """Write a new store at ``loc`` from ``parts``, part by part (see the module docstring).

    Raises
    ------
    SampleDataError
        If there are no samples in any part, a part breaks the rules a one-shot write checks, or a part's
        fields, levels, dtypes or trailing shapes differ from the first part's (naming the part and
        field); nothing is left at ``loc`` then (as after any failure).
    """
    build_store(
        loc, lambda root: _fill_or_clear(root, iter(parts), levels, frozenset(custom), config, allow_nonfinite), phase
    )


def _fill_or_clear(root: Any, *args: Any) -> None:
    """:func:`_fill`, or on failure no group left in ``root`` (a store not staged, a URL or a ``dict``, is
    written where it is; a staged one is removed whole anyway)."""
    try:
        _fill(root, *args)
    except BaseException:
        for name in (layout.META_GROUP, layout.CORE_GROUP, layout.CUSTOM_GROUP):
            if name in root:
                del root[name]
        raise


def _fill(
    root: Any,
    parts: Iterator[Samples],
    levels: Mapping[str, str] | None,
    custom: frozenset[str],
    config: WriteConfig,
    allow_nonfinite: bool | frozenset[str],
) -> None:
    first = _next_part(parts, levels)
    if first is None:
        raise SampleDataError("No data provided to write (the parts held no samples).")
    packed, disk = checked_new_samples(first, None, custom, allow_nonfinite=allow_nonfinite)
    levels_of: dict[str, Level] = dict(packed.levels)
    forms = {name: _form(packed.levels[name], values) for name, values in disk.items()}
    columns, configs = _create(root, packed, disk, config, custom)
    n_samples = n_atoms = n_edges = 0
    number = 0
    part: PackedSamples | None = packed
    del first, packed  # only ``part`` holds a part: one at a time
    while part is not None:
        if number:
            disk = checked_disk(part, n_atoms, allow_nonfinite=allow_nonfinite)
            _check_agrees(number, part, disk, forms)
        atoms_ptr, edges_ptr = part.atoms_ptr, part.edges_ptr
        meta = {
            layout.ATOMS_PTR: atoms_ptr[1 if number else 0 :] + n_atoms,
            layout.EDGES_PTR: edges_ptr[1 if number else 0 :] + n_edges,
            layout.SAMPLES_MASK: np.ones(len(part), dtype=np.bool_),
            layout.ATOMS_MASK: np.ones(int(atoms_ptr[-1]), dtype=np.bool_),
            layout.EDGES_MASK: np.ones(int(edges_ptr[-1]), dtype=np.bool_),
        }
        for name, values in meta.items():
            columns[layout.META_GROUP, name].push(values)
        for name, values in disk.items():
            columns[layout.CUSTOM_GROUP if name in custom else layout.CORE_GROUP, name].push(values)
        n_samples += len(part)
        n_atoms, n_edges = n_atoms + int(atoms_ptr[-1]), n_edges + int(edges_ptr[-1])
        del disk, meta, atoms_ptr, edges_ptr
        number += 1
        part = None  # so that the next part is made while this one is no longer held
        part = _next_part(parts, levels)
    for column in columns.values():
        column.finish()
    root.attrs.update(root_attributes(n_samples, levels_of, custom, configs))


def _next_part(parts: Iterator[Samples], levels: Mapping[str, str] | None) -> PackedSamples | None:
    """The next part with samples, packed (empty parts are skipped); ``None`` when there is none."""
    for part in parts:
        if not isinstance(part, (PackedSamples, SupportsPacked)) and len(part) == 0:
            continue
        packed = to_packed(part, levels)
        if len(packed):
            return packed
    return None


def _form(level: str, values: NDArray[Any]) -> tuple[str, str, tuple[int, ...]]:
    """What every part must agree on for one field: its level, dtype and trailing shape on disk."""
    return level, str(values.dtype), tuple(values.shape[1:])


def _check_agrees(
    number: int, packed: PackedSamples, disk: Mapping[str, NDArray[Any]], forms: Mapping[str, tuple[str, str, Any]]
) -> None:
    if set(disk) != set(forms):
        raise SampleDataError(
            f"Part {number} has fields {sorted(disk)} but part 0 has {sorted(forms)}; every part must hold "
            "the same fields. Nothing was written."
        )
    for name, values in disk.items():
        got, want = _form(packed.levels[name], values), forms[name]
        if got != want:
            raise SampleDataError(
                f"Part {number}: field {name!r} is (level, dtype, trailing shape) {got} but part 0 has {want}; "
                "every part must agree. Nothing was written."
            )


def _create(
    root: Any, packed: PackedSamples, disk: Mapping[str, NDArray[Any]], config: WriteConfig, custom: frozenset[str]
) -> tuple[dict[tuple[str, str], ShardedColumn], list[ArrayConfig]]:
    """The groups and (empty) arrays of the new store, laid out from the first part as a one-shot write would."""
    meta = root.create_group(layout.META_GROUP)
    groups = {
        layout.CORE_GROUP: root.create_group(layout.CORE_GROUP),
        layout.CUSTOM_GROUP: root.create_group(layout.CUSTOM_GROUP),
    }
    meta_probe = {
        layout.ATOMS_PTR: packed.atoms_ptr,
        layout.EDGES_PTR: packed.edges_ptr,
        layout.SAMPLES_MASK: np.ones(len(packed), dtype=np.bool_),
        layout.ATOMS_MASK: np.ones(int(packed.atoms_ptr[-1]), dtype=np.bool_),
        layout.EDGES_MASK: np.ones(int(packed.edges_ptr[-1]), dtype=np.bool_),
    }
    columns: dict[tuple[str, str], ShardedColumn] = {}
    configs: list[ArrayConfig] = []

    def add(group: str, target: Any, name: str, values: NDArray[Any], cfg: ArrayConfig) -> None:
        configs.append(cfg)
        arr = create_array(target, name, (0, *values.shape[1:]), values.dtype, cfg)
        columns[group, name] = ShardedColumn(arr)

    for name, values in meta_probe.items():
        add(layout.META_GROUP, meta, name, values, config.for_array(layout.META_GROUP, name, values))
    for group, target in groups.items():
        arrays = {name: values for name, values in disk.items() if (name in custom) == (group == layout.CUSTOM_GROUP)}
        for name, cfg in config.for_arrays(group, arrays).items():
            add(group, target, name, arrays[name], cfg)
    return columns, configs
