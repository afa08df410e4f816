"""Stores written by dali_alchemi open in nvalchemi-toolkit 0.2.0 and read back equal.

Runs only where nvalchemi is importable (``make parity`` builds such an environment); skipped elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig

nv_zarr = pytest.importorskip("nvalchemi.data.datapipes.backends.zarr", reason="nvalchemi-toolkit is not installed")


@pytest.mark.parametrize("raw", [False, True], ids=["compressed", "uncompressed"])
@pytest.mark.parametrize("sharded", [False, True])
def test_nvalchemi_reads_a_store_we_wrote_appended_and_extended(tmp_path: Path, sharded: bool, raw: bool) -> None:
    options = {"compressors": ()} if raw else {}
    config = WriteConfig(core=ArrayConfig(chunk_size=64, shard_size=128 if sharded else None, **options))
    samples = synthetic_samples(40, seed=3).split()
    path = tmp_path / "ours.zarr"
    writer = AtomicDataZarrWriter(path, config)
    writer.write(samples[:25])
    writer.append(samples[25:])
    writer.add_custom("tag", np.arange(40, dtype=np.int32), "system")
    writer.delete([5])
    theirs = nv_zarr.AtomicDataZarrReader(str(path))
    ours = AtomicDataZarrReader(path, cache_bytes=0)  # an uncompressed store's rows are then read in place
    assert len(theirs) == len(ours) == 39
    order = [0, 38, 5, 20, 24, 25, -1, 3, 3]
    for (a, _), (b, _) in zip(theirs.read_many(order), ours.read_many(order), strict=True):
        assert set(a) == set(b)
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            assert np.array_equal(a[key].numpy(), b[key].numpy()), key
    assert theirs.field_levels == ours.field_levels
    assert (ours.stats().files_read > 0) == raw


@pytest.mark.parametrize("sharded", [False, True])
def test_nvalchemi_reads_our_checksummed_complete_stores_after_every_operation(tmp_path: Path, sharded: bool) -> None:
    import json

    config = WriteConfig(core=ArrayConfig(chunk_size=32, shard_size=128 if sharded else None))
    samples = synthetic_samples(30, seed=9)
    samples.fields["forces"][: int(samples.atoms_ptr[10])] = 0.0  # all-zero chunks: written all the same
    parts = samples.split()
    path = tmp_path / "ours.zarr"
    writer = AtomicDataZarrWriter(path, config)
    writer.write(parts[:20])
    root = json.loads((path / "zarr.json").read_text())["attributes"]
    assert {k: root["dali_alchemi"][k] for k in ("complete_chunks", "checksums")} == {
        "complete_chunks": True,
        "checksums": "crc32c",
    }
    codecs = json.loads((path / "core" / "forces" / "zarr.json").read_text())["codecs"]
    inner = codecs[0]["configuration"]["codecs"] if sharded else codecs
    assert inner[-1] == {"name": "crc32c"}
    writer.append(parts[20:])
    writer.add_custom("tag", np.arange(30, dtype=np.int32), "system")
    writer.delete([0, 1, 2])
    for stage in ("operations", "defragmented"):
        theirs = nv_zarr.AtomicDataZarrReader(str(path))
        ours = AtomicDataZarrReader(path)
        assert len(theirs) == len(ours) == 27, stage
        for (a, _), (b, _) in zip(theirs.read_many(range(27)), ours.read_many(range(27)), strict=True):
            assert set(a) == set(b), stage
            for key in a:
                assert np.array_equal(a[key].numpy(), b[key].numpy()), (stage, key)
        writer.defragment()


def test_we_read_a_store_nvalchemi_wrote(tmp_path: Path) -> None:
    import torch
    from nvalchemi.data import AtomicData

    samples = synthetic_samples(12, seed=5).split()
    data = [AtomicData(**{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in s.items()}) for s in samples]
    path = tmp_path / "theirs.zarr"
    nv_zarr.AtomicDataZarrWriter(str(path)).write(data)
    theirs = nv_zarr.AtomicDataZarrReader(str(path))
    ours = AtomicDataZarrReader(path)
    for (a, _), (b, _) in zip(theirs.read_many(range(12)), ours.read_many(range(12)), strict=True):
        for key in a:
            assert np.array_equal(a[key].numpy(), b[key].numpy()), key


def test_verify_on_a_store_nvalchemi_wrote_checks_what_it_can(tmp_path: Path) -> None:
    import torch
    from nvalchemi.data import AtomicData

    from dali_alchemi import verify_store

    samples = synthetic_samples(12, seed=6).split()
    data = [AtomicData(**{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in s.items()}) for s in samples]
    path = tmp_path / "theirs.zarr"
    nv_zarr.AtomicDataZarrWriter(str(path)).write(data)
    report = verify_store(path)
    assert report.ok, report.problems
    assert not report.complete_chunks and report.checksums is None
    assert "core/positions" in report.unchecksummed and "meta/samples_mask" in report.unchecksummed
