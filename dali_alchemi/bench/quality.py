"""Shuffle quality of the orders the benchmark runs, as numbers in its records.

For each order, the epoch-0 plan the loaders build (the same arguments, the store's chunking and the
run's cache size) is scored with :func:`~dali_alchemi.plan.quality.shuffle_quality` (0 for sequential
order, about 1 for the full permutation) and, when the store has an ``energy`` field, with
:func:`~dali_alchemi.plan.quality.batch_ks` over the structures' energies: the mean distance between
each batch's energy distribution and the store's, which is what matters on a store sorted by energy.
Only pointers and the energies are read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dali_alchemi.bench.loaders import ORDERS, LoaderSettings, bench_plan
from dali_alchemi.plan.quality import batch_ks, shuffle_quality
from dali_alchemi.store.read.cache import DEFAULT_CACHE_BYTES
from dali_alchemi.store.read.reader import AtomicDataZarrReader

__all__ = ["order_quality"]


def order_quality(store: str, orders: tuple[str, ...], settings: LoaderSettings) -> dict[str, dict[str, Any]]:
    """``{order: {"shuffle_quality": q, "batch_energy_ks": ks or None}}`` for every order."""
    cache = DEFAULT_CACHE_BYTES if settings.cache_bytes is None else settings.cache_bytes
    result: dict[str, dict[str, Any]] = {}
    with AtomicDataZarrReader(store, cache_bytes=cache) as reader:
        energy = None
        if "energy" in reader.field_names and len(reader):
            packed = reader.read_packed(np.arange(len(reader)), fields=["energy"])
            energy = packed.fields["energy"].reshape(len(reader), -1)[:, 0].astype(np.float64)
        for order in orders:
            epoch = bench_plan(reader, ORDERS[order], settings, budget=True).epoch(0)
            whole = np.asarray(epoch.order)
            visited = whole[: int(epoch.batch_ptr[-1])]
            result[order] = {
                "shuffle_quality": shuffle_quality(visited),
                "batch_energy_ks": None if energy is None else batch_ks(energy, whole, epoch.batch_ptr),
            }
    return result
