"""NvalchemiDropInReader on its own: nvalchemi's hooks, metadata and exceptions (no nvalchemi needed).

The side-by-side comparison with nvalchemi's own reader, inside its Dataset, DataLoader and
MultiDataset, is in ``tests/parity/test_drop_in_reader.py``.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from dali_alchemi import AtomicDataZarrReader, ReaderClosedError, SampleIndexError, StoreFormatError, StoreNotFoundError
from dali_alchemi.errors import DeviceError
from dali_alchemi.interop.nvalchemi_reader import NvalchemiDropInReader


@pytest.fixture()
def drop_in(small_store: Path) -> NvalchemiDropInReader:
    reader = NvalchemiDropInReader(str(small_store))
    yield reader
    reader.close()


def test_reads_what_this_projects_reader_reads(drop_in: NvalchemiDropInReader, reader: AtomicDataZarrReader) -> None:
    order = [5, 299, -1, 5, 0]
    for (a, meta), (b, _) in zip(drop_in.read_many(order), reader.read_many(order), strict=True):
        assert set(a) == set(b)
        for key in a:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        assert meta["source_file"] == str(drop_in.store) and isinstance(meta["physical_index"], str)
    assert [m["index"] for _, m in drop_in.read_many(order)] == [5, 299, 299, 5, 0]


def test_single_sample_hooks(drop_in: NvalchemiDropInReader, reader: AtomicDataZarrReader) -> None:
    sample = drop_in._load_sample(-2)
    want, _ = reader.read(298)
    assert all(torch.equal(sample[k], want[k]) for k in want)
    many = drop_in._load_many_samples([3, 1])
    assert [int(s["atomic_numbers"].shape[0]) for s in many] == [int(reader.get_metadata(i)[0]) for i in (3, 1)]
    assert drop_in._get_sample_metadata(-1) == {
        "index": 299,
        "source_file": str(drop_in.store),
        "physical_index": "299",
    }
    data, meta = drop_in[7]
    assert meta["index"] == 7 and torch.equal(data["positions"], reader.read(7)[0]["positions"])
    assert drop_in.get_metadata(-1) == reader.get_metadata(299)
    assert drop_in.field_names == list(reader.field_names)
    assert drop_in.field_levels == reader.field_levels
    assert sum(1 for _ in drop_in) == len(drop_in) == 300


def test_exceptions_keep_nvalchemis_types_and_phrases(tmp_path: Path, small_store: Path) -> None:
    with pytest.raises(FileNotFoundError, match="Zarr store does not exist at") as missing:
        NvalchemiDropInReader(str(tmp_path / "nowhere.zarr"))
    assert isinstance(missing.value, StoreNotFoundError)
    for group, other in (("meta", "core"), ("core", "meta")):
        broken = tmp_path / f"no-{group}.zarr"
        zarr.open_group(broken, mode="w", zarr_format=3).create_group(other)
        with pytest.raises(ValueError, match=f"Zarr store at {broken} is missing '{group}' group") as err:
            NvalchemiDropInReader(str(broken))
        assert isinstance(err.value, StoreFormatError)
    reader = NvalchemiDropInReader(str(small_store))
    for call in (lambda: reader.read(300), lambda: reader.get_metadata(-301), lambda: reader.read_many([0, 300])):
        with pytest.raises(IndexError, match="out of range for reader with 300 samples") as err:
            call()
        assert isinstance(err.value, SampleIndexError)
    reader.close()
    reader.close()
    assert len(reader) == 300 and reader.get_metadata(0) == reader.get_metadata(0)  # cached sizes, as nvalchemi
    with pytest.raises(RuntimeError, match=r"^Cannot refresh a closed reader\.$") as err:
        reader.refresh()
    assert isinstance(err.value, ReaderClosedError)
    for call in (lambda: reader.read(0), lambda: reader.read_many([]), lambda: reader._load_sample(0)):
        with pytest.raises(RuntimeError, match=r"^Cannot read from a closed reader\.$"):
            call()


def test_iteration_failure_names_the_sample(small_store: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.zarr"
    shutil.copytree(small_store, broken)
    chunks = sorted(p for p in (broken / "core" / "positions" / "c").rglob("*") if p.is_file())
    chunks[len(chunks) // 2].write_bytes(b"not a chunk")  # a chunk in the middle: later samples fail
    reader = NvalchemiDropInReader(str(broken), cache_bytes=0)
    with pytest.raises(RuntimeError, match=r"Sample \d+ failed with exception: ChunkDecodeError"):
        for _ in reader:
            pass
    reader.close()


def test_pin_memory_is_settable_and_refused_without_a_gpu(drop_in: NvalchemiDropInReader) -> None:
    assert drop_in.pin_memory is False
    drop_in.pin_memory = False
    if torch.cuda.is_available():
        drop_in.pin_memory = True
        assert drop_in.read(0)[0]["positions"].is_pinned()
    else:
        with pytest.raises(RuntimeError, match="pin_memory=True needs a CUDA") as err:
            drop_in.pin_memory = True
        assert isinstance(err.value, DeviceError) and drop_in.pin_memory is False


def test_pickles_as_a_drop_in_and_is_a_packed_reader(
    drop_in: NvalchemiDropInReader, reader: AtomicDataZarrReader
) -> None:
    clone = pickle.loads(pickle.dumps(drop_in))
    try:
        assert type(clone) is NvalchemiDropInReader and len(clone) == 300
        np.testing.assert_array_equal(
            clone.read_packed([4, 2]).fields["positions"], reader.read_packed([4, 2]).fields["positions"]
        )
        assert repr(clone) == "NvalchemiDropInReader(len=300, pin_memory=False)"
    finally:
        clone.close()


@pytest.mark.dali
def test_the_dali_loader_reads_it_natively(drop_in: NvalchemiDropInReader) -> None:
    from dali_alchemi import DALIDataLoader

    with DALIDataLoader(drop_in, batch_size=50, num_workers=0, device="cpu", seed=1) as loader:
        assert loader.reader is drop_in  # a PackedReader: no adapter in between
        assert sum(batch.num_graphs for batch in loader) == 300
