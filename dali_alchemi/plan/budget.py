"""BudgetPlan: batches bounded by atoms and edges (and optionally structures), packed greedily in epoch order.

A model's memory and step time follow atoms and edges, not structures, so a budget batch holds as
many structures as fit under ``max_atoms`` and ``max_edges``. Sizes come from the pointer arrays (the
reader's :meth:`sample_sizes`), never from data. An epoch is planned in three steps, each vectorised
or looping once per *batch*, never per structure:

1. the epoch's global order (seeded by ``(seed, epoch)``, as for fixed batches);
2. greedy packing in that order: a batch ends before the structure that would break a budget (a cut
   found by ``searchsorted`` on the running sums);
3. the batches dealt to shards round-robin, the list padded by wrapping around (or truncated, with
   ``drop_last``) so that every shard has the same number of batches, as fairchem's
   ``MaxAtomDistributedBatchSampler`` does. Padding repeats whole batches: apart from those, every
   structure is seen exactly once per epoch across the shards.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.csr import concat_aranges, exclusive_cumsum
from dali_alchemi.errors import PlanError
from dali_alchemi.plan.base import EpochPlan
from dali_alchemi.plan.order import epoch_order

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import PtrArray

__all__ = ["OVERSIZED_POLICIES", "BudgetPlan", "deal_batches", "pack_greedy"]


OVERSIZED_POLICIES = ("error", "alone")
"""What to do with a structure larger than a budget: refuse the plan, or give it a batch of its own."""


def _positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
        raise PlanError(f"{name} must be a positive integer or None, got {value!r}")


def pack_greedy(
    n_atoms: NDArray[np.integer[Any]],
    n_edges: NDArray[np.integer[Any]],
    *,
    max_atoms: int | None,
    max_edges: int | None,
    max_structures: int | None,
) -> PtrArray:
    """Offsets ``[b + 1]`` of greedy batches over structures of these sizes, in the order given.

    A batch takes structures while its atoms stay within ``max_atoms``, its edges within ``max_edges``
    and its count within ``max_structures`` (``None``: unbounded). A structure that alone breaks a
    budget still gets a batch (of one): callers decide beforehand whether that is allowed.
    """
    n = int(n_atoms.size)
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    atoms_cum = exclusive_cumsum(n_atoms.astype(np.int64, copy=False))
    edges_cum = exclusive_cumsum(n_edges.astype(np.int64, copy=False))
    bounds = [0]
    start = 0
    while start < n:  # one iteration per batch
        end = n
        if max_atoms is not None:
            end = min(end, int(np.searchsorted(atoms_cum, atoms_cum[start] + max_atoms, side="right")) - 1)
        if max_edges is not None:
            end = min(end, int(np.searchsorted(edges_cum, edges_cum[start] + max_edges, side="right")) - 1)
        if max_structures is not None:
            end = min(end, start + max_structures)
        end = max(end, start + 1)
        bounds.append(end)
        start = end
    return np.asarray(bounds, dtype=np.int64)


def deal_batches(
    epoch: int, order: NDArray[np.int64], ptr: PtrArray, *, shard_id: int, num_shards: int, drop_last: bool
) -> EpochPlan:
    """Shard ``shard_id`` of an epoch's batches (``order`` cut at ``ptr``), dealt round-robin.

    The list of batches is padded by wrapping around (whole batches repeat), or with ``drop_last``
    truncated, so that every shard gets the same number of batches, as ``DistributedSampler`` pads
    samples.
    """
    total = int(ptr.size - 1)
    if drop_last:
        per_shard = total // num_shards
        dealt = np.arange(per_shard * num_shards, dtype=np.int64)
    else:
        per_shard = math.ceil(total / num_shards) if total else 0
        dealt = np.resize(np.arange(total, dtype=np.int64), per_shard * num_shards)
    mine = dealt[shard_id::num_shards]
    starts, counts = ptr[mine], ptr[mine + 1] - ptr[mine]
    return EpochPlan(epoch=epoch, order=order[concat_aranges(starts, counts)], batch_ptr=exclusive_cumsum(counts))


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetPlan:
    """Batches of as many structures as fit in ``max_atoms`` atoms and ``max_edges`` edges.

    Parameters
    ----------
    n_atoms, n_edges
        ``[N]`` per-structure counts of the reader, from its pointers (no data read).
    max_atoms, max_edges
        The budgets, either or both; ``None`` leaves that dimension unbounded.
    max_structures
        An optional cap on structures per batch (the loaders' ``batch_size`` when given with a budget).
    shuffle, seed
        The epoch's order, as for fixed batches: seeded by ``(seed, epoch)``.
    drop_last
        Drop the batches that do not divide evenly among the shards instead of repeating some.
    shard_id, num_shards
        This shard of the batches, dealt round-robin; every shard has the same count.
    oversized
        ``"error"`` (default): a structure larger than a budget makes the plan an error, naming it.
        ``"alone"``: such a structure forms a batch of its own (which then exceeds the budget).

    Raises
    ------
    PlanError
        At construction: a budget that is not a positive integer, no budget at all, sizes of the wrong
        shape, or (with ``oversized="error"``) a structure larger than a budget.
    """

    n_atoms: NDArray[np.integer[Any]] = field(repr=False)
    n_edges: NDArray[np.integer[Any]] = field(repr=False)
    max_atoms: int | None = None
    max_edges: int | None = None
    max_structures: int | None = None
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    shard_id: int = 0
    num_shards: int = 1
    oversized: str = "error"

    def __post_init__(self) -> None:
        for name in ("max_atoms", "max_edges", "max_structures"):
            _positive(name, getattr(self, name))
        if self.max_atoms is None and self.max_edges is None:
            raise PlanError("a BudgetPlan needs max_atoms, max_edges or both")
        if self.oversized not in OVERSIZED_POLICIES:
            raise PlanError(f"oversized must be one of {OVERSIZED_POLICIES}, got {self.oversized!r}")
        _positive("num_shards", self.num_shards)
        if not isinstance(self.shard_id, (int, np.integer)) or not 0 <= self.shard_id < self.num_shards:
            raise PlanError(f"shard_id must be in [0, {self.num_shards}), got {self.shard_id}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise PlanError(f"seed must be a non-negative integer, got {self.seed!r}")
        atoms = np.ascontiguousarray(self.n_atoms, dtype=np.int32)  # compact: the plan travels to workers
        edges = np.ascontiguousarray(self.n_edges, dtype=np.int32)
        if atoms.ndim != 1 or atoms.shape != edges.shape:
            raise PlanError(f"n_atoms and n_edges must be 1-D of one length, got {atoms.shape} and {edges.shape}")
        if (atoms < 0).any() or (edges < 0).any():
            raise PlanError("n_atoms and n_edges must be non-negative")
        object.__setattr__(self, "n_atoms", atoms)
        object.__setattr__(self, "n_edges", edges)
        if self.oversized == "error":
            for name, sizes, budget, unit in (
                ("max_atoms", atoms, self.max_atoms, "atoms"),
                ("max_edges", edges, self.max_edges, "edges"),
            ):
                if budget is not None and sizes.size and int(sizes.max()) > budget:
                    worst = int(np.argmax(sizes))
                    over = int((sizes > budget).sum())
                    raise PlanError(
                        f"structure {worst} has {int(sizes[worst])} {unit}, more than {name}={budget} "
                        f"({over} structure(s) exceed it); raise {name}, or pass oversized='alone' to give "
                        "each such structure a batch of its own"
                    )

    @property
    def num_samples(self) -> int:
        """Structures in the reader the plan was made for."""
        return int(self.n_atoms.size)

    def global_batches(self, epoch: int) -> tuple[NDArray[np.int64], PtrArray]:
        """The epoch's order over every structure and the offsets of all its batches, before sharding."""
        order = epoch_order(self.num_samples, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        ptr = pack_greedy(
            self.n_atoms[order], self.n_edges[order],
            max_atoms=self.max_atoms, max_edges=self.max_edges, max_structures=self.max_structures,
        )  # fmt: skip
        return order, ptr

    def epoch(self, epoch: int) -> EpochPlan:
        """This shard's batches of ``epoch``: every ``num_shards``-th global batch, the list padded to divide."""
        order, ptr = self.global_batches(epoch)
        return deal_batches(
            epoch, order, ptr, shard_id=self.shard_id, num_shards=self.num_shards, drop_last=self.drop_last
        )

    def fingerprint(self) -> str:
        """A checksum of the sizes: two plans over different stores of one length differ."""
        crc = zlib.crc32(self.n_edges.tobytes(), zlib.crc32(self.n_atoms.tobytes()))
        return f"{crc:08x}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready identity: the kind, every setting and the sizes' checksum (not the sizes)."""
        return {
            "kind": "budget", "num_samples": self.num_samples, "sizes_crc32": self.fingerprint(),
            "max_atoms": self.max_atoms, "max_edges": self.max_edges, "max_structures": self.max_structures,
            "shuffle": self.shuffle, "seed": self.seed, "drop_last": self.drop_last, "shard_id": self.shard_id,
            "num_shards": self.num_shards, "oversized": self.oversized,
        }  # fmt: skip
