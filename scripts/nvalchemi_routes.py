"""What the drop-in DataLoader's two routes cost: InMemoryDataset and per-sample transforms, side by side.

Usage (in the nvalchemi environment): ``python scripts/nvalchemi_routes.py STORE [BATCHES]``. Each
loader yields shuffled batches of 64; the first batch (start-up) is left out and the next BATCHES
(default 60) are timed. Prints structures/s and the route each drop-in loader took.
"""

from __future__ import annotations

import itertools
import sys
import time
from typing import Any

import torch
from nvalchemi.data.datapipes import AtomicDataZarrReader as NvReader
from nvalchemi.data.datapipes import DataLoader as NvLoader
from nvalchemi.data.datapipes import Dataset as NvDataset
from nvalchemi.data.datapipes import InMemoryDataset

from dali_alchemi.nvalchemi import AtomicDataZarrReader, DataLoader, Dataset


def identity(data, meta):  # type: ignore[no-untyped-def]  # nvalchemi's Compose refuses annotated transforms
    return data, meta


def rate(name: str, loader: Any, batches: int) -> float:
    it = iter(loader)
    next(it)  # start-up left out
    count, started = 0, time.perf_counter()
    for batch in itertools.islice(it, batches):
        count += batch.num_graphs
    elapsed = time.perf_counter() - started
    route = getattr(loader, "route", "-")
    print(f"{name:52s} {count:6d} structures in {elapsed:7.2f} s = {count / elapsed:9,.0f} structures/s  route={route}")
    return count / elapsed


def main(store: str, batches: int) -> None:
    torch.manual_seed(0)
    started = time.perf_counter()
    resident = InMemoryDataset(reader=NvReader(store))
    print(f"InMemoryDataset materialised in {time.perf_counter() - started:.1f} s")
    rate("nvalchemi DataLoader, InMemoryDataset", NvLoader(resident, batch_size=64, shuffle=True), batches)
    rate("dropin DataLoader, InMemoryDataset", DataLoader(resident, batch_size=64, shuffle=True), batches)
    fast = DataLoader(Dataset(AtomicDataZarrReader(store)), batch_size=64, shuffle=True)
    rate("dropin DataLoader, Dataset over the store", fast, batches)
    transformed = Dataset(AtomicDataZarrReader(store), transforms=[identity])
    rate("dropin DataLoader, Dataset + identity transform", DataLoader(transformed, batch_size=64, shuffle=True), batches)
    theirs = NvDataset(NvReader(store), transforms=[identity])
    rate("nvalchemi DataLoader, Dataset + identity transform", NvLoader(theirs, batch_size=64, shuffle=True), batches)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 60)
