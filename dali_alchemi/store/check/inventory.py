"""What a store holds, listed without trusting its metadata: its groups and arrays opened one by one,
and whether the chunk objects an array claims are stored. :func:`~dali_alchemi.store.check.verify.verify_store`
reports what these find as problems instead of failing on the first unreadable ``zarr.json``.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

import zarr
from zarr.core.sync import sync
from zarr.errors import BaseZarrError, ZarrUserWarning

from dali_alchemi.store.format import layout
from dali_alchemi.store.format.location import zarr_error_text

if TYPE_CHECKING:
    from dali_alchemi.store.check.consistency import Findings
    from dali_alchemi.store.format.location import StoreLocation

__all__ = ["MAX_IMPLICIT_OBJECTS", "fits_on_disk", "group_arrays", "store_groups", "stored_objects"]


MAX_IMPLICIT_OBJECTS = 1 << 16
"""Claimed-but-unstored chunk objects one array may have in a store that does not promise every chunk
(they read as the fill value); an array claiming more is reported, not walked, so that the time
:func:`verify_store` takes is bounded by what is stored rather than by what ``zarr.json`` claims."""


def store_groups(root: Any, store: str, found: Findings) -> dict[str, Any]:
    """The root's groups; a group whose ``zarr.json`` does not parse is a problem naming that file (and
    ``None`` here)."""
    out: dict[str, Any] = {}
    for name in (layout.META_GROUP, layout.CORE_GROUP, layout.CUSTOM_GROUP):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ZarrUserWarning)
                node = root.get(name)
        except (ValueError, TypeError, KeyError, BaseZarrError) as err:  # JSONDecodeError is a ValueError
            found.add("format", f"Store {store}: {name}/zarr.json is unreadable metadata: {zarr_error_text(err)}",
                      array=name)  # fmt: skip
            out[name] = None
            continue
        if isinstance(node, zarr.Group):
            out[name] = node
    return out


def group_arrays(loc: StoreLocation, group: Any, group_name: str, found: Findings) -> dict[str, Any]:
    """The arrays of one group, opened one by one: one whose ``zarr.json`` does not parse is a problem
    naming that file (the others are still checked), never an exception."""
    prefix = loc.key(group_name)
    # an HTTP listing names folders with a trailing "/" ("atoms_ptr/"), a local or object store without
    names = sorted({name.rstrip("/") for name in sync(_list_dir(loc.store, prefix))})
    out: dict[str, Any] = {}
    for name in names:
        if name == "zarr.json" or name.startswith("."):
            continue
        path = f"{group_name}/{name}"
        try:
            with warnings.catch_warnings():  # a directory without zarr.json: reported later as missing
                warnings.simplefilter("ignore", ZarrUserWarning)
                node = group.get(name)
        except (ValueError, TypeError, KeyError, BaseZarrError) as err:
            found.add("format", f"Store {loc.display}: {path}/zarr.json is unreadable metadata: "
                      f"{zarr_error_text(err)}", array=path)  # fmt: skip
            continue
        if isinstance(node, zarr.Array):
            out[path] = node
    return out


async def _list_dir(store: Any, prefix: str) -> list[str]:
    return [item async for item in store.list_dir(prefix)]


def stored_objects(loc: StoreLocation, path: str) -> int:
    """Chunk objects (chunk or shard files) stored for array ``path``: one listing, O(what is stored)."""
    if loc.local_root is not None:
        chunks = loc.local_root / path / "c"
        return sum(len(files) for _, _, files in os.walk(chunks)) if chunks.is_dir() else 0

    async def count() -> int:
        return sum([1 async for _ in loc.store.list_prefix(loc.key(path, "c") + "/")])

    return sync(count())


def fits_on_disk(loc: StoreLocation, path: str, arr: Any, complete: bool, found: Findings) -> bool:
    """Whether the chunk objects ``arr``'s ``zarr.json`` claims are stored, up to :data:`MAX_IMPLICIT_OBJECTS`
    unstored ones; if not, that is a problem and the array is not walked, so a claim of 10^12 rows
    costs one listing, not 10^12 / chunk rows reads."""
    shape = tuple(int(s) for s in arr.shape)
    if not shape:
        return True
    grid = tuple(int(s) for s in (arr.shards or arr.chunks))
    claimed = 1
    for extent, step in zip(shape, grid, strict=True):
        claimed *= -(-extent // step)
    if claimed <= MAX_IMPLICIT_OBJECTS:
        return True
    stored = stored_objects(loc, path)
    if claimed - stored <= MAX_IMPLICIT_OBJECTS:
        return True  # each missing one is reported by the walk (or read as the fill value)
    why = "missing chunks, though the store promises every one" if complete else "fill values at most"
    found.add("shape", f"array {path} claims shape {shape}, {claimed:,} chunk objects, but only {stored:,} are "
              f"stored: more than {MAX_IMPLICIT_OBJECTS:,} would be {why}; its chunks are not decoded", array=path)  # fmt: skip
    return False
