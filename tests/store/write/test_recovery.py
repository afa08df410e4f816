"""Recovery: crafted journals are refused with nothing deleted; the leftovers of dead operations go.

(Recovery of real interrupted operations is tested by killing writers in ``test_crash_safety.py``.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, StoreFormatError
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig

CONFIG = WriteConfig(core=ArrayConfig(chunk_size=64), meta=ArrayConfig(chunk_size=16))


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store.zarr"
    writer = AtomicDataZarrWriter(path, CONFIG)
    writer.write(synthetic_samples(20, seed=5))
    writer.add_custom("tag", np.arange(20, dtype=np.int32), "system")
    return path


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path.parent)): p.read_bytes() for p in sorted(path.parent.rglob("*")) if p.is_file()}


def _journal(path: Path, doc: object) -> Path:
    journal = path.with_name(f".{path.name}.dali-alchemi-journal.json")
    journal.write_text(json.dumps(doc))
    return journal


CRAFTED = {
    "add_custom ..": {"op": "add_custom", "key": "..", "level": "system", "previous": None, "state": "staging"},
    "add_custom .": {"op": "add_custom", "key": ".", "level": "system", "previous": None, "state": "swapping"},
    "add_custom a/../..": {"op": "add_custom", "key": "x/../..", "level": "atom", "previous": None, "state": "staging"},
    "add_custom zarr.json": {"op": "add_custom", "key": "zarr.json", "level": "atom", "previous": None, "state": "staging"},
    "delete beyond": {"op": "delete", "physical": [3, 20]},
    "delete negative": {"op": "delete", "physical": [-1]},
    "append not a prefix": {"op": "append", "samples": 5, "atoms": 7, "edges": 0},
    "append past the end": {"op": "append", "samples": 25, "atoms": 0, "edges": 0},
}  # fmt: skip


@pytest.mark.parametrize("garbage", [b"not json", b"{}", b"[1,2]", b"null", b"\xff"])
def test_a_garbage_journal_is_refused_by_readers_and_writers_naming_its_file(store: Path, garbage: bytes) -> None:
    journal = store.with_name(f".{store.name}.dali-alchemi-journal.json")
    journal.write_bytes(garbage)
    before = _files(store)
    attempts = (
        lambda: AtomicDataZarrReader(store), lambda: AtomicDataZarrWriter(store).recover(),
        lambda: AtomicDataZarrWriter(store).append(synthetic_samples(2, seed=9)),
    )  # fmt: skip
    for attempt in attempts:
        with pytest.raises(StoreFormatError, match="move the journal file aside") as info:
            attempt()
        assert str(journal) in str(info.value)
        assert _files(store) == before  # nothing deleted or changed, the journal kept
    journal.unlink()  # what the message says to do once no writer runs
    assert len(AtomicDataZarrReader(store)) == 20


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_journal_is_refused_and_nothing_is_deleted(store: Path, case: str) -> None:
    journal = _journal(store, CRAFTED[case])
    before = _files(store)
    for attempt in (lambda: AtomicDataZarrWriter(store).recover(), lambda: AtomicDataZarrWriter(store).delete([0])):
        with pytest.raises(StoreFormatError, match="journal"):
            attempt()
        assert _files(store) == before, case  # not one file deleted or changed, the journal kept
    journal.unlink()
    assert len(AtomicDataZarrReader(store)) == 20 and "tag" in AtomicDataZarrReader(store).field_names


def test_a_genuine_append_record_of_an_empty_old_state_still_rolls_back(tmp_path: Path) -> None:
    path = tmp_path / "store.zarr"
    writer = AtomicDataZarrWriter(path, CONFIG)
    writer.write(synthetic_samples(3, seed=6))
    atoms_ptr = AtomicDataZarrReader(path).atoms_ptr
    _journal(path, {"op": "append", "samples": 2, "atoms": int(atoms_ptr[2]), "edges": int(AtomicDataZarrReader(path).edges_ptr[2])})
    assert AtomicDataZarrWriter(path).recover() == "append"  # a prefix of the store: the append is undone
    assert len(AtomicDataZarrReader(path)) == 2


def test_recovery_removes_partial_files_and_a_dead_conversions_nested_staging(store: Path) -> None:
    _journal(store, {"op": "delete", "physical": [1]})  # a delete killed while zarr wrote a chunk
    partial = store / "core" / "positions" / "c" / "0.0123abc.partial"
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"half a chunk")
    nested = store.with_name(f"..{store.name}.dali-alchemi-create-convert-1234.dali-alchemi-create-5678")
    nested.mkdir()
    (nested / "zarr.json").write_text("{}")
    spool = store.with_name(f".{store.name}.dali-alchemi-convert-spool-abcd")
    spool.mkdir()
    assert AtomicDataZarrWriter(store).recover() == "delete"
    assert sorted(p.name for p in store.parent.iterdir()) == ["store.zarr"]
    assert not list(store.rglob("*.partial"))
    assert len(AtomicDataZarrReader(store)) == 19
