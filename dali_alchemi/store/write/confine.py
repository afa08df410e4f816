"""Keeping the writer's changes inside the store's own directory tree.

zarr writes every object to a new file and renames it over the old one, and the writer deletes files
by unlinking them, so a chunk file or ``zarr.json`` that is a symbolic link is replaced or removed as
a link: what it points to is never changed. A linked *directory* is different: every write below it
lands in the directory it points to, which may be anywhere (another store, a user's folder). Writer
operations therefore refuse a local store in which any directory below its root is a link, before
they change anything; readers still follow links. The store's root itself may be a link (a store
reached through a linked path): its target is the tree the writer works in.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from dali_alchemi.errors import UnsupportedStoreError

if TYPE_CHECKING:
    from dali_alchemi.store.format.location import StoreLocation

__all__ = ["check_no_linked_directories"]


def check_no_linked_directories(loc: StoreLocation) -> None:
    """Refuse to write to a local store in which a directory below its root is a symbolic link.

    Walks the store's directories only (no file is opened or stat-ed beyond its directory entry).

    Raises
    ------
    UnsupportedStoreError
        Naming the first linked directory found (relative to the store), where it points, and the fix.
    """
    root = loc.local_root
    if root is None or not root.is_dir():
        return
    pending = [str(root)]
    while pending:
        directory = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_symlink():
                    if entry.is_dir():  # follows the link: a linked directory
                        inside = os.path.relpath(entry.path, root)
                        raise UnsupportedStoreError(
                            f"Store {loc.display}: {inside} is a symbolic link to the directory "
                            f"{os.path.realpath(entry.path)}; the writer does not write through linked "
                            f"directories, since that would change files outside the store. Nothing was "
                            f"changed. Replace the link with a copy of what it points to (`cp -rL`), or "
                            f"`dali-alchemi rewrite` the store to a new path; readers still read it as it is"
                        )
                    continue  # a linked file is replaced or removed as a link, never changed through it
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
