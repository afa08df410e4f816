"""Time and peak memory of building one rank's epoch plan over a large synthetic dataset (no store).

Each case runs in a fresh process and reports the wall time of ``plan.epoch(0)`` (plan construction
included) and its CPU time (what a loaded machine inflates less), then builds it again under
tracemalloc for the peak of numpy's allocations, and the process's peak RSS (the sizes included).
Sizes are synthetic: ``randint(1, 5)`` atoms and twice that in edges per structure, as uint16.

    python scripts/plan_scale.py --n 10_000_000 110_000_000 --plans fixed budget block
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc


def _case(plan_kind: str, n: int, shards: int, shard: int, order: str) -> dict[str, object]:
    import numpy as np

    from dali_alchemi.plan import BlockShufflePlan, BudgetPlan, FixedBatchPlan
    from dali_alchemi.plan.spans import fixed_spans

    rng = np.random.default_rng(0)
    n_atoms = rng.integers(1, 5, size=n, dtype=np.uint16) if plan_kind != "fixed" else None
    n_edges = (2 * n_atoms).astype(np.uint16) if n_atoms is not None else None
    extra = {} if order == "default" else {"permutation": order}
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def build() -> object:
        if plan_kind == "fixed":
            plan = FixedBatchPlan(num_samples=n, batch_size=64, seed=1, shard_id=shard, num_shards=shards, **extra)
        elif plan_kind == "budget":
            plan = BudgetPlan(
                n_atoms=n_atoms, n_edges=n_edges, max_atoms=512, seed=1, shard_id=shard, num_shards=shards, **extra
            )
        else:
            plan = BlockShufflePlan(
                span_bounds=fixed_spans(n, 2048), buffer_spans=64, batch_size=64, seed=1, shard_id=shard,
                num_shards=shards, **extra,
            )  # fmt: skip
        return plan.epoch(0)

    start, cpu_start = time.perf_counter(), time.process_time()
    epoch = build()  # timed without tracemalloc, which slows every allocation
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    del epoch
    tracemalloc.start()
    epoch = build()  # the same build again, its allocations traced
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "plan": plan_kind, "n": n, "permutation": order, "seconds": round(seconds, 2), "cpu_seconds": round(cpu_seconds, 2),
        "traced_peak_mb": round(peak / 2**20, 1),
        "rss_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_before_mb": round(rss_before / 1024, 1),
        "plan_order_mb": round(epoch.order.nbytes / 2**20, 1), "batches": epoch.num_batches,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10_000_000, 110_000_000])
    parser.add_argument("--plans", nargs="+", default=["fixed", "budget", "block"])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--permutation", default="default", help="the plans' permutation= (default: left out)")
    parser.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(_case(args.plans[0], args.n[0], args.shards, args.shard, args.permutation)))
        return
    for n in args.n:
        for kind in args.plans:
            command = [sys.executable, __file__, "--case", "--n", str(n), "--plans", kind, "--shards", str(args.shards)]
            command += ["--shard", str(args.shard), "--permutation", args.permutation]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            print(done.stdout.strip() or done.stderr.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
