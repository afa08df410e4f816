"""to_pyg(batch) and to_nvalchemi(batch), where those packages are importable."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dali_alchemi import AtomicDataZarrReader, Batch
from dali_alchemi.interop import to_nvalchemi, to_pyg


@pytest.fixture(scope="module")
def batch(small_store: Path) -> Batch:
    with AtomicDataZarrReader(small_store) as reader:
        return Batch.from_packed(reader.read_packed([5, 0, 9, 2]))


def test_to_pyg(batch: Batch) -> None:
    pytest.importorskip("torch_geometric", reason="PyTorch Geometric is not installed")
    pyg = to_pyg(batch)
    assert pyg.num_graphs == 4
    assert torch.equal(pyg.pos, batch.positions) and torch.equal(pyg.z, batch.atomic_numbers)
    assert torch.equal(pyg.edge_index, batch.neighbor_list.t().long()) and pyg.edge_index.shape[0] == 2
    assert torch.equal(pyg.batch, batch.batch_idx.long()) and torch.equal(pyg.ptr, batch.batch_ptr)
    assert torch.equal(pyg.energy, batch.energy) and torch.equal(pyg.shifts, batch.shifts)
    for i, data in enumerate(pyg.to_data_list()):
        sample = batch[i]
        assert torch.equal(data.pos, sample["positions"])
        assert torch.equal(data.edge_index, sample["neighbor_list"].t().long())
        assert torch.equal(data.cell, sample["cell"]) and torch.equal(data.forces, sample["forces"])


def test_to_nvalchemi(batch: Batch) -> None:
    pytest.importorskip("nvalchemi.data", reason="nvalchemi-toolkit is not installed")
    theirs = to_nvalchemi(batch)
    assert theirs.num_graphs == 4 and theirs.num_nodes == batch.num_nodes and theirs.num_edges == batch.num_edges
    assert theirs.keys == batch.keys
    for name in batch.fields:
        assert torch.equal(getattr(theirs, name), batch[name]), name
    assert torch.equal(theirs.batch_ptr, batch.batch_ptr) and torch.equal(theirs.batch_idx, batch.batch_idx)


def test_to_nvalchemi_equals_nvalchemis_own_collation(batch: Batch) -> None:
    nv = pytest.importorskip("nvalchemi.data", reason="nvalchemi-toolkit is not installed")
    from tests.interop.nvalchemi_checks import assert_same_nvalchemi_batch

    reference = nv.Batch.from_raw_dicts(batch.to_data_list(), device=batch.device, field_levels=dict(batch.levels))
    assert_same_nvalchemi_batch(to_nvalchemi(batch), reference, key_order=True)
