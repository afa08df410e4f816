"""The host's share of a window in the ``"inflate"`` layout, beside decoding the same window on the host.

    python scripts/inflate_host_cost.py STORE [CACHE_MIB]

``STORE`` is a store in the ``inflate`` layout (``dali-alchemi synth --layout inflate``). For every window
of 16 batches of 64 structures, in store order and shuffled, it times what the ``"window"`` layout's
source reads (every field decoded on the host: ``read_packed``) and what the ``"inflate"`` layout's
source reads (the LZ4 fields' compressed chunks, checked, with ``read_compressed``; the other fields with
``read_packed``), each pass with a fresh reader and a ``CACHE_MIB`` cache (default 16), twice, side by
side, and prints structures/s and the compressed MiB per window. No GPU needed: this is the half of the
route that runs on the host; nvCOMP's half runs in ``make gpu-check``.
"""

from __future__ import annotations

import sys
import time

import torch

from dali_alchemi import AtomicDataZarrReader
from dali_alchemi.pipeline.inflate import inflate_route
from dali_alchemi.plan import FixedBatchPlan


def main(store: str, cache_mib: int) -> None:
    with AtomicDataZarrReader(store) as reader:
        n = len(reader)
    for shuffle in (False, True):
        epoch = FixedBatchPlan(num_samples=n, batch_size=64, shuffle=shuffle, seed=1).epoch(0)
        windows = [epoch.window(w, 16).indices for w in range(epoch.num_windows(16))]
        results: dict[str, list[str]] = {}
        for layout in ("window", "inflate") * 2:
            with AtomicDataZarrReader(store, cache_bytes=cache_mib << 20) as reader:
                route = inflate_route(reader, reader.field_names, torch.device("cuda"))  # builds no GPU state
                names = [f.name for f in route.inflated]
                started, sent = time.perf_counter(), 0
                for indices in windows:
                    if layout == "window":
                        reader.read_packed(indices)
                        continue
                    parts = reader.read_compressed(indices, fields=names).parts
                    reader.read_packed(indices, fields=route.host_fields)
                    sent += sum(part.blocks.nbytes for part in parts.values())
                rate = n / (time.perf_counter() - started)
            results.setdefault(layout, []).append(f"{rate:,.0f}/s ({sent / len(windows) / 2**20:.1f} MiB/window)")
        order = "shuffled" if shuffle else "store order"
        print(f"{order}, {cache_mib} MiB cache: " + "; ".join(f"{k} {', '.join(v)}" for k, v in results.items()))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 16)
