"""Orders and shards: seeded permutations and the DistributedSampler padding rule, plus the default shard.

An epoch's order is a function of ``(seed, epoch)`` alone. Sharding follows
``torch.utils.data.DistributedSampler``: the order is padded by wrapping around until it divides
evenly, and shard ``r`` takes every ``num_shards``-th index starting at ``r``; every shard therefore has
the same number of samples. Pure numpy, except :func:`resolve_shard`, which asks torch.distributed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from dali_alchemi.errors import PlanError

if TYPE_CHECKING:
    from dali_alchemi.types import IndexArray

__all__ = ["epoch_order", "resolve_shard", "shard"]


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


def resolve_shard(shard_id: int | None, num_shards: int | None) -> tuple[int, int]:
    """An explicit shard, else this rank of an initialised torch.distributed group, else ``(0, 1)``.

    Both loaders use this one rule, so under ``torchrun`` every loader shards by rank unless told otherwise.

    Raises
    ------
    PlanError
        If only one of ``shard_id`` and ``num_shards`` is given.
    """
    if (shard_id is None) != (num_shards is None):
        raise PlanError("shard_id and num_shards must be given together (or both left to torch.distributed)")
    if shard_id is not None and num_shards is not None:
        return shard_id, num_shards
    import torch.distributed as dist  # only here: the rest of planning needs no torch

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
