"""The work units of a parallel conversion: an input file's structures ``start:stop``, each converted into
a part store of its own, and the reports they send back.

Counting and ranged reads go through :func:`count_input` and :func:`read_unit`, which hand them to
:mod:`dali_alchemi.interop.ase_sources`, the one place that knows how each format is counted and read.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dali_alchemi.errors import ConfigError
from dali_alchemi.interop.ase_io import ConversionReport
from dali_alchemi.interop.ase_sources import count_structures, read_structures
from dali_alchemi.interop.assemble import PrecisionLoss

if TYPE_CHECKING:
    from ase import Atoms

__all__ = [
    "DEFAULT_PART_SIZE", "UNITS_PER_WORKER", "WorkUnit", "count_input", "merge_reports", "part_size_for",
    "read_unit", "report_from_dict", "report_to_dict", "split_units"
]  # fmt: skip

DEFAULT_PART_SIZE = 100_000
"""The most structures a part holds unless ``part_size`` says otherwise."""
UNITS_PER_WORKER = 2
"""Units per worker when the part size is left to the job: enough to even out units of unequal cost."""


@dataclass(frozen=True, slots=True)
class WorkUnit:
    """Structures ``start:stop`` of input ``input`` (its ``path``), converted into the part store ``name``.

    The last unit of an input (``to_end``) reads to the end of the file, so that structures the count
    missed are found (and refused) rather than left out.
    """

    name: str
    input: int
    path: str
    start: int
    stop: int
    to_end: bool = False

    @property
    def structures(self) -> int:
        """How many structures the unit holds."""
        return self.stop - self.start

    def describe(self) -> str:
        """The unit in messages: its part and where its structures come from."""
        return f"{self.name} ({self.path} structures {self.start}:{self.stop})"


def count_input(path: str | Path) -> int:
    """How many structures the file ``path`` holds (:func:`~dali_alchemi.interop.ase_sources.count_structures`:
    frame headers for (ext)xyz, the row count of a database, else a pass of ASE's reader)."""
    return count_structures(path)


def read_unit(path: str | Path, start: int, stop: int | None) -> Iterator[Atoms]:
    """Structures ``start:stop`` of ``path`` (``stop=None``: to the end), as
    :func:`~dali_alchemi.interop.ase_sources.read_structures` reads a range (a database row by row with its
    key-value pairs and data)."""
    return read_structures(path, index=f"{start}:{'' if stop is None else stop}")


def part_size_for(total: int, workers: int) -> int:
    """The part size a job of ``total`` structures on ``workers`` workers gets by default."""
    return max(1, min(DEFAULT_PART_SIZE, math.ceil(total / (UNITS_PER_WORKER * max(workers, 1)))))


def split_units(paths: Sequence[str], counts: Sequence[int], part_size: int) -> list[WorkUnit]:
    """Every input cut into units of at most ``part_size`` structures, as equal as its count allows, in
    input order (so the parts in order are the structures in the order a one-process convert writes them).

    Raises
    ------
    ConfigError
        If ``part_size`` is below 1.
    """
    if part_size < 1:
        raise ConfigError(f"part_size must be >= 1 (structures per part), got {part_size}")
    units: list[WorkUnit] = []
    for k, (path, n) in enumerate(zip(paths, counts, strict=True)):
        pieces = math.ceil(n / part_size)
        bounds = [i * n // pieces for i in range(pieces + 1)] if pieces else []
        for start, stop in itertools.pairwise(bounds):
            units.append(WorkUnit(f"part-{len(units):05d}", k, path, start, stop, to_end=stop == n))
    return units


def report_to_dict(report: ConversionReport) -> dict[str, Any]:
    """A conversion report as JSON (for the manifest, and to travel back from a worker)."""
    out = asdict(report)
    out["dropped"] = dict(report.dropped)
    out["precision"] = {name: [loss.over, loss.worst] for name, loss in report.precision.items()}
    return out


def report_from_dict(data: dict[str, Any]) -> ConversionReport:
    """The inverse of :func:`report_to_dict`."""
    values = dict(data)
    values["dropped"] = Counter(values["dropped"])
    values["precision"] = {name: PrecisionLoss(int(o), float(w)) for name, (o, w) in values["precision"].items()}
    return ConversionReport(**values)


def merge_reports(reports: Sequence[ConversionReport]) -> ConversionReport:
    """The report of the whole job: counts summed, fields in the first part's order, losses combined."""
    total = ConversionReport()
    for report in reports:
        total.structures += report.structures
        total.atoms += report.atoms
        total.edges += report.edges
        for name, level in report.fields.items():
            total.fields.setdefault(name, level)
        total.custom = sorted(set(total.custom) | set(report.custom))
        total.dropped.update(report.dropped)
        for key, why in report.dropped_reasons.items():
            total.dropped_reasons.setdefault(key, why)
        for counts, add in ((total.filled, report.filled), (total.lacking, report.lacking)):
            for name, n in add.items():
                counts[name] = counts.get(name, 0) + n
        for name, loss in report.precision.items():
            entry = total.precision.setdefault(name, PrecisionLoss())
            entry.over += loss.over
            entry.worst = max(entry.worst, loss.worst)
    return total
