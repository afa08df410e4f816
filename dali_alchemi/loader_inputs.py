"""What both loaders make of their arguments, once: the reader, the fields, the plan and the pad shape.

:func:`resolve_inputs` takes the store-or-reader argument (a path or URL, a packed reader, a reader with
nvalchemi's ``read_many`` contract, or a list of them), opens it, selects the fields, builds the plan
from a :class:`~dali_alchemi.plan.Plan` or :class:`~dali_alchemi.plan.PlanArguments`, and works out the
padded shape. A step that fails closes what the earlier ones opened. :class:`~dali_alchemi.pipeline.loader.DALIDataLoader`
and :func:`~dali_alchemi.baseline.plain_dataloader` both start here, so they mean the same by every
argument; neither imports :mod:`dali_alchemi.interop`, which only this module reaches into.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import numpy as np

from dali_alchemi.errors import ConfigError, PlanError, StoreChangedError
from dali_alchemi.interop.read_many import ReadManyAdapter, ReadManyReader, as_packed_reader
from dali_alchemi.plan import PadShape, Plan, PlanArguments, pad_shape, reader_plan
from dali_alchemi.store.format.location import StoreLike
from dali_alchemi.store.format.protocol import PackedReader, select_fields
from dali_alchemi.store.read.advice import warn_if_slow_layout
from dali_alchemi.store.read.multi import MultiReader
from dali_alchemi.store.read.opening import open_reader

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.batch import Batch
    from dali_alchemi.types import CountArray

__all__ = [
    "SIZE_SAMPLE", "SIZE_SAMPLE_RUN", "LoaderInputs", "LoaderSource", "check_reader_length", "check_shareable",
    "evenly_spaced", "nvalchemi_batches", "open_source", "resolve_inputs"
]  # fmt: skip

LoaderSource: TypeAlias = (
    StoreLike | PackedReader | ReadManyReader | Sequence[StoreLike | PackedReader | ReadManyReader]
)
"""What a loader reads: a store path or URL, a packed reader, a ``read_many`` reader, or a list of them."""


@dataclass
class LoaderInputs:
    """A loader's reader (and whether the loader opened it), fields, plan and pad shape."""

    reader: PackedReader
    owns_reader: bool
    fields: tuple[str, ...]
    plan: Plan
    pad_shape: PadShape | None
    sample_sizes: Callable[[], tuple[CountArray, CountArray]]
    """Atom and edge counts of every structure, from the reader's pointers: computed once, when first asked."""
    size_sample: Callable[[], tuple[CountArray, CountArray]]
    """Atom and edge counts of at most :data:`SIZE_SAMPLE` structures spread evenly over the reader (every
    structure of a smaller one): what estimates need, in memory that does not grow with the store."""

    def close(self) -> None:
        """Close the reader if the loader opened it."""
        if self.owns_reader:
            self.reader.close()


def resolve_inputs(
    store_or_reader: LoaderSource,
    *,
    plan: Plan | PlanArguments | None,
    arguments: PlanArguments,
    fields: tuple[str, ...] | None,
    cache_bytes: int | None,
    loader: str,
    shared_cache: str | None = None,
) -> LoaderInputs:
    """Open ``store_or_reader`` and build what a loader reads: see the module docstring.

    ``plan`` is a plan, or a :class:`~dali_alchemi.plan.PlanArguments` that stands for the loader's plan
    arguments (which must then be left at their defaults); ``arguments`` are those the loader was given.
    ``loader`` names the loader in the slow-layout warning.

    Raises
    ------
    PlanError
        If ``plan`` is a ``PlanArguments`` and plan arguments were given too, or the plan does not fit
        the reader (see :func:`~dali_alchemi.plan.arguments.build_plan`).
    """
    if isinstance(plan, PlanArguments):
        given = arguments.given()
        if given:
            raise PlanError(
                f"plan=PlanArguments(...) is mutually exclusive with {', '.join(given)}: pass them inside it"
            )
        arguments, plan = plan, None
    reader, owns = open_source(
        as_packed_reader(store_or_reader), fields=fields, cache_bytes=cache_bytes, shared_cache=shared_cache
    )
    try:
        selected = select_fields(reader, fields)
        sizes = _once(lambda: reader.sample_sizes(np.arange(len(reader), dtype=np.int64)))
        built = reader_plan(plan, arguments, reader, selected, sizes)
        if plan is not None or arguments.shuffle:
            warn_if_slow_layout(reader, loader)
        shape = pad_shape(arguments, built)
    except BaseException:
        if owns:
            reader.close()
        raise
    sample = _once(lambda: reader.sample_sizes(evenly_spaced(len(reader), SIZE_SAMPLE)))
    return LoaderInputs(reader, owns, tuple(selected), built, shape, sizes, sample)


SIZE_SAMPLE = 65_536
"""Structures whose sizes a loader's estimates look at (DALI's shared-memory hint): every structure of a
store up to this size, an even sample of a bigger one, so that at 10^8 structures no loader holds two
int64 counts per structure for an estimate."""

SIZE_SAMPLE_RUN = 256
"""Consecutive structures in each run of the size sample (see :func:`evenly_spaced`)."""


def evenly_spaced(n: int, limit: int, *, run: int = SIZE_SAMPLE_RUN) -> NDArray[np.int64]:
    """``arange(n)`` when ``n <= limit``, else at most ``limit`` indices, in runs of ``run`` consecutive ones spread evenly from the first to the last.

    Runs, not single indices: the pointers a size is read from are pages of a memory map (the shared
    pointer copy), and each page fault maps its neighbours too (64 KiB at a time on Linux). Single indices
    spread over 10^8 structures touched every page of the copy; ``limit // run`` runs touch a few MB.
    """
    if n <= limit:
        return np.arange(n, dtype=np.int64)
    runs = max(2, limit // run)  # the first and the last structure always among them
    run = max(1, limit // runs)
    starts = np.linspace(0, n - run, runs).astype(np.int64)
    return (starts[:, None] + np.arange(run, dtype=np.int64)).reshape(-1)


def check_reader_length(reader: PackedReader, plan: Plan, loader: str) -> None:
    """Refuse to start an iteration whose plan was made for another length than the reader has now.

    A reader refreshed after another writer appended (or deleted) changes its length, but a loader's
    plan, and the copies of the reader its worker processes hold, keep the length the loader was built
    with: iterating on would read only the old samples, or fail part way with an index out of range.

    Raises
    ------
    StoreChangedError
        If ``len(reader)`` differs from ``plan.num_samples``; names both lengths and the fix.
    """
    now, planned = len(reader), int(plan.num_samples)
    if now != planned:
        raise StoreChangedError(
            f"The reader now has {now} samples, but this {loader}'s plan was made for {planned} (the store "
            f"changed and the reader was refreshed); build a new {loader} over the reader to read the store "
            "as it is now (a loader keeps the plan, and its workers the reader, it was built with)"
        )


def open_source(
    source: StoreLike | PackedReader | Sequence[StoreLike | PackedReader],
    *,
    fields: tuple[str, ...] | None,
    cache_bytes: int | None,
    shared_cache: str | None = None,
) -> tuple[PackedReader, bool]:
    """The reader a loader reads through and whether it must close it: a list or tuple is a MultiReader.

    Anything else goes to :func:`~dali_alchemi.store.read.opening.open_reader` (a reader as it is, a store
    opened, sharing decoded chunks through ``shared_cache`` when given; a MultiReader shares none).
    """
    if isinstance(source, (list, tuple)):
        return MultiReader(source, fields=fields, cache_bytes=cache_bytes), True
    return open_reader(
        cast("StoreLike | PackedReader", source), fields=fields, cache_bytes=cache_bytes, shared_cache=shared_cache
    )


def _once(compute: Callable[[], Any]) -> Callable[[], Any]:
    done: list[Any] = []

    def get() -> Any:
        if not done:
            done.append(compute())
        return done[0]

    return get


def check_shareable(source: Any) -> None:
    """Refuse ``shared_cache=True`` for a source that would silently not share (see ``DALIDataLoader``).

    Raises
    ------
    ConfigError
        For a list of stores (the MultiReader's members keep caches of their own), a reader passed in
        (opened without the loader's shared folder) or a ``read_many`` reader (no decoded-chunk cache).
    """
    source = as_packed_reader(source)
    if isinstance(source, list | tuple):
        why = "a list of stores: the stores a MultiReader opens keep caches of their own"
    elif isinstance(source, ReadManyAdapter):
        why = f"a read_many reader ({type(source.reader).__name__}), which has no decoded-chunk cache"
    elif isinstance(source, PackedReader):
        why = (
            f"a reader passed in ({type(source).__name__}), opened without the loader's shared folder; "
            "open it with AtomicDataZarrReader(..., shared_cache=FOLDER) instead"
        )
    else:
        return
    raise ConfigError(f"shared_cache=True needs one store the loader opens itself, got {why}")


def nvalchemi_batches() -> Callable[[Batch], Any]:
    """What turns a Batch into nvalchemi's (``batch_type="nvalchemi"``); needs nvalchemi-toolkit."""
    from dali_alchemi.interop.nvalchemi_batch import from_batch

    return from_batch
