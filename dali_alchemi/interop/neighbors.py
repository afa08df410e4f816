"""Radius-cutoff neighbor lists with periodic images, vectorised with numpy.

For one structure, every pair (i, j) and lattice image S with ``|r_j + S @ cell - r_i| < cutoff`` is an
edge, except an atom with itself in the home cell. The images searched along a periodic axis are
those within ``ceil(cutoff / d)`` cells, where ``d`` is the spacing of the lattice planes across that
axis, so no neighbor is missed for any cell shape. Distances are computed for blocks of rows at a
time and images a group at a time, so memory stays bounded for large structures and small cells; a
cutoff reaching more than :data:`MAX_IMAGES` images is refused before any allocation. There is no
Python loop per atom.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from dali_alchemi.errors import ConfigError, SampleDataError

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["BLOCK_BYTES", "MAX_EDGES", "MAX_IMAGES", "ROW_BLOCK_BYTES", "image_offsets", "image_reach", "radius_graph"]


BLOCK_BYTES = 64 << 20
"""Memory for one group of candidate image atoms."""

ROW_BLOCK_BYTES = 64 << 10
"""Memory for one block of squared distances: small enough to stay in the core's cache, and below the
size from which the C allocator maps fresh pages for every array (as it does for all sizes above 64 KiB
under ``MALLOC_TRIM_THRESHOLD_=65536``, which Dask's workers set)."""

MAX_IMAGES = 1 << 20
"""Most periodic images searched for one structure (e.g. 101^3: a cutoff 50 times the plane spacing).
A cell far smaller than the cutoff (a 0.01 A cell, cutoff 5 A: 10^9 images) is refused up front: its
neighbor list alone would not fit in memory."""

MAX_EDGES = 1 << 26
"""Most edges one structure may get (67 million: about 3 GiB of neighbor list, shifts and offsets)."""


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
        raise SampleDataError("a periodic structure needs a cell of non-zero volume along its periodic axes")
    return lattice


def image_reach(cell: NDArray[np.floating], pbc: NDArray[np.bool_], cutoff: float) -> NDArray[np.float64]:
    """Cells searched each way along every axis: ``ceil(cutoff / plane spacing)`` if periodic, else 0.

    As floats, so a cutoff far beyond the plane spacing is counted, never wrapped around an integer.
    """
    if not np.any(pbc):
        return np.zeros(3)
    lattice = _complete_lattice(np.asarray(cell, dtype=np.float64), pbc)
    reciprocal = np.linalg.inv(lattice).T  # rows: reciprocal vectors; 1/|b_i| is the plane spacing
    spacing = 1.0 / np.linalg.norm(reciprocal, axis=1)
    return np.where(pbc, np.ceil(cutoff / spacing), 0.0)


def image_offsets(cell: NDArray[np.floating], pbc: NDArray[np.bool_], cutoff: float) -> NDArray[np.int64]:
    """Integer lattice offsets ``[K, 3]`` that can hold a neighbor within ``cutoff`` (the home cell first).

    Raises
    ------
    SampleDataError
        If more than :data:`MAX_IMAGES` images would be searched (a cell far smaller than the cutoff),
        before anything of that size is allocated.
    """
    reach = image_reach(cell, pbc, cutoff)
    count = math.prod(2.0 * float(r) + 1.0 for r in reach)  # a Python float: inf, never a wrapped integer
    if count > MAX_IMAGES:
        spacing = ", ".join(f"{cutoff / r:.3g}" if r else "-" for r in reach)
        raise SampleDataError(
            f"cutoff {cutoff:g} reaches {count:,.0f} periodic images of this cell (lattice planes about "
            f"{spacing} apart along its axes): more than {MAX_IMAGES:,}, so its neighbor list cannot be built "
            f"in bounded memory; use a smaller cutoff or a supercell of the structure"
        )
    axes = [np.arange(-int(n), int(n) + 1, dtype=np.int64) for n in reach]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    home = np.flatnonzero((grid == 0).all(axis=1))[0]
    return np.concatenate([grid[home : home + 1], np.delete(grid, home, axis=0)])


def radius_graph(
    positions: NDArray[np.floating], cell: NDArray[np.floating], pbc: NDArray[np.bool_], cutoff: float
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Edges ``[E, 2]`` (sender i, receiver j) and their image offsets ``[E, 3]``.

    The displacement of an edge is ``positions[j] + offsets @ cell - positions[i]``. Edges come sorted by
    sender, then image, then receiver. Images are searched a group at a time and atoms a block of rows
    at a time, so the work memory is about :data:`BLOCK_BYTES` whatever the cell and cutoff.

    Raises
    ------
    SampleDataError
        If the cutoff reaches more than :data:`MAX_IMAGES` images, or the structure has more than
        :data:`MAX_EDGES` edges (found while searching, before more memory is taken).
    """
    if not math.isfinite(cutoff) or cutoff <= 0:
        raise ConfigError(f"cutoff must be a positive number, got {cutoff}")
    pos = np.asarray(positions, dtype=np.float64)
    n = pos.shape[0]
    empty = np.zeros((0, 2), np.int64), np.zeros((0, 3), np.int64)
    if n == 0:
        return empty
    cell64 = np.asarray(cell, dtype=np.float64).reshape(3, 3)
    offsets = image_offsets(cell64, np.asarray(pbc, dtype=bool).reshape(3), cutoff)
    shifts = offsets.astype(np.float64) @ cell64  # [K, 3]
    images_per_group = max(1, BLOCK_BYTES // (24 * n))
    senders, receivers, images = [], [], []
    found = 0
    cutoff2 = cutoff * cutoff
    reach_low, reach_high = pos.min(axis=0) - cutoff, pos.max(axis=0) + cutoff
    for first_image in range(0, shifts.shape[0], images_per_group):
        group = shifts[first_image : first_image + images_per_group]
        candidates = (pos[None, :, :] + group[:, None, :]).reshape(-1, 3)  # [k * n, 3]: image k of atom j
        # only image atoms inside the atoms' bounding box grown by the cutoff can be within it of one
        # (the home cell's atoms all are, at their own columns)
        kept = np.flatnonzero(((candidates >= reach_low) & (candidates <= reach_high)).all(axis=1))
        targets = np.ascontiguousarray(candidates[kept].T)  # [3, m]
        rows_per_block = max(1, min(BLOCK_BYTES, ROW_BLOCK_BYTES) // (8 * max(kept.size, 1)))
        for start in range(0, n, rows_per_block):
            block = pos[start : start + rows_per_block]
            # differences axis by axis, not |t|^2 + |b|^2 - 2 b.t: exact near the cutoff, and no BLAS
            # call (whose threads would compete with the other workers of a parallel convert)
            d2 = np.square(block[:, 0, None] - targets[0])
            d2 += np.square(block[:, 1, None] - targets[1])
            d2 += np.square(block[:, 2, None] - targets[2])
            hit = d2 < cutoff2
            if first_image == 0:
                rows = np.arange(start, start + block.shape[0])
                hit[rows - start, rows] = False  # an atom is not its own neighbor in the home cell (image 0)
            i, column = np.nonzero(hit)
            found += i.size
            if found > MAX_EDGES:
                raise SampleDataError(
                    f"cutoff {cutoff:g} gives this structure of {n} atoms more than {MAX_EDGES:,} edges; "
                    f"use a smaller cutoff"
                )
            flat = kept[column]
            senders.append(i + start)
            images.append(first_image + flat // n)
            receivers.append(flat % n)
    sender, receiver, image = np.concatenate(senders), np.concatenate(receivers), np.concatenate(images)
    order = np.lexsort((receiver, image, sender))
    edges = np.stack([sender[order], receiver[order]], axis=1).astype(np.int64)
    return edges, offsets[image[order]]
