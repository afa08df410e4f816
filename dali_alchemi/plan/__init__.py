"""Index planning: which structures form which batch, per epoch and shard (pure numpy, no I/O).

:class:`Plan` is the seam every loader plans through and :class:`EpochPlan` what a plan returns. One
module per policy: ``base`` (the seam), ``order`` (permutations, sharding), ``fixed``
(:class:`FixedBatchPlan`, ``batch_size`` structures per batch), ``budget`` (:class:`BudgetPlan`,
batches bounded by atoms and edges), ``mixture`` (:class:`MixturePlan`, several datasets at set
rates), ``block`` (:class:`BlockShufflePlan`, a chunk-aware shuffle with elastic resume), ``quality``
(how well an order is shuffled, as numbers), ``recorded`` (:class:`RecordedPlan`, an epoch drawn from a
torch sampler) and ``arguments`` (the loaders' plan arguments -> a plan).
"""

from __future__ import annotations

from dali_alchemi.plan.arguments import (
    DEFAULT_BATCH_SIZE,
    PadShape,
    PlanArguments,
    build_plan,
    pad_shape,
    reader_plan,
)
from dali_alchemi.plan.base import ElasticPlan, EpochPlan, Plan, Window, restore
from dali_alchemi.plan.block import BlockShuffle, BlockShufflePlan
from dali_alchemi.plan.budget import BudgetPlan, pack_greedy
from dali_alchemi.plan.fixed import FixedBatchPlan
from dali_alchemi.plan.mixture import MixturePlan
from dali_alchemi.plan.order import epoch_order, resolve_shard, shard
from dali_alchemi.plan.quality import batch_ks, gap_quality, shuffle_quality
from dali_alchemi.plan.recorded import RecordedPlan
from dali_alchemi.plan.spans import StoreChunking, store_chunking

__all__ = [
    "DEFAULT_BATCH_SIZE", "BlockShuffle", "BlockShufflePlan", "BudgetPlan", "ElasticPlan", "EpochPlan",
    "FixedBatchPlan", "MixturePlan", "PadShape", "Plan", "PlanArguments", "RecordedPlan", "StoreChunking",
    "Window", "batch_ks", "build_plan", "epoch_order", "gap_quality", "pack_greedy", "pad_shape",
    "reader_plan", "resolve_shard", "restore", "shard", "shuffle_quality", "store_chunking"
]
