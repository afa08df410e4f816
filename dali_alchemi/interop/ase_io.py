"""ASE in and out: convert ``ase.Atoms`` (extxyz files, ASE databases, trajectories) to a store, and
Batches back to ``ase.Atoms``.

Structures stream through in chunks, so the input is never loaded whole. Each ``ase.Atoms`` maps to
nvalchemi's fields: ``atomic_numbers``, ``positions``, ``atomic_masses``, ``cell`` and ``pbc`` always;
``energy``, ``forces``, ``stress`` (3x3), ``virial``, ``dipole``, ``charges`` and ``momenta`` when the
structure or its calculator has them. Any other numeric per-atom array or per-structure ``info`` value
becomes a custom array. With ``cutoff`` a radius neighbor list with periodic images is computed on the
way in (``neighbor_list``, integer ``neighbor_list_shifts`` and cartesian ``shifts``).
``ase`` is imported when these functions run.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.errors import SampleDataError
from dali_alchemi.interop.neighbors import radius_graph
from dali_alchemi.store.packed import PackedSamples
from dali_alchemi.store.writer import AtomicDataZarrWriter

if TYPE_CHECKING:
    from ase import Atoms
    from numpy.typing import NDArray

    from dali_alchemi.batch import Batch
    from dali_alchemi.config import WriteConfig
    from dali_alchemi.store.location import StoreLike

logger = logging.getLogger(__name__)

DEFAULT_CHUNK = 1000
"""Structures converted and written per step."""

# ASE per-atom arrays and results that map onto AtomicData fields (name in ASE -> field).
_ATOM_FIELDS = {"forces": "forces", "momenta": "momenta", "charges": "charges", "initial_charges": "charges"}
_HANDLED_ARRAYS = {"numbers", "positions", *_ATOM_FIELDS}
_SYSTEM_FIELDS = ("energy", "stress", "virial", "dipole")


@dataclass(slots=True)
class ConversionReport:
    """What a conversion did: counts, the fields it wrote, and what it could not keep."""

    structures: int = 0
    atoms: int = 0
    edges: int = 0
    fields: dict[str, str] = field(default_factory=dict)
    custom: list[str] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)


def _stress_3x3(value: Any) -> NDArray[np.float64]:
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    if arr.size == 9:
        return arr.reshape(3, 3)
    if arr.size == 6:  # Voigt order xx, yy, zz, yz, xz, xy
        xx, yy, zz, yz, xz, xy = arr
        return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    raise SampleDataError(f"stress must have 6 (Voigt) or 9 entries, got {arr.size}")


def _numeric(value: Any) -> NDArray[Any] | None:
    arr = np.asarray(value)
    return arr if arr.dtype.kind in "biuf" else None


def atoms_to_sample(
    atoms: Atoms, *, float_dtype: Any = np.float32, cutoff: float | None = None
) -> tuple[dict[str, NDArray[Any]], dict[str, str], list[str]]:
    """One ``ase.Atoms`` as a sample dict, the levels of its custom fields, and the keys it dropped."""
    fdt = np.dtype(float_dtype)
    n = len(atoms)
    sample: dict[str, NDArray[Any]] = {
        "atomic_numbers": np.asarray(atoms.numbers, dtype=np.int64),
        "positions": np.asarray(atoms.positions, dtype=fdt),
        "atomic_masses": np.asarray(atoms.get_masses(), dtype=fdt),
        "cell": np.asarray(atoms.cell.array, dtype=fdt)[None],
        "pbc": np.asarray(atoms.pbc, dtype=np.bool_)[None],
    }
    custom: dict[str, str] = {}
    dropped: list[str] = []
    results = dict(atoms.calc.results) if atoms.calc is not None else {}
    info = dict(atoms.info)
    for key, name in _ATOM_FIELDS.items():
        value = results.get(key, atoms.arrays.get(key))
        if value is not None and name not in sample:
            sample[name] = np.asarray(value, dtype=fdt).reshape((n, *np.shape(value)[1:]))
    for key in _SYSTEM_FIELDS:
        value = results.get(key, info.pop(key, None))
        if value is None:
            continue
        if key in ("stress", "virial"):
            sample[key] = _stress_3x3(value).astype(fdt)[None]
        elif key == "energy":
            sample[key] = np.asarray(value, dtype=fdt).reshape(1, 1)
        else:
            sample[key] = np.asarray(value, dtype=fdt).reshape(1, -1)
    for key, value in atoms.arrays.items():
        if key in _HANDLED_ARRAYS:
            continue
        arr = _numeric(value)
        if arr is None or arr.shape[:1] != (n,):
            dropped.append(key)
            continue
        sample[key] = arr.astype(fdt) if arr.dtype.kind == "f" else arr
        custom[key] = "atom"
    for key, value in info.items():
        arr = _numeric(value)
        if arr is None:
            dropped.append(key)
            continue
        sample[key] = (arr.astype(fdt) if arr.dtype.kind == "f" else arr).reshape(1, *arr.shape)
        custom[key] = "system"
    if cutoff is not None:
        edges, images = radius_graph(atoms.positions, atoms.cell.array, atoms.pbc, cutoff)
        sample["neighbor_list"] = edges
        sample["neighbor_list_shifts"] = images
        sample["shifts"] = (images.astype(np.float64) @ atoms.cell.array).astype(fdt)
    return sample, custom, dropped


def write_atoms(
    structures: Iterable[Atoms],
    store: StoreLike,
    *,
    cutoff: float | None = None,
    float_dtype: Any = np.float32,
    chunk: int = DEFAULT_CHUNK,
    config: WriteConfig | None = None,
    progress: Callable[[int], None] | None = None,
) -> ConversionReport:
    """Write an iterable of ``ase.Atoms`` to a new store, ``chunk`` structures at a time.

    The first chunk fixes the fields; a later structure missing one of them is an error naming it, and
    keys that first appear later are dropped and counted in the report. ``progress`` is called with the
    number of structures written so far.

    Raises
    ------
    FileExistsError
        If the store exists.
    SampleDataError
        If a structure lacks a field the first chunk had, or the input is empty.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    writer = AtomicDataZarrWriter(store, config)
    report = ConversionReport()
    schema: dict[str, str] | None = None
    custom_levels: dict[str, str] = {}
    iterator = iter(structures)
    while True:
        block = list(itertools.islice(iterator, chunk))
        if not block:
            break
        samples = []
        for k, atoms in enumerate(block):
            sample, custom, dropped = atoms_to_sample(atoms, float_dtype=float_dtype, cutoff=cutoff)
            report.dropped.update(dropped)
            if schema is None:
                schema = dict.fromkeys(sample, "")
                custom_levels = custom
            missing = sorted(set(schema) - set(sample))
            if missing:
                raise SampleDataError(
                    f"Structure {report.structures + k} has no {missing}, which earlier structures have"
                )
            extra = set(sample) - set(schema)
            report.dropped.update(extra)
            samples.append({name: sample[name] for name in schema})
        packed = PackedSamples.from_samples(samples, levels=custom_levels)
        if report.structures == 0:
            writer.write(packed, levels=custom_levels, custom=sorted(custom_levels))
            report.fields = dict(packed.levels)
            report.custom = sorted(custom_levels)
        else:
            writer.append(packed, levels=custom_levels)
        report.structures += len(packed)
        report.atoms += int(packed.n_atoms.sum())
        report.edges += int(packed.n_edges.sum())
        if progress is not None:
            progress(report.structures)
    if report.structures == 0:
        raise SampleDataError("No structures to convert")
    if report.dropped:
        logger.info("conversion dropped keys it could not store: %s", dict(report.dropped))
    return report


def read_structures(path: str | Path, *, index: str = ":", format: str | None = None) -> Iterator[Atoms]:
    """Stream ``ase.Atoms`` from any file ASE reads (extxyz, ``.db``, ``.traj``, ...) without loading it whole."""
    from ase.io import iread

    return iter(iread(str(path), index=index, format=format))


def convert(
    inputs: Iterable[str | Path],
    store: StoreLike,
    *,
    cutoff: float | None = None,
    float_dtype: Any = np.float32,
    chunk: int = DEFAULT_CHUNK,
    config: WriteConfig | None = None,
    progress: Callable[[int], None] | None = None,
) -> ConversionReport:
    """Convert one or more ASE-readable files into a new store (see :func:`write_atoms`)."""
    paths = [Path(p) for p in inputs]
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"Input {path} does not exist")
    structures = itertools.chain.from_iterable(read_structures(p) for p in paths)
    return write_atoms(
        structures, store, cutoff=cutoff, float_dtype=float_dtype, chunk=chunk, config=config, progress=progress
    )


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
