"""Type aliases shared across the package, and the one small per-level container; no logic lives here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, TypeAlias, TypeVar

import numpy as np
from numpy.typing import NDArray

__all__ = ["LEVELS", "CountArray", "IndexArray", "Level", "PerLevel", "PtrArray", "T"]


Level: TypeAlias = Literal["atom", "edge", "system"]
"""Where a field lives: one row per atom, one row per edge, or one row per sample (structure)."""

LEVELS: tuple[Level, ...] = ("atom", "edge", "system")

IndexArray: TypeAlias = NDArray[np.int64]
"""A one-dimensional array of sample indices (logical or physical, as the name says)."""

PtrArray: TypeAlias = NDArray[np.int64]
"""A CSR pointer array: int64, length n + 1, first entry 0, non-decreasing."""

CountArray: TypeAlias = NDArray[np.int64]
"""Per-sample row counts (atoms or edges), int64."""


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PerLevel(Generic[T]):
    """One value per level (rows, pointers, bounds, ...), indexed by the level's name.

    The small container that replaces ``{"atom": ..., "edge": ..., "system": ...}`` dicts, so a missing
    or misspelt level is a type error rather than a ``KeyError`` at run time.
    """

    atom: T
    edge: T
    system: T

    def __getitem__(self, level: Level) -> T:
        return getattr(self, level)  # type: ignore[no-any-return]
