"""rewrite_store: the same structures, fields, custom arrays and deleted masks in another layout, or none."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter
from dali_alchemi.bench.http_server import StoreServer
from dali_alchemi.bench.synth import synthetic_config, write_synthetic_store
from dali_alchemi.config import layout_config
from dali_alchemi.errors import ConfigError, StoreExistsError, StoreNotFoundError
from dali_alchemi.store.format import layout
from dali_alchemi.store.write.rewrite import rewrite_store, staging_path
from tests.processes import HANG_S

N = 600
DELETED = [0, 17, 301, N - 1]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An old-layout store with soft-deleted samples and a custom array."""
    path = write_synthetic_store(tmp_path_factory.mktemp("rw") / "src.zarr", N, config=layout_config("compressed"))
    writer = AtomicDataZarrWriter(path)
    writer.add_custom("tag", np.arange(N, dtype=np.int32) * 3, "system")
    writer.delete(DELETED)
    return path


def _same_store(a: Path | str, b: Path) -> None:
    with AtomicDataZarrReader(a) as old, AtomicDataZarrReader(b) as new:
        assert len(old) == len(new) and old.field_levels == new.field_levels
        idx = np.arange(len(old))
        x, y = old.read_packed(idx), new.read_packed(idx)
        for name, values in x.fields.items():
            assert values.dtype == y.fields[name].dtype and np.array_equal(values, y.fields[name]), name


@pytest.mark.parametrize("name", ["default", "uncompressed", "compressed", "inflate"])
def test_every_layout_keeps_structures_fields_custom_arrays_and_deleted_masks(
    source: Path, tmp_path: Path, name: str
) -> None:
    report = rewrite_store(source, tmp_path / "out.zarr", name)
    out = tmp_path / "out.zarr"
    assert (report.samples, report.deleted_kept) == (N - len(DELETED), len(DELETED))
    _same_store(source, out)
    old, new = zarr.open_group(str(source), mode="r"), zarr.open_group(str(out), mode="r")
    for meta in layout.META_ARRAYS:  # pointers and masks as stored: the deleted samples stay deleted
        assert np.array_equal(old[f"meta/{meta}"][:], new[f"meta/{meta}"][:]), meta
    assert np.array_equal(old["custom/tag"][:], new["custom/tag"][:])  # deleted rows included
    assert new.attrs["dali_alchemi"]["checksums"] == "crc32c" and new.attrs["dali_alchemi"]["complete_chunks"]
    codecs = str(new["core/positions"].metadata.codecs)
    assert ("Sharding" in codecs) == (name in ("default", "inflate"))
    if name == "inflate":  # what the default compresses, as byte-shuffled LZ4 blocks DALI can inflate on a GPU
        assert "Shuffle" in str(new["core/atomic_numbers"].metadata.codecs)
        with AtomicDataZarrReader(out) as reader:
            assert reader.field_specs["atomic_numbers"].inflate is not None
            assert np.array_equal(new["core/atomic_numbers"][:], old["core/atomic_numbers"][:])  # plain zarr reads it
    elif name != "default":  # the default layout compresses an array or keeps it raw by its disk budget
        assert ("Blosc" in codecs) == (name == "compressed")
    assert not staging_path(out).exists()


def test_compact_drops_the_deleted_samples(source: Path, tmp_path: Path) -> None:
    report = rewrite_store(source, tmp_path / "out.zarr", compact=True)
    assert (report.samples, report.deleted_kept) == (N - len(DELETED), 0)
    _same_store(source, tmp_path / "out.zarr")
    assert zarr.open_group(str(tmp_path / "out.zarr"), mode="r")["meta/samples_mask"][:].all()


def test_sharded_and_remote_sources(tmp_path: Path) -> None:
    sharded = write_synthetic_store(tmp_path / "sharded.zarr", 200, config=synthetic_config("lz4", 256, 1024))
    rewrite_store(sharded, tmp_path / "a.zarr", "uncompressed")
    _same_store(sharded, tmp_path / "a.zarr")
    with StoreServer(tmp_path) as server:
        rewrite_store(server.url + "sharded.zarr", tmp_path / "b.zarr")
    _same_store(sharded, tmp_path / "b.zarr")


def test_bad_requests_are_refused_naming_what_is_wrong(source: Path, tmp_path: Path) -> None:
    (tmp_path / "taken.zarr").mkdir()
    with pytest.raises(StoreExistsError, match=r"taken\.zarr exists"):
        rewrite_store(source, tmp_path / "taken.zarr")
    with pytest.raises(StoreNotFoundError):
        rewrite_store(tmp_path / "missing.zarr", tmp_path / "out.zarr")
    with pytest.raises(ConfigError, match=r"'fast'.*default, compressed, uncompressed"):
        rewrite_store(source, tmp_path / "out.zarr", "fast")
    assert not (tmp_path / "out.zarr").exists()


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("destination", "problem"),
    [
        ("src.zarr/inner.zarr", "the destination {dst} is inside the source store"),
        ("src.zarr/core/deeper/new.zarr", "the destination {dst} is inside the source store"),
        ("link.zarr/inner.zarr", "the destination {dst} is inside the source store"),
        ("src.zarr", "the destination {dst} is the source store"),
        (".", "the source store is inside the destination {dst}"),
    ],
)
def test_a_destination_inside_around_or_at_the_source_is_refused_before_anything_is_written(
    tmp_path: Path, destination: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from dali_alchemi.cli import main

    src = write_synthetic_store(tmp_path / "src.zarr", 12)
    (tmp_path / "link.zarr").symlink_to(src, target_is_directory=True)
    before = _tree(tmp_path)
    dst = tmp_path / destination
    expected = f"Rewrite of {src} to {dst}: {problem.format(dst=dst)}, so the rewrite would change the store it copies"
    with pytest.raises(ConfigError, match="^" + re.escape(expected)):
        rewrite_store(src, dst)
    assert _tree(tmp_path) == before
    assert main(["rewrite", str(src), str(dst)]) == 2
    printed = capsys.readouterr()
    assert " ".join(expected.split()) in " ".join((printed.out + printed.err).split())
    assert _tree(tmp_path) == before


def test_a_staging_directory_that_would_be_the_source_is_refused(tmp_path: Path) -> None:
    src = write_synthetic_store(tmp_path / ".out.zarr.dali-alchemi-rewrite-partial", 12)
    before = _tree(src)
    with pytest.raises(ConfigError, match=r"the staging directory .* is the source store"):
        rewrite_store(src, tmp_path / "out.zarr")
    assert _tree(src) == before  # the rewrite's clean-up would have removed it


KILLED_REWRITE = """
import os, sys, time
from dali_alchemi.store.write.rewrite import rewrite_store
def progress(phase, done, total):
    if phase == sys.argv[3]:
        print("reached", flush=True)
        time.sleep(3600)
rewrite_store(sys.argv[1], sys.argv[2], progress=progress)
"""


@pytest.mark.parametrize("phase", ["copy", "check"])
def test_a_rewrite_killed_midway_leaves_no_store_and_the_next_one_succeeds(
    source: Path, tmp_path: Path, phase: str
) -> None:
    out = tmp_path / "out.zarr"
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-c", KILLED_REWRITE, str(source), str(out), phase],
                             cwd=root, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "reached"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(HANG_S)
    assert not out.exists() and staging_path(out).exists()
    rewrite_store(source, out)
    assert not staging_path(out).exists()
    _same_store(source, out)


def test_the_check_sizes_its_windows_from_a_bounded_sample_of_structures() -> None:
    from dali_alchemi.store.format.protocol import FieldSpec
    from dali_alchemi.store.write import rewrite

    asked: list[int] = []

    class HugeReader:  # ten million structures of 3 atoms and 5 edges
        def __init__(self) -> None:
            self.field_specs = {"positions": FieldSpec("atom", np.dtype(np.float32), (3,))}

        def __len__(self) -> int:
            return 10_000_000

        def sample_sizes(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            asked.append(len(indices))
            return np.full(len(indices), 3), np.full(len(indices), 5)

    assert rewrite._structure_bytes(HugeReader()) == 3 * 12  # type: ignore[arg-type]
    assert asked == [rewrite.SIZE_SAMPLE]
