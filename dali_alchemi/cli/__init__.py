"""The ``dali-alchemi`` command: parse arguments, call the library, print tables.

This package owns everything a person sees in a terminal (progress bars, tables); the library
functions it calls return records and print nothing. Off a terminal (a pipe, a file, a CI log) the
output is plain text at full width: no table is cut to 80 columns, no cell ends in an ellipsis, and
there are no progress bars.

One module per group of commands, each with a ``register(sub)`` that adds its subcommands. Parsing
the arguments imports nothing heavy (torch, zarr, DALI, the readers): each command imports what it
needs when it runs, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.markup import escape

from dali_alchemi import __version__
from dali_alchemi.cli import bench, repair, store, verify
from dali_alchemi.cli.console import CommandError, make_console
from dali_alchemi.errors import DaliAlchemiError

__all__ = ["COMMAND_MODULES", "build_parser", "main"]


COMMAND_MODULES = (store, verify, repair, bench)
"""The modules whose commands make up ``dali-alchemi``, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = argparse.ArgumentParser(prog="dali-alchemi", description="Atomistic Zarr stores to PyTorch through DALI.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dali-alchemi`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    console = make_console()
    try:
        return int(args.func(args, console))
    except CommandError as err:
        console.print(f"[red]error:[/red] {escape(str(err))}")
        return 2
    except (DaliAlchemiError, FileExistsError, FileNotFoundError, ValueError) as err:
        console.print(f"[red]error:[/red] {type(err).__name__}: {escape(str(err))}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
