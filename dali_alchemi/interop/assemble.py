"""From converted structures to store chunks, with the field set decided over the whole input.

``convert`` cannot know which fields a stream of structures has until it has seen the last one
(ASE's g2 collection gives ``initial_magmoms`` to 43 of its 162 molecules, the first of them the
fourth). So it works in two steps:

1. :class:`Spool` takes each chunk of extracted structures, keeps a census of every field (level,
   trailing shape, dtype, how many structures have it) and writes the chunk's values to a spool
   directory on disk, one ``.npy`` file per field, in the values' own dtypes.
2. :func:`decide` applies the ``missing`` policy to the census, and :meth:`Spool.chunks` reads the
   chunks back as :class:`~dali_alchemi.store.format.packed.PackedSamples` with exactly the decided fields,
   filled where a structure lacks one, and cast to the stored dtypes once per chunk, with a check of
   what float32 loses.

Policies for a field that only some structures have (``missing=``):

- ``"error"`` (the default): a :class:`~dali_alchemi.errors.SampleDataError` naming every such
  field, how many structures lack it and the first of them; nothing is written. ``convert`` refuses
  earlier still, at the first structure whose set of fields differs from the first structure's.
- ``"drop"``: the field is left out, and the report says why.
- ``"fill"``: the field is kept; structures without it get the fill value of its dtype (NaN for
  floats, -1 for signed integers, the largest value for unsigned ones, ``False`` for booleans), and
  a custom system-level boolean field ``<name>_present`` says which structures had it. The mask is
  what to test: NaN is unambiguous for floats, but -1 and ``False`` can be real values.

A field whose level or trailing shape differs between structures cannot be one array: it is an
error under ``"error"`` and dropped (with the reason) under the other two policies.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from dali_alchemi.errors import PrecisionLossWarning, SampleDataError
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.packed import PackedSamples

if TYPE_CHECKING:
    from numpy.typing import DTypeLike, NDArray

    from dali_alchemi.interop.ase_fields import Extracted
    from dali_alchemi.types import Level

__all__ = [
    "DEFAULT_TOLERANCE", "GEOMETRY", "MISSING_POLICIES", "PRESENT_SUFFIX", "REQUIRED", "Decision",
    "FieldCensus", "MissingPolicy", "PrecisionLoss", "Spool", "decide", "fill_value", "to_float32",
    "warn_precision"
]


MissingPolicy = Literal["error", "fill", "drop"]
MISSING_POLICIES: tuple[MissingPolicy, ...] = ("error", "fill", "drop")
PRESENT_SUFFIX = "_present"
DEFAULT_TOLERANCE = 1e-4
"""Largest change float32 may make to a value, in the value's own units (0.1 meV for energies in eV),
before :class:`~dali_alchemi.errors.PrecisionLossWarning` is issued."""
REQUIRED = ("atomic_numbers", "positions")
GEOMETRY = frozenset({"cell"})
"""System-level floats stored like the per-atom arrays: the cell is used in arithmetic with positions."""


def fill_value(dtype: np.dtype[Any]) -> Any:
    """What a structure without a field gets under ``missing="fill"`` (see the module docstring)."""
    if dtype.kind == "f":
        return np.nan
    if dtype.kind == "i":
        return -1
    if dtype.kind == "u":
        return np.iinfo(dtype).max
    return False


@dataclass(slots=True)
class FieldCensus:
    """What the input holds under one name: its level, trailing shape and dtype, and who has it."""

    level: Level
    trailing: tuple[int, ...]
    dtype: np.dtype[Any]
    present: int = 0
    first_missing: int | None = None
    conflict: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The fields to store (level and dtype), the ones filled (with how many structures lack each),
    and the ones dropped (with why)."""

    kept: dict[str, tuple[Level, np.dtype[Any]]]
    filled: dict[str, int]
    dropped: dict[str, str]

    @property
    def custom(self) -> dict[str, Level]:
        """Fields that go to ``custom/``: every one outside nvalchemi's key sets, or at another level."""
        return {name: level for name, (level, _) in self.kept.items() if layout.default_level(name) != level}


@dataclass(slots=True)
class PrecisionLoss:
    """What casting one field to float32 changed: values moved beyond the tolerance, and the worst move."""

    over: int = 0
    worst: float = 0.0


def to_float32(values: NDArray[Any], name: str, tolerance: float, loss: dict[str, PrecisionLoss]) -> NDArray[Any]:
    """``values`` as float32, counting in ``loss[name]`` the values that move by more than ``tolerance``."""
    narrow = values.astype(np.float32)
    if values.dtype.itemsize > 4 and values.size:
        with np.errstate(invalid="ignore"):
            moved = np.abs(narrow.astype(values.dtype) - values)
        over = int(np.count_nonzero(moved > tolerance))  # NaN compares False: fill values never count
        if over:
            entry = loss.setdefault(name, PrecisionLoss())
            entry.over += over
            entry.worst = max(entry.worst, float(np.nanmax(moved)))
    return narrow


def warn_precision(loss: dict[str, PrecisionLoss], tolerance: float) -> None:
    """One :class:`PrecisionLossWarning` per field that float32 changed beyond ``tolerance``."""
    for name, entry in loss.items():
        warnings.warn(
            f"Storing {name!r} as float32 changed {entry.over:,} values by more than {tolerance:g} "
            f"(at most {entry.worst:.3g}); store it as float64 to keep them",
            PrecisionLossWarning,
            stacklevel=3,
        )


class Spool:
    """Extracted chunks on local disk, and the census of their fields, until the whole input is seen."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.census: dict[str, FieldCensus] = {}
        self.structures = 0
        self.chunk_sizes: list[int] = []
        self._ids: dict[str, int] = {}
        directory.mkdir(parents=True, exist_ok=False)

    def _path(self, chunk: int, what: str) -> Path:
        return self.directory / f"{chunk:07d}-{what}.npy"

    def add(self, chunk: Sequence[Extracted]) -> None:
        """Record one chunk: its counts, and per field the values of the structures that have it."""
        index, start, m = len(self.chunk_sizes), self.structures, len(chunk)
        counts = np.array([(e.n_atoms, e.n_edges) for e in chunk], dtype=np.int64).reshape(m, 2)
        np.save(self._path(index, "counts"), counts)
        names = dict.fromkeys(name for e in chunk for name in e.fields)
        for name in (*self.census, *(n for n in names if n not in self.census)):
            present = np.fromiter((name in e.fields for e in chunk), dtype=np.bool_, count=m)
            self._count(name, present, start)
            parts = [e.fields[name] for e in chunk if name in e.fields]
            entry = self.census.get(name)
            if not parts or (entry is not None and entry.conflict is not None):
                continue
            conflict = self._conflict(name, parts, present, start)
            if conflict is not None:
                self.census[name].conflict = conflict
                continue
            values = np.concatenate([arr for _, arr in parts])
            entry = self.census[name]
            entry.dtype = np.result_type(entry.dtype, values.dtype)
            fid = self._ids.setdefault(name, len(self._ids))
            np.save(self._path(index, f"{fid}-values"), values)
            if not present.all():
                np.save(self._path(index, f"{fid}-present"), present)
        self.chunk_sizes.append(m)
        self.structures += m

    def _count(self, name: str, present: NDArray[np.bool_], start: int) -> None:
        entry = self.census.get(name)
        if entry is None:  # first seen here; _conflict sets its level and shape from its first values
            self.census[name] = entry = FieldCensus(level="atom", trailing=(), dtype=np.dtype(np.bool_))
            entry.first_missing = 0 if start > 0 or not present[0] else None
        entry.present += int(present.sum())
        if not present.all() and entry.first_missing is None:
            entry.first_missing = start + int(np.argmin(present))

    def _conflict(
        self, name: str, parts: list[tuple[Level, NDArray[Any]]], present: NDArray[np.bool_], start: int
    ) -> str | None:
        entry = self.census[name]
        if name not in self._ids:  # the first values seen: they set the form
            entry.level, entry.trailing = parts[0][0], parts[0][1].shape[1:]
        forms = [(level, arr.shape[1:]) for level, arr in parts]
        if set(forms) == {(entry.level, entry.trailing)}:
            return None
        k = next(k for k, form in enumerate(forms) if form != (entry.level, entry.trailing))
        owner = start + int(np.flatnonzero(present)[k])
        return (
            f"{entry.level} level with rows of shape {entry.trailing} in earlier structures, "
            f"{forms[k][0]} level with rows of shape {forms[k][1]} in structure {owner}"
        )

    # -- the second step ---------------------------------------------------------------------------
    def chunks(
        self,
        decision: Decision,
        *,
        float_dtype: DTypeLike,
        system_float_dtype: DTypeLike,
        tolerance: float,
        loss: dict[str, PrecisionLoss],
    ) -> Iterator[PackedSamples]:
        """Each spooled chunk with exactly ``decision``'s fields, filled and cast (see the module doc)."""
        levels: dict[str, Level] = {name: level for name, (level, _) in decision.kept.items()}
        levels.update({f"{name}{PRESENT_SUFFIX}": "system" for name in decision.filled})
        for index, m in enumerate(self.chunk_sizes):
            counts = np.load(self._path(index, "counts"))
            rows = {"atom": counts[:, 0], "edge": counts[:, 1], "system": np.ones(m, dtype=np.int64)}
            fields: dict[str, NDArray[Any]] = {}
            for name, (level, dtype) in decision.kept.items():
                fid = self._ids[name]
                values_path, present_path = self._path(index, f"{fid}-values"), self._path(index, f"{fid}-present")
                present = (
                    np.load(present_path) if present_path.exists() else np.full(m, values_path.exists(), dtype=bool)
                )
                values = np.load(values_path) if values_path.exists() else None
                trailing = self.census[name].trailing
                if present.all() and values is not None:
                    full = values.astype(dtype, copy=False)
                else:
                    full = np.full((int(rows[level].sum()), *trailing), fill_value(dtype), dtype=dtype)
                    if values is not None:
                        full[np.repeat(present, rows[level])] = values
                if name in decision.filled:
                    fields[f"{name}{PRESENT_SUFFIX}"] = present
                if dtype.kind == "f":
                    narrow = np.dtype(float_dtype if level != "system" or name in GEOMETRY else system_float_dtype)
                    full = to_float32(full, name, tolerance, loss) if narrow == np.float32 else full.astype(narrow)
                fields[name] = full
            yield PackedSamples.from_fields(fields, levels, counts[:, 0].copy(), counts[:, 1].copy())


def decide(census: dict[str, FieldCensus], structures: int, missing: MissingPolicy) -> Decision:
    """The fields to store, given the census of the whole input and the ``missing`` policy.

    Raises
    ------
    SampleDataError
        Under ``missing="error"``, naming every field that some structures lack or that cannot be one
        array; under any policy, if a ``<name>_present`` mask would take the name of a field.
    """
    kept: dict[str, tuple[Level, np.dtype[Any]]] = {}
    filled: dict[str, int] = {}
    dropped: dict[str, str] = {}
    problems: list[str] = []
    for name, entry in census.items():
        lacking = structures - entry.present
        if entry.conflict is not None:
            problems.append(f"{name!r} cannot be one array: {entry.conflict}")
            dropped[name] = f"cannot be one array: {entry.conflict}"
        elif lacking and name not in REQUIRED:
            where = (
                f"missing from {lacking:,} of {structures:,} structures (the first: structure {entry.first_missing})"
            )
            problems.append(f"{name!r} is {where}")
            if missing == "fill":
                kept[name] = (entry.level, entry.dtype)
                filled[name] = lacking
            else:
                dropped[name] = where
        else:
            kept[name] = (entry.level, entry.dtype)
    if problems and missing == "error":
        raise SampleDataError(
            "The structures do not all have the same fields: " + "; ".join(problems) + ". Choose what to do with "
            "missing='fill' (NaN, -1 or False, with a <name>_present mask) or missing='drop' (--missing on the "
            "command line); nothing was written"
        )
    taken = sorted(f"{name}{PRESENT_SUFFIX}" for name in filled if f"{name}{PRESENT_SUFFIX}" in census)
    if taken:
        raise SampleDataError(f"Cannot add the masks of filled fields: {taken} are already field names")
    return Decision(kept=kept, filled=filled, dropped=dropped)
