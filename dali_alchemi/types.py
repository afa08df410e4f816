"""Type aliases shared across the package; no logic lives here."""

from __future__ import annotations

from typing import Literal, TypeAlias

import numpy as np
from numpy.typing import NDArray

Level: TypeAlias = Literal["atom", "edge", "system"]
"""Where a field lives: one row per atom, one row per edge, or one row per sample (structure)."""

LEVELS: tuple[Level, ...] = ("atom", "edge", "system")

IndexArray: TypeAlias = NDArray[np.int64]
"""A one-dimensional array of sample indices (logical or physical, as the name says)."""

PtrArray: TypeAlias = NDArray[np.int64]
"""A CSR pointer array: int64, length n + 1, first entry 0, non-decreasing."""

CountArray: TypeAlias = NDArray[np.int64]
"""Per-sample row counts (atoms or edges), int64."""
