"""FixedBatchPlan: today's plan, batches of ``batch_size`` structures over a shuffled or sequential order."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dali_alchemi.errors import PlanError
from dali_alchemi.plan.base import EpochPlan
from dali_alchemi.plan.order import resolve_permutation, shard_order

__all__ = ["FixedBatchPlan"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FixedBatchPlan:
    """Batches of ``batch_size`` structures; the last one of an epoch may be smaller (or dropped).

    Parameters
    ----------
    num_samples
        Structures in the dataset (the reader's length).
    batch_size
        Structures per batch.
    shuffle, seed
        Shuffle with a permutation seeded by ``(seed, epoch)``; ``False`` visits structures in order.
    drop_last
        Drop a shard's last batch when it is smaller than ``batch_size``.
    shard_id, num_shards
        This shard and the shard count; every shard has the same number of batches (the order is
        padded by wrapping, like ``DistributedSampler``).
    permutation
        ``"auto"`` (default), ``"drawn"`` or ``"keyed"``: how a shuffled order is made (see
        :mod:`dali_alchemi.plan.order`); ``"auto"`` keys it from
        :data:`~dali_alchemi.plan.order.KEYED_MIN_SAMPLES` structures on. Resolved at construction.

    Raises
    ------
    PlanError
        At construction, naming the setting that is out of range.
    """

    num_samples: int
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    shard_id: int = 0
    num_shards: int = 1
    permutation: str = "auto"

    def __post_init__(self) -> None:
        for name in ("batch_size", "num_shards"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise PlanError(f"{name} must be a positive integer, got {value!r}")
        if (
            isinstance(self.num_samples, bool)
            or not isinstance(self.num_samples, (int, np.integer))
            or self.num_samples < 0
        ):
            raise PlanError(f"num_samples must be a non-negative integer, got {self.num_samples!r}")
        if not isinstance(self.shard_id, (int, np.integer)) or not 0 <= self.shard_id < self.num_shards:
            raise PlanError(f"shard_id must be in [0, {self.num_shards}), got {self.shard_id}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise PlanError(f"seed must be a non-negative integer, got {self.seed!r}")
        object.__setattr__(self, "permutation", resolve_permutation(self.permutation, self.num_samples, self.shuffle))

    @property
    def samples_per_shard(self) -> int:
        """Structures this shard sees per epoch, padding included."""
        return math.ceil(self.num_samples / self.num_shards) if self.num_samples else 0

    @property
    def num_batches(self) -> int:
        """Batches per epoch in every shard (the same for every epoch)."""
        if self.drop_last:
            return self.samples_per_shard // self.batch_size
        return math.ceil(self.samples_per_shard / self.batch_size)

    def epoch(self, epoch: int) -> EpochPlan:
        """This shard's epoch: its share of the seeded order, cut every ``batch_size`` structures."""
        mine = shard_order(
            self.num_samples, seed=self.seed, epoch=epoch, shuffle=self.shuffle, shard_id=self.shard_id,
            num_shards=self.num_shards, permutation=self.permutation,
        )  # fmt: skip
        ptr = np.minimum(np.arange(self.num_batches + 1, dtype=np.int64) * self.batch_size, mine.size)
        return EpochPlan(epoch=epoch, order=mine, batch_ptr=ptr)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the plan's kind and settings (benchmark records, loader state).

        ``permutation`` appears only when it is ``"keyed"``: a drawn order's identity is what it was
        before keyed orders existed, so states saved then restore, and states of a drawn order are
        refused by a keyed plan (and the other way round) rather than resumed in another order.
        """
        settings = asdict(self)
        if settings["permutation"] == "drawn":
            del settings["permutation"]
        return {"kind": "fixed", **settings}
