"""What every command shares: the console, tables, devices and the error a person is shown."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import ProgressColumn, Task
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    import torch

LOG_WIDTH = 10_000
"""The console width off a terminal: wider than any table, so rich never shrinks or ellipsizes a cell."""


class CommandError(Exception):
    """Bad input or a missing GPU, told as ``error: ...`` with exit code 2 rather than a traceback."""


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


def parse_device(spec: str) -> torch.device:
    """The device of ``--device``; a CUDA device on a machine without a GPU is a :class:`CommandError`."""
    from dali_alchemi.pipeline.loader import resolve_device as resolve

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
