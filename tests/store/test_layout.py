from __future__ import annotations

import pytest

from dali_alchemi.errors import FieldLevelError, StoreFormatError
from dali_alchemi.store import layout


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
