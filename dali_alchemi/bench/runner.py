"""Timing the loaders side by side: interleaved rounds, medians, records. Prints nothing.

Loaders run round by round in a fixed interleaved order (A B C, A B C, ...), so slow drifts of a
shared machine hit every loader alike; each record is the median over rounds. A measurement opens
the loader (time to first batch counts from there), runs ``epochs`` epochs, and optionally sleeps
``step_ms`` after each batch to stand for a training step; ``wait_s`` is then the time the loop spent
waiting for data and ``epoch_vs_steps`` the elapsed time over the measured time of the steps (1.0 when
reading is completely hidden behind compute). Throughput counts everything after the first batch;
the *warm* throughput only the epochs after the first, once caches hold what the store decodes to;
``total_s`` is the whole run, from opening the loader to its last batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from dali_alchemi.bench.environment import machine_info, package_versions
from dali_alchemi.bench.limit import LayoutLimit, measure_layout_limit
from dali_alchemi.bench.loaders import (
    NO_BLOCK_ORDER,
    ORDERS,
    LoaderSettings,
    Runnable,
    is_plain,
    nvalchemi_available,
    open_loader,
)
from dali_alchemi.bench.memory import MB, TreeMemorySampler, tree_pss
from dali_alchemi.bench.names import LAYOUT_ROWS, LIMITS, STORE_ORDER, import_loader_code
from dali_alchemi.bench.quality import order_quality
from dali_alchemi.config import DEFAULT_BATCHES_PER_WINDOW
from dali_alchemi.errors import ConfigError
from dali_alchemi.store.read.reader import AtomicDataZarrReader

__all__ = [
    "BenchConfig", "BenchMeta", "BenchRun", "Measurement", "ProgressCallback", "Record", "measure", "measure_limit",
    "median", "open_time", "run_bench", "store_size", "summarize"
]  # fmt: skip


ProgressCallback = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """What to compare and how (see ``dali-alchemi bench --help``)."""

    loaders: tuple[str, ...]
    orders: tuple[str, ...] = ("shuffle",)
    batch_size: int = 64
    epochs: int = 2
    rounds: int = 3
    step_ms: float = 0.0
    device: str = "cpu"
    batches_per_window: int = DEFAULT_BATCHES_PER_WINDOW
    torch_workers: int = 2
    seed: int = 0
    cache_bytes: int | None = None
    max_atoms: int | None = None
    max_edges: int | None = None
    max_batches: int | None = None

    def __post_init__(self) -> None:
        bad = [o for o in self.orders if o not in ORDERS]
        if bad:
            raise ConfigError(f"Unknown order {bad[0]!r}: use 'shuffle', 'block' and/or 'sequential'")
        for name in ("batch_size", "epochs", "rounds", "batches_per_window"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.step_ms < 0:
            raise ConfigError(f"step_ms must be >= 0, got {self.step_ms}")
        for name in ("max_atoms", "max_edges", "max_batches"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")


@dataclass(slots=True)
class Measurement:
    """One loader, one order, one round."""

    loader: str
    order: str
    samples: int = 0
    atoms: int = 0
    seconds: float = 0.0
    first_batch_s: float = float("nan")
    peak_pss_mb: float = 0.0
    start_pss_mb: float = 0.0
    processes: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0
    batches: int = 0
    warm_samples: int = 0
    warm_seconds: float = 0.0
    total_s: float = 0.0
    units: int = 0
    unit_atoms: int = 0
    decodes_per_chunk: float | None = None
    note: str | None = None


@dataclass(slots=True)
class Record:
    """A row of the report: medians over rounds for one loader and order.

    Memory is the PSS of the whole process tree (:mod:`dali_alchemi.bench.memory`): ``peak_pss_mb`` the
    largest sample while the loader ran (main process, DALI and torch workers, shared pages once),
    ``start_pss_mb`` the tree just before it opened (the process after its imports, plus what loaders
    measured before it left behind), ``processes`` the most processes in one sample.
    ``shuffle_quality`` and ``batch_energy_ks`` score the order's epoch-0 plan
    (:mod:`dali_alchemi.bench.quality`): 0 to about 1 from sequential to the full permutation, and the
    mean KS distance of batch energies from the store's (``None`` without an ``energy`` field).
    ``share_of_limit`` and ``warm_share_of_limit`` are ``samples_per_s`` and ``warm_samples_per_s`` over the
    ``limit`` row's structures/s (:mod:`dali_alchemi.bench.limit`), when the run measured it.
    ``decodes_per_chunk`` is how often each chunk the reader decodes was decoded per pass over the store
    (1.0: once), for the reads in this process (``packed``, ``packed-sequential``; ``None`` elsewhere).
    """

    loader: str
    order: str
    batch_size: int
    samples_per_s: float | None
    warm_samples_per_s: float | None
    atoms_per_s: float | None
    ratio_vs_plain: float | None
    first_batch_s: float | None
    peak_pss_mb: float | None
    start_pss_mb: float | None
    processes: int | None
    wait_s: float | None
    rounds: int
    note: str | None = None
    epoch_vs_steps: float | None = None
    shuffle_quality: float | None = None
    batch_energy_ks: float | None = None
    total_s: float | None = None
    batches_per_epoch: float | None = None
    atoms_per_batch: float | None = None
    fill_ratio: float | None = None
    share_of_limit: float | None = None
    warm_share_of_limit: float | None = None
    decodes_per_chunk: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class BenchMeta:
    """What every record of a run shares: the config, the store, the machine and the package versions."""

    config: dict[str, Any] = field(default_factory=dict)
    store: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class BenchRun:
    """A run: its metadata once, and a record per loader and order.

    :meth:`to_dict` is the shape of ``dali-alchemi bench --json``: ``{"meta": {"config", "store", "machine",
    "versions"}, "records": [...]}``.
    """

    meta: BenchMeta
    records: list[Record]

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta.to_dict(), "records": [r.to_dict() for r in self.records]}


def median(values: list[float]) -> float:
    """The median of ``values``; NaN for none (a loader that did not run)."""
    return float(np.median(values)) if values else float("nan")


def measure(name: str, order: str, store: str, config: BenchConfig, device: torch.device) -> Measurement:
    """Run one loader for ``config.epochs`` epochs over ``store`` and time it."""
    result = Measurement(loader=name, order=order)
    if name.startswith(("nvalchemi", "dropin")) and not nvalchemi_available():
        result.note = "not installed"
        return result
    budget = config.max_atoms is not None or config.max_edges is not None
    if name in ("nvalchemi", "nvalchemi-fast", "nvalchemi-dropin", "dropin", "dropin-w0") and budget:
        result.note = "no atom budget"
        return result
    if order == "block" and name.startswith(NO_BLOCK_ORDER):
        result.note = "no block order"
        return result
    settings = LoaderSettings(
        batch_size=config.batch_size, batches_per_window=config.batches_per_window, device=device,
        torch_workers=config.torch_workers, seed=config.seed, cache_bytes=config.cache_bytes,
        max_atoms=config.max_atoms, max_edges=config.max_edges,
    )  # fmt: skip
    step = config.step_ms / 1000.0
    import_loader_code(name)  # the first batch counts from building the loader, as in a training script
    with TreeMemorySampler() as memory:
        opened = time.perf_counter()
        runnable = open_loader(name, store, ORDERS[order], settings)
        started: float | None = None
        first_epoch_end, first_epoch_samples = 0.0, 0
        try:
            for epoch in range(config.epochs):
                units = runnable.epoch(epoch)
                per_epoch = _units_per_epoch(name, config)
                taken = 0
                while per_epoch is None or taken < per_epoch:
                    taken += 1
                    asked = time.perf_counter()
                    try:
                        samples, atoms = next(units)
                    except StopIteration:
                        break
                    got = time.perf_counter()
                    result.units += 1
                    result.unit_atoms += atoms
                    if started is None:
                        started = got
                        result.first_batch_s = got - opened
                    else:
                        result.wait_s += got - asked
                        result.samples += samples
                        result.atoms += atoms
                        result.batches += 1
                    if step and name not in LIMITS:
                        slept = time.perf_counter()
                        time.sleep(step)
                        result.step_s += time.perf_counter() - slept
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if epoch == 0:
                    first_epoch_end, first_epoch_samples = time.perf_counter(), result.samples
            result.seconds = time.perf_counter() - (started if started is not None else opened)
            result.total_s = time.perf_counter() - opened
            if config.epochs > 1:
                result.warm_seconds = time.perf_counter() - first_epoch_end
                result.warm_samples = result.samples - first_epoch_samples
            result.decodes_per_chunk = _decodes_per_chunk(runnable)
        finally:
            runnable.close()
    result.peak_pss_mb, result.start_pss_mb, result.processes = memory.peak_mb, memory.start_mb, memory.peak_processes
    return result


def measure_limit(store: str) -> tuple[list[Measurement], LayoutLimit | None]:
    """The ``limit`` and ``page-cache`` rows of one round, and the figures behind them (``None`` when not local)."""
    rows = [Measurement(loader=name, order="sequential") for name in LAYOUT_ROWS]
    try:
        limit = measure_layout_limit(store)
    except ConfigError:
        for row in rows:
            row.note = "local stores only"
        return rows, None
    for row, seconds in zip(rows, (limit.decode_s + limit.crc32c_s, limit.read_s), strict=True):
        row.samples = row.warm_samples = limit.structures
        row.atoms = limit.atoms
        row.seconds = row.warm_seconds = row.total_s = seconds
        row.units = sum(a.chunks for a in limit.arrays)
    return rows, limit


def _decodes_per_chunk(runnable: Runnable) -> float | None:
    """How often each chunk the reader decodes was decoded per pass over the store, so far (1.0: once);
    ``None`` for loaders whose reads happen elsewhere (in worker processes) or decode nothing."""
    reader = getattr(runnable, "reader", None)
    if not isinstance(reader, AtomicDataZarrReader):
        return None
    stats, blocks = reader.stats(), reader.decoded_blocks_per_pass()
    passes = stats.samples_read / len(reader) if len(reader) else 0.0
    return stats.blocks_decoded / blocks / passes if blocks and passes else None


def _units_per_epoch(name: str, config: BenchConfig) -> int | None:
    """Units measured per epoch under ``max_batches``: batches, or the windows holding them for the reads without a loader."""
    if config.max_batches is None:
        return None
    return -(-config.max_batches // config.batches_per_window) if name in LIMITS else config.max_batches


def open_time(store: str, repeats: int = 3) -> float:
    """Median seconds to open the store with the reader (its open-time checks included) and close it."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        AtomicDataZarrReader(store).close()
        times.append(time.perf_counter() - started)
    return median(times)


def store_size(store: str) -> dict[str, int]:
    """The store's structures and atoms (from its pointers: nothing is decoded), for the report's title."""
    with AtomicDataZarrReader(store) as reader:
        atoms, _ = reader.sample_sizes(np.arange(len(reader)))
        return {"structures": len(reader), "atoms": int(atoms.sum())}


def _batch_shape(done: list[Measurement], config: BenchConfig, loader: str) -> dict[str, float | None]:
    """Batches per epoch, mean atoms per batch and (under ``max_atoms``) the fill ratio.

    The fill ratio is real atoms / (batches x ``max_atoms``): 1.0 when every batch is full. The limits
    deliver windows, not batches, so they have none of these.
    """
    if not done or loader in (*LIMITS, *LAYOUT_ROWS):
        return {"batches_per_epoch": None, "atoms_per_batch": None, "fill_ratio": None}
    batches = median([m.units / config.epochs for m in done])
    per_batch = median([m.unit_atoms / m.units for m in done if m.units])
    fill = per_batch / config.max_atoms if config.max_atoms else None
    return {"batches_per_epoch": batches, "atoms_per_batch": per_batch, "fill_ratio": fill}


def summarize(measurements: list[Measurement], config: BenchConfig) -> list[Record]:
    """Medians per loader and order, with the ratio to the best plain DataLoader of the same order."""
    records = []
    groups: dict[tuple[str, str], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.loader, m.order), []).append(m)
    for (loader, order), runs in groups.items():
        done = [m for m in runs if m.note is None and m.seconds > 0]
        note = next((m.note for m in runs if m.note), None)
        rate = median([m.samples / m.seconds for m in done]) if done else None
        records.append(
            Record(
                loader=loader, order=order, batch_size=config.batch_size, samples_per_s=rate,
                warm_samples_per_s=(
                    median([m.warm_samples / m.warm_seconds for m in done if m.warm_seconds > 0])
                    if done and config.epochs > 1 else None
                ),
                atoms_per_s=median([m.atoms / m.seconds for m in done]) if done else None,
                ratio_vs_plain=None, first_batch_s=median([m.first_batch_s for m in done]) if done else None,
                peak_pss_mb=median([m.peak_pss_mb for m in done]) if done else None,
                start_pss_mb=median([m.start_pss_mb for m in done]) if done else None,
                processes=max(m.processes for m in done) if done else None,
                wait_s=median([m.wait_s for m in done]) if done else None, rounds=len(done), note=note,
                total_s=median([m.total_s for m in done]) if done else None,
                decodes_per_chunk=_median_or_none([m.decodes_per_chunk for m in done]),
                **_batch_shape(done, config, loader),
                epoch_vs_steps=(
                    median([m.seconds / m.step_s for m in done if m.step_s > 0])
                    if done and config.step_ms and loader not in LIMITS else None
                ),
            )
        )  # fmt: skip
    limits = [r.samples_per_s for r in records if r.loader == "limit" and r.samples_per_s]
    for r in records:
        if r.loader in LAYOUT_ROWS:  # no loader ran: nothing opened, no first batch, no memory of its own
            r.first_batch_s = r.peak_pss_mb = r.start_pss_mb = r.wait_s = r.processes = None
        elif limits:
            r.share_of_limit = None if r.samples_per_s is None else r.samples_per_s / limits[0]
            r.warm_share_of_limit = None if r.warm_samples_per_s is None else r.warm_samples_per_s / limits[0]
    for order in {r.order for r in records}:
        plain = [r.samples_per_s for r in records if r.order == order and is_plain(r.loader) and r.samples_per_s]
        best = max(plain) if plain else None
        for r in records:
            if r.order == order and best and r.samples_per_s is not None:
                r.ratio_vs_plain = r.samples_per_s / best
    return records


def _median_or_none(values: list[float | None]) -> float | None:
    """The median of the values measured; ``None`` when none was."""
    known = [v for v in values if v is not None]
    return median(known) if known else None


def _pss_after_import() -> float:
    """PSS of this process tree now, in MB: after the imports, before any loader opens."""
    return tree_pss()[0] / MB


def run_bench(
    store: str,
    config: BenchConfig,
    *,
    store_info: dict[str, Any] | None = None,
    progress: ProgressCallback | None = None,
) -> BenchRun:
    """Measure every loader in every order for ``config.rounds`` interleaved rounds; return the run."""
    device = torch.device(config.device)
    after_import = _pss_after_import()
    # packed-sequential and limit do not depend on the order: they are measured once per round, in store order.
    plan = [
        (r, name, order)
        for r in range(config.rounds)
        for name in config.loaders
        for order in (("sequential",) if name in STORE_ORDER else config.orders)
    ]
    measurements: list[Measurement] = []
    limit: LayoutLimit | None = None
    for done, (_, name, order) in enumerate(plan):
        if progress:
            progress(f"{name} ({order})", done, len(plan))
        if name == "limit":
            rows, limit = measure_limit(store)
            measurements.extend(rows)
        else:
            measurements.append(measure(name, order, store, config, device))
    if progress:
        progress("done", len(plan), len(plan))
    settings = LoaderSettings(
        batch_size=config.batch_size, seed=config.seed, cache_bytes=config.cache_bytes, max_atoms=config.max_atoms,
        max_edges=config.max_edges,
    )  # fmt: skip
    in_store_order = any(name in STORE_ORDER for name in config.loaders)
    orders = tuple(dict.fromkeys((*config.orders, *(("sequential",) if in_store_order else ()))))
    quality = order_quality(store, orders, settings)
    records = summarize(measurements, config)
    for record in records:
        if record.note is None and record.loader not in LAYOUT_ROWS:
            record.shuffle_quality = quality[record.order]["shuffle_quality"]
            record.batch_energy_ks = quality[record.order]["batch_energy_ks"]
    store_info = {**(store_info or {"path": store}), **store_size(store), "open_s": open_time(store)}
    if limit is not None:
        store_info["limit"] = limit.to_dict()  # the last round's figures, field by field
    meta = BenchMeta(
        config={k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()},
        store=store_info,
        machine={**machine_info(device), "pss_after_import_mb": after_import},
        versions=package_versions(),
    )
    return BenchRun(meta=meta, records=records)
