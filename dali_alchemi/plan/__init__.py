"""Index planning: which structures form which batch, per epoch and shard (pure numpy, no I/O).

:class:`Plan` is the seam every loader plans through and :class:`EpochPlan` what a plan returns;
:class:`FixedBatchPlan` is the plan the loaders build from ``batch_size``/``shuffle``/``seed``/
``drop_last`` and the shard. One module per policy: ``base`` (the seam), ``order`` (permutations,
sharding), ``fixed`` (fixed-size batches).
"""

from __future__ import annotations

from dali_alchemi.plan.base import EpochPlan, Plan, Window
from dali_alchemi.plan.fixed import DEFAULT_BATCH_SIZE, FixedBatchPlan, plan_from_arguments
from dali_alchemi.plan.order import epoch_order, resolve_shard, shard

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "EpochPlan",
    "FixedBatchPlan",
    "Plan",
    "Window",
    "epoch_order",
    "plan_from_arguments",
    "resolve_shard",
    "shard",
]
