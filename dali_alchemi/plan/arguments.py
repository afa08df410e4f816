"""From the loaders' plan arguments to a plan: the one place both loaders build (or check) theirs.

``batch_size``, ``shuffle``, ``seed``, ``drop_last``, the shard and the budgets mean the same in
:class:`~dali_alchemi.pipeline.loader.DALIDataLoader` and :func:`~dali_alchemi.baseline.plain_dataloader`
because both hand them to :func:`build_plan`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from dali_alchemi.errors import ConfigTypeError, PlanError
from dali_alchemi.plan.base import Plan
from dali_alchemi.plan.block import BlockShuffle, BlockShufflePlan, block_plan, block_sizes
from dali_alchemi.plan.budget import BudgetPlan
from dali_alchemi.plan.fixed import FixedBatchPlan
from dali_alchemi.plan.mixture import MixturePlan
from dali_alchemi.plan.order import resolve_shard
from dali_alchemi.plan.spans import StoreChunking, store_chunking

if TYPE_CHECKING:
    from dali_alchemi.store.format.protocol import PackedReader
    from dali_alchemi.types import CountArray, IndexArray

__all__ = [
    "DEFAULT_BATCH_SIZE", "PadShape", "PlanArguments", "build_plan", "pad_shape", "reader_plan",
    "shuffle_mode"
]


DEFAULT_BATCH_SIZE = 64
"""Structures per batch when neither ``batch_size``, a budget nor a plan is given."""


def shuffle_mode(shuffle: object) -> str | BlockShuffle:
    """``"global"`` (a full permutation), ``"sequential"``, or the :class:`BlockShuffle` settings.

    Raises
    ------
    PlanError
        Listing the choices, for anything else.
    """
    if isinstance(shuffle, BlockShuffle):
        return shuffle
    if shuffle is True or shuffle is np.True_ or shuffle == "global":
        return "global"
    if shuffle is False or shuffle is np.False_ or shuffle == "sequential":
        return "sequential"
    if shuffle == "block":
        return BlockShuffle()
    raise PlanError(
        f"shuffle must be one of True, False, 'global', 'sequential', 'block' or a BlockShuffle, got {shuffle!r}"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanArguments:
    """The loaders' arguments that describe a plan; the defaults are the loaders' defaults.

    ``batch_size=None`` means 64 structures per batch, or, with ``max_atoms``/``max_edges``, no cap on
    structures (a given ``batch_size`` then caps them).
    """

    batch_size: int | None = None
    shuffle: bool | str | BlockShuffle = True
    seed: int = 0
    drop_last: bool = False
    shard_id: int | None = None
    num_shards: int | None = None
    max_atoms: int | None = None
    max_edges: int | None = None
    oversized: str = "error"
    pad: bool = False
    weights: Sequence[float] | None = None
    samples_per_dataset: Sequence[int | float] | None = None
    epoch_policy: str | None = None

    def __post_init__(self) -> None:
        for name in ("weights", "samples_per_dataset"):  # held as tuples: plain data that compares equal
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(value))

    @property
    def mixture(self) -> bool:
        """Whether the arguments ask for a mixture of several datasets (weights, counts or a policy)."""
        return self.weights is not None or self.samples_per_dataset is not None or self.epoch_policy is not None

    def given(self) -> list[str]:
        """The arguments set to something other than their default (seed aside: it also seeds augmentations)."""
        return [f.name for f in fields(self) if f.name != "seed" and getattr(self, f.name) != f.default]


def reader_plan(
    plan: Plan | None,
    arguments: PlanArguments,
    reader: PackedReader,
    fields: Sequence[str],
    sample_sizes: Callable[[], tuple[CountArray, CountArray]],
) -> Plan:
    """:func:`build_plan` for a loader reading ``fields`` of ``reader`` (its chunking, its datasets' lengths)."""
    from dali_alchemi.store.read.multi import MultiReader  # the readers stay out of plan/'s imports (numpy only)

    return build_plan(
        plan, arguments, len(reader), sample_sizes, chunking=lambda: store_chunking(reader, fields),
        dataset_lengths=reader.lengths if isinstance(reader, MultiReader) and not reader.one_dataset else None,
    )  # fmt: skip


def build_plan(
    plan: Plan | None,
    arguments: PlanArguments,
    num_samples: int,
    sample_sizes: Callable[[], tuple[CountArray, CountArray]],
    chunking: Callable[[], StoreChunking] | None = None,
    dataset_lengths: Sequence[int] | None = None,
) -> Plan:
    """``plan`` checked against the reader, or the plan the arguments describe.

    Without a budget that is a :class:`FixedBatchPlan`; with ``max_atoms`` and/or ``max_edges`` a
    :class:`BudgetPlan` over the sizes ``sample_sizes()`` returns (called only then; it must read no
    data). ``shuffle="block"`` (or a :class:`BlockShuffle`) makes a :class:`BlockShufflePlan` of
    either kind of batches, its spans and buffer sizes from ``chunking()`` (called only then; ``None``:
    fixed-size spans). With ``weights``, ``samples_per_dataset`` or ``epoch_policy`` it is a
    :class:`MixturePlan` over the datasets of ``dataset_lengths`` (a MultiReader's ``lengths``): fixed
    counts per batch, or with a budget, per epoch. As with torch's ``batch_sampler``, a plan excludes the
    arguments that would build one.

    Raises
    ------
    PlanError
        If ``plan`` is given with plan arguments, was made for another number of samples, or the
        arguments are inconsistent (see the plans' own checks).
    ConfigTypeError
        If ``plan`` does not implement :class:`Plan`.
    """
    a = arguments
    if plan is not None:
        given = a.given()
        if given:
            raise PlanError(f"plan= is mutually exclusive with {', '.join(given)}: the plan decides the batches")
        if not isinstance(plan, Plan):
            raise ConfigTypeError(
                f"plan must implement dali_alchemi.plan.Plan (epoch, num_samples, to_dict), got {plan!r}"
            )
        if plan.num_samples != num_samples:
            raise PlanError(f"the plan was made for {plan.num_samples} samples, but the reader has {num_samples}")
        return plan
    shard, shards = resolve_shard(a.shard_id, a.num_shards)
    mode = shuffle_mode(a.shuffle)
    shuffle = mode == "global"
    if a.mixture:
        block = block_sizes(mode, num_samples, chunking, sample_sizes) if isinstance(mode, BlockShuffle) else None
        return _mixture_plan(a, sample_sizes, dataset_lengths, shard, shards, shuffle or block is not None, block)
    budget: BudgetPlan | None = None
    if a.pad:
        budget = _padded_plan(a, sample_sizes, shard, shards, shuffle)
    elif a.max_atoms is None and a.max_edges is None:
        if a.oversized != "error":
            raise PlanError("oversized= only applies with max_atoms or max_edges")
    else:
        n_atoms, n_edges = sample_sizes()
        budget = BudgetPlan(
            n_atoms=n_atoms, n_edges=n_edges, max_atoms=a.max_atoms, max_edges=a.max_edges,
            max_structures=a.batch_size, shuffle=shuffle, seed=a.seed, drop_last=a.drop_last, shard_id=shard,
            num_shards=shards, oversized=a.oversized,
        )  # fmt: skip
    if isinstance(mode, BlockShuffle):
        return block_plan(
            mode, num_samples=num_samples, batch_size=DEFAULT_BATCH_SIZE if a.batch_size is None else a.batch_size,
            budget=budget, seed=a.seed, drop_last=a.drop_last, shard_id=shard, num_shards=shards,
            chunking=chunking, sample_sizes=sample_sizes,
        )  # fmt: skip
    if budget is not None:
        return budget
    return FixedBatchPlan(
        num_samples=num_samples, batch_size=DEFAULT_BATCH_SIZE if a.batch_size is None else a.batch_size,
        shuffle=shuffle, seed=a.seed, drop_last=a.drop_last, shard_id=shard, num_shards=shards,
    )  # fmt: skip


def _mixture_plan(
    a: PlanArguments,
    sample_sizes: Callable[[], tuple[CountArray, CountArray]],
    dataset_lengths: Sequence[int] | None,
    shard: int,
    shards: int,
    shuffle: bool,
    block: tuple[IndexArray, int] | None = None,
) -> MixturePlan:
    """The :class:`MixturePlan` of ``weights``/``samples_per_dataset``/``epoch_policy`` over several datasets."""
    if dataset_lengths is None:
        raise PlanError(
            "weights, samples_per_dataset and epoch_policy mix several datasets: pass a list of stores or "
            "readers, or a MultiReader"
        )
    budgeted = a.max_atoms is not None or a.max_edges is not None
    if not budgeted and a.oversized != "error":
        raise PlanError("oversized= only applies with max_atoms or max_edges")
    n_atoms, n_edges = sample_sizes() if budgeted else (None, None)
    max_atoms, max_edges = a.max_atoms, a.max_edges
    if a.pad:  # the padded budget plan's checks and budgets (one row of each kept for padding)
        padded = _padded_plan(a, lambda: (n_atoms, n_edges), shard, shards, shuffle)  # type: ignore[arg-type,return-value]
        max_atoms, max_edges = padded.max_atoms, padded.max_edges
    batch_size = DEFAULT_BATCH_SIZE if a.batch_size is None and not budgeted else a.batch_size
    return MixturePlan(
        lengths=tuple(dataset_lengths), batch_size=batch_size,
        weights=None if a.weights is None else tuple(a.weights),
        samples_per_dataset=None if a.samples_per_dataset is None else tuple(a.samples_per_dataset),
        epoch_policy="dataset_size" if a.epoch_policy is None else a.epoch_policy,
        shuffle=shuffle, seed=a.seed, drop_last=a.drop_last, shard_id=shard, num_shards=shards,
        n_atoms=n_atoms, n_edges=n_edges, max_atoms=max_atoms, max_edges=max_edges, oversized=a.oversized,
        span_bounds=None if block is None else tuple(block[0].tolist()), buffer_spans=1 if block is None else block[1],
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class PadShape:
    """The fixed shape every padded batch gets: atom rows, edge rows and structures."""

    max_atoms: int
    max_edges: int
    max_structures: int

    def to_kwargs(self) -> dict[str, int]:
        """The keyword arguments of :func:`~dali_alchemi.padding.pad_batch`."""
        return {"max_atoms": self.max_atoms, "max_edges": self.max_edges, "max_structures": self.max_structures}


def _padded_plan(
    a: PlanArguments,
    sample_sizes: Callable[[], tuple[CountArray, CountArray]],
    shard: int,
    shards: int,
    shuffle: bool,
) -> BudgetPlan:
    """The budget plan behind ``pad=True``: one atom, one edge and one structure kept free for padding.

    :func:`~dali_alchemi.padding.pad_batch` puts the padding atoms and edges in a padding structure of
    their own, and the padding edges on padding atoms, so a padded batch needs room for one of each.
    """
    if a.max_atoms is None or a.max_atoms < 2:
        raise PlanError(f"pad=True needs max_atoms (at least 2: one row is kept for padding), got {a.max_atoms!r}")
    if a.max_edges is None or a.max_edges < 2:
        raise PlanError(f"pad=True needs max_edges (at least 2: one row is kept for padding), got {a.max_edges!r}")
    if a.oversized != "error":
        raise PlanError("pad=True cannot hold a structure larger than the budgets: oversized= must be 'error'")
    n_atoms, n_edges = sample_sizes()
    for name, sizes, budget, unit in (
        ("max_atoms", n_atoms, a.max_atoms, "atoms"),
        ("max_edges", n_edges, a.max_edges, "edges"),
    ):
        if sizes.size and int(sizes.max()) > budget - 1:
            worst = int(np.argmax(sizes))
            raise PlanError(
                f"structure {worst} has {int(sizes[worst])} {unit}; with pad=True a batch holds at most "
                f"{name} - 1 = {budget - 1} real {unit} (one row is kept for padding): raise {name}"
            )
    return BudgetPlan(
        n_atoms=n_atoms, n_edges=n_edges, max_atoms=a.max_atoms - 1, max_edges=a.max_edges - 1,
        max_structures=None if a.batch_size is None else a.batch_size, shuffle=shuffle, seed=a.seed,
        drop_last=a.drop_last, shard_id=shard, num_shards=shards, oversized="error",
    )  # fmt: skip


def pad_shape(a: PlanArguments, plan: Plan) -> PadShape | None:
    """The padded shape for ``pad=True`` (``None`` without it), from the plan :func:`build_plan` made.

    The structure count is ``batch_size + 1`` when ``batch_size`` caps the batches, else one more than
    the most structures a batch of the store's smallest structures can hold under the budgets.

    Raises
    ------
    PlanError
        If no structure count can be bounded (structures with no atoms and no edges, and no
        ``batch_size``).
    """
    if not a.pad:
        return None
    budget = plan.budget if isinstance(plan, BlockShufflePlan) else plan
    assert isinstance(budget, (BudgetPlan, MixturePlan)) and a.max_atoms is not None and a.max_edges is not None
    assert budget.n_atoms is not None and budget.n_edges is not None
    if a.batch_size is not None:
        most = a.batch_size
    else:
        bounds = [
            limit // int(sizes.min())
            for limit, sizes in ((budget.max_atoms, budget.n_atoms), (budget.max_edges, budget.n_edges))
            if limit is not None and sizes.size and int(sizes.min()) > 0
        ]
        if not bounds and budget.num_samples:
            raise PlanError("pad=True cannot bound the structures per batch (some have no atoms): give batch_size")
        most = min(bounds) if bounds else 1
    return PadShape(max_atoms=a.max_atoms, max_edges=a.max_edges, max_structures=most + 1)
