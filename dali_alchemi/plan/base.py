"""The plan seam: what a plan is, and the epoch plan every loader consumes.

A *plan* decides, for one shard, which structures an epoch visits in which order and where each
batch ends. It returns that decision as an :class:`EpochPlan`, plain arrays and nothing else, and
everything downstream (the DALI source, the iterator, the plain DataLoader) uses exactly those arrays:
nobody re-derives batches from a batch size. Windows (several consecutive batches read with one call
to the reader) are cut from the epoch plan by :meth:`EpochPlan.window`; they decide how structures are
*read* together, never which structures form a batch.

The shape of an epoch plan admits, with no special case downstream: batches of varying size (the
``batch_ptr`` offsets), orders built from spans of contiguous structures (any ``order``), indices over
several stores (``order`` indexes whatever reader the plan was made for), and an exact resume (the
loader's position is ``(epoch, batch)``, and :meth:`Plan.to_dict` is the plan's identity as plain data).
Pure numpy; no I/O, no torch, no DALI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from dali_alchemi.errors import ConfigTypeError, PlanError, PlanIndexError

if TYPE_CHECKING:
    from dali_alchemi.plan.keyed import ShardOrder
    from dali_alchemi.types import IndexArray, PtrArray

__all__ = [
    "STATE_KEYS", "ElasticPlan", "EpochPlan", "Plan", "Window", "check_state", "restore", "state_int", "window_starts",
]  # fmt: skip


STATE_KEYS = ("epoch", "batch", "plan")
"""The entries of a loader's ``state_dict()``, all required, no others."""


@dataclass(frozen=True, slots=True)
class Window:
    """The structures one reader call reads, and where each batch of them ends.

    Attributes
    ----------
    indices
        ``[n]`` int64 reader indices, the window's batches concatenated in order.
    batch_bounds
        ``[b + 1]`` int64 offsets into ``indices``: batch ``k`` of the window is
        ``indices[batch_bounds[k]:batch_bounds[k + 1]]``.
    first_batch
        The epoch-wide number of the window's first batch.
    """

    indices: IndexArray
    batch_bounds: PtrArray
    first_batch: int

    @property
    def num_batches(self) -> int:
        return int(self.batch_bounds.size - 1)


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """One shard's epoch: the structures in order and the offsets where each batch ends.

    Attributes
    ----------
    epoch
        The epoch this plan is for.
    order
        ``[n]`` int64 reader indices in the order the epoch visits them (padding included): an array,
        or for a keyed order a :class:`~dali_alchemi.plan.keyed.ShardOrder` that computes the entries
        it is sliced at (``np.asarray`` gives the array).
    batch_ptr
        ``[num_batches + 1]`` int64, starting at 0 and strictly increasing: batch ``i`` is
        ``order[batch_ptr[i]:batch_ptr[i + 1]]``. Structures of ``order`` past ``batch_ptr[-1]`` are
        not visited (a dropped last batch).

    Raises
    ------
    PlanError
        At construction, when ``batch_ptr`` does not start at 0, does not increase strictly or runs
        past ``order``.
    """

    epoch: int
    order: IndexArray | ShardOrder
    batch_ptr: PtrArray

    def __post_init__(self) -> None:
        ptr = self.batch_ptr
        if ptr.ndim != 1 or ptr.size < 1 or ptr[0] != 0:
            raise PlanError(f"batch_ptr must be a 1-D array starting at 0, got {ptr[:5].tolist()}...")
        if ptr.size > 1 and (bool(np.any(np.diff(ptr) < 1)) or int(ptr[-1]) > self.order.size):
            raise PlanError(
                f"batch_ptr must rise strictly and end within the epoch's {self.order.size} structures, "
                f"ends at {int(ptr[-1])}"
            )

    @property
    def num_batches(self) -> int:
        """Batches in this epoch (the same on every shard of a plan)."""
        return int(self.batch_ptr.size - 1)

    def batch(self, index: int) -> IndexArray:
        """The reader indices of batch ``index``."""
        if not 0 <= index < self.num_batches:
            raise PlanIndexError(f"batch {index} out of range: epoch {self.epoch} has {self.num_batches} batches")
        return self.order[int(self.batch_ptr[index]) : int(self.batch_ptr[index + 1])]

    def batches(self, first_batch: int = 0) -> list[IndexArray]:
        """Every batch from ``first_batch`` on, as index arrays (the reference view of the plan)."""
        self._check_batch(first_batch)
        ptr = self.batch_ptr.tolist()
        return [self.order[ptr[i] : ptr[i + 1]] for i in range(first_batch, self.num_batches)]

    def num_windows(self, batches_per_window: int, first_batch: int = 0, *, ramp: bool = False) -> int:
        """Windows needed from ``first_batch`` to the end of the epoch (see :func:`window_starts`)."""
        self._check_batch(first_batch)
        return _num_windows(self.num_batches - first_batch, batches_per_window, ramp)

    def window(self, index: int, batches_per_window: int, first_batch: int = 0, *, ramp: bool = False) -> Window:
        """Window ``index`` when the epoch is read from ``first_batch`` in windows of up to ``batches_per_window`` batches.

        With ``ramp`` the first windows are shorter (:func:`window_starts`), so the first batch waits for
        one batch's reads, not a whole window's.

        Raises
        ------
        PlanIndexError
            If ``index`` is past the end of the epoch (an ``IndexError``).
        """
        n_windows = self.num_windows(batches_per_window, first_batch, ramp=ramp)
        if not 0 <= index < n_windows:
            raise PlanIndexError(
                f"window {index} out of range: epoch {self.epoch} has {n_windows} windows from batch {first_batch}"
            )
        remaining = self.num_batches - first_batch
        b0 = first_batch + _window_start(index, remaining, batches_per_window, ramp)
        b1 = first_batch + _window_start(index + 1, remaining, batches_per_window, ramp)
        lo, hi = int(self.batch_ptr[b0]), int(self.batch_ptr[b1])
        return Window(indices=self.order[lo:hi], batch_bounds=self.batch_ptr[b0 : b1 + 1] - lo, first_batch=b0)

    def _check_batch(self, first_batch: int) -> None:
        if not 0 <= first_batch <= self.num_batches:
            raise PlanError(f"first_batch must be in [0, {self.num_batches}], got {first_batch}")


def window_starts(num_batches: int, batches_per_window: int, *, ramp: bool = False) -> PtrArray:
    """Where each window of ``num_batches`` batches starts, and the end: ``[num_windows + 1]`` batch offsets.

    Windows hold ``batches_per_window`` batches; the last may be short. With ``ramp`` the first few
    hold 1, 2, 4, ... batches (powers of two below ``batches_per_window``): a loader ramps every epoch
    (nothing is read ahead across an epoch's end), so its first batch waits for the reads of one batch
    rather than of a whole window (on a store far bigger than memory, a shuffled window of 16 batches
    reads 16 times the chunks of one from a cold disk), for ``log2(batches_per_window)`` more reader
    calls per epoch.

    Raises
    ------
    PlanError
        If ``batches_per_window`` is below 1 or ``num_batches`` is negative.
    """
    n_windows = _num_windows(num_batches, batches_per_window, ramp)
    starts = [_window_start(i, num_batches, batches_per_window, ramp) for i in range(n_windows + 1)]  # per window
    return np.asarray(starts, dtype=np.int64)


def _ramp_windows(batches_per_window: int, ramp: bool) -> int:
    """How many windows of 1, 2, 4, ... batches come before the whole ones."""
    return (batches_per_window - 1).bit_length() if ramp else 0


def _num_windows(num_batches: int, batches_per_window: int, ramp: bool) -> int:
    if batches_per_window < 1 or num_batches < 0:
        raise PlanError(f"windows need batches_per_window >= 1 and num_batches >= 0, got {batches_per_window}, {num_batches}")
    ramped = _ramp_windows(batches_per_window, ramp)
    in_ramp = (1 << ramped) - 1  # batches the whole ramp holds
    if num_batches <= in_ramp:
        return num_batches.bit_length()  # windows starting at 0, 1, 3, 7, ... below num_batches
    return ramped + -(-(num_batches - in_ramp) // batches_per_window)


def _window_start(index: int, num_batches: int, batches_per_window: int, ramp: bool) -> int:
    """The first batch of window ``index`` (``num_batches`` for the end), in constant time."""
    ramped = _ramp_windows(batches_per_window, ramp)
    start = (1 << index) - 1 if index < ramped else (1 << ramped) - 1 + (index - ramped) * batches_per_window
    return min(start, num_batches)


@runtime_checkable
class Plan(Protocol):
    """Decides each epoch of one shard: implement :meth:`epoch`, :attr:`num_samples` and :meth:`to_dict`.

    ``epoch(e)`` must be a pure function of the plan's settings and ``e`` (no hidden state), so every
    process (a DALI worker, another rank, a resumed job) rebuilds the same epoch. Every shard of one
    plan must have the same number of batches in an epoch, or collective operations deadlock at its
    end. Plans are pickled into DALI's worker processes: keep them small (settings, not orders).
    """

    @property
    def num_samples(self) -> int:
        """The length of the reader this plan was made for."""
        ...

    def epoch(self, epoch: int) -> EpochPlan:
        """This shard's epoch ``epoch``."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """The plan's identity as JSON-ready plain data (kind and settings), stored in loader state."""
        ...


@runtime_checkable
class ElasticPlan(Plan, Protocol):
    """A plan that can resume a checkpoint taken on another number of shards (or by another shard).

    :meth:`resume_from` returns the plan to continue with and the position ``(epoch, batch)`` to
    continue at, given the ``to_dict()`` of the plan that was checkpointed at ``(epoch, batch)``.
    """

    def resume_from(self, saved: Mapping[str, Any], epoch: int, batch: int) -> tuple[Plan, int, int]: ...


def state_int(value: Any, name: str, *, minimum: int = 0) -> int:
    """``value`` as an ``int`` if it is an integer (not a ``bool``) of at least ``minimum``.

    Raises
    ------
    ConfigTypeError
        If ``value`` is not an integer (a float, a bool, a string, ``None``); names ``name``.
    PlanError
        If it is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigTypeError(
            f"{name} must be an int, got {value!r} ({type(value).__name__}); load the dict a loader's "
            "state_dict() returned"
        )
    if value < minimum:
        raise PlanError(
            f"{name} must be >= {minimum}, got {int(value)}; load the dict a loader's state_dict() returned"
        )
    return int(value)


def check_state(state: Any) -> tuple[int, int, dict[str, Any]]:
    """The ``(epoch, batch, plan settings)`` of a loader's ``state_dict()``, every entry checked.

    Raises
    ------
    ConfigTypeError
        If ``state`` is not a mapping (``None``, say), ``epoch``/``batch`` are not ints (a float, a
        bool), or ``plan`` is not a mapping.
    PlanError
        If an entry is missing, an unknown entry is present, or ``epoch``/``batch`` are negative.
    """
    if not isinstance(state, Mapping):
        raise ConfigTypeError(
            f"load_state_dict needs the dict a loader's state_dict() returned ({{'epoch', 'batch', 'plan'}}), "
            f"got {state!r} ({type(state).__name__})"
        )
    missing = [key for key in STATE_KEYS if key not in state]
    unknown = sorted(repr(key) for key in state if key not in STATE_KEYS)
    if missing or unknown:
        problems = ([f"missing {missing}"] if missing else []) + (
            [f"unknown [{', '.join(unknown)}]"] if unknown else []
        )
        raise PlanError(
            f"state_dict entries are {list(STATE_KEYS)}; this one has {' and '.join(problems)}; "
            "load the dict a loader's state_dict() returned"
        )
    epoch = state_int(state["epoch"], "state_dict['epoch']")
    batch = state_int(state["batch"], "state_dict['batch']")
    saved = state["plan"]
    if not isinstance(saved, Mapping):
        raise ConfigTypeError(
            f"state_dict['plan'] must be a dict (the plan's to_dict()), got {saved!r} ({type(saved).__name__})"
        )
    return epoch, batch, dict(saved)


def restore(plan: Plan, state: Mapping[str, Any]) -> tuple[Plan, int, int]:
    """The plan and position ``(epoch, batch)`` a loader continues with after loading ``state``.

    ``state`` is a loader's ``state_dict()``: ``{"epoch", "batch", "plan": plan.to_dict()}``, checked
    entry by entry (:func:`check_state`). An :class:`ElasticPlan` decides itself (it may accept another
    shard count); any other plan must match the saved one in every setting. Both loaders call this, so
    they resume alike.

    Raises
    ------
    ConfigTypeError
        If ``state`` is not a mapping, or an entry has the wrong type (``epoch``/``batch`` not an int).
    PlanError
        If an entry is missing or unknown, ``epoch``/``batch`` are negative, the state belongs to a
        different plan (naming the settings that differ), or its batch is outside its epoch.
    """
    epoch, batch, saved = check_state(state)
    if isinstance(plan, ElasticPlan):
        plan, epoch, batch = plan.resume_from(saved, epoch, batch)
    else:
        mine = plan.to_dict()
        differing = sorted(set(saved) | set(mine), key=lambda k: (k not in mine, k))
        differing = [k for k in differing if saved.get(k) != mine.get(k)]
        if differing:
            raise PlanError(
                "state_dict belongs to a different plan: "
                + ", ".join(f"{k}={saved.get(k)!r} (loader has {mine.get(k)!r})" for k in differing)
            )
    num_batches = plan.epoch(epoch).num_batches
    if not 0 <= batch <= num_batches:
        raise PlanError(
            f"state_dict['batch'] is {batch}, outside epoch {epoch}'s {num_batches} batches (0 to {num_batches})"
        )
    return plan, epoch, batch
