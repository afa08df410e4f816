"""The GPU benchmark of ``make gpu-check``: the DALI loader on a CUDA device against a plain pinned copy.

It reports structures/s and atoms/s of the DALI loader delivering Batches on the GPU, the
host-to-device bandwidth that implies (bytes of every field of every batch over the epoch time),
and, for reference, the bandwidth of a plain ``torch`` copy of the same number of bytes from pinned
host memory, window by window. Needs CUDA.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from dali_alchemi.config import DEFAULT_BATCHES_PER_WINDOW

if TYPE_CHECKING:
    from dali_alchemi.batch import Batch

__all__ = ["H2DResult", "batch_bytes", "measure_h2d", "pinned_copy_rate"]


@dataclass(frozen=True, slots=True)
class H2DResult:
    """One GPU measurement."""

    device: str
    layout: str
    structures: int
    atoms: int
    bytes: int
    seconds: float
    samples_per_s: float
    atoms_per_s: float
    loader_gb_per_s: float
    pinned_copy_gb_per_s: float
    first_batch_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def batch_bytes(batch: Batch) -> int:
    """Bytes of a batch's fields (what crosses the bus; the pointers are built on the device)."""
    return sum(t.numel() * t.element_size() for t in batch.fields.values())


def pinned_copy_rate(total_bytes: int, chunk_bytes: int, device: torch.device, repeats: int = 3) -> float:
    """GB/s of ``torch`` copies of ``total_bytes`` from pinned host memory in ``chunk_bytes`` pieces."""
    chunk_bytes = max(1, min(chunk_bytes, total_bytes))
    host = torch.empty(chunk_bytes, dtype=torch.uint8).pin_memory()
    dest = torch.empty(chunk_bytes, dtype=torch.uint8, device=device)
    pieces = max(1, total_bytes // chunk_bytes)
    dest.copy_(host, non_blocking=True)
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(pieces):
            dest.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return pieces * chunk_bytes / best / 1e9


def measure_h2d(
    store: str,
    *,
    batch_size: int = 64,
    batches_per_window: int = DEFAULT_BATCHES_PER_WINDOW,
    epochs: int = 2,
    device: str = "cuda",
    layout: str = "window",
) -> H2DResult:
    """Run the DALI loader on ``device`` for ``epochs`` epochs and compare with pinned copies."""
    from dali_alchemi.errors import DeviceError
    from dali_alchemi.pipeline.loader import DALIDataLoader

    target = torch.device(device)
    if target.type != "cuda" or not torch.cuda.is_available():
        raise DeviceError("the host-to-device benchmark needs a CUDA GPU")
    opened = time.perf_counter()
    loader = DALIDataLoader(
        store, batch_size=batch_size, batches_per_window=batches_per_window, device=target, layout=layout
    )
    with loader:
        structures = atoms = moved = 0
        first: float | None = None
        started = 0.0
        for _ in range(epochs):
            for batch in loader:
                if first is None:
                    torch.cuda.synchronize(target)
                    first = time.perf_counter() - opened
                    started = time.perf_counter()
                    continue
                assert batch.positions.is_cuda
                structures += batch.num_graphs
                atoms += batch.num_nodes
                moved += batch_bytes(batch)
        torch.cuda.synchronize(target)
        seconds = time.perf_counter() - started
    window_bytes = max(1, moved // max(1, structures) * batch_size * batches_per_window)
    return H2DResult(
        device=torch.cuda.get_device_name(target),
        layout=layout,
        structures=structures,
        atoms=atoms,
        bytes=moved,
        seconds=seconds,
        samples_per_s=structures / seconds,
        atoms_per_s=atoms / seconds,
        loader_gb_per_s=moved / seconds / 1e9,
        pinned_copy_gb_per_s=pinned_copy_rate(moved, window_bytes, target),
        first_batch_s=first or float("nan"),
    )
