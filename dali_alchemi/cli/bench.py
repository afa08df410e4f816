"""Commands that measure: the loader benchmark, host-to-device copies, planning and augmentation cost."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dali_alchemi.bench.names import CODECS, DEFAULT_LOADERS, LOADER_HELP, STORE_LAYOUTS
from dali_alchemi.cli.console import CountColumn, at_least, cuda_device, fmt, make_table, parse_device, print_table

if TYPE_CHECKING:
    import torch
    from rich.console import Console
    from rich.table import Table

    from dali_alchemi.bench.runner import BenchConfig, BenchRun

__all__ = ["bench_legend", "cmd_augment_cost", "cmd_bench", "cmd_h2d", "cmd_plan_cost", "register"]

LEGEND = (
    "structures/s: after the first batch, over all epochs; warm: the epochs after the",
    "  first only. On a store of a few windows (16 batches each), what a loader read",
    "  ahead while its first batch came inflates structures/s: trust warm there.",
    "x plain: structures/s over the best plain torch DataLoader (torch-*) of the run.",
    "first batch s, total s: opening the loader (imported) to its first, last batch.",
    "peak PSS MB: peak memory of the whole process tree, workers included.",
    "quality: how well the order mixes the store: 0 in sequence, 1 a full shuffle.",
    "batch KS: batch energies' distance from the store's: 0 best, ~1/sqrt(batch) by",
    "  chance. packed, packed-sequential: the reader alone, no loader; the second in",
    "  store order through a 64 MiB cache (a store bigger than the cache).",
    "limit: the store's codecs on one core (crc32c + decode, bytes in memory);",
    "  page-cache: reading the same bytes; of limit: structures/s over limit's.",
)
"""What the bench table's columns mean, printed under it (80 columns at most; docs/benchmarks.md has more)."""
LEGEND_DECODES = "decodes/chunk: how often the reader decoded each chunk per pass over the store."
LEGEND_STEPS = "wait s: time the loop waited for data; epoch / steps: time over the steps' time."
LEGEND_BUDGET = "batches, atoms/batch: per epoch and their mean; fill: atoms/batch / max_atoms."


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    import tempfile

    from dali_alchemi.bench.loaders import validate_names

    loaders = [name.strip() for name in args.loaders.split(",") if name.strip()]
    validate_names(loaders)
    device = parse_device(args.device)
    config = _bench_config(args, loaders, device)
    with tempfile.TemporaryDirectory(prefix="dali-alchemi-bench-") as scratch:
        store, store_info = _bench_store(args, Path(scratch), console)
        run = _run_with_progress(args, store, store_info, config, console)
    table = _results_table(args, run, device)
    print_table(console, table, keys=2)  # each part names the loader and the order
    decodes = any(r.decodes_per_chunk is not None for r in run.records)
    budget = args.max_atoms is not None or args.max_edges is not None
    for line in bench_legend(steps=bool(args.step_ms), budget=budget, decodes=decodes):
        console.print(line, markup=False, highlight=False, style="dim")
    console.print(f"opening the store (with its open-time checks) took {run.meta.store['open_s'] * 1000:.1f} ms")
    console.print(
        f"peak PSS: the whole process tree (workers included, shared pages once); "
        f"{run.meta.machine['pss_after_import_mb']:.0f} MB after imports"
    )
    _write_outputs(args, run, str(table.title or ""), console)
    return 0


def _bench_config(args: argparse.Namespace, loaders: list[str], device: torch.device) -> BenchConfig:
    """The run's settings, from the command line."""
    from dali_alchemi.bench.runner import BenchConfig
    from dali_alchemi.config import DEFAULT_BATCHES_PER_WINDOW  # here: the parser must stay light to build

    window = DEFAULT_BATCHES_PER_WINDOW if args.batches_per_window is None else args.batches_per_window
    return BenchConfig(
        loaders=tuple(loaders), orders=tuple(o.strip() for o in args.order.split(",")), batch_size=args.batch_size,
        epochs=args.epochs, rounds=args.rounds, step_ms=args.step_ms, device=str(device),
        batches_per_window=window, torch_workers=args.torch_workers,
        cache_bytes=None if args.cache_mb is None else int(args.cache_mb * 2**20),
        max_atoms=args.max_atoms, max_edges=args.max_edges, max_batches=args.max_batches,
    )  # fmt: skip


def _bench_store(args: argparse.Namespace, scratch: Path, console: Console) -> tuple[str, dict[str, Any]]:
    """The store to measure and what the record says of it: the one given, else a synthetic one in ``scratch``."""
    if args.store:
        return args.store, {"path": args.store}
    from dali_alchemi.bench.synth import synthetic_config, write_synthetic_store

    store = str(scratch / "synthetic.zarr")
    console.print(f"writing a synthetic store of {args.n} structures (seed {args.seed}) ...")
    write_config = synthetic_config(
        args.codec, args.chunk_size, args.shard_size, checksum=not args.no_checksum, layout=args.layout
    )
    write_synthetic_store(store, args.n, seed=args.seed, config=write_config)
    return store, {"synthetic": True, "structures": args.n, "seed": args.seed, "write_config": write_config.to_dict()}


def _run_with_progress(
    args: argparse.Namespace, store: str, store_info: dict[str, Any], config: BenchConfig, console: Console
) -> BenchRun:
    """Run the benchmark under a progress bar, reading the store directly or served over loopback HTTP."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from dali_alchemi.bench.runner import run_bench

    with Progress(TextColumn("{task.description}"), BarColumn(), CountColumn(),
                  TimeElapsedColumn(), console=console, disable=not console.is_terminal) as bar:  # fmt: skip
        task = bar.add_task("starting", total=None)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total)

        if args.http_latency_ms is None:
            return run_bench(store, config, store_info=store_info, progress=progress)
        from dali_alchemi.bench.http_server import StoreServer

        local = Path(store)
        with StoreServer(local.parent, latency_s=args.http_latency_ms / 1000) as server:
            url = server.url + local.name
            store_info = {**store_info, "served_over": "http on loopback", "latency_ms": args.http_latency_ms}
            console.print(f"serving {local} at {url} with {args.http_latency_ms} ms per request")
            return run_bench(url, config, store_info=store_info, progress=progress)


def _results_table(args: argparse.Namespace, run: BenchRun, device: torch.device) -> Table:
    """One row per loader and order; step, batch-shape and fill columns only where the run has them."""
    steps = ["wait s", "epoch / steps"] if args.step_ms else []
    budget = args.max_atoms is not None or args.max_edges is not None
    shape = ["batches", "atoms/batch", *(["fill"] if args.max_atoms else [])] if budget else []
    sizing = f"max_atoms {args.max_atoms}, max_edges {args.max_edges}" if budget else f"batch {args.batch_size}"
    decodes = ["decodes/chunk"] if any(r.decodes_per_chunk is not None for r in run.records) else []
    table = make_table(
        "loader", "order", "structures/s", "warm structures/s", "atoms/s", "x plain", "of limit", "first batch s", "total s", "peak PSS MB", "quality", "batch KS",
        *steps, *shape, *decodes, title=f"{_store_size(run)}{sizing}, {device}, {_count(args.epochs, 'epoch')}, {_rounds(args.rounds)}",
    )  # fmt: skip
    for r in run.records:
        if r.note:
            table.add_row(r.loader, r.order, r.note, *[""] * (9 + len(steps) + len(shape) + len(decodes)))
            continue
        shape_cells = [fmt(r.batches_per_epoch, ",.0f"), fmt(r.atoms_per_batch, ",.0f")]
        shape_cells += [fmt(r.fill_ratio, ".3f")] if args.max_atoms else []
        table.add_row(
            r.loader, r.order, fmt(r.samples_per_s, ",.0f"), fmt(r.warm_samples_per_s, ",.0f"),
            fmt(r.atoms_per_s, ",.0f"), fmt(r.ratio_vs_plain, ".2f"), fmt(r.share_of_limit, ".1%"),
            fmt(r.first_batch_s, ".2f"),
            fmt(r.total_s, ".2f"), fmt(r.peak_pss_mb, ".0f"), fmt(r.shuffle_quality, ".3f"),
            fmt(r.batch_energy_ks, ".3f"), *([fmt(r.wait_s, ".2f"), fmt(r.epoch_vs_steps, ".3f")] if steps else []),
            *(shape_cells if shape else []), *([fmt(r.decodes_per_chunk, ".2f")] if decodes else []),
        )  # fmt: skip
    return table


def bench_legend(*, steps: bool = False, budget: bool = False, decodes: bool = False) -> list[str]:
    """The lines printed under the bench table: every column it shows, briefly (each at most 80 characters)."""
    extra = [*([LEGEND_STEPS] if steps else []), *([LEGEND_BUDGET] if budget else []), *([LEGEND_DECODES] if decodes else [])]
    return [*LEGEND, *extra]


def _write_outputs(args: argparse.Namespace, run: BenchRun, title: str, console: Console) -> None:
    """The run as JSON (``--json``) and as a bar chart (``--plot``), where asked for."""
    if args.json:
        import json

        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(run.to_dict(), indent=2))
        console.print(f"wrote {out}")
    if args.plot:
        from dali_alchemi.bench.plot import plot_records

        console.print(f"wrote {plot_records(run.records, args.plot, title=title)}")


def cmd_h2d(args: argparse.Namespace, console: Console) -> int:
    import json
    import tempfile

    from dali_alchemi.bench.h2d import measure_h2d
    from dali_alchemi.bench.synth import write_synthetic_store

    cuda_device(args.device)  # before the synthetic store is written, which takes a while
    with tempfile.TemporaryDirectory(prefix="dali-alchemi-h2d-") as scratch:
        store = args.store or str(Path(scratch) / "synthetic.zarr")
        if not args.store:
            write_synthetic_store(store, args.n, seed=42)
        results = [
            measure_h2d(store, batch_size=args.batch_size, epochs=args.epochs, device=args.device, layout=layout)
            for layout in args.layouts.split(",")
        ]
    table = make_table(
        "GPU", "layout", "structures/s", "atoms/s", "loader H2D GB/s", "pinned copy GB/s", "first batch s"
    )
    for r in results:
        table.add_row(
            r.device, r.layout, f"{r.samples_per_s:,.0f}", f"{r.atoms_per_s:,.0f}", f"{r.loader_gb_per_s:.2f}",
            f"{r.pinned_copy_gb_per_s:.2f}", f"{r.first_batch_s:.2f}",
        )  # fmt: skip
    print_table(console, table)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps([r.to_dict() for r in results], indent=2))
    return 0


def cmd_plan_cost(args: argparse.Namespace, console: Console) -> int:
    import time

    import numpy as np

    from dali_alchemi.plan import BudgetPlan, FixedBatchPlan, Plan

    rng = np.random.default_rng(args.seed)  # the synthetic recipe's sizes: 10-100 atoms, 1-4x as many edges
    n_atoms = rng.integers(10, 101, size=args.n)
    n_edges = rng.integers(1, 4 * n_atoms + 1)
    plans: dict[str, Callable[[], Plan]] = {
        f"budget max_atoms={args.max_atoms}": lambda: BudgetPlan(
            n_atoms=n_atoms, n_edges=n_edges, max_atoms=args.max_atoms, num_shards=args.shards
        ),
        f"fixed batch_size={args.batch_size}": lambda: FixedBatchPlan(
            num_samples=args.n, batch_size=args.batch_size, num_shards=args.shards
        ),
    }
    table = make_table(
        "plan", "build s", "epoch s", "batches", "fill",
        title=f"{args.n:,} structures, {args.shards} shard(s), {_rounds(args.repeats, 'repeat')}",
    )  # fmt: skip
    for name, make in plans.items():
        builds, epochs = [], []
        for repeat in range(args.repeats):
            started = time.perf_counter()
            plan = make()
            built = time.perf_counter()
            epoch = plan.epoch(repeat)
            epochs.append(time.perf_counter() - built)
            builds.append(built - started)
        fill = int(n_atoms[epoch.order].sum()) / (epoch.num_batches * args.max_atoms) if "budget" in name else None
        table.add_row(
            name, f"{np.median(builds):.3f}", f"{np.median(epochs):.3f}", f"{epoch.num_batches:,}", fmt(fill, ".3f")
        )
    print_table(console, table)
    return 0


def cmd_augment_cost(args: argparse.Namespace, console: Console) -> int:
    import tempfile
    import time

    import torch

    from dali_alchemi.augment import Augmentation, PositionNoise, RandomRotation, RandomTranslation, apply_augmentations
    from dali_alchemi.batch import Batch
    from dali_alchemi.bench.synth import write_synthetic_store
    from dali_alchemi.store.read.reader import AtomicDataZarrReader

    device = parse_device(args.device)
    with tempfile.TemporaryDirectory(prefix="dali-alchemi-augment-") as scratch:
        store = write_synthetic_store(Path(scratch) / "s.zarr", args.batch_size * 8, seed=1)
        with AtomicDataZarrReader(store) as reader:
            batches = [Batch.from_packed(reader.read_packed(range(k, k + args.batch_size)), device=device)
                       for k in range(0, args.batch_size * 8, args.batch_size)]  # fmt: skip
    table = make_table(
        "augmentation", "ms per batch", title=f"batch {args.batch_size}, {device}, {_rounds(args.repeats, 'repeat')}"
    )
    pipelines: dict[str, list[Augmentation]] = {
        "rotation": [RandomRotation()], "position noise": [PositionNoise(0.01)], "translation": [RandomTranslation()],
        "all three": [RandomRotation(), PositionNoise(0.01), RandomTranslation()],
    }  # fmt: skip
    records = []
    for name, pipeline in pipelines.items():
        times = []
        for repeat in range(args.repeats):
            for k, batch in enumerate(batches):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                started = time.perf_counter()
                apply_augmentations(batch, pipeline, seed=0, epoch=repeat, batch_index=k)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - started)
        median_ms = sorted(times)[len(times) // 2] * 1000
        table.add_row(name, f"{median_ms:.3f}")
        records.append({"augmentation": name, "ms_per_batch": median_ms, "device": str(device),
                        "batch_size": args.batch_size, "repeats": args.repeats})  # fmt: skip
    print_table(console, table)
    if args.json:
        import json

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(records, indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``dali-alchemi`` parser."""
    bench = sub.add_parser("bench", help="compare loaders side by side on a store (a synthetic one by default)")
    bench.add_argument(
        "store", nargs="?", help="path or URL of a store; omitted: a synthetic store in a temporary folder"
    )
    bench.add_argument("--n", type=int, default=20000, help="structures in the synthetic store (default 20000)")
    bench.add_argument("--seed", type=int, default=42, help="seed of the synthetic store")
    bench.add_argument("--loaders", default=",".join(DEFAULT_LOADERS), help=f"comma-separated: {LOADER_HELP}")
    bench.add_argument(
        "--order",
        default="shuffle",
        help="comma-separated: shuffle (global permutation), block (chunk-aware block shuffle), sequential",
    )
    bench.add_argument("--batch-size", type=int, default=64)
    bench.add_argument(
        "--batches-per-window",
        type=int,
        default=None,
        help="batches per packed read (nvalchemi: prefetch_factor); default: the loaders' default",
    )
    bench.add_argument("--epochs", type=int, default=2, help="epochs per measurement (default 2)")
    bench.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the report gives medians")
    bench.add_argument("--step-ms", type=float, default=0.0, help="simulated training step after each batch")
    bench.add_argument("--device", default="auto", help="auto, cpu or cuda")
    bench.add_argument("--torch-workers", type=int, default=2, help="workers of a torch loader named without -wN")
    bench.add_argument("--cache-mb", type=float, help="decoded-chunk cache per reader in MiB (default 1024)")
    bench.add_argument(
        "--max-atoms", type=int, help="batch by atoms: at most this many per batch (--batch-size is then ignored)"
    )
    bench.add_argument("--max-edges", type=int, help="batch by edges: at most this many per batch")
    bench.add_argument(
        "--max-batches", type=int,
        help="measure only the first N batches of each epoch (packed, decode and the other reads without a loader: "
        "the windows holding them); for large stores",
    )  # fmt: skip
    bench.add_argument(
        "--layout", choices=STORE_LAYOUTS, default="default", help="layout of the synthetic store (default: default)"
    )
    bench.add_argument(
        "--codec", choices=CODECS, help="one codec for every core array of the synthetic store instead of the layout's"
    )
    bench.add_argument("--chunk-size", type=int, help="rows per chunk of the synthetic store's core arrays")
    bench.add_argument("--shard-size", type=int, help="rows per shard of the synthetic store's core arrays")
    bench.add_argument(
        "--no-checksum", action="store_true", help="write the synthetic store without crc32c checksums (default: with)"
    )
    bench.add_argument(
        "--http-latency-ms", type=float,
        help="serve the (local) store over HTTP on loopback with this latency per request and read it from there",
    )  # fmt: skip
    bench.add_argument("--json", help="write the records to this JSON file")
    bench.add_argument("--plot", help="write a PNG bar chart to this file")
    bench.set_defaults(func=cmd_bench)

    h2d = sub.add_parser("h2d", help="GPU benchmark: the DALI loader on CUDA against a plain pinned copy")
    h2d.add_argument("store", nargs="?", help="path or URL of a store; omitted: a synthetic store")
    h2d.add_argument("--n", type=int, default=20000)
    h2d.add_argument("--batch-size", type=int, default=64)
    h2d.add_argument("--epochs", type=int, default=2)
    h2d.add_argument("--device", default="cuda")
    h2d.add_argument("--layouts", default="window,blob", help="DALI layouts to compare (comma-separated)")
    h2d.add_argument("--json", help="write the result to this JSON file")
    h2d.set_defaults(func=cmd_h2d)

    cost = sub.add_parser("plan-cost", help="time planning an epoch (fixed and atom-budget batches)")
    cost.add_argument("--n", type=at_least(1), default=1_000_000, help="structures (default 1,000,000)")
    cost.add_argument("--max-atoms", type=int, default=4096)
    cost.add_argument("--batch-size", type=int, default=64)
    cost.add_argument("--shards", type=int, default=1)
    cost.add_argument("--repeats", type=at_least(1), default=3)
    cost.add_argument("--seed", type=int, default=0)
    cost.set_defaults(func=cmd_plan_cost)

    aug = sub.add_parser("augment-cost", help="time the augmentations per batch")
    aug.add_argument("--batch-size", type=at_least(1), default=64)
    aug.add_argument("--device", default="auto")
    aug.add_argument("--repeats", type=at_least(1), default=20)
    aug.add_argument("--json", help="write the medians to this JSON file")
    aug.set_defaults(func=cmd_augment_cost)


def _store_size(run: BenchRun) -> str:
    """The store's size as the title starts with it: ``20,000 structures (1,101,243 atoms), ``."""
    store = run.meta.store
    if "structures" not in store or "atoms" not in store:
        return ""
    return f"{_count(store['structures'], 'structure')} ({store['atoms']:,} atoms), "


def _count(n: int, unit: str) -> str:
    return f"{n:,} {unit}{'' if n == 1 else 's'}"


def _rounds(n: int, unit: str = "round") -> str:
    """How a figure was summarised: ``1 round`` is the one measurement, more are their median."""
    return _count(n, unit) if n == 1 else f"median of {_count(n, unit)}"
