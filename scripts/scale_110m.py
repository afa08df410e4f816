"""The foundation-model scale run: write a store of N small structures, then open, plan and read it as 8 ranks would.

    python scripts/scale_110m.py write STORE --n 110000000      # synth, timed, peak RSS of the writer
    python scripts/scale_110m.py read STORE --ranks 8 --batches 10000

``write`` runs ``dali-alchemi synth STORE --n N --min-atoms 1 --max-atoms 4`` in a child process and samples
its memory. ``read`` first measures one rank alone in a fresh process (open, the global-shuffle plan of rank
0 of ``--ranks``, the first batch from building the loader), then starts ``--ranks`` processes on this
machine, each opening the store, building its own rank's loader and reading its share of ``--batches``
shuffled batches; it reports each rank's peak PSS (its process tree: DALI's workers included) and the
structures per second of all ranks together. Every figure is printed as one table row and, with
``--json``, written to a file.

``read --cold`` first drops the store's pages from this machine's page cache (``posix_fadvise``
``DONTNEED`` on every file: no root needed; a virtual machine's host may still cache them) and removes
the store's shared pointer copy, so the lone rank's open builds the copy from the disk and its first
batch reads chunks nobody has read since.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

from dali_alchemi import DALIDataLoader
from dali_alchemi.bench.memory import MB, TreeMemorySampler, tree_pss

BATCH_SIZE = 64
"""Structures per batch in every read of the run."""


def _peak_rss_of(cmd: list[str]) -> tuple[float, float, int]:
    """Run ``cmd``; return its wall seconds, the peak RSS of its process tree in bytes, and its status."""
    import psutil

    start = time.perf_counter()
    child = psutil.Popen(cmd)
    peak = 0
    while child.poll() is None:
        try:
            procs = [child, *child.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in procs if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.2)
    return time.perf_counter() - start, float(peak), int(child.returncode)


def cmd_write(args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, "-m", "dali_alchemi.cli", "synth", args.store, "--n", str(args.n),
           "--min-atoms", str(args.min_atoms), "--max-atoms", str(args.max_atoms)]  # fmt: skip
    wall, peak, status = _peak_rss_of(cmd)
    if status != 0:
        raise SystemExit(f"synth exited with status {status}")
    disk = sum(f.stat().st_size for f in Path(args.store).rglob("*") if f.is_file())
    return {
        "structures": args.n,
        "write_s": round(wall, 1),
        "structures_per_minute": round(args.n / wall * 60),
        "writer_peak_rss_mb": round(peak / MB),
        "disk_gb": round(disk / 2**30, 2),
    }


def _loader(store: str, rank: int, ranks: int, cache_mb: int, workers: int) -> DALIDataLoader:
    return DALIDataLoader(
        store, batch_size=BATCH_SIZE, shuffle=True, seed=0, shard_id=rank, num_shards=ranks, device="cpu", num_workers=workers,
        cache_bytes=cache_mb * MB,
    )  # fmt: skip


def _one_rank_alone(store: str, ranks: int, cache_mb: int, workers: int, queue: mp.Queue) -> None:
    """Open, plan and the first batch of rank 0, each timed, in a process of its own."""
    from dali_alchemi import AtomicDataZarrReader
    from dali_alchemi.plan import PlanArguments, build_plan

    start = time.perf_counter()
    reader = AtomicDataZarrReader(store, cache_bytes=cache_mb * MB)
    n = len(reader)
    opened = time.perf_counter() - start
    open_pss = tree_pss()[0]
    start = time.perf_counter()
    plan = build_plan(None, PlanArguments(batch_size=BATCH_SIZE, shuffle=True, seed=0, shard_id=0, num_shards=ranks),
                      n, lambda: reader.sample_sizes(np.arange(n)))  # fmt: skip
    epoch = plan.epoch(0)
    planned = time.perf_counter() - start
    reader.close()
    start = time.perf_counter()
    loader = _loader(store, 0, ranks, cache_mb, workers)
    batch = next(iter(loader))
    first = time.perf_counter() - start
    assert batch.num_graphs == BATCH_SIZE
    pss = tree_pss()[0]
    loader.close()
    queue.put({
        "structures": n, "open_s": round(opened, 3), "open_pss_mb": round(open_pss / MB),
        "plan_s": round(planned, 2), "plan_batches": epoch.num_batches, "first_batch_s": round(first, 2),
        "pss_after_first_batch_mb": round(pss / MB),
    })  # fmt: skip


def _rank(
    store: str, rank: int, ranks: int, batches: int, cache_mb: int, workers: int, start_at: float, queue: mp.Queue
) -> None:
    """One rank: its loader, ``batches`` shuffled batches read, its tree's peak PSS sampled throughout."""
    with TreeMemorySampler(interval=0.25) as memory:
        loader = _loader(store, rank, ranks, cache_mb, workers)
        while time.time() < start_at:  # every rank reads at once, after all have built their loaders
            time.sleep(0.01)
        begin = time.perf_counter()
        structures = 0
        for i, batch in enumerate(loader):
            structures += batch.num_graphs
            if i + 1 == batches:
                break
        seconds = time.perf_counter() - begin
        loader.close()
    queue.put({"rank": rank, "structures": structures, "read_s": seconds, "peak_pss_mb": memory.peak_bytes / MB})


def _make_cold(store: str) -> int:
    """Drop ``store``'s pages from the page cache and its shared pointer copy; the bytes of its files."""
    from dali_alchemi.store.read.shared_pointers import default_folder, store_id

    total = 0
    for path in Path(store).rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    folder = default_folder()
    if folder is not None and folder.is_dir():
        for copy in folder.glob(f"{store_id(Path(store))}-*"):
            copy.unlink(missing_ok=True)
    return total


def cmd_read(args: argparse.Namespace) -> dict[str, float]:
    if args.cold:
        print(f"dropped {_make_cold(args.store) / 2**30:.2f} GiB of the store from the page cache, and its pointer copy")
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    alone = ctx.Process(target=_one_rank_alone, args=(args.store, args.ranks, args.cache_mb, args.workers, queue))
    alone.start()
    result = dict(queue.get())
    alone.join()
    per_rank = -(-args.batches // args.ranks)
    start_at = time.time() + args.build_wait_s
    procs = [
        ctx.Process(
            target=_rank, args=(args.store, r, args.ranks, per_rank, args.cache_mb, args.workers, start_at, queue)
        )
        for r in range(args.ranks)
    ]
    for p in procs:
        p.start()
    ranks = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    slowest = max(r["read_s"] for r in ranks)
    result.update({
        "cold": bool(args.cold),
        "ranks": args.ranks,
        "dali_workers_per_rank": args.workers,
        "batches_read": sum(-(-r["structures"] // BATCH_SIZE) for r in ranks),
        "shuffled_structures_per_s_all_ranks": round(sum(r["structures"] for r in ranks) / slowest),
        "rank_peak_pss_mb_max": round(max(r["peak_pss_mb"] for r in ranks)),
        "rank_peak_pss_mb_mean": round(sum(r["peak_pss_mb"] for r in ranks) / len(ranks)),
    })  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="synth the store, timed, with the writer's peak RSS")
    write.add_argument("store")
    write.add_argument("--n", type=int, default=110_000_000)
    write.add_argument("--min-atoms", type=int, default=1)
    write.add_argument("--max-atoms", type=int, default=4)
    read = sub.add_parser("read", help="open, plan, first batch, then every rank reading shuffled batches")
    read.add_argument("store")
    read.add_argument("--ranks", type=int, default=8)
    read.add_argument("--batches", type=int, default=10_000, help="shuffled batches over all ranks together")
    read.add_argument("--cache-mb", type=int, default=64, help="each rank's decoded-chunk cache")
    read.add_argument("--workers", type=int, default=2, help="DALI worker processes per rank (the loader's default: 2)")
    read.add_argument("--build-wait-s", type=float, default=60.0, help="seconds the ranks get to build loaders")
    read.add_argument("--cold", action="store_true", help="drop the store's pages and pointer copy first")
    for p in (write, read):
        p.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = cmd_write(args) if args.command == "write" else cmd_read(args)
    for key, value in result.items():
        print(f"{key:40s} {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
