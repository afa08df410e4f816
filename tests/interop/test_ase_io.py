"""A real extxyz file through convert, the loader and Batch, and back to ase.Atoms, field for field."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
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
    import torch

    from dali_alchemi import DALIDataLoader

    store = tmp_path / "cu.zarr"
    report = convert([extxyz], store, cutoff=3.0, chunk=5)  # float32 per atom, float64 per structure
    assert report.structures == 23
    assert report.custom == ["energies", "free_energy", "spin", "step", "temperature"]  # EMT's results too
    assert report.dropped == {"config_type": 23} and report.dropped_reasons == {"config_type": "not numeric (str)"}
    assert report.fields["stress"] == "system" and report.fields["neighbor_list"] == "edge"
    original = read(extxyz, index=":")
    with DALIDataLoader(store, batch_size=4, shuffle=True, seed=1, num_workers=0, device="cpu") as loader:
        seen = 0
        for batch in loader:
            assert batch.positions.dtype == torch.float32 and batch.forces.dtype == torch.float32
            assert batch.energy.dtype == torch.float64 and batch.stress.dtype == torch.float64
            for index, atoms in zip(batch.sample_indices.tolist(), to_ase(batch), strict=True):
                want = original[index]
                assert np.array_equal(atoms.numbers, want.numbers)
                assert np.allclose(atoms.positions, want.positions)
                assert np.allclose(atoms.cell.array, want.cell.array) and (atoms.pbc == want.pbc).all()
                assert atoms.get_potential_energy() == want.get_potential_energy()  # float64: exact
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
    with pytest.raises(SampleDataError, match=r"'energy' is in structure 0 but not in structure 1\. Choose"):
        write_atoms([water, molecule("H2O")], tmp_path / "b.zarr", chunk=1)
    assert not (tmp_path / "b.zarr").exists()
    report = write_atoms([water, water.copy()], tmp_path / "c.zarr", cutoff=1.2)
    assert report.edges == 2 * 4  # two O-H bonds each way, per molecule
    with pytest.raises(SampleDataError, match="No structures"):
        write_atoms([], tmp_path / "d.zarr")
    with pytest.raises(FileNotFoundError, match=r"missing\.extxyz"):
        convert([tmp_path / "missing.extxyz"], tmp_path / "e.zarr")
    for bad, match in (
        ({"missing": "ignore"}, "missing must be one of error, fill, drop"),
        ({"tolerance": -1.0}, "tolerance must be >= 0"),
        ({"system_float_dtype": np.float16}, "system_float_dtype must be float32 or float64, got float16"),
    ):
        with pytest.raises(ValueError, match=match):
            write_atoms([water], tmp_path / "f.zarr", **bad)  # type: ignore[arg-type]


def test_cli_convert(
    extxyz: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["convert", str(extxyz), str(tmp_path / "cli.zarr"), "--cutoff", "2.8"]) == 0
    out = capsys.readouterr().out
    assert "wrote 23 structures" in out and "structures/s" in out
    assert "left out: config_type (23 structures have it): not numeric (str)" in " ".join(out.split())
    with AtomicDataZarrReader(tmp_path / "cli.zarr") as reader:
        assert reader.read(0)[0]["positions"].dtype.is_floating_point and len(reader) == 23


def _leftovers(folder: Path) -> list[str]:
    """Everything in ``folder``, hidden staging and spool directories included."""
    return sorted(p.name for p in folder.iterdir())


def _g2() -> list[ase.Atoms]:
    from ase.collections import g2

    return list(g2)


def test_fields_are_decided_over_the_whole_input(tmp_path: Path) -> None:
    g2 = _g2()
    magnetic = ["initial_magmoms" in atoms.arrays for atoms in g2]
    assert sum(magnetic) == 43 and not magnetic[0]  # the first structure has no magnetic moments
    report = write_atoms(g2, tmp_path / "fill.zarr", missing="fill", chunk=60)
    assert report.filled == {"initial_magmoms": 162 - 43}
    assert report.fields["initial_magmoms"] == "atom" and report.fields["initial_magmoms_present"] == "system"
    with AtomicDataZarrReader(tmp_path / "fill.zarr") as reader:
        packed = reader.read_packed(range(162))
        assert packed.fields["initial_magmoms_present"].tolist() == magnetic
        for i in (magnetic.index(True), magnetic.index(False)):
            got = reader.read(i)[0]["initial_magmoms"].numpy()
            if magnetic[i]:
                assert np.allclose(got, g2[i].arrays["initial_magmoms"])
            else:
                assert got.shape == (len(g2[i]),) and np.isnan(got).all()
    report = write_atoms(g2, tmp_path / "drop.zarr", missing="drop", chunk=60)
    assert "initial_magmoms" not in report.fields and report.dropped["initial_magmoms"] == 43
    assert report.dropped_reasons["initial_magmoms"] == "missing from 119 of 162 structures (the first: structure 0)"


def test_missing_error_refuses_at_the_first_structure_that_differs_without_reading_on(tmp_path: Path) -> None:
    pulled = 0

    def structures() -> Iterator[ase.Atoms]:
        nonlocal pulled
        for i in range(500):
            pulled += 1
            atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
            if i != 7:  # structure 7 has no energy
                atoms.info["energy"] = -1.0 * i
            yield atoms

    with pytest.raises(SampleDataError, match=r"'energy' is in structure 0 but not in structure 7.*stopped at structure 7"):
        write_atoms(structures(), tmp_path / "early.zarr", chunk=1000)
    assert pulled == 8  # not the 500 of the input, nor the 1,000 of a chunk
    assert _leftovers(tmp_path) == []
    report = write_atoms(structures(), tmp_path / "filled.zarr", missing="fill")
    assert pulled == 8 + 500 and report.filled == {"energy": 1}


def test_a_failed_convert_leaves_no_store_and_a_retry_works(tmp_path: Path) -> None:
    g2 = _g2()
    first = sorted(g2, key=lambda atoms: "initial_magmoms" not in atoms.arrays)  # the 43 magnetic ones first
    out = tmp_path / "g2.zarr"
    with pytest.raises(SampleDataError, match=r"'initial_magmoms' is in structure 0 but not in structure 43.*missing="):
        write_atoms(first, out, chunk=10)
    assert _leftovers(tmp_path) == []

    def broken() -> Iterator[ase.Atoms]:
        yield from first[:45]
        raise OSError("the input went away")

    with pytest.raises(OSError, match="went away"):
        write_atoms(broken(), out, chunk=10, missing="fill")
    assert _leftovers(tmp_path) == []
    report = write_atoms(first, out, chunk=60, missing="fill")
    assert report.structures == 162 and _leftovers(tmp_path) == ["g2.zarr"]


def test_what_a_killed_convert_left_is_removed_by_the_next(tmp_path: Path) -> None:
    for suffix in ("convert-spool-0badc0de", "create-convert-0badc0de"):  # the two directories convert uses
        (tmp_path / f".out.zarr.dali-alchemi-{suffix}" / "core").mkdir(parents=True)
    write_atoms(_structures(3), tmp_path / "out.zarr")
    assert _leftovers(tmp_path) == ["out.zarr"]


def test_a_failure_while_writing_leaves_no_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dali_alchemi.store.write import stream

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(stream, "checked_disk", fail)  # the second chunk of the one streamed write fails
    with pytest.raises(OSError, match="disk full"):
        write_atoms(_structures(7), tmp_path / "out.zarr", chunk=3)
    assert _leftovers(tmp_path) == []


def test_database_key_value_pairs_become_fields(tmp_path: Path) -> None:
    from ase.collections import dcdft, s22

    report = convert([s22.filename], tmp_path / "s22.zarr")
    assert report.fields["cc_energy"] == "system" and "cc_energy" in report.custom
    assert report.dropped == {"name": 22, "unique_id": 22}
    assert report.dropped_reasons["name"] == "not numeric (str)"
    with AtomicDataZarrReader(tmp_path / "s22.zarr") as reader:
        stored = reader.read_packed(range(22)).fields["cc_energy"]
        assert stored.dtype == np.float64
        assert stored.tolist() == [s22.data[name]["cc_energy"] for name in s22.names]
    report = convert([dcdft.filename], tmp_path / "dcdft.zarr", missing="drop")
    assert {"wien2k_B", "wien2k_Bp", "wien2k_volume"} <= set(report.fields)
    assert report.dropped["exp_volume"] == 58 and "missing from 13 of 71" in report.dropped_reasons["exp_volume"]
    with AtomicDataZarrReader(tmp_path / "dcdft.zarr") as reader:
        assert reader.read_packed(range(71)).fields["wien2k_volume"].tolist() == [
            dcdft.data[name]["wien2k_volume"] for name in dcdft.names
        ]


def test_calculator_results_become_fields(tmp_path: Path) -> None:
    from ase.calculators.singlepoint import SinglePointCalculator

    structures = []
    for k in range(4):
        atoms = molecule("CH4")
        n = len(atoms)
        atoms.calc = SinglePointCalculator(
            atoms, energy=-24.0 - k, free_energy=-24.1 - k, magmom=0.5 * k, magmoms=np.full(n, 0.1 * k),
            energies=np.arange(n) + k, stresses=np.tile(np.arange(6.0), (n, 1)), forces=np.ones((n, 3)),
        )  # fmt: skip
        atoms.arrays["tags"] = np.arange(n, dtype=np.int64)
        atoms.info["energy"] = 0.0  # the calculator's energy wins; this one is reported
        structures.append(atoms)
    report = write_atoms(structures, tmp_path / "calc.zarr")
    assert report.custom == ["energies", "free_energy", "magmom", "magmoms", "stresses", "tags"]
    assert report.dropped == {"energy (info)": 4}
    assert report.dropped_reasons["energy (info)"] == "'energy' was already given by the structure or its calculator"
    with AtomicDataZarrReader(tmp_path / "calc.zarr") as reader:
        sample = {k: v.numpy() for k, v in reader.read(3)[0].items()}
    assert sample["free_energy"].tolist() == [-27.1] and sample["free_energy"].dtype == np.float64
    assert sample["energy"].tolist() == [[-27.0]] and sample["magmom"].tolist() == [1.5]
    assert np.allclose(sample["magmoms"], 0.3) and sample["energies"].tolist() == [3, 4, 5, 6, 7]
    assert sample["stresses"].shape == (5, 3, 3) and sample["stresses"][0].tolist() == [
        [0.0, 5.0, 4.0], [5.0, 1.0, 3.0], [4.0, 3.0, 2.0],
    ]  # fmt: skip
    assert sample["tags"].dtype == np.int64 and sample["tags"].tolist() == [0, 1, 2, 3, 4]


def test_fill_values_per_dtype_and_fields_that_cannot_be_one_array(tmp_path: Path) -> None:
    structures = [molecule("H2O") for _ in range(3)]
    structures[0].arrays["tags"] = np.array([1, 2, 3])
    structures[0].info["flag"] = True
    structures[0].info["vector"] = np.arange(3.0)
    structures[2].info["vector"] = np.arange(5.0)
    with pytest.raises(SampleDataError, match=r"'vector' is in structure 0 but not in structure 1"):
        write_atoms(structures, tmp_path / "a.zarr")  # refused at structure 1, the first that differs
    same_fields = [molecule("H2O") for _ in range(3)]
    for k, atoms in enumerate(same_fields):
        atoms.info["vector"] = np.arange(5.0 if k == 2 else 3.0)
    with pytest.raises(SampleDataError, match=r"'vector' cannot be one array:.* shape \(5,\) in structure 2"):
        write_atoms(same_fields, tmp_path / "a.zarr")  # the same fields, but not one shape: the census refuses
    report = write_atoms(structures, tmp_path / "b.zarr", missing="fill")
    assert "vector" not in report.fields and report.dropped_reasons["vector"].startswith("cannot be one array")
    assert report.dropped["vector"] == 2
    del structures[2].info["vector"]
    report = write_atoms(structures, tmp_path / "c.zarr", missing="fill")
    assert report.filled == {"tags": 2, "flag": 2, "vector": 2}
    with AtomicDataZarrReader(tmp_path / "c.zarr") as reader:
        packed = reader.read_packed([0, 1, 2]).fields
    assert packed["tags"].tolist() == [1, 2, 3] + [-1] * 6 and packed["tags"].dtype == np.int64
    assert packed["flag"].tolist() == [True, False, False] and packed["flag_present"].tolist() == [True, False, False]
    assert packed["vector"][0].tolist() == [0.0, 1.0, 2.0] and np.isnan(packed["vector"][1:]).all()


def test_energies_are_float64_by_default_and_float32_warns(tmp_path: Path) -> None:
    from ase.calculators.singlepoint import SinglePointCalculator

    from dali_alchemi.errors import PrecisionLossWarning

    energies = [-98765.4321 + 0.0013 * k for k in range(5)]
    structures = []
    for energy in energies:
        atoms = bulk("Cu", "fcc", a=3.6)
        atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=np.zeros((1, 3)))
        structures.append(atoms)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float32 positions and forces lose nothing beyond the tolerance
        report = write_atoms(structures, tmp_path / "default.zarr")
    assert report.precision == {}
    with AtomicDataZarrReader(tmp_path / "default.zarr") as reader:
        fields = reader.read_packed(range(5)).fields
    assert fields["energy"].dtype == np.float64 and fields["energy"][:, 0].tolist() == energies
    assert fields["positions"].dtype == np.float32 and fields["cell"].dtype == np.float32
    with pytest.warns(PrecisionLossWarning, match=r"'energy' as float32 changed 5 values by more than 0.0001"):
        report = write_atoms(structures, tmp_path / "narrow.zarr", system_float_dtype=np.float32)
    assert report.precision["energy"].over == 5 and 1e-3 < report.precision["energy"].worst < 4e-3
    with AtomicDataZarrReader(tmp_path / "narrow.zarr") as reader:
        assert len(set(reader.read_packed(range(5)).fields["energy"][:, 0].tolist())) < 5  # collapsed, as warned


def test_cli_convert_policy_report_and_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.collections import g2

    monkeypatch.setenv("COLUMNS", "40")
    out = tmp_path / "g2.zarr"
    assert main(["convert", g2.filename, str(out), "--chunk", "10"]) == 2
    text = capsys.readouterr().out
    assert text.startswith("error: SampleDataError: The structures do not all have the same fields")
    assert "'initial_magmoms' is in structure 3 but not in structure 0" in text and _leftovers(tmp_path) == []
    assert main(["convert", g2.filename, str(out), "--missing", "fill"]) == 0
    text = capsys.readouterr().out
    assert "filled: initial_magmoms for 119 structures without it (see initial_magmoms_present)" in text
    said = " ".join(text.split())
    assert "left out: name (162 structures have it): not numeric (str)" in said
    assert "left out: unique_id (162 structures have it)" in said
    big = tmp_path / "big.extxyz"
    structures = [bulk("Cu", "fcc", a=3.6) for _ in range(5)]
    for k, atoms in enumerate(structures):
        atoms.calc = SinglePointCalculator(atoms, energy=-98765.4321 + 0.0013 * k)
    write(big, structures)
    assert main(["convert", str(big), str(tmp_path / "big.zarr")]) == 0
    assert "precision" not in capsys.readouterr().out
    assert main(["convert", str(big), str(tmp_path / "narrow.zarr"), "--system-float32", "--float64"]) == 0
    text = capsys.readouterr().out
    assert "precision: float32 changed 5 values of energy by more than 0.0001 (at most 0.00" in text
    with AtomicDataZarrReader(tmp_path / "narrow.zarr") as reader:
        fields = reader.read_packed(range(5)).fields
        assert fields["energy"].dtype == np.float32 and fields["positions"].dtype == np.float64


@pytest.mark.timeout(60)  # a hang detector only: the header is refused before ASE parses anything
@pytest.mark.parametrize("claimed", ["1000000000000", "3"])
def test_a_header_claiming_more_atoms_than_the_file_holds_is_refused(tmp_path: Path, claimed: str) -> None:
    path = tmp_path / "huge.xyz"
    path.write_text(f"2\nfirst\nH 0 0 0\nH 0 0 0.74\n{claimed}\nsecond\nH 0 0 0\n")
    store = tmp_path / "s.zarr"
    with pytest.raises(SampleDataError, match=rf"huge.xyz: frame 1 claims {int(claimed):,} atoms, but only 8 bytes"):
        convert([path], store)
    assert not store.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["huge.xyz"]
    assert main(["convert", str(path), str(store)]) != 0


@pytest.mark.timeout(60)
def test_a_tiny_cell_with_a_cutoff_is_a_clear_error_not_a_memory_blowup(tmp_path: Path) -> None:
    path = tmp_path / "tiny.xyz"
    write(path, bulk("Cu", "sc", a=0.01), format="extxyz")
    with pytest.raises(SampleDataError, match="periodic images of this cell"):
        convert([path], tmp_path / "s.zarr", cutoff=5.0)
    assert not (tmp_path / "s.zarr").exists()


def _water(n: int, *, forces: int) -> list[ase.Atoms]:
    """``n`` water molecules with energies; the first ``forces`` of them with forces too."""
    from ase.calculators.singlepoint import SinglePointCalculator

    out = []
    for k in range(n):
        atoms = molecule("H2O")
        atoms.rattle(0.01, seed=k)
        results = {"energy": -14.0 + 0.1 * k, **({"forces": np.full((3, 3), 0.1 * k)} if k < forces else {})}
        atoms.calc = SinglePointCalculator(atoms, **results)
        out.append(atoms)
    return out


def test_cli_convert_says_which_fields_it_added_and_why(
    extxyz: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["convert", str(extxyz), str(tmp_path / "edges.zarr"), "--cutoff", "2.8"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert said.count("added atomic_masses: ASE's masses (the input's own, else each element's standard mass)") == 1
    assert said.count("added neighbor_list (atom pairs within 2.8 Å) with each pair's periodic image") == 1
    assert "neighbor_list_shifts (int64 cell offsets, what its models read)" in said
    assert "shifts (the same in Å, neighbor_list_shifts @ cell)" in said
    with AtomicDataZarrReader(tmp_path / "edges.zarr") as reader:
        packed = reader.read_packed(range(2))
    images, shifts, cell = (packed.fields[k] for k in ("neighbor_list_shifts", "shifts", "cell"))
    assert images.dtype == np.int64 and shifts.dtype == np.float32 and len(shifts) == len(images) > 0
    first = int(packed.n_edges[0])  # the first structure's edges: its shifts are its images in its cell
    assert np.allclose(shifts[:first], images[:first] @ cell[0], atol=1e-5)
    moving = tmp_path / "moving.traj"
    atoms = molecule("H2O")
    atoms.set_velocities(np.ones((3, 3)))
    write(moving, [atoms])
    assert main(["convert", str(moving), str(tmp_path / "moving.zarr")]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "wrote 1 structure (3 atoms" in said and "added neighbor_list" not in said
    assert "kept momenta: the input's velocities as ASE holds them (masses x velocities)" in said


def test_cli_convert_missing_drop_says_the_structures_are_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    path = tmp_path / "part.extxyz"
    write(path, _water(12, forces=9))
    assert main(["convert", str(path), str(tmp_path / "drop.zarr"), "--missing", "drop"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "wrote 12 structures" in said
    assert (
        "left out: forces, which 3 of 12 structures lack (--missing drop: every structure is written, none with "
        "forces; --missing fill keeps it)" in said
    )
    with AtomicDataZarrReader(tmp_path / "drop.zarr") as reader:
        assert len(reader) == 12 and "forces" not in reader.field_names and "energy" in reader.field_names
    report = write_atoms(_water(12, forces=9), tmp_path / "api.zarr", missing="drop")
    assert report.lacking == {"forces": 3} and report.dropped == {"forces": 9}
    assert write_atoms(_water(4, forces=4), tmp_path / "all.zarr", missing="drop").lacking == {}


def test_convert_writes_its_chunks_in_one_streamed_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dali_alchemi.store.write.writer import AtomicDataZarrWriter

    calls: list[str] = []
    write, append = AtomicDataZarrWriter.write, AtomicDataZarrWriter.append

    def recorded(name: str, method: object) -> object:
        def call(self: AtomicDataZarrWriter, *args: object, **kwargs: object) -> object:
            calls.append(name)
            return method(self, *args, **kwargs)  # type: ignore[operator]

        return call

    monkeypatch.setattr(AtomicDataZarrWriter, "write", recorded("write", write))
    monkeypatch.setattr(AtomicDataZarrWriter, "append", recorded("append", append))
    structures = _structures(7)
    report = write_atoms(structures, tmp_path / "out.zarr", chunk=3)
    assert calls == ["write"] and (report.structures, report.atoms) == (7, sum(len(a) for a in structures))
    with AtomicDataZarrReader(tmp_path / "out.zarr") as reader:
        assert reader.read_packed(range(7)).n_atoms.tolist() == [len(a) for a in structures]
