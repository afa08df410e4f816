"""The write journal: what makes an interrupted write leave the store at its old or its new state.

Every mutating writer operation first records what it is about to do in a small JSON journal,
then changes the store in an order that never invalidates the old state, and removes the journal
last. A reader that finds a journal interprets the store as the journal says (the old state for an
unfinished append or add_custom, the new state for a delete), and the next writer operation first
finishes or rolls back whatever the journal describes (:func:`recover` in the writer).

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from dali_alchemi.errors import StoreFormatError

if TYPE_CHECKING:
    from dali_alchemi.store.location import StoreLocation

JOURNAL_KEY = ".dali-alchemi-journal.json"


def sibling(loc: StoreLocation, suffix: str) -> Path:
    """A hidden path beside a local store: ``<parent>/.<name>.dali-alchemi-<suffix>``."""
    assert loc.local_root is not None
    return loc.local_root.with_name(f".{loc.local_root.name}.dali-alchemi-{suffix}")


def _journal_path(loc: StoreLocation) -> Path:
    return sibling(loc, "journal.json")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new content, never a mix."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_journal(loc: StoreLocation) -> dict[str, Any] | None:
    """The journal of the operation in progress on this store, or ``None``."""
    if loc.local_root is not None:
        try:
            raw = _journal_path(loc).read_bytes()
        except FileNotFoundError:  # none, or a writer just finished
            return None
    else:
        buf = sync(loc.store.get(loc.key(JOURNAL_KEY), prototype=default_buffer_prototype()))
        if buf is None:
            return None
        raw = buf.to_bytes()
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise StoreFormatError(f"Store {loc.display}: the write journal is not valid JSON: {err}") from err
    if not isinstance(doc, dict) or "op" not in doc:
        raise StoreFormatError(f"Store {loc.display}: the write journal has no 'op': {doc!r}")
    return doc


def write_journal(loc: StoreLocation, doc: dict[str, Any]) -> None:
    """Record (or update) the operation in progress."""
    text = json.dumps(doc)
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
