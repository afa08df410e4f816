"""Row planning for a windowed read: which rows of which row blocks go where in the output.

Pure numpy over pointer arrays; no zarr, no I/O. A window of samples (physical indices, in request
order) becomes, per level, the global rows to read sorted by position in the store together with
their destination in the request-ordered output. Sorted rows make every row block a contiguous slice
of the plan, so each block is decoded once and scattered with one fancy-index assignment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dali_alchemi.csr import concat_aranges

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import CountArray, IndexArray, PtrArray


@dataclass(frozen=True, slots=True)
class LevelPlan:
    """Rows of one level (atom, edge or system) for a window, sorted by row.

    ``rows[k]`` is a global row of the store; ``dest[k]`` its position in the output, which is in
    request order. ``total`` is the output length.
    """

    rows: NDArray[np.int64]
    dest: NDArray[np.int64]
    total: int

    def blocks(self, block_rows: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Row blocks the plan touches (ascending) and the ``[len + 1]`` bounds of each block's slice."""
        if self.rows.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
        block_of_row = self.rows // block_rows
        change = np.empty(block_of_row.size, dtype=np.bool_)
        change[0] = True
        np.not_equal(block_of_row[1:], block_of_row[:-1], out=change[1:])
        starts = np.flatnonzero(change)
        bounds = np.empty(starts.size + 1, dtype=np.int64)
        bounds[:-1] = starts
        bounds[-1] = block_of_row.size
        return block_of_row[starts], bounds


def plan_rows(ptr: PtrArray, physical: IndexArray, order: IndexArray) -> tuple[LevelPlan, CountArray]:
    """Plan the rows of samples ``physical`` (request order) under CSR pointer ``ptr``.

    ``order`` is a stable argsort of ``physical``. Returns the plan and each sample's row count.
    """
    starts = ptr[physical]
    counts = ptr[physical + 1] - starts
    dest_starts = np.cumsum(counts) - counts
    rows = concat_aranges(starts[order], counts[order])
    dest = concat_aranges(dest_starts[order], counts[order])
    return LevelPlan(rows=rows, dest=dest, total=int(counts.sum())), counts


def plan_system_rows(physical: IndexArray, order: IndexArray) -> LevelPlan:
    """Plan of system-level rows: one row per sample, its physical index."""
    return LevelPlan(rows=physical[order], dest=order.astype(np.int64, copy=False), total=int(physical.size))
