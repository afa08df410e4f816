from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from dali_alchemi import Batch
from dali_alchemi.bench.synth import synthetic_samples


def _two() -> list[dict[str, np.ndarray]]:
    return [
        {
            "atomic_numbers": np.array([1, 6, 8]),
            "positions": np.arange(9, dtype=np.float32).reshape(3, 3),
            "neighbor_list": np.array([[0, 1], [1, 2]]),
            "energy": np.array([[1.5]], np.float32),
            "cell": np.eye(3, dtype=np.float32)[None],
            "pbc": np.array([[True, True, False]]),
        },
        {
            "atomic_numbers": np.array([1, 1, 8, 8]),
            "positions": -np.arange(12, dtype=np.float32).reshape(4, 3),
            "neighbor_list": np.array([[0, 1], [2, 3], [3, 0]]),
            "energy": np.array([[-2.0]], np.float32),
            "cell": 2 * np.eye(3, dtype=np.float32)[None],
            "pbc": np.array([[False, False, False]]),
        },
    ]


def test_collation_follows_nvalchemi() -> None:
    batch = Batch.from_samples(_two())
    assert batch.batch_idx.dtype == torch.int32 and batch.batch_idx.tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert batch.batch_ptr.dtype == torch.int64 and batch.batch_ptr.tolist() == [0, 3, 7]
    assert batch.edge_batch_ptr.tolist() == [0, 2, 5]
    assert batch.neighbor_list.tolist() == [[0, 1], [1, 2], [3, 4], [5, 6], [6, 3]]
    assert batch.energy.shape == (2, 1) and batch.cell.shape == (2, 3, 3) and batch.pbc.shape == (2, 3)
    assert (batch.num_graphs, batch.num_nodes, batch.num_edges) == (2, 7, 5)
    assert batch.num_nodes_list == [3, 4] and batch.num_edges_list == [2, 3]
    assert batch.num_nodes_per_graph.tolist() == [3, 4] and batch.num_nodes_per_graph.dtype == torch.int32
    assert batch.keys == {
        "node": {"atomic_numbers", "positions"},
        "edge": {"neighbor_list"},
        "system": {"energy", "cell", "pbc"},
    }
    assert batch["positions"] is batch.positions
    assert "energy" in batch and "forces" not in batch


def test_samples_come_back_with_local_indices() -> None:
    samples = _two()
    batch = Batch.from_samples(samples)
    for got, want in zip(batch.to_data_list(), samples, strict=True):
        for key, value in want.items():
            assert np.array_equal(got[key].numpy(), value), key
    assert batch[-1]["neighbor_list"].tolist() == [[0, 1], [2, 3], [3, 0]]
    with pytest.raises(IndexError, match="Index 2 out of range for batch with 2 structures"):
        batch[2]
    with pytest.raises(AttributeError, match="no field or attribute 'forces'"):
        batch.forces  # noqa: B018


def test_packed_round_trip_is_exact() -> None:
    packed = synthetic_samples(37, seed=9)
    batch = Batch.from_packed(packed)
    again = batch.to_packed()
    for key, value in packed.fields.items():
        assert np.array_equal(again.fields[key], value), key
    assert np.array_equal(again.n_atoms, packed.n_atoms) and np.array_equal(again.n_edges, packed.n_edges)
    reference = Batch.from_samples(packed.split())
    for key in packed.fields:
        assert torch.equal(batch[key], reference[key]), key
    assert torch.equal(batch.batch_idx, reference.batch_idx)


def test_from_packed_shares_memory_on_cpu() -> None:
    packed = synthetic_samples(4, seed=1)
    batch = Batch.from_packed(packed)
    assert batch.positions.data_ptr() == packed.fields["positions"].ctypes.data


def _is_host_indices(value: object, expected: list[int]) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.dtype == torch.int64
        and value.device.type == "cpu"
        and value.tolist() == expected
    )


def test_sample_indices_are_an_int64_cpu_tensor_however_they_are_made() -> None:
    packed = synthetic_samples(5, seed=3)
    assert _is_host_indices(Batch.from_packed(packed).sample_indices, [0, 1, 2, 3, 4])
    assert _is_host_indices(Batch.from_samples(_two(), sample_indices=[7, 3]).sample_indices, [7, 3])
    assert Batch.from_samples(_two()).sample_indices is None
    batch = Batch.from_samples(_two(), sample_indices=np.array([9, 4], dtype=np.int32))
    assert _is_host_indices(batch.sample_indices, [9, 4])
    assert _is_host_indices(batch.to("cpu").sample_indices, [9, 4])
    assert np.array_equal(batch.sample_indices.numpy(), [9, 4])  # the numpy array it used to be
    batch.sample_indices = np.array([1, 2])  # anything assigned is stored as one
    assert _is_host_indices(batch.sample_indices, [1, 2]) and "sample_indices" not in batch.fields
    assert _is_host_indices(pickle.loads(pickle.dumps(batch)).sample_indices, [1, 2])
    assert np.array_equal(batch.to_packed().logical_indices, [1, 2])


@pytest.mark.gpu
def test_sample_indices_stay_on_the_host_when_the_batch_moves() -> None:
    batch = Batch.from_samples(_two(), device="cuda", sample_indices=[5, 6])
    assert batch.positions.is_cuda and _is_host_indices(batch.sample_indices, [5, 6])
    assert _is_host_indices(batch.cpu().to("cuda").sample_indices, [5, 6])


def test_empty_batches_are_rejected() -> None:
    with pytest.raises(ValueError, match="Cannot create batch from empty data list"):
        Batch.from_samples([])


def test_zero_edges_and_moving() -> None:
    samples = [{"positions": np.zeros((2, 3), np.float32), "neighbor_list": np.zeros((0, 2), np.int64)}]
    batch = Batch.from_samples(samples).to("cpu")
    assert batch.neighbor_list.shape == (0, 2) and batch.num_edges_list == [0]
    copy = pickle.loads(pickle.dumps(batch.to_packed()))
    assert copy.n_atoms.tolist() == [2]
    assert batch.device == torch.device("cpu")
    assert "num_graphs=1" in repr(batch)


@pytest.mark.gpu
def test_to_cuda_keeps_values() -> None:
    batch = Batch.from_samples(_two())
    moved = batch.to("cuda", non_blocking=True)
    assert moved.positions.is_cuda and moved.batch_idx.is_cuda
    for key in batch.fields:
        assert torch.equal(moved[key].cpu(), batch[key])
    assert (
        Batch.from_packed(batch.to_packed(), device="cuda").neighbor_list.cpu().tolist() == batch.neighbor_list.tolist()
    )
    assert batch.pin_memory().positions.is_pinned()


def test_assigning_a_field_infers_its_level_from_the_leading_dimension() -> None:
    batch = Batch.from_samples(_two())  # 2 structures, 7 atoms, 5 edges
    stress = torch.zeros(2, 3, 3)
    batch.stress = stress
    assert batch.levels["stress"] == "system" and batch.stress is stress and "stress" in batch
    batch.charges = torch.ones(7)
    batch.edge_weight = torch.ones(5, 1)
    assert batch.levels["charges"] == "atom" and batch.levels["edge_weight"] == "edge"
    assert batch[1]["stress"].shape == (1, 3, 3) and batch[1]["charges"].shape == (4,)
    assert batch.to("cpu").stress is not None  # the new fields travel with the batch
    batch.positions = batch.positions + 1  # replacing a field keeps its level
    assert batch.levels["positions"] == "atom"
    with pytest.raises(ValueError, match=r"leading dimension 3: it matches no level .*add_field\('x'"):
        batch.x = torch.zeros(3)
    with pytest.raises(TypeError, match="needs a tensor"):
        batch.note = "text"
    with pytest.raises(ValueError, match="'positions' at atom level needs 7 rows"):
        batch.positions = torch.zeros(2, 3)


def test_an_ambiguous_leading_dimension_is_refused_and_add_field_decides() -> None:
    first = _two()[0]
    first["neighbor_list"] = np.array([[0, 1], [1, 2], [2, 0]])
    square = Batch.from_samples([first, first])  # 6 atoms and 6 edges: a 6-row tensor fits both levels
    with pytest.raises(ValueError, match="matches atom and edge level"):
        square.weights = torch.ones(6)
    square.add_field("weights", torch.ones(6), "edge")
    assert square.levels["weights"] == "edge"
    with pytest.raises(ValueError, match="level must be"):
        square.add_field("w", torch.ones(6), "graph")  # type: ignore[arg-type]
