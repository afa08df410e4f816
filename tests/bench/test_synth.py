from __future__ import annotations

import numpy as np
import pytest

from dali_alchemi.bench.synth import size_plan, synthetic_samples


def test_size_plan_follows_the_reference_recipe() -> None:
    import random

    rng = random.Random(42)
    expected = []
    for _ in range(50):
        atoms = rng.randint(10, 100)
        expected.append((atoms, rng.randint(1, 4 * atoms)))
    atoms, edges = size_plan(50, 42)
    assert list(zip(atoms.tolist(), edges.tolist(), strict=True)) == expected


def test_synthetic_samples_are_deterministic_and_valid() -> None:
    a, b = synthetic_samples(20, seed=3), synthetic_samples(20, seed=3)
    assert len(a.fields) == 11
    for key in a.fields:
        assert np.array_equal(a.fields[key], b.fields[key]), key
    assert not np.array_equal(synthetic_samples(20, seed=4).fields["positions"][:10], a.fields["positions"][:10])
    owner_atoms = np.repeat(a.n_atoms, a.n_edges)
    assert (a.fields["neighbor_list"] >= 0).all() and (a.fields["neighbor_list"] < owner_atoms[:, None]).all()
    assert a.fields["atomic_numbers"].min() >= 1 and a.fields["atomic_numbers"].max() <= 19
    assert a.fields["cell"].shape == (20, 3, 3) and a.fields["pbc"].all()


def test_synthetic_energies_are_float64_and_the_rest_keeps_its_dtypes() -> None:
    a = synthetic_samples(30, seed=7)
    dtypes = {name: values.dtype for name, values in a.fields.items()}
    assert dtypes["energy"] == np.float64 and dtypes["positions"] == dtypes["forces"] == dtypes["cell"] == np.float32
    rng = np.random.default_rng(7)  # the same values as float32 draws: the stream is unchanged
    total_atoms, total_edges = int(a.n_atoms.sum()), int(a.n_edges.sum())
    rng.integers(1, 20, size=total_atoms, dtype=np.int64)
    rng.random((total_edges, 2))
    for shape in ((total_atoms, 3), (total_atoms, 3), (total_edges, 3)):
        rng.standard_normal(shape, dtype=np.float32)
    assert a.fields["energy"].tolist() == rng.standard_normal((30, 1), dtype=np.float32).tolist()


def test_bad_sizes() -> None:
    with pytest.raises(ValueError, match="min_atoms"):
        size_plan(3, min_atoms=5, max_atoms=4)


def test_synthetic_config_follows_the_named_layout_with_or_without_checksums() -> None:
    from dali_alchemi.bench.synth import synthetic_config

    plain = synthetic_config(checksum=False)
    laid_out = {name: plain.for_array("core", name) for name in ("positions", "neighbor_list")}
    assert all(not cfg.checksum for cfg in laid_out.values()) and not plain.for_array("meta", "atoms_ptr").checksum
    assert laid_out["positions"].compressors == () and laid_out["neighbor_list"].compressors  # the default layout
    compressed = synthetic_config(layout="compressed")
    assert compressed.for_array("core", "positions").chunk_size is None  # 4 MiB chunks, as before
    assert synthetic_config("none").for_array("core", "atomic_numbers").compressors == ()


def test_synthetic_parts_follow_size_plan_and_start_as_synthetic_samples() -> None:
    from dali_alchemi.bench.synth import synthetic_parts

    parts = list(synthetic_parts(50, seed=5, min_atoms=1, max_atoms=4, structures=16))
    assert [len(p) for p in parts] == [16, 16, 16, 2]
    atoms, edges = size_plan(50, 5, 1, 4)
    assert np.array_equal(np.concatenate([p.n_atoms for p in parts]), atoms)
    assert np.array_equal(np.concatenate([p.n_edges for p in parts]), edges)
    first = synthetic_samples(16, seed=5, min_atoms=1, max_atoms=4)
    assert all(np.array_equal(parts[0].fields[k], first.fields[k]) for k in first.fields)
    again = list(synthetic_parts(50, seed=5, min_atoms=1, max_atoms=4, structures=16))
    assert all(np.array_equal(a.fields[k], b.fields[k]) for a, b in zip(parts, again, strict=True) for k in a.fields)
    with pytest.raises(ValueError, match=r"^parts need at least one structure, got structures=0$"):
        next(synthetic_parts(5, structures=0))


def test_a_part_holds_at_most_part_bytes() -> None:
    from dali_alchemi.bench.synth import PART_BYTES, part_structures, synthetic_parts

    structures = part_structures(4)
    assert structures > 50_000
    part = next(synthetic_parts(structures, seed=1, min_atoms=4, max_atoms=4))
    assert len(part) == structures and sum(v.nbytes for v in part.fields.values()) <= PART_BYTES


def test_write_synthetic_store_writes_the_store_part_by_part(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dali_alchemi import AtomicDataZarrReader
    from dali_alchemi.bench import synth

    monkeypatch.setattr(synth, "part_structures", lambda max_atoms: 7)
    synth.write_synthetic_store(tmp_path / "s.zarr", 30, seed=2, min_atoms=1, max_atoms=5)
    parts = list(synth.synthetic_parts(30, seed=2, min_atoms=1, max_atoms=5, structures=7))
    want = np.concatenate([p.fields["positions"] for p in parts])
    assert not np.array_equal(want, synthetic_samples(30, seed=2, min_atoms=1, max_atoms=5).fields["positions"])
    with AtomicDataZarrReader(tmp_path / "s.zarr") as reader:
        got = reader.read_packed(range(30))
        assert np.array_equal(got.fields["positions"], want)
        assert np.array_equal(got.n_atoms, np.concatenate([p.n_atoms for p in parts]))
