"""Commands about stores: write a synthetic one, inspect one, convert ASE-readable files into one."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from dali_alchemi.bench.names import CODECS, STORE_LAYOUTS
from dali_alchemi.cli.console import CommandError, human_bytes, make_table, print_table

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["cmd_convert", "cmd_inspect", "cmd_rewrite", "cmd_synth", "register"]


def cmd_synth(args: argparse.Namespace, console: Console) -> int:
    from dali_alchemi.bench.synth import write_synthetic_store

    if args.format == "extxyz":
        from dali_alchemi.bench.synth import write_synthetic_extxyz

        path = write_synthetic_extxyz(
            args.out, args.n, seed=args.seed, min_atoms=args.min_atoms, max_atoms=args.max_atoms
        )
    elif args.writer == "nvalchemi":
        from dali_alchemi.bench.synth import write_synthetic_store_nvalchemi

        path = write_synthetic_store_nvalchemi(
            args.out, args.n, seed=args.seed, min_atoms=args.min_atoms, max_atoms=args.max_atoms
        )
    else:
        from dali_alchemi.bench.synth import synthetic_config

        config = synthetic_config(
            args.codec, args.chunk_size, args.shard_size, checksum=not args.no_checksum, layout=args.layout
        )
        path = write_synthetic_store(
            args.out, args.n, seed=args.seed, min_atoms=args.min_atoms, max_atoms=args.max_atoms, config=config
        )
    console.print(f"wrote {args.n} synthetic structures (seed {args.seed}) to {path}")
    return 0


def cmd_inspect(args: argparse.Namespace, console: Console) -> int:
    from dali_alchemi.store.format.multistore import is_multistore
    from dali_alchemi.store.read.summary import summarize

    if is_multistore(args.store):
        return _inspect_multistore(args.store, console)
    summary = summarize(args.store)
    console.print(f"[bold]{summary.source}[/bold]")
    deleted = summary.physical_samples - summary.samples
    console.print(
        f"samples: {summary.samples}"
        + (f" ({deleted} soft-deleted)" if deleted else "")
        + f"   atoms: {summary.atoms}   edges: {summary.edges}   on disk: {human_bytes(summary.bytes_on_disk)}"
    )
    table = make_table("array", "level", "dtype", "shape", "chunks", "shards", "codecs")
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
    print_table(console, table)
    return 0


def _inspect_multistore(path: str, console: Console) -> int:
    """A multi-store's totals and its parts, then the arrays of its first part (every part has the same)."""
    from dali_alchemi.store.read.multistore import part_paths
    from dali_alchemi.store.read.summary import summarize

    summaries = [summarize(str(part)) for part in part_paths(path)]
    console.print(f"[bold]{path}[/bold]: a multi-store of {len(summaries)} parts, read as one store")
    console.print(
        f"samples: {sum(s.samples for s in summaries)}   atoms: {sum(s.atoms for s in summaries)}   "
        f"edges: {sum(s.edges for s in summaries)}   on disk: {human_bytes(sum(s.bytes_on_disk for s in summaries))}"
    )
    table = make_table("part", "samples", "atoms", "edges", "on disk")
    for part, s in zip(part_paths(path), summaries, strict=True):
        table.add_row(part.name, str(s.samples), str(s.atoms), str(s.edges), human_bytes(s.bytes_on_disk))
    print_table(console, table)
    arrays = make_table(f"array (of {part_paths(path)[0].name})", "level", "dtype", "shape", "chunks", "codecs")
    for a in summaries[0].arrays:
        arrays.add_row(
            f"{a.group}/{a.name}", a.level, a.dtype, str(list(a.shape)), str(list(a.chunks)), " ".join(a.codecs)
        )
    print_table(console, arrays)
    return 0


def cmd_convert(args: argparse.Namespace, console: Console) -> int:
    import time
    import warnings

    import numpy as np
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from dali_alchemi.errors import PrecisionLossWarning
    from dali_alchemi.interop.ase_fields import field_notes
    from dali_alchemi.interop.ase_io import convert

    for name in args.inputs:
        if Path(name).is_file() and Path(name).stat().st_size == 0:
            raise CommandError(f"{name} is empty: there are no structures to convert")
    if args.workers is not None and args.workers < 1:
        raise CommandError(f"--workers must be >= 1, got {args.workers}")
    parallel = args.workers is not None or args.scheduler is not None
    if args.part_size is not None and not parallel:
        raise CommandError("--part-size sizes the parts of a parallel convert: give --workers or --scheduler too")
    options = {
        "cutoff": args.cutoff, "float_dtype": np.float64 if args.float64 else np.float32,
        "system_float_dtype": np.float32 if args.system_float32 else np.float64, "missing": args.missing,
        "tolerance": args.tolerance, "chunk": args.chunk,
    }  # fmt: skip
    started = time.perf_counter()
    columns = (BarColumn(), MofNCompleteColumn()) if parallel else ()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), *columns, TimeElapsedColumn(), console=console,
                  disable=not console.is_terminal) as bar, warnings.catch_warnings():  # fmt: skip
        warnings.simplefilter("ignore", PrecisionLossWarning)  # the report below says it, once
        task = bar.add_task("converting", total=None)
        try:
            if parallel:
                from dali_alchemi.interop.parallel_convert import convert_parallel

                report = convert_parallel(
                    args.inputs, args.out, workers=args.workers or 1, scheduler=args.scheduler,
                    part_size=args.part_size, **options,
                    progress=lambda done, total: bar.update(task, completed=done, total=total,
                                                            description="structures converted"),
                )  # fmt: skip
            else:
                report = convert(
                    args.inputs, args.out, **options,
                    progress=lambda stage, done: bar.update(task, description=f"{done:,} structures {stage}"),
                )  # fmt: skip
        except Exception as err:
            if not _raised_in_ase(err.__traceback__):
                raise
            what = args.inputs[0] if len(args.inputs) == 1 else "the inputs (" + ", ".join(args.inputs) + ")"
            raise CommandError(f"ASE could not read {what}: {type(err).__name__}: {err}") from err
    seconds = time.perf_counter() - started
    console.print(
        f"wrote {_count(report.structures, 'structure')} ({report.atoms:,} atoms, {report.edges:,} edges) to {args.out} "
        f"in {seconds:.1f} s ({report.structures / seconds:,.0f} structures/s)"
        + (" as a multi-store (part stores and a manifest) that reads as one store" if parallel else "")
    )
    console.print("fields: " + ", ".join(f"{k} ({v})" for k, v in report.fields.items()))
    if report.custom:
        console.print("custom arrays: " + ", ".join(report.custom))
    for line in field_notes(report.fields, cutoff=args.cutoff):
        console.print(line, markup=False, highlight=False)
    for name, lacking in report.filled.items():
        console.print(f"filled: {name} for {lacking:,} structures without it (see {name}_present)")
    for name, loss in report.precision.items():
        console.print(
            f"[yellow]precision:[/yellow] float32 changed {loss.over:,} values of {name} by more than "
            f"{args.tolerance:g} (at most {loss.worst:.3g})"
        )
    for key, count in report.dropped.items():
        if key in report.lacking:
            console.print(
                f"[yellow]left out:[/yellow] {key}, which {report.lacking[key]:,} of {report.structures:,} structures "
                f"lack (--missing drop: every structure is written, none with {key}; --missing fill keeps it)",
                highlight=False,
            )
        else:
            console.print(
                f"[yellow]left out:[/yellow] {key} ({_count(count, 'structure')} have it): {report.dropped_reasons[key]}",
                highlight=False,
            )
    return 0


def cmd_rewrite(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from dali_alchemi.store.write.rewrite import rewrite_store

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                  console=console, disable=args.quiet or not console.is_terminal) as bar:  # fmt: skip
        task = bar.add_task("copying", total=None)

        def progress(phase: str, done: int, total: int) -> None:
            bar.update(task, description="copying" if phase == "copy" else "checking", completed=done, total=total)

        report = rewrite_store(args.src, args.dst, args.layout, compact=args.compact, progress=progress)
    before = "-" if report.bytes_before is None else human_bytes(report.bytes_before)
    kept = f", {report.deleted_kept:,} soft-deleted kept" if report.deleted_kept else ""
    console.print(
        f"rewrote {report.samples:,} samples{kept} from {report.source} to {report.destination} "
        f"({args.layout} layout): {before} -> {human_bytes(report.bytes_after)} on disk, "
        f"compared and verified, in {report.seconds:.1f} s"
    )
    return 0


def _count(n: int, unit: str) -> str:
    return f"{n:,} {unit}{'' if n == 1 else 's'}"


def _raised_in_ase(tb: TracebackType | None) -> bool:
    """Whether the innermost Python frame of a traceback is ASE's: the input could not be read or parsed."""
    module = None
    while tb is not None:
        module, tb = tb.tb_frame.f_globals.get("__name__", ""), tb.tb_next
    return isinstance(module, str) and (module == "ase" or module.startswith("ase."))


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``dali-alchemi`` parser."""
    synth = sub.add_parser("synth", help="write a synthetic store (nvalchemi's benchmark recipe)")
    synth.add_argument("out", help="path of the new store (must not exist)")
    synth.add_argument("--n", type=int, default=1000, help="number of structures (default 1000)")
    synth.add_argument("--seed", type=int, default=42, help="seed for sizes and values (default 42)")
    synth.add_argument("--min-atoms", type=int, default=10)
    synth.add_argument("--max-atoms", type=int, default=100)
    synth.add_argument(
        "--format", choices=("zarr", "extxyz"), default="zarr", help="a store, or an extxyz file (needs ase)"
    )
    synth.add_argument("--no-checksum", action="store_true", help="write no crc32c checksums (default: one per chunk)")
    synth.add_argument(
        "--layout", choices=STORE_LAYOUTS, default="default",
        help="default: arrays that compress little raw (read in place), the others blosc in small chunks; compressed: "
        "blosc-lz4 in 4 MiB chunks everywhere; uncompressed: raw everywhere; inflate: the default with byte-shuffled "
        "LZ4 blocks, which DALIDataLoader(layout='inflate') inflates on the GPU",
    )  # fmt: skip
    synth.add_argument(
        "--codec", choices=CODECS,
        help="one codec for every core array instead of the layout's (lz4: blosc-lz4 with shuffle; none: raw rows)",
    )  # fmt: skip
    synth.add_argument("--chunk-size", type=int, help="rows per chunk of every core array (default: the layout's)")
    synth.add_argument("--shard-size", type=int, help="rows per shard of every core array (default: the layout's)")
    synth.add_argument(
        "--writer", choices=("dali-alchemi", "nvalchemi"), default="dali-alchemi",
        help="write the store with this project's writer or nvalchemi-toolkit's own (one write; needs nvalchemi)",
    )  # fmt: skip
    synth.set_defaults(func=cmd_synth, writes=lambda args: args.out)

    rewrite = sub.add_parser(
        "rewrite", help="copy a store to a new one in another layout (compared with the source and verified)"
    )
    rewrite.add_argument("src", help="path or URL of the store to copy (this project's, nvalchemi's, remote)")
    rewrite.add_argument("dst", help="path of the new store (must not exist)")
    rewrite.add_argument(
        "--layout", choices=STORE_LAYOUTS, default="default",
        help="default: arrays that barely compress raw (read in place), the others compressed in small chunks; "
        "inflate: the same with byte-shuffled LZ4 blocks, inflated on the GPU by DALIDataLoader(layout='inflate')",
    )  # fmt: skip
    rewrite.add_argument("--compact", action="store_true", help="drop soft-deleted samples (default: keep them)")
    rewrite.add_argument("--quiet", action="store_true", help="no progress bar")
    rewrite.set_defaults(func=cmd_rewrite, writes=lambda args: args.dst)

    inspect = sub.add_parser("inspect", help="print a store's counts, arrays, chunks and codecs")
    inspect.add_argument("store", help="path or URL of the store")
    inspect.set_defaults(func=cmd_inspect)

    conv = sub.add_parser(
        "convert", help="convert extxyz files, ASE databases (.db, .aselmdb) or trajectories into a store (needs ase)"
    )
    conv.add_argument(
        "inputs", nargs="+",
        help="files ASE can read (extxyz, .db, fairchem's .aselmdb, .traj, ...), read one after the other; a folder "
        "gives its *.extxyz, *.xyz, *.aselmdb and *.db files in sorted order of their names",
    )  # fmt: skip
    conv.add_argument("out", help="path of the new store")
    conv.add_argument("--cutoff", type=float, help="compute a radius neighbor list (periodic images included)")
    width = conv.add_mutually_exclusive_group()
    width.add_argument(
        "--float32",
        action="store_false",
        dest="float64",
        default=False,
        help="per-atom and per-edge floats and the cell as float32 (the default)",
    )
    width.add_argument("--float64", action="store_true", help="per-atom and per-edge floats and the cell as float64")
    conv.add_argument(
        "--system-float32", action="store_true",
        help="per-structure floats (energies, stress, ...) as float32 too (default: float64)",
    )  # fmt: skip
    conv.add_argument(
        "--missing", choices=("error", "fill", "drop"), default="error",
        help="a field only some structures have: stop (default), fill it (NaN, -1 or False, with a "
        "<name>_present mask), or drop it",
    )  # fmt: skip
    conv.add_argument(
        "--tolerance", type=float, default=1e-4,
        help="report fields that float32 changes by more than this, in their own units (default 1e-4)",
    )  # fmt: skip
    conv.add_argument("--chunk", type=int, default=1000, help="structures converted per step (default 1000)")
    conv.add_argument(
        "--workers", type=int,
        help="convert in N processes of this machine: OUT becomes a multi-store (a folder of part stores and "
        "a manifest) that reads as one store; a rerun of the same command resumes",
    )  # fmt: skip
    conv.add_argument(
        "--scheduler", metavar="ADDRESS",
        help="convert on the Dask cluster of this scheduler (e.g. tcp://host:8786) into a multi-store, as --workers; "
        "OUT must be on a file system every worker writes",
    )  # fmt: skip
    conv.add_argument(
        "--part-size", type=int,
        help="with --workers or --scheduler: the most structures per part (default: two parts per worker, at most "
        "100,000 structures each)",
    )  # fmt: skip
    conv.set_defaults(func=cmd_convert, writes=lambda args: args.out)
