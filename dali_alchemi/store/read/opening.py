"""The reader a loader or a :class:`~dali_alchemi.store.read.multi.MultiReader` reads through: a reader it
is given, as it is, or a store it opens itself as an
:class:`~dali_alchemi.store.read.reader.AtomicDataZarrReader` (and so must close).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from dali_alchemi.errors import ConfigError
from dali_alchemi.store.format.multistore import is_multistore
from dali_alchemi.store.format.protocol import PackedReader
from dali_alchemi.store.read.reader import AtomicDataZarrReader

if TYPE_CHECKING:
    from dali_alchemi.store.format.location import StoreLike

__all__ = ["open_reader"]


def open_reader(
    store_or_reader: StoreLike | PackedReader,
    *,
    fields: tuple[str, ...] | None,
    cache_bytes: int | None,
    shared_cache: str | None = None,
) -> tuple[PackedReader, bool]:
    """The reader a loader reads through, and whether the loader opened it (and so must close it).

    A :class:`PackedReader` is used as it is; a multi-store (a parallel conversion's folder of parts) is
    opened as one dataset (:func:`~dali_alchemi.store.read.multistore.open_multistore`); anything else is a
    store, opened as an :class:`AtomicDataZarrReader` reading only ``fields`` (sharing decoded chunks
    through ``shared_cache``, when given).

    Raises
    ------
    ConfigError
        If ``cache_bytes`` is given with a reader: it configures a reader the loader opens itself; if
        ``shared_cache`` is given with a multi-store (its parts keep caches of their own).
    """
    if isinstance(store_or_reader, PackedReader):
        if cache_bytes is not None:
            raise ConfigError("cache_bytes= configures a reader the loader opens itself; set it on your reader instead")
        return store_or_reader, False
    if is_multistore(store_or_reader):
        from dali_alchemi.store.read.multistore import open_multistore  # it imports multi, which imports this

        if shared_cache is not None:
            raise ConfigError(f"shared_cache needs one store; {store_or_reader} is a multi-store of parts")
        return open_multistore(cast("str", store_or_reader), fields=fields, cache_bytes=cache_bytes), True
    options: dict[str, Any] = {} if cache_bytes is None else {"cache_bytes": cache_bytes}
    if shared_cache is not None:
        options["shared_cache"] = shared_cache
    return AtomicDataZarrReader(store_or_reader, fields=fields, **options), True
