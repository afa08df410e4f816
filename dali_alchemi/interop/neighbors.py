"""Radius-cutoff neighbor lists with periodic images, vectorised with numpy.

For one structure, every pair (i, j) and lattice image S with ``|r_j + S @ cell - r_i| < cutoff`` is an
edge, except an atom with itself in the home cell. The images searched along a periodic axis are
those within ``ceil(cutoff / d)`` cells, where ``d`` is the spacing of the lattice planes across that
axis, so no neighbor is missed for any cell shape. Distances are computed for blocks of rows at a
time, so memory stays bounded for large structures; there is no Python loop per atom.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

BLOCK_BYTES = 64 << 20
"""Memory for one block of candidate displacement vectors."""


def _complete_lattice(cell: NDArray[np.float64], pbc: NDArray[np.bool_]) -> NDArray[np.float64]:
    """The cell with zero vectors along non-periodic axes replaced by unit normals (a slab's empty third
    vector, say), so the plane spacing of the periodic axes is defined."""
    lattice = cell.copy()
    for axis in range(3):
        if not pbc[axis] and np.linalg.norm(lattice[axis]) < 1e-12:
            others = [lattice[k] for k in range(3) if k != axis]
            normal = np.cross(others[0], others[1])
            if np.linalg.norm(normal) < 1e-12:  # fewer than two usable vectors: any free direction will do
                normal = np.eye(3)[np.argmin(np.abs(others[0]) + np.abs(others[1]))]
            lattice[axis] = normal / np.linalg.norm(normal)
    if abs(float(np.linalg.det(lattice))) < 1e-12:
        raise ValueError("a periodic structure needs a cell of non-zero volume along its periodic axes")
    return lattice


def image_offsets(cell: NDArray[np.floating], pbc: NDArray[np.bool_], cutoff: float) -> NDArray[np.int64]:
    """Integer lattice offsets ``[K, 3]`` that can hold a neighbor within ``cutoff`` (the home cell first)."""
    reach = np.zeros(3, dtype=np.int64)
    if np.any(pbc):
        lattice = _complete_lattice(np.asarray(cell, dtype=np.float64), pbc)
        reciprocal = np.linalg.inv(lattice).T  # rows: reciprocal vectors; 1/|b_i| is the plane spacing
        spacing = 1.0 / np.linalg.norm(reciprocal, axis=1)
        reach = np.where(pbc, np.ceil(cutoff / spacing).astype(np.int64), 0)
    axes = [np.arange(-n, n + 1, dtype=np.int64) for n in reach]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    home = np.flatnonzero((grid == 0).all(axis=1))[0]
    return np.concatenate([grid[home : home + 1], np.delete(grid, home, axis=0)])


def radius_graph(
    positions: NDArray[np.floating], cell: NDArray[np.floating], pbc: NDArray[np.bool_], cutoff: float
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Edges ``[E, 2]`` (sender i, receiver j) and their image offsets ``[E, 3]``.

    The displacement of an edge is ``positions[j] + offsets @ cell - positions[i]``. Edges come sorted by
    sender, then image, then receiver.
    """
    if not math.isfinite(cutoff) or cutoff <= 0:
        raise ValueError(f"cutoff must be a positive number, got {cutoff}")
    pos = np.asarray(positions, dtype=np.float64)
    n = pos.shape[0]
    empty = np.zeros((0, 2), np.int64), np.zeros((0, 3), np.int64)
    if n == 0:
        return empty
    cell64 = np.asarray(cell, dtype=np.float64).reshape(3, 3)
    offsets = image_offsets(cell64, np.asarray(pbc, dtype=bool).reshape(3), cutoff)
    shifts = offsets.astype(np.float64) @ cell64  # [K, 3]
    targets = (pos[None, :, :] + shifts[:, None, :]).reshape(-1, 3)  # [K * n, 3]: image k of atom j
    rows_per_block = max(1, BLOCK_BYTES // (8 * targets.shape[0]))
    senders, receivers, images = [], [], []
    cutoff2 = cutoff * cutoff
    target_norms = (targets * targets).sum(axis=1)
    for start in range(0, n, rows_per_block):
        block = pos[start : start + rows_per_block]
        # |t - b|^2 = |t|^2 + |b|^2 - 2 b.t, one matrix product per block
        d2 = target_norms[None, :] + (block * block).sum(axis=1)[:, None] - 2.0 * (block @ targets.T)  # [rows, K * n]
        hit = d2 < cutoff2
        rows = np.arange(start, start + block.shape[0])
        hit[rows - start, rows] = False  # an atom is not its own neighbor in the home cell (image 0)
        i, flat = np.nonzero(hit)
        senders.append(i + start)
        images.append(flat // n)
        receivers.append(flat % n)
    sender, receiver, image = np.concatenate(senders), np.concatenate(receivers), np.concatenate(images)
    edges = np.stack([sender, receiver], axis=1).astype(np.int64)
    return edges, offsets[image]
