"""Stores written by a newer writer (extra groups, arrays, levels, attributes) open and read the known fields.

nvalchemi's main branch has extensible level schemas, so a newer store may record a level this version
does not know (here ``"group"``, for a field with one row per group of structures, with its own pointer
in ``meta/``), arrays with no recorded level, extra groups and extra root attributes. Whatever this
version cannot interpret is left out of the default field set with a warning, and asking for it by
name is a :class:`StoreFormatError` that names it; it is never dropped silently.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, StoreFormatError
from dali_alchemi.errors import StoreSchemaWarning


@pytest.fixture()
def newer_store(small_store: Path, tmp_path: Path) -> Path:
    """``small_store`` as a newer writer might leave it."""
    path = tmp_path / "newer.zarr"
    shutil.copytree(small_store, path)
    root = zarr.open_group(path, mode="r+")
    n = root["meta/samples_mask"].shape[0]
    groups_ptr = np.arange(0, n + 1, 3, dtype=np.int64)
    root["meta"].create_array("groups_ptr", data=groups_ptr)  # a pointer for the new level
    root["core"].create_array("group_energy", data=np.ones(groups_ptr.size - 1, np.float32))
    root["custom"].create_array("mystery", data=np.zeros(7, np.int32))  # no level recorded anywhere
    extra = root.create_group("levels")  # an extra group, with an array of its own
    extra.create_array("schema_ids", data=np.arange(4, dtype=np.int16))
    doc = json.loads((path / "zarr.json").read_text())
    doc["attributes"]["schema_version"] = 2
    doc["attributes"]["levels"] = {"group": {"ptr": "meta/groups_ptr", "parent": "system"}}
    doc["attributes"]["fields"]["core"]["group_energy"] = "group"
    doc["attributes"]["fields"]["level_schemas"] = {"group": {"fields": ["group_energy"]}}
    (path / "zarr.json").write_text(json.dumps(doc))
    return path


def test_a_newer_store_opens_and_reads_the_known_fields(small_store: Path, newer_store: Path) -> None:
    with pytest.warns(StoreSchemaWarning, match=r"not reading \['group_energy', 'mystery'\]"):
        reader = AtomicDataZarrReader(newer_store)
    with reader, AtomicDataZarrReader(small_store) as original:
        assert reader.field_levels == original.field_levels
        assert set(reader.skipped_fields) == {"group_energy", "mystery"}
        assert len(reader) == len(original)
        order = [0, 17, 299, 5]
        for (a, _), (b, _) in zip(reader.read_many(order), original.read_many(order), strict=True):
            assert set(a) == set(b)
            assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)


def test_asking_for_a_field_it_cannot_interpret_names_it(newer_store: Path) -> None:
    with pytest.raises(StoreFormatError, match=r"fields\.core\.group_energy has level 'group', which this version"):
        AtomicDataZarrReader(newer_store, fields=["positions", "group_energy"])
    with pytest.raises(StoreFormatError, match=r"array custom/mystery has no level in the 'fields' attribute"):
        AtomicDataZarrReader(newer_store, fields=["mystery"])
    with pytest.warns(StoreSchemaWarning), AtomicDataZarrReader(newer_store) as reader:
        with pytest.raises(StoreFormatError, match="group_energy has level 'group'"):
            reader.read_packed([0, 1], fields=["group_energy"])
        assert reader.read_packed([0, 1], fields=["positions"]).fields["positions"].shape[1] == 3


@pytest.mark.dali
def test_the_loader_refuses_a_field_of_a_level_it_cannot_interpret(newer_store: Path) -> None:
    from dali_alchemi import DALIDataLoader

    with pytest.raises(StoreFormatError, match="group_energy has level 'group'"):
        DALIDataLoader(newer_store, fields=["group_energy"], num_workers=0, device="cpu")


def test_known_fields_of_a_newer_store_need_no_warning(newer_store: Path, recwarn: pytest.WarningsRecorder) -> None:
    with AtomicDataZarrReader(newer_store, fields=["positions", "energy"]) as reader:
        assert reader.field_names == ("positions", "energy")
        assert reader.read(3)[0]["energy"].shape == (1, 1)
    assert not [w for w in recwarn if issubclass(w.category, StoreSchemaWarning)]


def test_the_writer_refuses_to_change_what_it_cannot_keep_consistent(newer_store: Path) -> None:
    writer = AtomicDataZarrWriter(newer_store)
    with pytest.raises(StoreFormatError, match=r"core/group_energy, custom/mystery: levels of a newer writer"):
        writer.delete([0])
    before = zarr.open_array(newer_store / "meta" / "samples_mask")[:]
    assert before.all()  # nothing was deleted


def test_extra_groups_and_attributes_alone_keep_the_store_writable(small_store: Path, tmp_path: Path) -> None:
    path = tmp_path / "extra.zarr"
    shutil.copytree(small_store, path)
    zarr.open_group(path, mode="r+").create_group("provenance").create_array("run", data=np.arange(3))
    doc = json.loads((path / "zarr.json").read_text())
    doc["attributes"]["created_by"] = {"tool": "newer", "version": "9"}
    (path / "zarr.json").write_text(json.dumps(doc))
    AtomicDataZarrWriter(path).delete([1])
    with AtomicDataZarrReader(path) as reader:
        assert len(reader) == 299 and reader.skipped_fields == {}
    assert json.loads((path / "zarr.json").read_text())["attributes"]["created_by"]["tool"] == "newer"
    assert (path / "provenance" / "run" / "zarr.json").exists()


def test_inspect_shows_the_level_it_does_not_read(newer_store: Path) -> None:
    from dali_alchemi.store.read.summary import summarize

    levels = {f"{a.group}/{a.name}": a.level for a in summarize(newer_store).arrays}
    assert levels["core/group_energy"] == "group (not read)"
    assert levels["custom/mystery"] == "?" and levels["core/positions"] == "atom"
    assert levels["meta/groups_ptr"] == "meta"
