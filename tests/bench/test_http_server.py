"""bench/http_server.py: the loopback store server counts requests and how many waited at once."""

from __future__ import annotations

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
