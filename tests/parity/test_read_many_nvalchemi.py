"""nvalchemi 0.2.0's own AtomicDataZarrReader through ReadManyAdapter: the contract, and both loaders.

Runs only where nvalchemi is importable (``make parity``); skipped elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, PackedSamples, plain_dataloader
from dali_alchemi.interop.read_many import ReadManyAdapter
from dali_alchemi.testing.reader import PackedReaderTests
from tests.loader_contract import assert_batches_equal
from tests.parity.test_drop_in_reader import write_nvalchemi_store

pipes = pytest.importorskip("nvalchemi.data.datapipes", reason="nvalchemi-toolkit is not installed")


@pytest.fixture(scope="module")
def nv_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_nvalchemi_store(tmp_path_factory.mktemp("nv") / "s.zarr", 61, seed=4)


class TestAdapterOverNvalchemisReader(PackedReaderTests):
    @pytest.fixture(autouse=True)
    def _store(self, nv_store: Path) -> None:
        self.store = nv_store

    def make_reader(self) -> ReadManyAdapter:
        return ReadManyAdapter(pipes.AtomicDataZarrReader(str(self.store)))

    def expected(self) -> PackedSamples:
        with AtomicDataZarrReader(self.store) as reader:
            return reader.read_packed(np.arange(len(reader)))


def test_sizes_come_from_its_get_metadata(nv_store: Path) -> None:
    theirs = pipes.AtomicDataZarrReader(str(nv_store))
    adapter = ReadManyAdapter(theirs)
    with AtomicDataZarrReader(nv_store) as ours:
        want = ours.sample_sizes(np.arange(61))
        assert adapter.field_specs == ours.field_specs
    got = adapter.sample_sizes(np.arange(61))
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    adapter.close()


@pytest.mark.parametrize(
    "make", [pytest.param("dali", marks=pytest.mark.dali), pytest.param("dali-w2", marks=pytest.mark.dali), "plain"]
)
@pytest.mark.parametrize("budget", [False, True])
def test_both_loaders_read_nvalchemis_reader(nv_store: Path, make: str, budget: bool) -> None:
    options: dict[str, Any] = {"seed": 3, **({"max_atoms": 60} if budget else {"batch_size": 9})}

    def build(reader: Any) -> Any:
        if make == "plain":
            return plain_dataloader(reader, num_workers=0, batched=True, **options)
        from dali_alchemi import DALIDataLoader

        workers = 2 if make == "dali-w2" else 0
        return DALIDataLoader(reader, device="cpu", num_workers=workers, batches_per_window=2, **options)

    theirs = pipes.AtomicDataZarrReader(str(nv_store))
    with AtomicDataZarrReader(nv_store) as ours:
        over_theirs, over_ours = build(theirs), build(ours)
        try:
            wrapped = over_theirs.dataset.reader if make == "plain" else over_theirs.reader
            assert isinstance(wrapped, ReadManyAdapter) and wrapped.reader is theirs
            assert_batches_equal(list(over_theirs), list(over_ours))
        finally:
            over_theirs.close()
            over_ours.close()
    theirs.read(0)  # the loader left the reader it was given open
