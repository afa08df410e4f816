"""The ``repair`` command: re-base the neighbor lists of stores grown by nvalchemi 0.2.0's append."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dali_alchemi.cli.console import EXIT_OK, EXIT_PROBLEMS

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["cmd_repair", "register"]


def cmd_repair(args: argparse.Namespace, console: Console) -> int:
    """Exit status 0 when the neighbor lists are (now) store-global, 1 when a dry run finds some to re-base or
    the store has samples repair refuses (the store is then unchanged), 2 for bad input."""
    from rich.markup import escape

    from dali_alchemi.errors import AmbiguousRepairError, RepairError
    from dali_alchemi.store.check.repair_plan import summary_lines
    from dali_alchemi.store.write.repair import repair_store

    try:
        report = repair_store(args.store, out=args.out, dry_run=args.dry_run, prefer=args.prefer)
    except RepairError as err:
        if not err.samples:  # repair could not run on this store at all (a custom neighbor_list, say): bad input
            raise
        # the store was read and has samples repair cannot re-base: a finding, not bad input
        console.print(f"[red]refused:[/red] {type(err).__name__}: {escape(str(err))}", highlight=False)
        if isinstance(err, AmbiguousRepairError):
            console.print(
                "if you know how the store was grown, --prefer sample-local (batch-local, global) may settle it"
            )
        return EXIT_PROBLEMS
    for line in summary_lines(report.plan):
        console.print(escape(line))
    if args.dry_run:
        console.print("dry run: nothing written")
        if report.plan.refused:
            console.print("[red]refused:[/red] repair would refuse this store: the samples above cannot be re-based")
            return EXIT_PROBLEMS
        if report.plan.changed.size:
            console.print("to re-base them: dali-alchemi repair STORE (in place), or with --out DIR (a repaired copy)")
            return EXIT_PROBLEMS
        return EXIT_OK
    if report.applied:
        console.print(f"repaired: {escape(str(report.written_to))}")
    else:
        console.print("nothing to repair: every neighbor list is already store-global")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``dali-alchemi`` parser."""
    repair = sub.add_parser(
        "repair", help="re-base neighbor lists that nvalchemi's append stored un-rebased (in place or --out DIR)"
    )
    repair.add_argument("store", help="path or URL of the store (a URL needs --out or --dry-run)")
    repair.add_argument("--dry-run", action="store_true", help="report what would change; write nothing")
    repair.add_argument("--out", help="write a repaired copy to this new directory; the store is only read")
    repair.add_argument(
        "--prefer", choices=("sample-local", "batch-local", "global"),
        help="settle ambiguous structures this way (how you know the store was grown, e.g. sample-local "
        "for one AtomicData per append)",
    )  # fmt: skip
    repair.set_defaults(func=cmd_repair, writes=lambda args: None if args.dry_run else args.out or args.store)
