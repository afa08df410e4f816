"""BlockShufflePlan: a chunk-aware shuffle for stores far larger than the decoded-chunk cache.

A full permutation over a store much bigger than the cache touches a different chunk for nearly every
structure of a window. This plan shuffles coarsely and then finely, as the loaders that train on huge
datasets do (MosaicML streaming, WebDataset, Ray Data):

1. the store is cut into *spans* of contiguous structures aligned with its chunks (from the reader's
   :meth:`~dali_alchemi.store.format.protocol.ChunkedReader.sample_chunk_bounds`, or fixed-size spans);
2. the span order is shuffled, seeded by ``(seed, epoch)``;
3. consecutive spans of that order are pooled into *buffers* of ``buffer_spans`` spans (by default as
   many as fill half the cache), and the structures inside each buffer are shuffled;
4. the resulting global order is cut into batches (``batch_size`` structures, or packed greedily by
   atom/edge budget), so a buffer's batches are contiguous and a window stays within one or two
   buffers.

The global order and its batches depend on the seed, the epoch and the store's spans only, never on
the number of shards: that is what makes an *elastic* resume possible. Shard ``r`` of ``W`` takes the
``r``-th contiguous run of the global batches (the list wrapped around so every shard gets the same
count), so shards read disjoint spans except at the ``W - 1`` cut points. A job checkpointed on ``N``
shards and resumed on ``M`` deals the batches no shard had delivered over the ``M`` new shards (see
:meth:`BlockShufflePlan.resume_from`). Pure numpy, vectorised or looping once per buffer or batch.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.csr import concat_aranges, exclusive_cumsum
from dali_alchemi.errors import ConfigTypeError, PlanError
from dali_alchemi.plan.base import EpochPlan, state_int
from dali_alchemi.plan.budget import BudgetPlan, pack_greedy, stream_batches
from dali_alchemi.plan.order import resolve_permutation
from dali_alchemi.plan.spans import (
    KeyedBlockOrder,
    StoreChunking,
    block_order,
    check_span_bounds,
    default_buffer_spans,
    fixed_spans,
)
from dali_alchemi.store.format.protocol import UNCHUNKED_SPAN_SIZE
from dali_alchemi.store.read.cache import DEFAULT_CACHE_BYTES

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import CountArray, IndexArray, PtrArray

__all__ = ["BLOCK_STREAM", "DEFAULT_SPAN_SIZE", "ELASTIC_KEYS", "BlockShuffle", "BlockShufflePlan", "ResumePoint", "block_plan", "block_sizes", "deal"]  # fmt: skip


DEFAULT_SPAN_SIZE = UNCHUNKED_SPAN_SIZE
"""Structures per span for a reader that does not say how it is chunked (about one 4 MiB chunk of
positions for structures of 20-40 atoms)."""

BLOCK_STREAM = 0xB10C
"""Mixed into the seed so the block order's random stream is not the global permutation's."""

ELASTIC_KEYS = ("shard_id", "num_shards", "resume")
"""Plan settings that may differ between a checkpoint and the plan resuming it."""


def _check_positive(name: str, value: Any, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise PlanError(f"{name} must be a positive integer{' or None' if optional else ''}, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockShuffle:
    """Settings of the block shuffle (``shuffle=BlockShuffle(...)``; ``shuffle="block"`` is the default one).

    Parameters
    ----------
    span_size
        Structures per span. ``None`` (default): spans follow the store's chunks (one row block of
        its per-atom arrays each), or :data:`DEFAULT_SPAN_SIZE` for a reader that does not report them.
    buffer_spans
        Spans pooled and shuffled together. ``None`` (default): as many as fill
        :data:`BUFFER_CACHE_FRACTION` of the reader's cache, at least one.
    """

    span_size: int | None = None
    buffer_spans: int | None = None

    def __post_init__(self) -> None:
        _check_positive("span_size", self.span_size, optional=True)
        _check_positive("buffer_spans", self.buffer_spans, optional=True)

    def to_dict(self) -> dict[str, Any]:
        return {"span_size": self.span_size, "buffer_spans": self.buffer_spans}


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where an epoch was checkpointed before: ``segments`` are ``(num_shards, batches)`` pairs, in order.

    Each segment dealt the batches not yet delivered over ``num_shards`` shards, and every shard had
    delivered its first ``batches`` of them when the job was checkpointed.
    """

    epoch: int
    segments: tuple[tuple[int, int], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "segments": [list(s) for s in self.segments]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ResumePoint | None:
        """The resume point of a saved plan's ``resume`` entry (``None``: none), every number checked.

        Raises
        ------
        PlanError, ConfigTypeError
            If the entry is malformed: not ``{"epoch": int, "segments": [[num_shards, batches], ...]}``
            with a non-negative epoch, at least one shard and non-negative batches.
        """
        if data is None:
            return None
        try:
            segments = [(w, b) for w, b in data["segments"]]
            return cls(
                epoch=state_int(data["epoch"], "state_dict['plan']['resume']['epoch']"),
                segments=tuple(
                    (
                        state_int(w, "a num_shards of state_dict['plan']['resume']['segments']", minimum=1),
                        state_int(b, "a batch count of state_dict['plan']['resume']['segments']"),
                    )
                    for w, b in segments
                ),
            )
        except (KeyError, TypeError, ValueError) as err:
            if isinstance(err, (PlanError, ConfigTypeError)):
                raise
            raise PlanError(f"state_dict plan has a malformed resume entry {data!r}: {err}") from err


def deal(batch_ids: IndexArray, num_shards: int, drop_last: bool) -> NDArray[np.int64]:
    """``[num_shards, L]``: shard ``r`` gets the ``r``-th contiguous run of ``batch_ids``.

    Without ``drop_last`` the list is padded by wrapping around to ``L * num_shards`` (``L`` rounded
    up), as ``DistributedSampler`` does; with it the tail that does not divide is left out.
    """
    n = int(batch_ids.size)
    per_shard = n // num_shards if drop_last else math.ceil(n / num_shards)
    dealt = batch_ids[: per_shard * num_shards] if drop_last or n == 0 else np.resize(batch_ids, per_shard * num_shards)
    return dealt.reshape(num_shards, per_shard)


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockShufflePlan:
    """Batches over a chunk-aware shuffle: shuffled spans, pooled into buffers shuffled inside.

    Parameters
    ----------
    span_bounds
        ``[S + 1]`` int64 offsets of the spans (from 0 to the sample count, strictly increasing).
    buffer_spans
        Spans per buffer.
    batch_size
        Structures per batch (the last batch of the epoch may be short), when ``budget`` is ``None``.
    budget
        A :class:`BudgetPlan` whose sizes and budgets pack the batches greedily instead (its own
        order and shard settings are not used).
    seed
        The span order and the order inside each buffer are seeded by ``(seed, epoch)``.
    drop_last
        Drop a short last batch and the batches that do not divide among the shards, instead of
        repeating some (wrap-around padding).
    shard_id, num_shards
        This shard: the ``shard_id``-th contiguous run of the epoch's batches.
    resume
        Set by :meth:`resume_from`: the checkpoints taken earlier in ``resume.epoch``, whose batches
        this plan leaves out of that epoch.
    permutation
        ``"auto"`` (default), ``"drawn"`` or ``"keyed"``. Drawn: the buffers are shuffled one after
        the other from one random stream, so every shard builds the whole order. Keyed: each buffer
        by a generator of its own (:class:`~dali_alchemi.plan.spans.KeyedBlockOrder`), so a shard
        builds only the buffers its batches touch (with a budget, the batches are still packed over
        every buffer, one block at a time). ``"auto"`` keys from
        :data:`~dali_alchemi.plan.order.KEYED_MIN_SAMPLES` structures on.

    Raises
    ------
    PlanError
        At construction, naming the setting that is out of range.
    """

    span_bounds: IndexArray = field(repr=False)
    buffer_spans: int
    batch_size: int | None = None
    budget: BudgetPlan | None = field(default=None, repr=False)
    seed: int = 0
    drop_last: bool = False
    shard_id: int = 0
    num_shards: int = 1
    resume: ResumePoint | None = None
    permutation: str = "auto"

    def __post_init__(self) -> None:
        bounds = np.asarray(self.span_bounds)
        n = int(bounds[-1]) if bounds.ndim == 1 and bounds.size else 0
        object.__setattr__(self, "span_bounds", check_span_bounds(bounds, n))
        _check_positive("buffer_spans", self.buffer_spans, optional=False)
        _check_positive("num_shards", self.num_shards, optional=False)
        if (self.batch_size is None) == (self.budget is None):
            raise PlanError("a BlockShufflePlan needs exactly one of batch_size and budget")
        _check_positive("batch_size", self.batch_size, optional=True)
        if self.budget is not None and self.budget.num_samples != n:
            raise PlanError(f"the budget was made for {self.budget.num_samples} samples, the spans cover {n}")
        if (
            isinstance(self.shard_id, bool)
            or not isinstance(self.shard_id, (int, np.integer))
            or not 0 <= self.shard_id < self.num_shards
        ):
            raise PlanError(f"shard_id must be in [0, {self.num_shards}), got {self.shard_id!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise PlanError(f"seed must be a non-negative integer, got {self.seed!r}")
        object.__setattr__(self, "permutation", resolve_permutation(self.permutation, n, True))

    @property
    def num_samples(self) -> int:
        """Structures in the reader the plan was made for."""
        return int(self.span_bounds[-1])

    @property
    def num_spans(self) -> int:
        return int(self.span_bounds.size - 1)

    def _key(self, epoch: int) -> list[int]:
        return [self.seed & 0xFFFFFFFF, self.seed >> 32, epoch, BLOCK_STREAM]

    def keyed_order(self, epoch: int) -> KeyedBlockOrder:
        """The keyed block order of ``epoch`` (whatever :attr:`permutation` says), built buffer by buffer."""
        key = self._key(epoch)
        return KeyedBlockOrder(
            self.span_bounds, self.buffer_spans, np.random.Generator(np.random.PCG64(np.random.SeedSequence(key))), key
        )

    def global_order(self, epoch: int) -> IndexArray:
        """Every structure of ``epoch`` in block order, before batching and sharding (any shard count)."""
        if self.permutation == "keyed":
            return self.keyed_order(epoch).values(0, self.num_samples)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self._key(epoch))))
        return block_order(self.span_bounds, self.buffer_spans, rng)

    def _keyed_ptr(self, keyed: KeyedBlockOrder) -> PtrArray:
        """The offsets of every batch of a keyed order, packed block by block with a budget."""
        n = self.num_samples
        if self.budget is None:
            assert self.batch_size is not None
            count = n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
            return np.minimum(np.arange(count + 1, dtype=np.int64) * self.batch_size, n)
        b = self.budget
        _, _, _, counts = stream_batches(
            n, lambda positions: keyed.values(positions.start, positions.stop), b.n_atoms, b.n_edges,
            max_atoms=b.max_atoms, max_edges=b.max_edges, max_structures=b.max_structures, shard_id=0, num_shards=1,
        )  # fmt: skip
        return exclusive_cumsum(counts)

    def global_batches(self, epoch: int) -> tuple[IndexArray, PtrArray]:
        """The global order and the offsets of all its batches, the same for every shard count."""
        if self.permutation == "keyed":
            keyed = self.keyed_order(epoch)
            return keyed.values(0, self.num_samples), self._keyed_ptr(keyed)
        order = self.global_order(epoch)
        n = int(order.size)
        if self.budget is None:
            assert self.batch_size is not None
            count = n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
            return order, np.minimum(np.arange(count + 1, dtype=np.int64) * self.batch_size, n)
        b = self.budget
        ptr = pack_greedy(
            b.n_atoms[order], b.n_edges[order],
            max_atoms=b.max_atoms, max_edges=b.max_edges, max_structures=b.max_structures,
        )  # fmt: skip
        return order, ptr

    def undelivered(self, epoch: int, num_batches: int) -> IndexArray:
        """Global batch numbers of ``epoch`` that the checkpoints in :attr:`resume` had not delivered.

        Raises
        ------
        PlanError
            If a checkpoint claims more batches than its shards had.
        """
        ids = np.arange(num_batches, dtype=np.int64)
        if self.resume is None or self.resume.epoch != epoch:
            return ids
        for shards, batches in self.resume.segments:
            dealt = deal(ids, shards, self.drop_last)
            if not 0 <= batches <= dealt.shape[1]:
                raise PlanError(
                    f"the checkpoint of epoch {epoch} on {shards} shards is at batch {batches}, but each of "
                    f"those shards had {dealt.shape[1]} batches"
                )
            seen = np.zeros(num_batches, dtype=bool)
            seen[dealt[:, :batches].reshape(-1)] = True
            ids = ids[~seen[ids]]
        return ids

    def epoch(self, epoch: int) -> EpochPlan:
        """This shard's batches of ``epoch``: its contiguous run of the (not yet delivered) global batches.

        With a keyed order only the buffers under this shard's batches are built: the batches are
        taken as runs of consecutive ones, each run one stretch of the order.
        """
        if self.permutation == "keyed":
            keyed = self.keyed_order(epoch)
            ptr = self._keyed_ptr(keyed)
        else:
            order, ptr = self.global_batches(epoch)
        mine = deal(self.undelivered(epoch, int(ptr.size - 1)), self.num_shards, self.drop_last)[self.shard_id]
        counts = ptr[mine + 1] - ptr[mine]
        if self.permutation != "keyed":
            return EpochPlan(
                epoch=epoch, order=order[concat_aranges(ptr[mine], counts)], batch_ptr=exclusive_cumsum(counts)
            )
        batch_ptr = exclusive_cumsum(counts)
        mine_order = np.empty(int(batch_ptr[-1]), dtype=np.int64)
        cuts = (np.flatnonzero(np.diff(mine) != 1) + 1).tolist() if mine.size else []
        for first, stop in itertools.pairwise(
            [0, *cuts, mine.size] if mine.size else []
        ):  # a run of consecutive batches
            lo, hi = int(ptr[mine[first]]), int(ptr[mine[stop - 1] + 1])
            keyed.values(lo, hi, out=mine_order[int(batch_ptr[first]) : int(batch_ptr[stop])])
        return EpochPlan(epoch=epoch, order=mine_order, batch_ptr=batch_ptr)

    def fingerprint(self) -> str:
        """A checksum of the span offsets: plans over differently chunked stores differ."""
        return f"{zlib.crc32(self.span_bounds.tobytes()):08x}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready identity: every setting, the spans' checksum (not the spans) and the resume point."""
        b = self.budget
        return {
            "kind": "block", "num_samples": self.num_samples, "num_spans": self.num_spans,
            "spans_crc32": self.fingerprint(), "buffer_spans": self.buffer_spans, "batch_size": self.batch_size,
            "max_atoms": None if b is None else b.max_atoms, "max_edges": None if b is None else b.max_edges,
            "max_structures": None if b is None else b.max_structures,
            "oversized": None if b is None else b.oversized, "sizes_crc32": None if b is None else b.fingerprint(),
            "seed": self.seed, "drop_last": self.drop_last, "shard_id": self.shard_id, "num_shards": self.num_shards,
            "resume": None if self.resume is None else self.resume.to_dict(),
        } | ({"permutation": "keyed"} if self.permutation == "keyed" else {})  # fmt: skip

    def resume_from(self, saved: Mapping[str, Any], epoch: int, batch: int) -> tuple[BlockShufflePlan, int, int]:
        """This plan, resuming a checkpoint taken at ``(epoch, batch)`` by a plan whose ``to_dict()`` is ``saved``.

        On the same shard of the same shard count the position is kept as it is. Otherwise (another
        shard count, or another shard) the checkpoint becomes a segment of the resume point: the epoch
        continues with the batches no shard had delivered, dealt over this plan's shards, from batch 0.
        Every shard of a job must be checkpointed at the same batch, as data-parallel training steps
        them together. A checkpoint at the end of an epoch resumes at the start of the next one.

        Raises
        ------
        PlanError
            If any other setting differs (the global order would differ), the position is outside
            the checkpointed epoch, or the saved shard or resume point is out of range.
        ConfigTypeError
            If the saved ``shard_id``, ``num_shards`` or resume point holds something else than ints.
        """
        mine = self.to_dict()
        differing = [k for k in sorted(set(saved) | set(mine)) if k not in ELASTIC_KEYS and saved.get(k) != mine.get(k)]
        if differing:
            raise PlanError(
                "state_dict belongs to a different plan: "
                + ", ".join(f"{k}={saved.get(k)!r} (loader has {mine.get(k)!r})" for k in differing)
            )
        saved_shards = state_int(saved.get("num_shards"), "state_dict['plan']['num_shards']", minimum=1)
        saved_shard = state_int(saved.get("shard_id"), "state_dict['plan']['shard_id']")
        if saved_shard >= saved_shards:
            raise PlanError(f"state_dict['plan']['shard_id'] is {saved_shard}, outside its {saved_shards} shards")
        point = ResumePoint.from_dict(saved.get("resume"))
        if point is not None and point.epoch != epoch:
            point = None  # an earlier epoch's resume says nothing about this one
        same_shard = (saved_shard, saved_shards) == (self.shard_id, self.num_shards)
        if same_shard or batch == 0:
            return (self if point == self.resume else replace(self, resume=point)), epoch, batch
        segments = (point.segments if point is not None else ()) + ((saved_shards, batch),)
        resumed = replace(self, resume=ResumePoint(epoch=epoch, segments=segments))
        if resumed.epoch(epoch).num_batches == 0:
            return replace(self, resume=None), epoch + 1, 0
        return resumed, epoch, 0


def block_plan(
    config: BlockShuffle,
    *,
    num_samples: int,
    batch_size: int | None,
    budget: BudgetPlan | None,
    seed: int,
    drop_last: bool,
    shard_id: int,
    num_shards: int,
    chunking: Callable[[], StoreChunking] | None,
    sample_sizes: Callable[[], tuple[CountArray, CountArray]],
) -> BlockShufflePlan:
    """The :class:`BlockShufflePlan` of ``config``, its default sizes taken from ``chunking()``.

    ``chunking`` (called once, reading no data) describes the store; ``None`` means fixed-size spans
    and the default cache budget, with one byte per atom row for the buffer estimate.
    """
    bounds, buffer_spans = block_sizes(config, num_samples, chunking, sample_sizes)
    if budget is not None:
        budget = replace(budget, shuffle=False, shard_id=0, num_shards=1)
    return BlockShufflePlan(
        span_bounds=bounds, buffer_spans=buffer_spans, batch_size=None if budget is not None else batch_size,
        budget=budget, seed=seed, drop_last=drop_last, shard_id=shard_id, num_shards=num_shards,
    )  # fmt: skip


def block_sizes(
    config: BlockShuffle,
    num_samples: int,
    chunking: Callable[[], StoreChunking] | None,
    sample_sizes: Callable[[], tuple[CountArray, CountArray]],
) -> tuple[IndexArray, int]:
    """The span offsets and buffer size ``config`` means for a store (its defaults from ``chunking()``)."""
    info = chunking() if chunking is not None else None
    if config.span_size is not None:
        bounds = fixed_spans(num_samples, config.span_size)
    elif info is not None and info.span_bounds is not None:
        bounds = check_span_bounds(info.span_bounds, num_samples)
    else:
        bounds = fixed_spans(num_samples, DEFAULT_SPAN_SIZE)
    buffer_spans = config.buffer_spans
    if buffer_spans is None:
        n_atoms, n_edges = sample_sizes()
        atom_b, edge_b, system_b = (1, 0, 0) if info is None else (info.atom_bytes, info.edge_bytes, info.system_bytes)
        total = int(n_atoms.sum(dtype=np.int64)) * atom_b + int(n_edges.sum(dtype=np.int64)) * edge_b
        total += system_b * int(n_atoms.size)  # the bytes of every structure, without a per-structure copy
        buffer_spans = default_buffer_spans(
            bounds, np.array([total], dtype=np.int64), DEFAULT_CACHE_BYTES if info is None else info.cache_bytes
        )
    return bounds, buffer_spans
