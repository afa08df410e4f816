"""The loaders the benchmark compares, behind one small interface.

Each entry opens a loader on a store for one order (``shuffle``: the global permutation, ``block``:
the chunk-aware block shuffle, or ``sequential``) and yields, per epoch,
``(structures, atoms)`` for every unit it delivers (a batch; a window for the reads without a loader). Batches
are moved to the benchmark device, as a training loop would. The DALI loader, the plain DataLoader
and the reads without a loader all use the same reader; nvalchemi's loader uses nvalchemi's own reader.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from dali_alchemi.bench.names import LIMITS, LOADER_HELP, RENAMED
from dali_alchemi.config import DEFAULT_BATCHES_PER_WINDOW, DEFAULT_NUM_WORKERS
from dali_alchemi.errors import ConfigError
from dali_alchemi.interop.read_many import as_packed_reader
from dali_alchemi.plan import PlanArguments, build_plan, store_chunking
from dali_alchemi.store.format.protocol import select_fields
from dali_alchemi.store.read.reader import AtomicDataZarrReader

__all__ = [
    "DECODE_CACHE_BYTES", "NO_BLOCK_ORDER", "ORDERS", "LoaderSettings", "Runnable", "Shuffle",
    "bench_plan", "is_plain", "nvalchemi_available", "open_loader", "validate_names"
]  # fmt: skip


DECODE_CACHE_BYTES = 64 << 20

ORDERS: dict[str, bool | str] = {"shuffle": True, "block": "block", "sequential": False}
"""The benchmark's orders and the ``shuffle=`` each loader gets for it."""

NO_BLOCK_ORDER = ("nvalchemi", "dropin", "pyg-dynamic")
DROPIN = ("dropin", "dropin-w0")  # the drop-in with its Dataset's default num_workers=2 (DALI workers), or 0
"""Loaders (name prefixes) with no block order of their own."""

Shuffle = bool | str


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderSettings:
    """What every loader in a run shares: batch size, window size, device, worker counts.

    ``batches_per_window`` is the batches read per reader call by the DALI loader and the reads without
    a loader (and nvalchemi's ``prefetch_factor``, which means the same there).
    """

    batch_size: int = 64
    batches_per_window: int = DEFAULT_BATCHES_PER_WINDOW
    max_atoms: int | None = None
    max_edges: int | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    torch_workers: int = 2
    seed: int = 0
    cache_bytes: int | None = None

    @property
    def plan_batch_size(self) -> int | None:
        """The batch size the loaders' plans get: none (no cap) when a budget sizes the batches."""
        return None if self.max_atoms or self.max_edges else self.batch_size


class Runnable(Protocol):
    def epoch(self, epoch: int) -> Iterator[tuple[int, int]]: ...

    def close(self) -> None: ...


class _BatchLoader:
    """Adapts anything that iterates Batches (and can set its epoch) to :class:`Runnable`."""

    def __init__(
        self, loader: Any, set_epoch: Callable[[int], None], device: torch.device, on_close: Callable[[], None]
    ) -> None:
        self.loader = loader
        self._set_epoch = set_epoch
        self.device = device
        self._on_close = on_close

    def epoch(self, epoch: int) -> Iterator[tuple[int, int]]:
        self._set_epoch(epoch)
        for batch in self.loader:
            if self.device.type == "cuda" and batch.device != self.device:
                batch = batch.to(self.device, non_blocking=True)
            yield batch.num_graphs, batch.num_nodes

    def close(self) -> None:
        self._on_close()


def _dali(store: str, shuffle: Shuffle, s: LoaderSettings, workers: int, layout: str, shared: bool) -> Runnable:
    from dali_alchemi.pipeline.loader import DALIDataLoader

    loader = DALIDataLoader(
        store, batch_size=s.plan_batch_size, shuffle=shuffle, seed=s.seed, batches_per_window=s.batches_per_window,
        num_workers=workers, device=s.device, layout=layout, cache_bytes=s.cache_bytes, max_atoms=s.max_atoms,
        max_edges=s.max_edges, shared_cache=shared,
    )  # fmt: skip
    return _BatchLoader(loader, loader.set_epoch, s.device, loader.close)


def _torch(store: str, shuffle: Shuffle, s: LoaderSettings, batched: bool, workers: int) -> Runnable:
    from dali_alchemi.baseline import plain_dataloader

    loader = plain_dataloader(
        store, batch_size=s.plan_batch_size, shuffle=shuffle, seed=s.seed, num_workers=workers,
        pin_memory=s.device.type == "cuda", batched=batched, cache_bytes=s.cache_bytes, max_atoms=s.max_atoms,
        max_edges=s.max_edges,
    )  # fmt: skip

    return _BatchLoader(loader, loader.set_epoch, s.device, loader.close)


class _PygDataset:
    """Each structure as a ``torch_geometric.data.Data``, read one at a time, as a PyG user's dataset would."""

    def __init__(self, reader: AtomicDataZarrReader) -> None:
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> Any:
        from torch_geometric.data import Data

        sample = self.reader.read_packed([index]).split()[0]
        tensors = {name: torch.from_numpy(value) for name, value in sample.items()}
        edge_index = tensors.pop("neighbor_list").t().long() if "neighbor_list" in tensors else None
        return Data(pos=tensors.pop("positions"), z=tensors.pop("atomic_numbers"), edge_index=edge_index, **tensors)


def _pyg_dynamic(store: str, shuffle: bool, s: LoaderSettings, workers: int) -> Runnable:
    """PyG's ``DataLoader`` with its ``DynamicBatchSampler``, as people batch by atoms today.

    The sampler reads every structure in the main process to learn its size, then the loader reads it
    again to batch it: that double read is part of how it works.
    """
    from torch_geometric.loader import DataLoader as PygDataLoader
    from torch_geometric.loader import DynamicBatchSampler

    if not s.max_atoms:
        raise ConfigError("pyg-dynamic batches by atoms: give --max-atoms")
    reader = (
        AtomicDataZarrReader(store) if s.cache_bytes is None else AtomicDataZarrReader(store, cache_bytes=s.cache_bytes)
    )
    dataset = _PygDataset(reader)
    sampler = DynamicBatchSampler(dataset, max_num=s.max_atoms, mode="node", shuffle=shuffle)  # type: ignore[arg-type]
    loader = PygDataLoader(dataset, batch_sampler=sampler, num_workers=workers)  # type: ignore[arg-type]

    def set_epoch(epoch: int) -> None:
        torch.manual_seed(s.seed + epoch)  # its sampler draws from torch's global generator

    return _BatchLoader(loader, set_epoch, s.device, reader.close)


def nvalchemi_available() -> bool:
    """Whether nvalchemi-toolkit can be imported here."""
    return importlib.util.find_spec("nvalchemi") is not None


def _nvalchemi_store(store: str) -> Any:
    """nvalchemi takes local paths as strings but needs a zarr Store object for a URL."""
    if "://" in store:
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(store, read_only=True)
    return store


def _nvalchemi(
    store: str, shuffle: bool, s: LoaderSettings, *, dropin: bool = False, skip_validation: bool = True
) -> Runnable:
    """nvalchemi's DataLoader over its own reader, or (``dropin``) over :class:`NvalchemiDropInReader`.

    ``skip_validation=False`` is nvalchemi's default Dataset (one validated ``AtomicData`` per structure).
    """
    from nvalchemi.data.datapipes import DataLoader, Dataset

    if dropin:
        from dali_alchemi.interop.nvalchemi_reader import NvalchemiDropInReader

        options: dict[str, Any] = {} if s.cache_bytes is None else {"cache_bytes": s.cache_bytes}
        reader: Any = NvalchemiDropInReader(store, **options)
    else:
        from nvalchemi.data.datapipes import AtomicDataZarrReader as NvReader

        reader = NvReader(_nvalchemi_store(store))
    dataset = Dataset(reader, device=s.device, skip_validation=skip_validation)
    loader = DataLoader(
        dataset, batch_size=s.batch_size, shuffle=shuffle, prefetch_factor=s.batches_per_window,
        pin_memory=s.device.type == "cuda", use_streams=s.device.type == "cuda",
    )  # fmt: skip

    def set_epoch(epoch: int) -> None:
        torch.manual_seed(s.seed + epoch)  # its RandomSampler draws from torch's global generator
        loader.set_epoch(epoch)

    return _BatchLoader(loader, set_epoch, s.device, reader.close)


def _dropin_module(store: str, shuffle: bool, s: LoaderSettings, workers: int = DEFAULT_NUM_WORKERS) -> Runnable:
    """:mod:`dali_alchemi.nvalchemi` with its defaults (validation on; ``Dataset(num_workers=workers)``)."""
    from dali_alchemi.nvalchemi import DataLoader, Dataset

    options: dict[str, Any] = {} if s.cache_bytes is None else {"cache_bytes": s.cache_bytes}
    if options:
        from dali_alchemi.nvalchemi import AtomicDataZarrReader

        dataset = Dataset(AtomicDataZarrReader(store, **options), device=s.device, num_workers=workers)
    else:
        dataset = Dataset(store, device=s.device, num_workers=workers)
    loader = DataLoader(
        dataset, batch_size=s.batch_size, shuffle=shuffle, prefetch_factor=s.batches_per_window,
        pin_memory=s.device.type == "cuda",
    )  # fmt: skip

    def set_epoch(epoch: int) -> None:
        torch.manual_seed(s.seed + epoch)  # its RandomSampler draws from torch's global generator, as nvalchemi's
        loader.set_epoch(epoch)

    def close() -> None:
        loader.close()
        dataset.reader.close()

    return _BatchLoader(loader, set_epoch, s.device, close)


class _ReadManyOnly:
    """This project's reader seen only through nvalchemi's contract (``read_many``, ``get_metadata``)."""

    def __init__(self, reader: AtomicDataZarrReader) -> None:
        self.reader = reader

    def read_many(self, indices: Any) -> Any:
        return self.reader.read_many(indices)

    def get_metadata(self, index: int) -> tuple[int, int]:
        return self.reader.get_metadata(index)

    def __len__(self) -> int:
        return len(self.reader)

    def close(self) -> None:
        self.reader.close()


def _dali_read_many(store: str, shuffle: Shuffle, s: LoaderSettings, workers: int, theirs: bool) -> Runnable:
    """``DALIDataLoader`` through :class:`ReadManyAdapter`: over nvalchemi's reader, or over this one's read_many."""
    from dali_alchemi.pipeline.loader import DALIDataLoader

    if theirs:
        from nvalchemi.data.datapipes import AtomicDataZarrReader as NvReader

        inner: Any = NvReader(_nvalchemi_store(store))
    else:
        options: dict[str, Any] = {} if s.cache_bytes is None else {"cache_bytes": s.cache_bytes}
        inner = _ReadManyOnly(AtomicDataZarrReader(store, **options))
    try:
        loader = DALIDataLoader(
            inner, batch_size=s.plan_batch_size, shuffle=shuffle, seed=s.seed, batches_per_window=s.batches_per_window,
            num_workers=workers, device=s.device, max_atoms=s.max_atoms, max_edges=s.max_edges,
        )  # fmt: skip
    except BaseException:
        inner.close()  # the loader does not own a reader passed in: close it here, or it leaks
        raise

    def close() -> None:
        loader.close()
        inner.close()

    return _BatchLoader(loader, loader.set_epoch, s.device, close)


def bench_plan(reader: Any, shuffle: Shuffle, s: LoaderSettings, *, budget: bool = False) -> Any:
    """The plan the loaders build for ``shuffle`` over ``reader`` (block, global or sequential order).

    The read limits use fixed batches of ``batch_size``; with ``budget`` the settings' atom and edge
    budgets apply too, as in the DALI loader and the plain DataLoader. A reader that only has
    ``read_many`` is seen through :class:`ReadManyAdapter`, as the loaders see it, and the block
    order's spans and buffers come from :func:`store_chunking` of every field, as in the loaders, so
    ``--order block`` is the same order for every loader.
    """
    arguments = (
        PlanArguments(batch_size=s.plan_batch_size, shuffle=shuffle, seed=s.seed, max_atoms=s.max_atoms,
                      max_edges=s.max_edges)
        if budget else PlanArguments(batch_size=s.batch_size, shuffle=shuffle, seed=s.seed)
    )  # fmt: skip
    packed = as_packed_reader(reader)
    fields = select_fields(packed, None)
    return build_plan(
        None, arguments, len(packed), lambda: packed.sample_sizes(np.arange(len(packed))),
        lambda: store_chunking(packed, fields),
    )  # fmt: skip


class _WindowedReads:
    """One read per window of ``batches_per_window`` batches, in the plan's order."""

    def __init__(self, reader: Any, shuffle: Shuffle, s: LoaderSettings) -> None:
        self.reader = reader
        self.plan = bench_plan(reader, shuffle, s)
        self.batches_per_window = s.batches_per_window

    def read(self, indices: np.ndarray) -> tuple[int, int]:
        """Read one window; return its structure and atom counts."""
        raise NotImplementedError

    def epoch(self, epoch: int) -> Iterator[tuple[int, int]]:
        epoch_plan = self.plan.epoch(epoch)
        for w in range(epoch_plan.num_windows(self.batches_per_window)):
            yield self.read(epoch_plan.window(w, self.batches_per_window).indices)

    def close(self) -> None:
        self.reader.close()


class _NvalchemiReads(_WindowedReads):
    """nvalchemi's own reader: one ``read_many`` per window, in the same order as ``packed``."""

    def __init__(self, store: str, shuffle: Shuffle, s: LoaderSettings) -> None:
        from nvalchemi.data.datapipes import AtomicDataZarrReader as NvReader

        super().__init__(NvReader(_nvalchemi_store(store)), shuffle, s)

    def read(self, indices: np.ndarray) -> tuple[int, int]:
        samples = self.reader.read_many(indices.tolist())
        return len(samples), sum(int(d["atomic_numbers"].shape[0]) for d, _ in samples)


class _ReadManyReads(_WindowedReads):
    """This reader through nvalchemi's contract: ``read_many`` per window, joined by :class:`ReadManyAdapter`."""

    def __init__(self, store: str, shuffle: Shuffle, s: LoaderSettings) -> None:
        from dali_alchemi.interop.read_many import ReadManyAdapter

        options: dict[str, Any] = {} if s.cache_bytes is None else {"cache_bytes": s.cache_bytes}
        super().__init__(ReadManyAdapter(_ReadManyOnly(AtomicDataZarrReader(store, **options))), shuffle, s)

    def read(self, indices: np.ndarray) -> tuple[int, int]:
        packed = self.reader.read_packed(indices)
        return len(packed), int(packed.n_atoms.sum())


class _PackedReads(_WindowedReads):
    """The reader's own packed windowed reads: the ceiling for anything built on top of it."""

    def __init__(self, store: str, shuffle: Shuffle, s: LoaderSettings, *, cache_bytes: int | None = None) -> None:
        budget = s.cache_bytes if cache_bytes is None else cache_bytes
        reader = AtomicDataZarrReader(store) if budget is None else AtomicDataZarrReader(store, cache_bytes=budget)
        super().__init__(reader, shuffle, s)

    def read(self, indices: np.ndarray) -> tuple[int, int]:
        packed = self.reader.read_packed(indices)
        return len(packed), int(packed.n_atoms.sum())


class _SequentialDecode(_PackedReads):
    """``packed-sequential``: this reader's windowed reads in store order through a 64 MiB cache, front to back.

    The other loaders get the reader's default cache (1 GiB), which can hold a store of tens of
    thousands of structures after the first epoch; this one keeps only what fits in 64 MiB, so what
    does not fit is read (and decoded) again each epoch: what the reader does on a store bigger than its
    cache. Not a ceiling: a shuffled loader whose cache holds the store can beat it (the ceiling is ``limit``).
    """

    def __init__(self, store: str, shuffle: Shuffle, s: LoaderSettings) -> None:
        super().__init__(store, False, s, cache_bytes=DECODE_CACHE_BYTES)


_PATTERN = re.compile(
    r"^(?P<kind>dali|torch|torch-batched|pyg-dynamic)(?:-w(?P<workers>\d+))?(?:-(?P<layout>blob|window|inflate))?"
    r"(?P<shared>-shared)?$"
)

_READ_MANY_PATTERN = re.compile(r"^(?P<kind>nvalchemi-dali|readmany-dali)(?:-w(?P<workers>\d+))?$")

def is_plain(name: str) -> bool:
    """Whether ``name`` is a plain torch DataLoader configuration (the ratio's reference)."""
    return name.startswith(("torch", "pyg"))


def _no_block(name: str, shuffle: Shuffle) -> bool:
    if not isinstance(shuffle, bool):
        raise ConfigError(f"Loader {name!r} has no block order")
    return shuffle


def open_loader(name: str, store: str, shuffle: Shuffle, settings: LoaderSettings) -> Runnable:
    """Open loader ``name`` (see :data:`LOADER_HELP`); raises :class:`ConfigError` for an unknown name."""
    if name == "nvalchemi":
        return _nvalchemi(store, _no_block(name, shuffle), settings, skip_validation=False)
    if name == "nvalchemi-fast":
        return _nvalchemi(store, _no_block(name, shuffle), settings)
    if name in DROPIN:
        dataset_workers = 0 if name == "dropin-w0" else DEFAULT_NUM_WORKERS
        return _dropin_module(store, _no_block(name, shuffle), settings, dataset_workers)
    if name == "nvalchemi-reader":
        return _NvalchemiReads(store, shuffle, settings)
    if name == "nvalchemi-dropin":
        return _nvalchemi(store, _no_block(name, shuffle), settings, dropin=True)
    read_many = _READ_MANY_PATTERN.match(name)
    if read_many is not None:
        workers = read_many.group("workers")
        count = DEFAULT_NUM_WORKERS if workers is None else int(workers)
        return _dali_read_many(store, shuffle, settings, count, read_many.group("kind") == "nvalchemi-dali")
    if name == "packed":
        return _PackedReads(store, shuffle, settings)
    if name == "readmany-reads":
        return _ReadManyReads(store, shuffle, settings)
    if name == "packed-sequential":
        return _SequentialDecode(store, shuffle, settings)
    match = _PATTERN.match(name)
    if match is None:
        raise ConfigError(f"Unknown loader {name!r}; choose from: {LOADER_HELP}")
    kind, workers = match.group("kind"), match.group("workers")
    if kind == "dali":
        return _dali(
            store,
            shuffle,
            settings,
            DEFAULT_NUM_WORKERS if workers is None else int(workers),
            match.group("layout") or "window",
            match.group("shared") is not None,
        )
    if match.group("layout") or match.group("shared"):
        raise ConfigError(f"Loader {name!r}: layout and -shared suffixes only apply to dali loaders")
    count = settings.torch_workers if workers is None else int(workers)
    if kind == "pyg-dynamic":
        return _pyg_dynamic(store, _no_block(name, shuffle), settings, count)
    return _torch(store, shuffle, settings, kind == "torch-batched", count)


def validate_names(names: list[str]) -> None:
    """Raise :class:`ConfigError` (a ``ValueError``) naming the first unknown loader."""
    for name in names:
        if name in RENAMED:
            raise ConfigError(f"Unknown loader {name!r}: {RENAMED[name]}")
        if name not in ("nvalchemi", "nvalchemi-fast", "nvalchemi-dropin", "limit", *DROPIN, *LIMITS) and not (
            _PATTERN.match(name) or _READ_MANY_PATTERN.match(name)
        ):
            raise ConfigError(f"Unknown loader {name!r}; choose from: {LOADER_HELP}")
