"""Parallel conversion side by side: one process, a pool of two, and a Dask LocalCluster of two (docs/bigger-than-memory.md).

    python scripts/convert_scaling.py WORK_DIR [--files 16] [--frames 400] [--repeats 3] [--no-dask]

Writes ``--files`` extxyz trajectories of ASE EMT molecular dynamics (108-atom copper, ``--frames`` frames
each, seed = file number) into ``WORK_DIR/inputs`` if they are not there yet, then converts all of them with
``--cutoff 5`` as ``convert_parallel(..., workers=1)`` once, then ``workers=2`` and a Dask
``LocalCluster(n_workers=2, threads_per_worker=1)`` alternated ``--repeats`` times. Each figure is the time
of the ``convert_parallel`` call: the pool's start is counted, the cluster's is not (it is up before the
job, as a cluster is). Prints each time and the ratios. Needs ase and dask[distributed].
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from dali_alchemi.interop.parallel_convert import convert_parallel

CUTOFF = 5.0


def write_inputs(folder: Path, files: int, frames: int) -> list[Path]:
    """The trajectories, written once and reused by later runs."""
    from ase.io import write

    from dali_alchemi.bench.realistic import emt_frames

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(files):
        path = folder / f"md-{frames}-{k:03d}.extxyz"
        if not path.exists():
            scratch = path.with_suffix(".tmp.extxyz")
            write(str(scratch), list(emt_frames(frames, seed=k)))
            scratch.rename(path)
        paths.append(path)
    return paths


def timed(inputs: list[Path], out: Path, **engine: Any) -> float:
    """Seconds of one conversion of ``inputs`` into a fresh ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    convert_parallel(inputs, out, cutoff=CUTOFF, **engine)
    seconds = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-dask", action="store_true", help="only the process pool")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    inputs = write_inputs(args.work_dir / "inputs", args.files, args.frames)
    out = args.work_dir / "out"
    print(f"{args.files} files x {args.frames} frames, cutoff {CUTOFF}", flush=True)
    one = timed(inputs, out, workers=1)
    print(f"workers=1: {one:.2f} s", flush=True)
    cluster = client = None
    if not args.no_dask:
        from distributed import Client, LocalCluster

        before = dict(os.environ)
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        os.environ.clear()  # the nanny set its malloc variables here too: keep them from the pool's workers
        os.environ.update(before)
    try:
        for _ in range(args.repeats):
            two = timed(inputs, out, workers=2)
            line = f"workers=2: {two:.2f} s ({one / two:.2f}x workers=1)"
            if client is not None:
                dask = timed(inputs, out, client=client)
                line += f"; Dask LocalCluster(2): {dask:.2f} s ({dask / two:.3f}x workers=2)"
            print(line, flush=True)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    main()
