"""DALIDataLoader: the user-facing loader that owns epochs, resume state and the pipeline's lifetime.

It asks its :class:`~dali_alchemi.plan.Plan` for each epoch, reads each window of the plan's batches
with one packed read through :class:`~dali_alchemi.pipeline.source.WindowSource`, lets DALI stage and
copy the data (``.gpu()`` on CUDA), and yields :class:`~dali_alchemi.batch.Batch` objects built on the
device, cut where the plan says. It reads through any :class:`~dali_alchemi.store.format.protocol.PackedReader`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dali_alchemi.augment import apply_augmentations, check_augmentations
from dali_alchemi.config import DEFAULT_BATCHES_PER_WINDOW, DEFAULT_NUM_WORKERS, LoaderConfig
from dali_alchemi.errors import ConfigError, LoaderClosedError, LoaderError
from dali_alchemi.keywords import checks_keywords
from dali_alchemi.loader_inputs import check_reader_length, check_shareable, nvalchemi_batches, resolve_inputs
from dali_alchemi.padding import pad_batch
from dali_alchemi.pipeline import lifetime
from dali_alchemi.pipeline.build import PipelineOutputs, build_pipeline, window_bytes_hint
from dali_alchemi.pipeline.dali_private import CLOSE_TIMEOUT_S, close_pipeline, disarm_pool, kill_workers
from dali_alchemi.pipeline.device import resolve_device
from dali_alchemi.pipeline.inflate import inflate_route
from dali_alchemi.pipeline.iterator import WindowIterator
from dali_alchemi.pipeline.source import BLOB_OUTPUTS, OutputSpec, ReadAheadSource, WindowSource, output_specs
from dali_alchemi.plan import PlanArguments, restore
from dali_alchemi.store.format.protocol import as_field_names
from dali_alchemi.store.read.shared import make_shared_folder, remove_shared_folder

if TYPE_CHECKING:
    from dali_alchemi.augment import Augmentation
    from dali_alchemi.loader_inputs import LoaderSource
    from dali_alchemi.plan import BlockShuffle, EpochPlan, Plan

__all__ = ["BATCH_TYPES", "KEEP_ALIVE_MARGIN", "KEYWORD_HINTS", "DALIDataLoader"]


logger = logging.getLogger(__name__)

KEEP_ALIVE_MARGIN = 3
"""Windows the read-ahead source keeps referenced beyond DALI's queue, whose buffers it shares."""

BATCH_TYPES = ("native", "nvalchemi")
"""What a DALIDataLoader can yield: this project's Batch, or nvalchemi's (``batch_type=``)."""


KEYWORD_HINTS = {
    "prefetch_factor": "'batches_per_window' (batches read together; nvalchemi's prefetch_factor)",
    "pin_memory": "'device' (on a CUDA device DALI copies through pinned memory itself)",
}
"""What DALIDataLoader says for keywords of nvalchemi's and torch's loaders that it spells otherwise."""


@checks_keywords(KEYWORD_HINTS)
class DALIDataLoader:
    """Iterate a store (or any :class:`~dali_alchemi.store.format.protocol.PackedReader`) as Batches through DALI.

    Parameters
    ----------
    store_or_reader
        A store (path, URL, zarr Store) or an open reader implementing
        :class:`~dali_alchemi.store.format.protocol.PackedReader` (this project's
        :class:`~dali_alchemi.store.read.reader.AtomicDataZarrReader`, for one), any reader with
        nvalchemi's ``read_many`` contract (read through a
        :class:`~dali_alchemi.interop.read_many.ReadManyAdapter`), or a list of them read as one
        dataset (a :class:`~dali_alchemi.store.read.multi.MultiReader`). A reader given is not closed.
    batch_size, shuffle, seed, drop_last, shard_id, num_shards
        Build the default plan, a :class:`~dali_alchemi.plan.FixedBatchPlan`: batches of ``batch_size``
        structures (default 64), shuffled each epoch by ``(seed, epoch)``, the last one dropped when
        short if ``drop_last``, this loader's shard (``None``: rank and world size of an initialised
        torch.distributed group, else ``(0, 1)``; shards are padded like ``DistributedSampler``).
        ``seed`` also seeds the augmentations. ``shuffle`` is ``True`` (or ``"global"``: a full
        permutation), ``False`` (or ``"sequential"``), or ``"block"`` (or a
        :class:`~dali_alchemi.plan.BlockShuffle` with explicit sizes): a chunk-aware shuffle for stores
        larger than the cache (a :class:`~dali_alchemi.plan.BlockShufflePlan`, with either kind of
        batches), which also resumes on another number of shards.
    max_atoms, max_edges, oversized
        Bound every batch by atoms and/or edges instead (a :class:`~dali_alchemi.plan.BudgetPlan`):
        structures are packed greedily in epoch order, ``batch_size`` (if given) caps the structures
        per batch, and every shard gets the same number of batches. A structure larger than a budget is
        an error at construction naming it, unless ``oversized="alone"`` gives it a batch of its own.
    pad
        Give every batch the same shape, for ``torch.compile`` and CUDA graphs: exactly ``max_atoms``
        atom rows, ``max_edges`` edge rows (both needed) and a fixed number of structures
        (``batch_size + 1``, or the most the budgets allow plus one), filled with padding structures
        (see :mod:`dali_alchemi.padding`; the masks are ``batch.padding``). One atom, edge and structure
        of each batch are kept for the padding, so real batches hold at most ``max_atoms - 1`` atoms.
    weights, samples_per_dataset, epoch_policy
        Over several stores: draw them at these rates, or these counts per batch, with nvalchemi's
        epoch policies (a :class:`~dali_alchemi.plan.mixture.MixturePlan`; see it for the meanings).
    plan
        A :class:`~dali_alchemi.plan.Plan` deciding every epoch's order and batches instead; it
        excludes the plan arguments above (except ``seed``) and must be made for the reader's length.
        Or a :class:`~dali_alchemi.plan.PlanArguments` holding those arguments, to share one set
        between this loader and :func:`~dali_alchemi.baseline.plain_dataloader`.
    batches_per_window
        Batches read together in one packed read (a *window*); nvalchemi calls this ``prefetch_factor``.
    num_workers
        DALI worker processes (parallel external source), each reading whole windows, so a window is
        never read twice (default 2, the fastest measured; see docs/benchmarks.md). 0 reads windows on a
        background thread of this process instead: no start-up cost, less memory, slower.
    device
        ``"auto"`` (CUDA when a GPU is visible), ``"cpu"`` or a CUDA device. With CUDA, DALI copies each
        window to the device through pinned memory and the Batch is built there.
    fields
        Read and return only these fields (one name, or several); ``None`` reads every field.
    read_ahead
        Windows read ahead on the background thread when ``num_workers == 0``.
    start_method
        How DALI starts workers: ``"fork"``, ``"spawn"``, or ``"auto"`` (fork unless CUDA is initialised).
    queue_depth
        DALI's pipeline prefetch queue depth (windows).
    cache_bytes
        Decoded-chunk cache of a reader the loader opens itself (per worker process).
    shared_cache
        With workers and a reader the loader opens itself: the workers share decoded chunks through a
        folder on shared memory, so each chunk is decoded once per machine rather than once per
        worker. Only one store given by path, URL or zarr Store can share; a list of stores, a reader
        passed in or a ``read_many`` reader is a :class:`~dali_alchemi.errors.ConfigError`. Off by default: on the reference machine the per-chunk cost of sharing (files on
        ``/dev/shm``) outweighed the decodes it saved (docs/bigger-than-memory.md).
    layout
        How a window goes through DALI: ``"window"`` (the default: one DALI sample per output), or
        ``"blob"`` (every array of the window in one byte buffer: one host-to-device copy per window
        instead of one per field; measured equal on the CPU, and the one to try where many small copies
        cost more than one large one), or ``"inflate"`` (CUDA only: fields stored as LZ4 blocks, the
        ``"inflate"`` store layout, cross as their compressed chunks and nvCOMP inflates them on the GPU;
        :mod:`dali_alchemi.pipeline.inflate`). Batches are identical in every layout.
    augmentations
        Per-structure transforms applied on ``device`` to every batch (see :mod:`dali_alchemi.augment`),
        seeded by ``(seed, epoch, batch index)`` so they are reproducible, also after a resume.
    batch_type
        What iteration yields: ``"native"`` (this project's :class:`~dali_alchemi.batch.Batch`, the
        default) or ``"nvalchemi"`` (an ``nvalchemi.data.Batch`` over the same tensors, built without
        a step per structure: :func:`~dali_alchemi.interop.nvalchemi_batch.from_batch`; needs
        nvalchemi-toolkit). Augmentations and padding are applied before the conversion.

    Iteration resumes where the loader stands: ``(epoch, batch)`` advances as batches are yielded,
    and moves to the next epoch when one ends. :meth:`set_epoch` jumps to the start of an epoch;
    :meth:`state_dict`/:meth:`load_state_dict` save and restore the position exactly.

    Raises
    ------
    PlanError, UnknownFieldError, DeviceError, ConfigError, ConfigTypeError
        At construction, for arguments that do not fit (each message names the argument); a keyword
        it does not take is a ``ConfigTypeError`` (a ``TypeError``) naming the keyword meant.
    LoaderError
        During iteration, for errors from the reader, the source or a worker, naming the original
        exception type.
    LoaderClosedError
        When iterated after :meth:`close`.
    StoreChangedError
        When iterated after the reader was refreshed to another length (another writer appended or
        deleted): the plan was made for the old one; build a new loader.
    """

    def __init__(
        self,
        store_or_reader: LoaderSource,
        *,
        batch_size: int | None = None,
        shuffle: bool | str | BlockShuffle = True,
        seed: int = 0,
        drop_last: bool = False,
        shard_id: int | None = None,
        num_shards: int | None = None,
        max_atoms: int | None = None,
        max_edges: int | None = None,
        oversized: str = "error",
        pad: bool = False,
        weights: Sequence[float] | None = None,
        samples_per_dataset: Sequence[int | float] | None = None,
        epoch_policy: str | None = None,
        plan: Plan | None = None,
        batches_per_window: int = DEFAULT_BATCHES_PER_WINDOW,
        num_workers: int = DEFAULT_NUM_WORKERS,
        device: str | torch.device = "auto",
        fields: str | Iterable[str] | None = None,
        read_ahead: int = 2,
        start_method: str = "auto",
        queue_depth: int = 2,
        cache_bytes: int | None = None,
        layout: str = "window",
        augmentations: Sequence[Augmentation] = (),
        shared_cache: bool = False,
        batch_type: str = "native",
    ) -> None:
        if batch_type not in BATCH_TYPES:
            raise ConfigError(f"batch_type must be one of {BATCH_TYPES}, got {batch_type!r}")
        self.batch_type = batch_type
        self.augmentations = check_augmentations(augmentations)
        self.config = LoaderConfig(
            batches_per_window=batches_per_window, num_workers=num_workers, device=str(device),
            fields=None if fields is None else as_field_names(fields),
            read_ahead=read_ahead, start_method=start_method, queue_depth=queue_depth, cache_bytes=cache_bytes,
            layout=layout,
        )  # fmt: skip
        self.layout = self.config.layout
        self.seed = seed
        self.device = resolve_device(device)
        # With shared_cache, worker processes share decoded chunks through a shared-memory folder, which
        # only a reader the loader opens itself, of one store, can be given: anything else would ignore it.
        if shared_cache:
            check_shareable(store_or_reader)
        sharing = shared_cache and num_workers > 0
        self._shared_folder = make_shared_folder() if sharing else None
        arguments = PlanArguments(
            batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, shard_id=shard_id,
            num_shards=num_shards, max_atoms=max_atoms, max_edges=max_edges, oversized=oversized, pad=pad,
            weights=weights, samples_per_dataset=samples_per_dataset, epoch_policy=epoch_policy,
        )  # fmt: skip
        try:
            inputs = resolve_inputs(
                store_or_reader, plan=plan, arguments=arguments, fields=self.config.fields,
                cache_bytes=cache_bytes, loader="DALIDataLoader", shared_cache=self._shared_folder,
            )  # fmt: skip
            self._route = inflate_route(inputs.reader, tuple(inputs.fields), self.device) if layout == "inflate" else None
        except BaseException:
            if self._shared_folder is not None:
                remove_shared_folder(self._shared_folder)
            raise
        self.reader, self._owns_reader, self.fields = inputs.reader, inputs.owns_reader, inputs.fields
        self.plan, self.pad_shape, self._size_sample = inputs.plan, inputs.pad_shape, inputs.size_sample
        self._to_nvalchemi = nvalchemi_batches() if batch_type == "nvalchemi" else None
        # On the CPU the batch index and neighbor-list offsets are computed where the window is read (in
        # the workers); on a GPU they are computed on the device (batch.collate).
        self.specs: tuple[OutputSpec, ...] = self._route.specs if self._route else output_specs(
            self.reader.field_specs, tuple(self.fields), host_collation=self.device.type == "cpu"
        )
        self._epoch = 0
        self._batch = 0
        self._epoch_plan: EpochPlan | None = None
        self._pipe: Any = None
        self._outputs: PipelineOutputs | None = None
        self._read_ahead: ReadAheadSource | None = None
        self._pipe_next: tuple[int, int] | None = None
        self._abandoned: list[Any] = []  # pipelines wedged by a dead worker; kept referenced, never shut down
        self._windows: WindowIterator | None = None  # the iteration whose runner thread uses the pipeline
        self._generation = 0
        self._closed = False
        if self.config.num_workers > 0:
            lifetime.register(self)  # its workers end with this process (SIGTERM, SIGHUP, exit)

    # -- sizes and position ---------------------------------------------------------------------------
    def epoch_plan(self, epoch: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` (default: the current one), computed once per epoch."""
        epoch = self._epoch if epoch is None else epoch
        if self._epoch_plan is None or self._epoch_plan.epoch != epoch:
            self._epoch_plan = self.plan.epoch(epoch)
        return self._epoch_plan

    def __len__(self) -> int:
        """Batches in the current epoch (the same on every shard), known before the first batch."""
        return self.epoch_plan().num_batches

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at the beginning of ``epoch`` (as ``DistributedSampler.set_epoch``)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f"epoch must be a non-negative integer, got {epoch!r}")
        self._epoch, self._batch = int(epoch), 0

    def state_dict(self) -> dict[str, Any]:
        """The position (epoch and batches already yielded in it) and the plan it belongs to, as plain data."""
        return {"epoch": self._epoch, "batch": self._batch, "plan": self.plan.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the position of :meth:`state_dict`; the next batch is exactly the one that followed.

        A block-shuffle plan (``shuffle="block"``) also resumes a state saved on another number of
        shards: the epoch continues with the batches no shard had delivered, dealt over the current
        shards (see :meth:`~dali_alchemi.plan.BlockShufflePlan.resume_from`).

        Raises
        ------
        ConfigTypeError
            If ``state`` is not a dict (``None``, say) or ``epoch``/``batch`` are not ints (a float, a
            bool); the message names the entry and the value.
        PlanError
            If an entry is missing or unknown, ``epoch``/``batch`` are negative, the state belongs to a
            different plan (any setting differs), since the batches would then differ, or its batch is
            outside its epoch.
        """
        plan, epoch, batch = restore(self.plan, state)
        if plan is not self.plan:
            self._discard_pipeline()  # its source carries the old plan
            self.plan, self._epoch_plan = plan, None
        self._epoch, self._batch = epoch, batch

    # -- iteration ----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise LoaderClosedError("This DALIDataLoader is closed; build a new one")
        check_reader_length(self.reader, self.plan, "DALIDataLoader")
        if self._batch >= len(self) and self._batch:
            self._epoch, self._batch = self._epoch + 1, 0
        if not self._stop_runner():  # an abandoned iteration's runner thread must not outlive its pipeline
            self._abandon_pipeline()
        self._ensure_pipeline(self._epoch, self._batch)
        self._generation += 1
        return self._iterate(self._generation)

    def _iterate(self, generation: int) -> Iterator[Any]:
        assert self._outputs is not None
        windows = self._windows = WindowIterator(self._pipe, self._outputs, self.specs, self.device, self._route)
        self._pipe_next = None  # mid-epoch until the epoch ends cleanly
        try:
            for window in windows.windows():
                for batch in window:
                    if generation != self._generation:
                        raise LoaderError(
                            "This iterator was superseded by a newer iter() over the same DALIDataLoader",
                            original_type="Superseded",
                        )
                    if self.augmentations:
                        apply_augmentations(
                            batch, self.augmentations, seed=self.seed, epoch=self._epoch, batch_index=self._batch
                        )
                    if self.pad_shape is not None:
                        batch = pad_batch(batch, **self.pad_shape.to_kwargs())
                    self._batch += 1
                    yield batch if self._to_nvalchemi is None else self._to_nvalchemi(batch)
        except LoaderError:
            if generation != self._generation:
                raise  # superseded: the pipeline belongs to the newer iteration now
            if windows.broken:
                self._abandon_pipeline()
            else:
                self._discard_pipeline()
            raise
        if generation != self._generation:
            return
        self._pipe.reset()
        self._epoch, self._batch = self._epoch + 1, 0
        self._pipe_next = (self._epoch, 0)

    def _ensure_pipeline(self, epoch: int, batch: int) -> None:
        if self._pipe is not None and self._pipe_next == (epoch, batch):
            return
        self._discard_pipeline()
        source = WindowSource(
            self.reader, self.plan, self.specs, batches_per_window=self.config.batches_per_window,
            start_epoch=epoch, start_batch=batch, layout=self.layout, route=self._route,
        )  # fmt: skip
        workers = self.config.num_workers
        if workers == 0:
            self._read_ahead = ReadAheadSource(
                source, depth=self.config.read_ahead, keep_alive=self.config.queue_depth + KEEP_ALIVE_MARGIN
            )
        start_method = self.config.start_method
        if start_method == "auto":
            start_method = "spawn" if torch.cuda.is_available() and torch.cuda.is_initialized() else "fork"
        self._pipe, self._outputs = build_pipeline(
            self._read_ahead if workers == 0 else source,
            BLOB_OUTPUTS if self.layout == "blob" else self.specs,
            device_id=self.device.index if self.device.type == "cuda" else None,
            num_workers=workers,
            start_method=start_method,
            queue_depth=self.config.queue_depth, route=self._route,
            bytes_per_window=window_bytes_hint(
                self.specs, self._size_sample(), self.epoch_plan(epoch), self.config.batches_per_window
            ),
        )
        self._pipe_next = (epoch, batch)

    def _abandon_pipeline(self) -> None:
        """Drop a pipeline left blocked inside DALI (by a dead worker, or a runner thread that did not
        stop): kill its workers, but do not shut it down (its thread is stuck in DALI, and shutting down
        under it is unsafe)."""
        kill_workers(self._pipe, CLOSE_TIMEOUT_S)
        disarm_pool(self._pipe)  # DALI's own close, at collection or exit, could wait on the stuck thread
        if self._pipe is not None:
            self._abandoned.append(self._pipe)
        self._windows = None  # its thread is stuck inside DALI; it is a daemon and holds nothing of ours
        self._pipe, self._outputs, self._pipe_next = None, None, None
        if self._read_ahead is not None:
            self._read_ahead.close()
            self._read_ahead = None

    def _stop_runner(self) -> bool:
        """Stop the current iteration's runner thread (bounded); ``False`` when its pipeline must be abandoned."""
        windows, self._windows = self._windows, None
        return windows is None or windows.stop()

    def _discard_pipeline(self) -> None:
        if not self._stop_runner():
            self._abandon_pipeline()
            return
        if not close_pipeline(self._pipe):  # DALI did not stop its workers in time; they were killed
            self._abandoned.append(self._pipe)
        self._pipe, self._outputs, self._pipe_next = None, None, None
        if self._read_ahead is not None:
            self._read_ahead.close()
            self._read_ahead = None

    def kill_workers(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Kill this loader's worker processes now (SIGKILL), waiting at most ``timeout`` for them.

        For a process about to end (SIGTERM, SIGHUP): it touches nothing but the processes, so it is safe
        whatever the loader is doing. The loader is not usable afterwards; :meth:`close` it.
        """
        for pipe in [self._pipe, *self._abandoned]:
            kill_workers(pipe, timeout)

    # -- lifetime -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop workers, free shared memory and (if the loader opened it) close the reader. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._generation += 1
        lifetime.unregister(self)
        self._discard_pipeline()
        if self._owns_reader:
            self.reader.close()
        if self._shared_folder is not None:
            remove_shared_folder(self._shared_folder)

    def __enter__(self) -> DALIDataLoader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to release safely
            logger.debug("error while closing a DALIDataLoader during garbage collection", exc_info=True)

    def __repr__(self) -> str:
        return (
            f"DALIDataLoader({self.reader!r}, plan={self.plan.to_dict()}, batches={len(self)}, "
            f"device={self.device}, workers={self.config.num_workers})"
        )
