"""The reader seam: what a loader needs from a reader, and nothing more.

:class:`PackedReader` is a ``typing.Protocol``. This project's
:class:`~dali_alchemi.store.read.reader.AtomicDataZarrReader` implements it, and so can an adapter over any
other source of structures (another project's reader, several stores at once). The loaders
(:class:`~dali_alchemi.pipeline.loader.DALIDataLoader`, :func:`~dali_alchemi.baseline.plain_dataloader`)
and the planners only ever call what is listed here. Contract tests that any implementation can
subclass live in :mod:`dali_alchemi.testing.reader`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from dali_alchemi.errors import ConfigError, UnknownFieldError

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.format.packed import PackedSamples
    from dali_alchemi.types import CountArray, IndexArray, Level

__all__ = [
    "UNCHUNKED_SPAN_SIZE", "ChunkedReader", "FieldSpec", "InflatedChunks", "PackedReader", "as_field_names", "select_fields"
]  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class InflatedChunks:
    """What a field's stored LZ4 blocks inflate to: chunks of ``chunk_shape`` (rows first) of ``dtype``, their
    bytes shuffled by elements of ``shuffle`` bytes before compression (0: not shuffled)."""

    chunk_shape: tuple[int, ...]
    dtype: np.dtype[Any]
    shuffle: int = 0

    @property
    def trailing(self) -> tuple[int, ...]:
        return self.chunk_shape[1:]

    @property
    def row_bytes(self) -> int:
        """Bytes of one inflated row."""
        return int(np.prod(self.trailing, dtype=np.int64)) * self.dtype.itemsize

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one inflated chunk: what nvCOMP inflates each block to (as uint8)."""
        return self.chunk_shape[0] * self.row_bytes


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """What one field holds: its level, dtype and the shape of one row (``trailing``, without dim 0)."""

    level: Level
    dtype: np.dtype[Any]
    trailing: tuple[int, ...]
    inflate: InflatedChunks | None = field(default=None, compare=False)
    """How the field's chunks are stored when DALI's GPU inflate decodes them as stored (the ``"inflate"``
    layout; ``DALIDataLoader(layout="inflate")``); ``None`` otherwise."""

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row (one atom, edge or structure) of this field."""
        return int(np.prod(self.trailing, dtype=np.int64)) * self.dtype.itemsize


@runtime_checkable
class PackedReader(Protocol):
    """A source of structures that a loader can plan over and read a window from.

    Implementations must also pickle as a recipe (paths and options, not open handles): the DALI
    loader sends the reader to its worker processes, where it is reopened.

    Methods
    -------
    __len__
        Number of structures; indices run over ``0 .. len - 1``.
    field_specs
        Every field the reader returns, in its order, with level, dtype and trailing shape.
    sample_sizes
        Atom and edge counts of structures, without reading any data (planners call it on a whole
        epoch).
    read_packed
        One window as :class:`~dali_alchemi.store.format.packed.PackedSamples`, in request order
        (duplicates allowed), optionally narrowed to ``fields``.
    close
        Release handles, threads and caches; idempotent.
    """

    def __len__(self) -> int: ...

    @property
    def field_specs(self) -> Mapping[str, FieldSpec]: ...

    def sample_sizes(self, indices: Sequence[int] | NDArray[Any]) -> tuple[CountArray, CountArray]: ...

    def read_packed(
        self, indices: Sequence[int] | NDArray[Any], *, fields: Sequence[str] | None = None
    ) -> PackedSamples: ...

    def close(self) -> None: ...


UNCHUNKED_SPAN_SIZE = 1024
"""Structures per span for a reader that does not say how it is chunked (about one 4 MiB chunk of
positions for structures of 20-40 atoms)."""


@runtime_checkable
class ChunkedReader(Protocol):
    """An optional capability of a :class:`PackedReader`: how its storage is chunked, in sample space.

    A chunk-aware plan (``shuffle="block"``) builds its spans from :meth:`sample_chunk_bounds` and
    sizes its buffers from :attr:`cache_bytes`; a reader without them gets fixed-size spans and the
    default cache budget.

    Methods
    -------
    sample_chunk_bounds
        ``[S + 1]`` int64 sample offsets, from 0 to ``len(reader)``, strictly increasing: span ``k``
        (samples ``[b[k], b[k + 1])``) is stored together, so reading it decodes about one chunk per
        array. Computed from pointers, without reading data.
    cache_bytes
        The reader's decoded-chunk cache budget in bytes.
    """

    def sample_chunk_bounds(self) -> IndexArray: ...

    @property
    def cache_bytes(self) -> int: ...


def as_field_names(fields: str | Iterable[str]) -> tuple[str, ...]:
    """``fields=`` as a tuple of names: a string is one name, not its letters."""
    return (fields,) if isinstance(fields, str) else tuple(fields)


def select_fields(reader: PackedReader, fields: str | Iterable[str] | None) -> tuple[str, ...]:
    """The fields a loader reads from ``reader``: all of them (``None``), one name, or a subset.

    Both loaders call this, so ``fields=`` means the same in each: a narrowing of what the reader returns.

    Raises
    ------
    UnknownFieldError
        Naming the fields the reader does not return, and those it does.
    ConfigError
        If ``fields`` is empty (a ``ValueError``).
    """
    available = tuple(reader.field_specs)
    if fields is None:
        return available
    names = as_field_names(fields)
    if not names:
        raise ConfigError("fields must name at least one field (or be None for all of them)")
    unknown = sorted(set(names) - set(available))
    if unknown:
        raise UnknownFieldError(f"Unknown fields {unknown}; the reader returns {list(available)}")
    return names
