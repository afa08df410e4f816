"""Exception hierarchy of dali_alchemi.

Every error the package raises on purpose derives from :class:`DaliAlchemiError`. Each specific error
also inherits the builtin a caller would naturally catch (a missing store is a ``FileNotFoundError``, a
malformed store a ``ValueError``, a bad index an ``IndexError``), so code written against nvalchemi's
reader keeps working. Messages name the store, the array or field, and what was expected versus found.
"""

from __future__ import annotations

__all__ = [
    "AmbiguousRepairError", "ChunkDecodeError", "ConfigError", "ConfigTypeError", "DaliAlchemiError",
    "DaliAlchemiWarning", "DeviceError", "EmptyBatchError", "FieldAssignmentError", "FieldLevelError",
    "FieldMismatchError", "InputNotFoundError", "LoaderClosedError", "LoaderError", "MetricInputError",
    "NotAReaderError", "NotAStoreError", "NvalchemiNotInstalledError", "PlanError", "PlanIndexError",
    "PrecisionLossWarning", "RangeIgnoredWarning", "ReadTooLargeError", "ReaderClosedError", "ReaderOutputError",
    "RemoteRangeError", "RemoteReadError", "RemoteRedirectError", "RepairError", "RewriteMismatchError",
    "SampleDataError", "SampleIndexError", "SampleReadError", "SlowLayoutWarning", "StoreChangedError",
    "StoreExistsError", "StoreFormatError", "StoreLockedError", "StoreNotFoundError", "StoreSchemaWarning",
    "StoreWriteError", "UnknownFieldError", "UnsupportedCodecError", "UnsupportedStoreError"
]


class DaliAlchemiError(Exception):
    """Base class of every error raised on purpose by dali_alchemi."""


class StoreNotFoundError(DaliAlchemiError, FileNotFoundError):
    """The store does not exist where it was asked for."""


class StoreExistsError(DaliAlchemiError, FileExistsError):
    """A new store was to be written where one (or anything else) already exists."""


class InputNotFoundError(DaliAlchemiError, FileNotFoundError):
    """An input file to be converted into a store does not exist."""


class UnsupportedStoreError(DaliAlchemiError, NotImplementedError):
    """The operation is not available for this kind of store (e.g. defragmenting a non-local store)."""


class StoreFormatError(DaliAlchemiError, ValueError):
    """The store exists but does not follow the nvalchemi 0.2.0 layout (missing or inconsistent arrays)."""


class NotAStoreError(StoreFormatError, StoreNotFoundError):
    """The path exists but holds no zarr group (no ``zarr.json`` at its root: an empty folder, say).

    Both a :class:`StoreFormatError` (a ``ValueError``) and a :class:`StoreNotFoundError` (a
    ``FileNotFoundError``), as zarr's ``GroupNotFoundError``, which nvalchemi's reader raises there, is both.
    """


class ChunkDecodeError(StoreFormatError):
    """A chunk is corrupted, truncated, fails its checksum, or is missing from a store that promises
    every chunk; names the array and the chunk key (also as the ``array`` and ``chunk`` attributes)."""

    def __init__(self, message: str, *, array: str | None = None, chunk: str | None = None) -> None:
        super().__init__(message)
        self.array = array
        self.chunk = chunk


class ReadTooLargeError(DaliAlchemiError, MemoryError):
    """A read would need more memory than the machine can give (a hostile store, or too large a window)."""


class RemoteReadError(DaliAlchemiError, OSError):
    """A request to a remote store kept failing after every retry; names the key and the last error."""


class RemoteRangeError(DaliAlchemiError, ValueError):
    """A server's answer to a byte-range request is not the bytes asked for (a ``206`` whose ``Content-Range``
    is another range, a body of another length); names the URL, the range asked and the answer. Not retried."""


class RemoteRedirectError(DaliAlchemiError, ValueError):
    """A server redirected a request where ``FetchConfig.follow_redirects`` does not allow it (by default, to
    another host); names both URLs and the setting that would follow it. Not retried."""


class FieldLevelError(DaliAlchemiError, ValueError):
    """A field has no known level, or a level string is not one of ``atom``, ``edge``, ``system``."""


class SampleDataError(DaliAlchemiError, ValueError):
    """Samples given to the writer are inconsistent (shapes, missing fields, dtypes)."""


class UnknownFieldError(DaliAlchemiError, KeyError):
    """A field was asked for that the store (or the reader's ``fields=`` selection) does not have."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class SampleIndexError(DaliAlchemiError, IndexError):
    """A sample index is out of range for the reader (or a structure index for a batch)."""


class StoreChangedError(DaliAlchemiError, RuntimeError):
    """Another process rewrote the store under an open reader, so the samples it indexes moved.

    Nothing of the read that noticed it is returned; ``refresh()`` the reader (a ``MultiReader``: open a new
    one; a loader: build a new one).
    """


class NotAReaderError(DaliAlchemiError, TypeError):
    """An object was given as a reader that has neither the packed-reader nor nvalchemi's ``read_many`` contract."""


class ReaderOutputError(DaliAlchemiError, ValueError):
    """A wrapped reader returned samples that break its contract: a missing field, a count, shape or dtype
    that does not fit the others, or a neighbor index outside its structure. Names the sample and field."""


class SampleReadError(DaliAlchemiError, RuntimeError):
    """Reading one sample failed while iterating a reader; names the sample and the original error."""


class ReaderClosedError(DaliAlchemiError, RuntimeError):
    """An operation was attempted on a reader after :meth:`close`."""


class LoaderClosedError(DaliAlchemiError, RuntimeError):
    """A loader was iterated after :meth:`close`; build a new one."""


class DeviceError(DaliAlchemiError, RuntimeError):
    """A CUDA device was asked for (``device="cuda"``, ``pin_memory=True``) and none is visible."""


class ConfigError(DaliAlchemiError, ValueError):
    """An argument or configuration value is out of range or inconsistent; the message names it."""


class ConfigTypeError(DaliAlchemiError, TypeError):
    """An argument or configuration value has the wrong type; the message names it and what was given."""


class PlanError(DaliAlchemiError, ValueError):
    """A plan does not fit its loader or reader (sample count, resume state, batch bounds)."""


class PlanIndexError(DaliAlchemiError, IndexError):
    """A batch or window index is out of range for an epoch plan."""


class EmptyBatchError(DaliAlchemiError, ValueError):
    """A batch was to be built from no samples (nvalchemi's "Cannot create batch from empty data list")."""


class UnsupportedCodecError(DaliAlchemiError, NotImplementedError):
    """An array's codec chain is not one the fast decoder handles; the reader then reads it through zarr."""


class LoaderError(DaliAlchemiError, RuntimeError):
    """A failure inside the loader's reading machinery (reader, source callback or worker process).

    The message starts with the original exception's type name, because DALI's worker processes only
    forward the text of an exception, not its type.
    """

    def __init__(self, message: str, *, original_type: str | None = None) -> None:
        super().__init__(message)
        self.original_type = original_type


class FieldMismatchError(DaliAlchemiError, ValueError):
    """Stores read as one dataset disagree on a field (level, dtype or row shape); names both stores."""


class FieldAssignmentError(DaliAlchemiError, TypeError):
    """A value assigned to a Batch attribute cannot be a field (not a tensor, or 0-dimensional)."""


class NvalchemiNotInstalledError(DaliAlchemiError, ImportError):
    """Something that needs nvalchemi-toolkit was used where it cannot be imported; says how to install it."""


class MetricInputError(DaliAlchemiError, ValueError):
    """The inputs of a shuffle-quality metric do not fit together (an order, its batches, the values)."""


class DaliAlchemiWarning(UserWarning):
    """Base class of every warning dali_alchemi issues."""


class PrecisionLossWarning(DaliAlchemiWarning):
    """Storing floats in a narrower dtype (float32) changed some values by more than the stated tolerance."""


class RewriteMismatchError(DaliAlchemiError, ValueError):
    """A rewritten store does not hold what its source held (checked before it is moved into place)."""


class SlowLayoutWarning(DaliAlchemiWarning):
    """A shuffled loader opened a store whose layout and cache do not fit each other; names the rewrite command."""


class RepairError(DaliAlchemiError, ValueError):
    """A store's neighbor lists cannot be repaired: some samples fit no way they could have been stored.

    ``samples`` lists the physical indices of those samples.
    """

    def __init__(self, message: str, samples: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.samples = samples


class AmbiguousRepairError(RepairError):
    """Several ways a sample's neighbor list could have been stored fit its values; repair refuses to guess."""


class StoreSchemaWarning(DaliAlchemiWarning):
    """A store holds arrays whose level this version cannot interpret (a newer writer's); they are not read."""


class RangeIgnoredWarning(DaliAlchemiWarning):
    """A server answered a byte-range request with the whole file (it ignores HTTP ``Range``); the reader slices
    out the bytes it wanted, correct but fetching whole files. Issued once per opened store."""


class StoreLockedError(DaliAlchemiError, TimeoutError):
    """Another writer holds the store's writer lock (and kept it past the timeout asked for).

    ``holder`` is the :class:`~dali_alchemi.store.write.lock.LockHolder` it names (pid, host, operation, since
    when), or ``None`` when the lock names no readable holder.
    """

    def __init__(self, message: str, *, holder: object | None = None) -> None:
        super().__init__(message)
        self.holder = holder


class StoreWriteError(DaliAlchemiError, OSError):
    """The operating system refused a writer operation's write (no space left, a read-only file system,
    no permission, a quota, a file too large).

    The message names the store, the operation, the OS error and the state the store was left in (its
    old state, or the one the next writer operation finishes or rolls back). ``errno`` is the OS
    error's, so ``except OSError`` and errno checks keep working; ``store`` and ``operation`` are
    attributes too.
    """

    def __init__(self, errno: int | None, message: str, *, store: str = "", operation: str = "") -> None:
        super().__init__(errno, message)
        self.store = store
        self.operation = operation

    def __str__(self) -> str:  # OSError would prefix "[Errno N]", which the message already names
        return str(self.strerror)

    def __reduce__(self) -> tuple[type[StoreWriteError], tuple[int | None, str], dict[str, str]]:
        return type(self), (self.errno, str(self.strerror)), {"store": self.store, "operation": self.operation}
