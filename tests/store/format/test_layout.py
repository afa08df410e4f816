from __future__ import annotations

import pytest

from dali_alchemi.errors import FieldLevelError, StoreFormatError
from dali_alchemi.store.format import layout


def test_default_levels_follow_nvalchemi_key_sets() -> None:
    assert layout.resolve_level("positions") == "atom"
    assert layout.resolve_level("neighbor_list") == "edge"
    assert layout.resolve_level("energy") == "system"
    assert layout.default_level("graph_alpha_spins") is None


def test_unknown_field_needs_an_explicit_level() -> None:
    with pytest.raises(FieldLevelError, match="'tag' is not a known AtomicData field"):
        layout.resolve_level("tag")
    assert layout.resolve_level("tag", {"tag": "system"}) == "system"


def test_invalid_level_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="Invalid level 'node'"):
        layout.resolve_level("tag", {"tag": "node"})


def test_schema_round_trip_is_sorted_and_deterministic() -> None:
    schema = layout.StoreSchema(num_samples=3, core={"positions": "atom", "energy": "system"}, custom={"tag": "system"})
    attrs = schema.to_attributes()
    assert list(attrs["fields"]["core"]) == ["energy", "positions"]
    assert layout.parse_schema(attrs, store="s") == schema
    assert schema.field_levels == {"positions": "atom", "energy": "system", "tag": "system"}


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"num_samples": "3"}, "num_samples"),
        ({"num_samples": 3, "fields": []}, "must be a mapping"),
        ({"num_samples": 3, "fields": {"core": []}}, "fields.core must be a mapping"),
    ],
)
def test_parse_schema_rejects_bad_attributes(attrs: dict, message: str) -> None:
    with pytest.raises(StoreFormatError, match=message):
        layout.parse_schema(attrs, store="s")


def test_parse_schema_keeps_levels_it_cannot_interpret_aside() -> None:
    attrs = {"num_samples": 3, "fields": {"core": {"x": "node", "e": "system"}, "custom": {"y": 1}, "levels": {}}}
    schema = layout.parse_schema(attrs, store="s")
    assert schema.field_levels == {"e": "system"}
    assert schema.unknown_levels == {"core/x": "node", "custom/y": 1}


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("a/b", "path separator"), ("a\\b", "path separator"), ("..", "starts with '.'"), (".", "starts with '.'"),
        (".hidden", "starts with '.'"), ("", "is empty"), ("zarr.json", "reserved by zarr"),
        ("a\x00b", "control character"), ("a\nb", "control character"), ("x" * 256, "longer than 255 bytes"),
        ("é" * 128, "longer than 255 bytes"), (7, "is a int"),
    ],
)  # fmt: skip
def test_field_names_that_could_not_be_an_array_are_named(name: object, problem: str) -> None:
    found = layout.field_name_problem(name)
    assert found is not None and problem in found


@pytest.mark.parametrize("name", ["energy", "x" * 255, "é" * 127, "charge-2", "c", "__tag", "zarr.json2"])
def test_ordinary_field_names_pass(name: str) -> None:
    assert layout.field_name_problem(name) is None


def test_the_reader_refuses_a_store_recording_a_field_that_could_not_be_an_array() -> None:
    attrs = {"fields": {"core": {"positions": "atom"}, "custom": {"a/b": "atom"}}}
    with pytest.raises(StoreFormatError, match=r"fields.custom names a field 'a/b' that contains a path separator"):
        layout.parse_schema(attrs, store="s")


@pytest.mark.parametrize(
    ("name", "dtype", "shape", "problem"),
    [
        ("atomic_numbers", "float32", (5,), "dtype float32, which cannot hold atomic_numbers"),
        ("positions", "float32", (5, 2), "shape (5, 2); expected [rows, 3]"),
        ("neighbor_list", "int64", (4, 3), "shape (4, 3); expected [rows, 2]"),
        ("pbc", "int8", (1, 3), "dtype int8, which cannot hold pbc"),
    ],
)
def test_the_array_rules_name_what_a_field_needs(name: str, dtype: str, shape: tuple[int, ...], problem: str) -> None:
    assert layout.field_array_problem(name, dtype, shape) == f"has {problem}"
    assert layout.field_array_problem("custom_thing", dtype, shape) is None
