"""HTTP(S) stores: byte-range answers checked against the range asked, and redirects kept to their origin.

A store opened from an ``http(s)://`` URL reads through :class:`CheckedHTTPFileSystem`, fsspec's HTTP
filesystem with two checks that fsspec leaves out:

- **Range answers.** A ``206`` must carry the ``Content-Range`` asked for (a server that sends other
  bytes would otherwise hand a shard index or a chunk the wrong bytes, which fail later as corrupt
  data). A ``200`` to a range request is the whole file (Python's ``http.server`` answers every request
  so): the bytes asked for are sliced out of it, correct but wasteful, and a
  :class:`~dali_alchemi.errors.RangeIgnoredWarning` says so once per server. An answer that fits
  neither raises a :class:`~dali_alchemi.errors.RemoteRangeError` naming the URL and both ranges.
- **Redirects.** Every request of the filesystem's session (reads, sizes, listings) follows a redirect
  only as ``FetchConfig.follow_redirects`` allows: by default within the same origin (scheme, host and
  port). Any other raises a :class:`~dali_alchemi.errors.RemoteRedirectError` before the other host is
  contacted.
"""

from __future__ import annotations

import asyncio
import os
import re
import warnings
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fsspec.implementations.http import HTTPFileSystem
from yarl import URL
from zarr.storage import FsspecStore

from dali_alchemi.errors import ConfigError, RangeIgnoredWarning, RemoteRangeError, RemoteRedirectError
from dali_alchemi.remote_config import REDIRECT_POLICIES, FetchConfig

__all__ = [
    "REDIRECT_STATUSES",
    "CheckedHTTPFileSystem",
    "http_store",
    "is_http_url",
    "same_origin_redirects",
    "wanted_bytes",
]


REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
"""The statuses aiohttp follows as redirects."""

_ASKED = re.compile(r"bytes=(\d*)-(\d*)$")
_ANSWERED = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)$")


def is_http_url(text: str) -> bool:
    """Whether ``text`` is a plain ``http://`` or ``https://`` URL (not an fsspec chain such as ``simplecache::``)."""
    return text.startswith(("http://", "https://")) and "::" not in text


def _origin(url: URL) -> tuple[str, str, int | None]:
    return url.scheme, (url.host or "").lower(), url.port  # yarl gives the scheme's default port when none is set


async def same_origin_redirects(request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
    """An aiohttp client middleware that refuses redirects to another origin (scheme, host or port).

    It sees each answer before aiohttp follows its redirect, so a refused target is never contacted;
    aiohttp's own limit (10 redirects) bounds a chain of followed ones.

    Raises
    ------
    RemoteRedirectError
        If the answer redirects to another origin.
    """
    response = await handler(request)
    location = response.headers.get("Location") if response.status in REDIRECT_STATUSES else None
    if location is None:
        return response
    target = request.url.join(URL(location))
    if _origin(target) == _origin(request.url):
        return response
    response.close()
    raise RemoteRedirectError(
        f"{request.url} redirected ({response.status}) to {target}, another origin (scheme, host or port), which "
        "is not followed by default; if the store is meant to be read from there, open it by that URL or with "
        "FetchConfig(follow_redirects='any')"
    )


def wanted_bytes(url: str, asked: str, status: int, headers: Mapping[str, str], body: bytes) -> bytes:
    """The bytes a range request ``asked`` (``bytes=a-b``, ``bytes=a-`` or ``bytes=-n``) wanted, from its answer.

    Raises
    ------
    RemoteRangeError
        If the answer is a ``206`` for other bytes than asked (or without a readable ``Content-Range``),
        a ``200`` whose body is not as long as its ``Content-Length``, or any other status.
    """
    first, last = (int(x) if x else None for x in _ASKED.fullmatch(asked).groups())  # type: ignore[union-attr]
    if status == 200:
        length = headers.get("Content-Length")
        if "Content-Range" in headers or (
            length is not None and "Content-Encoding" not in headers and int(length) != len(body)
        ):
            raise RemoteRangeError(
                f"{url}: asked for {asked}, the server answered 200 with {len(body)} bytes (Content-Length "
                f"{length}, Content-Range {headers.get('Content-Range')}), which is neither the range nor the whole "
                "file; serve the store with a server that supports HTTP Range requests"
            )
        if first is None:  # the last n bytes
            return body[max(0, len(body) - (last or 0)) :]
        return body[first : None if last is None else last + 1]
    answered = headers.get("Content-Range", "")
    match = _ANSWERED.fullmatch(answered.strip()) if status == 206 else None
    if match is None:
        raise RemoteRangeError(
            f"{url}: asked for {asked}, the server answered {status} with Content-Range {answered or 'missing'!r}; "
            "a server must answer a Range request with 206 and the range, or 200 and the whole file"
        )
    start, stop, total = int(match[1]), int(match[2]) + 1, None if match[3] == "*" else int(match[3])
    if total is not None:  # the range that should have come, clipped to the file
        if first is None:  # the last n bytes
            fits = (start, stop) == (max(0, total - (last or 0)), total)
        else:
            fits = (start, stop) == (first, total if last is None else min(last + 1, total))
    else:  # the file's size not given: the bytes must at least lie inside the range asked
        fits = (first is None and stop - start <= (last or 0)) or (
            first == start and (last is None or stop <= last + 1)
        )
    if not fits or len(body) != stop - start:
        raise RemoteRangeError(
            f"{url}: asked for {asked}, the server answered 206 with Content-Range {answered!r} and {len(body)} bytes; "
            "those are not the bytes asked for, so nothing of the answer is used"
        )
    return body


class CheckedHTTPFileSystem(HTTPFileSystem):
    """fsspec's HTTP filesystem with range answers checked and redirects kept to ``follow_redirects``.

    ``follow_redirects`` is one of :data:`~dali_alchemi.remote_config.REDIRECT_POLICIES`; every other
    argument is fsspec's. With ``"same-origin"`` its aiohttp session refuses redirects to other hosts
    (:func:`same_origin_redirects`).

    Raises
    ------
    ConfigError
        If ``follow_redirects`` is not one of the policies.
    """

    def __init__(self, *args: Any, follow_redirects: str = "same-origin", **kwargs: Any) -> None:
        if follow_redirects not in REDIRECT_POLICIES:
            raise ConfigError(f"follow_redirects must be one of {REDIRECT_POLICIES}, got {follow_redirects!r}")
        client_kwargs = dict(kwargs.pop("client_kwargs", None) or {})
        if follow_redirects == "same-origin":
            client_kwargs["middlewares"] = (*client_kwargs.get("middlewares", ()), same_origin_redirects)
        super().__init__(*args, client_kwargs=client_kwargs, **kwargs)
        self.follow_redirects = follow_redirects
        self.ignoring_range: set[tuple[str, str, int | None]] = set()  # the origins warned about

    async def _cat_file(self, url: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        if (start is None and end is None) or start == end:
            return await super()._cat_file(url, start=start, end=end, **kwargs)
        kw = {**self.kwargs, **kwargs}
        asked = await self._process_limits(url, start, end)
        kw["headers"] = {**(kw.get("headers") or {}), "Range": asked}
        session = await self.set_session()
        async with session.get(self.encode_url(url), **kw) as response:
            body = await response.read()
            self._raise_not_found_for_status(response, url)
            status, headers = response.status, response.headers
        wanted = wanted_bytes(url, asked, status, headers, body)
        if status == 200 and _origin(URL(url)) not in self.ignoring_range:
            self.ignoring_range.add(_origin(URL(url)))
            warnings.warn(
                f"{url}: the server answered 200 with the whole file ({len(body)} bytes) to a request for {asked}: "
                "it ignores HTTP Range requests (Python's http.server does), so every read fetches whole files and "
                "slices out the bytes it needs. Serve the store with a server that supports Range requests (nginx, "
                "Apache, Caddy, object storage) to fetch only those bytes.",
                RangeIgnoredWarning, stacklevel=2,
            )  # fmt: skip
        return wanted

    async def set_session(self) -> Any:
        fresh = self._session is None
        session = await super().set_session()
        if fresh and self.asynchronous:  # fsspec closes the sessions of its sync instances only
            weakref.finalize(self, _close_session, os.getpid(), asyncio.get_running_loop(), session)
        return session

    async def _info(self, url: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return await super()._info(url, **kwargs)
        except FileNotFoundError as err:  # fsspec reports any failure of its HEAD and GET as a missing file
            if isinstance(err.__cause__, RemoteRedirectError):
                raise err.__cause__ from None
            raise


def _close_session(pid: int, loop: asyncio.AbstractEventLoop, session: Any) -> None:
    """Close ``session`` when its filesystem goes (or at exit), in the process that opened it only."""
    if os.getpid() == pid:  # a forked child's copy belongs to the parent's event loop, not to the child
        HTTPFileSystem.close_session(loop, session)


def http_store(
    url: str, *, read_only: bool, fetch: FetchConfig | None, storage_options: Mapping[str, Any] | None
) -> FsspecStore:
    """A zarr store for ``url`` read through a :class:`CheckedHTTPFileSystem`.

    Like ``FsspecStore.from_url``, stores opened with the same options (``follow_redirects`` included)
    share one filesystem, and so one connection pool, per thread.
    """
    policy = (fetch or FetchConfig()).follow_redirects
    fs = CheckedHTTPFileSystem(asynchronous=True, follow_redirects=policy, **dict(storage_options or {}))
    return FsspecStore(fs=fs, path=fs._strip_protocol(url), read_only=read_only)
