"""Index planning: which samples form which batch, per epoch and shard, and how batches group into windows.

Pure numpy; no I/O, no torch, no DALI. An epoch's order is a function of ``(seed, epoch)`` alone, so
any process (a DALI worker, another rank, a resumed job) can rebuild it. Sharding follows
``torch.utils.data.DistributedSampler``: the order is padded by wrapping around until it divides
evenly, and shard ``r`` takes every ``num_shards``-th index starting at ``r``; every shard therefore has
the same number of samples and batches, so collective operations never deadlock at the end of an
epoch. Windows (``batches_per_window`` consecutive batches) only decide how samples are *read*
together; they never change which samples form a batch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from dali_alchemi.types import IndexArray


def epoch_order(n: int, *, seed: int, epoch: int, shuffle: bool) -> IndexArray:
    """The order of ``n`` samples in ``epoch``: a permutation seeded by ``(seed, epoch)``, or ``arange``."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, epoch])))
    return rng.permutation(n).astype(np.int64)


def shard(order: IndexArray, *, shard_id: int, num_shards: int) -> IndexArray:
    """Shard ``shard_id`` of ``order``, padded by wrapping like ``DistributedSampler(drop_last=False)``."""
    per_shard = math.ceil(order.size / num_shards) if order.size else 0
    padded = np.resize(order, per_shard * num_shards) if order.size else order
    return padded[shard_id::num_shards]


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplePlan:
    """How an epoch of ``num_samples`` samples is sharded, shuffled and cut into batches and windows.

    Parameters
    ----------
    num_samples
        Samples in the dataset (the reader's length).
    batch_size
        Samples per batch.
    shuffle, seed
        Shuffle with a permutation seeded by ``(seed, epoch)``.
    drop_last
        Drop a shard's last batch when it is smaller than ``batch_size``.
    shard_id, num_shards
        This shard and the shard count (see the module docstring for the padding policy).
    batches_per_window
        Consecutive batches read together in one call to the reader.
    """

    num_samples: int
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    shard_id: int = 0
    num_shards: int = 1
    batches_per_window: int = 16

    def __post_init__(self) -> None:
        for name in ("batch_size", "num_shards", "batches_per_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.num_samples, int) or self.num_samples < 0:
            raise ValueError(f"num_samples must be a non-negative integer, got {self.num_samples!r}")
        if not 0 <= self.shard_id < self.num_shards:
            raise ValueError(f"shard_id must be in [0, {self.num_shards}), got {self.shard_id}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def samples_per_shard(self) -> int:
        """Samples this shard sees per epoch, padding included."""
        return math.ceil(self.num_samples / self.num_shards) if self.num_samples else 0

    @property
    def num_batches(self) -> int:
        """Batches per epoch in every shard."""
        if self.drop_last:
            return self.samples_per_shard // self.batch_size
        return math.ceil(self.samples_per_shard / self.batch_size)

    def shard_order(self, epoch: int) -> IndexArray:
        """This shard's samples for ``epoch``, in order (``samples_per_shard`` logical indices)."""
        order = epoch_order(self.num_samples, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        return shard(order, shard_id=self.shard_id, num_shards=self.num_shards)

    def batch_bounds(self, first_batch: int = 0) -> IndexArray:
        """``[k + 1]`` offsets into :meth:`shard_order` of batches ``first_batch, first_batch + 1, ...``."""
        self._check_batch(first_batch)
        starts = np.arange(first_batch, self.num_batches + 1, dtype=np.int64) * self.batch_size
        return np.minimum(starts, self.samples_per_shard)

    def num_windows(self, first_batch: int = 0) -> int:
        """Windows needed for batches ``first_batch`` to the end of the epoch."""
        self._check_batch(first_batch)
        return math.ceil((self.num_batches - first_batch) / self.batches_per_window)

    def window(
        self, epoch: int, window: int, first_batch: int = 0, order: IndexArray | None = None
    ) -> tuple[IndexArray, IndexArray]:
        """Window ``window`` of ``epoch`` when the epoch resumes at ``first_batch``.

        Returns the window's indices (its batches, concatenated) and ``[b + 1]`` batch offsets into
        them. ``order`` may pass a precomputed :meth:`shard_order` for ``epoch``.

        Raises
        ------
        IndexError
            If ``window`` is past the end of the epoch.
        """
        n_windows = self.num_windows(first_batch)
        if not 0 <= window < n_windows:
            raise IndexError(
                f"window {window} out of range: the epoch has {n_windows} windows from batch {first_batch}"
            )
        if order is None:
            order = self.shard_order(epoch)
        b0 = first_batch + window * self.batches_per_window
        b1 = min(b0 + self.batches_per_window, self.num_batches)
        lo = b0 * self.batch_size
        hi = min(b1 * self.batch_size, self.samples_per_shard)
        bounds = np.minimum(np.arange(b0, b1 + 1, dtype=np.int64) * self.batch_size, hi) - lo
        return order[lo:hi], bounds

    def batches(self, epoch: int, first_batch: int = 0) -> list[IndexArray]:
        """Every batch of ``epoch`` from ``first_batch`` on, as index arrays (the reference view of the plan)."""
        order = self.shard_order(epoch)
        bounds = self.batch_bounds(first_batch)
        return [order[bounds[i] : bounds[i + 1]] for i in range(bounds.size - 1)]

    def _check_batch(self, first_batch: int) -> None:
        if not 0 <= first_batch <= self.num_batches:
            raise ValueError(f"first_batch must be in [0, {self.num_batches}], got {first_batch}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for benchmark records and loader state)."""
        return asdict(self)
