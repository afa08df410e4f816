"""The checks of a store's decoded arrays, in numpy: pointers, masks and neighbor lists.

:mod:`dali_alchemi.store.check.verify` decodes the arrays and hands each block to these checks, which
record what is wrong as :class:`Problem` records (array, chunk key, structure) in :class:`Findings`.
Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["Findings", "OnBlock", "Problem", "mask_check", "neighbor_check", "owners", "pointer_ok", "row_owner"]


OnBlock = Callable[[int, "NDArray[Any]", str], None]
"""Called with (first row, decoded rows, chunk key) for every block of an array that decoded."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a store: what kind, a message, and where (array, chunk key, structure)."""

    kind: str
    """``journal``, ``format``, ``missing-array``, ``missing-chunk``, ``corrupt-chunk``, ``no-checksum``,
    ``shape``, ``pointer``, ``mask`` or ``neighbor-list``."""
    message: str
    array: str | None = None
    chunk: str | None = None
    sample: int | None = None
    """The structure's physical index (deleted ones counted), where one is concerned."""


@dataclass
class Findings:
    """Problems found so far: at most ``limit`` listed, the rest counted; each (array, chunk, kind,
    sample) once."""

    limit: int
    problems: list[Problem] = field(default_factory=list)
    left_out: int = 0
    reported: set[tuple[str | None, str | None, str, int | None]] = field(default_factory=set)

    def add(self, kind: str, message: str, *, array: str | None = None, chunk: str | None = None,
            sample: int | None = None) -> None:  # fmt: skip
        if chunk is not None:
            if (array, chunk, kind, sample) in self.reported:
                return  # a shard index read once per block of its shard is one problem
            self.reported.add((array, chunk, kind, sample))
        if len(self.problems) >= self.limit:
            self.left_out += 1
            return
        self.problems.append(Problem(kind=kind, message=message, array=array, chunk=chunk, sample=sample))


def owners(first: int, last: int, ptr: NDArray[np.int64] | None, n_samples: int) -> tuple[str, int | None]:
    """Text naming the structures that own rows ``first..last``, and the first of them."""
    if ptr is None:
        if n_samples < 0:
            return f" (rows {first}-{last})", None
        return f" (rows {first}-{last}: structures {first}-{min(last, n_samples - 1)})", first
    lo, hi = (int(v) for v in np.searchsorted(ptr, [first, last], side="right") - 1)
    return f" (rows {first}-{last}: structures {lo}-{hi}, physical indices)", lo


def row_owner(ptr: NDArray[np.int64], first: int, count: int) -> NDArray[np.int64]:
    """The structure that owns each of rows ``first .. first + count`` under pointer ``ptr`` (rows past
    the pointer's end are given to the last structure)."""
    stop = first + count
    lo, hi = (int(v) for v in np.searchsorted(ptr, [first, max(first, stop - 1)], side="right") - 1)
    hi = min(max(hi, lo), ptr.size - 2)
    counts = np.asarray(np.diff(np.clip(ptr[lo : hi + 2], first, stop)), dtype=np.int64)
    owner = np.repeat(np.arange(lo, hi + 1, dtype=np.int64), counts)
    if owner.size < count:
        owner = np.concatenate([owner, np.full(count - owner.size, ptr.size - 2, dtype=np.int64)])
    return owner


def pointer_ok(name: str, ptr: NDArray[Any], n: int, found: Findings) -> bool:
    path = f"meta/{name}"
    if ptr.size != n + 1:
        found.add("pointer", f"{path} has {ptr.size} entries; expected {n + 1} for {n} samples in samples_mask",
                  array=path)  # fmt: skip
        return False
    if ptr.dtype.kind not in "iu":
        found.add("pointer", f"{path} has dtype {ptr.dtype}; expected integers", array=path)
        return False
    ok = True
    if int(ptr[0]) != 0:
        found.add("pointer", f"{path} starts at {int(ptr[0])}, not 0", array=path, sample=0)
        ok = False
    for k in np.flatnonzero(np.diff(ptr.astype(np.int64)) < 0)[: found.limit].tolist():
        found.add("pointer", f"{path} decreases at sample {k}: entry {k + 1} ({int(ptr[k + 1])}) < entry {k} "
                  f"({int(ptr[k])})", array=path, sample=int(k))  # fmt: skip
        ok = False
    return ok


def mask_check(path: str, ptr: NDArray[np.int64], samples_mask: NDArray[np.bool_], found: Findings) -> OnBlock:
    """Rows of live structures must be True in an atoms/edges mask, rows of deleted ones False."""

    def check(first: int, data: NDArray[Any], key: str) -> None:
        owner = row_owner(ptr, first, data.shape[0])
        wrong = np.flatnonzero(data.astype(np.bool_) != samples_mask[np.clip(owner, 0, samples_mask.size - 1)])
        for sample in np.unique(owner[wrong])[: found.limit].tolist():
            state = "live" if samples_mask[sample] else "deleted"
            found.add("mask", f"{path} disagrees with samples_mask for {state} sample {sample}", array=path,
                      chunk=key, sample=int(sample))  # fmt: skip

    return check


def neighbor_check(
    path: str, atoms_ptr: NDArray[np.int64], edges_ptr: NDArray[np.int64], mask: NDArray[np.bool_], found: Findings
) -> OnBlock:
    """Every stored (store-global) index of a live structure's edges must be one of its own atom rows."""

    def check(first: int, data: NDArray[Any], key: str) -> None:
        owner = np.clip(row_owner(edges_ptr, first, data.shape[0]), 0, mask.size - 1)
        lo, hi = atoms_ptr[owner], atoms_ptr[owner + 1]
        values = data.reshape(data.shape[0], -1).astype(np.int64)
        bad = mask[owner] & ((values < lo[:, None]) | (values >= hi[:, None])).any(axis=1)
        rows = np.flatnonzero(bad)
        samples, at = np.unique(owner[rows], return_index=True)
        for sample, row in zip(samples[: found.limit].tolist(), rows[at][: found.limit].tolist(), strict=True):
            found.add("neighbor-list", f"sample {sample}: {path} row {first + row} holds {values[row].tolist()}, "
                      f"outside the sample's atom rows [{int(atoms_ptr[sample])}, {int(atoms_ptr[sample + 1])})",
                      array=path, chunk=key, sample=int(sample))  # fmt: skip

    return check
