"""``dali-alchemi verify STORE``: decode every chunk once and check the store whole before a long job.

Exit status 0 when nothing is wrong, 1 when problems were found (each listed with its array, chunk
key and structure), 2 when there is no store to check (nothing at that path, a plain file, a folder with
no ``zarr.json``) or the arguments are bad.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from rich.markup import escape

from dali_alchemi.cli.console import EXIT_OK, EXIT_PROBLEMS, CountColumn, human_bytes, make_table, print_table

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import TaskID

    from dali_alchemi.store.check.verify import VerifyReport

__all__ = ["cmd_verify", "register"]


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    from rich.console import Console as RichConsole
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from dali_alchemi.cli.console import CommandError
    from dali_alchemi.store.check.verify import verify_store

    if args.max_problems < 1:
        raise CommandError(f"--max-problems must be at least 1, got {args.max_problems}")
    from dali_alchemi.store.format.multistore import is_multistore

    stores = [args.store]
    if is_multistore(args.store):  # a parallel convert's parts: each checked as the store it is
        from dali_alchemi.store.read.multistore import part_paths

        stores = [str(part) for part in part_paths(args.store)]
    # the bar goes to stderr, so that --json output on stdout stays clean; none off a terminal
    status = RichConsole(stderr=True)
    reports = []
    with Progress(TextColumn("verifying"), BarColumn(), CountColumn("chunks"),
                  TimeElapsedColumn(), console=status, transient=True, disable=not status.is_terminal) as bar:  # fmt: skip
        for store in stores:
            task = bar.add_task("verifying", total=None)

            def advance(done: int, total: int | None, task: TaskID = task) -> None:
                bar.update(task, completed=done, total=total)

            reports.append(verify_store(store, max_problems=args.max_problems, progress=advance))
    if args.json:
        dicts = [report.to_dict() for report in reports]
        print(json.dumps(dicts[0] if len(stores) == 1 else {"store": args.store, "parts": dicts}, indent=2))
        return EXIT_OK if all(report.ok for report in reports) else EXIT_PROBLEMS
    codes = [_print_report(report, console) for report in reports]
    return EXIT_OK if all(code == EXIT_OK for code in codes) else EXIT_PROBLEMS


def _print_report(report: VerifyReport, console: Console) -> int:
    """What ``verify`` prints of one store's report; the exit status it gives."""
    if report.samples < 0:  # its root or its pointers are unreadable: too little was checked to sum up
        for problem in report.problems:
            console.print(f"[red]problem[/red]: {escape(problem.message)}", highlight=False)
        return EXIT_PROBLEMS
    rate = report.samples / report.seconds if report.seconds > 0 and report.samples > 0 else 0.0
    console.print(
        f"[bold]{report.store}[/bold]: {max(report.samples, 0):,} structures ({report.live:,} live), "
        f"{report.arrays} arrays, {report.chunks:,} chunks, {human_bytes(report.bytes_decoded)} decoded "
        f"in {report.seconds:.2f} s ({rate:,.0f} structures/s)"
    )
    promise = "every chunk written" if report.complete_chunks else "chunks may be implicit (store written elsewhere)"
    console.print(f"promise: {promise}; checksums: {report.checksums or 'none promised'}")
    if report.unchecksummed:
        console.print("arrays without checksums: " + ", ".join(report.unchecksummed))
    for line in report.skipped:
        console.print(f"skipped: {line}")
    if report.implicit_chunks:
        console.print(f"{report.implicit_chunks:,} chunks are not stored and read as the fill value")
    if report.ok:
        console.print("[green]ok[/green]: no problems found")
        return EXIT_OK
    table = make_table("kind", "array", "chunk", "structure", "problem")
    for p in report.problems:
        cells = (p.kind, p.array or "-", p.chunk or "-", "-" if p.sample is None else str(p.sample), p.message)
        table.add_row(*map(escape, cells))  # "[V, 3]" in a message is text, not rich markup
    print_table(console, table)
    more = f" (and {report.problems_left_out:,} more not listed)" if report.problems_left_out else ""
    n = len(report.problems) + report.problems_left_out
    console.print(f"[red]{n:,} problem{'' if n == 1 else 's'} found[/red]{more}")
    return EXIT_PROBLEMS


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``verify`` to the ``dali-alchemi`` parser."""
    verify = sub.add_parser(
        "verify", help="decode every chunk once and check checksums, pointers, masks and neighbor lists"
    )
    verify.add_argument("store", help="path or URL of the store")
    verify.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    verify.add_argument("--max-problems", type=int, default=100, help="problems listed one by one (default 100)")
    verify.set_defaults(func=cmd_verify)
