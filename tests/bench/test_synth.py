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
