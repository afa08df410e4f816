"""store/format/http.py: range answers checked (servers that ignore Range, or answer another range) and
redirects kept to the store's origin, against real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from yarl import URL
from zarr.core.sync import sync

from dali_alchemi import AtomicDataZarrReader
from dali_alchemi.bench.http_server import StoreServer
from dali_alchemi.bench.synth import write_synthetic_store
from dali_alchemi.errors import ConfigError, RangeIgnoredWarning, RemoteRangeError, RemoteRedirectError
from dali_alchemi.remote_config import FetchConfig
from dali_alchemi.store.format.http import CheckedHTTPFileSystem, same_origin_redirects, wanted_bytes

N = 300


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store in the default layout (shards whose indexes are read with suffix ranges), in a folder to serve."""
    root = tmp_path_factory.mktemp("served-http")
    write_synthetic_store(root / "S", N, seed=5)
    return root


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


class _WrongRange(_Quiet):
    """Answers a Range request with 206 and as many bytes as asked, from one byte earlier (and says so)."""

    def do_GET(self) -> None:
        path = Path(self.translate_path(self.path))
        wanted = self.headers.get("Range")
        if not wanted or not path.is_file():
            super().do_GET()
            return
        data = path.read_bytes()
        first, last = wanted.removeprefix("bytes=").split("-")
        start = len(data) - int(last) if first == "" else int(first)
        stop = len(data) if first == "" or last == "" else min(len(data), int(last) + 1)
        shifted = max(0, start - 1)
        body = data[shifted : shifted + stop - start]
        self.send_response(HTTPStatus.PARTIAL_CONTENT)
        self.send_header("Content-Range", f"bytes {shifted}-{shifted + len(body) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Moved(_Quiet):
    """Serves the folder (ignoring Range) and redirects ``/moved/...`` to ``/...`` on the same server."""

    def do_GET(self) -> None:
        if self.path.startswith("/moved/"):
            self.send_response(HTTPStatus.MOVED_PERMANENTLY)
            self.send_header("Location", self.path.removeprefix("/moved"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default backlog of 5 drops the reader's concurrent connections (a 1 s SYN retry)


@contextmanager
def _serving(root: Path, handler: type[SimpleHTTPRequestHandler] = _Quiet) -> Iterator[str]:
    """Python's own ``http.server`` handler (what ``python -m http.server`` runs) on 127.0.0.1, in a thread."""
    server = _Server(("127.0.0.1", 0), partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _same_reads(remote: AtomicDataZarrReader, local: AtomicDataZarrReader) -> None:
    order = np.random.default_rng(0).permutation(N)[:120]
    got, want = remote.read_packed(order), local.read_packed(order)
    assert len(remote) == N and sorted(got.fields) == sorted(want.fields)
    for name in want.fields:
        assert got.fields[name].dtype == want.fields[name].dtype, name
        assert np.array_equal(got.fields[name], want.fields[name]), name


# -- servers that ignore Range, or answer another range --------------------------------------------------
def test_a_server_that_ignores_range_reads_right_with_one_warning(served: Path) -> None:
    local = AtomicDataZarrReader(served / "S")
    with _serving(served) as url, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with AtomicDataZarrReader(url + "S") as remote:
            _same_reads(remote, local)
            _same_reads(remote, local)
    ignored = [w for w in caught if issubclass(w.category, RangeIgnoredWarning)]
    assert len(ignored) == 1, [str(w.message) for w in caught]
    message = str(ignored[0].message)
    assert message.startswith(url + "S/") and "answered 200 with the whole file" in message
    assert "ignores HTTP Range requests" in message and "supports Range requests" in message


def test_a_206_with_another_content_range_is_a_remote_range_error(served: Path) -> None:
    with _serving(served, _WrongRange) as url:
        with pytest.raises(
            RemoteRangeError, match=r"asked for bytes=\S+, the server answered 206 with Content-Range"
        ) as info:
            with AtomicDataZarrReader(url + "S", fetch=FetchConfig(retries=3, backoff_s=0.0)) as remote:
                remote.read_packed(np.arange(10))
    assert str(info.value).startswith(url + "S/")
    assert "those are not the bytes asked for" in str(info.value)


@pytest.mark.parametrize(
    ("asked", "want"),
    [
        ("bytes=2-5", b"2345"),
        ("bytes=7-", b"789"),
        ("bytes=-3", b"789"),
        ("bytes=-40", b"0123456789"),
        ("bytes=12-20", b""),
    ],
)
def test_a_whole_file_answer_gives_the_bytes_asked_for(asked: str, want: bytes) -> None:
    whole = b"0123456789"
    assert wanted_bytes("http://h/f", asked, 200, {"Content-Length": "10"}, whole) == want


@pytest.mark.parametrize(
    ("asked", "answered", "body"),
    [("bytes=2-5", "bytes 2-5/10", b"2345"), ("bytes=-3", "bytes 7-9/10", b"789"), ("bytes=-40", "bytes 0-9/10", b"0123456789"),
     ("bytes=7-", "bytes 7-9/10", b"789"), ("bytes=8-20", "bytes 8-9/10", b"89"), ("bytes=2-5", "bytes 2-5/*", b"2345")],
)  # fmt: skip
def test_a_206_for_the_range_asked_is_taken(asked: str, answered: str, body: bytes) -> None:
    assert wanted_bytes("http://h/f", asked, 206, {"Content-Range": answered}, body) == body


@pytest.mark.parametrize(
    ("asked", "status", "headers", "body", "match"),
    [
        (
            "bytes=2-5",
            206,
            {"Content-Range": "bytes 3-6/10"},
            b"3456",
            r"answered 206 with Content-Range 'bytes 3-6/10'",
        ),
        ("bytes=-3", 206, {"Content-Range": "bytes 6-8/10"}, b"678", r"asked for bytes=-3, the server answered 206"),
        ("bytes=2-5", 206, {"Content-Range": "bytes 2-5/10"}, b"23", r"and 2 bytes; those are not the bytes asked for"),
        ("bytes=2-5", 206, {}, b"2345", r"answered 206 with Content-Range 'missing'"),
        ("bytes=2-5", 204, {}, b"", r"answered 204"),
        ("bytes=2-5", 200, {"Content-Length": "12"}, b"0123456789", r"answered 200 with 10 bytes \(Content-Length 12"),
    ],
)
def test_an_answer_that_is_not_the_range_is_a_remote_range_error(
    asked: str, status: int, headers: dict[str, str], body: bytes, match: str
) -> None:
    with pytest.raises(RemoteRangeError, match=match) as info:
        wanted_bytes("http://h/S/c/0", asked, status, headers, body)
    assert str(info.value).startswith(f"http://h/S/c/0: asked for {asked}")


# -- redirects -----------------------------------------------------------------------------------------
def test_a_redirect_to_another_host_is_refused_by_default_and_followed_when_allowed(served: Path) -> None:
    local = AtomicDataZarrReader(served / "S")
    with StoreServer(served) as real, StoreServer(served, redirect_to=real.url) as front:
        assert real.url != front.url  # another port: another origin
        with pytest.raises(RemoteRedirectError) as info:
            AtomicDataZarrReader(front.url + "S", fetch=FetchConfig(retries=3, backoff_s=0.0))
        message = str(info.value)
        # the first key the opening reads through the front (the root's or a meta array's zarr.json)
        assert re.match(rf"{re.escape(front.url)}S/(\S*)zarr\.json redirected \(307\) to {re.escape(real.url)}S/\1zarr\.json, another origin", message), message
        assert "FetchConfig(follow_redirects='any')" in message
        assert sum(real.requests.values()) == 0  # refused before the other host was asked anything
        assert sum(front.requests.values()) <= 2  # not retried (the opening reads two keys before it fails)

        with AtomicDataZarrReader(front.url + "S", fetch=FetchConfig(follow_redirects="any")) as remote:
            _same_reads(remote, local)
        assert sum(real.requests.values()) >= sum(front.requests.values()) - 2 > 0  # each sent on, and answered there


def test_a_redirect_within_the_origin_is_followed(served: Path) -> None:
    local = AtomicDataZarrReader(served / "S")
    with _serving(served, _Moved) as url, warnings.catch_warnings():
        warnings.simplefilter("ignore", RangeIgnoredWarning)
        with AtomicDataZarrReader(url + "moved/S") as remote:
            _same_reads(remote, local)


class _Answer(SimpleNamespace):
    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    ("location", "followed"),
    [("/S/b", True), ("b", True), ("http://127.0.0.1:8000/S/b", True), ("http://127.0.0.1:8001/S/b", False),
     ("http://localhost:8000/S/b", False), ("https://127.0.0.1:8000/S/b", False), ("//example.org/S/b", False)],
)  # fmt: skip
def test_only_redirects_to_the_same_scheme_host_and_port_are_followed(location: str, followed: bool) -> None:
    request = SimpleNamespace(url=URL("http://127.0.0.1:8000/S/a"))
    answer = _Answer(status=302, headers={"Location": location}, closed=False)

    async def handler(_: Any) -> Any:
        return answer

    if followed:
        assert sync(same_origin_redirects(request, handler)) is answer
        return
    with pytest.raises(
        RemoteRedirectError, match=r"^http://127.0.0.1:8000/S/a redirected \(302\) to \S+, another origin"
    ):
        sync(same_origin_redirects(request, handler))
    assert answer.closed


def test_the_redirect_policy_is_checked() -> None:
    for bad in ("", "all", "none", True):
        with pytest.raises(ConfigError, match=r"follow_redirects must be one of \('same-origin', 'any'\)"):
            FetchConfig(follow_redirects=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="follow_redirects must be one of"):
            CheckedHTTPFileSystem(follow_redirects=bad, skip_instance_cache=True)  # type: ignore[arg-type]
    assert FetchConfig().follow_redirects == "same-origin"
