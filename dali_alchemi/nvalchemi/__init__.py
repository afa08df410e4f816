"""nvalchemi's datapipes, read at DALI speed: the migration is one import line.

``from nvalchemi.data.datapipes import AtomicDataZarrReader, Dataset, DataLoader`` becomes
``from dali_alchemi.nvalchemi import AtomicDataZarrReader, Dataset, DataLoader``; the training code
around it stays as it is and receives nvalchemi's own ``Batch`` objects, equal to those nvalchemi's
DataLoader yields for the same indices.

- :class:`AtomicDataZarrReader` is this project's packed reader with nvalchemi 0.2.0's reader contract
  (:class:`~dali_alchemi.interop.nvalchemi_reader.NvalchemiDropInReader`).
- :class:`Dataset` is nvalchemi's ``Dataset`` (a subclass) that also opens a store path.
- :class:`DataLoader` takes nvalchemi's arguments with its defaults and meaning and reads through
  :class:`~dali_alchemi.pipeline.loader.DALIDataLoader`.
- ``AtomicDataZarrWriter``, ``ZarrArrayConfig``, ``ZarrWriteConfig``, ``Reader``, ``InMemoryDataset``,
  ``MultiDataset``, ``BatchDatasetProtocol``, ``DistributedSamplerProtocol``, ``MultiDatasetSampler``
  and ``MultiDatasetBatchSampler`` are nvalchemi's own, re-exported, so every name users import from
  ``nvalchemi.data.datapipes`` is here.

Importing this module without nvalchemi-toolkit installed raises
:class:`~dali_alchemi.errors.NvalchemiNotInstalledError` (an ``ImportError``) saying how to install it.
"""

from __future__ import annotations

from dali_alchemi.errors import NvalchemiNotInstalledError

try:
    from nvalchemi.data.datapipes import (
        AtomicDataZarrWriter,
        BatchDatasetProtocol,
        DistributedSamplerProtocol,
        InMemoryDataset,
        MultiDataset,
        MultiDatasetBatchSampler,
        MultiDatasetSampler,
        Reader,
        ZarrArrayConfig,
        ZarrWriteConfig,
    )
except ImportError as err:
    raise NvalchemiNotInstalledError(
        "dali_alchemi.nvalchemi needs nvalchemi-toolkit 0.2.0, which cannot be imported here "
        f"({err}); install it with: pip install nvalchemi-toolkit==0.2.0 (from a clone: pip install -e '.[nvalchemi]', or make parity)"
    ) from err

from dali_alchemi.interop.nvalchemi_reader import NvalchemiDropInReader as AtomicDataZarrReader
from dali_alchemi.nvalchemi._dataloader import DataLoader
from dali_alchemi.nvalchemi._dataset import Dataset

__all__ = [
    "AtomicDataZarrReader", "AtomicDataZarrWriter", "BatchDatasetProtocol", "DataLoader", "Dataset",
    "DistributedSamplerProtocol", "InMemoryDataset", "MultiDataset", "MultiDatasetBatchSampler",
    "MultiDatasetSampler", "Reader", "ZarrArrayConfig", "ZarrWriteConfig"
]
