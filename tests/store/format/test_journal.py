"""The write journal: typed records, their exact JSON, parse errors, and how a reader interprets them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dali_alchemi.errors import StoreFormatError
from dali_alchemi.store.format import journal
from dali_alchemi.store.format.journal import (
    AS_IS,
    AddCustomOp,
    AppendOp,
    DefragmentOp,
    DeleteOp,
    Operation,
    OpState,
    ReadView,
    interpret,
    parse_operation,
)
from dali_alchemi.store.format.location import StoreLocation, resolve_store
from dali_alchemi.types import PerLevel

# The journal text each operation wrote before the records were typed; stores interrupted by an
# older version hold exactly these bytes.
LEGACY: list[tuple[str, Operation]] = [
    ('{"op": "append", "samples": 40, "atoms": 812, "edges": 3020}', AppendOp(samples=40, atoms=812, edges=3020)),
    ('{"op": "delete", "physical": [1, 5, 7, 30]}', DeleteOp(physical=(1, 5, 7, 30))),
    (
        '{"op": "add_custom", "key": "tag", "level": "system", "previous": null, "state": "staging"}',
        AddCustomOp(key="tag", level="system", previous=None, state=OpState.STAGING),
    ),
    (
        '{"op": "add_custom", "key": "q", "level": "atom", "previous": "edge", "state": "swapping"}',
        AddCustomOp(key="q", level="atom", previous="edge", state=OpState.SWAPPING),
    ),
    (
        '{"op": "add_custom", "key": "q", "level": "atom", "previous": "edge", "state": "committed"}',
        AddCustomOp(key="q", level="atom", previous="edge", state=OpState.COMMITTED),
    ),
    ('{"op": "defragment"}', DefragmentOp()),
]


@pytest.fixture()
def local(tmp_path: Path) -> StoreLocation:
    return resolve_store(tmp_path / "s.zarr", read_only=False, must_exist=False)


@pytest.fixture()
def memory() -> StoreLocation:
    return resolve_store({}, read_only=False, must_exist=False)


def _journal_file(loc: StoreLocation) -> Path:
    path = journal.sibling(loc, journal.JOURNAL_SUFFIX)
    assert path.name == f".{loc.local_root.name}.dali-alchemi-journal.json"  # type: ignore[union-attr]
    return path


@pytest.mark.parametrize(("text", "op"), LEGACY, ids=[t for t, _ in LEGACY])
def test_records_write_the_exact_legacy_json_and_read_it_back(local: StoreLocation, text: str, op: Operation) -> None:
    journal.write_journal(local, op)
    assert _journal_file(local).read_text() == text
    assert journal.read_journal(local) == op
    _journal_file(local).write_text(text)  # as an older writer left it
    assert journal.read_journal(local) == op


def test_a_journal_in_a_non_local_store_lives_under_its_hidden_key(memory: StoreLocation) -> None:
    op = AppendOp(samples=3, atoms=10, edges=20)
    assert journal.read_journal(memory) is None
    journal.write_journal(memory, op)
    raw = memory.store._store_dict[journal.JOURNAL_KEY].to_bytes()  # type: ignore[attr-defined]
    assert raw == b'{"op": "append", "samples": 3, "atoms": 10, "edges": 20}'
    assert journal.read_journal(memory) == op
    journal.clear_journal(memory)
    assert journal.read_journal(memory) is None


def test_clearing_removes_the_file_and_is_idempotent(local: StoreLocation) -> None:
    journal.write_journal(local, DefragmentOp())
    journal.clear_journal(local)
    assert not _journal_file(local).exists()
    assert journal.read_journal(local) is None
    journal.clear_journal(local)
    assert list(local.local_root.parent.iterdir()) == []  # type: ignore[union-attr]  # no temporary file left


def test_add_custom_state_changes_keep_every_other_field_and_the_key_order() -> None:
    staging = AddCustomOp(key="tag", level="system", previous="system", state=OpState.STAGING)
    swapping = staging.with_state(OpState.SWAPPING)
    assert (swapping.key, swapping.level, swapping.previous) == ("tag", "system", "system")
    assert swapping.state is OpState.SWAPPING and staging.state is OpState.STAGING
    assert list(swapping.to_json()) == ["op", "key", "level", "previous", "state"]
    assert journal.dumps(swapping) == json.dumps({**staging.to_json(), "state": "swapping"})


def test_keys_this_version_does_not_know_are_ignored() -> None:
    doc = {"op": "append", "samples": 1, "atoms": 2, "edges": 3, "writer": "a later version"}
    assert parse_operation(doc, store="s") == AppendOp(samples=1, atoms=2, edges=3)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([1, 2], r"the write journal has no 'op': \[1, 2\]"),
        ({"samples": 3}, "the write journal has no 'op'"),
        ({"op": "append", "samples": 3, "atoms": 1}, "the write journal of 'append' has no 'edges'"),
        ({"op": "append", "samples": -1, "atoms": 1, "edges": 1}, "has samples=-1; expected a non-negative integer"),
        ({"op": "append", "samples": True, "atoms": 1, "edges": 1}, "has samples=True; expected a non-negative"),
        ({"op": "append", "samples": "3", "atoms": 1, "edges": 1}, "has samples='3'"),
        ({"op": "delete"}, "the write journal of 'delete' has no 'physical'"),
        ({"op": "delete", "physical": [1, "2"]}, "has physical=\\[1, '2'\\]; expected a list of non-negative physical"),
        ({"op": "delete", "physical": [1, -2]}, "has physical=\\[1, -2\\]; expected a list of non-negative physical"),
        ({"op": "delete", "physical": 4}, "has physical=4"),
        ({"op": "add_custom", "key": "", "level": "atom", "previous": None, "state": "staging"}, "array '', which is empty"),
        ({"op": "add_custom", "key": "..", "level": "atom", "previous": None, "state": "staging"}, "'..', which starts with '.'"),
        ({"op": "add_custom", "key": ".", "level": "atom", "previous": "atom", "state": "swapping"}, "'.', which starts"),
        ({"op": "add_custom", "key": "a/../..", "level": "atom", "previous": None, "state": "staging"}, "path separator"),
        ({"op": "add_custom", "key": 3, "level": "atom", "previous": None, "state": "staging"}, "is a int, not a string"),
        ({"op": "add_custom", "key": "t", "level": "node", "previous": None, "state": "staging"}, "has level='node'"),
        ({"op": "add_custom", "key": "t", "level": "atom", "previous": "x", "state": "staging"}, "previous='x'"),
        ({"op": "add_custom", "key": "t", "level": "atom", "previous": None, "state": "done"}, "has state='done'"),
        ({"op": "add_custom", "key": "t", "level": "atom", "state": "staging"}, "has no 'previous'"),
    ],
)
def test_malformed_journals_are_format_errors_naming_the_store(doc: object, message: str) -> None:
    with pytest.raises(StoreFormatError, match=message) as info:
        parse_operation(doc, store="/data/s.zarr")
    assert "Store /data/s.zarr" in str(info.value)


def test_an_unknown_operation_names_it_and_the_store(local: StoreLocation) -> None:
    _journal_file(local).write_text('{"op": "compact"}')
    with pytest.raises(
        StoreFormatError, match=f"^Unknown operation 'compact' in the write journal of {local.display} \\(in "
    ):
        journal.read_journal(local)


def test_a_journal_that_is_not_json_names_the_store(local: StoreLocation) -> None:
    _journal_file(local).write_text('{"op": "app')
    with pytest.raises(StoreFormatError, match=f"^Store {local.display}: the write journal .* is not valid JSON"):
        journal.read_journal(local)


GARBAGE: dict[str, bytes] = {
    "not json": b"not json",
    "empty object": b"{}",
    "a list": b"[1,2]",
    "null": b"null",
    "empty file": b"",
    "not utf-8": b"\xff\xfe\x00garbage",
    "nested past the parser": b"[" * 100_000,
    "an op without its fields": b'{"op": "append"}',
    "a huge list": json.dumps(list(range(50_000))).encode(),
}


@pytest.mark.parametrize("case", list(GARBAGE))
def test_a_garbage_journal_names_its_file_and_the_fix(local: StoreLocation, case: str) -> None:
    path = _journal_file(local)
    path.write_bytes(GARBAGE[case])
    with pytest.raises(StoreFormatError) as info:
        journal.read_journal(local)
    message = str(info.value)
    assert message.startswith(f"Store {local.display}:") or message.startswith("Unknown operation")
    assert str(path) in message, case
    assert "If no writer is running on this store, move the journal file aside, then run" in message
    assert f"`dali-alchemi verify {local.display}`" in message
    assert len(message) < 1500, case  # a huge journal is not copied into the message
    assert path.read_bytes() == GARBAGE[case]  # never removed or changed


def test_a_journal_that_cannot_be_read_names_its_file(local: StoreLocation) -> None:
    path = _journal_file(local)
    path.mkdir()
    with pytest.raises(StoreFormatError, match=f"the write journal {path} cannot be read .*move the journal"):
        journal.read_journal(local)


def test_no_operation_reads_the_store_as_it_is() -> None:
    assert interpret(None) is AS_IS
    assert AS_IS == ReadView() and not AS_IS.growing
    assert (AS_IS.rows, AS_IS.deleted, AS_IS.hidden_custom, AS_IS.fallback_dirs) == (None, (), None, ())


def test_an_unfinished_append_is_read_at_its_old_sizes() -> None:
    view = interpret(AppendOp(samples=40, atoms=812, edges=3020))
    assert view.rows == PerLevel(atom=812, edge=3020, system=40)
    assert view.growing
    assert (view.deleted, view.hidden_custom, view.fallback_dirs) == ((), None, ())


def test_an_unfinished_delete_is_read_at_its_new_state() -> None:
    view = interpret(DeleteOp(physical=(1, 5)))
    assert view.deleted == (1, 5)
    assert view.rows is None and not view.growing


@pytest.mark.parametrize("state", [OpState.STAGING, OpState.SWAPPING])
def test_an_uncommitted_add_custom_hides_the_new_array_and_reads_the_one_it_replaces(state: OpState) -> None:
    replacing = interpret(AddCustomOp(key="tag", level="atom", previous="system", state=state))
    assert replacing.hidden_custom == "tag"
    assert replacing.replaced_level == "system"
    assert replacing.moved_aside == "previous-tag" == journal.previous_suffix("tag")
    adding = interpret(AddCustomOp(key="q", level="atom", previous=None, state=state))
    assert (adding.hidden_custom, adding.replaced_level) == ("q", None)
    assert not adding.growing and adding.deleted == ()


def test_a_committed_add_custom_is_read_at_its_new_state() -> None:
    op = AddCustomOp(key="tag", level="atom", previous="system", state=OpState.COMMITTED)
    assert interpret(op) == AS_IS


def test_a_defragment_swap_reads_the_compacted_copy_first() -> None:
    view = interpret(DefragmentOp())
    assert view.fallback_dirs == ("defragment-new", "defragment-old")
    assert (journal.DEFRAGMENT_NEW, journal.DEFRAGMENT_OLD) == view.fallback_dirs
    assert view.rows is None and view.hidden_custom is None


def test_records_are_frozen() -> None:
    op = AppendOp(samples=1, atoms=2, edges=3)
    with pytest.raises(AttributeError):
        op.samples = 5  # type: ignore[misc]


def test_a_repair_record_round_trips_and_is_read_at_its_new_state_once_swapping() -> None:
    from dali_alchemi.store.format.journal import REPAIR_NEW, OpState, RepairOp

    op = RepairOp(key="neighbor_list", samples=9, state=OpState.STAGING)
    text = journal.dumps(op)
    assert json.loads(text) == {"op": "repair", "key": "neighbor_list", "samples": 9, "state": "staging"}
    assert parse_operation(json.loads(text), store="s") == op
    assert interpret(op) == AS_IS  # building the rewritten array: the old state
    assert interpret(op.with_state(OpState.SWAPPING)) == ReadView(staged_core=("neighbor_list", REPAIR_NEW))
    assert interpret(op.with_state(OpState.COMMITTED)) == AS_IS
    for bad, message in (
        ({"op": "repair", "key": "positions", "samples": 1, "state": "staging"}, "has key='positions'"),
        ({"op": "repair", "key": "neighbor_list", "samples": 1, "state": "done"}, "has state='done'"),
        ({"op": "repair", "key": "neighbor_list", "state": "staging"}, "has no 'samples'"),
    ):
        with pytest.raises(StoreFormatError, match=message):
            parse_operation(bad, store="s")
