"""Bad stores and bad input: each gets a clear error naming what is wrong, never a crash."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr

from dali_alchemi import AtomicDataZarrReader, ChunkDecodeError, NotAStoreError, StoreFormatError, StoreNotFoundError
from dali_alchemi.store.format.location import resolve_store, zarr_error_text
from dali_alchemi.store.read.open_checks import holds_root_metadata, open_root


@pytest.fixture()
def store_copy(small_store: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy.zarr"
    shutil.copytree(small_store, target)
    return target


def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _rewrite(store: Path, name: str, values: np.ndarray) -> None:
    group_name, array_name = name.split("/")
    group = zarr.open_group(store / group_name, mode="r+")
    old = group[array_name]
    chunks = old.chunks
    del group[array_name]
    arr = group.create_array(
        array_name, shape=values.shape, dtype=values.dtype, chunks=(max(1, chunks[0]), *values.shape[1:])
    )
    if values.size:
        arr[...] = values


def test_missing_store_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope.zarr")):
        AtomicDataZarrReader(tmp_path / "nope.zarr")


def test_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hello")
    with pytest.raises(StoreFormatError, match=r"is not a zarr group.*dali-alchemi convert INPUT"):
        AtomicDataZarrReader(tmp_path / "plain")


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "read-write"])
def test_a_plain_file_is_not_a_store_and_nothing_is_created(tmp_path: Path, read_only: bool) -> None:
    afile = tmp_path / "afile"
    afile.write_text("hello")
    loc = resolve_store(afile, read_only=read_only, must_exist=True)
    with pytest.raises(StoreFormatError) as refused:
        open_root(loc)  # read-write, zarr would first try to create the folder: FileExistsError
    assert str(refused.value) == (
        f"Store {afile} is a file, not a store: a store is a folder (a zarr v3 group). To make a store from files "
        "ASE reads: dali-alchemi convert INPUT... OUT.zarr (or a synthetic one: dali-alchemi synth OUT.zarr)"
    )
    assert afile.read_text() == "hello" and not holds_root_metadata(loc)


@pytest.mark.parametrize(
    ("root_json", "expected"),
    [
        (None, "there is no zarr.json at its root"),
        ('{"zarr_format": 3, "node_type": "array"}', "its zarr.json is unreadable: "),
        ("{not json", "its zarr.json is unreadable: JSONDecodeError: "),
    ],
    ids=["no zarr.json", "an array's zarr.json", "zarr.json that does not parse"],
)
def test_not_a_zarr_group_is_told_in_the_projects_terms(tmp_path: Path, root_json: str | None, expected: str) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    if root_json is not None:
        (folder / "zarr.json").write_text(root_json)
    loc = resolve_store(folder, read_only=True, must_exist=True)
    with pytest.raises(StoreFormatError) as refused:
        open_root(loc)
    message = str(refused.value)
    assert message.startswith(f"Store {folder} is not a zarr group: {expected}") and "dali-alchemi convert" in message
    assert "StorePath(" not in message and "LocalStore" not in message and "file://" not in message
    assert holds_root_metadata(loc) == (root_json is not None)


def test_an_empty_folder_is_not_a_store_and_also_a_file_not_found_error_as_in_nvalchemi(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        NotAStoreError, match=r"is not a zarr group: there is no zarr.json at its root.*dali-alchemi convert INPUT"
    ) as caught:
        AtomicDataZarrReader(tmp_path / "empty")
    assert isinstance(caught.value, StoreFormatError) and isinstance(caught.value, ValueError)
    assert isinstance(caught.value, StoreNotFoundError) and isinstance(caught.value, FileNotFoundError)
    (tmp_path / "empty" / "zarr.json").write_text("{not json")  # there, but unreadable: only a format error
    with pytest.raises(StoreFormatError, match="is not a zarr group") as caught:
        AtomicDataZarrReader(tmp_path / "empty")
    assert not isinstance(caught.value, FileNotFoundError)


def test_zarr_v2_store_is_rejected(tmp_path: Path) -> None:
    zarr.open_group(tmp_path / "v2.zarr", mode="w", zarr_format=2)
    with pytest.raises(StoreFormatError, match="zarr format 2; expected zarr format 3"):
        AtomicDataZarrReader(tmp_path / "v2.zarr")


@pytest.mark.parametrize("group", ["meta", "core"])
def test_missing_group(store_copy: Path, group: str) -> None:
    shutil.rmtree(store_copy / group)
    with pytest.raises(StoreFormatError, match=f"missing the '{group}' group"):
        AtomicDataZarrReader(store_copy)


@pytest.mark.parametrize("array", ["atoms_ptr", "edges_ptr", "samples_mask", "atoms_mask"])
def test_missing_meta_array(store_copy: Path, array: str) -> None:
    shutil.rmtree(store_copy / "meta" / array)
    with pytest.raises(StoreFormatError, match=f"missing array meta/{array}"):
        AtomicDataZarrReader(store_copy)


def test_pointer_not_monotonic(store_copy: Path) -> None:
    ptr = zarr.open_array(store_copy / "meta" / "atoms_ptr", mode="r")[...]
    ptr[5], ptr[6] = ptr[6], ptr[5]
    _rewrite(store_copy, "meta/atoms_ptr", ptr)
    with pytest.raises(StoreFormatError, match="meta/atoms_ptr is not monotonic: entry 6"):
        AtomicDataZarrReader(store_copy)


def test_pointer_not_starting_at_zero(store_copy: Path) -> None:
    ptr = zarr.open_array(store_copy / "meta" / "edges_ptr", mode="r")[...]
    _rewrite(store_copy, "meta/edges_ptr", ptr + 1)
    with pytest.raises(StoreFormatError, match="meta/edges_ptr starts at 1; expected 0"):
        AtomicDataZarrReader(store_copy)


def test_pointer_past_the_end_of_the_data(store_copy: Path) -> None:
    ptr = zarr.open_array(store_copy / "meta" / "atoms_ptr", mode="r")[...]
    ptr[-1] += 5
    _rewrite(store_copy, "meta/atoms_ptr", ptr)
    with pytest.raises(StoreFormatError, match=r"meta/atoms_mask has shape \(\d+,\); expected \(\d+,\)"):
        AtomicDataZarrReader(store_copy)
    mask = np.ones(int(ptr[-1]), dtype=bool)
    _rewrite(store_copy, "meta/atoms_mask", mask)
    with pytest.raises(StoreFormatError, match=r"array core/\w+ has \d+ rows; expected \d+ atoms \(atoms_ptr\[-1\]\)"):
        AtomicDataZarrReader(store_copy)


def test_mask_length_disagrees(store_copy: Path) -> None:
    _rewrite(store_copy, "meta/samples_mask", np.ones(299, dtype=bool))
    with pytest.raises(StoreFormatError, match=r"meta/atoms_ptr has shape \(301,\); expected \(300,\) for 299 samples"):
        AtomicDataZarrReader(store_copy)


def test_system_array_with_wrong_length(store_copy: Path) -> None:
    _rewrite(store_copy, "core/energy", np.zeros((299, 1), np.float32))
    with pytest.raises(StoreFormatError, match=r"array core/energy has 299 rows; expected 300 samples"):
        AtomicDataZarrReader(store_copy)


def test_num_samples_attribute_disagrees(store_copy: Path) -> None:
    _edit_json(store_copy / "zarr.json", lambda d: d["attributes"].__setitem__("num_samples", 301))
    with pytest.raises(StoreFormatError, match="num_samples is 301 but meta/samples_mask has 300"):
        AtomicDataZarrReader(store_copy)


def test_unknown_level_string(store_copy: Path) -> None:
    _edit_json(store_copy / "zarr.json", lambda d: d["attributes"]["fields"]["core"].__setitem__("energy", "graph"))
    with pytest.raises(StoreFormatError, match=r"fields\.core\.energy has level 'graph', which this version cannot"):
        AtomicDataZarrReader(store_copy, fields=["energy", "positions"])


def test_impossible_dtype_for_a_field(store_copy: Path) -> None:
    z = zarr.open_array(store_copy / "core" / "atomic_numbers", mode="r")[...]
    _rewrite(store_copy, "core/atomic_numbers", z.astype(np.float32))
    with pytest.raises(
        StoreFormatError, match="core/atomic_numbers has dtype float32, which cannot hold atomic_numbers"
    ):
        AtomicDataZarrReader(store_copy)


def test_neighbor_list_must_be_pairs(store_copy: Path) -> None:
    nl = zarr.open_array(store_copy / "core" / "neighbor_list", mode="r")[...]
    _rewrite(store_copy, "core/neighbor_list", nl[:, :1])
    with pytest.raises(StoreFormatError, match=r"core/neighbor_list has shape \(\d+, 1\); expected \[rows, 2\]"):
        AtomicDataZarrReader(store_copy)


def test_corrupted_chunk_names_array_and_chunk(store_copy: Path) -> None:
    chunk = store_copy / "core" / "positions" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[10:40] = b"\xff" * 30
    chunk.write_bytes(bytes(data))
    reader = AtomicDataZarrReader(store_copy)  # opening stays cheap: chunks are checked when read
    with pytest.raises(
        ChunkDecodeError, match=r"Array 'core/positions': chunk 'core/positions/c/1/0' could not be decoded"
    ):
        reader.read_packed(np.arange(300))
    assert reader.read(0)[0]["positions"].shape[1] == 3  # chunk 0 is fine


def test_truncated_chunk_names_array_and_chunk(store_copy: Path) -> None:
    chunk = store_copy / "core" / "forces" / "c" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-7])
    with pytest.raises(ChunkDecodeError, match="'core/forces/c/0/0' could not be decoded"):
        AtomicDataZarrReader(store_copy).read(0)


def test_zarr_error_text_names_the_store_by_its_path_not_by_zarrs_objects() -> None:
    from zarr.storage import LocalStore, StorePath

    store = StorePath(LocalStore("/data/s.zarr", read_only=True), "core")
    err = ValueError(f"No array found in store {store!r} at path 'x'; also {LocalStore('/data/t.zarr')!r} and {store}")
    expected = "No array found in store /data/s.zarr/core at path 'x'; also /data/t.zarr and /data/s.zarr/core"
    assert zarr_error_text(err) == f"ValueError: {expected}"
