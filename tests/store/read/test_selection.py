"""store/read/selection.py: the fields a reader reads, checked on open (a newer writer's arrays skipped
with a warning that points at the code that opened the reader) and narrowed per read."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from dali_alchemi import AtomicDataZarrReader, ConfigError, UnknownFieldError
from dali_alchemi.errors import StoreSchemaWarning


@pytest.fixture()
def with_mystery(small_store: Path, tmp_path: Path) -> Path:
    """``small_store`` with a custom array whose level is recorded nowhere (a newer writer's)."""
    path = tmp_path / "mystery.zarr"
    shutil.copytree(small_store, path)
    zarr.open_group(path, mode="r+")["custom"].create_array("mystery", data=np.zeros(7, np.int32))
    return path


def test_the_skipped_fields_warning_points_at_the_code_that_opened_the_reader(with_mystery: Path) -> None:
    with pytest.warns(StoreSchemaWarning, match=r"not reading \['mystery'\]") as opened:
        reader = AtomicDataZarrReader(with_mystery)
    with reader, pytest.warns(StoreSchemaWarning):
        reader.refresh()
        assert "mystery" not in reader.field_names and "mystery" in reader.skipped_fields
    assert [Path(w.filename).name for w in opened] == [Path(__file__).name]


def test_fields_asked_for_are_read_in_the_order_asked(small_store: Path) -> None:
    with AtomicDataZarrReader(small_store, fields=["forces", "positions"]) as reader:
        assert reader.field_names == ("forces", "positions")
    with pytest.raises(UnknownFieldError, match=r"Unknown fields \['nope'\] for store .*; available: \["):
        AtomicDataZarrReader(small_store, fields=["positions", "nope"])


def test_a_read_narrows_to_fields_of_the_readers_selection_and_to_at_least_one(small_store: Path) -> None:
    with AtomicDataZarrReader(small_store, fields=["positions", "forces"]) as reader:
        assert set(reader.read_packed([0, 1], fields="forces").fields) == {"forces"}
        with pytest.raises(UnknownFieldError, match=r"Unknown fields \['cell'\]; this reader returns \['positions', 'forces'\]"):
            reader.read_packed([0], fields=["cell"])
        with pytest.raises(ConfigError, match="fields must name at least one field"):
            reader.read_packed([0], fields=[])
