"""A store's summary for ``dali-alchemi inspect``: counts, per-array layout and size on disk.

Returns plain records; printing is the CLI's job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from zarr.core.sync import sync

from dali_alchemi.store.format import layout
from dali_alchemi.store.format.location import StoreLike, StoreLocation, resolve_store, root_groups
from dali_alchemi.store.read.open_checks import open_root
from dali_alchemi.store.read.snapshot import open_snapshot

__all__ = ["ArraySummary", "StoreSummary", "summarize"]


@dataclass(frozen=True, slots=True)
class ArraySummary:
    """One array: group, level, dtype, shape, chunk and shard shapes, and its codec names."""

    group: str
    name: str
    level: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    shards: tuple[int, ...] | None
    codecs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StoreSummary:
    """Sample, atom and edge counts plus every array of a store."""

    source: str
    samples: int
    physical_samples: int
    atoms: int
    edges: int
    arrays: tuple[ArraySummary, ...]
    bytes_on_disk: int


def _codec_names(codecs: Any) -> tuple[str, ...]:
    names = []
    for codec in codecs:
        data = codec.to_dict()
        conf = data.get("configuration") or {}
        if data["name"] == "sharding_indexed":
            names.append("sharding(" + ",".join(_codec_names(codec.codecs)) + ")")
        elif data["name"] == "bytes":
            names.append("bytes")
        else:
            detail = ",".join(
                f"{k}={v}" for k, v in sorted(conf.items()) if k in ("level", "cname", "clevel", "shuffle")
            )
            names.append(f"{data['name']}({detail})" if detail else str(data["name"]))
    return tuple(names)


def _size_on_disk(loc: StoreLocation) -> int:
    if loc.local_root is not None:
        total = 0
        for folder, _, files in os.walk(loc.local_root):
            total += sum(os.path.getsize(os.path.join(folder, f)) for f in files)
        return total

    async def _total() -> int:
        size = 0
        async for key in loc.store.list_prefix(loc.prefix):
            size += await loc.store.getsize(key)
        return size

    return int(sync(_total()))


def summarize(store: StoreLike) -> StoreSummary:
    """Summarise ``store`` (any form the reader accepts) as the reader sees it.

    It runs the reader's open-time checks (:func:`~dali_alchemi.store.read.snapshot.open_snapshot`), so a
    store the reader would refuse is refused here too, with the reader's error.

    Raises
    ------
    StoreNotFoundError
        If there is nothing at a local path.
    StoreFormatError
        If the reader refuses the store (not a zarr v3 group, or a layout, dtype or shape it cannot read).
    """
    loc = resolve_store(store, read_only=True, must_exist=True)
    snapshot = open_snapshot(loc)
    root = open_root(snapshot.location)
    schema = snapshot.schema
    groups = root_groups(root)
    arrays = []
    for group_name, recorded in (
        (layout.META_GROUP, {}),
        (layout.CORE_GROUP, schema.core),
        (layout.CUSTOM_GROUP, schema.custom),
    ):
        if group_name not in groups:
            continue
        for name, arr in sorted(groups[group_name].arrays()):
            unread = schema.unknown_levels.get(f"{group_name}/{name}")
            level = (
                "meta" if group_name == layout.META_GROUP
                else f"{unread} (not read)" if unread is not None
                else recorded.get(name) or layout.default_level(name) or "?"
            )  # fmt: skip
            arrays.append(
                ArraySummary(
                    group=group_name,
                    name=name,
                    level=level,
                    dtype=str(np.dtype(arr.dtype)),
                    shape=tuple(int(s) for s in arr.shape),
                    chunks=tuple(int(c) for c in arr.chunks),
                    shards=None if arr.shards is None else tuple(int(s) for s in arr.shards),
                    codecs=_codec_names(arr.metadata.codecs),
                )
            )
    return StoreSummary(
        source=loc.display,
        samples=snapshot.n_live,
        physical_samples=snapshot.n_physical,
        atoms=int(snapshot.atoms_ptr[-1]),
        edges=int(snapshot.edges_ptr[-1]),
        arrays=tuple(arrays),
        bytes_on_disk=_size_on_disk(loc),
    )
