"""Several stores against one: the same structures read as one store, and split in two behind a MultiReader.

Writes a synthetic store of ``--n`` structures and the same structures split in two stores (the first
``--split`` of them, then the rest), then measures side by side, alternating rounds:

1. packed reads of the same windows (those of a shuffled epoch, and of a ``weights=(1, 1)`` mixture)
   through ``AtomicDataZarrReader(whole)`` and ``MultiReader([first, second])`` (structures per CPU
   second of this process, all threads, and the ratios);
2. ``DALIDataLoader`` epochs (CPU, 2 workers, batches of 64) over the whole store and over the two,
   with and without ``weights=``, epochs of the three loaders alternating;
3. planning one epoch of a million structures: ``FixedBatchPlan`` against ``MixturePlan``, and
   ``BudgetPlan`` against a budget ``MixturePlan``.

Usage: ``python scripts/bench_multi.py [--n 20000] [--rounds 5]``; prints one line per figure.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dali_alchemi import (
    AtomicDataZarrReader,
    AtomicDataZarrWriter,
    BudgetPlan,
    FixedBatchPlan,
    MixturePlan,
    MultiReader,
)
from dali_alchemi.bench.synth import synthetic_samples


def _rate(fn: Callable[[], int], clock: Callable[[], float] = time.perf_counter) -> float:
    start = clock()
    n = fn()
    return n / (clock() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--split", type=float, default=0.75)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-multi-"))
    packed = synthetic_samples(args.n, seed=0)
    cut = int(args.n * args.split)
    whole, first, second = root / "whole.zarr", root / "first.zarr", root / "second.zarr"
    AtomicDataZarrWriter(whole).write(packed)
    AtomicDataZarrWriter(first).write(packed.take(np.arange(cut)))
    AtomicDataZarrWriter(second).write(packed.take(np.arange(cut, args.n)))

    # The windows a loader reads (16 batches of 64): a plain shuffle of the two, and a (1, 1) mixture.
    plain = FixedBatchPlan(num_samples=args.n, batch_size=64).epoch(0)
    mixed = MixturePlan(lengths=(cut, args.n - cut), batch_size=64, weights=(1, 1)).epoch(0)
    orders = {
        "shuffled": [plain.window(k, 16).indices for k in range(8)],
        "weights=(1, 1)": [mixed.window(k, 16).indices for k in range(8)],
    }
    rates: dict[str, list[float]] = {}
    with AtomicDataZarrReader(whole) as one, MultiReader([first, second]) as two:
        for windows in orders.values():  # warm the caches alike
            for w in windows[:2]:
                one.read_packed(w), two.read_packed(w)
        for _ in range(args.rounds):
            for order, windows in orders.items():
                for name, reader in (
                    (f"reader, {order}: one store", one),
                    (f"reader, {order}: MultiReader of two", two),
                ):
                    rates.setdefault(name, []).append(
                        _rate(
                            lambda reader=reader, windows=windows: sum(len(reader.read_packed(w)) for w in windows),
                            time.process_time,  # CPU time of every thread: less at the mercy of a busy machine
                        )
                    )

    from dali_alchemi import DALIDataLoader

    loaders = {
        "DALIDataLoader: one store": lambda: DALIDataLoader(whole, batch_size=64, device="cpu", seed=1),
        "DALIDataLoader: two stores": lambda: DALIDataLoader([first, second], batch_size=64, device="cpu", seed=1),
        "DALIDataLoader: two stores, weights=(1, 1)": lambda: DALIDataLoader(
            [first, second], batch_size=64, device="cpu", seed=1, weights=(1, 1)
        ),
    }
    opened = {name: make() for name, make in loaders.items()}
    try:
        for name, loader in opened.items():
            next(iter(loader))  # start every loader's workers before timing
            rates[name] = []
        for epoch in range(1, args.rounds + 1):  # alternate, so the machine's noise falls on all alike
            for name, loader in opened.items():
                loader.set_epoch(epoch)
                rates[name].append(_rate(lambda loader=loader: sum(b.num_graphs for b in loader)))
    finally:
        for loader in opened.values():
            loader.close()

    for name, values in rates.items():
        unit = "structures per CPU s" if name.startswith("reader") else "structures/s"
        print(f"{name:52s} {statistics.median(values):>10,.0f} {unit} (median of {len(values)})")
    for order in orders:
        ratio = statistics.median(rates[f"reader, {order}: MultiReader of two"]) / statistics.median(
            rates[f"reader, {order}: one store"]
        )
        print(f"{f'reader, {order}: MultiReader / one store':52s} {ratio:>10.2f}")

    n = 1_000_000
    sizes = np.random.default_rng(0).integers(10, 100, size=n)
    plans = {
        "plan: FixedBatchPlan, 1M structures": FixedBatchPlan(num_samples=n, batch_size=64),
        "plan: MixturePlan (3:1), 1M structures": MixturePlan(
            lengths=(750_000, 250_000), batch_size=64, weights=(3, 1)
        ),
        "plan: BudgetPlan, 1M structures": BudgetPlan(n_atoms=sizes, n_edges=sizes * 4, max_atoms=4096),
        "plan: MixturePlan budget (3:1), 1M structures": MixturePlan(
            lengths=(750_000, 250_000), weights=(3, 1), n_atoms=sizes, n_edges=sizes * 4, max_atoms=4096
        ),
    }
    for name, plan in plans.items():
        times = []
        for epoch in range(3):
            start = time.perf_counter()
            plan.epoch(epoch)
            times.append(time.perf_counter() - start)
        print(f"{name:52s} {1000 * statistics.median(times):>10.0f} ms per epoch (median of 3)")


if __name__ == "__main__":
    main()
