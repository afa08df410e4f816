#!/usr/bin/env python3
"""Time ``repair`` on a store grown the way nvalchemi 0.2.0's benchmark recipe grows one.

Writes ``--n`` synthetic structures (nvalchemi's recipe: 10-100 atoms, 1-4x atoms random edges), then
gives ``neighbor_list`` exactly the values nvalchemi's ``append`` leaves when the store is written as
one ``write`` of ``--batch`` structures followed by appends of ``--batch`` (each appended structure's
indices relative to the first atom of its append call). It then times a dry run, an in-place repair
and a repaired copy (``out=``), and checks every repaired structure against the true neighbor list.

    python scripts/repair_cost.py --n 20000 --batch 2000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, repair_store
from dali_alchemi.bench.synth import write_synthetic_store
from dali_alchemi.store.check.repair_plan import KINDS


def as_appended(path: Path, batch: int) -> int:
    """Store neighbor lists as nvalchemi's append would for one write of ``batch`` then appends of ``batch``."""
    root = zarr.open_group(path, mode="r+")
    a_ptr, e_ptr = root["meta/atoms_ptr"][:], root["meta/edges_ptr"][:]
    n = a_ptr.size - 1
    first = (np.arange(n) // batch) * batch  # first structure of each call
    nl = root["core/neighbor_list"]
    nl[:] = nl[:] - np.repeat(a_ptr[first], np.diff(e_ptr))[:, None]
    return int((first > 0).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--prefer", choices=("sample-local", "batch-local", "global"), help="passed to repair")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_synthetic_store(Path(tmp) / "grown.zarr", args.n, seed=args.seed)
        with AtomicDataZarrReader(path) as reader:
            truth = reader.read_packed(np.arange(len(reader)), fields=["neighbor_list"]).fields["neighbor_list"]
        appended = as_appended(path, args.batch)
        started = time.perf_counter()
        plan = repair_store(path, dry_run=True, prefer=args.prefer).plan
        dry = time.perf_counter() - started
        result: dict[str, object] = {
            "structures": args.n, "appended": appended, "edges": int(plan.edges_ptr[-1]), "kinds": plan.counts,
            "dry_run_s": round(dry, 3),
        }  # fmt: skip
        if not plan.refused:
            started = time.perf_counter()
            repair_store(path, out=Path(tmp) / "copy.zarr", prefer=args.prefer)
            result["copy_s"] = round(time.perf_counter() - started, 3)
            started = time.perf_counter()
            AtomicDataZarrWriter(path).repair(prefer=args.prefer)
            result["in_place_s"] = round(time.perf_counter() - started, 3)
            for name in (path, Path(tmp) / "copy.zarr"):
                with AtomicDataZarrReader(name) as reader:
                    got = reader.read_packed(np.arange(len(reader)), fields=["neighbor_list"]).fields["neighbor_list"]
                assert np.array_equal(got, truth), f"{name}: repaired neighbor lists differ from the truth"
            result["verified"] = True
        else:
            result["refused"] = {k: len(plan.samples_of(KINDS.index(k))) for k in ("ambiguous", "undetermined")}
        print(json.dumps(result))


if __name__ == "__main__":
    main()
