"""The iterator's collation fed by hand: what DALI's outputs would hold, as torch tensors on the device.

No DALI here: each pipeline output is a stand-in with the two methods the iterator calls on a DALI
TensorList, holding exactly the samples the source produces for a window, placed where the pipeline
would put them (``.gpu()`` outputs on the device, host copies on the CPU). So the device half of the
loader (DLPack views, ``batch_idx``, pointers and neighbor-list offsets computed on the GPU, the blob
unpacked on the GPU) is tested with torch alone; the CPU case checks the stand-in itself.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from dali_alchemi import AtomicDataZarrReader, Batch
from dali_alchemi.batch import collate
from dali_alchemi.pipeline.iterator import WindowIterator
from dali_alchemi.pipeline.source import BLOB_OUTPUTS, OutputSpec, WindowSource, output_specs
from dali_alchemi.plan import FixedBatchPlan
from tests.loader_contract import assert_batches_equal, reference_batches

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class TensorListStandIn:
    """The part of a DALI TensorList the iterator uses: per-sample shapes and one reshaped flat tensor."""

    def __init__(self, samples: list[np.ndarray], device: torch.device) -> None:
        self.samples = samples
        self.device = device

    def shape(self) -> list[tuple[int, ...]]:
        return [sample.shape for sample in self.samples]

    def as_reshaped_tensor(self, shape: list[int]) -> torch.Tensor:
        flat = np.concatenate([np.ascontiguousarray(s).reshape(-1) for s in self.samples])
        return torch.from_numpy(flat).reshape(shape).to(self.device)  # has __dlpack__, as DALI's tensor does


def pipeline_outputs(
    window: tuple[list[np.ndarray], ...], specs: tuple[OutputSpec, ...], device: torch.device
) -> tuple[Any, tuple[TensorListStandIn, ...]]:
    """The outputs of a run of the pipeline that :func:`~dali_alchemi.pipeline.build.build_pipeline` builds."""
    by_name = dict(zip((s.name for s in specs), window, strict=True))
    if device.type == "cpu":
        names = SimpleNamespace(device_names=tuple(by_name), host_names=())
        return names, tuple(TensorListStandIn(by_name[n], device) for n in by_name)
    on_device = tuple(s.name for s in specs if s.placement in ("device", "both"))
    on_host = tuple(s.name for s in specs if s.placement in ("host", "both"))
    raw = [TensorListStandIn(by_name[n], device) for n in on_device]
    raw += [TensorListStandIn(by_name[n], torch.device("cpu")) for n in on_host]
    return SimpleNamespace(device_names=on_device, host_names=on_host), tuple(raw)


def _device(name: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if name == "cuda" else torch.device(name)


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("layout", ["window", "blob"])
def test_the_iterator_collates_host_tensors_on_the_device(
    reader: AtomicDataZarrReader, layout: str, device_name: str
) -> None:
    device = _device(device_name)
    plan = FixedBatchPlan(num_samples=len(reader), batch_size=16, seed=3)
    specs = output_specs(reader.field_specs, reader.field_names, host_collation=device.type == "cpu")  # as the loader
    source = WindowSource(reader, plan, specs, batches_per_window=4, layout=layout)
    iterator = WindowIterator(None, None, specs, device)  # type: ignore[arg-type]
    got: list[Batch] = []
    for w in range(source.num_windows(0)):  # the source's windows (its first epoch ramps up)
        names, raw = pipeline_outputs(source.read_window(0, w), BLOB_OUTPUTS if layout == "blob" else specs, device)
        iterator.outputs = names
        batches = iterator._to_batches(raw)
        assert all(b.positions.device == device and b.batch_idx.device == device for b in batches)
        assert all(b.batch_ptr.device == device and b.neighbor_list.device == device for b in batches)
        got += batches
    assert_batches_equal(got, reference_batches(reader, plan, 0))


@pytest.mark.parametrize("device_name", DEVICES)
def test_collate_on_the_device_equals_the_host(reader: AtomicDataZarrReader, device_name: str) -> None:
    device = _device(device_name)
    packed = reader.read_packed(np.arange(40, 140))
    n_atoms, n_edges = packed.n_atoms, packed.n_edges
    host = collate(
        fields={k: torch.from_numpy(v.copy()) for k, v in packed.fields.items()}, levels=reader.field_levels,
        n_atoms=torch.from_numpy(n_atoms), n_edges=torch.from_numpy(n_edges), host_n_atoms=n_atoms,
        host_n_edges=n_edges, batch_bounds=np.array([0, 24, 48, 72, 96, 100]),
    )  # fmt: skip
    moved = collate(
        fields={k: torch.from_numpy(v).to(device) for k, v in packed.fields.items()}, levels=reader.field_levels,
        n_atoms=torch.from_numpy(n_atoms).to(device), n_edges=torch.from_numpy(n_edges).to(device),
        host_n_atoms=n_atoms, host_n_edges=n_edges, batch_bounds=np.array([0, 24, 48, 72, 96, 100]),
    )  # fmt: skip
    assert [b.num_graphs for b in moved] == [24, 24, 24, 24, 4]
    for a, b in zip(host, moved, strict=True):
        assert b.positions.device == device
        for name in a.fields:
            assert torch.equal(a[name], b[name].cpu()), name
        for name in ("batch_idx", "batch_ptr", "edge_batch_ptr"):
            assert torch.equal(getattr(a, name), getattr(b, name).cpu()), name
    assert int(moved[1].neighbor_list.max()) < moved[1].num_nodes  # offsets are local to each batch
