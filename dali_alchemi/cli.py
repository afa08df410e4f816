"""The ``dali-alchemi`` command: parse arguments, call the library, print tables.

This module owns everything a person sees in a terminal (progress bars, tables); the library
functions it calls return records and print nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def cmd_synth(args: argparse.Namespace, console: Console) -> int:
    from dali_alchemi.bench.synth import write_synthetic_store

    path = write_synthetic_store(args.out, args.n, seed=args.seed, min_atoms=args.min_atoms, max_atoms=args.max_atoms)
    console.print(f"wrote {args.n} synthetic structures (seed {args.seed}) to {path}")
    return 0


def cmd_inspect(args: argparse.Namespace, console: Console) -> int:
    from dali_alchemi.store.summary import summarize

    summary = summarize(args.store)
    console.print(f"[bold]{summary.source}[/bold]")
    deleted = summary.physical_samples - summary.samples
    console.print(
        f"samples: {summary.samples}"
        + (f" ({deleted} soft-deleted)" if deleted else "")
        + f"   atoms: {summary.atoms}   edges: {summary.edges}   on disk: {_human_bytes(summary.bytes_on_disk)}"
    )
    table = Table("array", "level", "dtype", "shape", "chunks", "shards", "codecs")
    for a in summary.arrays:
        table.add_row(
            f"{a.group}/{a.name}",
            a.level,
            a.dtype,
            str(list(a.shape)),
            str(list(a.chunks)),
            "-" if a.shards is None else str(list(a.shards)),
            " ".join(a.codecs),
        )
    console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dali-alchemi", description="Atomistic Zarr stores to PyTorch through DALI.")
    sub = parser.add_subparsers(dest="command", required=True)

    synth = sub.add_parser("synth", help="write a synthetic store (nvalchemi's benchmark recipe)")
    synth.add_argument("out", help="path of the new store (must not exist)")
    synth.add_argument("--n", type=int, default=1000, help="number of structures (default 1000)")
    synth.add_argument("--seed", type=int, default=42, help="seed for sizes and values (default 42)")
    synth.add_argument("--min-atoms", type=int, default=10)
    synth.add_argument("--max-atoms", type=int, default=100)
    synth.set_defaults(func=cmd_synth)

    inspect = sub.add_parser("inspect", help="print a store's counts, arrays, chunks and codecs")
    inspect.add_argument("store", help="path or URL of the store")
    inspect.set_defaults(func=cmd_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dali-alchemi`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    from dali_alchemi.errors import DaliAlchemiError

    try:
        return int(args.func(args, console))
    except (DaliAlchemiError, FileExistsError, FileNotFoundError, ValueError) as err:
        console.print(f"[red]error:[/red] {type(err).__name__}: {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
