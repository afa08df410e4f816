"""A physics-realistic store: frames of an ASE EMT molecular-dynamics run of a copper crystal.

Synthetic stores draw positions and forces at random; real ones hold trajectories, whose positions,
forces and velocities compress little (blosc-lz4 keeps 0.83-0.94 of their bytes) while their atomic
numbers compress almost away. Layout choices are measured on both (docs/stores.md, "Store layouts"). Needs ase.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dali_alchemi.errors import ConfigError

if TYPE_CHECKING:
    from ase import Atoms

    from dali_alchemi.config import WriteConfig
    from dali_alchemi.interop.ase_io import ConversionReport

__all__ = ["emt_frames", "write_emt_store"]


def emt_frames(
    n_frames: int, *, repeat: int = 3, steps_per_frame: int = 5, temperature_k: float = 800.0, seed: int = 0
) -> Iterator[Atoms]:
    """``n_frames`` snapshots of velocity-Verlet MD (2 fs steps) of fcc Cu, ``repeat``^3 cubic cells (4 atoms each).

    Each frame carries its EMT energy and forces (as a single-point calculator) and its velocities.
    """
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet
    from ase.units import fs

    if n_frames < 1 or repeat < 1 or steps_per_frame < 1:
        raise ConfigError(
            f"need n_frames, repeat and steps_per_frame >= 1, got {n_frames}, {repeat}, {steps_per_frame}"
        )
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((repeat, repeat, repeat))
    atoms.calc = EMT()
    MaxwellBoltzmannDistribution(atoms, temperature_K=temperature_k, rng=np.random.default_rng(seed))
    dynamics = VelocityVerlet(atoms, 2 * fs)
    for _ in range(n_frames):
        dynamics.run(steps_per_frame)
        frame = atoms.copy()
        frame.calc = SinglePointCalculator(frame, energy=atoms.get_potential_energy(), forces=atoms.get_forces())
        yield frame


def write_emt_store(
    path: str | Path, n_frames: int, *, cutoff: float | None = None, config: WriteConfig | None = None, seed: int = 0
) -> ConversionReport:
    """Write :func:`emt_frames` to a new store at ``path`` (a radius neighbor list when ``cutoff`` is given)."""
    from dali_alchemi.interop.ase_io import write_atoms

    return write_atoms(emt_frames(n_frames, seed=seed), path, cutoff=cutoff, config=config)
