"""Writes the operating system refuses (a full disk, a read-only mount, no permission, a quota, a size limit).

A writer operation that hits one stops where it is, under its lock, and puts the store back the way
an interrupted operation is put back (:func:`~dali_alchemi.store.write.recovery.recover`: an append or an
add_custom rolled back, a delete or a swapping defragment finished, staging removed); then it raises
:class:`~dali_alchemi.errors.StoreWriteError` naming the store, the operation, the OS error and the
state the store is in. If putting it back is refused too (the disk is still full), the journal stays:
readers keep reading the state it describes, and the next writer operation finishes the recovery.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from dali_alchemi.errors import DaliAlchemiError, StoreWriteError
from dali_alchemi.store.format.journal import AddCustomOp, AppendOp, OpState, RepairOp, read_journal
from dali_alchemi.store.write.recovery import recover

if TYPE_CHECKING:
    from dali_alchemi.store.format.journal import Operation
    from dali_alchemi.store.format.location import StoreLocation

__all__ = ["REFUSALS", "is_refusal", "refused", "roll_back", "told_as_refused"]


REFUSALS: dict[int, str] = {
    errno.ENOSPC: "free space on that file system, then run it again",
    errno.EDQUOT: "free some of your disk quota (or have it raised), then run it again",
    errno.EROFS: "the file system is mounted read-only: write to a copy on a writable one",
    errno.EACCES: "check the permissions of the store, its files and its parent directory",
    errno.EFBIG: "a file grew past the size limit (`ulimit -f`, or the file system's): raise it, then run it again",
}
"""The errno values that mean the operating system refused a write, with the next step for each: one table
for :class:`~dali_alchemi.errors.StoreWriteError` and the command line's one-line errors."""


def is_refusal(err: BaseException) -> bool:
    """Whether ``err`` is the OS refusing a write (and not already one of this package's errors)."""
    return isinstance(err, OSError) and not isinstance(err, DaliAlchemiError) and err.errno in REFUSALS


def _rolled_back(op: Operation) -> bool:
    """Whether recovering ``op`` returns the store to its state before it (else it finishes it)."""
    if isinstance(op, AppendOp):
        return True
    if isinstance(op, (AddCustomOp, RepairOp)):
        return op.state is not OpState.SWAPPING and op.state is not OpState.COMMITTED
    return False


def roll_back(loc: StoreLocation, operation: str) -> str:
    """Put the store back after a refused write (under the caller's writer lock); says the state it is in."""
    try:
        op = read_journal(loc)
    except DaliAlchemiError:
        op = None
    try:
        recover(loc)
    except Exception as err:  # the disk is still full, say: the journal stays and describes the state
        if op is None:
            return f"Cleaning up failed too ({type(err).__name__}: {err}); the store itself was not changed."
        fate = "rolls it back" if _rolled_back(op) else "finishes it"
        state = "old" if _rolled_back(op) else "new"
        return (
            f"It could not be put back ({type(err).__name__}: {err}): readers read it at its {state} state, "
            f"as its write journal says, and the next writer operation (or AtomicDataZarrWriter(store).recover()) "
            f"{fate} once the cause is fixed."
        )
    if op is None:
        return "No store was created." if operation == "write" else "The store was not changed."
    if _rolled_back(op):
        return f"The store was rolled back to its state before the {operation}."
    return f"The {op.OP} had reached the point readers see, and was finished."


def refused(loc: StoreLocation, operation: str, err: OSError, state: str) -> StoreWriteError:
    """The error for ``operation`` on the store at ``loc`` refused with ``err``; ``state`` says how the
    store was left."""
    store = loc.display
    code = err.errno
    reason = err.strerror or (os.strerror(code) if code is not None else str(err))
    where = f" ({err.filename})" if err.filename else ""
    name = errno.errorcode.get(code, str(code)) if code is not None else "?"
    fix = REFUSALS.get(code, "") if code is not None else ""
    return StoreWriteError(
        code,
        f"Store {store}: {operation} failed: the operating system refused a write: {reason} "
        f"[{name}]{where}. {state} Next: {fix}.",
        store=store, operation=operation,
    )  # fmt: skip


@contextmanager
def told_as_refused(loc: StoreLocation, operation: str, state: Callable[[], str]) -> Iterator[None]:
    """A write the OS refuses inside the block becomes :func:`refused`'s error; ``state()`` puts the store
    back if it must (:func:`roll_back`) and says how it was left."""
    try:
        yield
    except OSError as err:
        if not is_refusal(err):
            raise
        raise refused(loc, operation, err, state()) from err
