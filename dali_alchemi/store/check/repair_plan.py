"""Repair: infer how each sample's neighbor list was stored, and rewrite it store-global as the format requires.

nvalchemi 0.2.0's ``append`` does not re-base ``neighbor_list`` (store-format notes, section 9). Every
write or append call of it stores ``local + atoms_ptr[i] - atoms_ptr[g]``, where ``g`` is the first
sample of that call: the first ``write`` is store-global (``g = 0``), an appended list or Batch (and
the dynamics ``ZarrData`` sink, which appends every write) is batch-local, and a single appended
AtomicData is sample-local (``g = i``). Its ``defragment`` then moves rows without re-basing them.

So sample ``i``'s stored values are ``local + atoms_ptr[i] - c_i`` for an unknown offset ``c_i``, and
the repaired values are ``stored + c_i``. What the values pin down (:func:`infer`):

- Every local index lies in ``[0, n_atoms)``, so ``c_i`` lies in ``[a_i - min, a_i - max + n_atoms - 1]``.
  When the neighbor list reaches its first and its last atom the interval is one value: the offset is
  read off the data, whatever wrote it (**exact**).
- Otherwise the append model narrows it: ``c_i`` is 0 or ``atoms_ptr[g]`` for a sample ``g <= i``;
  the latest exact sample in ``[g, i)`` must have the same offset (they belong to one call), and so
  must a later exact sample whose call started at or before ``i``. One candidate left: repaired; more:
  **ambiguous**, refused with the samples listed (:class:`~dali_alchemi.errors.AmbiguousRepairError`).
- If some exact sample fits no append (rows moved since: a defragment after an append), the model
  does not hold, and a non-exact sample is repaired only when the exact samples on both sides of it
  agree on the offset; the others are refused as **undetermined** (:class:`~dali_alchemi.errors.RepairError`).

Everything is vectorised per window of samples (numpy): no Python loop per sample or per edge. The
rewrite itself (:mod:`dali_alchemi.store.write.repair`) is crash-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.csr import concat_aranges
from dali_alchemi.errors import AmbiguousRepairError, ConfigError, RepairError

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.open_checks import MetaInfo

__all__ = [
    "INFER_WINDOW_EDGES", "KINDS", "NEIGHBOR_LIST", "PREFERENCES", "RepairPlan", "infer", "stored_extents",
    "summary_lines"
]


NEIGHBOR_LIST = "neighbor_list"
INFER_WINDOW_EDGES = 1 << 22
"""Edge rows read per step while inferring (about 64 MiB of int64 pairs)."""

KINDS = ("global", "batch-local", "sample-local", "moved", "no-edges", "deleted", "ambiguous", "undetermined")
"""How a sample's neighbor list was found stored (codes are positions in this tuple).

``global``: store-global, as the format requires (unchanged). ``batch-local``: relative to the first
atom of an appended list or Batch (or a ``ZarrData`` sink write). ``sample-local``: relative to its own
first atom (a single appended AtomicData). ``moved``: rows moved after it was written, without re-basing
(a defragment after an append). ``no-edges`` and ``deleted`` samples are left as they are."""
GLOBAL, BATCH_LOCAL, SAMPLE_LOCAL, MOVED, NO_EDGES, DELETED, AMBIGUOUS, UNDETERMINED = range(len(KINDS))


_FAR = np.int64(1) << 62


@dataclass(frozen=True, slots=True)
class RepairPlan:
    """What :func:`infer` found: per physical sample, how it was stored and the offset that repairs it.

    Attributes
    ----------
    store
        The store's display name.
    kinds
        int8 ``[N]``: a position in :data:`KINDS` per physical sample.
    offsets
        int64 ``[N]``: what to add to each of the sample's stored indices (0: unchanged).
    edges_ptr
        The store's edge pointer, to map edge rows to samples.
    """

    store: str
    kinds: NDArray[np.int8]
    offsets: NDArray[np.int64]
    edges_ptr: NDArray[np.int64]

    @property
    def counts(self) -> dict[str, int]:
        """Samples of each kind (kinds with none left out)."""
        found = np.bincount(self.kinds, minlength=len(KINDS))
        return {kind: int(n) for kind, n in zip(KINDS, found, strict=True) if n}

    def samples_of(self, kind: int) -> tuple[int, ...]:
        """Physical indices of the samples of one kind."""
        return tuple(int(i) for i in np.flatnonzero(self.kinds == kind))

    @property
    def changed(self) -> NDArray[np.int64]:
        """Physical indices of the samples whose stored indices change."""
        return np.flatnonzero(self.offsets != 0)

    @property
    def edges_changed(self) -> int:
        """Edge rows that change."""
        return int(np.diff(self.edges_ptr)[self.offsets != 0].sum())

    @property
    def refused(self) -> bool:
        """Some samples are ambiguous or undetermined: the store cannot be repaired as a whole."""
        return bool(((self.kinds == AMBIGUOUS) | (self.kinds == UNDETERMINED)).any())

    def check(self) -> None:
        """Raise if the plan cannot be applied.

        Raises
        ------
        AmbiguousRepairError
            If several interpretations fit some samples (they are listed).
        RepairError
            If none can be determined for some samples (they are listed).
        """
        ambiguous, undetermined = self.samples_of(AMBIGUOUS), self.samples_of(UNDETERMINED)
        if ambiguous:
            raise AmbiguousRepairError(
                f"Store {self.store}: neighbor_list of {len(ambiguous)} samples (physical {_listed(ambiguous)}) "
                f"fits several ways of storing it (store-global, batch-local, sample-local) and too few of its "
                f"atoms appear in it to tell which; nothing was changed",
                ambiguous,
            )
        if undetermined:
            raise RepairError(
                f"Store {self.store}: neighbor_list of {len(undetermined)} samples (physical {_listed(undetermined)}) "
                f"cannot be re-based: rows were moved after an append (an nvalchemi defragment) or the values fit "
                f"no way of storing them, and too few of their atoms appear in them to recover the offset; "
                f"nothing was changed",
                undetermined,
            )


def _listed(samples: tuple[int, ...], limit: int = 20) -> str:
    shown = ", ".join(map(str, samples[:limit]))
    return shown + (f", ... ({len(samples) - limit} more)" if len(samples) > limit else "")


def stored_extents(arr: Any, meta: MetaInfo, window: int = INFER_WINDOW_EDGES) -> tuple[NDArray[np.int64], ...]:
    """Per physical sample, the smallest and largest stored index of its neighbor list (0 where none).

    Reads ``window`` edge rows at a time (whole samples); one ``reduceat`` per window, no loop per sample.
    """
    ptr = meta.edges_ptr
    n = meta.n_physical
    lo, hi = np.zeros(n, np.int64), np.zeros(n, np.int64)
    start = 0
    while start < n:
        stop = int(np.searchsorted(ptr, ptr[start] + window, side="right")) - 1
        stop = min(max(stop, start + 1), n)
        e0, e1 = int(ptr[start]), int(ptr[stop])
        if e1 > e0:
            rows = np.asarray(arr[e0:e1]).astype(np.int64, copy=False).reshape(e1 - e0, -1)
            counts = np.diff(ptr[start : stop + 1])
            with_edges = np.flatnonzero(counts > 0)
            firsts = ptr[start + with_edges] - e0
            lo[start + with_edges] = np.minimum.reduceat(rows.min(axis=1), firsts)
            hi[start + with_edges] = np.maximum.reduceat(rows.max(axis=1), firsts)
        start = stop
    return lo, hi


PREFERENCES = ("global", "batch-local", "sample-local")
"""What ``prefer=`` may name: how the user knows the store was grown, to settle ambiguous samples."""


def infer(
    root: Any, meta: MetaInfo, *, store: str, window: int = INFER_WINDOW_EDGES, prefer: str | None = None
) -> RepairPlan:
    """Infer, for every live sample, how its neighbor list was stored and the offset that re-bases it.

    Reads ``core/neighbor_list`` once, ``window`` edge rows at a time; see the module docstring for the
    rule. A store without a neighbor list, or without samples, gives a plan that changes nothing. ``prefer`` settles a
    sample that several interpretations fit when one of them is that one: ``"sample-local"`` (the
    store grew one AtomicData at a time), ``"batch-local"`` (it continues the call of the structure
    before it) or ``"global"``; the user says so, the data cannot.
    """
    if prefer is not None and prefer not in PREFERENCES:
        raise ConfigError(f"prefer must be one of {', '.join(PREFERENCES)} or None, got {prefer!r}")
    n = meta.n_physical
    kinds = np.full(n, NO_EDGES, np.int8)
    kinds[~meta.samples_mask] = DELETED
    offsets = np.zeros(n, np.int64)
    group = meta.schema.group_of(NEIGHBOR_LIST)
    if n == 0 or NEIGHBOR_LIST not in meta.schema.field_levels or group not in meta.groups or NEIGHBOR_LIST not in root[group]:
        return RepairPlan(store=store, kinds=kinds, offsets=offsets, edges_ptr=meta.edges_ptr)
    smin, smax = stored_extents(root[f"{group}/{NEIGHBOR_LIST}"], meta, window)
    bounds = _offset_bounds(meta, smin, smax)
    near = _exact_neighbours(bounds)
    candidates = _append_candidates(meta.atoms_ptr, bounds, near)
    in_model = bounds.exact & (candidates.n_valid >= 1)
    offsets[bounds.exact] = bounds.c_exact[bounds.exact]
    if (bounds.exact & ~in_model).any():
        model_ok = _settle_moved_store(bounds, near, in_model, kinds, offsets)
    else:
        model_ok = _settle_by_append_model(bounds, candidates, near, prefer, kinds, offsets)
    kinds[bounds.broken] = UNDETERMINED
    _label(kinds, offsets, bounds.a, model_ok)
    return RepairPlan(store=store, kinds=kinds, offsets=offsets, edges_ptr=meta.edges_ptr)


@dataclass(frozen=True, slots=True)
class _Bounds:
    """What each physical sample's stored extents say about its offset ``c_i``: ``c_lo <= c_i <= c_hi``."""

    a: NDArray[np.int64]
    """Each sample's first atom (``atoms_ptr[i]``)."""
    has: NDArray[np.bool_]
    """Live, with edges: the samples whose offset is inferred."""
    c_lo: NDArray[np.int64]
    c_hi: NDArray[np.int64]
    broken: NDArray[np.bool_]
    """The values span more rows than the sample has atoms: no offset fits."""
    exact: NDArray[np.bool_]
    """The interval is one value: the offset is read off the data."""
    c_exact: NDArray[np.int64]
    """That offset where ``exact``, else 0."""

    @property
    def loose(self) -> NDArray[np.bool_]:
        """The samples the data alone does not pin (neither exact nor broken)."""
        return self.has & ~self.exact & ~self.broken


def _offset_bounds(meta: MetaInfo, smin: NDArray[np.int64], smax: NDArray[np.int64]) -> _Bounds:
    """Each sample's interval of possible offsets, from its smallest and largest stored index."""
    a_ptr = meta.atoms_ptr
    a, atoms = a_ptr[:-1], np.diff(a_ptr)
    has = meta.samples_mask & (np.diff(meta.edges_ptr) > 0)
    c_lo = np.where(has, a - smin, -_FAR)
    c_hi = np.where(has, a - smax + atoms - 1, _FAR)
    exact = has & (c_lo == c_hi)
    return _Bounds(
        a=a, has=has, c_lo=c_lo, c_hi=c_hi, broken=has & (c_lo > c_hi), exact=exact, c_exact=np.where(exact, c_lo, 0)
    )


@dataclass(frozen=True, slots=True)
class _ExactNeighbours:
    """Per sample, the exact samples on either side of it, and whether the later one pins it."""

    prev_exact: NDArray[np.int64]
    """The latest exact sample before ``i`` (-1: none)."""
    next_exact: NDArray[np.int64]
    """The first exact sample after ``i`` (``n``: none)."""
    c_next: NDArray[np.int64]
    """That sample's offset (0: none)."""
    pinned: NDArray[np.bool_]
    """The later exact sample's call started at or before ``i``, so ``i`` has its offset."""


def _exact_neighbours(bounds: _Bounds) -> _ExactNeighbours:
    """The nearest exact samples before and after each sample, by running maxima and minima (no loop)."""
    exact, a = bounds.exact, bounds.a
    n = exact.size
    idx = np.arange(n, dtype=np.int64)
    last_exact = np.maximum.accumulate(np.where(exact, idx, -1))
    prev_exact = np.concatenate([[-1], last_exact[:-1]])  # latest exact sample before i
    next_exact = np.minimum.accumulate(np.where(exact, idx, n)[::-1])[::-1]
    next_exact = np.concatenate([next_exact[1:], [n]])  # first exact sample after i
    c_next = np.where(next_exact < n, bounds.c_exact[np.minimum(next_exact, n - 1)], 0)
    # A later exact sample whose call started at or before i (offset atoms_ptr[g], 1 <= c <= a_i) pins i.
    pinned = (next_exact < n) & (c_next >= 1) & (c_next <= a)
    return _ExactNeighbours(prev_exact=prev_exact, next_exact=next_exact, c_next=c_next, pinned=pinned)


@dataclass(frozen=True, slots=True)
class _Candidates:
    """The offsets the append model allows: one (sample, value) pair per candidate, and per-sample tallies."""

    owner: NDArray[np.int64]
    """The sample of each pair."""
    value: NDArray[np.int64]
    """The candidate offset of each pair (``atoms_ptr[g]``, ``1 <= g <= i``)."""
    ok: NDArray[np.bool_]
    """The pair agrees with the exact samples around its sample."""
    n_valid: NDArray[np.int64]
    """Per sample: how many offsets fit, store-global (0) included."""
    chosen: NDArray[np.int64]
    """Per sample: the offset that fits, meaningful where exactly one does."""
    global_ok: NDArray[np.bool_]
    """Per sample: store-global (offset 0) fits."""


def _append_candidates(a_ptr: NDArray[np.int64], bounds: _Bounds, near: _ExactNeighbours) -> _Candidates:
    """Every offset the append model allows each sample, checked against the exact samples around it."""
    n, a = bounds.a.size, bounds.a
    c_lo, c_hi, c_exact = bounds.c_lo, bounds.c_hi, bounds.c_exact
    prev_exact, c_next, pinned = near.prev_exact, near.c_next, near.pinned
    # Candidate offsets atoms_ptr[g], 1 <= g <= i, inside [c_lo, c_hi], one pair per (sample, value).
    values = np.unique(a_ptr[1:n])
    g_last = np.searchsorted(a_ptr[:n], values, side="right") - 1  # latest sample starting at that value
    cand = np.flatnonzero(bounds.has & ~bounds.broken)
    p0 = np.searchsorted(values, np.maximum(c_lo[cand], 1), side="left")
    p1 = np.searchsorted(values, np.minimum(c_hi[cand], a[cand]), side="right")
    count = np.maximum(p1 - p0, 0)
    pos = concat_aranges(p0, count)
    owner = np.repeat(cand, count)
    value, start = values[pos], np.minimum(g_last[pos], owner)
    prev = prev_exact[owner]
    ok = (prev < start) | (c_exact[np.maximum(prev, 0)] == value)
    ok &= ~pinned[owner] | (c_next[owner] == value)
    n_valid = np.bincount(owner[ok], minlength=n)
    chosen = np.zeros(n, np.int64)
    chosen[owner[ok]] = value[ok]  # meaningful where exactly one is valid
    global_ok = bounds.has & ~bounds.broken & (c_lo <= 0) & (c_hi >= 0) & ~pinned
    n_valid += global_ok
    chosen[global_ok] = 0
    return _Candidates(owner=owner, value=value, ok=ok, n_valid=n_valid, chosen=chosen, global_ok=global_ok)


def _settle_moved_store(
    bounds: _Bounds,
    near: _ExactNeighbours,
    in_model: NDArray[np.bool_],
    kinds: NDArray[np.int8],
    offsets: NDArray[np.int64],
) -> NDArray[np.bool_]:
    """Rows moved (some exact sample fits no append): only exact samples on both sides agreeing on the
    offset pin a loose one. Fills ``kinds`` and ``offsets``; returns the samples repaired."""
    exact, loose = bounds.exact, bounds.loose
    prev_exact, next_exact, c_next = near.prev_exact, near.next_exact, near.c_next
    n = exact.size
    agree = (prev_exact >= 0) & (next_exact < n) & (bounds.c_exact[np.maximum(prev_exact, 0)] == c_next)
    fits = agree & (bounds.c_lo <= c_next) & (c_next <= bounds.c_hi)
    settled = loose & fits
    offsets[settled] = c_next[settled]
    kinds[loose & ~fits] = UNDETERMINED
    kinds[exact & ~in_model] = MOVED
    return (exact & in_model) | settled


def _settle_by_append_model(
    bounds: _Bounds,
    candidates: _Candidates,
    near: _ExactNeighbours,
    prefer: str | None,
    kinds: NDArray[np.int8],
    offsets: NDArray[np.int64],
) -> NDArray[np.bool_]:
    """The append model holds: a loose sample with one fitting offset takes it; ``prefer`` settles those
    with several; the rest are ambiguous (several) or undetermined (none). Fills ``kinds`` and
    ``offsets``; returns the samples repaired."""
    loose, n_valid = bounds.loose, candidates.n_valid
    settled = loose & (n_valid == 1)
    offsets[settled] = candidates.chosen[settled]
    if prefer is not None:
        settled |= _settle_by_preference(bounds, candidates, near, prefer, loose & (n_valid > 1), offsets)
    kinds[loose & ~settled & (n_valid > 1)] = AMBIGUOUS
    kinds[loose & (n_valid == 0)] = UNDETERMINED
    return bounds.exact | settled


def _settle_by_preference(
    bounds: _Bounds,
    candidates: _Candidates,
    near: _ExactNeighbours,
    prefer: str,
    ambiguous: NDArray[np.bool_],
    offsets: NDArray[np.int64],
) -> NDArray[np.bool_]:
    """Give the ``ambiguous`` samples that the preferred way of storing fits its offset; returns them."""
    n = bounds.a.size
    if prefer == "global":
        pick, preferred = ambiguous & candidates.global_ok, np.zeros(n, np.int64)
    else:
        preferred = bounds.a.copy() if prefer == "sample-local" else bounds.c_exact[np.maximum(near.prev_exact, 0)]
        owner = candidates.owner
        match = candidates.ok & (candidates.value == preferred[owner])
        pick = ambiguous & (np.bincount(owner[match], minlength=n) > 0)
    offsets[pick] = preferred[pick]
    return pick


def _label(kinds: NDArray[np.int8], offsets: NDArray[np.int64], a: NDArray[np.int64], ok: NDArray[np.bool_]) -> None:
    """Name how each repaired sample was stored: global, batch-local (shares its offset with a neighbour
    of the same call), sample-local (alone at its own first atom) or moved (any other offset)."""
    order = np.flatnonzero(ok & (kinds == NO_EDGES))
    if order.size == 0:
        return
    c = offsets[order]
    same_prev = np.concatenate([[False], c[1:] == c[:-1]])
    same_next = np.concatenate([c[:-1] == c[1:], [False]])
    kind = np.full(order.size, MOVED, np.int8)
    kind[c == 0] = GLOBAL
    start = (c > 0) & (c == a[order])
    kind[(c > 0) & (c <= a[order]) & (same_prev | same_next)] = BATCH_LOCAL
    kind[start & ~same_prev & ~same_next] = SAMPLE_LOCAL
    kinds[order] = kind


def summary_lines(plan: RepairPlan) -> list[str]:
    """What a repair of this plan changes, as lines for a person to read."""
    counts = plan.counts
    live = sum(v for k, v in counts.items() if k != "deleted")
    lines = [f"{plan.store}: {live} live samples; neighbor_list stored as:"]
    lines += [f"  {kind}: {counts[kind]}" for kind in KINDS if kind in counts]
    changed = plan.changed
    lines.append(f"{changed.size} samples ({plan.edges_changed} edge rows) to re-base to store-global indices")
    for kind in (AMBIGUOUS, UNDETERMINED):
        samples = plan.samples_of(kind)
        if samples:
            lines.append(f"{KINDS[kind]} samples (physical): {_listed(samples)}")
    return lines
