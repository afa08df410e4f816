"""The nvalchemi-toolkit 0.2.0 store layout: names, levels and the root-attribute schema.

This module is pure: it knows the group and array names, the default level of every AtomicData field,
which fields hold atom indices (and so are re-based per sample), and how to parse and check the root
``fields`` attribute. It performs no I/O; the reader and writer call it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dali_alchemi.errors import FieldLevelError, StoreFormatError
from dali_alchemi.types import LEVELS, Level

__all__ = [
    "ATOMS_MASK", "ATOMS_PTR", "ATOM_FIELDS", "ATOM_INDEX_FIELDS", "CHECKSUM_CRC32C", "CORE_GROUP",
    "CUSTOM_GROUP", "EDGES_MASK", "EDGES_PTR", "EDGE_FIELDS", "EXPECTED_DTYPE_KINDS",
    "EXPECTED_TRAILING_SHAPES", "FIELDS_ATTR", "MAX_NAME_BYTES", "META_ARRAYS", "META_GROUP", "NON_DATA_KEYS",
    "NUM_SAMPLES_ATTR", "RESERVED_NAMES", "SAMPLES_MASK", "SYSTEM_FIELDS", "WRITER_ATTR", "Integrity",
    "StoreSchema", "check_level", "default_level", "field_array_problem", "field_name_problem",
    "parse_integrity", "parse_schema", "resolve_level", "unknown_level_message"
]


META_GROUP = "meta"
CORE_GROUP = "core"
CUSTOM_GROUP = "custom"

ATOMS_PTR = "atoms_ptr"
EDGES_PTR = "edges_ptr"
SAMPLES_MASK = "samples_mask"
ATOMS_MASK = "atoms_mask"
EDGES_MASK = "edges_mask"
META_ARRAYS = (ATOMS_PTR, EDGES_PTR, SAMPLES_MASK, ATOMS_MASK, EDGES_MASK)

NUM_SAMPLES_ATTR = "num_samples"
FIELDS_ATTR = "fields"
WRITER_ATTR = "dali_alchemi"
"""Root attribute where this project's writer records what it promises about the chunks and its
generation counter (:mod:`~dali_alchemi.store.format.generation`); nvalchemi's own attributes are left as
nvalchemi writes them, and its reader ignores this one."""
CHECKSUM_CRC32C = "crc32c"

# Per-field levels of nvalchemi's AtomicData (store-format.md section 5). Fields outside these sets
# need an explicit level: there is no silent fallback.
ATOM_FIELDS = frozenset(
    {
        "atomic_numbers", "positions", "atomic_masses", "atom_categories", "velocities", "momenta",
        "forces", "charges", "node_attrs", "node_embeddings", "node_alpha_spins", "node_beta_spins",
        "kinetic_energies", "neighbor_matrix", "neighbor_matrix_shifts", "num_neighbors",
    }
)  # fmt: skip
EDGE_FIELDS = frozenset({"neighbor_list", "shifts", "neighbor_list_shifts", "edge_embeddings"})
SYSTEM_FIELDS = frozenset({"energy", "charge", "spin", "stress", "virial", "cell", "dipole", "pbc", "graph_embeddings"})

# Fields whose values are atom row indices. On disk they are store-global (local + atoms_ptr[i]);
# the reader returns them sample-local and Batch offsets them by each sample's node offset.
ATOM_INDEX_FIELDS = frozenset({"neighbor_list"})

# Keys that describe a batch rather than hold sample data; never written.
NON_DATA_KEYS = frozenset({"batch_idx", "batch_ptr", "device", "dtype", "info", "num_nodes"})


def default_level(name: str) -> Level | None:
    """Level of an nvalchemi AtomicData field, or ``None`` when ``name`` is in none of its key sets."""
    if name in ATOM_FIELDS:
        return "atom"
    if name in EDGE_FIELDS:
        return "edge"
    if name in SYSTEM_FIELDS:
        return "system"
    return None


def check_level(level: str, *, what: str) -> Level:
    """Return ``level`` if it is one of ``atom``/``edge``/``system``; raise :class:`FieldLevelError` otherwise."""
    if level not in LEVELS:
        raise FieldLevelError(f"Invalid level {level!r} for {what}: expected one of {', '.join(LEVELS)}")
    return level  # type: ignore[return-value]


def resolve_level(name: str, explicit: Mapping[str, str] | None = None) -> Level:
    """The level of field ``name``: an explicit entry wins, then the nvalchemi default key sets.

    Raises
    ------
    FieldLevelError
        If the field is in no default key set and has no explicit level.
    """
    if explicit and name in explicit:
        return check_level(explicit[name], what=f"field {name!r}")
    level = default_level(name)
    if level is None:
        raise FieldLevelError(
            f"Field {name!r} is not a known AtomicData field; pass levels={{{name!r}: 'atom'|'edge'|'system'}}"
        )
    return level


@dataclass(frozen=True, slots=True)
class StoreSchema:
    """The root attributes of a store: its physical sample count and every field's group and level."""

    num_samples: int
    core: dict[str, Level] = field(default_factory=dict)
    custom: dict[str, Level] = field(default_factory=dict)
    unknown_levels: dict[str, Any] = field(default_factory=dict)
    """``"group/name"`` -> the recorded level of fields whose level this version cannot interpret (a level
    added by a newer nvalchemi): they are not part of :attr:`field_levels`."""

    @property
    def field_levels(self) -> dict[str, Level]:
        """Core and custom levels flattened into one map; custom wins on a name collision (as nvalchemi)."""
        return {**self.core, **self.custom}

    def group_of(self, name: str) -> str:
        """``"custom"`` or ``"core"``: the group that holds array ``name`` (custom wins, as in the reader)."""
        return CUSTOM_GROUP if name in self.custom else CORE_GROUP

    def to_attributes(self) -> dict[str, Any]:
        """The root ``zarr.json`` attributes, with field names sorted so the JSON is deterministic."""
        return {
            NUM_SAMPLES_ATTR: int(self.num_samples),
            FIELDS_ATTR: {
                CORE_GROUP: {k: self.core[k] for k in sorted(self.core)},
                CUSTOM_GROUP: {k: self.custom[k] for k in sorted(self.custom)},
            },
        }


def parse_schema(attributes: Mapping[str, Any], *, store: str) -> StoreSchema:
    """Parse and check the root attributes of a store.

    ``num_samples`` may be absent (nvalchemi's reader never reads it); it is then reported as -1 and the
    reader derives the count from the pointers. ``fields`` may be absent in stores written by other tools,
    in which case every array's level falls back to the nvalchemi default key sets.

    Levels other than ``atom``, ``edge`` and ``system`` (a newer writer's) are kept in
    ``unknown_levels``, not refused: a reader skips those fields unless it is asked for them. Other
    root attributes and other keys of ``fields`` are ignored.

    Raises
    ------
    StoreFormatError
        If ``fields`` is not a mapping of group -> {name: level}, names a field that could not be an
        array (:func:`field_name_problem`), or ``num_samples`` is not an integer.
    """
    raw_n = attributes.get(NUM_SAMPLES_ATTR, -1)
    if isinstance(raw_n, bool) or not isinstance(raw_n, int) or raw_n < -1:
        raise StoreFormatError(
            f"Store {store}: root attribute {NUM_SAMPLES_ATTR!r} must be a non-negative integer, found {raw_n!r}"
        )
    raw_fields = attributes.get(FIELDS_ATTR, {})
    if not isinstance(raw_fields, Mapping):
        raise StoreFormatError(
            f"Store {store}: root attribute {FIELDS_ATTR!r} must be a mapping, found {type(raw_fields).__name__}"
        )
    groups: dict[str, dict[str, Level]] = {}
    unknown: dict[str, Any] = {}
    for group in (CORE_GROUP, CUSTOM_GROUP):
        entries = raw_fields.get(group, {})
        if not isinstance(entries, Mapping):
            raise StoreFormatError(
                f"Store {store}: attribute fields.{group} must be a mapping of field -> level, "
                f"found {type(entries).__name__}"
            )
        levels: dict[str, Level] = {}
        for name, level in entries.items():
            problem = field_name_problem(name)
            if problem is not None:
                raise StoreFormatError(f"Store {store}: attribute fields.{group} names a field {name!r} that {problem}")
            if isinstance(level, str) and level in LEVELS:
                levels[str(name)] = level  # type: ignore[assignment]
            else:  # a level a newer writer added: kept aside, an error only for a reader that asks for it
                unknown[f"{group}/{name}"] = level
        groups[group] = levels
    return StoreSchema(num_samples=raw_n, core=groups[CORE_GROUP], custom=groups[CUSTOM_GROUP], unknown_levels=unknown)


def unknown_level_message(store: str, key: str, level: Any) -> str:
    """The error for a field whose recorded level this version cannot interpret."""
    group, _, name = key.partition("/")
    return (
        f"Store {store}: fields.{group}.{name} has level {level!r}, which this version cannot interpret "
        f"(it reads levels {', '.join(LEVELS)}); array {key} was written by a newer writer"
    )


@dataclass(frozen=True, slots=True)
class Integrity:
    """What a store promises about its chunks (root attribute ``dali_alchemi``).

    ``complete_chunks``: every chunk of every array was written, none left implicit at the fill value,
    so a missing chunk is damage, not zeros. ``checksums``: ``"crc32c"`` when every array's chunks end
    in zarr v3's crc32c codec. Stores written elsewhere promise neither (the defaults).
    """

    complete_chunks: bool = False
    checksums: str | None = None

    def to_attributes(self, attributes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The root attribute that records the promise, keeping what else ``attributes`` hold in it."""
        kept = (attributes or {}).get(WRITER_ATTR)
        state = dict(kept) if isinstance(kept, Mapping) else {}
        state.update(complete_chunks=self.complete_chunks, checksums=self.checksums)
        return {WRITER_ATTR: state}


def parse_integrity(attributes: Mapping[str, Any], *, store: str) -> Integrity:
    """The chunk promise a store's root attributes record; none when the attribute is absent.

    Raises
    ------
    StoreFormatError
        If the attribute is present but malformed.
    """
    raw = attributes.get(WRITER_ATTR)
    if raw is None:
        return Integrity()
    complete = raw.get("complete_chunks", False) if isinstance(raw, Mapping) else None
    checksums = raw.get("checksums") if isinstance(raw, Mapping) else None
    if not isinstance(complete, bool) or checksums not in (None, CHECKSUM_CRC32C):
        raise StoreFormatError(
            f"Store {store}: root attribute {WRITER_ATTR!r} must be "
            f'{{"complete_chunks": true|false, "checksums": "crc32c"|null}}, found {raw!r}'
        )
    return Integrity(complete_chunks=complete, checksums=checksums)


# Cheap metadata checks for well-known fields: allowed numpy dtype kinds and the trailing shape.
# A store whose atomic_numbers are float, or whose neighbor_list is not [E, 2], is rejected at open.
EXPECTED_DTYPE_KINDS: dict[str, str] = {
    "atomic_numbers": "iu", "atom_categories": "iu", "num_neighbors": "iu", "neighbor_matrix": "iu",
    "neighbor_list": "iu", "positions": "f", "forces": "f", "velocities": "f", "momenta": "f",
    "atomic_masses": "f", "charges": "f", "shifts": "f", "energy": "f", "cell": "f", "stress": "f",
    "virial": "f", "dipole": "f", "pbc": "b",
}  # fmt: skip
EXPECTED_TRAILING_SHAPES: dict[str, tuple[int, ...]] = {
    "atomic_numbers": (), "positions": (3,), "forces": (3,), "velocities": (3,), "momenta": (3,),
    "neighbor_list": (2,), "shifts": (3,), "neighbor_list_shifts": (3,), "cell": (3, 3), "stress": (3, 3),
    "virial": (3, 3), "pbc": (3,),
}  # fmt: skip


# -- rules the writer and the reader share ----------------------------------------------------------
MAX_NAME_BYTES = 255
"""Longest field name, in UTF-8 bytes: one path component on common filesystems (ext4, XFS, NFS)."""
RESERVED_NAMES = frozenset({"zarr.json"})
"""Names that would collide with zarr's own objects inside a group."""


def field_name_problem(name: object) -> str | None:
    """What makes ``name`` unusable as a field (array) name, or ``None`` when it is fine.

    A field is one directory inside ``core/`` or ``custom/`` and one key in the ``fields``
    attribute, so its name must be a single path component that neither zarr nor the filesystem
    treats specially: not empty, no ``/`` or ``\\``, no leading ``.`` (``.``, ``..``, hidden keys), no
    control characters (NUL), not ``zarr.json``, at most :data:`MAX_NAME_BYTES` bytes. The writer
    refuses such a name before anything is written, the reader refuses a store that records one, and
    the journal parser a journal that names one.
    """
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a string"
    if not name:
        return "is empty"
    if "/" in name or "\\" in name:
        return "contains a path separator ('/' or '\\')"
    if name.startswith("."):
        return "starts with '.'"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "contains a control character (NUL, newline, ...)"
    if name in RESERVED_NAMES:
        return "is reserved by zarr"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    return None


def field_array_problem(name: str, dtype: Any, shape: tuple[int, ...]) -> str | None:
    """What makes an on-disk array of ``dtype`` and ``shape`` unfit to hold field ``name``, or ``None``.

    Well-known fields have allowed dtype kinds (:data:`EXPECTED_DTYPE_KINDS`: float
    ``atomic_numbers`` are refused) and trailing shapes (:data:`EXPECTED_TRAILING_SHAPES`:
    ``positions`` are ``[V, 3]``, ``neighbor_list`` is ``[E, 2]``); the reader checks the stored
    arrays and the writer the arrays it is about to store with this one rule.
    """
    kinds = EXPECTED_DTYPE_KINDS.get(name)
    dt = np.dtype(dtype)
    if kinds is not None and dt.kind not in kinds:
        return f"has dtype {dt}, which cannot hold {name}"
    trailing = EXPECTED_TRAILING_SHAPES.get(name)
    if trailing is not None and tuple(shape[1:]) != trailing:
        return f"has shape {tuple(shape)}; expected [rows, {', '.join(map(str, trailing))}]"
    return None
