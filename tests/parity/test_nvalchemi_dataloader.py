"""dali_alchemi.nvalchemi's DataLoader beside nvalchemi 0.2.0's own: the same batches for the same settings.

Runs only where nvalchemi is importable (``make parity``). Each case builds nvalchemi's loader and
ours over the same store with the same arguments (and the same torch seed where a sampler draws from
it) and compares every batch: fields with dtype and device, counts, pointers, and the methods' results.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from dali_alchemi.bench.synth import write_synthetic_store, write_synthetic_store_nvalchemi
from tests.interop.nvalchemi_checks import assert_same_nvalchemi_batch

nv = pytest.importorskip("nvalchemi.data.datapipes", reason="nvalchemi-toolkit is not installed")
da = pytest.importorskip("dali_alchemi.nvalchemi")


WORKERS = 0
"""DALI worker processes of our datasets: none (a background thread), since starting workers costs seconds per
loader; test_dali_workers_deliver_the_same_batches runs with them."""


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("nvloader")
    a = write_synthetic_store_nvalchemi(root / "a.zarr", 37, seed=1, min_atoms=3, max_atoms=12)
    b = write_synthetic_store_nvalchemi(root / "b.zarr", 22, seed=2, min_atoms=3, max_atoms=12)
    return str(a), str(b)


@pytest.fixture(scope="module")
def ours_written(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store of this project's writer: float64 energies and no masses, categories or velocities."""
    path = tmp_path_factory.mktemp("ours") / "ours.zarr"
    write_synthetic_store(path, 19, seed=5, min_atoms=3, max_atoms=10)
    return str(path)


def _pair(
    store: str, *, seed: int | None = None, dataset: dict[str, Any] | None = None, **loader: Any
) -> tuple[list[Any], list[Any]]:
    """nvalchemi's batches and ours for the same store, dataset and loader settings (CPU)."""
    options = {"device": "cpu", **(dataset or {})}
    if seed is not None:
        torch.manual_seed(seed)
    theirs = list(nv.DataLoader(nv.Dataset(nv.AtomicDataZarrReader(store), **options), **loader))
    if seed is not None:
        torch.manual_seed(seed)
    ours = list(da.DataLoader(da.Dataset(store, **{"num_workers": WORKERS, **options}), **loader))
    return ours, theirs


def _assert_same(ours: list[Any], theirs: list[Any], *, key_order: bool = True) -> None:
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs, strict=True):
        assert_same_nvalchemi_batch(a, b, key_order=key_order)


@pytest.mark.parametrize("prefetch_factor", [0, 2, 16])
def test_plain_batches_equal_nvalchemis(stores: tuple[str, str], prefetch_factor: int) -> None:
    ours, theirs = _pair(stores[0], batch_size=5, prefetch_factor=prefetch_factor)
    assert len(ours) == 8  # ceil(37 / 5): the short last batch is kept
    _assert_same(ours, theirs)


def test_dali_workers_deliver_the_same_batches(stores: tuple[str, str]) -> None:
    torch.manual_seed(2)
    theirs = list(
        nv.DataLoader(nv.Dataset(nv.AtomicDataZarrReader(stores[0]), device="cpu"), batch_size=5, shuffle=True)
    )
    torch.manual_seed(2)
    loader = da.DataLoader(da.Dataset(stores[0], device="cpu", num_workers=2), batch_size=5, shuffle=True)
    _assert_same(list(loader), theirs)
    loader.close()


def _grown_store(path: Any) -> str:
    """10 structures written by this project's writer (which re-bases appended neighbor lists)."""
    from dali_alchemi import AtomicDataZarrWriter
    from dali_alchemi.bench.synth import synthetic_samples

    AtomicDataZarrWriter(path).write(synthetic_samples(10, seed=1, min_atoms=3, max_atoms=6).split())
    return str(path)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_refreshed_reader_of_a_grown_store_is_read_whole_as_nvalchemi_does(tmp_path: Any, workers: int) -> None:
    from dali_alchemi import AtomicDataZarrWriter
    from dali_alchemi.bench.synth import synthetic_samples

    ours_store, theirs_store = _grown_store(tmp_path / "ours.zarr"), _grown_store(tmp_path / "theirs.zarr")
    theirs = nv.DataLoader(nv.Dataset(nv.AtomicDataZarrReader(theirs_store), device="cpu"), batch_size=2)
    ours = da.DataLoader(da.Dataset(ours_store, device="cpu", num_workers=workers), batch_size=2)
    try:
        assert len(list(ours)) == len(list(theirs)) == len(ours) == 5
        for loader, store in ((ours, ours_store), (theirs, theirs_store)):
            AtomicDataZarrWriter(store).append(synthetic_samples(10, seed=2, min_atoms=3, max_atoms=6).split())
            loader.dataset.reader.refresh()
        assert len(ours) == len(theirs) == 10
        got = list(ours)
        _assert_same(got, list(theirs))
        assert len(got) == 10 and len(list(ours)) == 10  # and the epoch after
    finally:
        ours.close()


def test_skip_validation_gives_nvalchemis_raw_batches(stores: tuple[str, str]) -> None:
    # nvalchemi's raw path keeps its reader's key order (the store's listing order); the set of keys is compared.
    ours, theirs = _pair(stores[0], dataset={"skip_validation": True}, batch_size=6)
    _assert_same(ours, theirs, key_order=False)


def test_validation_casts_and_fills_as_atomic_data_does(ours_written: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours, theirs = _pair(ours_written, batch_size=4)
    _assert_same(ours, theirs)
    assert ours[0].energy.dtype == torch.float32 and "atomic_masses" in ours[0].keys["node"]
    assert any("AtomicData fields ['energy'] were cast" in str(w.message) for w in caught)
    raw, raw_theirs = _pair(ours_written, dataset={"skip_validation": True}, batch_size=4)
    _assert_same(raw, raw_theirs, key_order=False)
    assert raw[0].energy.dtype == torch.float64


def test_validation_fills_what_atomic_data_fills(stores: tuple[str, str]) -> None:
    fields = ["atomic_numbers", "positions", "forces", "energy", "cell", "pbc", "neighbor_list", "shifts"]
    dataset = nv.Dataset(da.AtomicDataZarrReader(stores[1], fields=fields), device="cpu")
    ours = list(da.DataLoader(dataset, batch_size=6))
    _assert_same(ours, list(nv.DataLoader(dataset, batch_size=6)))
    assert {"atomic_masses", "atom_categories", "velocities"} <= ours[0].keys["node"]
    assert ours[0].atomic_masses.dtype == torch.float32 and ours[0].atom_categories.dtype == torch.int64


def test_shuffled_with_the_global_seed_and_with_a_seeded_generator(stores: tuple[str, str]) -> None:
    ours, theirs = _pair(stores[0], seed=11, batch_size=4, shuffle=True)
    _assert_same(ours, theirs)

    def loaders(make: Callable[..., Any], dataset: Any) -> list[Any]:
        sampler = torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(3))
        return list(make(dataset, batch_size=4, sampler=sampler))

    _assert_same(
        loaders(da.DataLoader, da.Dataset(stores[0], device="cpu", num_workers=WORKERS)),
        loaders(nv.DataLoader, nv.Dataset(nv.AtomicDataZarrReader(stores[0]), device="cpu")),
    )


def test_a_sampler_and_a_batch_sampler_decide_the_batches(stores: tuple[str, str]) -> None:
    order = [5, 3, 3, 30, 0, 36, 12]
    ours, theirs = _pair(stores[0], batch_size=3, sampler=order)
    _assert_same(ours, theirs)
    assert [b.num_graphs for b in ours] == [3, 3, 1]
    batches = [[4, 1], [36], [7, 7, 8, 2, 0]]
    ours, theirs = _pair(stores[0], batch_sampler=batches)
    _assert_same(ours, theirs)
    assert [b.num_graphs for b in ours] == [2, 1, 5]


def test_drop_last_and_len(stores: tuple[str, str]) -> None:
    ours, theirs = _pair(stores[0], batch_size=5, drop_last=True)
    _assert_same(ours, theirs)
    loader = da.DataLoader(da.Dataset(stores[0], device="cpu", num_workers=WORKERS), batch_size=5, drop_last=True)
    assert len(loader) == 7 == len(ours) and all(b.num_graphs == 5 for b in ours)


def test_batch_transforms_run_on_every_batch(stores: tuple[str, str]) -> None:
    def center(batch):  # type: ignore[no-untyped-def]  # nvalchemi's Compose reads the annotations
        batch.positions = batch.positions - batch.positions.mean(0)
        return batch

    ours, theirs = _pair(stores[0], batch_size=6, batch_transforms=[center])
    _assert_same(ours, theirs)
    assert abs(float(ours[0].positions.mean())) < 1e-5

    def broken(batch):  # type: ignore[no-untyped-def]
        raise KeyError("no such thing")

    loader = da.DataLoader(
        da.Dataset(stores[0], device="cpu", num_workers=WORKERS), batch_size=6, batch_transforms=[broken]
    )
    with pytest.raises(RuntimeError) as caught:
        next(iter(loader))
    assert isinstance(caught.value.__cause__, KeyError)


def test_per_sample_transforms_run_as_in_nvalchemi(stores: tuple[str, str]) -> None:
    def shift(data, metadata):  # type: ignore[no-untyped-def]  # nvalchemi's Compose reads the annotations
        data.positions = data.positions + float(metadata["index"])
        return data, metadata

    # nvalchemi's own route prefetches on the dataset's thread pool, which needs a worker
    ours, theirs = _pair(stores[0], dataset={"transforms": [shift], "num_workers": 1}, batch_size=7)
    _assert_same(ours, theirs)
    loader = da.DataLoader(da.Dataset(stores[0], device="cpu", transforms=[shift]), batch_size=7)
    assert loader.route == "nvalchemi"


def test_two_ranks_through_distributed_sampler(stores: tuple[str, str]) -> None:
    from torch.utils.data.distributed import DistributedSampler

    seen = []
    for rank in (0, 1):
        per_loader = []
        for make, dataset in (
            (da.DataLoader, da.Dataset(stores[0], device="cpu", num_workers=WORKERS)),
            (nv.DataLoader, nv.Dataset(nv.AtomicDataZarrReader(stores[0]), device="cpu")),
        ):
            sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=4)
            loader = make(dataset, batch_size=4, sampler=sampler)
            epochs = []
            for epoch in (0, 1):
                loader.set_epoch(epoch)
                epochs.append(list(loader))
            per_loader.append(epochs)
        for ours, theirs in zip(*per_loader, strict=True):
            _assert_same(ours, theirs)
        seen.append(per_loader[0])
    assert len(seen[0][0]) == len(seen[1][0]) == 5  # 19 samples per rank (one padded), batches of 4
    first = [b.positions for b in seen[0][0]]
    assert not all(torch.equal(a, b) for a, b in zip(first, [b.positions for b in seen[0][1]], strict=True))


def _multi(make_dataset: Callable[[str], Any], stores: tuple[str, str], **options: Any) -> Any:
    return nv.MultiDataset(*(make_dataset(store) for store in stores), **options)


def test_multidataset_with_its_samplers(stores: tuple[str, str]) -> None:
    def theirs_ds(store: str) -> Any:
        return nv.Dataset(nv.AtomicDataZarrReader(store), device="cpu")

    def ours_ds(store: str) -> Any:
        return da.Dataset(store, device="cpu", num_workers=WORKERS)

    def batches(make: Callable[..., Any], dataset: Any, how: str) -> list[Any]:
        if how == "plain":
            return list(make(dataset, batch_size=8))
        if how == "sampler":
            sampler = nv.MultiDatasetSampler(dataset, weights=[0.7, 0.3], num_samples=30, seed=2)
            return list(make(dataset, batch_size=6, sampler=sampler))
        sampler = nv.MultiDatasetBatchSampler(dataset, batch_size=6, samples_per_dataset=[4, 2], seed=3)
        return list(make(dataset, batch_sampler=sampler))

    for how in ("plain", "sampler", "batch_sampler"):
        ours_multi = _multi(ours_ds, stores, num_workers=WORKERS)
        loader = da.DataLoader(ours_multi, batch_size=2)
        assert loader.route == "packed"
        # A batch mixing datasets is made by nvalchemi with append and index_select, which reorder the keys.
        theirs = batches(nv.DataLoader, _multi(theirs_ds, stores), how)
        _assert_same(batches(da.DataLoader, ours_multi, how), theirs, key_order=False)


def test_nvalchemis_own_dataset_and_reader_are_read_through_read_many(stores: tuple[str, str]) -> None:
    dataset = nv.Dataset(nv.AtomicDataZarrReader(stores[1]), device="cpu")
    loader = da.DataLoader(dataset, batch_size=5)
    assert loader.route == "packed"
    _assert_same(list(loader), list(nv.DataLoader(dataset, batch_size=5)))


def test_in_memory_dataset_is_handed_to_nvalchemis_path(stores: tuple[str, str]) -> None:
    dataset = nv.InMemoryDataset(reader=nv.AtomicDataZarrReader(stores[1]), device="cpu")
    loader = da.DataLoader(dataset, batch_size=5)
    assert loader.route == "nvalchemi"
    _assert_same(list(loader), list(nv.DataLoader(dataset, batch_size=5)))


def test_arguments_attributes_and_errors_are_nvalchemis(stores: tuple[str, str]) -> None:
    dataset = da.Dataset(stores[0], device="cpu", num_workers=WORKERS)
    loader = da.DataLoader(dataset)
    reference = nv.DataLoader(dataset)
    for name in ("batch_size", "shuffle", "drop_last", "prefetch_factor", "num_streams", "use_streams", "pin_memory"):
        assert getattr(loader, name) == getattr(reference, name), name
    assert loader.dataset is dataset and type(loader.sampler) is type(reference.sampler)
    assert loader.batch_sampler is None and len(loader) == len(reference) == 37
    assert loader.effective_read_window == reference.effective_read_window
    for kwargs in ({"batch_size": 0}, {"prefetch_factor": -1}, {"batch_sampler": [[0]], "shuffle": True}):
        with pytest.raises(ValueError) as ours_error:
            da.DataLoader(dataset, **kwargs)
        with pytest.raises(ValueError) as their_error:
            nv.DataLoader(dataset, **kwargs)
        assert str(ours_error.value) == str(their_error.value)
    with pytest.raises(TypeError, match="Pass \\[fn\\] instead of fn"):
        da.DataLoader(dataset, batch_transforms=lambda b: b)
    with pytest.raises(IndexError, match="Index 99 out of range for reader with 37 samples"):
        list(da.DataLoader(dataset, sampler=[0, 99]))


def test_a_mistyped_keyword_names_the_one_meant(stores: tuple[str, str]) -> None:
    with pytest.raises(
        TypeError, match=r"^DataLoader got an unexpected keyword argument 'batchsize'; did you mean 'batch_size'\?$"
    ):
        da.DataLoader(da.Dataset(stores[0], device="cpu"), batchsize=4)
    with pytest.raises(
        TypeError, match=r"^Dataset got an unexpected keyword argument 'num_worker'; did you mean 'num_workers'\?$"
    ):
        da.Dataset(stores[0], num_worker=0)


def test_set_epoch_step_skips_batches_once(stores: tuple[str, str]) -> None:
    dataset = da.Dataset(stores[0], device="cpu", num_workers=WORKERS)
    loader = da.DataLoader(dataset, batch_size=5)
    full = list(loader)
    loader.set_epoch_step(6)
    rest = list(loader)
    assert len(rest) == 2 and torch.equal(rest[0].positions, full[6].positions)
    assert len(list(loader)) == 8
    with pytest.raises(ValueError, match="step must be >= 0"):
        loader.set_epoch_step(-1)
    for bad in (1.5, True, None):
        with pytest.raises(TypeError, match=rf"step must be an int, got {bad!r} \({type(bad).__name__}\)"):
            loader.set_epoch_step(bad)
    assert len(list(loader)) == 8  # nothing was skipped


def test_dali_loader_yields_nvalchemi_batches(stores: tuple[str, str]) -> None:
    from dali_alchemi import DALIDataLoader

    with DALIDataLoader(
        stores[0], batch_size=5, shuffle=False, num_workers=0, device="cpu", batch_type="nvalchemi"
    ) as dl:
        ours = list(dl)
    dataset = nv.Dataset(nv.AtomicDataZarrReader(stores[0]), device="cpu", skip_validation=True)
    _assert_same(ours, list(nv.DataLoader(dataset, batch_size=5)), key_order=False)


def test_a_training_step_through_nvalchemis_neighbor_list_hook(stores: tuple[str, str]) -> None:
    from nvalchemi.hooks import NeighborListHook
    from nvalchemi.hooks._context import HookContext
    from nvalchemi.models.base import NeighborConfig

    # the hook's torch.compile takes minutes on a CPU. config.patch restores the setting on the way out;
    # a monkeypatch of this config module deletes the entry instead, which breaks torch.compile afterwards
    with torch._dynamo.config.patch(disable=True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.SiLU(), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        hook = NeighborListHook(NeighborConfig(cutoff=0.6))
        losses = []
        for batch in da.DataLoader(da.Dataset(stores[1], device="cpu", num_workers=WORKERS), batch_size=8, shuffle=True):
            hook(HookContext(batch=batch), None)  # replaces the edges group with its own neighbor list
            sender, receiver = batch.neighbor_list[:, 0].long(), batch.neighbor_list[:, 1].long()
            cell = batch.cell[batch.batch_idx.long()[sender]]
            shifts = torch.einsum("ek,ekl->el", batch.neighbor_list_shifts.to(cell.dtype), cell)
            distance = (batch.positions[receiver] - batch.positions[sender] + shifts).norm(dim=1, keepdim=True)
            per_edge = model(distance).squeeze(1)
            energy = torch.zeros(batch.num_graphs).index_add_(0, batch.batch_idx.long()[sender], per_edge)
            loss = torch.nn.functional.mse_loss(energy, batch.energy.squeeze(1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            assert batch.edge_ptr.shape == (batch.num_nodes + 1,) and int(batch.edge_ptr[-1]) == batch.num_edges
            losses.append(float(loss))
        assert len(losses) == 3 and all(np.isfinite(losses))


@pytest.mark.gpu
def test_batches_on_cuda_with_pinned_reads_equal_nvalchemis(stores: tuple[str, str]) -> None:
    torch.manual_seed(6)
    dataset = nv.Dataset(nv.AtomicDataZarrReader(stores[0]), device="cuda")
    theirs = list(nv.DataLoader(dataset, batch_size=6, shuffle=True, pin_memory=True))
    torch.manual_seed(6)
    loader = da.DataLoader(da.Dataset(stores[0], device="cuda"), batch_size=6, shuffle=True, pin_memory=True)
    ours = list(loader)
    assert ours[0].device.type == "cuda" and ours[0].positions.is_cuda
    _assert_same(ours, theirs)
    loader.close()
