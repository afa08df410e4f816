"""Peak memory (PSS of the process tree) of packed reads of shuffled windows, with and without the working set.

    python scripts/window_memory.py STORE --cache-mb 16 [--unbounded]

Reads three windows of 1,024 structures of a global permutation through one reader. ``--unbounded``
decodes each read's chunks as one group (as before reads were bounded by a working set); run each
setting in a fresh process, so one does not inherit the other's freed memory.
"""

from __future__ import annotations

import argparse

import numpy as np

from dali_alchemi import AtomicDataZarrReader
from dali_alchemi.bench.memory import TreeMemorySampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--cache-mb", type=float, default=16)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--unbounded", action="store_true", help="one group per read (no working-set bound)")
    args = parser.parse_args()
    with AtomicDataZarrReader(args.store, cache_bytes=int(args.cache_mb * 2**20)) as reader:
        if args.unbounded:
            reader._engine.working_set_bytes = 1 << 62
        order = np.random.default_rng(0).permutation(len(reader))
        with TreeMemorySampler(interval=0.05) as memory:
            for w in range(args.windows):
                reader.read_packed(order[w * 1024 : (w + 1) * 1024])
        blocks = reader.stats().blocks_decoded / args.windows
    label = "one group per read" if args.unbounded else f"working set {reader._engine.working_set_bytes >> 20} MiB"
    print(
        f"{label}: PSS {memory.start_mb:.0f} MB at start, {memory.peak_mb:.0f} MB peak; {blocks:.0f} chunks decoded per window"
    )


if __name__ == "__main__":
    main()
