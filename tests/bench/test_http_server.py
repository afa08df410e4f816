"""bench/http_server.py: the loopback store server counts requests and how many waited at once, and can ignore
Range or redirect every request."""

from __future__ import annotations

import http.client
import threading
import urllib.request
from pathlib import Path

from dali_alchemi.bench.http_server import StoreServer


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def test_requests_in_flight_together_are_counted_once_each(tmp_path: Path) -> None:
    (tmp_path / "chunk").write_bytes(b"0123456789")
    with StoreServer(tmp_path, latency_s=0.5) as server:
        assert server.peak_concurrency == 0
        assert _get(server.url + "chunk") == b"0123456789"
        assert _get(server.url + "chunk") == b"0123456789"
        assert server.peak_concurrency == 1  # one after the other: never two at once

        server.reset_counts()
        arrived = threading.Barrier(4)

        def fetch() -> None:
            arrived.wait(60)  # all four ask at once; each then waits 0.5 s inside the server
            _get(server.url + "chunk")

        threads = [threading.Thread(target=fetch) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert server.requests[("GET", "/chunk")] == 4
        assert 2 <= server.peak_concurrency <= 4


def _ask(url: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_ranges_are_honoured_or_ignored_as_asked(tmp_path: Path) -> None:
    (tmp_path / "chunk").write_bytes(b"0123456789")
    with StoreServer(tmp_path) as server:
        status, headers, body = _ask(server.url, "/chunk", {"Range": "bytes=-3"})
        assert (status, headers["Content-Range"], body) == (206, "bytes 7-9/10", b"789")
    with StoreServer(tmp_path, ranges=False) as server:  # as Python's http.server: 200 and the whole file
        status, headers, body = _ask(server.url, "/chunk", {"Range": "bytes=-3"})
        assert (status, "Content-Range" in headers, body) == (200, False, b"0123456789")


def test_redirect_to_sends_every_request_on_to_the_same_path(tmp_path: Path) -> None:
    (tmp_path / "chunk").write_bytes(b"0123456789")
    with StoreServer(tmp_path) as real, StoreServer(tmp_path, redirect_to=real.url) as front:
        status, headers, body = _ask(front.url, "/chunk", {})
        assert (status, headers["Location"], body) == (307, real.url + "chunk", b"")
        assert _get(front.url + "chunk") == b"0123456789"  # urllib follows it
        assert front.requests[("GET", "/chunk")] == 2 and real.requests[("GET", "/chunk")] == 1
