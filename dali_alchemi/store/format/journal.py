"""The write journal: what makes an interrupted write leave the store at its old or its new state.

Every mutating writer operation first records what it is about to do in a small JSON journal,
then changes the store in an order that never invalidates the old state, and removes the journal
last. The journal holds one operation, a typed record here (:class:`AppendOp`, :class:`DeleteOp`,
:class:`AddCustomOp`, :class:`DefragmentOp`, :class:`RepairOp`). A reader that finds one reads the store as
:func:`interpret` says (the old state for an unfinished append or add_custom, the new state for a
delete, the staged copy while a defragment swaps directories or a repair swaps its array), and the next writer operation first
finishes or rolls back whatever the journal describes (:mod:`dali_alchemi.store.write.recovery`).

For a local directory store the journal and any staging directories live *beside* the store
(``.<name>.dali-alchemi-journal.json``, ``.<name>.dali-alchemi-*``), so the store directory itself only
ever holds zarr objects and zarr and nvalchemi never see foreign files. Other stores keep the journal
under a hidden key at the store's root. Each journal write replaces the whole object atomically
(a temporary file and ``os.replace`` locally; stores write whole objects).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from dali_alchemi.errors import StoreFormatError
from dali_alchemi.store.format import layout
from dali_alchemi.types import LEVELS, Level, PerLevel

if TYPE_CHECKING:
    from dali_alchemi.store.format.location import StoreLocation

__all__ = [
    "AS_IS", "CREATE_PREFIX", "DEFRAGMENT_NEW", "DEFRAGMENT_OLD", "JOURNAL_KEY", "JOURNAL_SUFFIX",
    "REPAIR_NEW", "REPAIR_OLD", "AddCustomOp", "AppendOp", "DefragmentOp", "DeleteOp", "OpState", "Operation",
    "ReadView", "RepairOp", "atomic_write_text", "clear_journal", "dumps", "interpret", "parse_operation",
    "previous_suffix", "read_journal", "sibling", "siblings", "staging_suffix", "write_journal"
]


JOURNAL_KEY = ".dali-alchemi-journal.json"
"""Key of the journal inside a non-local store."""

# Suffixes of the hidden paths beside a local store (see :func:`sibling`).
JOURNAL_SUFFIX = "journal.json"
DEFRAGMENT_NEW = "defragment-new"
"""The compacted copy a defragment builds, moved into place by the swap."""
DEFRAGMENT_OLD = "defragment-old"
"""The old store, moved aside by the swap and deleted after it."""
CREATE_PREFIX = "create-"
"""A new store being written (``create-<random>``), renamed into place when complete."""
REPAIR_NEW = "repair-new"
"""The repaired copy of ``core/neighbor_list`` a repair builds, moved into place by its swap."""
REPAIR_OLD = "repair-old"
"""The old ``core/neighbor_list``, moved aside by a repair's swap and deleted after it."""


def staging_suffix(key: str) -> str:
    """Where add_custom builds the new custom array ``key`` before moving it in."""
    return f"staging-{key}"


def previous_suffix(key: str) -> str:
    """Where add_custom moves the custom array ``key`` it replaces until it commits."""
    return f"previous-{key}"


# -- the operations -------------------------------------------------------------------------------
class OpState(StrEnum):
    """How far an add_custom or a repair got: building the new array, swapping it in, or committed
    (only cleanup left)."""

    STAGING = "staging"
    SWAPPING = "swapping"
    COMMITTED = "committed"


@dataclass(frozen=True, slots=True)
class AppendOp:
    """An append after the store's first ``samples`` physical samples, ``atoms`` atoms and ``edges`` edges."""

    OP: ClassVar[str] = "append"
    samples: int
    atoms: int
    edges: int

    @property
    def rows(self) -> PerLevel[int]:
        """Rows of each level before the append: the old state."""
        return PerLevel(atom=self.atoms, edge=self.edges, system=self.samples)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.OP, "samples": self.samples, "atoms": self.atoms, "edges": self.edges}


@dataclass(frozen=True, slots=True)
class DeleteOp:
    """A soft delete of ``physical`` samples (sorted, distinct)."""

    OP: ClassVar[str] = "delete"
    physical: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"op": self.OP, "physical": list(self.physical)}


@dataclass(frozen=True, slots=True)
class AddCustomOp:
    """Writing custom array ``key`` at ``level``; ``previous`` is the level of the array it replaces."""

    OP: ClassVar[str] = "add_custom"
    key: str
    level: Level
    previous: Level | None
    state: OpState

    def with_state(self, state: OpState) -> AddCustomOp:
        return replace(self, state=state)

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.OP,
            "key": self.key,
            "level": self.level,
            "previous": self.previous,
            "state": self.state.value,
        }


@dataclass(frozen=True, slots=True)
class DefragmentOp:
    """A defragment whose compacted copy is complete and whose directory swap has begun."""

    OP: ClassVar[str] = "defragment"

    def to_json(self) -> dict[str, Any]:
        return {"op": self.OP}


@dataclass(frozen=True, slots=True)
class RepairOp:
    """Rewriting core array ``key`` (``neighbor_list``) to store-global indices; ``samples`` of them change."""

    OP: ClassVar[str] = "repair"
    key: str
    samples: int
    state: OpState

    def with_state(self, state: OpState) -> RepairOp:
        return replace(self, state=state)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.OP, "key": self.key, "samples": self.samples, "state": self.state.value}


Operation = AppendOp | DeleteOp | AddCustomOp | DefragmentOp | RepairOp
"""One journaled operation."""


def _field(doc: Mapping[str, Any], name: str, store: str) -> Any:
    if name not in doc:
        raise StoreFormatError(f"Store {store}: the write journal of {doc['op']!r} has no {name!r}: {dict(doc)!r}")
    return doc[name]


def _bad(doc: Mapping[str, Any], name: str, expected: str, store: str) -> StoreFormatError:
    return StoreFormatError(
        f"Store {store}: the write journal of {doc['op']!r} has {name}={doc[name]!r}; expected {expected}"
    )


def _count(doc: Mapping[str, Any], name: str, store: str) -> int:
    value = _field(doc, name, store)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(doc, name, "a non-negative integer", store)
    return value


def _level(doc: Mapping[str, Any], name: str, store: str, *, optional: bool = False) -> Level | None:
    value = _field(doc, name, store)
    if value is None and optional:
        return None
    if value not in LEVELS:
        raise _bad(doc, name, f"one of {', '.join(LEVELS)}" + (" or null" if optional else ""), store)
    return value  # type: ignore[no-any-return]


def parse_operation(doc: Any, *, store: str) -> Operation:
    """The typed record of a journal document; keys this version does not know are ignored.

    A record is checked like the operation it describes: it may name only paths inside that
    operation's own arrays (an add_custom's key follows the field-name rules of
    :func:`~dali_alchemi.store.format.layout.field_name_problem`, so no ``..`` or ``.``), because recovery
    deletes what it names. :mod:`dali_alchemi.store.write.recovery` checks the counts against the store.

    Raises
    ------
    StoreFormatError
        If the document has no ``op``, names an unknown operation, or a field is missing or malformed.
    """
    if not isinstance(doc, dict) or "op" not in doc:
        shown = repr(doc)
        shown = shown if len(shown) <= 200 else f"{shown[:200]}... ({len(shown)} characters)"
        raise StoreFormatError(f"Store {store}: the write journal has no 'op': {shown}")
    op = doc["op"]
    if op == AppendOp.OP:
        return AppendOp(
            samples=_count(doc, "samples", store), atoms=_count(doc, "atoms", store), edges=_count(doc, "edges", store)
        )
    if op == DeleteOp.OP:
        physical = _field(doc, "physical", store)
        if not isinstance(physical, list) or any(
            isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in physical
        ):
            raise _bad(doc, "physical", "a list of non-negative physical sample indices", store)
        return DeleteOp(physical=tuple(physical))
    if op == AddCustomOp.OP:
        key = _field(doc, "key", store)
        problem = layout.field_name_problem(key)
        if problem is not None:  # recovery deletes custom/<key>: "..", "." or "a/../b" would name other paths
            raise StoreFormatError(
                f"Store {store}: the write journal of 'add_custom' names custom array {key!r}, which {problem}: "
                f"a path outside the arrays an add_custom writes; nothing was changed (remove the journal "
                f"if no writer of yours left it)"
            )
        state = _field(doc, "state", store)
        if state not in tuple(OpState):
            raise _bad(doc, "state", f"one of {', '.join(OpState)}", store)
        level = _level(doc, "level", store)
        assert level is not None
        return AddCustomOp(
            key=key, level=level, previous=_level(doc, "previous", store, optional=True), state=OpState(state)
        )
    if op == DefragmentOp.OP:
        return DefragmentOp()
    if op == RepairOp.OP:
        key = _field(doc, "key", store)
        if key not in layout.ATOM_INDEX_FIELDS:
            raise _bad(doc, "key", "an atom-index field (neighbor_list)", store)
        state = _field(doc, "state", store)
        if state not in tuple(OpState):
            raise _bad(doc, "state", f"one of {', '.join(OpState)}", store)
        return RepairOp(key=key, samples=_count(doc, "samples", store), state=OpState(state))
    raise StoreFormatError(f"Unknown operation {op!r} in the write journal of {store}")


def dumps(op: Operation) -> str:
    """The journal file's text for ``op``."""
    return json.dumps(op.to_json())


# -- how a reader reads a store with an unfinished operation -------------------------------------
@dataclass(frozen=True, slots=True)
class ReadView:
    """How to read a store on which an operation is unfinished; the default reads it as it is.

    Attributes
    ----------
    rows
        Read only this many rows of each level (an unfinished append: its old state). Arrays may be
        longer than the pointers say.
    deleted
        Physical samples to read as deleted (an unfinished delete: its new state).
    hidden_custom
        A custom array being written: what is on disk under that name is not part of the store yet.
    replaced_level
        The level of the older custom array ``hidden_custom`` replaces, which is read instead
        (``None``: there is none, the name is new).
    moved_aside
        Suffix of the path beside a local store where that older array may have been moved.
    fallback_dirs
        Suffixes of the paths beside a local store to read, first existing one wins, when the store
        directory itself is missing (a defragment between its two renames).
    staged_core
        ``(name, suffix)``: read core array ``name`` from the path beside a local store with that
        suffix while it exists, else from the store (a repair swapping its rewritten array in).
    """

    rows: PerLevel[int] | None = None
    deleted: tuple[int, ...] = ()
    hidden_custom: str | None = None
    replaced_level: Level | None = None
    moved_aside: str | None = None
    fallback_dirs: tuple[str, ...] = ()
    staged_core: tuple[str, str] | None = None

    @property
    def growing(self) -> bool:
        """An append is unfinished: arrays may hold more rows than the state read."""
        return self.rows is not None


AS_IS = ReadView()
"""No operation in progress (or only its cleanup): read the store as it is."""


def interpret(op: Operation | None) -> ReadView:
    """How a reader must read a store on which ``op`` is unfinished, so it sees the old or the new state.

    - An append is read at its old state (its journal holds the old sizes); it commits when its
      journal is cleared.
    - A delete is read at its new state from the moment it is journaled.
    - An add_custom that has not committed is read at its old state: without the new array, or
      with the array it replaces (possibly moved aside). Once committed only cleanup is left.
    - A defragment is journaled once its compacted copy is complete; while the store directory is
      missing (between the two renames of the swap) the copy is read, or else the old store.
    - A repair is read at its old state while it builds the rewritten array, and at its new state
      (the rewritten array, beside the store or already moved in) from the moment it swaps.
    """
    if isinstance(op, AppendOp):
        return ReadView(rows=op.rows)
    if isinstance(op, DeleteOp):
        return ReadView(deleted=op.physical)
    if isinstance(op, AddCustomOp) and op.state is not OpState.COMMITTED:
        return ReadView(hidden_custom=op.key, replaced_level=op.previous, moved_aside=previous_suffix(op.key))
    if isinstance(op, DefragmentOp):
        return ReadView(fallback_dirs=(DEFRAGMENT_NEW, DEFRAGMENT_OLD))
    if isinstance(op, RepairOp) and op.state is OpState.SWAPPING:
        return ReadView(staged_core=(op.key, REPAIR_NEW))
    return AS_IS


# -- the file ------------------------------------------------------------------------------------
def sibling(loc: StoreLocation, suffix: str) -> Path:
    """A hidden path beside a local store: ``<parent>/.<name>.dali-alchemi-<suffix>``."""
    assert loc.local_root is not None
    return loc.local_root.with_name(f".{loc.local_root.name}.dali-alchemi-{suffix}")


def siblings(loc: StoreLocation) -> list[Path]:
    """Every hidden path beside a local store (its journal, staging directories, copies moved aside)."""
    assert loc.local_root is not None
    return sorted(loc.local_root.parent.glob(f".{loc.local_root.name}.dali-alchemi-*"))


def _journal_path(loc: StoreLocation) -> Path:
    return sibling(loc, JOURNAL_SUFFIX)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new content, never a mix."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_journal(loc: StoreLocation) -> Operation | None:
    """The operation in progress on this store, or ``None``.

    A journal this version cannot interpret is never guessed at (it may describe an append whose
    arrays are already longer than the pointers, or a delete halfway through zeroing rows): the
    error names the file and what to do.

    Raises
    ------
    StoreFormatError
        If the journal cannot be read, is not valid JSON or not a known operation (see
        :func:`parse_operation`); the message names the journal's path and the fix.
    """
    where = str(_journal_path(loc)) if loc.local_root is not None else f"{loc.display}/{JOURNAL_KEY}"
    if loc.local_root is not None:
        try:
            raw = _journal_path(loc).read_bytes()
        except FileNotFoundError:  # none, or a writer just finished
            return None
        except OSError as err:  # a directory, no permission
            raise StoreFormatError(
                f"Store {loc.display}: the write journal {where} cannot be read ({err}). {_journal_fix(loc)}"
            ) from err
    else:
        buf = sync(loc.store.get(loc.key(JOURNAL_KEY), prototype=default_buffer_prototype()))
        if buf is None:
            return None
        raw = buf.to_bytes()
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as err:  # RecursionError: nested past the parser's depth
        raise StoreFormatError(
            f"Store {loc.display}: the write journal {where} is not valid JSON ({type(err).__name__}: "
            f"{str(err)[:200]}). {_journal_fix(loc)}"
        ) from err
    try:
        return parse_operation(doc, store=loc.display)
    except StoreFormatError as err:
        raise StoreFormatError(f"{err} (in {where}). {_journal_fix(loc)}") from err


def _journal_fix(loc: StoreLocation) -> str:
    """What to do about a journal this version cannot interpret (readers and writers refuse the store)."""
    remove = "move the journal file aside" if loc.local_root is not None else f"delete the key {JOURNAL_KEY!r}"
    return (
        "This version never writes such a journal, so which state of the store is valid cannot be told from "
        "it: readers and writers refuse the store (AtomicDataZarrWriter(store).recover() too), and nothing was "
        f"changed. If no writer is running on this store, {remove}, then run `dali-alchemi verify "
        f"{loc.display}`: an operation stopped halfway can leave arrays longer than the pointers (an append) "
        "or deleted samples half-zeroed (a delete)"
    )


def write_journal(loc: StoreLocation, op: Operation) -> None:
    """Record (or update) the operation in progress."""
    text = dumps(op)
    if loc.local_root is not None:
        atomic_write_text(_journal_path(loc), text)
    else:
        buffer = default_buffer_prototype().buffer.from_bytes(text.encode())
        sync(loc.store.set(loc.key(JOURNAL_KEY), buffer))


def clear_journal(loc: StoreLocation) -> None:
    """Mark the operation finished."""
    if loc.local_root is not None:
        _journal_path(loc).unlink(missing_ok=True)
    else:
        sync(loc.store.delete(loc.key(JOURNAL_KEY)))
