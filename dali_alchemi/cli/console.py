"""What every command shares: the console, tables, devices and the error a person is shown."""

from __future__ import annotations

import argparse
import errno
import os
import textwrap
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Console
from rich.progress import ProgressColumn, Task
from rich.table import Column, Table
from rich.text import Text

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

__all__ = [
    "EXIT_BAD_INPUT", "EXIT_OK", "EXIT_PROBLEMS", "LOG_WIDTH", "CommandError", "CountColumn", "at_least",
    "cuda_device", "fmt", "fold_columns", "human_bytes", "is_told_os_error", "make_console", "make_table",
    "os_error_message", "parse_device", "print_table"
]

EXIT_OK = 0
"""Exit status of a command that did what it was asked and found nothing wrong."""

EXIT_PROBLEMS = 1
"""Exit status of a command that ran and found damage in a store (``verify``; ``repair`` finding neighbor lists
to re-base in a dry run, or refusing some)."""

EXIT_BAD_INPUT = 2
"""Exit status of a command that could not do its job: bad usage or options, no store (or a file, or a folder
that is not one) at the path, a store the reader refuses, or a path the system would not let it write."""


LOG_WIDTH = 10_000
"""The console width off a terminal: wider than any table, so rich never shrinks or ellipsizes a cell."""


class CommandError(Exception):
    """Bad input or a missing GPU, told as ``error: ...`` with exit code 2 rather than a traceback."""


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer no smaller than ``minimum`` (else a usage error, exit status 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


_NEXT_STEP = {  # and the steps for a refused write (store.write.refusals.REFUSALS), read when an error is told
    errno.EPERM: "choose a folder you may write to, or change its permissions",
    errno.ENOTDIR: "a part of the path is a file, not a folder: check the path",
    errno.EEXIST: "something is already at that path (a file where a folder was expected?): check the path",
    errno.ENOENT: "check that the folder exists",
}
"""What to do about an error the operating system gave, by its errno."""

_NEXT_STEP_READING = {
    errno.EACCES: "you may not read it: check its permissions",
    errno.EPERM: "you may not read it: check its permissions",
}
"""What to do instead, where the command was not writing anything."""


def is_told_os_error(err: OSError, writing: str | None = None) -> bool:
    """Whether ``err`` is one the system gives a user to act on (a full disk, no permission, a path that is a
    file), told in one line; any other (a bad file descriptor, say) is a bug, shown with its traceback."""
    from dali_alchemi.store.write.refusals import REFUSALS

    if isinstance(err, (ConnectionError, TimeoutError)):  # a server or the network
        return True
    if isinstance(err.errno, int):
        return err.errno in REFUSALS or err.errno in _NEXT_STEP or err.errno in _NEXT_STEP_READING
    return writing is not None and "requested and" in str(err)  # numpy's short write: "N requested and M written"


def os_error_message(err: OSError, writing: str | None = None) -> str:
    """One line for an error the operating system gave: the error's class, the OS's reason and the path it was
    about, what the command was writing (``writing``), and what to do.

    ``writing`` is given as typed and also shown absolute, because the failing path is often a temporary
    file beside it (the new store is built there, then renamed into place).
    """
    reason = err.strerror or str(err) or "no reason given"
    line = f"{type(err).__name__}: {reason}"
    if err.filename is not None:
        line += f": {os.fsdecode(err.filename)}"
    if err.filename2 is not None:
        line += f" -> {os.fsdecode(err.filename2)}"
    if writing is not None:
        line += f" (while writing {os.path.abspath(writing)})"
    code = err.errno if isinstance(err.errno, int) else -1
    from dali_alchemi.store.write.refusals import REFUSALS  # imported only when there is an error to tell

    step = (_NEXT_STEP_READING.get(code) if writing is None else None) or REFUSALS.get(code) or _NEXT_STEP.get(code)
    if step is None and err.errno is None and writing is not None:  # numpy's short write: "N requested and M written"
        step = "a write stopped short, as on a full disk or past a file-size limit: free some space, or write elsewhere"
    if step is None:
        step = "check the path and the disk" if writing is not None else "check the path and its permissions"
    return f"{line}; {step}"


class CountColumn(ProgressColumn):
    """``done/total unit`` once the total is known, ``done unit`` before (never ``0/None``)."""

    def __init__(self, unit: str = "") -> None:
        super().__init__()
        self.unit = f" {unit}" if unit else ""

    def render(self, task: Task) -> Text:
        done = f"{int(task.completed):,}"
        return Text(done + self.unit if task.total is None else f"{done}/{int(task.total):,}{self.unit}")


def make_console() -> Console:
    """rich's console on a terminal; anywhere else one that never cuts a table to the width of a terminal."""
    console = Console()
    if console.is_terminal:
        return console
    return Console(width=LOG_WIDTH, soft_wrap=True)


def make_table(*columns: str, title: str | None = None) -> Table:
    """A table whose cells wrap onto more lines in a narrow terminal rather than end in an ellipsis."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def print_table(console: Console, table: Table, keys: int = 1) -> None:
    """Print ``table`` whole, or, on a terminal too narrow for it, as several tables of its columns.

    Each part repeats the first ``keys`` columns (what a row is about) and takes as many of the others
    as fit, so that no number is broken over two lines. Off a terminal the table is printed whole.
    """
    columns = table.columns
    if not console.is_terminal or _table_width(columns) <= console.width or len(columns) <= keys + 1:
        console.print(table)
        return
    for part in fold_columns(table, console.width, keys):
        console.print(part)


def fold_columns(table: Table, width: int, keys: int = 1) -> list[Table]:
    """``table`` cut into tables at most ``width`` wide (where its cells allow), each starting with
    the first ``keys`` columns; the title goes on the first."""
    key_columns, rest = table.columns[:keys], table.columns[keys:]
    groups: list[list[Column]] = [[]]
    for column in rest:
        if groups[-1] and _table_width([*key_columns, *groups[-1], column]) > width:
            groups.append([])
        groups[-1].append(column)
    parts = []
    for i, group in enumerate(groups):
        part = Table(title=table.title if i == 0 else None)
        for column in (*key_columns, *group):  # as wide as its widest cell, its header wrapped to fit
            needed = _needed(column)
            header = textwrap.fill(str(column.header), width=needed)
            part.add_column(header, overflow="fold", justify=column.justify, min_width=needed)
        for row in range(table.row_count):
            part.add_row(*(column._cells[row] for column in (*key_columns, *group)))
        parts.append(part)
    return parts


def _needed(column: Column) -> int:
    """The width ``column`` needs with no cell broken (its header may wrap between words)."""
    header = max((cell_len(word) for word in str(column.header).split()), default=0)
    return max([header, *(cell_len(str(cell)) for cell in column._cells)])


def _table_width(columns: list[Column]) -> int:
    """The width a table of ``columns`` needs with no cell broken."""
    return sum(_needed(column) + 3 for column in columns) + 1  # padding and a rule per column, the last edge


def parse_device(spec: str) -> torch.device:
    """The device of ``--device``; a CUDA device on a machine without a GPU is a :class:`CommandError`."""
    from dali_alchemi.pipeline.device import resolve_device as resolve

    try:
        return resolve(spec)
    except RuntimeError as err:  # no GPU, or a malformed device string
        raise CommandError(f"--device {spec}: {err}") from err


def cuda_device(spec: str) -> torch.device:
    """The device of ``h2d --device``, which must be a visible CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
        raise CommandError(
            f"h2d measures host-to-device copies and needs a CUDA GPU, and none is visible "
            f"(torch {torch.__version__}, {build})"
        )
    device = parse_device(spec)
    if device.type != "cuda":
        raise CommandError(f"h2d measures host-to-device copies: --device must be a CUDA device, got {spec!r}")
    return device


def human_bytes(n: float) -> str:
    """A byte count for people: 512 B, 3.2 MiB, 1.1 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt(value: float | None, spec: str) -> str:
    """A table cell: the value formatted, or ``-`` when it was not measured."""
    return "-" if value is None else format(value, spec)
