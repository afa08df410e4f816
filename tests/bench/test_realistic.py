"""The physics-realistic store (ASE EMT molecular dynamics) and what the default layout costs on disk there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ase")

from dali_alchemi.bench.realistic import emt_frames
from dali_alchemi.config import layout_config
from dali_alchemi.interop.ase_io import write_atoms
from dali_alchemi.store.read.reader import AtomicDataZarrReader
from dali_alchemi.store.read.summary import summarize

FRAMES = 150


def test_frames_are_a_trajectory_with_forces_and_velocities() -> None:
    frames = list(emt_frames(3, repeat=2))
    assert [len(f) for f in frames] == [32, 32, 32]
    assert not np.allclose(frames[0].positions, frames[1].positions)  # the atoms move
    assert all(f.get_forces().shape == (32, 3) and np.isfinite(f.get_potential_energy()) for f in frames)
    assert np.abs(frames[2].get_velocities()).max() > 0


@pytest.fixture(scope="module")
def emt_stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("emt")
    frames = list(emt_frames(FRAMES))  # one trajectory, written in both layouts
    paths = {}
    for name in ("compressed", "default"):
        paths[name] = root / f"{name}.zarr"
        write_atoms(frames, paths[name], cutoff=4.0, config=layout_config(name))
    return paths


def test_the_default_layout_stores_the_same_values(emt_stores: dict[str, Path]) -> None:
    with AtomicDataZarrReader(emt_stores["compressed"]) as old, AtomicDataZarrReader(emt_stores["default"]) as new:
        assert len(old) == len(new) == FRAMES
        a, b = old.read_packed(np.arange(FRAMES)), new.read_packed(np.arange(FRAMES))
        assert set(a.fields) == set(b.fields) >= {"positions", "forces", "momenta", "neighbor_list"}
        for name in a.fields:
            assert a.fields[name].dtype == b.fields[name].dtype
            np.testing.assert_array_equal(a.fields[name], b.fields[name])


def test_the_default_layout_costs_at_most_a_fifth_more_disk(emt_stores: dict[str, Path]) -> None:
    sizes = {name: summarize(str(path)).bytes_on_disk for name, path in emt_stores.items()}
    assert sizes["default"] <= 1.2 * sizes["compressed"], sizes
    arrays = {a.name: a for a in summarize(str(emt_stores["default"])).arrays}
    for raw in ("positions", "forces", "momenta"):  # they compress little: stored raw, read in place
        assert arrays[raw].codecs == ("sharding(bytes,crc32c)",), arrays[raw].codecs
    for dense in ("atomic_numbers", "neighbor_list", "shifts"):
        assert "blosc" in arrays[dense].codecs[0] and arrays[dense].shards is not None
