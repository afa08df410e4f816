"""The synthetic dataset of nvalchemi's benchmark (``nvalchemi-io-test``), deterministic by seed.

Sizes follow the reference recipe exactly: ``random.Random(seed)`` draws, per structure,
``n_atoms = randint(min_atoms, max_atoms)`` then ``n_edges = randint(1, 4 * n_atoms)``. Values, which
the reference leaves to torch's global generator, come from ``numpy.random.default_rng(seed)`` here,
so a seed fixes the whole store. The 11 fields are those nvalchemi's validation produces, in its
dtypes except ``energy``: float64, this project's default for per-structure floats (the values are the
float32 draws, so a seed gives the same numbers as before; nvalchemi's ``AtomicData`` would cast them
to float32, the dtype of ``positions``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dali_alchemi.errors import ConfigError, StoreExistsError
from dali_alchemi.store.format.packed import PackedSamples
from dali_alchemi.store.write.writer import AtomicDataZarrWriter

if TYPE_CHECKING:
    from dali_alchemi.config import WriteConfig

__all__ = [
    "PART_BYTES", "SYNTHETIC_LEVELS", "part_structures", "size_plan", "synthetic_config", "synthetic_parts",
    "synthetic_samples", "write_synthetic_extxyz", "write_synthetic_store", "write_synthetic_store_nvalchemi"
]


def synthetic_config(
    codec: str | None = None,
    chunk_size: int | None = None,
    shard_size: int | None = None,
    checksum: bool = True,
    *,
    layout: str = "default",
) -> WriteConfig:
    """The write config of a synthetic store from the command line's ``--layout``, ``--codec``, chunk and shard options.

    With no ``codec``, chunk or shard size the store follows the named ``layout`` (one of
    :data:`~dali_alchemi.config.STORE_LAYOUTS`); otherwise ``codec`` (one of
    :data:`~dali_alchemi.bench.names.CODECS`, ``lz4`` when only sizes are given) and the sizes apply to
    every core array. ``checksum=False`` leaves the checksums out of every array.
    """
    from dataclasses import replace

    from zarr.codecs import ZstdCodec

    from dali_alchemi.config import DEFAULT_COMPRESSORS, ArrayConfig, WriteConfig, layout_config

    if codec is None and chunk_size is None and shard_size is None:
        config = layout_config(layout)
        if checksum:
            return config
        laid_out = config.for_arrays("core", synthetic_samples(2000).fields)  # the layout of a sample of the data
        overrides = {name: replace(cfg, checksum=False) for name, cfg in laid_out.items()}
        return WriteConfig(meta=ArrayConfig(checksum=False), custom=ArrayConfig(checksum=False), field_overrides=overrides)
    compressors = {
        "lz4": DEFAULT_COMPRESSORS,
        "zstd": (ZstdCodec(level=1),),
        "zstd3": (ZstdCodec(level=3),),
        "none": (),
    }[codec or "lz4"]
    core = ArrayConfig(compressors=compressors, chunk_size=chunk_size, shard_size=shard_size, checksum=checksum)
    if checksum:
        return WriteConfig(meta=ArrayConfig(), core=core, custom=ArrayConfig())
    return WriteConfig(core=core, meta=ArrayConfig(checksum=False), custom=ArrayConfig(checksum=False))


# Standard atomic weights of Z = 1..19 (H..K), float32 as nvalchemi fills atomic_masses.
_MASSES = np.array(
    [0.0, 1.008, 4.0026, 6.94, 9.0122, 10.81, 12.011, 14.007, 15.999, 18.998, 20.180,
     22.990, 24.305, 26.982, 28.085, 30.974, 32.06, 35.45, 39.948, 39.098],
    dtype=np.float32,
)  # fmt: skip

SYNTHETIC_LEVELS = {
    "atomic_numbers": "atom", "positions": "atom", "forces": "atom", "atomic_masses": "atom",
    "atom_categories": "atom", "velocities": "atom", "neighbor_list": "edge", "shifts": "edge",
    "energy": "system", "cell": "system", "pbc": "system",
}  # fmt: skip


def size_plan(n: int, seed: int = 42, min_atoms: int = 10, max_atoms: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Atoms and edges per structure, exactly as the reference benchmark draws them."""
    _check_sizes(n, min_atoms, max_atoms)
    return _draw_sizes(random.Random(seed), n, min_atoms, max_atoms)


def _check_sizes(n: int, min_atoms: int, max_atoms: int) -> None:
    if n < 0 or min_atoms < 1 or max_atoms < min_atoms:
        raise ConfigError(f"need n >= 0 and 1 <= min_atoms <= max_atoms, got {n}, {min_atoms}, {max_atoms}")


def _draw_sizes(rng: random.Random, n: int, min_atoms: int, max_atoms: int) -> tuple[np.ndarray, np.ndarray]:
    """The next ``n`` structures' atom and edge counts from ``rng``, in the reference's order of draws."""
    # randint(a, b) is a + _randbelow(b - a + 1) (random.py); called directly, the loop takes half the time
    below, span = rng._randbelow, max_atoms - min_atoms + 1  # type: ignore[attr-defined]
    draws = [(atoms := min_atoms + below(span), 1 + below(4 * atoms)) for _ in range(n)]
    sizes = np.array(draws, dtype=np.int64).reshape(n, 2)
    return np.ascontiguousarray(sizes[:, 0]), np.ascontiguousarray(sizes[:, 1])


def synthetic_samples(n: int, seed: int = 42, min_atoms: int = 10, max_atoms: int = 100) -> PackedSamples:
    """``n`` synthetic structures as one packed block (sample-local neighbor lists)."""
    n_atoms, n_edges = size_plan(n, seed, min_atoms, max_atoms)
    return _structures(n_atoms, n_edges, np.random.default_rng(seed))


PART_BYTES = 64 << 20
"""About the most bytes one part of a streamed synthetic store holds (its largest structures assumed).
Memory holds about one part, its checked copy and a shard per array whatever the store's size (0.78 GB
measured writing 10 million structures of 1 to 4 atoms); a first part this large is enough to choose
the layout from (docs/bigger-than-memory.md)."""

_ATOM_BYTES = 8 + 3 * 12 + 4 + 8  # atomic_numbers; positions, forces, velocities; atomic_masses; atom_categories
_EDGE_BYTES = 16 + 12  # neighbor_list, shifts
_SYSTEM_BYTES = 8 + 36 + 3  # energy, cell, pbc


def part_structures(max_atoms: int) -> int:
    """Structures per part of a streamed synthetic store: :data:`PART_BYTES` at ``max_atoms`` each."""
    largest = max_atoms * _ATOM_BYTES + 4 * max_atoms * _EDGE_BYTES + _SYSTEM_BYTES
    return max(1, PART_BYTES // largest)


def synthetic_parts(
    n: int, seed: int = 42, min_atoms: int = 10, max_atoms: int = 100, *, structures: int | None = None
) -> Iterator[PackedSamples]:
    """``n`` synthetic structures in parts of ``structures`` (default :func:`part_structures`), as a generator.

    Sizes are :func:`size_plan`'s, drawn part after part from one generator, so they are the same as
    one ``size_plan(n)``; values continue one ``numpy`` generator from part to part. The first part is
    :func:`synthetic_samples` of its size, so a store of at most one part holds exactly those structures.
    """
    _check_sizes(n, min_atoms, max_atoms)
    structures = part_structures(max_atoms) if structures is None else structures
    if structures < 1:
        raise ConfigError(f"parts need at least one structure, got structures={structures}")
    sizes, values = random.Random(seed), np.random.default_rng(seed)
    for start in range(0, n, structures):
        n_atoms, n_edges = _draw_sizes(sizes, min(structures, n - start), min_atoms, max_atoms)
        yield _structures(n_atoms, n_edges, values)


def _structures(n_atoms: np.ndarray, n_edges: np.ndarray, rng: np.random.Generator) -> PackedSamples:
    """Structures of the given sizes with values drawn from ``rng``, in one packed block."""
    n = int(n_atoms.size)
    total_atoms, total_edges = int(n_atoms.sum()), int(n_edges.sum())
    z = rng.integers(1, 20, size=total_atoms, dtype=np.int64)
    owner = np.repeat(n_atoms, n_edges)
    neighbor_list = (rng.random((total_edges, 2)) * owner[:, None]).astype(np.int64)
    fields = {
        "atomic_numbers": z,
        "positions": rng.standard_normal((total_atoms, 3), dtype=np.float32),
        "forces": rng.standard_normal((total_atoms, 3), dtype=np.float32),
        "atomic_masses": _MASSES[z],
        "atom_categories": np.zeros(total_atoms, dtype=np.int64),
        "velocities": np.zeros((total_atoms, 3), dtype=np.float32),
        "neighbor_list": neighbor_list,
        "shifts": rng.standard_normal((total_edges, 3), dtype=np.float32),
        "energy": rng.standard_normal((n, 1), dtype=np.float32).astype(np.float64),
        "cell": np.broadcast_to(np.eye(3, dtype=np.float32), (n, 3, 3)).copy(),
        "pbc": np.ones((n, 3), dtype=np.bool_),
    }
    return PackedSamples.from_fields(fields, SYNTHETIC_LEVELS, n_atoms, n_edges)  # type: ignore[arg-type]


def write_synthetic_store(
    path: str | Path,
    n: int,
    *,
    seed: int = 42,
    min_atoms: int = 10,
    max_atoms: int = 100,
    config: WriteConfig | None = None,
) -> Path:
    """Write an ``n``-structure synthetic store at ``path`` (which must not exist) and return the path.

    Written part by part (:func:`synthetic_parts`, streamed by the writer), so memory stays bounded
    whatever ``n``.
    """
    if n < 1:
        raise ConfigError(f"a synthetic store needs at least one structure, got n={n}")
    AtomicDataZarrWriter(path, config).write(synthetic_parts(n, seed, min_atoms, max_atoms))
    return Path(path)


def write_synthetic_store_nvalchemi(
    path: str | Path, n: int, *, seed: int = 42, min_atoms: int = 10, max_atoms: int = 100
) -> Path:
    """The same store written by nvalchemi-toolkit's own ``AtomicDataZarrWriter``, in one ``write``.

    One ``write`` of every structure, not nvalchemi's write-then-append recipe: nvalchemi 0.2.0's
    ``append`` stores neighbor lists without re-basing them (see the store format notes), which this
    project's reader refuses. Needs nvalchemi-toolkit.
    """
    import torch
    from nvalchemi.data import AtomicData
    from nvalchemi.data.datapipes import AtomicDataZarrWriter as NvalchemiWriter

    if n < 1:
        raise ConfigError(f"a synthetic store needs at least one structure, got n={n}")
    if Path(path).exists():
        raise StoreExistsError(f"Zarr store already exists at {path}")
    samples = synthetic_samples(n, seed, min_atoms, max_atoms).split()
    data = [AtomicData(**{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in s.items()}) for s in samples]
    NvalchemiWriter(str(path)).write(data)
    return Path(path)


def write_synthetic_extxyz(
    path: str | Path, n: int, *, seed: int = 42, min_atoms: int = 10, max_atoms: int = 100
) -> Path:
    """Write ``n`` synthetic periodic structures to an extxyz file (energies, forces, stress; needs ase).

    Sizes follow :func:`size_plan`; atoms sit at random positions in a cubic box of about 11 A^3 per
    atom, so a radius neighbor list has realistic edge counts. Written in chunks, never all at once.
    """
    from ase import Atoms
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.io import write

    n_atoms, _ = size_plan(n, seed, min_atoms, max_atoms)
    rng = np.random.default_rng(seed)
    out = Path(path)
    out.unlink(missing_ok=True)
    for start in range(0, n, 1000):
        chunk = []
        for count in n_atoms[start : start + 1000].tolist():
            side = (11.0 * count) ** (1 / 3)
            atoms = Atoms(
                numbers=rng.integers(1, 20, count), positions=rng.uniform(0, side, (count, 3)),
                cell=np.eye(3) * side, pbc=True,
            )  # fmt: skip
            stress = rng.standard_normal((3, 3))
            atoms.calc = SinglePointCalculator(
                atoms, energy=float(rng.standard_normal()), forces=rng.standard_normal((count, 3)),
                stress=(stress + stress.T).ravel()[[0, 4, 8, 5, 2, 1]],
            )  # fmt: skip
            atoms.info["temperature"] = float(rng.uniform(200, 400))
            chunk.append(atoms)
        write(out, chunk, format="extxyz", append=start > 0)
    return out
