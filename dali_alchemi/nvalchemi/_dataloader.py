"""DataLoader: nvalchemi 0.2.0's DataLoader (arguments, defaults, attributes, epochs), read through DALI.

Ordering is nvalchemi's, decided by the same objects: ``batch_sampler``, else ``sampler``, else a
``RandomSampler``/``SequentialSampler`` over the dataset, cut every ``batch_size`` indices (the last
batch kept unless ``drop_last``). At each iteration the epoch is drawn from them in this process, as
nvalchemi draws it, and recorded as a :class:`~dali_alchemi.plan.RecordedPlan`; the batches it yields
are exactly those, in that order.

Reading takes one of two routes, decided when the loader is built:

- **packed** (the fast one): a :class:`~dali_alchemi.nvalchemi.Dataset` or nvalchemi ``Dataset`` (or a
  ``MultiDataset`` of them) without per-sample ``transforms``. The epoch's plan goes to a
  :class:`~dali_alchemi.pipeline.loader.DALIDataLoader` over the dataset's reader (its packed reads; a
  reader with only nvalchemi's ``read_many`` goes through a
  :class:`~dali_alchemi.interop.read_many.ReadManyAdapter`), reading ``prefetch_factor`` batches per
  window in the dataset's ``num_workers`` DALI worker processes (nvalchemi's prefetch threads become
  processes; 0, or a reader that does not pickle, reads on one background thread). Each batch becomes an ``nvalchemi.data.Batch`` on the dataset's device
  by :func:`~dali_alchemi.interop.nvalchemi_batch.build_batch`. With ``skip_validation=False`` (the
  default) nvalchemi's per-sample ``AtomicData`` validation is done by
  :class:`~dali_alchemi.nvalchemi._atomic.AtomicDataRules` (representatives validated once, casts and
  defaults per batch).
- **nvalchemi's own** for what must see one ``AtomicData`` per structure: a dataset with per-sample
  ``transforms`` (they run exactly as in nvalchemi, one call per structure, with its metadata, and
  cost what they cost there), an ``InMemoryDataset`` (already resident: nvalchemi's path has no read
  to speed up), or any other object with nvalchemi's batch-dataset contract. The recorded batches are
  handed to nvalchemi's ``DataLoader`` as its ``batch_sampler``.

``batch_transforms`` run on each yielded batch through nvalchemi's ``Compose`` (a failure is its
``RuntimeError``), on either route.
"""

from __future__ import annotations

import itertools
import logging
import pickle
from collections.abc import Iterator, Sequence
from math import ceil
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dali_alchemi.config import DEFAULT_NUM_WORKERS
from dali_alchemi.errors import ConfigError, ConfigTypeError
from dali_alchemi.interop.nvalchemi_batch import build_batch
from dali_alchemi.interop.read_many import as_packed_reader
from dali_alchemi.keywords import checks_keywords
from dali_alchemi.nvalchemi._epochs import EpochFolderPlan
from dali_alchemi.plan.recorded import RecordedPlan
from dali_alchemi.store.read.shared import make_shared_folder, remove_shared_folder

__all__ = ["DataLoader", "packed_route_applies"]

if TYPE_CHECKING:
    from dali_alchemi.batch import Batch
    from dali_alchemi.nvalchemi._atomic import AtomicDataRules
    from dali_alchemi.pipeline.loader import DALIDataLoader
    from dali_alchemi.store.format.protocol import PackedReader

logger = logging.getLogger(__name__)


class _Replay:
    """A batch sampler that yields the batches it was last given (nvalchemi's route gets each epoch so)."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class _PackedRoute:
    """The fast route: one DALIDataLoader over the dataset's (or datasets') reader for every epoch.

    Each epoch's batches are recorded into an :class:`~dali_alchemi.nvalchemi._epochs.EpochFolderPlan`
    before the epoch starts, so the loader's pipeline and worker processes live across epochs. When the
    dataset's length changed since (its reader was refreshed after an append or a delete), the next epoch
    starts a new DALIDataLoader over the reader as it is now, as nvalchemi's loader reads it, so its
    worker processes hold the refreshed reader. (A ``MultiDataset`` keeps its members' lengths from its
    construction, in nvalchemi too.)
    """

    def __init__(self, dataset: Any, batches_per_window: int) -> None:
        from nvalchemi.data.datapipes import MultiDataset

        children = list(dataset.datasets) if isinstance(dataset, MultiDataset) else [dataset]
        devices = {str(child.target_device) for child in children}
        if len(devices) > 1:
            raise ConfigError(f"The datasets of a MultiDataset must share one device, got {sorted(devices)}")
        self.device = children[0].target_device
        self._children = children
        self._follows = None if isinstance(dataset, MultiDataset) else dataset
        self.batches_per_window = batches_per_window
        # nvalchemi's Dataset(num_workers=) sizes its prefetch thread pool; here the prefetching workers
        # are DALI's worker processes (0: one background thread), so the same number sizes them.
        self._workers = int(getattr(dataset, "num_workers", DEFAULT_NUM_WORKERS))
        self._folder = make_shared_folder()
        self._owned: PackedReader | None = None
        self._loader: DALIDataLoader | None = None
        self._attach()
        self._next_epoch = 0

    def _attach(self) -> None:
        """Read the datasets' readers as they are now: the packed reader, the validation rules, the plan."""
        from dali_alchemi.nvalchemi._atomic import AtomicDataRules
        from dali_alchemi.store.read.multi import MultiReader

        children = self._children
        readers = [as_packed_reader(child.reader) for child in children]
        levels = [dict(getattr(child.reader, "field_levels", None) or {}) for child in children]
        self.rules: list[AtomicDataRules] = [
            AtomicDataRules(reader, level) for child, reader, level in zip(children, readers, levels, strict=True)
            if not child.skip_validation
        ]  # fmt: skip
        # One set of rules serves every batch, so the datasets must be validated alike.
        self.uniform = len({(tuple(r.order or ()), tuple(r.casts.items()), r.fills) for r in self.rules}) <= 1
        if len(children) == 1:
            self.reader: PackedReader = readers[0]
        else:
            shared = [name for name in readers[0].field_specs if all(name in r.field_specs for r in readers[1:])]
            self.reader = self._owned = MultiReader(readers, fields=shared)
        self.num_workers = self._workers if self._workers > 0 and _pickles(self.reader) else 0
        self.plan = EpochFolderPlan(self._folder, len(self.reader))

    def _follow_the_dataset(self) -> None:
        """Start over on the reader as it is now if the dataset's length changed (a refresh after a write)."""
        if self._follows is None or len(self._follows) == self.plan.num_samples:
            return
        logger.info(
            "the dataset now has %d samples (%d when the loader started): reading it anew",
            len(self._follows),
            self.plan.num_samples,
        )
        if self._loader is not None:
            self._loader.close()
            self._loader = None
        self._attach()

    def epoch(self, batches: list[list[int]]) -> Iterator[Any]:
        from dali_alchemi.pipeline.loader import DALIDataLoader

        self._follow_the_dataset()
        epoch = self._next_epoch
        self._next_epoch += 1
        recorded = RecordedPlan.from_batches(batches, num_samples=len(self.reader), epoch=epoch).epoch(epoch)
        self.plan.record(recorded)
        if self._loader is None:
            self._loader = DALIDataLoader(
                self.reader, plan=self.plan, num_workers=self.num_workers, device=self.device,
                batches_per_window=self.batches_per_window,
            )  # fmt: skip
        if (self._loader.epoch, self._loader.state_dict()["batch"]) != (epoch, 0):
            self._loader.set_epoch(epoch)  # the last epoch was left part way: the pipeline restarts here
        rules = self.rules[0] if self.rules else None
        for batch in self._loader:
            yield self._to_nvalchemi(batch, rules)

    def _to_nvalchemi(self, batch: Batch, rules: AtomicDataRules | None) -> Any:
        order = None
        if rules is not None:
            rules.apply(batch)
            order = rules.order
        n_atoms = torch.from_numpy(np.asarray(batch.num_nodes_list, dtype=np.int32))
        n_edges = torch.from_numpy(np.asarray(batch.num_edges_list, dtype=np.int32))
        # The dataset's device as nvalchemi names it (``cuda``, not ``cuda:0``): nvalchemi's batches carry that.
        return build_batch(batch.fields, batch.levels, n_atoms, n_edges, device=self.device, order=order)

    def close(self) -> None:
        if self._loader is not None:
            self._loader.close()
        if self._owned is not None:
            self._owned.close()
        remove_shared_folder(self._folder)


def _pickles(reader: PackedReader) -> bool:
    """Whether ``reader`` can go to DALI's worker processes (else the loader reads on a thread)."""
    try:
        pickle.dumps(reader)
    except Exception as err:  # any failure to pickle means: no workers
        logger.info("the reader does not pickle (%s: %s); reading on a background thread", type(err).__name__, err)
        return False
    return True


def packed_route_applies(dataset: Any) -> bool:
    """Whether ``dataset`` is read by the fast route (see the module docstring)."""
    from nvalchemi.data.datapipes import Dataset as NvDataset
    from nvalchemi.data.datapipes import MultiDataset

    children = list(dataset.datasets) if isinstance(dataset, MultiDataset) else [dataset]
    for child in children:
        # nvalchemi keeps the per-sample transforms only as a private Compose (``None`` without any).
        if not isinstance(child, NvDataset) or child._sample_transform is not None:
            return False
    skips = {bool(child.skip_validation) for child in children}
    return len(skips) == 1


@checks_keywords()
class DataLoader:
    """nvalchemi 0.2.0's ``DataLoader``, yielding its ``Batch``, read through this project's DALI loader.

    Parameters
    ----------
    dataset
        A :class:`~dali_alchemi.nvalchemi.Dataset`, an nvalchemi ``Dataset`` over any reader, a
        ``MultiDataset`` of them, an ``InMemoryDataset`` or any object with nvalchemi's batch-dataset
        contract (the last two, and datasets with per-sample ``transforms``, are read by nvalchemi's
        own route; see the module docstring).
    batch_size : int, default=1
        Samples per batch.
    shuffle : bool, default=False
        A ``RandomSampler`` over the dataset (torch's global generator, as in nvalchemi).
    drop_last : bool, default=False
        Drop the last incomplete batch.
    sampler : torch.utils.data.Sampler | None
        Yields sample indices; overrides ``shuffle``.
    batch_sampler : torch.utils.data.Sampler | None
        Yields whole batches of indices; excludes ``sampler`` and ``shuffle``.
    prefetch_factor : int, default=2
        Batches read together in one window (nvalchemi's meaning); 0 reads one batch at a time.
    num_streams, use_streams
        nvalchemi's CUDA-stream prefetch settings, kept as its attributes (``use_streams`` is
        ``use_streams and torch.cuda.is_available()``) and passed to nvalchemi's route. The fast route
        does not use them: DALI copies each window to the device itself, through pinned memory.
    pin_memory : bool, default=False
        Set on the dataset (nvalchemi asks its reader for page-locked tensors).
    batch_transforms : Sequence[callable] | None
        Applied to each yielded batch in order (nvalchemi's ``Compose``).

    Raises
    ------
    ConfigError
        At construction, for ``batch_size < 1``, ``prefetch_factor < 0`` or ``batch_sampler`` with
        ``sampler`` or ``shuffle`` (nvalchemi's messages; a ``ValueError``).
    ConfigTypeError
        At construction, if ``batch_transforms`` is not a sequence, or for a keyword it does not take
        (a ``TypeError``, naming the keyword meant).
    RuntimeError
        During iteration, when a batch transform fails (the original is its ``__cause__``).
    IndexError
        During iteration, for a sampler index out of range (nvalchemi's message).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        sampler: Any = None,
        batch_sampler: Any = None,
        prefetch_factor: int = 2,
        num_streams: int = 4,
        use_streams: bool = True,
        pin_memory: bool = False,
        batch_transforms: Sequence[Any] | None = None,
    ) -> None:
        from nvalchemi.data.transforms import Compose
        from torch.utils.data import RandomSampler, SequentialSampler

        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if prefetch_factor < 0:
            raise ConfigError(f"prefetch_factor must be >= 0, got {prefetch_factor}")
        if batch_sampler is not None and (sampler is not None or shuffle):
            raise ConfigError("batch_sampler is mutually exclusive with sampler and shuffle")
        if batch_transforms is not None and not isinstance(batch_transforms, Sequence):
            raise ConfigTypeError(
                "batch_transforms must be a Sequence of callables, not a single callable or generator. "
                "Pass [fn] instead of fn."
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.prefetch_factor = prefetch_factor
        self.num_streams = num_streams
        self.use_streams = use_streams and torch.cuda.is_available()
        self.batch_sampler = batch_sampler
        self.pin_memory = pin_memory
        self._epoch_step_start = 0
        if pin_memory and hasattr(dataset, "pin_memory"):
            dataset.pin_memory = True  # as nvalchemi: the dataset passes it to its reader
        self._batch_transform = Compose(list(batch_transforms)) if batch_transforms else None
        self.sampler: Any
        if batch_sampler is None:
            if sampler is not None:
                self.sampler = sampler
            elif shuffle:
                self.sampler = RandomSampler(dataset)
            else:
                self.sampler = SequentialSampler(dataset)
        else:
            self.sampler = None
        self._packed: _PackedRoute | None = None
        self._nvalchemi: Any = None
        self._replay = _Replay()
        if packed_route_applies(dataset):
            route = _PackedRoute(dataset, batches_per_window=max(prefetch_factor, 1))
            if route.uniform:
                self._packed = route
            else:
                route.close()

    @property
    def route(self) -> str:
        """``"packed"`` (the fast route) or ``"nvalchemi"`` (nvalchemi's own; see the module docstring)."""
        return "packed" if self._packed is not None else "nvalchemi"

    @property
    def effective_read_window(self) -> int:
        """The most samples one read fetches (``batch_size * max(prefetch_factor, 1)``), as nvalchemi's."""
        return self.batch_size * max(self.prefetch_factor, 1)

    def __len__(self) -> int:
        """Batches per epoch: ``len(batch_sampler)``, else ``ceil`` (or floor with ``drop_last``) of samples."""
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        n_samples = len(self.sampler) if self.sampler is not None else len(self.dataset)
        if self.drop_last:
            return n_samples // self.batch_size
        return ceil(n_samples / self.batch_size)

    # -- the epoch's batches ------------------------------------------------------------------------
    def _generate_batches(self) -> list[list[int]]:
        """This epoch's batches, drawn from the sampler now (nvalchemi's order, skip and ``drop_last``)."""
        start = self._epoch_step_start
        self._epoch_step_start = 0
        if self.batch_sampler is not None:
            batches = [list(b) for b in self.batch_sampler]
            return batches[start:]
        indices = np.fromiter((int(i) for i in self.sampler), dtype=np.int64)
        full = indices.size // self.batch_size
        cuts = list(range(0, full * self.batch_size + 1, self.batch_size))
        if indices.size > full * self.batch_size and not self.drop_last:
            cuts.append(int(indices.size))
        values = indices.tolist()
        return [values[a:b] for a, b in itertools.pairwise(cuts)][start:]

    def set_epoch_step(self, step: int) -> None:
        """Skip ``step`` batches (in sampler order, without reading them) at the start of the next iteration.

        Raises
        ------
        ConfigTypeError
            If ``step`` is not an int (a float or a bool would skip another number of batches; a ``TypeError``).
        ConfigError
            If ``step`` is negative (a ``ValueError``).
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise ConfigTypeError(f"step must be an int, got {step!r} ({type(step).__name__})")
        if step < 0:
            raise ConfigError(f"step must be >= 0, got {step}")
        self._epoch_step_start = step

    def set_epoch(self, epoch: int) -> None:
        """Pass ``epoch`` to the first of ``batch_sampler``, its ``sampler`` and ``sampler`` with ``set_epoch``."""
        seen: set[int] = set()
        for candidate in (self.batch_sampler, getattr(self.batch_sampler, "sampler", None), self.sampler):
            if candidate is None or id(candidate) in seen:
                continue
            seen.add(id(candidate))
            set_epoch = getattr(candidate, "set_epoch", None)
            if set_epoch is not None:
                set_epoch(epoch)
                return

    # -- iteration ----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        batches = self._generate_batches()
        if not batches:
            return
        source = self._packed.epoch(batches) if self._packed is not None else self._nvalchemi_epoch(batches)
        transform = self._batch_transform
        for batch in source:
            yield batch if transform is None else transform(batch)

    def _nvalchemi_epoch(self, batches: list[list[int]]) -> Iterator[Any]:
        from nvalchemi.data.datapipes import DataLoader as NvDataLoader

        if self._nvalchemi is None:
            self._nvalchemi = NvDataLoader(
                self.dataset, batch_sampler=self._replay, prefetch_factor=self.prefetch_factor,
                num_streams=self.num_streams, use_streams=self.use_streams,
            )  # fmt: skip
        self._replay.batches = batches
        return iter(self._nvalchemi)

    def close(self) -> None:
        """Stop the reading pipeline and release what this loader opened (not the dataset's reader)."""
        if self._packed is not None:
            self._packed.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            logger.debug("error while closing a DataLoader during garbage collection", exc_info=True)

    def __repr__(self) -> str:
        return f"DataLoader(batch_size={self.batch_size}, batches={len(self)}, route={self.route!r})"
