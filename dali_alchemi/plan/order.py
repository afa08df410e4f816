"""Orders and shards: seeded permutations and the DistributedSampler padding rule, plus the default shard.

An epoch's order is a function of ``(seed, epoch)`` alone. Sharding follows
``torch.utils.data.DistributedSampler``: the order is padded by wrapping around until it divides
evenly, and shard ``r`` takes every ``num_shards``-th index starting at ``r``; every shard therefore has
the same number of samples. Pure numpy, except :func:`resolve_shard`, which asks torch.distributed.

Two permutations exist. ``"drawn"`` is ``rng.permutation(n)`` seeded by ``(seed, epoch)``: the whole
order at once, 8 bytes per structure in every process. ``"keyed"`` is
:func:`~dali_alchemi.plan.keyed.keyed_order`, evaluated at a shard's own positions only. ``"auto"``
(the plans' default) draws below :data:`KEYED_MIN_SAMPLES` structures, so the orders of smaller
datasets (and their saved states) stay as they were, and keys above it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from dali_alchemi.errors import PlanError
from dali_alchemi.plan.keyed import ShardOrder, keyed_shard

if TYPE_CHECKING:
    from dali_alchemi.types import IndexArray

__all__ = [
    "KEYED_MIN_SAMPLES",
    "PERMUTATIONS",
    "epoch_order",
    "resolve_permutation",
    "resolve_shard",
    "shard",
    "shard_order",
]


KEYED_MIN_SAMPLES = 1 << 23
"""From this many structures (8,388,608) on, ``permutation="auto"`` means the keyed permutation: a
drawn one would hold 64 MiB and more in every rank."""

PERMUTATIONS = ("auto", "drawn", "keyed")
"""The plans' ``permutation=`` choices: by size, ``rng.permutation`` drawn whole, or keyed per position."""


def resolve_permutation(permutation: str, num_samples: int, shuffle: bool) -> str:
    """``"drawn"`` or ``"keyed"``: what ``permutation`` means for ``num_samples`` structures.

    Without ``shuffle`` the order is ``arange`` either way, and it is called ``"drawn"`` (the plans'
    identity then has no ``permutation`` entry, as before the keyed one existed).

    Raises
    ------
    PlanError
        If ``permutation`` is not one of :data:`PERMUTATIONS`.
    """
    if not isinstance(permutation, str) or permutation not in PERMUTATIONS:
        raise PlanError(f"permutation must be one of {PERMUTATIONS}, got {permutation!r}")
    if not shuffle:
        return "drawn"
    if permutation == "auto":
        return "keyed" if num_samples >= KEYED_MIN_SAMPLES else "drawn"
    return permutation


def epoch_order(n: int, *, seed: int, epoch: int, shuffle: bool) -> IndexArray:
    """The order of ``n`` samples in ``epoch``: a permutation seeded by ``(seed, epoch)``, or ``arange``."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, epoch])))
    return rng.permutation(n).astype(np.int64, copy=False)


def shard(order: IndexArray, *, shard_id: int, num_shards: int) -> IndexArray:
    """Shard ``shard_id`` of ``order``, padded by wrapping like ``DistributedSampler(drop_last=False)``."""
    per_shard = math.ceil(order.size / num_shards) if order.size else 0
    padded = np.resize(order, per_shard * num_shards) if order.size else order
    return padded[shard_id::num_shards]


def shard_order(
    n: int, *, seed: int, epoch: int, shuffle: bool, shard_id: int, num_shards: int, permutation: str
) -> IndexArray | ShardOrder:
    """``shard(epoch_order(...))`` of the ``"drawn"`` or ``"keyed"`` permutation, without a padded copy.

    The keyed permutation is evaluated at this shard's positions alone, and only when they are read (a
    :class:`~dali_alchemi.plan.keyed.ShardOrder`; so is an unshuffled order from
    :data:`KEYED_MIN_SAMPLES` structures on); the drawn one is drawn whole (it cannot be otherwise) but
    indexed at those positions instead of padded by ``np.resize``.
    """
    if permutation == "keyed" or (not shuffle and n >= KEYED_MIN_SAMPLES):
        return ShardOrder(n=n, seed=seed, epoch=epoch, shuffle=shuffle, shard_id=shard_id, num_shards=num_shards)
    if not shuffle:
        return keyed_shard(n, seed=seed, epoch=epoch, shuffle=False, shard_id=shard_id, num_shards=num_shards)
    positions = keyed_shard(n, seed=seed, epoch=epoch, shuffle=False, shard_id=shard_id, num_shards=num_shards)
    return epoch_order(n, seed=seed, epoch=epoch, shuffle=True)[positions]


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
