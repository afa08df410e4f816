"""The reference a loader's Batches are checked against: the reader plus Batch.from_samples, batch by batch.

Needs neither DALI nor a GPU, so the tests of every loader (DALI's, the plain torch one, the iterator
fed by hand) share it.
"""

from __future__ import annotations

import numpy as np
import torch

from dali_alchemi import AtomicDataZarrReader, Batch
from dali_alchemi.planning import SamplePlan


def _reference(reader: AtomicDataZarrReader, plan: SamplePlan, epoch: int, first_batch: int = 0) -> list[Batch]:
    return [
        Batch.from_samples(
            [sample for sample, _ in reader.read_many(indices)], levels=reader.field_levels, sample_indices=indices
        )
        for indices in plan.batches(epoch, first_batch)
    ]


def _assert_batches_equal(got: list[Batch], want: list[Batch]) -> None:
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert set(a.fields) == set(b.fields), k
        for name in b.fields:
            assert a[name].dtype == b[name].dtype, (k, name)
            assert torch.equal(a[name].cpu(), b[name]), (k, name)
        assert torch.equal(a.batch_idx.cpu(), b.batch_idx) and torch.equal(a.batch_ptr.cpu(), b.batch_ptr)
        assert a.num_nodes_list == b.num_nodes_list and a.num_edges_list == b.num_edges_list
        assert np.array_equal(a.sample_indices, b.sample_indices), k
