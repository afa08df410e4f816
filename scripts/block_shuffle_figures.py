"""The block shuffle's figures: shuffle quality, batch KS on an energy-sorted order, and chunk decodes.

    python scripts/block_shuffle_figures.py STORE [--cache-mb 16] [--max-windows 40] [--buffer-spans K]
        [--dali-batches B]

For the sequential, block and global orders of ``STORE`` it prints: the plan (spans, buffer size),
:func:`~dali_alchemi.plan.shuffle_quality` and :func:`~dali_alchemi.plan.gap_quality` of epoch 0,
:func:`~dali_alchemi.plan.batch_ks` of the store's energies as if the store were sorted by energy (the sorted energies assigned to structures
0, 1, 2, ...; the spans and sizes stay the store's), and what reading the epoch window by window
(16 batches of 64, one packed read each) through a reader with that cache costs: chunk payloads
fetched per 1,000 structures and structures per second. Reads stop after ``--max-windows`` windows
(0: plan only). ``--dali-batches B`` also times :class:`~dali_alchemi.DALIDataLoader` (default workers,
CPU, the same cache per worker) over its first ``B`` batches, start-up included.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dali_alchemi import AtomicDataZarrReader, BlockShuffle
from dali_alchemi.plan import PlanArguments, batch_ks, build_plan, gap_quality, shuffle_quality, store_chunking

BATCH, BATCHES_PER_WINDOW = 64, 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store")
    parser.add_argument("--cache-mb", type=float, default=16.0)
    parser.add_argument("--max-windows", type=int, default=40)
    parser.add_argument("--buffer-spans", type=int, help="spans per buffer (default: from the cache)")
    parser.add_argument("--dali-batches", type=int, default=0, help="also time DALIDataLoader over this many batches")
    args = parser.parse_args()
    cache = int(args.cache_mb * 2**20)
    with AtomicDataZarrReader(args.store, fields=("energy",)) as meta:
        energy = meta.read_packed(np.arange(len(meta))).fields["energy"].reshape(-1)
    sorted_energy = np.sort(energy)
    print(f"{args.store}: {len(energy):,} structures, cache {args.cache_mb:g} MiB, batch {BATCH}")
    print("| order | spans | structures per buffer | plan ms | shuffle_quality | gap_quality |"
          " batch KS (sorted energy) | chunks per 1k structures | structures/s | DALI loader structures/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    block = BlockShuffle(buffer_spans=args.buffer_spans)
    for name, shuffle in (("sequential", False), ("block", block), ("global", True)):
        reader = AtomicDataZarrReader(args.store, cache_bytes=cache, num_threads=2)
        fields = tuple(reader.field_specs)
        plan = build_plan(
            None, PlanArguments(batch_size=BATCH, shuffle=shuffle, shard_id=0, num_shards=1), len(reader),
            lambda r=reader: r.sample_sizes(np.arange(len(r))), lambda r=reader, f=fields: store_chunking(r, f),
        )  # fmt: skip
        started = time.perf_counter()
        epoch = plan.epoch(0)
        plan_ms = (time.perf_counter() - started) * 1e3
        quality, gaps = shuffle_quality(epoch.order), gap_quality(epoch.order)
        ks = batch_ks(sorted_energy, epoch.order, epoch.batch_ptr)
        spans = getattr(plan, "num_spans", None)
        per_buffer = "-" if spans is None else f"{len(reader) / spans * plan.buffer_spans:,.0f}"  # type: ignore[attr-defined]
        windows = min(epoch.num_windows(BATCHES_PER_WINDOW), args.max_windows)
        structures = 0
        started = time.perf_counter()
        for w in range(windows):
            structures += reader.read_packed(epoch.window(w, BATCHES_PER_WINDOW).indices).n_atoms.size
        elapsed = time.perf_counter() - started
        chunks = reader.stats().chunks_fetched
        reader.close()
        cost = f"{chunks / structures * 1e3:.1f} | {structures / elapsed:,.0f}" if structures else "- | -"
        dali = _dali_rate(args.store, shuffle, cache, args.dali_batches) if args.dali_batches else "-"
        print(
            f"| {name} | {spans or '-'} | {per_buffer} | {plan_ms:.0f} | {quality:.3f} | {gaps:.3f} | {ks:.3f} | "
            f"{cost} | {dali} |"
        )


def _dali_rate(store: str, shuffle: object, cache: int, batches: int) -> str:
    """Structures per second of the DALI loader (default workers, CPU) over its first ``batches`` batches."""
    from dali_alchemi import DALIDataLoader

    with DALIDataLoader(store, batch_size=BATCH, shuffle=shuffle, cache_bytes=cache, device="cpu") as loader:  # type: ignore[arg-type]
        structures, started = 0, time.perf_counter()
        for k, batch in enumerate(loader, start=1):
            structures += batch.num_graphs
            if k == batches:
                break
        return f"{structures / (time.perf_counter() - started):,.0f}"


if __name__ == "__main__":
    main()
