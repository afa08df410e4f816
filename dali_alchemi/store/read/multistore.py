"""Open a multi-store (a folder of part stores and their manifest: see
:mod:`dali_alchemi.store.format.multistore`) as one dataset: a
:class:`~dali_alchemi.store.read.multi.MultiReader` over the parts in order with ``one_dataset=True``
(global indices over the parts, the fields of one store, no ``dataset_id``, one store to the plans).
"""

from __future__ import annotations

import os
from pathlib import Path

from dali_alchemi.errors import FieldMismatchError, StoreFormatError
from dali_alchemi.store.format.multistore import read_manifest
from dali_alchemi.store.read.cache import DEFAULT_CACHE_BYTES
from dali_alchemi.store.read.multi import MultiReader

__all__ = ["open_multistore", "part_paths"]


def part_paths(path: str | os.PathLike[str]) -> list[Path]:
    """The part stores of a finished multi-store, in order.

    Raises
    ------
    StoreFormatError
        If the manifest is unreadable, or the conversion that writes it has not finished (naming how many
        parts are done and how to finish it).
    """
    manifest = read_manifest(path)
    parts = manifest.get("parts", [])
    if not manifest.get("complete"):
        done = sum(1 for part in parts if part.get("done"))
        raise StoreFormatError(
            f"{path} is a multi-store whose conversion has not finished ({done} of {len(parts)} parts written); "
            "run the same convert command again to finish it"
        )
    return [Path(path) / part["name"] for part in parts]


def open_multistore(
    path: str | os.PathLike[str], *, fields: tuple[str, ...] | None = None, cache_bytes: int | None = None
) -> MultiReader:
    """The multi-store at ``path`` as one dataset, reading only ``fields`` (default: all).

    ``cache_bytes`` (default: one reader's, 1 GiB) is the budget of the whole dataset: each part's reader
    decodes into a cache of ``cache_bytes / parts``, so memory does not grow with the number of parts.

    Raises
    ------
    StoreFormatError
        As :func:`part_paths`.
    FieldMismatchError
        If the parts do not all have the same fields (naming the part and the fields).
    """
    parts = part_paths(path)
    per_part = (DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes) // len(parts)
    reader = MultiReader([str(p) for p in parts], fields=fields, cache_bytes=per_part, one_dataset=True)
    first = set(reader.members[0].field_specs)
    for part, member in zip(parts[1:], reader.members[1:], strict=True):
        if set(member.field_specs) != first:
            reader.close()
            raise FieldMismatchError(
                f"{path}: part {part.name} has fields {sorted(member.field_specs)}, part {parts[0].name} has "
                f"{sorted(first)}; the parts of one dataset must have the same fields"
            )
    return reader
