"""NvalchemiDropInReader: this project's reader with the whole contract of nvalchemi 0.2.0's reader.

nvalchemi's ``Dataset``, ``DataLoader`` and ``MultiDataset`` read through a reader: ``read_many``,
``__len__``, ``close``, ``get_metadata`` (atom and edge counts), a settable ``pin_memory`` (the
DataLoader sets it), ``field_levels`` and ``field_names``, and the single-sample hooks of its
``Reader`` base class (``_load_sample``, ``_load_many_samples``, ``_get_sample_metadata``, ``read``,
``__getitem__``, ``__iter__``). :class:`NvalchemiDropInReader` is
:class:`~dali_alchemi.store.read.reader.AtomicDataZarrReader` (so the packed fast path underneath, and a
:class:`~dali_alchemi.store.format.protocol.PackedReader` for this project's loaders too) with those hooks,
nvalchemi's constructor, its metadata, and the exceptions nvalchemi raises in the same situations:

========================================  ======================  ===============================================
situation                                 builtin type            key phrase of the message (as nvalchemi's)
========================================  ======================  ===============================================
the store path does not exist             ``FileNotFoundError``   ``Zarr store does not exist at STORE``
no ``meta`` (or ``core``) group           ``ValueError``          ``Zarr store at STORE is missing 'meta' group``
an index out of range                     ``IndexError``          ``Index I out of range for reader with N samples``
``refresh()`` after ``close()``           ``RuntimeError``        ``Cannot refresh a closed reader.``
reading after ``close()``                 ``RuntimeError``        ``Cannot read from a closed reader.``
a sample failing inside ``iter(reader)``  ``RuntimeError``        ``Sample I failed with exception: TYPE: ...``
========================================  ======================  ===============================================

Each is also this project's own exception class (``StoreNotFoundError``, ``StoreFormatError``,
``SampleIndexError``, ``ReaderClosedError``), so ``except ValueError`` and ``except StoreFormatError``
both work. Two differences remain on purpose: ``pin_memory=True`` without a GPU is refused when it is
set (a ``RuntimeError``, as nvalchemi's first pinned read would raise), and a store this project
considers corrupt (pointers past their arrays, neighbor indices outside their structure) is refused
with a ``ValueError`` naming the problem, where nvalchemi would return wrong values.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dali_alchemi.errors import DeviceError, ReaderClosedError, SampleReadError, StoreFormatError
from dali_alchemi.store.format import layout
from dali_alchemi.store.read.identity import SnapshotIdentity, identify
from dali_alchemi.store.read.open_checks import open_root
from dali_alchemi.store.read.reader import AtomicDataZarrReader

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.format.location import StoreLike

__all__ = ["NvalchemiDropInReader"]


logger = logging.getLogger(__name__)


class NvalchemiDropInReader(AtomicDataZarrReader):
    """A drop-in for ``nvalchemi.data.datapipes.AtomicDataZarrReader``, read through this project's engine.

    Parameters
    ----------
    store
        As nvalchemi's: a path, a zarr ``Store``/``StorePath`` or a ``dict``; URLs (``s3://``,
        ``http://``...) work too.
    pin_memory
        Return pinned tensors; settable later (nvalchemi's ``DataLoader(pin_memory=True)`` sets it).
        Needs a GPU.
    include_index_in_metadata
        Accepted for nvalchemi's signature. As in nvalchemi's Zarr reader, metadata always holds
        ``index`` (its ``_get_sample_metadata`` includes it either way).
    **options
        This project's reader options: ``fields``, ``cache_bytes``, ``num_threads``, ``fetch``,
        ``storage_options``.

    Swap ``AtomicDataZarrReader(store)`` from nvalchemi for ``NvalchemiDropInReader(store)``; the
    ``Dataset``, ``DataLoader`` and ``MultiDataset`` around it stay as they are.
    """

    def __init__(
        self,
        store: StoreLike,
        *,
        pin_memory: bool = False,
        include_index_in_metadata: bool = True,
        **options: Any,
    ) -> None:
        self.include_index_in_metadata = include_index_in_metadata
        self._pin = False
        try:
            super().__init__(store, pin_memory=pin_memory, **options)
        except StoreFormatError as err:
            missing = self._missing_group()
            if missing is None:
                raise
            raise StoreFormatError(f"Zarr store at {store} is missing {missing!r} group ({err})") from err
        self._options["include_index_in_metadata"] = include_index_in_metadata

    def _missing_group(self) -> str | None:
        """The first of ``meta``, ``core`` the store lacks, or ``None`` (or when it is no group at all)."""
        try:
            groups = {name for name, _ in open_root(self._location).groups()}
        except (StoreFormatError, AttributeError):
            return None
        return next((g for g in (layout.META_GROUP, layout.CORE_GROUP) if g not in groups), None)

    # -- nvalchemi's closed-reader and pin-memory behaviour -----------------------------------------
    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise ReaderClosedError("Cannot read from a closed reader.")

    def refresh(self) -> None:
        """Re-read the store's pointers and masks (after another writer changed it), as nvalchemi's ``refresh``."""
        if getattr(self, "_closed", False):
            raise ReaderClosedError("Cannot refresh a closed reader.")
        super().refresh()

    @property  # type: ignore[override]
    def pin_memory(self) -> bool:
        """Whether reads return pinned tensors; nvalchemi's ``Dataset``/``DataLoader`` set it."""
        return self._pin

    @pin_memory.setter
    def pin_memory(self, enabled: bool) -> None:
        if enabled and not torch.cuda.is_available():
            raise DeviceError("pin_memory=True needs a CUDA build of torch and a visible GPU")
        self._pin = bool(enabled)
        if hasattr(self, "_options"):
            self._options["pin_memory"] = self._pin

    # -- nvalchemi's Reader hooks -------------------------------------------------------------------
    @property
    def field_names(self) -> list[str]:  # type: ignore[override]  # nvalchemi's type
        """The fields each sample holds, as a list (nvalchemi's type)."""
        return list(self._fields)

    def read_many(self, indices: Sequence[int] | NDArray[Any]) -> list[tuple[dict[str, torch.Tensor], dict[str, Any]]]:
        """``[(tensors, metadata), ...]`` in request order, as nvalchemi's ``read_many``.

        Metadata is nvalchemi's: ``{"index": I, "source_file": str(store), "physical_index": "P"}``.
        """
        self._check_open()
        pairs = super().read_many(indices)
        source = str(self.store)
        for _, metadata in pairs:
            metadata["source_file"] = source
        return pairs

    def _load_many_samples(self, indices: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        """The tensors of several samples, without metadata (nvalchemi's batch hook)."""
        return [data for data, _ in self.read_many(indices)]

    def _load_sample(self, index: int) -> dict[str, torch.Tensor]:
        """The tensors of one sample (the hook nvalchemi's ``Dataset`` calls on readers without ``read_many``)."""
        return self._load_many_samples([index])[0]

    def _get_sample_metadata(self, index: int) -> dict[str, Any]:
        """``{"index", "source_file", "physical_index"}`` of one sample, without reading its data."""
        logical = int(self.normalize_indices([index])[0])
        physical = int(self._snapshot.physical(np.asarray([logical]))[0])
        return {"index": logical, "source_file": str(self.store), "physical_index": str(physical)}

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], dict[str, Any]]]:
        """Every sample in order; a failure is a :class:`~dali_alchemi.errors.SampleReadError` (a
        ``RuntimeError``) naming the sample, as in nvalchemi."""
        for i in range(len(self)):
            try:
                yield self.read(i)
            except Exception as err:
                message = f"Sample {i} failed with exception: {type(err).__name__}: {err}"
                logger.error(message)
                raise SampleReadError(message) from err

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen_drop_in, (self.store, dict(self._options), identify(self._snapshot, self._fields)))

    def __repr__(self) -> str:
        return f"NvalchemiDropInReader(len={len(self)}, pin_memory={self.pin_memory})"


def _reopen_drop_in(
    store: StoreLike, options: dict[str, Any], identity: SnapshotIdentity | None = None
) -> NvalchemiDropInReader:
    reader = NvalchemiDropInReader(store, **options)
    if identity is not None:
        reader._serve(identity)  # the state the pickled reader served (or StoreChangedError)
    return reader
