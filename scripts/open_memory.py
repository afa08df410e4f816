"""What opening a store and reading a first batch cost one process, and each of several at once.

Each measurement runs in a fresh process (spawned, so nothing is inherited): the time
``AtomicDataZarrReader(store)`` takes, the process's RSS and PSS (proportional set size: pages
shared with other processes count once in all) after the open and after reading one batch of
shuffled structures, and that batch's time. ``--processes P`` opens the store in P processes at
once, as P ranks of one machine sharding a store would, and reports each one's figures once all
of them have read their batch (so that shared pages are counted while all of them map them).

Runs are made one after the other, so the first run of a store is the first open on this
machine (it may build what later opens reuse) and the others are warm.

    PYTHONPATH=. python scripts/open_memory.py STORE [STORE ...] [--runs 3] [--processes 8] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import time
from typing import Any

import numpy as np
import psutil


def _memory() -> dict[str, float]:
    info = psutil.Process().memory_full_info()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux
    return {"rss_mb": info.rss / 2**20, "pss_mb": info.pss / 2**20, "peak_rss_mb": peak}


def _measure(store: str, batch: int, seed: int, barrier: Any, results: Any) -> None:
    from dali_alchemi import AtomicDataZarrReader

    before = _memory()
    start = time.perf_counter()
    reader = AtomicDataZarrReader(store)
    opened = time.perf_counter() - start
    after_open = _memory()
    indices = np.random.default_rng(seed).choice(len(reader), size=min(batch, len(reader)), replace=False)
    start = time.perf_counter()
    reader.read_many(indices)
    first_batch = time.perf_counter() - start
    if barrier is not None:
        barrier.wait()  # every process has read its batch: shared pages are mapped by all of them
    after_batch = _memory()
    if barrier is not None:
        barrier.wait()  # every process has measured before any lets its mappings go
    reader.close()
    results.put(
        {
            "samples": len(reader),
            "open_s": round(opened, 4),
            "first_batch_s": round(first_batch, 4),
            "import_pss_mb": round(before["pss_mb"], 1),
            "open_rss_mb": round(after_open["rss_mb"] - before["rss_mb"], 1),
            "open_pss_mb": round(after_open["pss_mb"] - before["pss_mb"], 1),
            "batch_rss_mb": round(after_batch["rss_mb"], 1),
            "batch_pss_mb": round(after_batch["pss_mb"], 1),
            "peak_rss_mb": round(after_batch["peak_rss_mb"], 1),
        }
    )


def run(store: str, *, processes: int, batch: int) -> list[dict[str, Any]]:
    """One measurement of ``store`` in ``processes`` fresh processes at once; their results."""
    context = mp.get_context("spawn")
    results = context.Queue()
    barrier = context.Barrier(processes) if processes > 1 else None
    workers = [
        context.Process(target=_measure, args=(store, batch, seed, barrier, results)) for seed in range(processes)
    ]
    for worker in workers:
        worker.start()
    out = [results.get(timeout=1800) for _ in workers]
    for worker in workers:
        worker.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stores", nargs="+")
    parser.add_argument("--runs", type=int, default=3, help="measurements of each store, one after the other")
    parser.add_argument("--processes", type=int, default=1, help="processes opening the store at once")
    parser.add_argument("--batch", type=int, default=64, help="structures of the first batch (shuffled)")
    args = parser.parse_args()
    for store in args.stores:
        for attempt in range(args.runs):
            for result in run(store, processes=args.processes, batch=args.batch):
                print(json.dumps({"store": store, "run": attempt, "processes": args.processes, **result}), flush=True)


if __name__ == "__main__":
    main()
