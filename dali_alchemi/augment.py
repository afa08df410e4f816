"""Per-structure augmentations applied to a Batch on its own device, with no per-structure Python work.

* :class:`RandomRotation` draws one rotation per structure, uniform on SO(3) (normalised Gaussian
  quaternions), and applies it consistently: vectors (positions, forces, velocities, momenta,
  cartesian edge shifts, dipole) become ``R v``, lattice vectors (the rows of ``cell``) become ``R a``,
  and rank-2 tensors (stress, virial) become ``R S R^T``. Energies, distances and the integer image
  offsets of a neighbor list are unchanged.
* :class:`PositionNoise` adds Gaussian noise to positions.
* :class:`RandomTranslation` moves every atom of a periodic structure by the same random fraction of
  its cell, which changes nothing physical and keeps neighbor lists valid.

Randomness comes from one ``torch.Generator`` per batch, seeded by ``(seed, epoch, batch index)``
(:func:`batch_generator`), so an augmented epoch is reproducible, also after a resume.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from dali_alchemi.errors import ConfigError, ConfigTypeError

if TYPE_CHECKING:
    from dali_alchemi.batch import Batch

__all__ = [
    "LATTICE_FIELDS", "TENSOR_FIELDS", "VECTOR_FIELDS", "Augmentation", "PositionNoise", "RandomRotation",
    "RandomTranslation", "apply_augmentations", "batch_generator", "check_augmentations", "random_rotations"
]


VECTOR_FIELDS = ("positions", "forces", "velocities", "momenta", "shifts", "dipole")
LATTICE_FIELDS = ("cell",)
TENSOR_FIELDS = ("stress", "virial")


class Augmentation(Protocol):
    """Transforms a Batch in place (replacing its tensors), drawing randomness from ``generator``."""

    def __call__(self, batch: Batch, generator: torch.Generator) -> None: ...


def batch_generator(seed: int, epoch: int, batch_index: int, device: torch.device) -> torch.Generator:
    """A generator on ``device`` seeded by ``(seed, epoch, batch_index)`` alone."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, epoch, batch_index]).generate_state(2, np.uint32)
    generator = torch.Generator(device=device)
    generator.manual_seed(int(state[0]) << 32 | int(state[1]))
    return generator


def random_rotations(n: int, generator: torch.Generator, *, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``[n, 3, 3]`` rotation matrices, uniform on SO(3) (Haar measure)."""
    q = torch.randn(n, 4, generator=generator, device=device, dtype=torch.float64)
    w, x, y, z = (q / q.norm(dim=1, keepdim=True)).unbind(dim=1)
    rot = torch.stack(
        [
            1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w),
            2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w),
            2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y),
        ],
        dim=1,
    )  # fmt: skip
    return rot.reshape(n, 3, 3).to(dtype)


def _rows_owner(batch: Batch, level: str) -> torch.Tensor:
    """For each row of a level, the index of its structure (on the batch's device, no sync)."""
    if level == "atom":
        return batch.batch_idx.long()
    structures = torch.arange(batch.num_graphs, device=batch.device)
    if level == "system":
        return structures
    counts = torch.diff(batch.edge_batch_ptr)
    return torch.repeat_interleave(structures, counts, output_size=batch.num_edges)


@dataclass(frozen=True, slots=True)
class RandomRotation:
    """Rotate every structure by its own random rotation, consistently across all its fields."""

    vector_fields: Sequence[str] = VECTOR_FIELDS
    lattice_fields: Sequence[str] = LATTICE_FIELDS
    tensor_fields: Sequence[str] = TENSOR_FIELDS

    def __call__(self, batch: Batch, generator: torch.Generator) -> None:
        dtype = batch["positions"].dtype if "positions" in batch else torch.float32
        rot = random_rotations(batch.num_graphs, generator, device=batch.device, dtype=dtype)
        for name in self.vector_fields:
            if name in batch:
                values = batch.fields[name]
                owner = _rows_owner(batch, batch.levels[name])
                batch.fields[name] = torch.einsum("nij,nj->ni", rot.to(values.dtype)[owner], values)
        for name in self.lattice_fields:
            if name in batch:
                values = batch.fields[name]
                batch.fields[name] = torch.bmm(values, rot.to(values.dtype).transpose(1, 2))
        for name in self.tensor_fields:
            if name in batch:
                values, r = batch.fields[name], rot.to(batch.fields[name].dtype)
                batch.fields[name] = torch.bmm(torch.bmm(r, values), r.transpose(1, 2))


@dataclass(frozen=True, slots=True)
class PositionNoise:
    """Add Gaussian noise of standard deviation ``sigma`` (in position units) to every position."""

    sigma: float

    def __post_init__(self) -> None:
        if self.sigma < 0:
            raise ConfigError(f"sigma must be >= 0, got {self.sigma}")

    def __call__(self, batch: Batch, generator: torch.Generator) -> None:
        positions = batch.fields["positions"]
        noise = torch.randn(positions.shape, generator=generator, device=positions.device, dtype=positions.dtype)
        batch.fields["positions"] = positions + self.sigma * noise


@dataclass(frozen=True, slots=True)
class RandomTranslation:
    """Move each periodic structure by a uniform random fraction of its cell (along periodic axes only)."""

    def __call__(self, batch: Batch, generator: torch.Generator) -> None:
        if "cell" not in batch or "pbc" not in batch:
            return
        positions, cell = batch.fields["positions"], batch.fields["cell"]
        fraction = torch.rand((batch.num_graphs, 3), generator=generator, device=positions.device, dtype=cell.dtype)
        fraction = fraction * batch.fields["pbc"].to(cell.dtype)  # no move along non-periodic axes
        offset = torch.einsum("nk,nkj->nj", fraction, cell).to(positions.dtype)
        batch.fields["positions"] = positions + offset[batch.batch_idx.long()]


def apply_augmentations(
    batch: Batch, augmentations: Sequence[Augmentation], *, seed: int, epoch: int, batch_index: int
) -> Batch:
    """Apply ``augmentations`` in order with the batch's own generator; returns the same Batch."""
    if augmentations:
        generator = batch_generator(seed, epoch, batch_index, batch.device)
        for augmentation in augmentations:
            augmentation(batch, generator)
    return batch


def check_augmentations(augmentations: Sequence[Augmentation]) -> tuple[Augmentation, ...]:
    """``augmentations`` as a tuple, each checked to take ``(batch, generator)``, at construction.

    Raises
    ------
    ConfigTypeError
        Naming the first entry that is not callable with two positional arguments (a one-argument
        ``lambda b: b`` would otherwise fail only at the first batch).
    """
    if callable(augmentations) or isinstance(augmentations, (str, bytes)):
        raise ConfigTypeError(f"augmentations must be a sequence of augmentations, got {augmentations!r}")
    checked = tuple(augmentations)
    for k, augmentation in enumerate(checked):
        if not callable(augmentation):
            raise ConfigTypeError(f"augmentations[{k}] is not callable: {augmentation!r}")
        try:
            inspect.signature(augmentation).bind(None, None)
        except TypeError:
            raise ConfigTypeError(
                f"augmentations[{k}] ({augmentation!r}) must accept (batch, generator), "
                "like dali_alchemi.augment.RandomRotation"
            ) from None
        except ValueError:  # no signature to inspect (some builtins): trust it
            continue
    return checked
