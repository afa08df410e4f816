"""The ``repair`` command: re-base the neighbor lists of stores grown by nvalchemi 0.2.0's append."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dali_alchemi.cli.console import CommandError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["cmd_repair", "register"]


def cmd_repair(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    from dali_alchemi.store.check.repair_plan import summary_lines
    from dali_alchemi.store.write.repair import repair_store

    report = repair_store(args.store, out=args.out, dry_run=args.dry_run, prefer=args.prefer)
    for line in summary_lines(report.plan):
        console.print(escape(line))
    if args.dry_run:
        if report.plan.refused:
            raise CommandError("repair would refuse this store: the samples listed above cannot be re-based")
        console.print("dry run: nothing written")
    elif report.applied:
        console.print(f"repaired: {escape(str(report.written_to))}")
    else:
        console.print("nothing to repair: every neighbor list is already store-global")
    return 0


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
    repair.set_defaults(func=cmd_repair)
