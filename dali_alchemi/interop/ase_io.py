"""ASE in and out: convert ``ase.Atoms`` (extxyz files, ASE databases, trajectories) to a store, and
Batches back to ``ase.Atoms``.

Structures stream through in chunks, so the input is never loaded whole. What each structure holds
is read by :mod:`dali_alchemi.interop.ase_fields` (nvalchemi's fields, the calculator's other
results, per-atom arrays, ``info`` and an ASE database's key-value pairs); which fields the store
gets is decided over the whole input, with an explicit policy for fields only some structures have
(:mod:`dali_alchemi.interop.assemble`). Per-atom and per-edge floats (and the cell) are stored as
``float_dtype`` (float32 by default), per-structure floats (energies, stress, virial, ...) as
``system_float_dtype`` (float64 by default: they are small, and float32 moves a total energy of
-98,765 eV by up to 4 meV); float32 warns when it changes a value by more than ``tolerance``.
``ase`` is imported when these functions run.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.errors import ConfigError, SampleDataError, StoreExistsError, StoreWriteError
from dali_alchemi.interop.ase_fields import Extracted, extract
from dali_alchemi.interop.ase_sources import (
    DATABASE_FORMATS,
    MIN_ATOM_LINE_BYTES,
    XYZ_FORMATS,
    check_xyz_counts,
    count_structures,
    input_files,
    read_structures,
)
from dali_alchemi.interop.assemble import (
    DEFAULT_TOLERANCE,
    MISSING_POLICIES,
    PRESENT_SUFFIX,
    REQUIRED,
    Decision,
    MissingPolicy,
    PrecisionLoss,
    Spool,
    decide,
    warn_precision,
)
from dali_alchemi.store.format.journal import CREATE_PREFIX, sibling
from dali_alchemi.store.format.location import resolve_store
from dali_alchemi.store.write.lock import WriterLock
from dali_alchemi.store.write.writer import AtomicDataZarrWriter

if TYPE_CHECKING:
    from ase import Atoms
    from numpy.typing import DTypeLike

    from dali_alchemi.batch import Batch
    from dali_alchemi.config import WriteConfig
    from dali_alchemi.store.format.location import StoreLike, StoreLocation
    from dali_alchemi.store.format.packed import PackedSamples

__all__ = [
    "DATABASE_FORMATS", "DEFAULT_CHUNK", "MIN_ATOM_LINE_BYTES", "XYZ_FORMATS", "ConversionReport",
    "batch_to_atoms", "check_xyz_counts", "convert", "count_structures", "input_files", "read_structures",
    "refuse_differing_fields", "write_atoms"
]  # fmt: skip


logger = logging.getLogger(__name__)

DEFAULT_CHUNK = 1000
"""Structures converted and written per step."""


@dataclass(slots=True)
class ConversionReport:
    """What a conversion did.

    Attributes
    ----------
    structures, atoms, edges
        Counts written.
    fields
        Every stored field and its level.
    custom
        The fields stored in ``custom/`` (outside nvalchemi's key sets).
    dropped
        Every key that was not stored, with the number of structures that had it.
    dropped_reasons
        Why each key in ``dropped`` was not stored (not numeric, only in some structures, ...).
    filled
        Under ``missing="fill"``: each filled field and how many structures lacked it.
    lacking
        Under ``missing="drop"``: each field left out because some structures lack it, and how many lack it.
    precision
        Each field that float32 changed by more than the tolerance: how many values, and the largest change.
    """

    structures: int = 0
    atoms: int = 0
    edges: int = 0
    fields: dict[str, str] = field(default_factory=dict)
    custom: list[str] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    dropped_reasons: dict[str, str] = field(default_factory=dict)
    filled: dict[str, int] = field(default_factory=dict)
    lacking: dict[str, int] = field(default_factory=dict)
    precision: dict[str, PrecisionLoss] = field(default_factory=dict)


def _extracted(structures: Iterable[Atoms], cutoff: float | None, refuse_early: bool) -> Iterator[Extracted]:
    """Each structure's fields as it is read; with ``refuse_early``, stopping at the first whose set of
    fields differs from the first structure's (see :func:`refuse_differing_fields`)."""
    first: Extracted | None = None
    for index, atoms in enumerate(structures):
        one = extract(atoms, cutoff=cutoff)
        if refuse_early:
            first = first or one
            refuse_differing_fields(first, one, index)
        yield one


def refuse_differing_fields(first: Extracted, other: Extracted, index: int) -> None:
    """Under ``missing="error"``: raise as soon as structure ``index`` holds other fields than structure 0.

    The whole-input census would refuse the same input after reading all of it; a difference in the
    set of fields can never be undone by later structures.

    Raises
    ------
    SampleDataError
        Naming each field one of the two structures has and the other lacks.
    """
    if other.fields.keys() == first.fields.keys():
        return
    only_first = sorted(set(first.fields) - set(other.fields) - set(REQUIRED))
    only_other = sorted(set(other.fields) - set(first.fields) - set(REQUIRED))
    if not only_first and not only_other:
        return
    problems = [f"{name!r} is in structure 0 but not in structure {index}" for name in only_first]
    problems += [f"{name!r} is in structure {index} but not in structure 0" for name in only_other]
    raise SampleDataError(
        "The structures do not all have the same fields: " + "; ".join(problems) + ". Choose what to do with "
        "missing='fill' (NaN, -1 or False, with a <name>_present mask) or missing='drop' (--missing on the "
        f"command line); nothing was written (stopped at structure {index}, before reading the rest)"
    )


def write_atoms(
    structures: Iterable[Atoms],
    store: StoreLike,
    *,
    cutoff: float | None = None,
    float_dtype: DTypeLike = np.float32,
    system_float_dtype: DTypeLike = np.float64,
    missing: MissingPolicy = "error",
    tolerance: float = DEFAULT_TOLERANCE,
    chunk: int = DEFAULT_CHUNK,
    config: WriteConfig | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> ConversionReport:
    """Write an iterable of ``ase.Atoms`` to a new store, ``chunk`` structures at a time.

    The input is read once: each chunk is converted and spooled to disk beside the store, and the
    store is written from the spool once the fields of the whole input are known (``missing``
    decides what happens to a field only some structures have: see
    :mod:`dali_alchemi.interop.assemble`). A local store is built beside its path and renamed into
    place, so a conversion that fails leaves nothing behind (what a killed one left, the next one
    removes, as any writer operation does); another store (a URL, a zarr ``Store``)
    is written only after the whole input converted. ``progress`` is called with ``"read"`` or
    ``"written"`` and the number of structures so far. Issues a
    :class:`~dali_alchemi.errors.PrecisionLossWarning` per field that float32 changed by more than
    ``tolerance`` (in the field's own units).

    Raises
    ------
    StoreExistsError
        If the store exists (a ``FileExistsError``).
    SampleDataError
        If the input is empty, or under ``missing="error"`` if the structures' fields differ: at the first
        structure whose set of fields differs from the first one's, before the rest is read.
    StoreWriteError
        If the operating system refuses a write (a full disk, a read-only file system, no permission),
        naming the store asked for; nothing is left at its path.
    """
    if chunk < 1:
        raise ConfigError(f"chunk must be >= 1, got {chunk}")
    if missing not in MISSING_POLICIES:
        raise ConfigError(f"missing must be one of {', '.join(MISSING_POLICIES)}, got {missing!r}")
    if not tolerance >= 0:
        raise ConfigError(f"tolerance must be >= 0 (the largest change float32 may make unreported), got {tolerance}")
    for name, dtype in (("float_dtype", float_dtype), ("system_float_dtype", system_float_dtype)):
        if np.dtype(dtype) not in (np.float32, np.float64):
            raise ConfigError(f"{name} must be float32 or float64, got {np.dtype(dtype)}")
    location = resolve_store(store, read_only=False, must_exist=False)
    local = location.local_root
    if local is None:
        return _convert(structures, store, location, cutoff, float_dtype, system_float_dtype, missing, tolerance,
                        chunk, config, progress)  # fmt: skip
    local.parent.mkdir(parents=True, exist_ok=True)
    with WriterLock(location, "convert"):  # its spool and build beside the path are its own until it ends
        return _convert(structures, store, location, cutoff, float_dtype, system_float_dtype, missing, tolerance,
                        chunk, config, progress)  # fmt: skip


def _convert(
    structures: Iterable[Atoms], store: StoreLike, location: StoreLocation, cutoff: float | None,
    float_dtype: DTypeLike, system_float_dtype: DTypeLike, missing: MissingPolicy, tolerance: float, chunk: int,
    config: WriteConfig | None, progress: Callable[[str, int], None] | None,
) -> ConversionReport:  # fmt: skip
    """:func:`write_atoms` once its arguments are checked (and a local path's writer lock held)."""
    local = location.local_root
    if local is not None:
        AtomicDataZarrWriter(store).recover()  # what a killed conversion or writer left beside the path
    if local is not None and local.exists():
        raise StoreExistsError(f"Zarr store already exists at {location.display}")
    tag = uuid.uuid4().hex[:8]
    spool_dir = (
        sibling(location, f"convert-spool-{tag}")
        if local is not None
        else Path(tempfile.gettempdir()) / f"dali-alchemi-convert-spool-{tag}"
    )
    report = ConversionReport()
    try:
        spool = _spool_input(structures, Spool(spool_dir), cutoff, missing, chunk, report, progress)
        decision = decide(spool.census, spool.structures, missing)
        for name, why in decision.dropped.items():
            report.dropped[name] += spool.census[name].present
            report.dropped_reasons[name] = why
            if spool.census[name].conflict is None:  # left out for the structures that lack it
                report.lacking[name] = spool.structures - spool.census[name].present
        report.filled = dict(decision.filled)
        chunks = spool.chunks(
            decision, float_dtype=float_dtype, system_float_dtype=system_float_dtype, tolerance=tolerance,
            loss=report.precision,
        )  # fmt: skip
        build = sibling(location, f"{CREATE_PREFIX}convert-{tag}") if local is not None else None
        try:
            _write_chunks(chunks, store if build is None else build, decision, config, report, progress)
            if build is not None:
                assert local is not None
                if local.exists():
                    raise StoreExistsError(f"Zarr store already exists at {location.display}")
                os.rename(build, local)
        except StoreWriteError as err:
            if build is None:
                raise
            shutil.rmtree(build, ignore_errors=True)
            raise _refused_convert(err, build, location) from err
        except BaseException:
            if build is not None:
                shutil.rmtree(build, ignore_errors=True)
            raise
    finally:
        shutil.rmtree(spool_dir, ignore_errors=True)
    warn_precision(report.precision, tolerance)
    if report.dropped:
        logger.info("conversion dropped keys it could not store: %s", report.dropped_reasons)
    return report


def _refused_convert(err: StoreWriteError, build: Path, location: StoreLocation) -> StoreWriteError:
    """``err`` (a write refused while the store was built beside its path) told of the store asked for."""
    store = location.display
    message = str(err).replace(str(build), store).replace(": write failed:", ": convert failed:", 1)
    return StoreWriteError(err.errno, message, store=store, operation="convert")


def _spool_input(
    structures: Iterable[Atoms], spool: Spool, cutoff: float | None, missing: MissingPolicy, chunk: int,
    report: ConversionReport, progress: Callable[[str, int], None] | None,
) -> Spool:  # fmt: skip
    """Read the input once, ``chunk`` structures at a time, into ``spool``, counting the keys it dropped."""
    stream = _extracted(structures, cutoff, refuse_early=missing == "error")
    while extracted := list(itertools.islice(stream, chunk)):
        for one in extracted:
            for key, why in one.dropped.items():
                report.dropped[key] += 1
                report.dropped_reasons.setdefault(key, why)
        spool.add(extracted)
        if progress is not None:
            progress("read", spool.structures)
    if spool.structures == 0:
        raise SampleDataError("No structures to convert")
    return spool


def _write_chunks(
    chunks: Iterable[PackedSamples], target: StoreLike, decision: Decision, config: WriteConfig | None,
    report: ConversionReport, progress: Callable[[str, int], None] | None,
) -> None:  # fmt: skip
    """Write the spooled chunks to ``target`` in one write, streamed chunk by chunk in bounded memory."""
    custom = {**decision.custom, **{f"{name}{PRESENT_SUFFIX}": "system" for name in decision.filled}}
    # a filled field holds NaN where its structure had no value (its *_present mask says where)
    writer = AtomicDataZarrWriter(target, config, allow_nonfinite=set(decision.filled))

    def counted() -> Iterator[PackedSamples]:
        for packed in chunks:
            report.fields = report.fields or dict(packed.levels)
            yield packed  # the writer asks for the next chunk once this one is written or buffered
            report.structures += len(packed)
            report.atoms += int(packed.n_atoms.sum())
            report.edges += int(packed.n_edges.sum())
            if progress is not None:
                progress("written", report.structures)

    writer.write(counted(), levels=custom, custom=sorted(custom))
    report.custom = sorted(custom)


def convert(
    inputs: Iterable[str | Path],
    store: StoreLike,
    *,
    cutoff: float | None = None,
    float_dtype: DTypeLike = np.float32,
    system_float_dtype: DTypeLike = np.float64,
    missing: MissingPolicy = "error",
    tolerance: float = DEFAULT_TOLERANCE,
    chunk: int = DEFAULT_CHUNK,
    config: WriteConfig | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> ConversionReport:
    """Convert one or more ASE-readable files, or folders of them, into a new store (see :func:`write_atoms`).

    The files are read one after the other, each streamed (:func:`read_structures`); a folder gives its
    ``*.extxyz``, ``*.xyz``, ``*.aselmdb`` and ``*.db`` files in sorted order of their names.

    Raises
    ------
    InputNotFoundError
        If an input does not exist, or a folder holds none of those files.
    SampleDataError
        If a structure cannot be read (naming the file and the frame), and as :func:`write_atoms` says.
    """
    structures = itertools.chain.from_iterable(read_structures(p) for p in input_files(inputs))
    return write_atoms(
        structures, store, cutoff=cutoff, float_dtype=float_dtype, system_float_dtype=system_float_dtype,
        missing=missing, tolerance=tolerance, chunk=chunk, config=config, progress=progress,
    )  # fmt: skip


def batch_to_atoms(batch: Batch) -> list[Atoms]:
    """Every structure of a Batch as an ``ase.Atoms`` (on the CPU), with a calculator holding its
    energy, forces and stress, other per-atom fields in ``arrays`` and per-structure ones in ``info``.
    Edge-level fields (neighbor lists) are left out: ``ase.Atoms`` has no place for them."""
    from ase import Atoms
    from ase.calculators.singlepoint import SinglePointCalculator

    out = []
    known = {"atomic_numbers", "positions", "cell", "pbc", "atomic_masses", "energy", "forces", "stress"}
    for sample in batch.cpu().to_data_list():
        atoms = Atoms(
            numbers=sample["atomic_numbers"].numpy(),
            positions=sample["positions"].double().numpy(),
            cell=sample["cell"][0].double().numpy() if "cell" in sample else None,
            pbc=sample["pbc"][0].numpy() if "pbc" in sample else False,
        )
        results: dict[str, Any] = {}
        if "energy" in sample:
            results["energy"] = float(sample["energy"].reshape(-1)[0])
        if "forces" in sample:
            results["forces"] = sample["forces"].double().numpy()
        if "stress" in sample:
            s = sample["stress"][0].double().numpy()
            results["stress"] = np.array([s[0, 0], s[1, 1], s[2, 2], s[1, 2], s[0, 2], s[0, 1]])
        if results:
            atoms.calc = SinglePointCalculator(atoms, **results)
        for name, tensor in sample.items():
            if name in known:
                continue
            level = batch.levels[name]
            if level == "atom":
                atoms.arrays[name] = tensor.numpy()
            elif level == "system":
                value = tensor.numpy()[0]
                atoms.info[name] = value.item() if value.ndim == 0 else value
            # edge-level fields (neighbor lists) have no place in ase.Atoms
        out.append(atoms)
    return out
