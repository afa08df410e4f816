"""A store nvalchemi 0.2.0 wrote, rewritten to each layout, reads back equal in nvalchemi and here.

Runs only where nvalchemi is importable (``make parity``); skipped elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

nv_zarr = pytest.importorskip("nvalchemi.data.datapipes.backends.zarr", reason="nvalchemi-toolkit is not installed")

from dali_alchemi import AtomicDataZarrReader  # noqa: E402
from dali_alchemi.bench.synth import write_synthetic_store_nvalchemi  # noqa: E402
from dali_alchemi.store.write.rewrite import rewrite_store  # noqa: E402


@pytest.fixture(scope="module")
def theirs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_store_nvalchemi(tmp_path_factory.mktemp("nv") / "nv.zarr", 120, seed=5)


@pytest.mark.parametrize("name", ["default", "uncompressed", "compressed"])
def test_nvalchemi_reads_its_store_rewritten(theirs: Path, tmp_path: Path, name: str) -> None:
    out = tmp_path / f"{name}.zarr"
    rewrite_store(theirs, out, name)
    before, after = nv_zarr.AtomicDataZarrReader(str(theirs)), nv_zarr.AtomicDataZarrReader(str(out))
    ours = AtomicDataZarrReader(out)
    assert len(before) == len(after) == len(ours) == 120
    order = [0, 119, 7, 64, 7, -1]
    for (a, _), (b, _), (c, _) in zip(before.read_many(order), after.read_many(order), ours.read_many(order), strict=True):
        assert set(a) == set(b) == set(c)
        for key in a:
            assert a[key].dtype == b[key].dtype == c[key].dtype, key
            assert np.array_equal(a[key].numpy(), b[key].numpy()) and np.array_equal(a[key].numpy(), c[key].numpy()), key
    assert before.field_levels == after.field_levels
