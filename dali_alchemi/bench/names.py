"""The names of the loaders the benchmark compares, importable without torch.

The command line lists them in ``dali-alchemi bench --help``; keeping them here, away from the loaders
themselves (which import torch, zarr and DALI), keeps every ``--help`` fast. The pattern that parses a
name lives with the loaders, in :mod:`dali_alchemi.bench.loaders`.
"""

from __future__ import annotations

import importlib

__all__ = [
    "CODECS", "DEFAULT_LOADERS", "LAYOUT_ROWS", "LIMITS", "LOADER_HELP", "RENAMED", "STORE_LAYOUTS", "STORE_ORDER",
    "import_loader_code",
]  # fmt: skip


LOADER_HELP = (
    "dali-wN (the DALI loader with N worker processes; dali-w0 reads on a background thread; dali: the "
    "default), optionally with a DALI layout suffix -window, -blob or -inflate (CUDA only: LZ4 chunks inflated on the GPU; "
    "needs a store written with --layout inflate), and -shared (the workers share decoded "
    "chunks through a shared-memory folder: DALIDataLoader(shared_cache=True)); torch-wN (plain "
    "DataLoader, per-sample reads), torch-batched-wN (one read per batch, split into samples), pyg-dynamic-wN (PyG's DataLoader "
    "with its DynamicBatchSampler; needs --max-atoms), nvalchemi (nvalchemi-toolkit's "
    "DataLoader, its Dataset's default settings: one validated AtomicData per structure), nvalchemi-fast (the same "
    "with skip_validation=True), nvalchemi-dropin (nvalchemi-fast over NvalchemiDropInReader), dropin "
    "(dali_alchemi.nvalchemi's DataLoader and Dataset, defaults; dropin-w0: Dataset(num_workers=0), read on a "
    "background thread), nvalchemi-dali-wN (DALIDataLoader "
    "over nvalchemi's reader, through ReadManyAdapter), readmany-dali-wN (DALIDataLoader over this reader seen only "
    "through read_many), readmany-reads (its read_many per window, joined by ReadManyAdapter), nvalchemi-reader "
    "(its read_many per window), packed (this reader's windowed reads), packed-sequential "
    "(the same in store order through a 64 MiB cache: a store bigger than the cache), limit (no loader: the "
    "store's codecs on one core, crc32c and decode with the bytes in memory, and the page-cache read of "
    "the same bytes, its page-cache row)"
)
DEFAULT_LOADERS = (
    "dali",
    "dali-w0",
    "torch-w2",
    "torch-batched-w0",
    "torch-batched-w2",
    "nvalchemi",
    "packed",
    "packed-sequential",
    "limit",
)

LIMITS = ("packed", "packed-sequential", "nvalchemi-reader", "readmany-reads")
"""The rows that are reads without a loader: one unit per window, no batches, no simulated steps."""

STORE_ORDER = ("packed-sequential", "limit")
"""The names measured in store order only, whatever orders the run asks for."""

RENAMED = {
    "decode": "'decode' is now 'packed-sequential' (this reader in store order through a 64 MiB cache); "
    "the layout's limit, what the store's codecs do on one core, is the 'limit' row",
}
"""Loader names of earlier versions, and what became of them."""

LAYOUT_ROWS = ("limit", "page-cache")
"""The rows the ``limit`` name adds (:mod:`dali_alchemi.bench.limit`): the store's codecs on one core, and
reading the same bytes from the page cache. No loader runs; they are measured once per round."""

STORE_LAYOUTS = ("default", "compressed", "uncompressed", "inflate")
"""Named store layouts (:func:`dali_alchemi.config.layout_config`; the ``--layout`` of ``synth``, ``bench`` and ``rewrite``)."""

CODECS = ("lz4", "zstd", "zstd3", "none")
"""Codecs of a synthetic store (``--codec``, one for every core array instead of the layout's): blosc-lz4, zstd level 1 or 3, or raw bytes
(``none``: rows read in place, no decode)."""


def _modules_of(name: str) -> tuple[str, ...]:
    """The modules loader ``name`` imports when it opens (the loaders import them lazily)."""
    modules: tuple[str, ...] = ()
    if name.startswith(("dali", "nvalchemi-dali", "readmany-dali")):
        modules = ("dali_alchemi.pipeline.loader",)
    elif name.startswith(("torch", "pyg")):
        modules = ("dali_alchemi.baseline", *(("torch_geometric.loader",) if name.startswith("pyg") else ()))
    elif name.startswith("dropin"):
        modules = ("dali_alchemi.nvalchemi",)
    if name.startswith("nvalchemi"):
        modules += ("nvalchemi.data.datapipes", "dali_alchemi.nvalchemi")
    return modules


def import_loader_code(name: str) -> None:
    """Import what loader ``name`` needs, before the clock of its first batch starts.

    A training script imports the library before it builds a loader, so the first batch counts from
    building it, not from importing DALI (about 0.3 s in a fresh process). What cannot be imported is left
    for opening the loader to report, as it did.
    """
    for module in _modules_of(name):
        try:
            importlib.import_module(module)
        except ImportError:
            return
