"""A store ``convert`` wrote (float32 per atom, float64 per structure, custom fields, a fill mask) opens
in nvalchemi-toolkit 0.2.0 and reads back equal, dtypes included.

nvalchemi's reader returns what is stored; its ``AtomicData`` (and so its Dataset and DataLoader) casts
every float field to the dtype of ``positions``, so there energies become float32 again, with a warning.
Runs only where nvalchemi is importable; skipped elsewhere.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader

nv_zarr = pytest.importorskip("nvalchemi.data.datapipes.backends.zarr", reason="nvalchemi-toolkit is not installed")
pytest.importorskip("ase")


def test_nvalchemi_reads_a_converted_store(tmp_path: Path) -> None:
    from ase.build import bulk
    from ase.calculators.singlepoint import SinglePointCalculator

    from dali_alchemi.interop.ase_io import write_atoms

    structures, expected = [], [-98765.4321 + 0.0013 * k for k in range(6)]
    for k in range(6):
        atoms = bulk("Cu", "fcc", a=3.6 + 0.01 * k) * (1, 1, 1 + k % 2)
        n = len(atoms)
        atoms.calc = SinglePointCalculator(
            atoms, energy=expected[k], free_energy=-98765.5 + k, forces=np.full((n, 3), 0.1 * k)
        )
        if k % 2:
            atoms.arrays["initial_magmoms"] = np.full(n, 0.5)
        structures.append(atoms)
    path = tmp_path / "converted.zarr"
    write_atoms(structures, path, cutoff=3.0, missing="fill", chunk=4)
    theirs = nv_zarr.AtomicDataZarrReader(str(path))
    ours = AtomicDataZarrReader(path)
    assert len(theirs) == len(ours) == 6 and theirs.field_levels == ours.field_levels
    for (a, _), (b, _) in zip(theirs.read_many(range(6)), ours.read_many(range(6)), strict=True):
        assert set(a) == set(b)
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            assert np.array_equal(a[key].numpy(), b[key].numpy(), equal_nan=True), key
    energies = [a["energy"].item() for a, _ in theirs.read_many(range(6))]
    assert energies == expected  # float64 on disk: exact

    from nvalchemi.data.datapipes import Dataset

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data, _ = Dataset(theirs, device="cpu")[0]
    assert str(data.energy.dtype) == "torch.float32"  # AtomicData casts to the dtype of positions
    assert any("energy" in str(w.message) and "float32" in str(w.message) for w in caught)
