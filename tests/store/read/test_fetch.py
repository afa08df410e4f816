"""store/read/fetch.py: many byte requests in one call, answered in request order, for local and other stores."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import MemoryStore

from dali_alchemi.errors import ChunkDecodeError
from dali_alchemi.store.read import fetch as fetch_module
from dali_alchemi.store.read.fetch import INLINE_READS, ByteRequest, LocalFetcher, StoreFetcher

OBJECTS = {f"a/c/{i}": bytes(range(i, i + 40)) for i in range(12)}


@pytest.fixture()
def pool() -> ThreadPoolExecutor:
    with ThreadPoolExecutor(4) as executor:
        yield executor


@pytest.fixture()
def local(tmp_path: Path, pool: ThreadPoolExecutor) -> LocalFetcher:
    for key, data in OBJECTS.items():
        path = tmp_path / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return LocalFetcher(tmp_path, pool)


def _memory_store() -> MemoryStore:
    store = MemoryStore()
    for key, data in OBJECTS.items():
        sync(store.set(key, default_buffer_prototype().buffer.from_bytes(data)))
    return store


@pytest.fixture()
def remote() -> StoreFetcher:
    return StoreFetcher(_memory_store(), max_concurrency=3)


def _as_bytes(payloads: list[Any | None]) -> list[bytes | None]:
    return [None if p is None else bytes(p) for p in payloads]


@pytest.fixture(params=["local", "store"])
def fetcher(request: pytest.FixtureRequest, local: LocalFetcher, remote: StoreFetcher) -> Any:
    return local if request.param == "local" else remote


@pytest.mark.parametrize("count", [1, INLINE_READS, 12])  # inline on the calling thread, and on the pool
def test_whole_objects_come_back_in_request_order(fetcher: Any, count: int) -> None:
    keys = [f"a/c/{i}" for i in reversed(range(12))][:count]
    got = _as_bytes(fetcher.fetch([ByteRequest(k) for k in keys]))
    assert got == [OBJECTS[k] for k in keys]


def test_ranges_offsets_and_suffixes(fetcher: Any) -> None:
    data = OBJECTS["a/c/3"]
    requests = [
        ByteRequest("a/c/3", start=5, stop=9),
        ByteRequest("a/c/3", suffix=6),
        ByteRequest("a/c/3", start=30),
        ByteRequest("a/c/3", suffix=100),  # longer than the object: all of it
        ByteRequest("a/c/3", start=0, stop=40),
    ]
    assert _as_bytes(fetcher.fetch(requests)) == [data[5:9], data[-6:], data[30:], data, data]


def test_a_missing_object_is_none_in_its_place(fetcher: Any) -> None:
    requests = [ByteRequest("a/c/0"), ByteRequest("a/c/99"), ByteRequest("b/none", suffix=4), ByteRequest("a/c/1")]
    assert _as_bytes(fetcher.fetch(requests)) == [OBJECTS["a/c/0"], None, None, OBJECTS["a/c/1"]]


def test_a_path_through_a_file_is_missing_not_an_error(local: LocalFetcher) -> None:
    assert local.fetch([ByteRequest("a/c/0/inner"), ByteRequest("a/c/5")]) == [None, OBJECTS["a/c/5"]]


@pytest.mark.parametrize("count", [1, 12])  # inline on the calling thread, and on the pool
def test_a_directory_in_a_chunks_place_is_a_chunk_error_naming_the_array(
    local: LocalFetcher, tmp_path: Path, count: int
) -> None:
    (tmp_path / "a" / "c" / "7").unlink()
    (tmp_path / "a" / "c" / "7").mkdir()
    with pytest.raises(ChunkDecodeError, match=r"Array 'a': chunk a/c/7 is a directory") as caught:
        local.fetch([ByteRequest("a/c/0")] * (count - 1) + [ByteRequest("a/c/7")])
    assert (caught.value.array, caught.value.chunk) == ("a", "a/c/7")


def test_local_reads_return_bytes_and_store_reads_numpy_buffers(local: LocalFetcher, remote: StoreFetcher) -> None:
    assert type(local.fetch([ByteRequest("a/c/2")])[0]) is bytes
    payload = remote.fetch([ByteRequest("a/c/2")])[0]
    assert payload.dtype.name == "uint8" and payload.tobytes() == OBJECTS["a/c/2"]
    assert remote.fetch([]) == [] and local.fetch([]) == []


class _Counting(MemoryStore):
    """A memory store that records how many reads are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.active = 0
        self.peak = 0

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        self.active += 1
        self.peak = max(self.peak, self.active)
        await asyncio.sleep(0.005)
        self.active -= 1
        return await super().get(key, prototype, byte_range)


def test_store_reads_overlap_up_to_max_concurrency() -> None:
    store = _Counting()
    for key, data in OBJECTS.items():
        sync(store.set(key, default_buffer_prototype().buffer.from_bytes(data)))
    got = StoreFetcher(store, max_concurrency=3).fetch([ByteRequest(k) for k in OBJECTS])
    assert _as_bytes(got) == list(OBJECTS.values())
    assert store.peak == 3


def test_max_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_concurrency must be >= 1, got 0"):
        StoreFetcher(MemoryStore(), max_concurrency=0)


def _counting_preads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record every ``os.pread`` the local fetcher makes, as ``(length, offset)``."""
    calls: list[tuple[int, int]] = []
    real = fetch_module.os.pread

    def pread(fd: int, length: int, offset: int) -> bytes:
        calls.append((length, offset))
        return real(fd, length, offset)

    monkeypatch.setattr(fetch_module.os, "pread", pread)
    return calls


def test_neighbouring_ranges_of_one_file_are_read_once_and_match_separate_reads(
    local: LocalFetcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = OBJECTS["a/c/3"]
    spans = [(0, 7), (7, 15), (18, 25), (25, 25), (30, 40)]  # adjacent, a 3-byte gap, empty, a 5-byte gap
    requests = [ByteRequest("a/c/3", start=a, stop=b) for a, b in spans]
    separate = [local.read([r])[0] for r in requests]
    calls = _counting_preads(monkeypatch)
    merged = local.read(requests)
    assert calls == [(40, 0)]  # one read from the first start to the last stop
    assert all(isinstance(p, memoryview) for p in merged)
    assert _as_bytes(merged) == _as_bytes(separate) == [data[a:b] for a, b in spans]


def test_ranges_that_overlap_change_file_or_lie_far_apart_are_read_apart(
    local: LocalFetcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fetch_module, "MERGE_GAP", 4)
    requests = [
        ByteRequest("a/c/3", start=0, stop=10),
        ByteRequest("a/c/3", start=5, stop=12),  # overlaps the last one
        ByteRequest("a/c/4", start=12, stop=20),  # another file
        ByteRequest("a/c/4", start=25, stop=30),  # 5 bytes on: beyond the gap of 4
        ByteRequest("a/c/4", suffix=3),
    ]
    calls = _counting_preads(monkeypatch)
    got = _as_bytes(local.read(requests))
    assert len(calls) == 5
    assert got == [OBJECTS["a/c/3"][0:10], OBJECTS["a/c/3"][5:12], OBJECTS["a/c/4"][12:20], OBJECTS["a/c/4"][25:30],
                   OBJECTS["a/c/4"][-3:]]  # fmt: skip


def test_a_merged_read_past_the_end_of_the_file_reads_short_like_separate_reads(local: LocalFetcher) -> None:
    data = OBJECTS["a/c/5"]  # 40 bytes
    requests = [ByteRequest("a/c/5", start=30, stop=36), ByteRequest("a/c/5", start=36, stop=44),
                ByteRequest("a/c/5", start=44, stop=50)]  # fmt: skip
    merged = _as_bytes(local.read(requests))
    assert merged == _as_bytes([local.read([r])[0] for r in requests]) == [data[30:36], data[36:40], b""]


def test_a_merged_read_spans_at_most_merge_bytes(local: LocalFetcher, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch_module, "MERGE_BYTES", 16)
    requests = [ByteRequest("a/c/6", start=a, stop=a + 8) for a in range(0, 40, 8)]
    calls = _counting_preads(monkeypatch)
    got = _as_bytes(local.read(requests))
    assert calls == [(16, 0), (16, 16), (8, 32)]
    assert got == [OBJECTS["a/c/6"][a : a + 8] for a in range(0, 40, 8)]
