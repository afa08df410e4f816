"""Files foundation-model datasets ship in (extxyz, ASE SQLite databases, fairchem's ASE-LMDB files),
written by ASE and ase-db-backends themselves, read whole and by frame range, counted, and converted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ase = pytest.importorskip("ase")
pytest.importorskip("ase_db_backends")
import ase.db  # noqa: E402, F811
from ase.calculators.singlepoint import SinglePointCalculator  # noqa: E402
from ase.io import write  # noqa: E402

from dali_alchemi import AtomicDataZarrReader, InputNotFoundError, SampleDataError  # noqa: E402
from dali_alchemi.cli import main  # noqa: E402
from dali_alchemi.interop import ase_sources  # noqa: E402
from dali_alchemi.interop.ase_io import check_xyz_counts, convert, read_structures  # noqa: E402
from dali_alchemi.interop.ase_sources import count_structures  # noqa: E402

N = 12
KINDS = ("extxyz", "db", "aselmdb")
READ_KINDS = (*KINDS, "json", "traj")


def _structures(n: int, first: int = 0) -> list[ase.Atoms]:
    """``n`` small periodic structures with a calculator's energy, forces and stress, and (in ``info``)
    the two values a database keeps as a key-value pair and as data."""
    out = []
    for k in range(first, first + n):
        rng = np.random.default_rng(k)
        size = 2 + k % 3
        atoms = ase.Atoms(numbers=[8, 1, 1, 6][:size] if size < 4 else [8, 1, 1, 6], cell=np.eye(3) * (5 + 0.1 * k),
                          positions=rng.uniform(0, 5, (size, 3)), pbc=True)  # fmt: skip
        atoms.calc = SinglePointCalculator(
            atoms, energy=-100.0 - k / 7, forces=rng.normal(size=(size, 3)), stress=rng.normal(size=6)
        )
        atoms.info.update(step=k, charges=np.arange(3.0) + k)
        out.append(atoms)
    return out


def _write(path: Path, structures: list[ase.Atoms]) -> Path:
    """``structures`` written by ASE (extxyz: ``info`` in the comment line) or by ``ase.db`` (SQLite, or
    ase-db-backends' ASE-LMDB writer): ``step`` as a key-value pair, ``charges`` as data."""
    if path.suffix in (".extxyz", ".traj"):
        write(path, structures)
        return path
    with ase.db.connect(str(path)) as db:
        for atoms in structures:
            db.write(atoms, step=int(atoms.info["step"]), data={"charges": atoms.info["charges"]})
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sources")
    return {kind: _write(folder / f"in.{kind}", _structures(N)) for kind in READ_KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_each_format_converts_field_for_field(kind: str, sources: dict[str, Path], tmp_path: Path) -> None:
    want = _structures(N)
    report = convert([sources[kind]], tmp_path / "out.zarr", chunk=5)
    assert report.structures == N and report.atoms == sum(len(a) for a in want)
    assert {name: report.fields[name] for name in ("energy", "forces", "stress", "step", "charges")} == {
        "energy": "system", "forces": "atom", "stress": "system", "step": "system", "charges": "system",
    }  # fmt: skip
    assert report.custom == ["charges", "step"]
    with AtomicDataZarrReader(tmp_path / "out.zarr") as reader:
        assert len(reader) == N
        for i in (0, 5, N - 1):
            got = reader.read(i)[0]
            assert got["positions"].dtype.itemsize == 4 and got["energy"].dtype.itemsize == 8
            assert np.array_equal(got["atomic_numbers"].numpy(), want[i].numbers)
            assert np.allclose(got["positions"].numpy(), want[i].positions, atol=1e-5)
            assert np.allclose(got["cell"].numpy()[0], want[i].cell.array, atol=1e-5)
            assert float(got["energy"]) == want[i].get_potential_energy()  # float64: exact
            assert np.allclose(got["forces"].numpy(), want[i].get_forces(), atol=1e-5)
            assert np.allclose(got["stress"].numpy()[0], want[i].get_stress(voigt=False))
            assert int(got["step"]) == i and got["step"].dtype.is_floating_point is False
            assert np.array_equal(got["charges"].numpy()[0], np.arange(3.0) + i)


@pytest.mark.parametrize("kind", READ_KINDS)
@pytest.mark.parametrize("index", ["3:7", "0:2", "9:", ":4", "10:40", "5:5", "40:50"])
def test_a_range_is_the_slice_of_the_whole_read(kind: str, index: str, sources: dict[str, Path]) -> None:
    whole = list(read_structures(sources[kind]))
    start, stop = (int(p) if p else None for p in index.split(":"))
    part = list(read_structures(sources[kind], index=index))
    assert len(part) == len(whole[start:stop])
    for got, want in zip(part, whole[start:stop], strict=True):
        assert (
            np.array_equal(got.positions, want.positions) and got.get_potential_energy() == want.get_potential_energy()
        )
        assert _step(got) == _step(want)


def _step(atoms: ase.Atoms) -> int:
    """The structure's ``step``: in ``info`` from extxyz and trajectories, among the key-value pairs from a database."""
    return int(atoms.info["step"] if "step" in atoms.info else atoms.info["key_value_pairs"]["step"])


@pytest.mark.parametrize("kind", [*READ_KINDS, "extxyz.gz"])
def test_count_structures_is_the_number_read(kind: str, sources: dict[str, Path], tmp_path: Path) -> None:
    path = sources.get(kind)
    if path is None:
        path = tmp_path / f"in.{kind}"
        write(path, _structures(N))
    assert count_structures(path) == N == sum(1 for _ in read_structures(path))


def test_an_sqlite_database_is_read_a_page_at_a_time(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ase_sources, "DATABASE_PAGE", 4)
    path = _write(tmp_path / "paged.db", _structures(N))
    stream = read_structures(path)
    assert next(stream).get_potential_energy() == -100.0
    with ase.db.connect(str(path)) as other:  # rows past the first page are not read yet
        other.delete(list(range(9, N + 1)))
    assert [a.info["key_value_pairs"]["step"] for a in stream] == list(range(1, 8))
    assert [a.info["key_value_pairs"]["step"] for a in read_structures(path, index="2:6")] == [2, 3, 4, 5]


def test_an_aselmdb_file_is_read_a_row_at_a_time(sources: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from ase_db_backends.aselmdb import LMDBDatabase

    decoded = []
    original = LMDBDatabase._get_row

    def counting(self: LMDBDatabase, idx: int, include_data: bool = True) -> object:
        decoded.append(idx)
        return original(self, idx, include_data)

    monkeypatch.setattr(LMDBDatabase, "_get_row", counting)
    stream = read_structures(sources["aselmdb"], index="4:")
    assert next(stream).get_potential_energy() == -100.0 - 4 / 7
    assert decoded == [5]  # ids start at 1: only the row yielded was decoded, none before it
    assert len(list(stream)) == N - 5 and decoded == list(range(5, N + 1))


def test_many_files_and_a_folder_of_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "shards"
    folder.mkdir()
    _write(folder / "b.db", _structures(4, first=4))
    _write(folder / "a.extxyz", _structures(4))
    _write(folder / "c.aselmdb", _structures(4, first=8))
    (folder / "notes.txt").write_text("not an input")
    for lock in folder.glob("*-lock"):  # the LMDB writer's; a reader makes none
        lock.unlink()
    before = sorted(p.name for p in folder.iterdir())
    report = convert([folder], tmp_path / "folder.zarr", chunk=3)
    assert report.structures == 12
    assert sorted(p.name for p in folder.iterdir()) == before == ["a.extxyz", "b.db", "c.aselmdb", "notes.txt"]
    with AtomicDataZarrReader(tmp_path / "folder.zarr") as reader:
        assert [int(reader.read(i)[0]["step"]) for i in range(12)] == list(range(12))  # a, b, c in name order
    report = convert([folder / "c.aselmdb", folder / "a.extxyz"], tmp_path / "two.zarr")
    with AtomicDataZarrReader(tmp_path / "two.zarr") as reader:
        assert [int(reader.read(i)[0]["step"]) for i in range(8)] == [8, 9, 10, 11, 0, 1, 2, 3]
    assert main(["convert", str(folder), str(tmp_path / "cli.zarr")]) == 0
    assert "wrote 12 structures" in capsys.readouterr().out


def test_a_failure_names_the_file_and_the_frame(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.extxyz", _structures(3))
    bad = _write(tmp_path / "bad.extxyz", _structures(4))
    lines = bad.read_text().splitlines(keepends=True)
    third = sum(2 + len(a) for a in _structures(2))  # the header of frame 2
    lines[third + 2] = "O 0.0 oops 0.0\n"
    bad.write_text("".join(lines))
    with pytest.raises(
        SampleDataError,
        match=rf"^{bad}: frame 2 \(counted from 0\) cannot be read: ValueError: .*oops.*; fix that frame or leave the file out",
    ):
        convert([good, bad], tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()
    with pytest.raises(SampleDataError, match=rf"^{bad}: frame 2 \(counted from 0\) cannot be read"):
        list(read_structures(bad, index="1:3"))
    assert check_xyz_counts(bad) == 4
    gap = tmp_path / "gap.extxyz"
    gap.write_text("1\nfirst\nH 0 0 0\n\n1\nsecond\nH 1 1 1\n\n")  # ASE's parser stops at the blank line
    for read in (check_xyz_counts, count_structures, lambda path: list(read_structures(path))):
        with pytest.raises(SampleDataError, match=rf"^{gap}: a blank line before frame 1 ends the file .* leave out"):
            read(gap)
    gap.write_text("1\nfirst\nH 0 0 0\n\n\n")  # blank lines at the end are no frames
    assert count_structures(gap) == len(list(read_structures(gap))) == 1


def test_missing_inputs_and_corrupt_databases_are_named(tmp_path: Path) -> None:
    for missing in (tmp_path / "gone.aselmdb", tmp_path / "gone.db", tmp_path / "gone.extxyz"):
        with pytest.raises(InputNotFoundError, match=rf"^Input {missing} does not exist"):
            read_structures(missing)
        with pytest.raises(InputNotFoundError, match=rf"^Input {missing} does not exist"):
            count_structures(missing)
        with pytest.raises(InputNotFoundError, match=rf"^Input {missing} does not exist"):
            convert([missing], tmp_path / "out.zarr")
    assert not (tmp_path / "gone.db").exists()  # not created by sqlite on the way
    for kind in KINDS:
        (tmp_path / f"empty.{kind}").touch()
        for read in (read_structures, count_structures):
            with pytest.raises(
                SampleDataError, match=rf"^{tmp_path / f'empty.{kind}'} is empty: it holds no structures"
            ):
                read(tmp_path / f"empty.{kind}")
        assert (tmp_path / f"empty.{kind}").stat().st_size == 0  # not made a database of
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputNotFoundError, match=r"folder .*empty holds no \*\.extxyz, \*\.xyz, \*\.aselmdb, \*\.db"):
        convert([tmp_path / "empty"], tmp_path / "out.zarr")
    for name, says in (
        ("broken.aselmdb", "cannot be opened as an ASE aselmdb database: InvalidError: .*File is not an LMDB file"),
        ("broken.db", r"is not an SQLite database \(it does not start with b'SQLite format 3"),
    ):
        (tmp_path / name).write_bytes(b"this is not a database\n" * 300)
        for read in (lambda path: list(read_structures(path)), count_structures):
            with pytest.raises(SampleDataError, match=rf"^{tmp_path / name} {says}"):
                read(tmp_path / name)
        with pytest.raises(SampleDataError, match=rf"^{tmp_path / name} {says}"):
            convert([tmp_path / name], tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()


def test_a_truncated_aselmdb_file_is_refused_not_read_as_empty(tmp_path: Path) -> None:
    whole = _write(tmp_path / "whole.aselmdb", _structures(60)).read_bytes()
    cut = tmp_path / "cut.aselmdb"
    cut.write_bytes(whole[: len(whole) // 2])  # LMDB read this as an empty database (or crashed on it)
    says = rf"^{cut} is truncated: its pages need {len(whole):,} bytes, the file holds {len(whole) // 2:,}"
    for read in (lambda path: list(read_structures(path)), count_structures):
        with pytest.raises(SampleDataError, match=says):
            read(cut)
