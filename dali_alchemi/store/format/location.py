"""Resolving what a user passes as a store (path, URL, zarr Store) into one zarr Store.

The reader and writer accept the same things nvalchemi does: ``str`` or ``pathlib.Path`` paths, a
URL that fsspec understands (``memory://``, ``http(s)://``, ``s3://``, ``gs://``, ``file://``), a zarr
``Store`` or ``StorePath``, or a ``dict`` used as in-memory storage. Local directories are recognised
so the reader can read their chunk files directly.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import zarr
from zarr.abc.store import Store
from zarr.storage import FsspecStore, LocalStore, MemoryStore, StorePath

from dali_alchemi.errors import ConfigTypeError, StoreNotFoundError
from dali_alchemi.store.format.http import http_store, is_http_url
from dali_alchemi.store.format.remote import RetryingStore

if TYPE_CHECKING:
    from dali_alchemi.remote_config import FetchConfig

__all__ = [
    "NOT_A_STORE_NEXT_STEP", "StoreLike", "StoreLocation", "open_group", "resolve_store", "root_groups",
    "root_members", "store_not_found", "zarr_error_text"
]


StoreLike = str | os.PathLike[str] | Store | StorePath | dict[str, Any]

NOT_A_STORE_NEXT_STEP = (
    "To make a store from files ASE reads: dali-alchemi convert INPUT... OUT.zarr "
    "(or a synthetic one: dali-alchemi synth OUT.zarr)"
)
"""What an error about a path that holds no store suggests doing next."""


def store_not_found(path: str | os.PathLike[str]) -> StoreNotFoundError:
    """The error for a local store path where nothing exists: the path made absolute (a relative one names
    no folder once it is in a log), and what to do."""
    return StoreNotFoundError(
        f"Zarr store does not exist at {os.path.abspath(path)}: check the path. {NOT_A_STORE_NEXT_STEP}"
    )


_ZARR_STORE_REPR = re.compile(r"StorePath\(\w+, '([^']*)'\)|\b\w*Store\('([^']*)'\)|(file://[^\s'\"]*)")


def zarr_error_text(err: BaseException) -> str:
    """``Class: message`` of an exception zarr raised, with zarr's names for a store (``StorePath(LocalStore,
    'file:///data/s.zarr')``, ``LocalStore('file://...')``, ``file://...``) replaced by the path or URL they
    stand for, so that an error message speaks of the user's store, not of zarr's objects."""

    def plain(match: re.Match[str]) -> str:
        url = next(group for group in match.groups() if group is not None)
        return url.removeprefix("file://")

    return f"{type(err).__name__}: {_ZARR_STORE_REPR.sub(plain, str(err))}"


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """A resolved store: the zarr store, the path prefix inside it, a display name, and a local root."""

    store: Store
    prefix: str
    display: str
    local_root: Path | None

    def key(self, *parts: str) -> str:
        """A key inside the store, below ``prefix``."""
        return "/".join(p for p in (self.prefix, *parts) if p)


def open_group(loc: StoreLocation, *, mode: Literal["r", "r+", "w", "a"]) -> Any:
    """The zarr group at ``loc`` (its store, below its prefix), opened with ``mode``."""
    return zarr.open_group(store=StorePath(loc.store, loc.prefix), mode=mode)


def root_members(root: Any) -> dict[str, Any]:
    """The arrays and groups at the root of a store, by name.

    The writer keeps its journal and lock under hidden keys at the root of a non-local store
    (``.dali-alchemi-*``); they are no zarr objects, and zarr's warning about them is silenced here.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Object at \.dali-alchemi-", category=UserWarning)
        return dict(root.members())


def root_groups(root: Any) -> dict[str, Any]:
    """The groups at the root of a store, by name (see :func:`root_members`)."""
    return {name: node for name, node in root_members(root).items() if isinstance(node, zarr.Group)}


def _is_url(text: str) -> bool:
    return "://" in text and not text.startswith("file://")


def resolve_store(
    store: StoreLike,
    *,
    read_only: bool,
    must_exist: bool,
    fetch: FetchConfig | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> StoreLocation:
    """Resolve ``store`` into a :class:`StoreLocation`.

    Stores reached over a network (URLs, fsspec and object stores) are wrapped in a
    :class:`~dali_alchemi.store.format.remote.RetryingStore` that retries reads under ``fetch``.
    ``http(s)://`` URLs read through :func:`~dali_alchemi.store.format.http.http_store` (range answers
    checked, redirects as ``fetch.follow_redirects`` allows). ``storage_options`` go to fsspec for URLs
    (credentials, ``endpoint_url``, ...).

    Raises
    ------
    StoreNotFoundError
        If ``must_exist`` and a local path does not exist.
    ConfigTypeError
        If ``store`` is none of the accepted kinds (a ``TypeError``).
    """
    if isinstance(store, StorePath):
        inner = store.store
        root = Path(inner.root) / store.path if isinstance(inner, LocalStore) else None
        return StoreLocation(store=inner, prefix=store.path, display=str(store), local_root=root)
    if isinstance(store, LocalStore):
        return StoreLocation(store=store, prefix="", display=str(store.root), local_root=Path(store.root))
    if isinstance(store, (MemoryStore, RetryingStore)):
        return StoreLocation(store=store, prefix="", display=str(store), local_root=None)
    if isinstance(store, Store):
        return StoreLocation(store=RetryingStore(store, fetch), prefix="", display=str(store), local_root=None)
    if isinstance(store, dict):
        return StoreLocation(store=MemoryStore(store), prefix="", display="<memory>", local_root=None)
    if isinstance(store, (str, os.PathLike)):
        text = os.fspath(store)
        if _is_url(text):
            remote = (
                http_store(text, read_only=read_only, fetch=fetch, storage_options=storage_options)
                if is_http_url(text)
                else FsspecStore.from_url(
                    text, read_only=read_only, storage_options=dict(storage_options or {}) or None
                )
            )
            wrapped: Store = remote if text.startswith("memory://") else RetryingStore(remote, fetch)
            return StoreLocation(store=wrapped, prefix="", display=text, local_root=None)
        path = Path(text.removeprefix("file://")).expanduser()
        if must_exist and not path.exists():
            raise store_not_found(path)
        # the real folder: a store reached by two paths (one through a link) has one lock, one journal and one
        # set of staging folders beside it, and a defragment swaps the folder itself, not the link
        real = path.resolve()
        # messages name a local store by its absolute path as given (links kept), wherever the command ran
        shown = str(path.absolute())
        return StoreLocation(store=LocalStore(real, read_only=read_only), prefix="", display=shown, local_root=real)
    raise ConfigTypeError(
        f"store must be a path, a URL, a zarr Store, a StorePath or a dict, got {type(store).__name__}"
    )
