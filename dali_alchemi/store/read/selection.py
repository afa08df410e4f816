"""Which fields a reader reads: its ``fields=`` selection checked against the store it opens, and one
read's ``fields=`` narrowing of it.

A field the store holds but this version cannot interpret (a newer writer's level) is an error when asked
for by name, and skipped with a :class:`~dali_alchemi.errors.StoreSchemaWarning` when every field is read;
a name the store (or the reader's selection) does not hold is an :class:`~dali_alchemi.errors.UnknownFieldError`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING

from dali_alchemi.errors import ConfigError, StoreFormatError, StoreSchemaWarning, UnknownFieldError
from dali_alchemi.store.format.protocol import as_field_names

if TYPE_CHECKING:
    from dali_alchemi.store.read.snapshot import Snapshot

__all__ = ["fields_to_read", "narrow_fields"]


def fields_to_read(snapshot: Snapshot, requested: tuple[str, ...] | None) -> tuple[str, ...]:
    """The fields a reader opened with ``fields=requested`` reads from ``snapshot``, in the requested order.

    ``None`` reads every array the snapshot can interpret, in store order, and warns (attributed to the
    code that opened the reader) about those it skips.

    Raises
    ------
    StoreFormatError
        If a requested field is one this version cannot interpret (saying why).
    UnknownFieldError
        If a requested field is not in the store (naming those available).
    """
    uninterpretable = [name for name in (requested or ()) if name in snapshot.skipped]
    if uninterpretable:
        raise StoreFormatError(snapshot.skipped[uninterpretable[0]])
    if requested is None and snapshot.skipped:
        skipped = sorted(snapshot.skipped)
        message = f"Store {snapshot.location.display}: not reading {skipped}: their level is a newer writer's"
        warnings.warn(message, StoreSchemaWarning, stacklevel=4)  # here, refresh, __init__, its caller
    if requested is None:
        return tuple(snapshot.handles)
    unknown = sorted(set(requested) - set(snapshot.handles))
    if unknown:
        raise UnknownFieldError(
            f"Unknown fields {unknown} for store {snapshot.location.display}; available: {sorted(snapshot.handles)}"
        )
    return tuple(requested)


def narrow_fields(fields: str | Iterable[str], reading: tuple[str, ...], snapshot: Snapshot) -> tuple[str, ...]:
    """``fields`` (one name, or several) checked against ``reading``, the fields the reader reads.

    Raises
    ------
    StoreFormatError
        If one is a field of ``snapshot`` this version cannot interpret.
    UnknownFieldError
        If one is not among ``reading``.
    ConfigError
        If ``fields`` names none.
    """
    names = as_field_names(fields)
    unknown = sorted(set(names) - set(reading))
    uninterpretable = [name for name in unknown if name in snapshot.skipped]
    if uninterpretable:
        raise StoreFormatError(snapshot.skipped[uninterpretable[0]])
    if unknown:
        raise UnknownFieldError(f"Unknown fields {unknown}; this reader returns {list(reading)}")
    if not names:
        raise ConfigError("fields must name at least one field")
    return names
