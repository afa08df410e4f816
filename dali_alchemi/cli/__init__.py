"""The ``dali-alchemi`` command: parse arguments, call the library, print tables.

This package owns everything a person sees in a terminal (progress bars, tables); the library
functions it calls return records and print nothing. Off a terminal (a pipe, a file, a CI log) the
output is plain text at full width: no table is cut to 80 columns, no cell ends in an ellipsis, and
there are no progress bars.

Every command exits with one of three statuses (:data:`~dali_alchemi.cli.console.EXIT_OK` 0: done, nothing
wrong; :data:`~dali_alchemi.cli.console.EXIT_PROBLEMS` 1: it ran and found damage in a store;
:data:`~dali_alchemi.cli.console.EXIT_BAD_INPUT` 2: it could not do its job, bad usage, no readable store at
the path, or a destination the system would not let it write), and tells an error in one line, ``error:``
then the error's class and message, not a traceback (one is a bug).

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
from dali_alchemi.cli.console import EXIT_BAD_INPUT, CommandError, is_told_os_error, make_console, os_error_message
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
    """Entry point of the ``dali-alchemi`` console script; returns the exit status (usage errors exit 2 from
    argparse)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    console = make_console()
    try:
        return int(args.func(args, console))
    except CommandError as err:
        message = str(err)
    except DaliAlchemiError as err:  # the project's errors name the store, the array and what to do
        message = f"{type(err).__name__}: {err}"
    except OSError as err:  # the system refused: a full disk, a read-only folder, a file where a folder goes
        writes = getattr(args, "writes", None)
        writing = writes(args) if writes is not None else None
        if not is_told_os_error(err, writing):
            raise
        message = os_error_message(err, writing=writing)
    except ValueError as err:  # raised past the project's checks, perhaps by zarr: its names for a store go
        from dali_alchemi.store.format.location import zarr_error_text

        message = zarr_error_text(err)
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
