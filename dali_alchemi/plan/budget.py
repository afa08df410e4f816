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

With a keyed permutation (``permutation="keyed"``, the default from
:data:`~dali_alchemi.plan.order.KEYED_MIN_SAMPLES` structures on) or no shuffle, steps 1 and 2 run
block by block over the order (:func:`stream_batches`), keeping only this shard's batches; the
shard's order is then evaluated at its own positions. The batches are the same as packing the
whole order at once, and memory stays proportional to a block and this shard's batches. The sizes
are kept in the dtype given when it is an integer of at most 32 bits (uint16 holds any structure of
this field), so a 110 M-structure dataset costs 220 MB per count, not 880 MB.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.csr import concat_aranges, exclusive_cumsum
from dali_alchemi.errors import PlanError
from dali_alchemi.plan.base import EpochPlan
from dali_alchemi.plan.keyed import keyed_order
from dali_alchemi.plan.order import epoch_order, resolve_permutation

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import PtrArray

__all__ = [
    "OVERSIZED_POLICIES",
    "STREAM_BLOCK",
    "BudgetPlan",
    "compact_sizes",
    "deal_batches",
    "pack_greedy",
    "stream_batches",
]


OVERSIZED_POLICIES = ("error", "alone")
"""What to do with a structure larger than a budget: refuse the plan, or give it a batch of its own."""


STREAM_BLOCK = 1 << 21
"""Positions of the order packed at once by :func:`stream_batches` (a batch longer than that grows it)."""


def compact_sizes(sizes: NDArray[Any], name: str) -> NDArray[np.integer[Any]]:
    """``sizes`` as a 1-D contiguous integer array of at most 32 bits, copied only when it must be.

    Raises
    ------
    PlanError
        If ``sizes`` holds negative counts (naming ``name``).
    """
    array = np.asarray(sizes)
    if not (np.issubdtype(array.dtype, np.integer) and array.dtype.itemsize <= 4):
        array = array.astype(np.int32)
    array = np.ascontiguousarray(array)
    if array.size and np.issubdtype(array.dtype, np.signedinteger) and int(array.min()) < 0:
        worst = int(np.argmin(array))
        raise PlanError(
            f"n_atoms and n_edges must be non-negative: {name} of structure {worst} is {int(array[worst])}; "
            "pass the counts the reader's sample_sizes() returns"
        )
    return array


def stream_batches(
    n: int,
    values_at: Callable[[range], NDArray[np.int64]],
    n_atoms: NDArray[np.integer[Any]],
    n_edges: NDArray[np.integer[Any]],
    *,
    max_atoms: int | None,
    max_edges: int | None,
    max_structures: int | None,
    shard_id: int,
    num_shards: int,
) -> tuple[int, NDArray[np.int64], PtrArray, NDArray[np.int64]]:
    """The greedy batches of an order of ``n`` structures, packed :data:`STREAM_BLOCK` positions at a time.

    ``values_at(range(start, stop))`` gives the order at those positions. Returns the batch count and, for the
    batches this shard can be dealt (those numbered ``shard_id`` modulo ``num_shards``, and the first
    ``num_shards``, which wrap-around padding repeats), their numbers, first positions and lengths.
    The batches are exactly :func:`pack_greedy`'s over the whole order: a block's last batch, which
    might go on in the next block, is packed again with it.
    """
    start, total, block = 0, 0, STREAM_BLOCK
    kept: list[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]] = []
    while start < n:
        stop = min(start + block, n)
        values = values_at(range(start, stop))
        ptr = pack_greedy(
            n_atoms[values] if max_atoms is not None else values,  # only the sizes a budget bounds are gathered
            n_edges[values] if max_edges is not None else None,
            max_atoms=max_atoms, max_edges=max_edges, max_structures=max_structures,
        )  # fmt: skip
        if stop < n:
            if ptr.size <= 2:  # one batch runs through the whole block: pack a longer one
                block *= 2
                continue
            ptr = ptr[:-1]
        ids = np.arange(total, total + ptr.size - 1, dtype=np.int64)
        mine = (ids % num_shards == shard_id) | (ids < num_shards)
        kept.append((ids[mine], start + ptr[:-1][mine], np.diff(ptr)[mine]))
        total += int(ptr.size - 1)
        start += int(ptr[-1])
        block = STREAM_BLOCK
    if not kept:
        return 0, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    ids, starts, counts = (np.concatenate(part) for part in zip(*kept, strict=True))
    return total, ids, starts, counts


def _positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
        raise PlanError(f"{name} must be a positive integer or None, got {value!r}")


def pack_greedy(
    n_atoms: NDArray[np.integer[Any]],
    n_edges: NDArray[np.integer[Any]] | None,
    *,
    max_atoms: int | None,
    max_edges: int | None,
    max_structures: int | None,
) -> PtrArray:
    """Offsets ``[b + 1]`` of greedy batches over structures of these sizes, in the order given.

    A batch takes structures while its atoms stay within ``max_atoms``, its edges within ``max_edges``
    and its count within ``max_structures`` (``None``: unbounded; ``n_edges`` may then be ``None``).
    A structure that alone breaks a budget still gets a batch (of one): callers decide beforehand
    whether that is allowed.
    """
    n = int(n_atoms.size)
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    cums = [  # running sums only of the budgets that bound the batches
        (exclusive_cumsum(sizes.astype(np.int64, copy=False)), budget)
        for sizes, budget in ((n_atoms, max_atoms), (n_edges, max_edges))
        if budget is not None and sizes is not None
    ]
    bounds = [0]
    start = 0
    while start < n:  # one iteration per batch
        end = n
        for cum, budget in cums:
            end = min(end, int(cum.searchsorted(cum[start] + budget, side="right")) - 1)
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
    permutation
        ``"auto"`` (default), ``"drawn"`` or ``"keyed"``: how a shuffled order is made (see
        :mod:`dali_alchemi.plan.order`); resolved at construction.
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
    permutation: str = "auto"

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
        atoms = compact_sizes(self.n_atoms, "n_atoms")  # compact: the plan travels to workers
        edges = compact_sizes(self.n_edges, "n_edges")
        if atoms.ndim != 1 or atoms.shape != edges.shape:
            raise PlanError(f"n_atoms and n_edges must be 1-D of one length, got {atoms.shape} and {edges.shape}")
        object.__setattr__(self, "permutation", resolve_permutation(self.permutation, int(atoms.size), self.shuffle))
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

    def values_at(self, epoch: int) -> Callable[[NDArray[np.int64] | range], NDArray[np.int64]]:
        """The epoch's order as a function of positions (keyed, or ``arange`` without shuffle)."""
        if not self.shuffle:
            return lambda p: np.arange(p.start, p.stop, dtype=np.int64) if isinstance(p, range) else p
        return lambda positions: keyed_order(positions, self.num_samples, seed=self.seed, epoch=epoch)

    def global_batches(self, epoch: int) -> tuple[NDArray[np.int64], PtrArray]:
        """The epoch's order over every structure and the offsets of all its batches, before sharding."""
        if self.permutation == "keyed":
            order = self.values_at(epoch)(range(self.num_samples))
        else:
            order = epoch_order(self.num_samples, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        ptr = pack_greedy(
            self.n_atoms[order], self.n_edges[order],
            max_atoms=self.max_atoms, max_edges=self.max_edges, max_structures=self.max_structures,
        )  # fmt: skip
        return order, ptr

    def epoch(self, epoch: int) -> EpochPlan:
        """This shard's batches of ``epoch``: every ``num_shards``-th global batch, the list padded to divide."""
        if self.permutation == "drawn" and self.shuffle:
            order, ptr = self.global_batches(epoch)
            return deal_batches(
                epoch, order, ptr, shard_id=self.shard_id, num_shards=self.num_shards, drop_last=self.drop_last
            )
        values_at = self.values_at(epoch)
        total, ids, starts, counts = stream_batches(
            self.num_samples, values_at, self.n_atoms, self.n_edges, max_atoms=self.max_atoms,
            max_edges=self.max_edges, max_structures=self.max_structures, shard_id=self.shard_id,
            num_shards=self.num_shards,
        )  # fmt: skip
        per_shard = total // self.num_shards if self.drop_last else math.ceil(total / self.num_shards)
        mine = np.arange(self.shard_id, per_shard * self.num_shards, self.num_shards, dtype=np.int64)
        if total:
            mine %= total
        at = np.searchsorted(ids, mine)
        ptr = exclusive_cumsum(counts[at])
        order = np.empty(int(ptr[-1]), dtype=np.int64)
        cuts = np.unique(np.searchsorted(ptr, np.arange(0, order.size, STREAM_BLOCK), side="right") - 1)
        for lo, hi in itertools.pairwise([*cuts.tolist(), at.size]):  # the shard's order a block of batches at a time
            order[ptr[lo] : ptr[hi]] = values_at(concat_aranges(starts[at[lo:hi]], counts[at[lo:hi]]))
        return EpochPlan(epoch=epoch, order=order, batch_ptr=ptr)

    def fingerprint(self) -> str:
        """A checksum of the sizes (as int32, whatever their dtype): plans over different stores of one length differ."""
        crc = 0
        for sizes in (self.n_atoms, self.n_edges):
            for lo in range(0, sizes.size, STREAM_BLOCK):  # no whole copy of the sizes
                crc = zlib.crc32(np.ascontiguousarray(sizes[lo : lo + STREAM_BLOCK], dtype=np.int32).data, crc)
        return f"{crc:08x}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready identity: the kind, every setting and the sizes' checksum (not the sizes)."""
        return {
            "kind": "budget", "num_samples": self.num_samples, "sizes_crc32": self.fingerprint(),
            "max_atoms": self.max_atoms, "max_edges": self.max_edges, "max_structures": self.max_structures,
            "shuffle": self.shuffle, "seed": self.seed, "drop_last": self.drop_last, "shard_id": self.shard_id,
            "num_shards": self.num_shards, "oversized": self.oversized,
        } | ({"permutation": "keyed"} if self.permutation == "keyed" else {})  # fmt: skip
