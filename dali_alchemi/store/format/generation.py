"""Noticing, once per read, that another process changed the store under an open reader.

A reader serves the state it opened (its :class:`~dali_alchemi.store.read.snapshot.Snapshot`). Appends
leave that state readable exactly: the rows it indexes do not move. A delete (which zeroes the
deleted samples' rows), a defragment (which moves every row after the first deleted sample) or a
replaced custom array do not, and reading on would mix two states of the store. To notice without a
cost per structure, the reader compares a small *token* after every read: the bytes of the root
``zarr.json`` and of ``meta/atoms_ptr/zarr.json`` (two small objects). Every operation of this
project's writer changes the root document (it bumps a ``generation`` counter in the root
attributes), and a defragment or an append also changes the pointer's shape. Only when the token
changed does the reader open the store again and compare the two states
(:func:`~dali_alchemi.store.read.snapshot.incompatibility`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from dali_alchemi.store.format import layout

if TYPE_CHECKING:
    from dali_alchemi.store.format.location import StoreLocation

__all__ = ["GENERATION_KEY", "REWRITTEN_KEY", "TOKEN_KEYS", "bumped", "read_token", "writer_state"]


TOKEN_KEYS = ("zarr.json", f"{layout.META_GROUP}/{layout.ATOMS_PTR}/zarr.json")
"""The objects whose bytes make up a store's token."""

GENERATION_KEY = "generation"
"""Counter in :data:`~dali_alchemi.store.format.layout.WRITER_ATTR` bumped by every delete, defragment, ``add_custom`` and ``repair``."""

REWRITTEN_KEY = "rewritten"
"""Map in :data:`~dali_alchemi.store.format.layout.WRITER_ATTR` from a field to the generation that last replaced it (``add_custom``, ``repair``)."""


def read_token(loc: StoreLocation) -> bytes:
    """The bytes of :data:`TOKEN_KEYS` at ``loc`` (a missing object counts as empty)."""
    if loc.local_root is not None:
        return b"\0".join(_file_bytes(os.path.join(loc.local_root, key)) for key in TOKEN_KEYS)

    async def get_all() -> list[Any]:
        proto = default_buffer_prototype()
        return list(await asyncio.gather(*(loc.store.get(loc.key(key), prototype=proto) for key in TOKEN_KEYS)))

    return b"\0".join(b"" if buf is None else buf.to_bytes() for buf in sync(get_all()))


def _file_bytes(path: str) -> bytes:
    """A small file's bytes, read with plain descriptors (a read checks the token each time: half the cost of
    ``open``); empty where it is missing, e.g. the instant a defragment swaps directories."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return b""
    try:
        parts = []
        while part := os.read(fd, 1 << 16):
            parts.append(part)
        return b"".join(parts)
    finally:
        os.close(fd)


def writer_state(attributes: Mapping[str, Any]) -> tuple[int, dict[str, int]]:
    """``(generation, {custom field: generation that replaced it})`` from the root attributes."""
    state = attributes.get(layout.WRITER_ATTR)
    if not isinstance(state, Mapping):
        return 0, {}
    generation = state.get(GENERATION_KEY, 0)
    rewritten = state.get(REWRITTEN_KEY, {})
    return (
        generation if isinstance(generation, int) else 0,
        {k: v for k, v in rewritten.items() if isinstance(v, int)} if isinstance(rewritten, Mapping) else {},
    )


def bumped(attributes: Mapping[str, Any], *, rewritten: str | None = None) -> dict[str, Any]:
    """The :data:`~dali_alchemi.store.format.layout.WRITER_ATTR` entry after one more operation (that replaced custom ``rewritten``)."""
    state = dict(attributes.get(layout.WRITER_ATTR) or {})
    generation, replaced = writer_state(attributes)
    state[GENERATION_KEY] = generation + 1
    if rewritten is not None:
        state[REWRITTEN_KEY] = {**replaced, rewritten: generation + 1}
    return {layout.WRITER_ATTR: state}
