"""From the loaders' plan arguments to a plan: the one place both loaders build (or check) theirs.

``batch_size``, ``shuffle``, ``seed``, ``drop_last``, the shard and the budgets mean the same in
:class:`~dali_alchemi.pipeline.loader.DALIDataLoader` and :func:`~dali_alchemi.baseline.plain_dataloader`
because both hand them to :func:`build_plan`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from dali_alchemi.errors import PlanError
from dali_alchemi.plan.base import Plan
from dali_alchemi.plan.budget import BudgetPlan
from dali_alchemi.plan.fixed import FixedBatchPlan
from dali_alchemi.plan.order import resolve_shard

if TYPE_CHECKING:
    from dali_alchemi.types import CountArray

DEFAULT_BATCH_SIZE = 64
"""Structures per batch when neither ``batch_size``, a budget nor a plan is given."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanArguments:
    """The loaders' arguments that describe a plan; the defaults are the loaders' defaults.

    ``batch_size=None`` means 64 structures per batch, or, with ``max_atoms``/``max_edges``, no cap on
    structures (a given ``batch_size`` then caps them).
    """

    batch_size: int | None = None
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    shard_id: int | None = None
    num_shards: int | None = None
    max_atoms: int | None = None
    max_edges: int | None = None
    oversized: str = "error"

    def given(self) -> list[str]:
        """The arguments set to something other than their default (seed aside: it also seeds augmentations)."""
        return [
            f.name for f in fields(self) if f.name != "seed" and getattr(self, f.name) != f.default
        ]


def build_plan(
    plan: Plan | None,
    arguments: PlanArguments,
    num_samples: int,
    sample_sizes: Callable[[], tuple[CountArray, CountArray]],
) -> Plan:
    """``plan`` checked against the reader, or the plan the arguments describe.

    Without a budget that is a :class:`FixedBatchPlan`; with ``max_atoms`` and/or ``max_edges`` a
    :class:`BudgetPlan` over the sizes ``sample_sizes()`` returns (called only then; it must read no
    data). As with torch's ``batch_sampler``, a plan excludes the arguments that would build one.

    Raises
    ------
    PlanError
        If ``plan`` is given with plan arguments, was made for another number of samples, or the
        arguments are inconsistent (see the plans' own checks).
    TypeError
        If ``plan`` does not implement :class:`Plan`.
    """
    a = arguments
    if plan is not None:
        given = a.given()
        if given:
            raise PlanError(f"plan= is mutually exclusive with {', '.join(given)}: the plan decides the batches")
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must implement dali_alchemi.plan.Plan (epoch, num_samples, to_dict), got {plan!r}")
        if plan.num_samples != num_samples:
            raise PlanError(f"the plan was made for {plan.num_samples} samples, but the reader has {num_samples}")
        return plan
    shard, shards = resolve_shard(a.shard_id, a.num_shards)
    if a.max_atoms is None and a.max_edges is None:
        if a.oversized != "error":
            raise PlanError("oversized= only applies with max_atoms or max_edges")
        return FixedBatchPlan(
            num_samples=num_samples, batch_size=DEFAULT_BATCH_SIZE if a.batch_size is None else a.batch_size,
            shuffle=a.shuffle, seed=a.seed, drop_last=a.drop_last, shard_id=shard, num_shards=shards,
        )  # fmt: skip
    n_atoms, n_edges = sample_sizes()
    return BudgetPlan(
        n_atoms=n_atoms, n_edges=n_edges, max_atoms=a.max_atoms, max_edges=a.max_edges, max_structures=a.batch_size,
        shuffle=a.shuffle, seed=a.seed, drop_last=a.drop_last, shard_id=shard, num_shards=shards,
        oversized=a.oversized,
    )  # fmt: skip
