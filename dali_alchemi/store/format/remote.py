"""Retries for stores reached over a network: every read is retried with exponential back-off.

:class:`RetryingStore` wraps any zarr store, so zarr's own metadata reads and the reader's chunk
fetches share one policy (:class:`~dali_alchemi.config.FetchConfig`). A missing object is an answer,
not a failure, and is never retried; anything else (a timeout, a reset connection, an HTTP 5xx) is
retried. Every attempt is bounded by ``FetchConfig.timeout_s``, whatever the network stack's own
timeouts, so a server that never answers fails like one that refuses; after the last attempt a :class:`~dali_alchemi.errors.RemoteReadError` names the key,
the number of attempts and the last error. A wrong answer is not retried either: a redirect refused
(:class:`~dali_alchemi.errors.RemoteRedirectError`), or more bytes than a byte range asked for
(:class:`~dali_alchemi.errors.RemoteRangeError`; a server that ignores ``Range`` sends whole files),
which would otherwise reach the decoder as a corrupt chunk or shard index.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from zarr.abc.store import ByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.storage import WrapperStore

from dali_alchemi.errors import RemoteRangeError, RemoteReadError, RemoteRedirectError
from dali_alchemi.remote_config import FetchConfig

if TYPE_CHECKING:
    from zarr.core.buffer import Buffer, BufferPrototype

__all__ = ["PERMANENT_ERRORS", "RetryingStore", "T"]


logger = logging.getLogger(__name__)

T = TypeVar("T")

# Answers, not failures: retrying them cannot help.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    RemoteRangeError,
    RemoteRedirectError,
)


def _checked_length(store: Store, key: str, byte_range: ByteRequest | None, buf: Buffer | None) -> Buffer | None:
    """``buf``, unless it holds more bytes than ``byte_range`` asked for (a server that ignored the range).

    Raises
    ------
    RemoteRangeError
        If ``buf`` is longer than the range or suffix asked for.
    """
    if buf is None or byte_range is None:
        return buf
    if isinstance(byte_range, RangeByteRequest):
        most, asked = byte_range.end - byte_range.start, f"bytes {byte_range.start}-{byte_range.end - 1}"
    elif isinstance(byte_range, SuffixByteRequest):
        most, asked = byte_range.suffix, f"the last {byte_range.suffix} bytes"
    else:
        return buf
    if len(buf) > most:
        raise RemoteRangeError(
            f"{key!r} on {store}: asked for {asked}, got {len(buf)} bytes: the store ignored the byte range, as an "
            "HTTP server without Range support does by sending whole files. Serve the store with a server that "
            "supports HTTP Range requests, or open it by its http(s):// URL, which takes the bytes asked for out of "
            "whole-file answers"
        )
    return buf


class RetryingStore(WrapperStore[Store]):
    """A zarr store whose reads are retried under a :class:`FetchConfig`; writes pass straight through."""

    def __init__(self, store: Store, fetch: FetchConfig | None = None) -> None:
        super().__init__(store)
        self.fetch = fetch or FetchConfig()

    def _with_store(self, store: Store) -> RetryingStore:
        return type(self)(store, self.fetch)

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self._store, "fetch": self.fetch}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["store"], state["fetch"])  # type: ignore[misc]

    async def _retry(self, what: str, key: str, call: Callable[[], Awaitable[T]]) -> T:
        attempts = self.fetch.retries + 1
        timeout = self.fetch.timeout_s
        for attempt in range(attempts):
            try:
                return await asyncio.wait_for(call(), timeout)  # bounds connecting and reading alike
            except PERMANENT_ERRORS:
                raise
            except Exception as err:  # network stacks raise many types; all are worth another try
                if attempt + 1 == attempts:
                    why = f"no answer within {timeout:g} s (FetchConfig.timeout_s)" if isinstance(err, TimeoutError) else err
                    raise RemoteReadError(
                        f"{what} {key!r} on {self._store} failed after {attempts} attempts: {type(err).__name__}: {why}"
                    ) from err
                delay = self.fetch.delay(attempt)
                logger.debug("%s %r failed (%s), retrying in %.3f s", what, key, err, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        buf = await self._retry("reading", key, lambda: self._store.get(key, prototype, byte_range))
        return _checked_length(self._store, key, byte_range, buf)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        pairs = list(key_ranges)
        bufs = await self._retry(
            "reading", ",".join(k for k, _ in pairs[:3]), lambda: self._store.get_partial_values(prototype, pairs)
        )
        return [
            _checked_length(self._store, key, byte_range, buf)
            for (key, byte_range), buf in zip(pairs, bufs, strict=True)
        ]

    async def exists(self, key: str) -> bool:
        return await self._retry("checking", key, lambda: self._store.exists(key))

    async def getsize(self, key: str) -> int:
        return await self._retry("sizing", key, lambda: self._store.getsize(key))

    async def _listed(self, what: str, prefix: str, lister: Callable[[], AsyncIterator[str]]) -> list[str]:
        async def collect() -> list[str]:
            return [item async for item in lister()]

        return await self._retry(what, prefix, collect)

    async def list(self) -> AsyncIterator[str]:  # type: ignore[override]
        for item in await self._listed("listing", "", self._store.list):
            yield item

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:  # type: ignore[override]
        for item in await self._listed("listing", prefix, lambda: self._store.list_prefix(prefix)):
            yield item

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:  # type: ignore[override]
        for item in await self._listed("listing", prefix, lambda: self._store.list_dir(prefix)):
            yield item
