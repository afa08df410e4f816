"""dali_alchemi: feed atomistic training data from nvalchemi Zarr stores to PyTorch through NVIDIA DALI.

Data flows one way: ``store`` (layout, writer, reader) -> ``plan`` (order, batches, shards) ->
``pipeline`` (DALI source, pipeline, iterator) -> :class:`Batch`. ``baseline`` (the plain torch
DataLoader) and ``bench`` sit beside, on the same reader, plan and Batch. Importing this package is
cheap: torch, zarr and DALI are imported only when a name that needs them is first used.

The public names are the keys of ``_EXPORTS`` (with the module each lives in); ``__all__`` is built
from it, and the block under ``TYPE_CHECKING`` only repeats it for type checkers (a test keeps the two
equal).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    # reading and writing stores
    "AtomicDataZarrReader": "dali_alchemi.store.read.reader",
    "AtomicDataZarrWriter": "dali_alchemi.store.write.writer",
    "PackedSamples": "dali_alchemi.store.format.packed",
    "PackedReader": "dali_alchemi.store.format.protocol",
    "FieldSpec": "dali_alchemi.store.format.protocol",
    "MultiReader": "dali_alchemi.store.read.multi",
    "ChunkedReader": "dali_alchemi.store.format.protocol",
    "WriteConfig": "dali_alchemi.config",
    "layout_config": "dali_alchemi.config",
    "rewrite_store": "dali_alchemi.store.write.rewrite",
    "RewriteReport": "dali_alchemi.store.write.rewrite",
    "ArrayConfig": "dali_alchemi.config",
    "FetchConfig": "dali_alchemi.remote_config",
    "verify_store": "dali_alchemi.store.check.verify",
    "VerifyReport": "dali_alchemi.store.check.verify",
    "repair_store": "dali_alchemi.store.write.repair",
    "RepairReport": "dali_alchemi.store.write.repair",
    # readers of nvalchemi's contract
    "NvalchemiDropInReader": "dali_alchemi.interop.nvalchemi_reader",
    "ReadManyAdapter": "dali_alchemi.interop.read_many",
    # planning epochs
    "Plan": "dali_alchemi.plan",
    "EpochPlan": "dali_alchemi.plan",
    "FixedBatchPlan": "dali_alchemi.plan",
    "BudgetPlan": "dali_alchemi.plan",
    "MixturePlan": "dali_alchemi.plan",
    "BlockShuffle": "dali_alchemi.plan",
    "BlockShufflePlan": "dali_alchemi.plan",
    "shuffle_quality": "dali_alchemi.plan",
    "batch_ks": "dali_alchemi.plan",
    # loading
    "DALIDataLoader": "dali_alchemi.pipeline.loader",
    "plain_dataloader": "dali_alchemi.baseline",
    "Batch": "dali_alchemi.batch",
    "pad_batch": "dali_alchemi.padding",
    "unpad_batch": "dali_alchemi.padding",
    # errors
    "DaliAlchemiError": "dali_alchemi.errors",
    "ConfigError": "dali_alchemi.errors",
    "StoreFormatError": "dali_alchemi.errors",
    "StoreLockedError": "dali_alchemi.errors",
    "StoreNotFoundError": "dali_alchemi.errors",
    "NotAStoreError": "dali_alchemi.errors",
    "StoreExistsError": "dali_alchemi.errors",
    "UnsupportedStoreError": "dali_alchemi.errors",
    "ChunkDecodeError": "dali_alchemi.errors",
    "FieldLevelError": "dali_alchemi.errors",
    "SampleDataError": "dali_alchemi.errors",
    "SampleIndexError": "dali_alchemi.errors",
    "StoreChangedError": "dali_alchemi.errors",
    "UnknownFieldError": "dali_alchemi.errors",
    "ReadTooLargeError": "dali_alchemi.errors",
    "RemoteReadError": "dali_alchemi.errors",
    "RemoteRangeError": "dali_alchemi.errors",
    "RemoteRedirectError": "dali_alchemi.errors",
    "RangeIgnoredWarning": "dali_alchemi.errors",
    "ReaderClosedError": "dali_alchemi.errors",
    "ReaderOutputError": "dali_alchemi.errors",
    "NotAReaderError": "dali_alchemi.errors",
    "LoaderClosedError": "dali_alchemi.errors",
    "LoaderError": "dali_alchemi.errors",
    "DeviceError": "dali_alchemi.errors",
    "PlanError": "dali_alchemi.errors",
    "FieldMismatchError": "dali_alchemi.errors",
    "MetricInputError": "dali_alchemi.errors",
    "DaliAlchemiWarning": "dali_alchemi.errors",
    "PrecisionLossWarning": "dali_alchemi.errors",
    "RepairError": "dali_alchemi.errors",
    "AmbiguousRepairError": "dali_alchemi.errors",
    "StoreSchemaWarning": "dali_alchemi.errors",
    "StoreWriteError": "dali_alchemi.errors",
    "InputNotFoundError": "dali_alchemi.errors",
    "SampleReadError": "dali_alchemi.errors",
    "ConfigTypeError": "dali_alchemi.errors",
    "PlanIndexError": "dali_alchemi.errors",
    "EmptyBatchError": "dali_alchemi.errors",
    "UnsupportedCodecError": "dali_alchemi.errors",
    "FieldAssignmentError": "dali_alchemi.errors",
    "NvalchemiNotInstalledError": "dali_alchemi.errors",
    "RewriteMismatchError": "dali_alchemi.errors",
    "SlowLayoutWarning": "dali_alchemi.errors",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from dali_alchemi.baseline import plain_dataloader
    from dali_alchemi.batch import Batch
    from dali_alchemi.config import ArrayConfig, WriteConfig, layout_config
    from dali_alchemi.errors import (
        AmbiguousRepairError,
        ChunkDecodeError,
        ConfigError,
        ConfigTypeError,
        DaliAlchemiError,
        DaliAlchemiWarning,
        DeviceError,
        EmptyBatchError,
        FieldAssignmentError,
        FieldLevelError,
        FieldMismatchError,
        InputNotFoundError,
        LoaderClosedError,
        LoaderError,
        MetricInputError,
        NotAReaderError,
        NotAStoreError,
        NvalchemiNotInstalledError,
        PlanError,
        PlanIndexError,
        PrecisionLossWarning,
        RangeIgnoredWarning,
        ReaderClosedError,
        ReaderOutputError,
        ReadTooLargeError,
        RemoteRangeError,
        RemoteReadError,
        RemoteRedirectError,
        RepairError,
        RewriteMismatchError,
        SampleDataError,
        SampleIndexError,
        SampleReadError,
        SlowLayoutWarning,
        StoreChangedError,
        StoreExistsError,
        StoreFormatError,
        StoreLockedError,
        StoreNotFoundError,
        StoreSchemaWarning,
        StoreWriteError,
        UnknownFieldError,
        UnsupportedCodecError,
        UnsupportedStoreError,
    )
    from dali_alchemi.interop.nvalchemi_reader import NvalchemiDropInReader
    from dali_alchemi.interop.read_many import ReadManyAdapter
    from dali_alchemi.padding import pad_batch, unpad_batch
    from dali_alchemi.pipeline.loader import DALIDataLoader
    from dali_alchemi.plan import (
        BlockShuffle,
        BlockShufflePlan,
        BudgetPlan,
        EpochPlan,
        FixedBatchPlan,
        MixturePlan,
        Plan,
        batch_ks,
        shuffle_quality,
    )
    from dali_alchemi.remote_config import FetchConfig
    from dali_alchemi.store.check.verify import VerifyReport, verify_store
    from dali_alchemi.store.format.packed import PackedSamples
    from dali_alchemi.store.format.protocol import ChunkedReader, FieldSpec, PackedReader
    from dali_alchemi.store.read.multi import MultiReader
    from dali_alchemi.store.read.reader import AtomicDataZarrReader
    from dali_alchemi.store.write.repair import RepairReport, repair_store
    from dali_alchemi.store.write.rewrite import RewriteReport, rewrite_store
    from dali_alchemi.store.write.writer import AtomicDataZarrWriter


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dali_alchemi' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
