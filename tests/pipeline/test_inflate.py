"""pipeline/inflate.py: the ``"inflate"`` layout, its host half checked on the CPU with liblz4 standing in
for nvCOMP, and the whole route on a GPU."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dali_alchemi import AtomicDataZarrReader
from dali_alchemi.batch import collate
from dali_alchemi.errors import ConfigError, DeviceError, StoreFormatError
from dali_alchemi.pipeline.inflate import (
    ARGUMENT,
    ATOM_STARTS,
    BLOCKS,
    ROWS,
    SIZES,
    InflateRoute,
    assemble,
    inflate_route,
)
from dali_alchemi.pipeline.source import BATCH_BOUNDS, INDICES, N_ATOMS, N_EDGES, WindowSource
from dali_alchemi.plan import FixedBatchPlan
from dali_alchemi.store.read.compressed import CompressedRows, inflate_reference
from tests.loader_contract import assert_batches_equal, reference_batches

CUDA = torch.device("cuda", 0)  # a device object only: building the route touches no GPU


def _route(store: Path) -> tuple[AtomicDataZarrReader, InflateRoute]:
    reader = AtomicDataZarrReader(store)
    return reader, inflate_route(reader, reader.field_names, CUDA)


def test_the_route_inflates_the_lz4_fields_and_sends_the_rest_as_rows(inflate_store: Path) -> None:
    reader, route = _route(inflate_store)
    with reader:
        names = [f.name for f in route.inflated]
        assert {"atomic_numbers", "positions", "neighbor_list"} <= set(names)
        assert set(route.host_fields) == set(reader.field_names) - set(names)  # the custom arrays (not LZ4)
        assert route.fields == reader.field_names and route.rebases
        atomic_numbers = next(f for f in route.inflated if f.name == "atomic_numbers")
        assert atomic_numbers.chunk_shape == (64,) and atomic_numbers.dtype == reader.field_specs["atomic_numbers"].dtype
        assert atomic_numbers.shuffle == atomic_numbers.dtype.itemsize and atomic_numbers.chunk_bytes == 64 * 8
        placements = {spec.name: spec.placement for spec in route.specs}
        assert placements[BLOCKS + "positions"] == "device" and placements[ROWS + "positions"] == "device"
        assert placements[SIZES + "positions"] == ARGUMENT and placements[ATOM_STARTS] == "device"
        assert route.device_outputs([BLOCKS + "positions", N_ATOMS]) == ["positions", N_ATOMS]


def test_the_route_needs_a_cuda_device_and_lz4_fields(inflate_store: Path, reader: AtomicDataZarrReader) -> None:
    with AtomicDataZarrReader(inflate_store) as r:
        with pytest.raises(DeviceError, match=r"layout='inflate'.*needs a CUDA device, not cpu"):
            inflate_route(r, r.field_names, torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"none of the fields .* is stored as LZ4 blocks.*--layout inflate"):
        inflate_route(reader, reader.field_names, CUDA)  # the blosc store
    with pytest.raises(ConfigError, match="layout='inflate' and an inflate route go together"):
        WindowSource(reader, FixedBatchPlan(num_samples=300, batch_size=4), (), batches_per_window=2, layout="inflate")


@pytest.mark.dali
def test_the_loader_refuses_the_inflate_layout_without_a_gpu(inflate_store: Path) -> None:
    from dali_alchemi import DALIDataLoader

    with pytest.raises(DeviceError, match=r"needs a CUDA device, not cpu"):
        DALIDataLoader(inflate_store, batch_size=8, device="cpu", layout="inflate")


def _inflated_on_host(outputs: dict[str, Any], route: InflateRoute) -> dict[str, torch.Tensor]:
    """What DALI's inflate makes of a window's blocks, here by liblz4: ``[chunks, chunk_bytes]`` per field."""
    out = {}
    for f in route.inflated:
        part = CompressedRows(
            name=f.name, level=f.level, blocks=outputs[BLOCKS + f.name], sizes=outputs[SIZES + f.name],
            rows=outputs[ROWS + f.name], chunk_shape=f.chunk_shape, dtype=f.dtype, shuffle=f.shuffle,
        )  # fmt: skip
        out[f.name] = torch.from_numpy(inflate_reference(part))
    return out


def _assembled(outputs: dict[str, Any], route: InflateRoute, inflated: dict[str, torch.Tensor]) -> dict[str, Any]:
    return assemble(
        inflated, {f.name: torch.from_numpy(outputs[ROWS + f.name]) for f in route.inflated}, route,
        n_atoms=torch.from_numpy(outputs[N_ATOMS]), n_edges=torch.from_numpy(outputs[N_EDGES]),
        atom_starts=torch.from_numpy(outputs[ATOM_STARTS]), host_n_edges=outputs[N_EDGES],
        sample_indices=outputs[INDICES],
    )  # fmt: skip


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "sequential"])
def test_windows_assemble_into_the_batches_the_host_reads(inflate_store: Path, shuffle: bool) -> None:
    reader, route = _route(inflate_store)
    with reader:
        plan = FixedBatchPlan(num_samples=len(reader), batch_size=16, shuffle=shuffle, seed=4)
        source = WindowSource(reader, plan, route.specs, batches_per_window=3, layout="inflate", route=route)
        source = pickle.loads(pickle.dumps(source))  # as DALI sends it to its worker processes
        got = []
        for window in range(source.num_windows(0)):
            outputs = {spec.name: arrays[0] for spec, arrays in zip(route.specs, source.read_window(0, window), strict=True)}
            fields = {name: torch.from_numpy(outputs[name]) for name in route.host_fields}
            fields.update(_assembled(outputs, route, _inflated_on_host(outputs, route)))
            got += collate(
                fields={name: fields[name] for name in route.fields}, levels=reader.field_levels,
                n_atoms=torch.from_numpy(outputs[N_ATOMS]), n_edges=torch.from_numpy(outputs[N_EDGES]),
                host_n_atoms=outputs[N_ATOMS], host_n_edges=outputs[N_EDGES], batch_bounds=outputs[BATCH_BOUNDS],
                sample_indices=outputs[INDICES],
            )  # fmt: skip
        assert_batches_equal(got, reference_batches(reader, plan, 0))


@pytest.mark.dali
def test_the_shared_memory_hint_counts_the_blocks_as_their_decoded_rows(inflate_store: Path) -> None:
    from dali_alchemi.pipeline.build import window_bytes_hint

    reader, route = _route(inflate_store)
    with reader:
        by_name = {spec.name: spec for spec in route.specs}
        assert by_name[BLOCKS + "positions"].row_bytes == 12 and by_name[BLOCKS + "neighbor_list"].row_bytes == 16
        assert by_name[ROWS + "positions"].row_bytes == 8
        plan = FixedBatchPlan(num_samples=len(reader), batch_size=32, shuffle=False)
        source = WindowSource(reader, plan, route.specs, batches_per_window=4, layout="inflate", route=route)
        hint = window_bytes_hint(route.specs, reader.sample_sizes(np.arange(len(reader))), plan.epoch(0), 4)
        sent = [sum(a[0].nbytes for a in source.read_window(0, w)) for w in range(source.num_windows(0))]
        assert max(sent) <= hint < 3 * max(sent)  # covers a store-order window, without a gross overcount


def test_an_atom_index_outside_its_structure_is_refused(inflate_store: Path) -> None:
    reader, route = _route(inflate_store)
    with reader:
        source = WindowSource(
            reader, FixedBatchPlan(num_samples=len(reader), batch_size=8, shuffle=False), route.specs, batches_per_window=1, layout="inflate",
            route=route,
        )  # fmt: skip
        outputs = {spec.name: arrays[0] for spec, arrays in zip(route.specs, source.read_window(0, 0), strict=True)}
        inflated = _inflated_on_host(outputs, route)
        row = int(outputs[ROWS + "neighbor_list"][5])  # the sixth edge of the window (structure 0's)
        chunk, at = divmod(row * 2 + 1, 64 * 2)  # its second index: element `at` of a chunk of 64 x 2 int64
        shuffled = inflated["neighbor_list"][chunk].view(8, -1)  # stored shuffled: byte k of every element together
        shuffled[:, at] = torch.tensor(list((10**6).to_bytes(8, "little")), dtype=torch.uint8)
        with pytest.raises(StoreFormatError, match=r"neighbor_list of sample 0 holds \[\d+, \d+\] .*outside its \d+ atoms"):
            _assembled(outputs, route, inflated)


@pytest.mark.gpu
@pytest.mark.dali
@pytest.mark.parametrize(("shuffle", "workers"), [(True, 2), (False, 0), (True, 0)])
def test_inflated_batches_on_the_gpu_equal_the_window_layout(inflate_store: Path, shuffle: bool, workers: int) -> None:
    from dali_alchemi import DALIDataLoader

    options: dict[str, Any] = {"batch_size": 16, "seed": 2, "shuffle": shuffle, "num_workers": workers, "device": "cuda"}
    with (
        DALIDataLoader(inflate_store, layout="window", **options) as window,
        DALIDataLoader(inflate_store, layout="inflate", **options) as inflate,
    ):
        for epoch in range(2):
            got, want = list(inflate), list(window)
            assert got and got[0].positions.is_cuda and got[0].neighbor_list.is_cuda, epoch
            assert_batches_equal(got, [b.to("cpu") for b in want])
