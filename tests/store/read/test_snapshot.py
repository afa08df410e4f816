"""store/read/snapshot.py: one consistent, frozen view of a store, also while an operation is unfinished.

Operations are interrupted in-process: the writer's ``on_phase`` hook raises after a given phase, which
leaves the store and its journal exactly as a killed writer would (the crash tests kill real processes).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.errors import StoreFormatError, StoreNotFoundError
from dali_alchemi.store.format import journal
from dali_alchemi.store.format.journal import DeleteOp
from dali_alchemi.store.format.location import StoreLocation, resolve_store
from dali_alchemi.store.read import snapshot
from dali_alchemi.store.read.snapshot import LOAD_ATTEMPTS, open_snapshot

CONFIG = WriteConfig(core=ArrayConfig(chunk_size=32), custom=ArrayConfig(chunk_size=8))
BASE = synthetic_samples(12, seed=5, min_atoms=2, max_atoms=9)


class Interrupted(Exception):
    pass


def _interrupt_at(writer: AtomicDataZarrWriter, phase: str) -> None:
    def on_phase(name: str) -> None:
        if name == phase:
            raise Interrupted(name)

    writer.on_phase = on_phase


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("snapshot") / "s.zarr"
    writer = AtomicDataZarrWriter(store, CONFIG)
    writer.write(BASE)
    writer.add_custom("tag", np.arange(12, dtype=np.int32), "system")
    return store


@pytest.fixture()
def path(pristine: Path, tmp_path: Path) -> Path:
    """A fresh copy of the pristine store, which a test may interrupt operations on."""
    store = tmp_path / "s.zarr"
    shutil.copytree(pristine, store)
    return store


def _loc(path: Path) -> StoreLocation:
    return resolve_store(path, read_only=True, must_exist=False)


def test_a_snapshot_holds_pointers_masks_and_handles_read_only(path: Path) -> None:
    snap = open_snapshot(_loc(path))
    assert snap.n_physical == 12 and snap.active.tolist() == list(range(12))
    assert snap.atoms_ptr.tolist() == BASE.atoms_ptr.tolist() and snap.edges_ptr.tolist() == BASE.edges_ptr.tolist()
    assert snap.atoms_ptr.dtype == np.int64 and snap.samples_mask.dtype == np.bool_
    assert snap.levels["tag"] == "system" and snap.levels["neighbor_list"] == "edge"
    assert set(snap.schema.custom) == {"tag"}
    assert snap.location.local_root == path
    tag = snap.handles["tag"]
    assert (tag.shape, tag.dtype, tag.codec is not None) == ((12,), np.dtype(np.int32), True)
    for arr in (snap.atoms_ptr, snap.edges_ptr, snap.samples_mask, snap.active):
        assert not arr.flags.writeable
    with pytest.raises(TypeError):
        snap.handles["tag"] = tag  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.live = np.zeros(0, np.int64)  # type: ignore[misc]


def test_an_unfinished_append_is_read_at_the_old_state(path: Path) -> None:
    writer = AtomicDataZarrWriter(path, CONFIG)
    _interrupt_at(writer, "samples_mask")
    extra = synthetic_samples(3, seed=6, min_atoms=2, max_atoms=9).split()
    with pytest.raises(Interrupted):
        writer.append([dict(s, tag=np.array([99], np.int32)) for s in extra], levels={"tag": "system"})
    root = zarr.open_group(path, mode="r")
    assert root["meta/samples_mask"].shape == (15,)  # on disk the append is almost done
    snap = open_snapshot(_loc(path))
    assert snap.n_physical == 12 and len(snap.active) == 12
    assert snap.atoms_ptr.tolist() == BASE.atoms_ptr.tolist()
    assert root["core/positions"].shape[0] > int(snap.atoms_ptr[-1])  # arrays already longer on disk
    assert snap.handles["positions"].shape[0] == int(snap.atoms_ptr[-1])  # read as the old state's rows
    assert snap.handles["positions"].codec.n_blocks == -(-int(snap.atoms_ptr[-1]) // 32)


def test_an_append_stopped_after_its_metadata_grew_serves_the_old_state_read_whole(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zarr grows an array's zarr.json before it writes the new chunks: the old state must not need them."""
    import zarr.storage._local as zarr_local

    with AtomicDataZarrReader(path) as reader:
        expected = reader.read_packed(np.arange(12))
    original = zarr_local._put

    def killed(target: Path, value: object, exclusive: bool = False) -> int:
        if "core/positions/c/" in target.as_posix():
            raise Interrupted(str(target))  # as a writer killed right then
        return original(target, value, exclusive)  # type: ignore[arg-type]

    monkeypatch.setattr(zarr_local, "_put", killed)
    new_rows = synthetic_samples(30, seed=6, min_atoms=2, max_atoms=9).split()
    extra = [dict(s, tag=np.array([9], np.int32)) for s in new_rows]
    with pytest.raises(Interrupted):
        AtomicDataZarrWriter(path, CONFIG).append(extra, levels={"tag": "system"})
    monkeypatch.undo()
    root = zarr.open_group(path, mode="r")
    grown = root["core/positions"].shape[0]
    assert grown > int(expected.atoms_ptr[-1]) + 32  # chunks past the old state are in the metadata, not on disk
    with AtomicDataZarrReader(path) as reader:
        for _ in range(3):  # the third read takes small arrays whole
            got = reader.read_packed(np.arange(12))
            for name, values in expected.fields.items():
                assert np.array_equal(got.fields[name], values), name
        assert len(reader) == 12


def test_an_unfinished_delete_is_read_at_the_new_state(path: Path) -> None:
    writer = AtomicDataZarrWriter(path, CONFIG)
    _interrupt_at(writer, "journal")
    with pytest.raises(Interrupted):
        writer.delete([2, 7])
    assert zarr.open_group(path, mode="r")["meta/samples_mask"][...].all()  # nothing changed on disk yet
    snap = open_snapshot(_loc(path))
    assert snap.n_physical == 12
    assert snap.active.tolist() == [i for i in range(12) if i not in (2, 7)]
    assert snap.samples_mask.tolist() == [i not in (2, 7) for i in range(12)]


def test_an_uncommitted_replacement_reads_the_array_it_replaces(path: Path) -> None:
    writer = AtomicDataZarrWriter(path, CONFIG)
    _interrupt_at(writer, "fields")
    with pytest.raises(Interrupted):
        writer.add_custom("tag", np.arange(int(BASE.n_atoms.sum()), dtype=np.float32), "atom")
    snap = open_snapshot(_loc(path))
    old = snap.handles["tag"]
    assert (old.level, old.shape, old.dtype) == ("system", (12,), np.dtype(np.int32))
    assert old.codec is None  # moved aside, so read through zarr
    assert old.array[...].tolist() == list(range(12))


def test_an_uncommitted_new_custom_array_is_not_part_of_the_store(path: Path) -> None:
    writer = AtomicDataZarrWriter(path, CONFIG)
    _interrupt_at(writer, "moved-new")
    with pytest.raises(Interrupted):
        writer.add_custom("charge", np.ones(int(BASE.n_atoms.sum()), np.float32), "atom")
    assert (path / "custom" / "charge").exists()
    assert "charge" not in open_snapshot(_loc(path)).handles


def test_during_a_defragment_swap_the_compacted_copy_is_read(path: Path) -> None:
    writer = AtomicDataZarrWriter(path, CONFIG)
    writer.delete([0, 5])
    _interrupt_at(writer, "retired")
    with pytest.raises(Interrupted):
        writer.defragment(window=4)
    assert not path.exists()
    snap = open_snapshot(_loc(path))
    assert snap.location.local_root == journal.sibling(_loc(path), "defragment-new")
    assert snap.location.display == str(path)
    assert snap.n_physical == 10 and snap.samples_mask.all()


def test_a_missing_store_without_a_journal_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match=f"Zarr store does not exist at {tmp_path / 'none.zarr'}: check"):
        open_snapshot(_loc(tmp_path / "none.zarr"))


def test_a_missing_store_is_named_by_its_absolute_path_with_a_next_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreNotFoundError) as missing:
        open_snapshot(_loc(Path("none.zarr")))
    assert str(missing.value) == (
        f"Zarr store does not exist at {tmp_path / 'none.zarr'}: check the path. To make a store from files ASE "
        "reads: dali-alchemi convert INPUT... OUT.zarr (or a synthetic one: dali-alchemi synth OUT.zarr)"
    )


@pytest.mark.parametrize(
    ("field", "zarr_json"),
    [("positions", {"shape": [5]}), ("positions", {"shape": [-5, 3]}), ("energy", {"data_type": "notatype"})],
    ids=["fewer dimensions than its chunks", "a negative extent", "an unknown data type"],
)
def test_metadata_zarr_cannot_parse_is_a_store_format_error(
    path: Path, field: str, zarr_json: dict[str, object]
) -> None:
    meta = path / "core" / field / "zarr.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), **zarr_json}))
    with pytest.raises(StoreFormatError, match=f"Store {path}: unreadable metadata: ValueError: "):
        open_snapshot(_loc(path))


def test_a_journal_that_changes_while_opening_is_read_again(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []

    def once_then_finished(loc: StoreLocation) -> object:
        calls.append(loc)
        return DeleteOp(physical=(3,)) if len(calls) == 1 else None  # a delete finishes under the reader

    monkeypatch.setattr(snapshot, "read_journal", once_then_finished)
    snap = open_snapshot(_loc(path))
    assert len(calls) == 4  # read, re-checked (changed), read again, re-checked
    assert snap.samples_mask.all()  # the finished state, not a mix


def test_a_store_whose_pointers_change_for_a_while_is_opened_once_they_settle(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append changes the pointers' metadata several times while its journal stays the same."""
    tokens = iter([b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"])  # changes under the first 4 attempts
    waited: list[float] = []
    monkeypatch.setattr(snapshot, "read_token", lambda loc: next(tokens, b"settled"))
    monkeypatch.setattr(snapshot.time, "sleep", waited.append)
    snap = open_snapshot(_loc(path))
    assert snap.token == b"settled" and snap.n_physical == 12
    assert waited == list(snapshot.RETRY_WAIT_S[:4])  # waited longer each time, not at once
    assert sum(snapshot.RETRY_WAIT_S) > 0.5 and len(snapshot.RETRY_WAIT_S) == LOAD_ATTEMPTS - 1


def test_a_store_that_keeps_changing_is_refused(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def always_new(loc: StoreLocation) -> DeleteOp:
        calls.append(1)
        return DeleteOp(physical=(len(calls),))

    monkeypatch.setattr(snapshot, "read_journal", always_new)
    monkeypatch.setattr(snapshot, "RETRY_WAIT_S", (0.0,))
    with pytest.raises(StoreFormatError, match="kept changing while it was opened; try again"):
        open_snapshot(_loc(path))
    assert len(calls) == 2 * LOAD_ATTEMPTS


def test_a_store_swapped_for_its_defragmented_copy_while_it_opens_is_read_again(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A defragment swaps directories: a reader that read the old root attributes (12 samples) and then
    # the new meta arrays (10) saw two states at once; it must read the store again, not call it damaged.
    newer = tmp_path / "newer.zarr"
    shutil.copytree(path, newer)
    writer = AtomicDataZarrWriter(newer)
    writer.delete([0, 1])
    writer.defragment()
    real, swaps = snapshot.open_root, []

    def open_then_swap(loc: StoreLocation) -> object:
        root = real(loc)
        if not swaps:
            swaps.append(loc)
            path.rename(tmp_path / "aside.zarr")
            newer.rename(path)
        return root

    monkeypatch.setattr(snapshot, "open_root", open_then_swap)
    snap = open_snapshot(_loc(path))
    assert len(swaps) == 1 and snap.n_physical == 10 and snap.n_live == 10
    assert snap.atoms_ptr.tolist() == (BASE.atoms_ptr[2:] - BASE.atoms_ptr[2]).tolist()


def test_a_store_that_keeps_swapping_while_it_opens_is_told_as_changing(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    newer = tmp_path / "newer.zarr"
    shutil.copytree(path, newer)
    writer = AtomicDataZarrWriter(newer)
    writer.delete([0, 1])
    writer.defragment()
    real = snapshot.open_root

    def open_then_swap(loc: StoreLocation) -> object:
        root = real(loc)
        path.rename(tmp_path / "aside.zarr")
        newer.rename(path)
        (tmp_path / "aside.zarr").rename(newer)
        return root

    monkeypatch.setattr(snapshot, "open_root", open_then_swap)
    monkeypatch.setattr(snapshot, "RETRY_WAIT_S", (0.0,))
    with pytest.raises(StoreFormatError, match="kept changing while it was opened; try again"):
        open_snapshot(_loc(path))
