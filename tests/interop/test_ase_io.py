"""A real extxyz file through convert, the loader and Batch, and back to ase.Atoms, field for field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ase = pytest.importorskip("ase")
from ase.build import bulk, molecule  # noqa: E402
from ase.calculators.emt import EMT  # noqa: E402
from ase.io import read, write  # noqa: E402

from dali_alchemi import AtomicDataZarrReader, SampleDataError  # noqa: E402
from dali_alchemi.cli import main  # noqa: E402
from dali_alchemi.interop import to_ase  # noqa: E402
from dali_alchemi.interop.ase_io import convert, write_atoms  # noqa: E402


def _structures(n: int) -> list[ase.Atoms]:
    out = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=3.6 + 0.01 * k) * (2, 1 + k % 2, 1)
        if k % 3 == 0:
            atoms[0].symbol = "Al"
        atoms.rattle(0.05, seed=k)
        atoms.calc = EMT()
        atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()
        atoms.info.update(config_type="bulk", temperature=300.0 + k, step=k)
        atoms.arrays["spin"] = np.linspace(-1, 1, len(atoms))
        out.append(atoms)
    return out


@pytest.fixture(scope="module")
def extxyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ase") / "cu.extxyz"
    write(path, _structures(23))
    return path


@pytest.mark.dali
def test_extxyz_through_convert_loader_and_back_to_atoms(extxyz: Path, tmp_path: Path) -> None:
    from dali_alchemi import DALIDataLoader

    store = tmp_path / "cu.zarr"
    report = convert([extxyz], store, cutoff=3.0, float_dtype=np.float64, chunk=5)
    assert report.structures == 23 and report.custom == ["spin", "step", "temperature"]
    assert report.dropped == {"config_type": 23}
    assert report.fields["stress"] == "system" and report.fields["neighbor_list"] == "edge"
    original = read(extxyz, index=":")
    with DALIDataLoader(store, batch_size=4, shuffle=True, seed=1, num_workers=0, device="cpu") as loader:
        seen = 0
        for batch in loader:
            for index, atoms in zip(batch.sample_indices.tolist(), to_ase(batch), strict=True):
                want = original[index]
                assert np.array_equal(atoms.numbers, want.numbers)
                assert np.allclose(atoms.positions, want.positions)
                assert np.allclose(atoms.cell.array, want.cell.array) and (atoms.pbc == want.pbc).all()
                assert np.isclose(atoms.get_potential_energy(), want.get_potential_energy())
                assert np.allclose(atoms.get_forces(), want.get_forces())
                assert np.allclose(atoms.get_stress(), want.get_stress())
                assert np.allclose(atoms.arrays["spin"], want.arrays["spin"])
                assert atoms.info["temperature"] == want.info["temperature"] and atoms.info["step"] == want.info["step"]
                assert np.allclose(atoms.get_masses(), want.get_masses())
                seen += 1
        assert seen == 23
    with AtomicDataZarrReader(store) as reader:
        sample = reader.read(4)[0]
        edges = sample["neighbor_list"].numpy()
        vectors = (sample["positions"][edges[:, 1]] + sample["shifts"] - sample["positions"][edges[:, 0]]).norm(dim=1)
        assert (vectors < 3.0).all() and len(edges) > 0


@pytest.mark.parametrize("suffix", [".db", ".traj"])
def test_databases_and_trajectories_stream_in(suffix: str, tmp_path: Path) -> None:
    source = tmp_path / f"input{suffix}"
    structures = _structures(7)
    write(source, structures)
    report = convert([source], tmp_path / "out.zarr", chunk=3)
    assert report.structures == 7
    with AtomicDataZarrReader(tmp_path / "out.zarr") as reader:
        assert np.allclose(reader.read(6)[0]["forces"].numpy(), structures[6].get_forces(), atol=1e-5)


def test_molecules_without_a_cell_and_inconsistent_inputs(tmp_path: Path) -> None:
    water = molecule("H2O")
    water.info["energy"] = -14.2
    with pytest.raises(SampleDataError, match=r"Structure 1 has no \['energy'\]"):
        write_atoms([water, molecule("H2O")], tmp_path / "b.zarr", chunk=1)
    report = write_atoms([water, water.copy()], tmp_path / "c.zarr", cutoff=1.2)
    assert report.edges == 2 * 4  # two O-H bonds each way, per molecule
    with pytest.raises(SampleDataError, match="No structures"):
        write_atoms([], tmp_path / "d.zarr")
    with pytest.raises(FileNotFoundError, match=r"missing\.extxyz"):
        convert([tmp_path / "missing.extxyz"], tmp_path / "e.zarr")


def test_cli_convert(
    extxyz: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["convert", str(extxyz), str(tmp_path / "cli.zarr"), "--cutoff", "2.8"]) == 0
    out = capsys.readouterr().out
    assert "wrote 23 structures" in out and "structures/s" in out and "config_type x23" in out
    with AtomicDataZarrReader(tmp_path / "cli.zarr") as reader:
        assert reader.read(0)[0]["positions"].dtype.is_floating_point and len(reader) == 23
