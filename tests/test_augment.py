"""Augmentations respect the physics: energies unchanged, vectors and tensors rotate together,
distances preserved, rotations uniform on SO(3), and everything reproducible."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dali_alchemi import AtomicDataZarrReader, Batch
from dali_alchemi.augment import (
    PositionNoise,
    RandomRotation,
    RandomTranslation,
    apply_augmentations,
    batch_generator,
    random_rotations,
)
from dali_alchemi.interop.neighbors import radius_graph


def _crystals(n: int = 6, seed: int = 0) -> Batch:
    """Small random periodic structures with forces, stress, virial, dipole and a periodic neighbor list."""
    rng = np.random.default_rng(seed)
    samples = []
    for k in range(n):
        atoms = int(rng.integers(2, 7))
        cell = np.diag(rng.uniform(3.0, 5.0, 3)) + rng.normal(0, 0.3, (3, 3))
        pbc = np.array([True, True, k % 2 == 0])
        positions = rng.uniform(0, 1, (atoms, 3)) @ cell
        edges, images = radius_graph(positions, cell, pbc, 3.0)
        stress = rng.normal(size=(3, 3))
        samples.append({
            "atomic_numbers": rng.integers(1, 10, atoms), "positions": positions, "forces": rng.normal(size=(atoms, 3)),
            "energy": rng.normal(size=(1, 1)), "cell": cell[None], "pbc": pbc[None], "stress": (stress + stress.T)[None],
            "virial": rng.normal(size=(1, 3, 3)), "dipole": rng.normal(size=(1, 3)),
            "neighbor_list": edges, "neighbor_list_shifts": images, "shifts": images @ cell,
        })  # fmt: skip
    return Batch.from_samples(samples)


def _clone(batch: Batch) -> Batch:
    return Batch.from_packed(batch.to_packed())


def _edge_lengths(batch: Batch) -> torch.Tensor:
    i, j = batch.neighbor_list.long().T
    return (batch.positions[j] + batch.shifts - batch.positions[i]).norm(dim=1)


def test_rotation_keeps_the_physics() -> None:
    before = _crystals()
    after = _clone(before)
    RandomRotation()(after, batch_generator(1, 0, 0, after.device))
    assert torch.equal(after.energy, before.energy)
    assert torch.allclose(_edge_lengths(after), _edge_lengths(before), atol=1e-9)
    assert torch.equal(after.neighbor_list_shifts, before.neighbor_list_shifts)
    for g in range(before.num_graphs):
        lo, hi = int(before.batch_ptr[g]), int(before.batch_ptr[g + 1])
        # recover this structure's rotation from its lattice vectors: cell' = cell R^T
        rot = torch.linalg.solve(before.cell[g], after.cell[g]).T
        assert torch.allclose(rot @ rot.T, torch.eye(3, dtype=rot.dtype), atol=1e-9)
        assert torch.isclose(torch.det(rot), torch.tensor(1.0, dtype=rot.dtype))
        assert torch.allclose(after.positions[lo:hi], before.positions[lo:hi] @ rot.T, atol=1e-9)
        assert torch.allclose(after.forces[lo:hi], before.forces[lo:hi] @ rot.T, atol=1e-9)  # forces rotate too
        assert torch.allclose(after.stress[g], rot @ before.stress[g] @ rot.T, atol=1e-9)
        assert torch.allclose(after.virial[g], rot @ before.virial[g] @ rot.T, atol=1e-9)
        assert torch.allclose(after.dipole[g], rot @ before.dipole[g], atol=1e-9)


def test_rotations_are_uniform_on_so3() -> None:
    rot = random_rotations(
        200_000, batch_generator(3, 0, 0, torch.device("cpu")), device=torch.device("cpu"), dtype=torch.float64
    )
    assert torch.allclose(rot @ rot.transpose(1, 2), torch.eye(3, dtype=torch.float64).expand_as(rot), atol=1e-12)
    assert torch.allclose(torch.det(rot), torch.ones(len(rot), dtype=torch.float64))
    # Haar measure: E[R] = 0, and the image of any axis is uniform on the sphere (each coordinate ~ U[-1, 1])
    assert rot.mean(dim=0).abs().max() < 0.01
    z = rot[:, :, 2]
    counts = torch.histc(z[:, 0], bins=10, min=-1, max=1)
    assert (counts / len(rot) - 0.1).abs().max() < 0.005
    # the rotation angle follows (1 - cos t) / pi on [0, pi]: E[cos t] = -1/2 (i.e. E[trace] = 0)
    assert abs(float(rot.diagonal(dim1=1, dim2=2).sum(dim=1).mean())) < 0.01


def test_translation_moves_only_periodic_structures_and_keeps_distances() -> None:
    before = _crystals()
    before.fields["pbc"] = before.pbc.clone()
    before.fields["pbc"][1] = False  # one structure is not periodic at all
    after = _clone(before)
    RandomTranslation()(after, batch_generator(5, 0, 0, after.device))
    assert torch.allclose(_edge_lengths(after), _edge_lengths(before), atol=1e-9)
    moved = (after.positions - before.positions).norm(dim=1)
    owner = before.batch_idx.long()
    assert (moved[owner == 1] == 0).all() and (moved[owner == 0] > 0).all()
    delta = after.positions - before.positions  # one rigid shift per structure
    for g in range(before.num_graphs):
        rows = delta[owner == g]
        assert torch.allclose(rows, rows[:1].expand_as(rows), atol=1e-12)


def test_noise_and_determinism() -> None:
    base = _crystals()
    pipeline = [RandomRotation(), PositionNoise(0.01), RandomTranslation()]
    a = apply_augmentations(_clone(base), pipeline, seed=7, epoch=2, batch_index=5)
    b = apply_augmentations(_clone(base), pipeline, seed=7, epoch=2, batch_index=5)
    c = apply_augmentations(_clone(base), pipeline, seed=7, epoch=2, batch_index=6)
    assert torch.equal(a.positions, b.positions) and torch.equal(a.forces, b.forces)
    assert not torch.equal(a.positions, c.positions)
    noisy = apply_augmentations(_clone(base), [PositionNoise(0.1)], seed=1, epoch=0, batch_index=0)
    assert 0.08 < float((noisy.positions - base.positions).std()) < 0.12
    with pytest.raises(ValueError, match="sigma must be >= 0"):
        PositionNoise(-1.0)


@pytest.mark.dali
def test_the_loader_augments_reproducibly(small_store: Path) -> None:
    from dali_alchemi import DALIDataLoader

    reader = AtomicDataZarrReader(small_store)
    options = dict(batch_size=32, seed=3, num_workers=0, device="cpu", augmentations=[RandomRotation()])
    with DALIDataLoader(reader, **options) as first, DALIDataLoader(reader, **options) as second:
        rotated = list(first)
        for a, b in zip(rotated, second, strict=True):
            assert torch.equal(a.positions, b.positions)  # same seed, epoch and batch: same rotations
    with DALIDataLoader(reader, batch_size=32, seed=3, num_workers=0, device="cpu") as plain:
        for a, b in zip(rotated, plain, strict=True):
            assert torch.equal(a.energy, b.energy) and not torch.allclose(a.positions, b.positions)
            first_atoms = a.batch_ptr[:-1].long()  # atoms 0 and 1 of every structure
            for x in (a, b):
                x.fields["_d"] = x.positions[first_atoms + 1] - x.positions[first_atoms]
            assert torch.allclose(a["_d"].norm(dim=1), b["_d"].norm(dim=1), atol=1e-5)
            dot_a = (a.forces[first_atoms] * a["_d"]).sum(dim=1)
            dot_b = (b.forces[first_atoms] * b["_d"]).sum(dim=1)
            assert torch.allclose(dot_a, dot_b, atol=1e-4)  # forces turned with the positions


@pytest.mark.gpu
def test_augmentations_on_the_gpu_match_their_cpu_physics() -> None:
    batch = _crystals().to("cuda")
    before = _clone(batch.cpu())
    apply_augmentations(batch, [RandomRotation(), RandomTranslation()], seed=1, epoch=0, batch_index=0)
    assert batch.positions.is_cuda
    lengths = _edge_lengths(batch.cpu())
    assert torch.allclose(lengths, _edge_lengths(before), atol=1e-9)


def test_augmentations_are_checked_when_the_loader_is_built() -> None:
    from dali_alchemi.augment import PositionNoise, check_augmentations

    noise = PositionNoise(0.1)
    assert check_augmentations([noise]) == (noise,)
    with pytest.raises(TypeError, match=r"augmentations\[0\] .* must accept \(batch, generator\)"):
        check_augmentations([lambda b: b])
    with pytest.raises(TypeError, match=r"augmentations\[1\] is not callable"):
        check_augmentations([noise, 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="must be a sequence of augmentations"):
        check_augmentations(noise)  # type: ignore[arg-type]
