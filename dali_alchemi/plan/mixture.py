"""MixturePlan: epochs drawn from several datasets at set rates, as nvalchemi 0.2.0's multi-dataset samplers.

The plan indexes a :class:`~dali_alchemi.store.read.multi.MultiReader` (member ``d`` holds global indices
``offsets[d] ..``). How often each member is drawn follows nvalchemi's samplers:

- ``mix="batch"`` (``MultiDatasetBatchSampler``): every batch holds a fixed number of structures of
  each dataset: ``samples_per_dataset`` (integers: counts summing to ``batch_size``; floats: rates),
  or ``weights`` splitting ``batch_size`` (default: the dataset lengths), by largest remainder. The
  number of batches follows ``epoch_policy``: ``"dataset_size"`` is ``ceil(total / batch_size)`` with
  replacement and ``"min_size"`` without; ``"min_size"`` stops when the first contributing dataset
  runs out; ``"max_size"`` runs until the last one does (oversampling the others, so it needs
  replacement when they differ). ``ceil`` with replacement, ``floor`` without.
- ``mix="sample"`` (``MultiDatasetSampler``, and the only mix with atom or edge budgets): an epoch
  draws a fixed number of structures from each dataset (``weights`` times the epoch's length, by
  largest remainder), shuffled together, then cut into batches of ``batch_size`` or packed greedily
  under ``max_atoms``/``max_edges`` with :func:`~dali_alchemi.plan.budget.pack_greedy`. The epoch's
  length is ``num_samples``, else from ``epoch_policy``: ``"dataset_size"`` the total length (the
  sampler's default), ``"min_size"``/``"max_size"`` as above with rates in place of counts.

Each dataset's draws are successive passes over it, each pass a fresh permutation seeded by
``(seed, epoch, dataset)``: with replacement, a structure repeats only once the whole dataset has
been drawn (nvalchemi draws shuffled replacement samples independently; the counts per dataset are
the same). Without replacement a dataset is never drawn more than once per epoch. Within a batch,
structures come grouped by dataset (nvalchemi shuffles them; to a model a batch is a set, and grouped,
a MultiReader reads a window in a few runs per store instead of one per structure). Batches are dealt
to shards round-robin with :func:`~dali_alchemi.plan.budget.deal_batches` (whole batches repeat to
even them out). Everything is vectorised: the loops run once per dataset, never per structure.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.errors import PlanError
from dali_alchemi.plan.budget import BudgetPlan, deal_batches, pack_greedy
from dali_alchemi.plan.spans import block_order, check_span_bounds, local_spans

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.plan.base import EpochPlan
    from dali_alchemi.types import IndexArray

__all__ = ["EPOCH_POLICIES", "MIXES", "MixturePlan", "counts_from_weights", "normalise_weights", "pass_orders"]


EPOCH_POLICIES = ("dataset_size", "min_size", "max_size")
"""How the epoch's length follows from the datasets' lengths (nvalchemi's ``epoch_policy``)."""

MIXES = ("batch", "sample")
"""Fixed counts of each dataset in every batch, or fixed counts per epoch, shuffled together."""


def normalise_weights(weights: Any, lengths: tuple[int, ...]) -> NDArray[np.float64]:
    """Rates summing to 1, one per dataset (``None``: the lengths), checked as nvalchemi checks them."""
    values = np.asarray(lengths if weights is None else list(weights), dtype=np.float64)
    if values.shape != (len(lengths),):
        raise PlanError(f"Expected {len(lengths)} dataset weights, got {values.size}")
    if not np.isfinite(values).all():
        raise PlanError(f"Dataset weights must be finite, got {values.tolist()}")
    if (values < 0).any():
        raise PlanError(f"Dataset weights must be non-negative, got {values.tolist()}")
    if values.sum() <= 0:
        raise PlanError("At least one dataset weight must be positive")
    for d, (w, n) in enumerate(zip(values.tolist(), lengths, strict=True)):
        if w > 0 and n == 0:
            raise PlanError(f"Dataset {d} has positive weight but no samples")
    return np.asarray(values / values.sum(), dtype=np.float64)


def counts_from_weights(weights: NDArray[np.float64], total: int) -> NDArray[np.int64]:
    """``total`` split by ``weights``: floors, then one more to the largest remainders (ties: lowest index)."""
    raw = weights * total
    counts = np.floor(raw).astype(np.int64)
    remaining = total - int(counts.sum())
    if remaining > 0:
        counts[np.argsort(-(raw - counts), kind="stable")[:remaining]] += 1
    return counts


def pass_orders(
    length: int,
    count: int,
    *,
    rng: np.random.Generator,
    shuffle: bool,
    spans: IndexArray | None = None,
    buffer_spans: int = 1,
) -> IndexArray:
    """``count`` local indices of one dataset: successive passes over it, each a fresh permutation.

    This is the one place a dataset's order is made. With ``spans`` (the dataset's span offsets) each
    pass is a block order instead (:func:`~dali_alchemi.plan.spans.block_order`: spans shuffled, then
    ``buffer_spans`` spans at a time shuffled together), so consecutive draws stay in a few chunks.
    """
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    passes = math.ceil(count / length)
    if shuffle and spans is not None:
        orders = np.concatenate([block_order(spans, buffer_spans, rng) for _ in range(passes)])
    elif shuffle:
        orders = np.argsort(rng.random((passes, length)), axis=1).astype(np.int64)
    else:
        orders = np.broadcast_to(np.arange(length, dtype=np.int64), (passes, length))
    return orders.reshape(-1)[:count]


def _epoch_length(policy: str, lengths: list[int], per_unit: list[float], replacement: bool) -> int:
    """Units (batches, or samples) per epoch under ``policy``, for datasets drawn ``per_unit`` per unit."""
    rounding = math.ceil if replacement else math.floor
    exhausted = [rounding(n / c) for n, c in zip(lengths, per_unit, strict=True) if c > 0]
    low, high = min(exhausted), max(exhausted)
    if policy == "min_size":
        return low
    if not replacement and high > low:
        raise PlanError(
            "epoch_policy='max_size' requires replacement=True when smaller datasets would need oversampling"
        )
    return high


def _int(name: str, value: Any, *, minimum: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum):
        raise PlanError(f"{name} must be an integer >= {minimum} or None, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MixturePlan:
    """Epochs over several datasets at set rates (see the module docstring for each setting's meaning).

    Parameters
    ----------
    lengths
        Structures in each dataset, in the MultiReader's order (``MultiReader.lengths``).
    batch_size
        Structures per batch (``mix="batch"``: required), or a cap on structures per budget batch.
    weights, samples_per_dataset
        Rates per dataset, or (``mix="batch"`` only) counts per batch; mutually exclusive. Neither:
        rates proportional to the lengths.
    epoch_policy
        ``"dataset_size"``, ``"min_size"`` or ``"max_size"``.
    num_batches, num_samples
        The epoch's length given directly instead (batches with ``mix="batch"``, structures with
        ``mix="sample"``).
    replacement
        Whether a dataset may be drawn more than its length in an epoch (then in successive passes).
    mix
        ``"batch"`` or ``"sample"``; ``None``: ``"sample"`` with a budget, else ``"batch"``.
    shuffle, seed
        Shuffle each dataset's passes and the mixture, seeded by ``(seed, epoch)``.
    drop_last
        Drop the batches that do not divide evenly among the shards (and, for fixed-size sample mixes,
        a short last batch) instead of repeating some.
    shard_id, num_shards
        This shard; every shard gets the same number of batches.
    n_atoms, n_edges, max_atoms, max_edges, oversized
        Budget batches, as :class:`~dali_alchemi.plan.BudgetPlan` (sizes over the global index).
    span_bounds, buffer_spans
        The block shuffle (``shuffle="block"``): span offsets over the global index (cut at each
        dataset's ends) and the spans pooled per buffer; each pass over a dataset is then a block order,
        so its consecutive draws come from a few chunks. ``None``: full permutations.

    Raises
    ------
    PlanError
        At construction, naming the setting that does not fit.
    """

    lengths: tuple[int, ...]
    batch_size: int | None = None
    weights: tuple[float, ...] | None = None
    samples_per_dataset: tuple[int | float, ...] | None = None
    epoch_policy: str = "dataset_size"
    num_batches: int | None = None
    num_samples_per_epoch: int | None = None
    replacement: bool = True
    mix: str | None = None
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    shard_id: int = 0
    num_shards: int = 1
    n_atoms: NDArray[np.integer[Any]] | None = field(default=None, repr=False)
    n_edges: NDArray[np.integer[Any]] | None = field(default=None, repr=False)
    max_atoms: int | None = None
    max_edges: int | None = None
    oversized: str = "error"
    span_bounds: tuple[int, ...] | None = field(default=None, repr=False)
    buffer_spans: int = 1
    _counts: NDArray[np.int64] = field(init=False, repr=False, compare=False)
    _units: int = field(init=False, repr=False, compare=False)
    _budget: BudgetPlan | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lengths = tuple(int(n) for n in self.lengths)
        if not lengths or any(n < 0 for n in lengths):
            raise PlanError(f"lengths must be one non-negative length per dataset, got {self.lengths!r}")
        object.__setattr__(self, "lengths", lengths)
        for name in ("weights", "samples_per_dataset"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(value))
        if self.weights is not None and self.samples_per_dataset is not None:
            raise PlanError("weights and samples_per_dataset are mutually exclusive")
        if self.epoch_policy not in EPOCH_POLICIES:
            raise PlanError(f"epoch_policy must be one of {EPOCH_POLICIES}, got {self.epoch_policy!r}")
        _int("batch_size", self.batch_size, minimum=1)
        _int("num_batches", self.num_batches, minimum=1)
        _int("num_samples_per_epoch", self.num_samples_per_epoch, minimum=1)
        _int("seed", self.seed, minimum=0)
        _int("num_shards", self.num_shards, minimum=1)
        _int("buffer_spans", self.buffer_spans, minimum=1)
        if self.span_bounds is not None:
            checked = check_span_bounds(np.asarray(self.span_bounds), sum(lengths))
            object.__setattr__(self, "span_bounds", tuple(checked.tolist()))
        if not isinstance(self.shard_id, (int, np.integer)) or not 0 <= self.shard_id < self.num_shards:
            raise PlanError(f"shard_id must be in [0, {self.num_shards}), got {self.shard_id}")
        budgeted = self.max_atoms is not None or self.max_edges is not None
        mix = self.mix if self.mix is not None else ("sample" if budgeted else "batch")
        if mix not in MIXES:
            raise PlanError(f"mix must be one of {MIXES}, got {self.mix!r}")
        object.__setattr__(self, "mix", mix)
        budget = None
        if budgeted:
            if self.n_atoms is None or self.n_edges is None:
                raise PlanError("max_atoms/max_edges need n_atoms and n_edges (the sizes over the global index)")
            budget = BudgetPlan(
                n_atoms=self.n_atoms, n_edges=self.n_edges, max_atoms=self.max_atoms, max_edges=self.max_edges,
                max_structures=self.batch_size, oversized=self.oversized,
            )  # fmt: skip
            if budget.num_samples != self.num_samples:
                raise PlanError(f"n_atoms has {budget.num_samples} sizes for {self.num_samples} structures")
            object.__setattr__(self, "n_atoms", budget.n_atoms)
            object.__setattr__(self, "n_edges", budget.n_edges)
        object.__setattr__(self, "_budget", budget)
        counts, units = self._batch_counts() if mix == "batch" else self._sample_counts()
        object.__setattr__(self, "_counts", counts)
        object.__setattr__(self, "_units", units)

    def _batch_counts(self) -> tuple[NDArray[np.int64], int]:
        """Structures of each dataset per batch, and the batches per epoch (``MultiDatasetBatchSampler``)."""
        if self._budget is not None:
            raise PlanError(
                "mix='batch' fixes each batch's count per dataset: with max_atoms/max_edges use mix='sample'"
            )
        if self.num_samples_per_epoch is not None:
            raise PlanError("num_samples_per_epoch applies to mix='sample'; give num_batches for mix='batch'")
        bs = self.batch_size
        if bs is None:
            raise PlanError("mix='batch' needs batch_size")
        spd = self.samples_per_dataset
        if spd is not None and not any(isinstance(c, Real) and not isinstance(c, Integral) for c in spd):
            if len(spd) != len(self.lengths):
                raise PlanError(f"Expected {len(self.lengths)} per-dataset counts, got {len(spd)}")
            if any(isinstance(c, bool) or not isinstance(c, Integral) for c in spd):
                raise PlanError(f"Integer samples_per_dataset entries must be integral counts, got {spd!r}")
            counts = np.asarray([int(c) for c in spd], dtype=np.int64)
            if (counts < 0).any():
                raise PlanError(f"samples_per_dataset counts must be non-negative, got {counts.tolist()}")
            if int(counts.sum()) != bs:
                raise PlanError(f"samples_per_dataset counts must sum to batch_size: {int(counts.sum())} != {bs}")
        else:
            counts = counts_from_weights(normalise_weights(spd if spd is not None else self.weights, self.lengths), bs)
        for d, (c, n) in enumerate(zip(counts.tolist(), self.lengths, strict=True)):
            if c > 0 and n == 0:
                raise PlanError(f"Dataset {d} contributes {c} samples per batch but has no samples")
        if not counts.any():
            raise PlanError("At least one dataset must contribute samples per batch")
        if self.num_batches is not None:
            batches = self.num_batches
        elif self.epoch_policy == "dataset_size" and self.replacement:
            batches = math.ceil(self.num_samples / bs)
        else:
            policy = "min_size" if self.epoch_policy == "dataset_size" else self.epoch_policy
            batches = _epoch_length(policy, list(self.lengths), counts.tolist(), self.replacement)
        if not self.replacement:
            complete = min(n // c for n, c in zip(self.lengths, counts.tolist(), strict=True) if c > 0)
            if batches > complete:
                raise PlanError(
                    f"replacement=False supports at most {complete} complete batches for the requested "
                    f"per-dataset counts {counts.tolist()}, asked for {batches}"
                )
        if batches < 1:
            raise PlanError(f"num_batches must be >= 1, got {batches} (a dataset is smaller than its share of a batch)")
        return counts, batches

    def _sample_counts(self) -> tuple[NDArray[np.int64], int]:
        """Structures drawn from each dataset per epoch (``MultiDatasetSampler``), and their total."""
        if self.samples_per_dataset is not None:
            raise PlanError(
                "samples_per_dataset fixes each batch's counts and needs mix='batch' (a batch_size, no budget); "
                "give weights= for mix='sample'"
            )
        if self.num_batches is not None:
            raise PlanError("num_batches applies to mix='batch'; give num_samples_per_epoch for mix='sample'")
        if self._budget is None and self.batch_size is None:
            raise PlanError("mix='sample' needs batch_size, max_atoms or max_edges")
        rates = normalise_weights(self.weights, self.lengths)
        if self.num_samples_per_epoch is not None:
            total = self.num_samples_per_epoch
        elif self.epoch_policy == "dataset_size":
            total = self.num_samples
        else:
            total = _epoch_length(self.epoch_policy, list(self.lengths), rates.tolist(), self.replacement)
        counts = counts_from_weights(rates, total)
        if not self.replacement:
            for d, (c, n) in enumerate(zip(counts.tolist(), self.lengths, strict=True)):
                if c > n:
                    raise PlanError(f"replacement=False cannot draw {c} samples from dataset {d} with only {n} samples")
        if total < 1:
            raise PlanError(f"the epoch would draw {total} structures; a dataset is empty or its weight too small")
        return counts, total

    # -- the Plan protocol ----------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Structures over all datasets (the MultiReader's length)."""
        return sum(self.lengths)

    @property
    def draws_per_dataset(self) -> NDArray[np.int64]:
        """Structures drawn from each dataset per epoch over all shards, before the shards' padding."""
        return self._counts * self._units if self.mix == "batch" else self._counts.copy()

    @property
    def counts_per_batch(self) -> NDArray[np.int64] | None:
        """Structures of each dataset in every batch (``mix="batch"``), else ``None``."""
        return self._counts.copy() if self.mix == "batch" else None

    def _rng(self, epoch: int, stream: int) -> np.random.Generator:
        seed = int(self.seed)
        return np.random.Generator(
            np.random.PCG64(np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, epoch, stream]))
        )

    def _draws(self, epoch: int, counts: NDArray[np.int64]) -> list[IndexArray]:
        """Each dataset's draws of the epoch, as global indices (one vectorised call per dataset)."""
        offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        bounds = None if self.span_bounds is None else np.asarray(self.span_bounds, dtype=np.int64)
        draws = []
        for d, (n, c) in enumerate(zip(self.lengths, counts.tolist(), strict=True)):
            spans = None if bounds is None else local_spans(bounds, int(offsets[d]), int(offsets[d + 1]))
            rng = self._rng(epoch, d + 1)
            draws.append(offsets[d] + pass_orders(n, int(c), rng=rng, shuffle=self.shuffle, spans=spans,
                                                  buffer_spans=self.buffer_spans))  # fmt: skip
        return draws

    def global_batches(self, epoch: int) -> tuple[IndexArray, NDArray[np.int64]]:
        """The epoch's order over all shards and the offsets of its batches, before dealing them out.

        Within a batch the structures come grouped by dataset, in dataset order (a batch is a set to the
        model, and grouped, a window reaches each store in a few contiguous runs instead of one per
        structure).
        """
        if self.mix == "batch":
            batches, bs = self._units, int(self._counts.sum())
            draws = self._draws(epoch, self._counts * batches)
            grid = np.concatenate([d.reshape(batches, -1) for d in draws], axis=1)  # [batches, batch_size]
            return grid.reshape(-1), np.arange(batches + 1, dtype=np.int64) * bs
        draws = self._draws(epoch, self._counts)
        choice = np.repeat(np.arange(len(self.lengths), dtype=np.int64), self._counts)
        if self.shuffle:
            choice = self._rng(epoch, 0).permutation(choice)
        order = np.empty(self._units, dtype=np.int64)
        order[np.argsort(choice, kind="stable")] = np.concatenate(draws)
        if self._budget is not None:
            b = self._budget
            ptr = pack_greedy(
                b.n_atoms[order], b.n_edges[order],
                max_atoms=b.max_atoms, max_edges=b.max_edges, max_structures=b.max_structures,
            )  # fmt: skip
        else:
            assert self.batch_size is not None
            full, rest = divmod(order.size, self.batch_size)
            cuts = np.arange(full + 1, dtype=np.int64) * self.batch_size
            ptr = cuts if rest == 0 or self.drop_last else np.append(cuts, order.size)
        covered = int(ptr[-1])  # group each batch by dataset, keeping the drawn order within a dataset
        grouped = np.lexsort((choice[:covered], np.repeat(np.arange(ptr.size - 1), np.diff(ptr))))
        order[:covered] = order[:covered][grouped]
        return order, ptr

    def epoch(self, epoch: int) -> EpochPlan:
        """This shard's batches of ``epoch``."""
        order, ptr = self.global_batches(epoch)
        return deal_batches(
            epoch, order, ptr, shard_id=self.shard_id, num_shards=self.num_shards, drop_last=self.drop_last
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready identity: the kind, every setting and (with a budget) the sizes' checksum."""
        out: dict[str, Any] = {
            "kind": "mixture", "lengths": list(self.lengths), "mix": self.mix, "batch_size": self.batch_size,
            "weights": None if self.weights is None else [float(w) for w in self.weights],
            "samples_per_dataset": None if self.samples_per_dataset is None else list(self.samples_per_dataset),
            "epoch_policy": self.epoch_policy, "num_batches": self.num_batches,
            "num_samples_per_epoch": self.num_samples_per_epoch, "replacement": self.replacement,
            "shuffle": self.shuffle, "seed": self.seed, "drop_last": self.drop_last, "shard_id": self.shard_id,
            "num_shards": self.num_shards, "max_atoms": self.max_atoms, "max_edges": self.max_edges,
            "oversized": self.oversized,
        }  # fmt: skip
        if self.span_bounds is not None:  # the block shuffle of each dataset's passes
            out["block"] = {"spans_crc32": f"{zlib.crc32(np.asarray(self.span_bounds, np.int64).tobytes()):08x}",
                            "num_spans": len(self.span_bounds) - 1, "buffer_spans": self.buffer_spans}  # fmt: skip
        if self._budget is not None:
            out["sizes_crc32"] = self._budget.fingerprint()
        return out
