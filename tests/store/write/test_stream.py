from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, SampleDataError
from dali_alchemi import config as config_module
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.store.format.packed import PackedSamples
from dali_alchemi.store.write.stream import ShardedColumn, is_parts

PACKED = synthetic_samples(900, seed=3, min_atoms=1, max_atoms=6)
CUTS = (0, 301, 302, 777, 900)  # parts that align with no chunk or shard


def _parts(packed: PackedSamples = PACKED, cuts: tuple[int, ...] = CUTS) -> Iterator[PackedSamples]:
    return (packed.take(np.arange(a, b)) for a, b in itertools.pairwise(cuts))


def _files(root: Path) -> list[tuple[str, bytes]]:
    return sorted((str(f.relative_to(root)), f.read_bytes()) for f in root.rglob("*") if f.is_file())


@pytest.fixture
def small_default_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default layout with its sizes scaled down, so a small store spans many shards of every array."""
    monkeypatch.setattr(config_module, "SAMPLE_BYTES", 512)
    monkeypatch.setattr(config_module, "SMALL_CHUNK_BYTES", 512)
    monkeypatch.setattr(config_module, "CHUNKS_PER_SHARD", 4)


@pytest.mark.parametrize(
    "config",
    [
        None,
        WriteConfig(meta=ArrayConfig(chunk_size=128), core=ArrayConfig(chunk_size=200), custom=ArrayConfig()),
        WriteConfig(meta=ArrayConfig(chunk_size=64, shard_size=256), core=ArrayConfig(chunk_size=64, shard_size=192)),
    ],
    ids=["default", "unsharded", "sharded"],
)
def test_a_streamed_write_is_the_one_shot_write_byte_for_byte(
    tmp_path: Path, small_default_layout: None, config: WriteConfig | None
) -> None:
    AtomicDataZarrWriter(tmp_path / "whole.zarr", config).write(PACKED)
    AtomicDataZarrWriter(tmp_path / "parts.zarr", config).write(_parts())
    whole, parts = _files(tmp_path / "whole.zarr"), _files(tmp_path / "parts.zarr")
    assert [name for name, _ in parts] == [name for name, _ in whole]
    assert [name for (name, a), (_, b) in zip(whole, parts, strict=True) if a != b] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts.zarr", "whole.zarr"]  # no staging left


def test_parts_may_be_lists_of_dicts_with_custom_fields_and_store_global_neighbor_lists(tmp_path: Path) -> None:
    samples = PACKED.take(np.arange(40)).split()
    for i, sample in enumerate(samples):
        sample["charge"] = np.full((1, 1), i, dtype=np.float32)
    parts = (samples[a:b] for a, b in [(0, 7), (7, 7), (7, 40)])  # an empty part is skipped
    AtomicDataZarrWriter(tmp_path / "s.zarr").write(parts, levels={"charge": "system"}, custom=["charge"])
    with AtomicDataZarrReader(tmp_path / "s.zarr") as reader:
        assert len(reader) == 40
        got = reader.read_many(range(40))
        for (sample, _), want in zip(got, samples, strict=True):
            assert np.array_equal(sample["neighbor_list"].numpy(), want["neighbor_list"])
            assert np.array_equal(sample["charge"].numpy().reshape(-1), want["charge"].reshape(-1))
    import zarr

    root = zarr.open_group(tmp_path / "s.zarr", mode="r")
    assert "charge" in root["custom"] and root.attrs["fields"]["custom"] == {"charge": "system"}
    assert root["core/neighbor_list"][...].max() >= root["meta/atoms_ptr"][7]  # store-global after part 0


def _with(packed: PackedSamples, name: str, values: np.ndarray) -> PackedSamples:
    fields, levels = {**packed.fields, name: values}, {**packed.levels, "spin": "atom"}
    return PackedSamples.from_fields(fields, levels, packed.n_atoms, packed.n_edges)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda p: _with(p, "energy", p.fields["energy"].astype(np.float32)),
            "Part 2: field 'energy' is (level, dtype, trailing shape) ('system', 'float32', (1,)) but part 0 has "
            "('system', 'float64', (1,)); every part must agree. Nothing was written.",
        ),
        (
            lambda p: _with(p, "spin", np.zeros((int(p.n_atoms.sum()), 3), dtype=np.float32)),
            "Part 2: field 'spin' is (level, dtype, trailing shape) ('atom', 'float32', (3,)) but part 0 has "
            "('atom', 'float32', (2,)); every part must agree. Nothing was written.",
        ),
        (
            lambda p: PackedSamples.from_fields(
                {k: v for k, v in p.fields.items() if k != "pbc"}, p.levels, p.n_atoms, p.n_edges
            ),
            "Part 2 has fields ['atom_categories', 'atomic_masses', 'atomic_numbers', 'cell', 'energy', 'forces', "
            "'neighbor_list', 'positions', 'shifts', 'spin', 'velocities'] but part 0 has ['atom_categories', "
            "'atomic_masses', 'atomic_numbers', 'cell', 'energy', 'forces', 'neighbor_list', 'pbc', 'positions', "
            "'shifts', 'spin', 'velocities']; every part must hold the same fields. Nothing was written.",
        ),
    ],
    ids=["dtype", "trailing-shape", "fields"],
)
def test_a_part_that_disagrees_with_the_first_is_refused_and_nothing_is_left(
    tmp_path: Path, change: Any, message: str
) -> None:
    parts = [_with(p, "spin", np.zeros((int(p.n_atoms.sum()), 2), dtype=np.float32)) for p in _parts()]
    parts[2] = change(parts[2])
    with pytest.raises(SampleDataError) as err:
        AtomicDataZarrWriter(tmp_path / "s.zarr").write(iter(parts), levels={"spin": "atom"})
    assert str(err.value) == message
    assert list(tmp_path.iterdir()) == []


def test_a_part_is_checked_as_a_write_checks_its_samples(tmp_path: Path) -> None:
    parts = list(_parts())
    positions = parts[3].fields["positions"].copy()
    positions[5, 1] = np.nan
    parts[3] = _with(parts[3], "positions", positions)
    with pytest.raises(SampleDataError, match=r"Field 'positions': row 5 \(sample \d+\) holds .*not finite"):
        AtomicDataZarrWriter(tmp_path / "s.zarr").write(iter(parts))
    assert list(tmp_path.iterdir()) == []
    AtomicDataZarrWriter(tmp_path / "s.zarr", allow_nonfinite=True).write(iter(parts))
    with AtomicDataZarrReader(tmp_path / "s.zarr") as reader:
        assert len(reader) == len(PACKED)


@pytest.mark.parametrize("parts", [iter([]), (p for p in [[], []])], ids=["no-parts", "empty-parts"])
def test_no_samples_in_any_part_is_an_error(tmp_path: Path, parts: Iterator[Any]) -> None:
    with pytest.raises(SampleDataError, match=r"^No data provided to write \(the parts held no samples\)\.$"):
        AtomicDataZarrWriter(tmp_path / "s.zarr").write(parts)
    assert list(tmp_path.iterdir()) == []


def test_a_failure_midway_leaves_nothing_at_the_path(tmp_path: Path) -> None:
    def failing() -> Iterator[PackedSamples]:
        parts = _parts()
        yield next(parts)
        yield next(parts)
        raise OSError("the source went away")

    with pytest.raises(OSError, match="the source went away"):
        AtomicDataZarrWriter(tmp_path / "s.zarr").write(failing())
    assert list(tmp_path.iterdir()) == []
    AtomicDataZarrWriter(tmp_path / "s.zarr").write(_parts())  # the path is free
    with AtomicDataZarrReader(tmp_path / "s.zarr") as reader:
        assert len(reader) == len(PACKED)


def test_is_parts_keeps_one_set_of_samples_one_write() -> None:
    assert is_parts(iter([PACKED])) and is_parts(p for p in [PACKED])
    assert not is_parts(PACKED) and not is_parts(PACKED.split()) and not is_parts(tuple(PACKED.split()))


class _RecordingArray:
    """Enough of a zarr array for ShardedColumn, recording every write."""

    def __init__(self, chunks: int, shards: int | None) -> None:
        self.chunks, self.shards = (chunks, 3), None if shards is None else (shards, 3)
        self.shape: tuple[int, ...] = (0, 3)
        self.data = np.zeros((0, 3))
        self.writes: list[tuple[int, int, tuple[int, ...]]] = []

    def resize(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.data = np.concatenate([self.data, np.zeros((shape[0] - len(self.data), 3))])

    def __setitem__(self, key: slice, values: np.ndarray) -> None:
        self.writes.append((key.start, key.stop, self.shape))
        self.data[key] = values


@pytest.mark.parametrize(("chunks", "shards", "unit"), [(4, 12, 12), (5, None, 5)])
def test_a_column_writes_whole_shards_once_and_the_rest_at_the_end(chunks: int, shards: int | None, unit: int) -> None:
    arr = _RecordingArray(chunks, shards)
    column = ShardedColumn(arr)
    rows = np.arange(3 * 50, dtype=np.float64).reshape(50, 3)
    for a, b in [(0, 7), (7, 9), (9, 33), (33, 34), (34, 50)]:
        column.push(rows[a:b])
    column.finish()
    assert np.array_equal(arr.data, rows) and arr.shape == (50, 3)
    starts = [start for start, _, _ in arr.writes]
    assert all(start % unit == 0 for start in starts) and len(set(starts)) == len(starts)  # each row written once
    assert all((stop - start) % unit == 0 for start, stop, _ in arr.writes[:-1])
    assert arr.writes[-1][1] == 50 and all(stop == shape[0] for _, stop, shape in arr.writes)


def test_a_failed_streamed_write_to_a_store_that_is_not_staged_leaves_it_empty() -> None:
    from zarr.storage import MemoryStore

    store = MemoryStore()
    parts = list(_parts())
    parts[1] = _with(parts[1], "spin", np.zeros((int(parts[1].n_atoms.sum()), 2), dtype=np.float32))
    with pytest.raises(SampleDataError, match=r"^Part 1 has fields"):
        AtomicDataZarrWriter(store).write(iter(parts))
    assert sorted(store._store_dict) == ["zarr.json"]  # the empty root group, nothing in it
    AtomicDataZarrWriter(store).write(_parts())  # nothing was there
    with AtomicDataZarrReader(store) as reader:
        assert len(reader) == len(PACKED)
