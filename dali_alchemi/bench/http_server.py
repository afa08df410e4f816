"""A loopback HTTP server for a store directory, with injected latency and failures, counting requests.

It stands for object storage in the remote-store benchmark and tests: every request waits
``latency_s`` (requests are served concurrently, one thread each), a seeded fraction of them answer
``503 Service Unavailable``, and the server counts requests per path so a test can check how often
each chunk was fetched. It serves GET and HEAD, byte ranges (``Range: bytes=a-b``, ``bytes=a-``,
``bytes=-n``) and HTML directory listings, which is what fsspec's HTTP filesystem needs. Requests
matching ``stall`` are accepted and never answered, like a hung server. With ``ranges=False`` it ignores
``Range`` and answers 200 with the whole file, as Python's ``http.server`` does; with ``redirect_to`` it
answers every request with a redirect to the same path there. It binds to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from dali_alchemi.errors import ConfigError

__all__ = ["StoreServer"]


_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class _Handler(SimpleHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: the counts are the record

    def _delay_or_fail(self) -> bool:
        """Wait the injected latency; True when this request was chosen to fail (or stalled)."""
        self.server.count(self.command, self.path)
        if self.server.stall is not None and self.server.stall.search(self.path):
            self.server.stopping.wait()  # accepted, never answered: until the server stops
            self.close_connection = True
            return True
        if self.server.latency_s:
            with self.server.in_flight():
                time.sleep(self.server.latency_s)
        if self.server.should_fail():
            self.send_error(HTTPStatus.SERVICE_UNAVAILABLE, "injected failure")
            return True
        if self.server.redirect_to is not None:
            self.send_response(HTTPStatus.TEMPORARY_REDIRECT)
            self.send_header("Location", self.server.redirect_to + self.path.lstrip("/"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        return False

    def do_HEAD(self) -> None:
        if not self._delay_or_fail():
            super().do_HEAD()

    def do_GET(self) -> None:
        if self._delay_or_fail():
            return
        wanted = self.headers.get("Range")
        path = Path(self.translate_path(self.path))
        if not wanted or not path.is_file() or not self.server.ranges:
            super().do_GET()
            return
        match = _RANGE.match(wanted.strip())
        size = path.stat().st_size
        if match is None:
            self.send_error(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, "unsupported range")
            return
        first, last = match.groups()
        if first == "":  # the last n bytes
            start, stop = max(0, size - int(last)), size
        else:
            start, stop = int(first), size if last == "" else min(size, int(last) + 1)
        if start >= size and size > 0:
            self.send_error(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, "range past the end")
            return
        with open(path, "rb") as fh:
            fh.seek(start)
            body = fh.read(max(0, stop - start))
        self.send_response(HTTPStatus.PARTIAL_CONTENT)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # the default backlog of 5 drops concurrent connections and serialises clients

    def __init__(
        self, address: tuple[str, int], handler: Any, *, latency_s: float, failure_rate: float, seed: int,
        stall: str | None = None, ranges: bool = True, redirect_to: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(address, handler)
        self.ranges = ranges
        self.redirect_to = redirect_to
        self.stall = re.compile(stall) if stall is not None else None
        self.stopping = threading.Event()
        self.latency_s = latency_s
        self.failure_rate = failure_rate
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.failures = 0
        self.waiting = 0
        self.peak_waiting = 0

    def count(self, method: str, path: str) -> None:
        with self._lock:
            self.requests[(method, path.split("?")[0])] += 1

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """Counts a request as waiting out its latency, and keeps the most that waited at once."""
        with self._lock:
            self.waiting += 1
            self.peak_waiting = max(self.peak_waiting, self.waiting)
        try:
            yield
        finally:
            with self._lock:
                self.waiting -= 1

    def should_fail(self) -> bool:
        if not self.failure_rate:
            return False
        with self._lock:
            failed = self._random.random() < self.failure_rate
            self.failures += failed
            return failed


class StoreServer:
    """Serve ``root`` on http://127.0.0.1:<port>/ in a background thread (use as a context manager).

    Parameters
    ----------
    root
        The directory to serve (for example the parent folder of a ``.zarr`` store).
    latency_s
        Seconds every request waits before it is answered.
    failure_rate
        Fraction of requests answered with 503, drawn from a generator seeded with ``seed``.
    stall
        A regular expression: requests whose path matches it are accepted and never answered (until
        the server stops), as a hung server or a black-holed connection would.
    ranges
        ``False``: ignore ``Range`` headers and answer 200 with the whole file, as Python's
        ``http.server`` does.
    redirect_to
        A base URL ending in ``/``: every request is answered ``307 Temporary Redirect`` to its path
        below it (a store that moved, or a server handing reads to another host).
    """

    def __init__(
        self, root: str | os.PathLike[str], *, latency_s: float = 0.0, failure_rate: float = 0.0, seed: int = 0,
        stall: str | None = None, ranges: bool = True, redirect_to: str | None = None,
    ) -> None:  # fmt: skip
        if not 0.0 <= failure_rate < 1.0:
            raise ConfigError(f"failure_rate must be in [0, 1), got {failure_rate}")
        handler = partial(_Handler, directory=str(root))
        self._server = _Server(
            ("127.0.0.1", 0), handler, latency_s=latency_s, failure_rate=failure_rate, seed=seed, stall=stall,
            ranges=ranges, redirect_to=redirect_to,
        )  # fmt: skip
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="store-server", daemon=True
        )  # stop() waits for the next poll

    @property
    def url(self) -> str:
        """The server's base URL, ending in ``/``."""
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}/"

    @property
    def requests(self) -> Counter[tuple[str, str]]:
        """Requests so far, keyed by ``(method, path)``."""
        return self._server.requests

    @property
    def failures(self) -> int:
        """Requests answered with an injected 503 so far."""
        return self._server.failures

    @property
    def peak_concurrency(self) -> int:
        """The most requests that were waiting out their latency at the same moment (0 without latency).

        Above 1 means the client overlapped its requests; a client that fetches one at a time keeps it at 1
        however fast or slow the machine is.
        """
        return self._server.peak_waiting

    def reset_counts(self) -> None:
        self._server.requests.clear()
        self._server.failures = 0
        self._server.peak_waiting = 0

    def start(self) -> StoreServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.stopping.set()  # stalled requests end
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> StoreServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
