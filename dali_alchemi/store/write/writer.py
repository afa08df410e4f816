"""AtomicDataZarrWriter: create, extend, soft-delete and compact nvalchemi 0.2.0 stores, crash-safely.

The writer owns the pointer arrays and masks, and keeps every data array consistent with them:
``neighbor_list`` is stored store-global (``local + atoms_ptr[i]``) on write and append, and re-based
whenever rows move (defragment), which fixes the reference implementation's defects listed in the
store-format notes. Arrays are always created with explicit chunk shapes that keep trailing dims whole.
Each operation takes the lock, opens the store (``write``: checks that none exists yet) and hands the
work to its module: ``write`` to :mod:`~dali_alchemi.store.write.create` (or, given parts,
:mod:`~dali_alchemi.store.write.stream`), ``append``, ``add_custom``, ``defragment``, ``repair`` to theirs.

Interrupted writes (a killed process) leave a local store readable at its old or its new state: ``write``
builds the store beside its path and renames it into place; ``append``, ``delete`` and ``add_custom`` record
a journal first (:mod:`dali_alchemi.store.format.journal`) and order their changes so that the old state
stays valid until the commit point; ``defragment`` builds the compacted store beside the old one and swaps
the directories. The next writer operation finishes or rolls back an interrupted one (:mod:`.recovery`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from dali_alchemi.config import WriteConfig
from dali_alchemi.errors import (
    ConfigError,
    ConfigTypeError,
    StoreExistsError,
    StoreNotFoundError,
    UnsupportedStoreError,
)
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.generation import bumped
from dali_alchemi.store.format.indices import checked_indices
from dali_alchemi.store.format.journal import DeleteOp, clear_journal, read_journal, write_journal
from dali_alchemi.store.format.location import StoreLike, StoreLocation, open_group, resolve_store, root_members
from dali_alchemi.store.format.packed import PackedSamples, SupportsPacked, as_numpy
from dali_alchemi.store.read.open_checks import MetaInfo, check_every_array_known, check_meta, open_root
from dali_alchemi.store.write.append import append_rows, checked_new_rows
from dali_alchemi.store.write.confine import check_no_linked_directories
from dali_alchemi.store.write.custom import checked_custom, write_custom
from dali_alchemi.store.write.defragment import DEFAULT_DEFRAGMENT_WINDOW
from dali_alchemi.store.write.defragment import defragment as run_defragment
from dali_alchemi.store.write.encode import Samples, check_field_name
from dali_alchemi.store.write.lock import WriterLock
from dali_alchemi.store.write.recovery import apply_delete, recover
from dali_alchemi.store.write.refusals import is_refusal, refused, roll_back
from dali_alchemi.store.write.repair import RepairReport, check_in_place, repair_copy, run_repair
from dali_alchemi.store.write.stream import Parts, write_new_store

if TYPE_CHECKING:
    import torch
    from numpy.typing import NDArray

    from dali_alchemi.types import Level

__all__ = ["AtomicDataZarrWriter"]


logger = logging.getLogger(__name__)


class AtomicDataZarrWriter:
    """Write nvalchemi 0.2.0 stores.

    Parameters
    ----------
    store
        Where the store lives: a path, a URL, a zarr ``Store`` or ``StorePath``, or a ``dict``.
    config
        Codecs, chunk and shard sizes (a :class:`~dali_alchemi.config.WriteConfig` or a plain mapping).
        ``None`` follows the default layout (:func:`~dali_alchemi.config.default_array_configs`): arrays
        that compress little stored raw, the others compressed in small chunks, inside shards.
    lock_timeout
        Seconds each operation waits for another writer of the same store to finish (see
        :mod:`dali_alchemi.store.write.lock`); 0, the default, raises
        :class:`~dali_alchemi.errors.StoreLockedError` at once, naming that writer.
    allow_nonfinite
        Store NaN and inf in float fields. By default they are refused (``SampleDataError`` naming the
        field and sample, before anything is written): nvalchemi stores them silently, and a NaN
        position or label poisons a training run far from its cause. Pass ``True`` for stores that
        mark missing labels with NaN, or the names of the fields that may (convert's filled fields).

    Attributes
    ----------
    on_phase
        Called with the name of each step of a write operation as it completes (``"journal"``,
        ``"data"``, ..., ``"done"``); for progress reporting and the crash tests.
    """

    def __init__(
        self,
        store: StoreLike,
        config: WriteConfig | Mapping[str, Any] | None = None,
        *,
        lock_timeout: float = 0.0,
        allow_nonfinite: bool | Collection[str] = False,
    ) -> None:
        if not lock_timeout >= 0:
            raise ConfigError(f"lock_timeout must be >= 0 seconds, got {lock_timeout}")
        self.lock_timeout = float(lock_timeout)
        self.allow_nonfinite: bool | frozenset[str] = (
            allow_nonfinite if isinstance(allow_nonfinite, bool) else frozenset(allow_nonfinite)
        )
        self._location: StoreLocation = resolve_store(store, read_only=False, must_exist=False)
        if config is None:
            config = WriteConfig()
        elif isinstance(config, Mapping):
            config = WriteConfig.from_dict(config)
        self.config: WriteConfig = config
        self.on_phase: Callable[[str], None] | None = None

    # -- helpers ------------------------------------------------------------------------------------
    def _phase(self, name: str) -> None:
        if self.on_phase is not None:
            self.on_phase(name)

    @contextmanager
    def _locked(self, operation: str) -> Iterator[WriterLock]:
        """Hold the store's writer lock for ``operation`` (re-entrant: nested operations hold it once)."""
        local = self._local
        if local is not None:
            local.parent.mkdir(parents=True, exist_ok=True)
        with WriterLock(self._location, operation, timeout=self.lock_timeout) as lock:
            yield lock

    @contextmanager
    def _writing(self, operation: str, *, lock: bool = True) -> Iterator[None]:
        """Hold the lock for ``operation``; a write the OS refuses becomes a :class:`StoreWriteError`.

        A refusal under the lock puts the store back first (:mod:`~dali_alchemi.store.write.refusals`);
        one while taking the lock (a read-only directory) changed nothing. ``lock=False``: an operation
        that writes only a new store elsewhere (a repair's copy), which cleans up after itself.
        """
        try:
            if not lock:
                yield
                return
            with self._locked(operation):
                try:
                    yield
                except OSError as err:
                    if not is_refusal(err):
                        raise
                    raise refused(self._location, operation, err, roll_back(self._location, operation)) from err
        except OSError as err:
            if not is_refusal(err):
                raise
            raise refused(self._location, operation, err, "The store was not changed.") from err

    @property
    def _local(self) -> Path | None:
        return self._location.local_root

    def _exists(self) -> bool:
        loc = self._location
        if loc.local_root is not None:
            return loc.local_root.exists()
        try:
            root = open_group(loc, mode="r")
        except (FileNotFoundError, zarr.errors.BaseZarrError, KeyError):
            return False
        return bool(root_members(root))

    def _root(self) -> Any:
        return open_group(self._location, mode="r+")

    def _open(self, *, every_array_known: bool = True, recover_first: bool = True) -> tuple[Any, MetaInfo]:
        """Recover an interrupted operation if there is one, then open the store for writing.

        Operations that must keep every array consistent with the pointers (``every_array_known``)
        refuse a store holding arrays this version cannot interpret (levels of a newer writer).
        """
        if recover_first:  # only a dry run opens without: it writes nothing
            check_no_linked_directories(self._location)  # before recovery, which writes too
            recover(self._location, self._phase)
        if not self._exists():
            raise StoreNotFoundError(f"Zarr store does not exist at {self._location.display}")
        open_root(self._location)  # checks that it is a zarr v3 group
        root = self._root()
        meta = check_meta(root, store=self._location.display)
        if every_array_known:
            check_every_array_known(root, meta, store=self._location.display)
        return root, meta

    # -- write --------------------------------------------------------------------------------------
    def write(
        self, samples: Samples | Parts, *, levels: Mapping[str, str] | None = None, custom: Sequence[str] = ()
    ) -> None:
        """Create the store from ``samples`` (dicts of numpy arrays or torch tensors, or a Batch), or from parts.

        Per-sample shapes follow nvalchemi: atom fields ``[V, *t]``, edge fields ``[E, *t]``, system
        fields ``[1, *t]``; ``neighbor_list`` is sample-local. Fields outside nvalchemi's key sets need
        ``levels={name: "atom"|"edge"|"system"}``. Fields named in ``custom`` go to the ``custom/`` group
        (as :meth:`add_custom` would put them) instead of ``core/``. A local store is built beside its
        path and renamed into place, so it never exists half-written. An iterator of parts (each samples as
        above) is written part by part in bounded memory (:mod:`~dali_alchemi.store.write.stream`).

        Raises
        ------
        StoreExistsError
            If the store exists (for a local path: anything at that path, an empty directory too); a
            ``FileExistsError``.
        SampleDataError
            If there are no samples, or they (or two parts) are inconsistent (a ``ValueError``).
        StoreWriteError
            If the operating system refuses a write (no space left, read-only, no permission, a quota, a
            size limit; an ``OSError`` with that errno), after the store is put back
            (:mod:`~dali_alchemi.store.write.refusals`).
        """
        with self._writing("write"):
            if self._exists():
                raise StoreExistsError(f"Zarr store already exists at {self._location.display}")
            write_new_store(self._location, samples, levels, custom, self.config, self.allow_nonfinite, self._phase)
            self._phase("done")

    # -- append -------------------------------------------------------------------------------------
    def append(self, samples: Samples, *, levels: Mapping[str, str] | None = None) -> None:
        """Add samples at the end, extending every core and custom array and the pointers and masks.

        The new samples must carry exactly the store's fields (core and custom), with trailing shapes
        and dtypes the store can hold; ``neighbor_list`` is stored re-based to store-global indices.
        An empty sequence does nothing. Data is extended first, then the masks, the pointers and last
        ``samples_mask``, under a journal that makes readers keep the old sample count until the end.

        Raises
        ------
        StoreNotFoundError
            If the store does not exist (a ``FileNotFoundError``).
        SampleDataError
            If fields are missing or extra, or shapes or dtypes do not fit the stored arrays.
        StoreWriteError
            If the operating system refuses a write (no space left, read-only, no permission, a quota, a
            size limit; an ``OSError`` with that errno), after the store is put back
            (:mod:`~dali_alchemi.store.write.refusals`).
        UnsupportedStoreError
            If a directory inside the local store is a symbolic link: writing through it would change
            files outside the store (:mod:`~dali_alchemi.store.write.confine`).
        """
        if isinstance(samples, SupportsPacked) and not isinstance(samples, PackedSamples):
            samples = samples.to_packed()  # once: a Batch on a device is copied to the host here only
        if not isinstance(samples, PackedSamples) and len(samples) == 0:
            return
        with self._writing("append"):
            root, meta = self._open()
            rows = checked_new_rows(root, meta, samples, levels, allow_nonfinite=self.allow_nonfinite)
            if rows is None:
                return
            append_rows(self._location, root, meta, rows, self._phase)
            self._phase("done")

    # -- custom arrays ------------------------------------------------------------------------------
    def add_custom(self, key: str, data: NDArray[Any] | torch.Tensor, level: str) -> None:
        """Store ``data`` as ``custom/<key>``, one row per atom, edge or physical sample.

        An existing custom array of that name is replaced. On a local store the new array is built
        beside the store and moved in; the ``fields`` attribute is the commit point.

        Raises
        ------
        FieldLevelError
            If ``level`` is not ``atom``, ``edge`` or ``system`` (a ``ValueError``).
        StoreNotFoundError
            If the store does not exist (a ``FileNotFoundError``).
        SampleDataError
            If ``data.shape[0]`` is not the physical size of that level (deleted samples included),
            ``key`` is already a core field or no usable name, the array breaks the rules the reader
            checks, or holds NaN or inf without ``allow_nonfinite`` (a ``ValueError``); all before
            anything is written.
        StoreWriteError
            If the operating system refuses a write (no space left, read-only, no permission, a quota, a
            size limit; an ``OSError`` with that errno), after the store is put back
            (:mod:`~dali_alchemi.store.write.refusals`).
        UnsupportedStoreError
            If a directory inside the local store is a symbolic link: writing through it would change
            files outside the store (:mod:`~dali_alchemi.store.write.confine`).
        """
        checked: Level = layout.check_level(level, what=f"custom array {key!r}")
        check_field_name(key)
        with self._writing("add_custom"):
            root, meta = self._open()
            values = checked_custom(key, data, checked, meta, allow_nonfinite=self.allow_nonfinite)
            write_custom(self._location, root, meta, key, values, checked, self.config, self._phase)
            self._phase("done")

    # -- delete -------------------------------------------------------------------------------------
    def delete(self, indices: Sequence[int] | NDArray[Any] | torch.Tensor) -> None:
        """Soft-delete samples by *physical* index (nvalchemi semantics); their data is zeroed.

        The pointers are unchanged; readers must :meth:`~AtomicDataZarrReader.refresh`. Deleting an
        already deleted sample does nothing. ``samples_mask`` is the commit point; the journal makes
        readers see the deletion as soon as it starts.

        Raises
        ------
        SampleIndexError
            For an out-of-range index (an ``IndexError``).
        ConfigTypeError
            For indices that are not integers (a boolean mask, floats).
        StoreWriteError
            If the operating system refuses a write (no space left, read-only, no permission, a quota, a
            size limit; an ``OSError`` with that errno), after the store is put back
            (:mod:`~dali_alchemi.store.write.refusals`).
        UnsupportedStoreError
            If a directory inside the local store is a symbolic link: writing through it would change
            files outside the store (:mod:`~dali_alchemi.store.write.confine`).
        """
        raw = as_numpy(indices)
        if raw.dtype == np.bool_ or (raw.size and raw.dtype.kind not in "iuO"):
            raise ConfigTypeError(
                f"delete() takes integer physical indices, got dtype {raw.dtype} (a mask is not accepted)"
            )
        if raw.size == 0:
            return
        with self._writing("delete"):
            root, meta = self._open()
            physical = np.unique(
                checked_indices(raw, meta.n_physical, what="Physical index", owner="a store", negative=False)
            )
            write_journal(self._location, DeleteOp(physical=tuple(physical.tolist())))
            self._phase("journal")
            root.attrs.update(bumped(root.attrs.asdict()))  # open readers notice before any row is zeroed
            apply_delete(root, meta, physical, self._phase)
            clear_journal(self._location)
            self._phase("done")

    # -- defragment ---------------------------------------------------------------------------------
    def defragment(
        self, config: WriteConfig | Mapping[str, Any] | None = None, *, window: int = DEFAULT_DEFRAGMENT_WINDOW
    ) -> None:
        """Drop soft-deleted samples for good, streaming ``window`` samples at a time.

        The live samples are copied in order into a new store beside the old one (with ``config``, or
        the writer's), with ``neighbor_list`` re-based, and the new store then replaces the old one.
        Deleting every sample leaves a valid, empty, readable store that keeps its fields. Memory use is
        bounded by one window, never the whole store (:mod:`dali_alchemi.store.write.defragment`).

        Raises
        ------
        UnsupportedStoreError
            If the store is not a local directory (a ``NotImplementedError``), or a directory inside it
            is a symbolic link (:mod:`~dali_alchemi.store.write.confine`).
        StoreWriteError
            If the operating system refuses a write (no space left, read-only, no permission, a quota, a
            size limit; an ``OSError`` with that errno), after the store is put back
            (:mod:`~dali_alchemi.store.write.refusals`).
        """
        if window < 1:
            raise ConfigError(f"window must be >= 1 sample, got {window}")
        new_config = (
            self.config if config is None else WriteConfig.from_dict(config) if isinstance(config, Mapping) else config
        )
        loc = self._location
        if loc.local_root is None:
            raise UnsupportedStoreError(
                "defragment() rewrites local directory stores only; copy the store to a local path first"
            )
        with self._writing("defragment"):
            root, meta = self._open()
            run_defragment(loc, root, meta, new_config, window, self._phase)
            self.config = new_config
            self._phase("done")
            logger.info("defragmented %s: %d -> %d samples", loc.display, meta.n_physical, int(meta.samples_mask.sum()))

    # -- repair -------------------------------------------------------------------------------------
    def repair(
        self, *, out: str | os.PathLike[str] | None = None, dry_run: bool = False, prefer: str | None = None
    ) -> RepairReport:
        """Re-base neighbor lists that nvalchemi 0.2.0's append (or defragment) stored un-rebased.

        Infers how each sample's ``neighbor_list`` was stored and rewrites it store-global
        (:mod:`dali_alchemi.store.check.repair_plan`), in place and crash-safely, or into a new store at ``out``.
        ``dry_run`` only reports. The report's plan says what was found per sample. ``prefer``
        (``"sample-local"``, ``"batch-local"``, ``"global"``) settles samples that several
        interpretations fit, the way the user knows the store was grown.

        Raises
        ------
        AmbiguousRepairError
            If several ways of storing fit some samples; they are listed, nothing is changed.
        RepairError
            If no way of storing can be determined for some samples; likewise.
        UnsupportedStoreError
            For an in-place repair of a store that is not a local directory (use ``out``), or of one in
            which a directory is a symbolic link (:mod:`~dali_alchemi.store.write.confine`).
        StoreWriteError
            If the operating system refuses a write (no space left, read-only, no permission, a quota, a
            size limit; an ``OSError`` with that errno), after the store is put back
            (:mod:`~dali_alchemi.store.write.refusals`).
        """
        if out is not None or dry_run:  # the store is only read (it may be read-only): no lock unless recovering
            if read_journal(self._location) is not None:
                self.recover()
            if out is not None and not dry_run:
                with self._writing("repair", lock=False):
                    return repair_copy(self._location, Path(out), self._phase, prefer=prefer)
            root, meta = self._open(every_array_known=False, recover_first=False)
            return run_repair(self._location, root, meta, dry_run=True, prefer=prefer, phase=self._phase)
        check_in_place(self._location)
        with self._writing("repair"):
            root, meta = self._open(every_array_known=False)  # only neighbor_list changes
            report = run_repair(self._location, root, meta, dry_run=False, prefer=prefer, phase=self._phase)
        if report.applied:
            self._phase("done")
            logger.info("repaired %s: %d samples re-based", self._location.display, report.plan.changed.size)
        return report

    # -- recovery -----------------------------------------------------------------------------------
    def recover(self) -> str | None:
        """Finish or roll back an operation that a killed writer left half-done; returns its name.

        Every writer operation calls this first. An append, or an add_custom that had not committed,
        is rolled back (the store returns to its old state); a delete is completed; a defragment is
        completed if its directory swap had begun, and rolled back (its staged copy removed) if not.
        Staging directories and the ``*.partial`` files that a killed writer left are removed
        (:mod:`dali_alchemi.store.write.recovery`). Runs under the writer lock, so an operation whose writer
        is alive is never rolled back: that raises :class:`~dali_alchemi.errors.StoreLockedError`
        instead (after ``lock_timeout``).

        Raises
        ------
        StoreLockedError
            If another writer holds the store's lock past ``lock_timeout`` (a ``TimeoutError``).
        StoreFormatError
            If the write journal cannot be interpreted; the message names its file and the fix.
        StoreWriteError
            If the operating system refuses a write (no space left, read-only, no permission, a quota, a
            size limit; an ``OSError`` with that errno), after the store is put back
            (:mod:`~dali_alchemi.store.write.refusals`).
        UnsupportedStoreError
            If a directory inside the local store is a symbolic link: writing through it would change
            files outside the store (:mod:`~dali_alchemi.store.write.confine`).
        """
        local = self._local
        if local is not None and not local.parent.is_dir():
            return None  # nothing can be there, and recovering creates no directories
        with self._writing("recover"):
            check_no_linked_directories(self._location)
            return recover(self._location, self._phase)
