"""Disk size of one ASE EMT molecular-dynamics trajectory written in each store layout (docs/stores.md, "Store layouts").

    python scripts/layout_disk.py [FRAMES] [OUT_DIR]

Writes the same frames (108-atom copper, with forces and momenta) in the ``compressed``, ``default``,
``uncompressed`` and ``inflate`` layouts, without and with a 5 Å neighbor list, and prints each size and its ratio to
``compressed``. Needs ase.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from dali_alchemi.bench.realistic import emt_frames
from dali_alchemi.config import layout_config
from dali_alchemi.interop.ase_io import write_atoms
from dali_alchemi.store.read.summary import summarize


def main(frames: int, out: Path) -> None:
    warnings.simplefilter("ignore")
    trajectory = list(emt_frames(frames))
    for cutoff in (None, 5.0):
        sizes = {}
        for name in ("compressed", "default", "uncompressed", "inflate"):
            path = out / f"emt-{name}-{cutoff}.zarr"
            shutil.rmtree(path, ignore_errors=True)
            write_atoms(trajectory, path, cutoff=cutoff, config=layout_config(name))
            sizes[name] = summarize(str(path)).bytes_on_disk
        shown = ", ".join(f"{k} {v / 2**20:.2f} MiB ({v / sizes['compressed']:.3f}x)" for k, v in sizes.items())
        print(f"{frames} frames of {len(trajectory[0])} atoms, cutoff {cutoff}: {shown}", flush=True)


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as scratch:
        main(count, Path(sys.argv[2]) if len(sys.argv) > 2 else Path(scratch))
