"""After a repair, nvalchemi-toolkit 0.2.0's own reader returns the true neighbor lists too.

Before it, nvalchemi's reader silently returns shifted indices for every appended structure of the
vendored stores (nvalchemi wrote them; tests/fixtures/make_nv_appended.py). Runs only where nvalchemi
is importable (``make parity``); skipped elsewhere.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrWriter, repair_store

nv_zarr = pytest.importorskip("nvalchemi.data.datapipes.backends.zarr", reason="nvalchemi-toolkit is not installed")

# store -> structures nvalchemi's reader returns wrong before the repair (all the appended ones)
WRONG_BEFORE = {"list": 8, "batch": 9, "single": 8, "sink": 7, "defragment": 8}


def _truth(nv_fixture: Path, name: str) -> list[np.ndarray]:
    with np.load(nv_fixture / f"nv_append_{name}.truth.npz") as npz:
        return [npz[f"nl/{i}"] for i in range(len(npz["n_atoms"]))]


def _theirs(path: Path) -> list[np.ndarray]:
    reader = nv_zarr.AtomicDataZarrReader(str(path))
    try:
        return [s["neighbor_list"].numpy() for s, _ in reader.read_many(list(range(len(reader))))]
    finally:
        reader.close()


@pytest.mark.parametrize("name", list(WRONG_BEFORE))
def test_nvalchemi_reads_true_neighbor_lists_after_repair(nv_fixture: Path, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.zarr"
    shutil.copytree(nv_fixture / f"nv_append_{name}.zarr", path)
    truth = _truth(nv_fixture, name)
    before = _theirs(path)
    wrong = sum(not np.array_equal(b, t) for b, t in zip(before, truth, strict=True))
    assert wrong == WRONG_BEFORE[name]
    AtomicDataZarrWriter(path).repair()
    after = _theirs(path)
    assert len(after) == len(truth)
    for i, (a, t) in enumerate(zip(after, truth, strict=True)):
        assert a.dtype == t.dtype and np.array_equal(a, t), f"{name} sample {i}"


def test_nvalchemi_reads_a_repaired_copy(nv_fixture: Path, tmp_path: Path) -> None:
    out = tmp_path / "copy.zarr"
    repair_store(nv_fixture / "nv_append_batch.zarr", out=out)
    assert all(np.array_equal(a, t) for a, t in zip(_theirs(out), _truth(nv_fixture, "batch"), strict=True))
