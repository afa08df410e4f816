"""A second PackedReader, in memory and written here: it passes the contract, and both loaders read through it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from dali_alchemi import Batch, FieldSpec, PackedSamples, plain_dataloader
from dali_alchemi.testing.reader import PackedReaderTests


class MemoryReader:
    """Structures held as one PackedSamples; reads are ``take``s."""

    def __init__(self, packed: PackedSamples) -> None:
        self.packed = packed

    def __len__(self) -> int:
        return len(self.packed)

    @property
    def field_specs(self) -> dict[str, FieldSpec]:
        return {
            name: FieldSpec(level=self.packed.levels[name], dtype=values.dtype, trailing=values.shape[1:])
            for name, values in self.packed.fields.items()
        }

    def sample_sizes(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64)
        return self.packed.n_atoms[indices], self.packed.n_edges[indices]

    def read_packed(self, indices: Any, *, fields: Sequence[str] | None = None) -> PackedSamples:
        taken = self.packed.take(np.asarray(indices, dtype=np.int64))
        if fields is None:
            return taken
        return PackedSamples(
            logical_indices=taken.logical_indices, physical_indices=taken.physical_indices, n_atoms=taken.n_atoms,
            n_edges=taken.n_edges, fields={n: taken.fields[n] for n in fields}, levels={n: taken.levels[n] for n in fields},
        )  # fmt: skip

    def close(self) -> None:
        pass


def _structures(n: int = 57) -> PackedSamples:
    rng = np.random.default_rng(5)
    samples = []
    for _ in range(n):
        atoms, edges = int(rng.integers(2, 9)), int(rng.integers(0, 12))
        samples.append(
            {
                "positions": rng.normal(size=(atoms, 3)).astype(np.float32),
                "atomic_numbers": rng.integers(1, 9, size=atoms).astype(np.int64),
                "neighbor_list": rng.integers(0, atoms, size=(edges, 2)).astype(np.int64),
                "energy": rng.normal(size=(1, 1)),
            }
        )
    return PackedSamples.from_samples(samples)


class TestMemoryReader(PackedReaderTests):
    def make_reader(self) -> MemoryReader:
        return MemoryReader(_structures())

    def expected(self) -> PackedSamples:
        return _structures()


@pytest.mark.parametrize(
    "make", [pytest.param("dali", marks=pytest.mark.dali), pytest.param("dali-w2", marks=pytest.mark.dali), "plain"]
)
def test_both_loaders_read_any_packed_reader(make: str) -> None:
    reader = MemoryReader(_structures())
    options: dict[str, Any] = {"batch_size": 10, "seed": 2}
    if make == "plain":
        loader: Any = plain_dataloader(reader, num_workers=0, batched=True, **options)
    else:
        from dali_alchemi import DALIDataLoader  # imports DALI: only in the dali-marked cases

        workers = 2 if make == "dali-w2" else 0
        loader = DALIDataLoader(reader, device="cpu", num_workers=workers, batches_per_window=2, **options)
    try:
        batches = list(loader)
        assert [b.num_graphs for b in batches] == [10] * 5 + [7]
        for batch, indices in zip(batches, loader.plan.epoch(0).batches(), strict=True):
            want = Batch.from_packed(reader.read_packed(indices))
            assert batch.sample_indices.tolist() == indices.tolist()
            for name in want.fields:
                assert torch.equal(batch[name], want[name]), name
            assert torch.equal(batch.batch_idx, want.batch_idx)
    finally:
        loader.close()
