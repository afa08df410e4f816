"""store/read/identity.py: a copy of a reader serves exactly its parent's state, told apart by segment checksums."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrWriter
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.store.format.location import resolve_store
from dali_alchemi.store.read import pointers
from dali_alchemi.store.read.identity import identify, incompatibility, served_as
from dali_alchemi.store.read.snapshot import Snapshot, open_snapshot


@pytest.fixture(autouse=True)
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pointers, "SEGMENT_ROWS", 4)  # 40 samples: ten whole segments


def _open(path: Path) -> Snapshot:
    return open_snapshot(resolve_store(path, read_only=True, must_exist=False))


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    path = tmp_path / "s.zarr"
    writer = AtomicDataZarrWriter(path)
    writer.write(synthetic_samples(40, seed=1, min_atoms=1, max_atoms=6))
    writer.delete([1, 30])
    return path


def test_a_grown_store_is_served_as_the_parent_had_it(store: Path) -> None:
    parent = _open(store)
    identity = identify(parent, ("positions",))
    AtomicDataZarrWriter(store).append(synthetic_samples(6, seed=2, min_atoms=1, max_atoms=6))
    served = served_as(identity, _open(store))
    assert isinstance(served, Snapshot)
    assert (served.n_physical, served.n_live) == (40, 38)
    np.testing.assert_array_equal(served.atoms_ptr, parent.atoms_ptr)
    np.testing.assert_array_equal(served.physical(np.arange(38)), np.setdiff1d(np.arange(40), [1, 30]))
    assert incompatibility(parent, _open(store), ("positions",)) is None


def test_a_sample_deleted_inside_a_whole_segment_is_told(store: Path) -> None:
    parent = _open(store)
    identity = identify(parent, ("positions",))
    AtomicDataZarrWriter(store).delete([9])  # segment 2 of 10
    fresh = _open(store)
    assert served_as(identity, fresh) == (
        "the pointers or deleted samples of its first 40 physical samples changed (a delete or a defragment)"
    )
    assert (
        incompatibility(parent, fresh, ("positions",))
        == "1 of its samples were deleted (physical 9) and their rows zeroed"
    )
