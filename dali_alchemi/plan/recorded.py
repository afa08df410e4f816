"""RecordedPlan: an epoch decided elsewhere (a torch sampler, a batch sampler), kept as plain arrays.

Samplers are Python iterators that may draw from torch's global generator, so they cannot be replayed
inside a DALI worker. A loader that honours a sampler therefore draws one epoch from it in the training
process, records the batches it yielded with :meth:`RecordedPlan.from_batches` (one concatenation, no
loop per structure) and hands that plan to the pipeline. The plan is pure data: its one epoch is the
recorded one, and asking for any other epoch is an error rather than a silent guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dali_alchemi.errors import EmptyBatchError, PlanError, SampleIndexError
from dali_alchemi.plan.base import EpochPlan

__all__ = ["RecordedPlan"]


@dataclass(frozen=True, slots=True)
class RecordedPlan:
    """One recorded epoch over a reader of ``num_samples`` structures.

    Attributes
    ----------
    num_samples
        The length of the reader the indices refer to.
    recorded
        The epoch's plan: ``order`` is every batch's indices concatenated, ``batch_ptr`` where each
        batch ends.

    Raises
    ------
    SampleIndexError
        At construction, for an index outside ``[0, num_samples)`` (nvalchemi's message; an ``IndexError``).
    """

    num_samples: int
    recorded: EpochPlan

    def __post_init__(self) -> None:
        order = np.asarray(self.recorded.order)
        if order.size and (int(order.min()) < 0 or int(order.max()) >= self.num_samples):
            bad = order[(order < 0) | (order >= self.num_samples)]
            raise SampleIndexError(f"Index {int(bad[0])} out of range for reader with {self.num_samples} samples")

    @classmethod
    def from_batches(cls, batches: Sequence[Sequence[int]], *, num_samples: int, epoch: int = 0) -> RecordedPlan:
        """The plan whose batches are exactly ``batches``, in order (negative indices count from the end).

        Raises
        ------
        EmptyBatchError
            If a batch is empty (nvalchemi's message: it cannot make a Batch of nothing; a ``ValueError``).
        SampleIndexError
            For an index out of range.
        """
        sizes = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
        if sizes.size and int(sizes.min()) == 0:
            raise EmptyBatchError("Cannot create batch from empty data list")
        order = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if batches else np.zeros(0, np.int64)
        order = np.where(order < 0, order + num_samples, order)
        ptr = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=ptr[1:])
        return cls(num_samples=num_samples, recorded=EpochPlan(epoch=epoch, order=order, batch_ptr=ptr))

    def epoch(self, epoch: int) -> EpochPlan:
        """The recorded epoch; any other epoch was never recorded.

        Raises
        ------
        PlanError
            If ``epoch`` is not the recorded one.
        """
        if epoch != self.recorded.epoch:
            raise PlanError(f"This plan recorded epoch {self.recorded.epoch} only, not epoch {epoch}")
        return self.recorded

    def to_dict(self) -> dict[str, Any]:
        """The plan's identity: its kind, length, epoch and batch count (not the indices themselves)."""
        return {
            "kind": "recorded",
            "num_samples": self.num_samples,
            "epoch": self.recorded.epoch,
            "num_batches": self.recorded.num_batches,
        }
