from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from dali_alchemi import Batch
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.padding import PAD_SPACING, Padding, pad_batch, unpad_batch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

# Batches of 1-6 structures of 5-20 atoms (at most 80 edges each) always fit, with room to pad.
MAX_ATOMS, MAX_EDGES, MAX_STRUCTURES = 128, 512, 8
BUDGET = {"max_atoms": MAX_ATOMS, "max_edges": MAX_EDGES, "max_structures": MAX_STRUCTURES}
SIZES = [3, 1, 6, 2, 5, 4, 6, 2, 3]  # structures per batch; with the seeds, nine different atom counts


def _batches(device: str) -> list[Batch]:
    batches = []
    for seed, n in enumerate(SIZES):
        packed = synthetic_samples(n, seed=seed, min_atoms=5, max_atoms=20)
        batch = Batch.from_packed(packed, device=device)
        batch.sample_indices = np.arange(100 * seed, 100 * seed + n, dtype=np.int64)
        batches.append(batch)
    return batches


def _two(device: str = "cpu") -> Batch:
    samples = [
        {
            "atomic_numbers": np.array([1, 6, 8]),
            "positions": np.arange(9, dtype=np.float32).reshape(3, 3),
            "forces": np.ones((3, 3), np.float32),
            "neighbor_list": np.array([[0, 1], [1, 2]]),
            "shifts": np.ones((2, 3), np.float32),
            "energy": np.array([[1.5]], np.float32),
            "cell": np.eye(3, dtype=np.float32)[None],
            "pbc": np.array([[True, True, False]]),
        },
        {
            "atomic_numbers": np.array([1, 1, 8, 8]),
            "positions": -np.arange(12, dtype=np.float32).reshape(4, 3),
            "forces": -np.ones((4, 3), np.float32),
            "neighbor_list": np.array([[0, 1], [2, 3], [3, 0]]),
            "shifts": np.zeros((3, 3), np.float32),
            "energy": np.array([[-2.0]], np.float32),
            "cell": 2 * np.eye(3, dtype=np.float32)[None],
            "pbc": np.array([[False, False, False]]),
        },
    ]
    return Batch.from_samples(samples, device=device, sample_indices=[10, 11])


@pytest.mark.parametrize("device", DEVICES)
def test_padded_shapes_are_constant(device: str) -> None:
    shapes = set()
    for batch in _batches(device):
        padded = pad_batch(batch, **BUDGET)
        assert (padded.num_graphs, padded.num_nodes, padded.num_edges) == (MAX_STRUCTURES, MAX_ATOMS, MAX_EDGES)
        assert padded.batch_ptr.shape == padded.edge_batch_ptr.shape == (MAX_STRUCTURES + 1,)
        assert padded.batch_idx.shape == (MAX_ATOMS,) and padded.batch_idx.dtype == torch.int32
        assert padded.sample_indices is not None and padded.sample_indices.shape == (MAX_STRUCTURES,)
        assert padded.padding is not None and padded.device == batch.device
        for tensor in (*padded.fields.values(), padded.batch_ptr, padded.batch_idx, padded.padding.atom_mask):
            assert tensor.device == batch.device
        shapes.add(tuple((name, tuple(t.shape), t.dtype) for name, t in padded.fields.items()))
    assert len(shapes) == 1
    (one,) = shapes
    dims = {name: shape[0] for name, shape, _ in one}
    assert dims["positions"] == dims["atomic_numbers"] == MAX_ATOMS
    assert dims["neighbor_list"] == dims["shifts"] == MAX_EDGES
    assert dims["energy"] == dims["cell"] == dims["pbc"] == MAX_STRUCTURES


@pytest.mark.parametrize("device", DEVICES)
def test_real_rows_are_unchanged(device: str) -> None:
    for batch in _batches(device):
        padded = pad_batch(batch, **BUDGET)
        real = unpad_batch(padded)
        assert real.padding is None and real.num_graphs == batch.num_graphs
        for name, tensor in batch.fields.items():
            assert torch.equal(padded[name][: tensor.shape[0]], tensor), name
            assert torch.equal(real[name], tensor), name
        assert torch.equal(padded.batch_ptr[: batch.num_graphs + 1], batch.batch_ptr)
        assert torch.equal(padded.edge_batch_ptr[: batch.num_graphs + 1], batch.edge_batch_ptr)
        assert torch.equal(padded.batch_idx[: batch.num_nodes], batch.batch_idx)
        assert padded.num_nodes_list[: batch.num_graphs] == batch.num_nodes_list
        assert real.sample_indices is not None and batch.sample_indices is not None
        assert np.array_equal(real.sample_indices, batch.sample_indices)
        for got, want in zip(padded.to_data_list()[: batch.num_graphs], batch.to_data_list(), strict=True):
            assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        assert batch.padding is None and unpad_batch(batch) is batch  # the input is left as it was


@pytest.mark.parametrize("device", DEVICES)
def test_padding_rows_are_as_specified(device: str) -> None:
    batch = _two(device)  # 2 structures, 7 atoms, 5 edges
    padded = pad_batch(batch, max_atoms=10, max_edges=9, max_structures=4)
    assert padded.sample_indices is not None and padded.sample_indices.tolist() == [10, 11, -1, -1]
    # The first padding structure owns the 3 padding atoms and the 4 padding edges; the last is empty.
    assert padded.batch_ptr.tolist() == [0, 3, 7, 10, 10]
    assert padded.edge_batch_ptr.tolist() == [0, 2, 5, 9, 9]
    assert padded.num_nodes_list == [3, 4, 3, 0] and padded.num_edges_list == [2, 3, 4, 0]
    assert padded.batch_idx.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert padded.atomic_numbers[7:].tolist() == [0, 0, 0]
    assert padded.forces[7:].eq(0).all() and padded.shifts[5:].eq(0).all()
    far = PAD_SPACING * torch.tensor([1.0, 2.0, 3.0])[:, None].expand(3, 3)
    assert torch.equal(padded.positions[7:].cpu(), far)
    # Self-loops on padding atoms, spread over them, in batch-local indices.
    assert padded.neighbor_list[5:].tolist() == [[7, 7], [8, 8], [9, 9], [7, 7]]
    assert padded.energy[2:].eq(0).all() and not padded.pbc[2:].any()
    assert torch.equal(padded.cell[2:].cpu(), PAD_SPACING * torch.eye(3).expand(2, 3, 3))
    assert padded.cell.dtype == padded.positions.dtype == torch.float32
    pad_structure = padded[2]  # given back like any structure, with local indices
    assert pad_structure["neighbor_list"].tolist() == [[0, 0], [1, 1], [2, 2], [0, 0]]
    assert padded[3]["positions"].shape == (0, 3) and padded[3]["energy"].tolist() == [[0.0]]
    assert len(padded.to_data_list()) == 4
    assert "real_structures=2" in repr(padded)
    assert repr(padded.padding) == "Padding(atoms=7/10, edges=5/9, structures=2/4)"


@pytest.mark.parametrize("device", DEVICES)
def test_padding_atoms_are_beyond_any_cutoff(device: str) -> None:
    for batch in _batches(device):
        padded = pad_batch(batch, **BUDGET)
        n = batch.num_nodes
        pos = padded.positions.double()
        real_to_pad = torch.cdist(pos[:n], pos[n:])
        pad_to_pad = torch.cdist(pos[n:], pos[n:]) + torch.eye(MAX_ATOMS - n, device=device, dtype=pos.dtype) * 1e12
        assert real_to_pad.min() > 0.9 * PAD_SPACING and pad_to_pad.min() > 0.9 * PAD_SPACING
        pad_edges = padded.neighbor_list[batch.num_edges :]
        assert torch.equal(pad_edges[:, 0], pad_edges[:, 1]) and (pad_edges >= n).all()
        # Every padding atom and edge is in the first padding structure, never in a real one.
        assert padded.batch_idx[n:].eq(batch.num_graphs).all()


@pytest.mark.parametrize("device", DEVICES)
def test_masks_and_real_counts_are_device_tensors(device: str) -> None:
    batch = _two(device)
    padded = pad_batch(batch, max_atoms=10, max_edges=9, max_structures=4)
    padding = padded.padding
    assert isinstance(padding, Padding)
    assert padding.atom_mask.tolist() == [True] * 7 + [False] * 3
    assert padding.edge_mask.tolist() == [True] * 5 + [False] * 4
    assert padding.structure_mask.tolist() == [True, True, False, False]
    assert padding.mask("atom") is padding.atom_mask and padding.mask("system") is padding.structure_mask
    for mask in (padding.atom_mask, padding.edge_mask, padding.structure_mask):
        assert mask.dtype == torch.bool and mask.device == batch.device
    counts = (padding.num_real_structures, padding.num_real_atoms, padding.num_real_edges)
    assert all(c.shape == () and c.dtype == torch.int64 and c.device == batch.device for c in counts)
    assert [int(c) for c in counts] == [2, 7, 5]
    assert (padding.host_counts.system, padding.host_counts.atom, padding.host_counts.edge) == (2, 7, 5)
    # The masks agree with the sample indices and the batch index.
    assert padded.sample_indices is not None
    assert padding.structure_mask.tolist() == [bool(i >= 0) for i in padded.sample_indices]
    assert torch.equal(padding.atom_mask, padding.structure_mask[padded.batch_idx.long()])


def test_the_graph_and_node_names_are_deprecated_aliases_of_the_glossary_names() -> None:
    padding = pad_batch(_two("cpu"), max_atoms=10, max_edges=9, max_structures=4).padding
    assert padding is not None
    with pytest.warns(DeprecationWarning, match=r"Padding\.num_real_graphs is deprecated.*num_real_structures"):
        assert padding.num_real_graphs is padding.num_real_structures
    with pytest.warns(DeprecationWarning, match=r"Padding\.num_real_nodes is deprecated.*num_real_atoms"):
        assert padding.num_real_nodes is padding.num_real_atoms
    moved = padding.map(lambda t: t.clone())
    assert int(moved.num_real_structures) == 2 and int(moved.num_real_atoms) == 7


def test_padding_follows_the_batch_and_unknown_sample_indices_stay_unknown() -> None:
    batch = _two()
    batch.sample_indices = None
    padded = pad_batch(batch, max_atoms=8, max_edges=5, max_structures=3)
    assert padded.sample_indices is None and padded.num_edges_list == [2, 3, 0]
    moved = padded.to("cpu")
    assert moved.padding is not None and padded.padding is not None
    assert torch.equal(moved.padding.atom_mask, padded.padding.atom_mask)
    assert moved.padding.host_counts == padded.padding.host_counts


def test_exact_fits() -> None:
    batch = _two()
    same = pad_batch(batch, max_atoms=7, max_edges=5, max_structures=2)
    assert same.padding is not None and bool(same.padding.atom_mask.all()) and bool(same.padding.structure_mask.all())
    assert all(same[name] is batch[name] for name in batch.fields)
    assert same.sample_indices is not None and same.sample_indices.tolist() == [10, 11]
    # Atoms and edges fit exactly: the padding structures are empty.
    empty = pad_batch(batch, max_atoms=7, max_edges=5, max_structures=4)
    assert empty.num_nodes_list == [3, 4, 0, 0] and empty.batch_ptr.tolist() == [0, 3, 7, 7, 7]
    assert empty.energy.shape == (4, 1) and empty.padding is not None
    assert empty.padding.structure_mask.tolist() == [True, True, False, False]
    # Edges fit exactly, atoms do not.
    atoms_only = pad_batch(batch, max_atoms=9, max_edges=5, max_structures=3)
    assert atoms_only.num_nodes_list == [3, 4, 2] and atoms_only.num_edges_list == [2, 3, 0]


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"max_atoms": 6, "max_edges": 9, "max_structures": 4}, "batch has 7 atoms, over the budget max_atoms=6"),
        ({"max_atoms": 10, "max_edges": 4, "max_structures": 4}, "batch has 5 edges, over the budget max_edges=4"),
        (
            {"max_atoms": 10, "max_edges": 9, "max_structures": 1},
            "batch has 2 structures, over the budget max_structures=1",
        ),
        (
            {"max_atoms": 10, "max_edges": 9, "max_structures": 2},
            "max_structures=2 leaves no room for a padding structure: the batch has 2 structures and needs 3 "
            "padding atoms and 4 padding edges, so max_structures must be at least 3",
        ),
        (
            {"max_atoms": 7, "max_edges": 9, "max_structures": 3},
            "max_atoms=7 leaves no padding atom for the 4 padding edges' self-loops: the batch has 7 atoms, "
            "so max_atoms must be at least 8",
        ),
        ({"max_atoms": -1, "max_edges": 9, "max_structures": 3}, "max_atoms must be a non-negative integer, got -1"),
        ({"max_atoms": 10, "max_edges": 9.0, "max_structures": 3}, "max_edges must be a non-negative integer"),
        ({"max_atoms": 10, "max_edges": 9, "max_structures": True}, "max_structures must be a non-negative integer"),
    ],
)
def test_budgets_that_do_not_fit_are_errors(budget: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        pad_batch(_two(), **budget)


def test_padding_twice_is_an_error() -> None:
    padded = pad_batch(_two(), max_atoms=10, max_edges=9, max_structures=4)
    with pytest.raises(ValueError, match="already padded"):
        pad_batch(padded, max_atoms=12, max_edges=9, max_structures=5)


# -- a small energy model -------------------------------------------------------------------------------
CUTOFF = 1.5


class EnergyModel(nn.Module):
    """Atomic-number embedding, one message-passing step within a smooth cutoff, per-atom readout, sum-pooled."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, width)
        self.message = nn.Linear(width, width)
        self.readout = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, 1))

    def forward(
        self, z: torch.Tensor, pos: torch.Tensor, edges: torch.Tensor, batch_idx: torch.Tensor, n_graphs: int
    ) -> torch.Tensor:
        h = self.embed(z)
        src, dst = edges[:, 0], edges[:, 1]
        r2 = (pos[dst] - pos[src]).pow(2).sum(-1)
        weight = torch.clamp(1 - r2 / CUTOFF**2, min=0).pow(2)  # zero beyond the cutoff, smooth at it
        h = h + torch.zeros_like(h).index_add_(0, dst, self.message(h)[src] * weight[:, None])
        per_atom = self.readout(h).squeeze(-1)
        return torch.zeros(n_graphs, dtype=pos.dtype, device=pos.device).index_add_(0, batch_idx.long(), per_atom)


def _loss_terms(
    model: EnergyModel,
    z: torch.Tensor,
    pos: torch.Tensor,
    edges: torch.Tensor,
    batch_idx: torch.Tensor,
    target: torch.Tensor,
    structure_mask: torch.Tensor,
    num_real_structures: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-structure energies and the MSE over real structures, from tensors alone."""
    energy = model(z, pos, edges, batch_idx, target.shape[0])
    error = torch.where(structure_mask, (energy - target.squeeze(-1)).pow(2), 0.0)
    return energy, error.sum() / num_real_structures


def _model_inputs(batch: Batch) -> tuple[torch.Tensor, ...]:
    """What the model reads; an unpadded batch is all real."""
    if batch.padding is None:
        mask = torch.ones(batch.num_graphs, dtype=torch.bool, device=batch.device)
        num_real_structures = torch.tensor(batch.num_graphs, device=batch.device)
    else:
        mask, num_real_structures = batch.padding.structure_mask, batch.padding.num_real_structures
    fields = (batch.atomic_numbers, batch.positions, batch.neighbor_list, batch.batch_idx, batch.energy)
    return (*fields, mask, num_real_structures)


def _loss_and_forces(model: EnergyModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    z, pos, edges, batch_idx, target, mask, num_real_structures = _model_inputs(batch)
    pos = pos.clone().requires_grad_(True)
    energy, loss = _loss_terms(model, z, pos, edges, batch_idx, target, mask, num_real_structures)
    (forces,) = torch.autograd.grad(-energy.sum(), pos)
    return energy, loss, forces


@pytest.mark.parametrize("device", DEVICES)
def test_energy_model_sees_no_padding(device: str) -> None:
    torch.manual_seed(0)
    model = EnergyModel().to(device)
    within_cutoff = 0
    for batch in _batches(device):
        padded = pad_batch(batch, **BUDGET)
        energy, loss, forces = _loss_and_forces(model, batch)
        energy_p, loss_p, forces_p = _loss_and_forces(model, padded)
        torch.testing.assert_close(loss_p, loss)
        torch.testing.assert_close(energy_p[: batch.num_graphs], energy)
        torch.testing.assert_close(forces_p[: batch.num_nodes], forces)
        assert torch.isfinite(loss_p) and torch.isfinite(forces_p).all()
        pos = batch.positions
        r2 = (pos[batch.neighbor_list[:, 1]] - pos[batch.neighbor_list[:, 0]]).pow(2).sum(-1)
        within_cutoff += int((r2 < CUTOFF**2).sum())
    assert within_cutoff > 100  # the message-passing step does act on the real atoms


def _count_compiles(batches: list[Batch], model: EnergyModel) -> int:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(_loss_terms, backend="aot_eager", dynamic=False, fullgraph=True)
    for batch in batches:
        _, loss = step(model, *_model_inputs(batch))
        loss.backward()
    return int(counters["stats"]["unique_graphs"])


@pytest.mark.parametrize("device", DEVICES)
def test_padded_batches_compile_once(device: str) -> None:
    torch.manual_seed(0)
    model = EnergyModel().to(device)
    batches = _batches(device)
    assert len({b.num_nodes for b in batches}) == len(batches) >= 8
    padded = [pad_batch(b, **BUDGET) for b in batches]
    with torch._dynamo.config.patch(recompile_limit=64):
        try:
            assert _count_compiles(padded, model) == 1
            unpadded = _count_compiles(batches, model)
        finally:
            torch._dynamo.reset()
    print(f"graphs compiled over {len(batches)} batches: padded 1, unpadded {unpadded}")  # for comparison only


@pytest.mark.gpu
def test_padding_does_not_synchronise() -> None:
    batches = _batches("cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        padded = [pad_batch(b, **BUDGET) for b in batches]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(p.positions.is_cuda for p in padded)


@pytest.mark.gpu
def test_padding_moves_to_the_gpu() -> None:
    pinned = pad_batch(_two(), max_atoms=10, max_edges=9, max_structures=4).pin_memory()
    assert pinned.padding is not None and pinned.padding.atom_mask.is_pinned()
    moved = pinned.to("cuda", non_blocking=True)
    assert moved.padding is not None and moved.padding.atom_mask.is_cuda and moved.padding.num_real_structures.is_cuda
    assert moved.padding.structure_mask.tolist() == [True, True, False, False]


@pytest.mark.dali
def test_a_whole_epoch_of_the_loaders_padded_batches_compiles_once(small_store: Path) -> None:
    from dali_alchemi import DALIDataLoader

    options = {"max_atoms": 601, "max_edges": 3001, "num_workers": 0, "device": "cpu", "seed": 4}
    with DALIDataLoader(small_store, pad=True, **options) as loader:
        padded = list(loader)
    with DALIDataLoader(small_store, **options) as loader:
        ragged = list(loader)
    assert len(padded) == len(ragged) >= 10
    torch.manual_seed(0)
    model = EnergyModel()
    with torch._dynamo.config.patch(recompile_limit=64):
        try:
            assert _count_compiles(padded, model) == 1
            unpadded = _count_compiles(ragged, model)
        finally:
            torch._dynamo.reset()
    assert unpadded > 1
    print(f"graphs compiled over an epoch of {len(padded)} loader batches: padded 1, unpadded {unpadded}")
