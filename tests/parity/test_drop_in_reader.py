"""NvalchemiDropInReader inside nvalchemi 0.2.0's Dataset, DataLoader and MultiDataset, beside its own reader.

Runs only where nvalchemi is importable (``make parity``); skipped elsewhere. Every store here is
written by nvalchemi's own writer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr

from dali_alchemi.bench.synth import synthetic_samples, write_synthetic_store_nvalchemi
from dali_alchemi.interop.nvalchemi_reader import NvalchemiDropInReader

pipes = pytest.importorskip("nvalchemi.data.datapipes", reason="nvalchemi-toolkit is not installed")


def write_nvalchemi_store(path: Path, n: int, seed: int) -> Path:
    """``n`` small synthetic structures written by nvalchemi's writer in one ``write``."""
    return write_synthetic_store_nvalchemi(path, n, seed=seed, min_atoms=3, max_atoms=20)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("nv")
    return write_nvalchemi_store(root / "a.zarr", 45, seed=1), write_nvalchemi_store(root / "b.zarr", 28, seed=2)


READERS: dict[str, Callable[[str], Any]] = {
    "nvalchemi": lambda store: pipes.AtomicDataZarrReader(store),
    "drop-in": lambda store: NvalchemiDropInReader(store),
}


def test_the_synthetic_recipe_written_by_nvalchemi_reads_the_same(tmp_path: Path) -> None:
    path = write_synthetic_store_nvalchemi(tmp_path / "synth.zarr", 30, seed=9)
    want = synthetic_samples(30, seed=9)
    with NvalchemiDropInReader(str(path)) as reader:
        got = reader.read_packed(np.arange(30))
    for name, values in want.fields.items():
        np.testing.assert_array_equal(got.fields[name], values, err_msg=name)
    with pytest.raises(FileExistsError, match="already exists"):
        write_synthetic_store_nvalchemi(path, 3)


def _batch_tensors(batch: Any) -> dict[str, torch.Tensor]:
    return {**batch.to_dict(), "batch_idx": batch.batch_idx, "batch_ptr": batch.batch_ptr}


def _assert_same_batches(ours: list[Any], theirs: list[Any]) -> None:
    assert len(ours) == len(theirs) > 1
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        ta, tb = _batch_tensors(a), _batch_tensors(b)
        assert set(ta) == set(tb), k
        for name in tb:
            assert ta[name].dtype == tb[name].dtype and torch.equal(ta[name], tb[name]), (k, name)


def _epoch(dataset: Any, **options: Any) -> list[Any]:
    return list(pipes.DataLoader(dataset, **options))


@pytest.mark.parametrize("skip_validation", [False, True])
@pytest.mark.parametrize("prefetch_factor", [0, 3])
def test_dataloader_batches_equal_over_either_reader(
    stores: tuple[Path, Path], skip_validation: bool, prefetch_factor: int
) -> None:
    order = np.random.default_rng(0).permutation(45)
    batches = [order[i : i + 8].tolist() for i in range(0, 45, 8)]
    got = {}
    for name, make in READERS.items():
        dataset = pipes.Dataset(make(str(stores[0])), device="cpu", skip_validation=skip_validation)
        got[name] = _epoch(dataset, batch_sampler=batches, prefetch_factor=prefetch_factor)
        assert len(dataset) == 45 and dataset.get_metadata(3) == dataset.reader.get_metadata(3)
        dataset.close()
    _assert_same_batches(got["drop-in"], got["nvalchemi"])


def test_dataset_samples_metadata_and_fields_equal(stores: tuple[Path, Path]) -> None:
    theirs = pipes.Dataset(READERS["nvalchemi"](str(stores[0])), device="cpu")
    ours = pipes.Dataset(READERS["drop-in"](str(stores[0])), device="cpu")
    assert sorted(ours.field_names) == sorted(theirs.field_names)
    assert ours.reader.field_levels == theirs.reader.field_levels
    for index in (0, 17, 44, -1):
        (a, ma), (b, mb) = ours[index], theirs[index]
        assert ma == mb
        assert ours.get_metadata(index) == theirs.get_metadata(index)
        for key, value in b.model_dump().items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(a.model_dump()[key], value), (index, key)
    assert [m for _, m in ours.read_many([4, 4, 0])] == [m for _, m in theirs.read_many([4, 4, 0])]
    ours.close()
    theirs.close()


def test_multidataset_over_drop_ins_equals_over_nvalchemis_readers(stores: tuple[Path, Path]) -> None:
    batches = [[0, 44, 45, 72], [10, 50, 11], [60, 1, 2, 3, 70]]  # across both datasets
    got = {}
    for name, make in READERS.items():
        multi = pipes.MultiDataset(*(pipes.Dataset(make(str(s)), device="cpu") for s in stores))
        assert len(multi) == 73 and multi.get_metadata(50) == multi.datasets[1].reader.get_metadata(5)
        got[name] = (_epoch(multi, batch_sampler=batches, prefetch_factor=2), multi[60][1])
        multi.close()
    _assert_same_batches(got["drop-in"][0], got["nvalchemi"][0])
    assert got["drop-in"][1] == got["nvalchemi"][1]


def test_dataloader_sets_pin_memory_through_the_dataset(stores: tuple[Path, Path]) -> None:
    for make in READERS.values():
        dataset = pipes.Dataset(make(str(stores[1])), device="cpu")
        dataset.pin_memory = False
        assert dataset.pin_memory is False and dataset.reader.pin_memory is False
        if torch.cuda.is_available():
            loader = pipes.DataLoader(dataset, batch_size=4, pin_memory=True)
            assert dataset.reader.pin_memory is True and len(list(loader)) == 7
        dataset.close()


def _raised(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except Exception as err:
        return err
    raise AssertionError("nothing was raised")


def test_same_builtin_exceptions_with_nvalchemis_phrases(stores: tuple[Path, Path], tmp_path: Path) -> None:
    no_meta = tmp_path / "no-meta.zarr"
    zarr.open_group(no_meta, mode="w", zarr_format=3).create_group("core")
    no_core = tmp_path / "no-core.zarr"
    zarr.open_group(no_core, mode="w", zarr_format=3).create_group("meta")
    store = str(stores[1])

    def closed(make: Callable[[str], Any], then: Callable[[Any], Any]) -> Callable[[], Any]:
        def run() -> Any:
            reader = make(store)
            reader.close()
            return then(reader)

        return run

    situations: dict[str, Callable[[Callable[[str], Any]], Callable[[], Any]]] = {
        "missing store": lambda make: lambda: make(str(tmp_path / "nowhere.zarr")),
        "missing meta group": lambda make: lambda: make(str(no_meta)),
        "missing core group": lambda make: lambda: make(str(no_core)),
        "read past the end": lambda make: lambda: make(store).read(28),
        "read_many past the end": lambda make: lambda: make(store).read_many([0, 30]),
        "get_metadata past the end": lambda make: lambda: make(store).get_metadata(28),
        "refresh a closed reader": lambda make: closed(make, lambda r: r.refresh()),
        "read a closed reader": lambda make: closed(make, lambda r: r.read(0)),
        "read_many on a closed reader": lambda make: closed(make, lambda r: r.read_many([1, 2])),
    }
    for what, situation in situations.items():
        theirs = _raised(situation(READERS["nvalchemi"]))
        ours = _raised(situation(READERS["drop-in"]))
        builtin = next(t for t in type(theirs).__mro__ if t.__module__ == "builtins")
        assert isinstance(ours, builtin), (what, type(theirs), type(ours))
        assert str(theirs) in str(ours), (what, str(theirs), str(ours))
