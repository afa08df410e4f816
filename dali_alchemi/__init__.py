"""dali_alchemi: feed atomistic training data from nvalchemi Zarr stores to PyTorch through NVIDIA DALI.

Data flows one way: ``store`` (layout, writer, reader) -> ``planning`` (sampling, sharding, windows)
-> ``pipeline`` (DALI source, pipeline, iterator) -> :class:`Batch`. Importing this package is cheap:
torch, zarr and DALI are imported only when the names that need them are first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "AtomicDataZarrReader": "dali_alchemi.store.reader",
    "DALIDataLoader": "dali_alchemi.pipeline.loader",
    "LoaderConfig": "dali_alchemi.config",
    "SamplePlan": "dali_alchemi.planning",
    "AtomicDataZarrWriter": "dali_alchemi.store.writer",
    "Batch": "dali_alchemi.batch",
    "PackedSamples": "dali_alchemi.store.packed",
    "WriteConfig": "dali_alchemi.config",
    "ArrayConfig": "dali_alchemi.config",
    "DaliAlchemiError": "dali_alchemi.errors",
    "StoreFormatError": "dali_alchemi.errors",
    "StoreNotFoundError": "dali_alchemi.errors",
    "ChunkDecodeError": "dali_alchemi.errors",
    "FieldLevelError": "dali_alchemi.errors",
    "SampleDataError": "dali_alchemi.errors",
    "SampleIndexError": "dali_alchemi.errors",
    "ReaderClosedError": "dali_alchemi.errors",
    "LoaderError": "dali_alchemi.errors",
    "UnknownFieldError": "dali_alchemi.errors",
    "RemoteReadError": "dali_alchemi.errors",
    "ReadTooLargeError": "dali_alchemi.errors",
}

__all__ = [
    "ArrayConfig",
    "AtomicDataZarrReader",
    "AtomicDataZarrWriter",
    "Batch",
    "ChunkDecodeError",
    "DALIDataLoader",
    "DaliAlchemiError",
    "FieldLevelError",
    "LoaderConfig",
    "LoaderError",
    "PackedSamples",
    "ReadTooLargeError",
    "ReaderClosedError",
    "RemoteReadError",
    "SampleDataError",
    "SampleIndexError",
    "SamplePlan",
    "StoreFormatError",
    "StoreNotFoundError",
    "UnknownFieldError",
    "WriteConfig",
]

if TYPE_CHECKING:
    from dali_alchemi.batch import Batch
    from dali_alchemi.config import ArrayConfig, LoaderConfig, WriteConfig
    from dali_alchemi.errors import (
        ChunkDecodeError,
        DaliAlchemiError,
        FieldLevelError,
        LoaderError,
        ReaderClosedError,
        ReadTooLargeError,
        RemoteReadError,
        SampleDataError,
        SampleIndexError,
        StoreFormatError,
        StoreNotFoundError,
        UnknownFieldError,
    )
    from dali_alchemi.pipeline.loader import DALIDataLoader
    from dali_alchemi.planning import SamplePlan
    from dali_alchemi.store.packed import PackedSamples
    from dali_alchemi.store.reader import AtomicDataZarrReader
    from dali_alchemi.store.writer import AtomicDataZarrWriter


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dali_alchemi' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
