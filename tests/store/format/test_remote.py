"""Stores read over the network: a real HTTP server on loopback with latency and failures, and S3."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zarr.abc.store import RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import MemoryStore

from dali_alchemi import AtomicDataZarrReader
from dali_alchemi.bench.http_server import StoreServer
from dali_alchemi.bench.synth import write_synthetic_store
from dali_alchemi.config import ArrayConfig, FetchConfig, WriteConfig
from dali_alchemi.errors import ConfigError, RemoteRangeError, RemoteReadError
from dali_alchemi.store.format.remote import RetryingStore

N = 600
LATENCY = 0.02


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with many small chunks, in a folder to serve."""
    root = tmp_path_factory.mktemp("served")
    config = WriteConfig(core=ArrayConfig(chunk_size=2048), meta=ArrayConfig(chunk_size=4096))
    write_synthetic_store(root / "s.zarr", N, seed=8, min_atoms=10, max_atoms=60, config=config)
    return root


def _chunk_gets(server: StoreServer) -> dict[str, int]:
    """GETs of data chunks (core and custom arrays) per path; each worker also re-reads the meta arrays."""
    return {
        path: n for (method, path), n in server.requests.items()
        if method == "GET" and "/c/" in path and ("/core/" in path or "/custom/" in path)
    }  # fmt: skip


@pytest.mark.dali
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("workers", "shared"), [(0, False), (2, False), (2, True)])
def test_a_shuffled_epoch_fetches_each_chunk_once_and_overlaps_requests(
    served: Path, workers: int, shared: bool
) -> None:
    from dali_alchemi import DALIDataLoader

    local = AtomicDataZarrReader(served / "s.zarr")
    chunks = sum(h.codec.n_blocks for h in local._snapshot.handles.values())  # one chunk per block here
    with StoreServer(served, latency_s=LATENCY) as server:
        loader = DALIDataLoader(server.url + "s.zarr", batch_size=32, batches_per_window=4, num_workers=workers,
                                start_method="fork", device="cpu", shared_cache=shared)  # fmt: skip
        server.reset_counts()
        delivered = [b.sample_indices for b in loader]
        loader.close()
        gets = _chunk_gets(server)
        overlapped = server.peak_concurrency
    assert np.array_equal(np.sort(np.concatenate(delivered)), np.arange(N))
    windows = loader.plan.epoch(0).num_windows(4)
    # each reading process's cache fetches a chunk once per epoch; workers sharing decoded chunks (a
    # shared-memory folder) fetch it once per machine
    assert max(gets.values()) == (1 if shared or not workers else max(gets.values())) <= max(1, workers) <= windows
    assert len(gets) <= chunks and sum(gets.values()) <= chunks * (1 if shared else max(1, workers))
    requests = sum(server.requests.values())
    # overlapped: the server had several requests waiting at once (a serial client never has two)
    assert overlapped > 1, f"{requests} requests, never more than one at a time: fetches did not overlap"
    print(f"workers={workers}: {requests} requests ({sum(gets.values())} chunk GETs for {chunks} chunks, "
          f"{windows} windows), up to {overlapped} at once")  # fmt: skip


@pytest.fixture(scope="module")
def aligned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """640 structures of exactly 32 atoms in chunks of 2048 rows: every chunk holds 64 whole structures."""
    root = tmp_path_factory.mktemp("aligned")
    config = WriteConfig(core=ArrayConfig(chunk_size=2048), meta=ArrayConfig(chunk_size=4096))
    write_synthetic_store(root / "a.zarr", 640, seed=9, min_atoms=32, max_atoms=32, config=config)
    return root


ALIGNED_FIELDS = ("positions", "forces", "atomic_numbers", "energy")


@pytest.mark.dali
@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_block_order_fetches_every_chunk_once_per_epoch_with_a_small_cache(aligned: Path, workers: int) -> None:
    from dali_alchemi import DALIDataLoader

    local = AtomicDataZarrReader(aligned / "a.zarr", fields=ALIGNED_FIELDS)
    handles = [local._snapshot.handles[name] for name in ALIGNED_FIELDS]
    chunks = {
        f"/a.zarr/{loc.key}" for h in handles for b in range(h.codec.n_blocks) for _, loc in h.codec.chunks_of_block(b)
    }
    decoded = sum(h.codec.row_nbytes * h.shape[0] for h in handles)
    cache = decoded // 2  # the store is twice the cache: in global order chunks are fetched again and again
    with StoreServer(aligned, latency_s=0.002) as server:
        loader = DALIDataLoader(server.url + "a.zarr", batch_size=16, batches_per_window=2, num_workers=workers,
                                start_method="fork", device="cpu", shuffle="block", cache_bytes=cache,
                                fields=ALIGNED_FIELDS, shared_cache=True)  # fmt: skip
        per_epoch = []
        for _ in range(2):
            server.reset_counts()
            delivered = np.concatenate([b.sample_indices for b in loader])
            assert np.array_equal(np.sort(delivered), np.arange(640))
            per_epoch.append(_chunk_gets(server))
        loader.close()
    assert set(per_epoch[0]) == chunks  # every chunk of the arrays read is fetched in the first epoch ...
    assert set(per_epoch[1]) <= chunks  # (the second finds the last buffer's chunks still cached)
    for gets in per_epoch:
        assert max(gets.values()) == 1  # ... and none twice in an epoch (once per machine, with workers)
    with AtomicDataZarrReader(aligned / "a.zarr", fields=ALIGNED_FIELDS, cache_bytes=cache) as reader:
        order = np.random.default_rng(0).permutation(640)
        for start in range(0, 640, 32):
            reader.read_packed(order[start : start + 32])
        assert reader.stats().chunks_fetched > 2 * len(chunks)  # the global order, for comparison


@pytest.mark.dali
@pytest.mark.timeout(120)
def test_transient_failures_are_retried_without_losing_or_duplicating(served: Path) -> None:
    from dali_alchemi import DALIDataLoader

    local = AtomicDataZarrReader(served / "s.zarr")
    with StoreServer(served, latency_s=0.002, failure_rate=0.2, seed=3) as server:
        reader = AtomicDataZarrReader(server.url + "s.zarr", fetch=FetchConfig(retries=8, backoff_s=0.001))
        with DALIDataLoader(reader, batch_size=50, batches_per_window=3, num_workers=0, device="cpu") as loader:
            batches = list(loader)
        failures = server.failures
    assert failures > 10  # the server did fail, and often
    indices = np.concatenate([b.sample_indices for b in batches])
    assert np.array_equal(np.sort(indices), np.arange(N))
    for batch in batches[:4]:
        expected = local.read_packed(batch.sample_indices)
        for name in ("positions", "neighbor_list", "energy"):
            got = batch[name].numpy()
            if name == "neighbor_list":
                got = batch.to_packed().fields[name]
            assert np.array_equal(got, expected.fields[name]), name


def test_retries_run_out_with_a_clear_error(served: Path) -> None:
    with StoreServer(served, failure_rate=0.95, seed=1) as server:
        with pytest.raises(RemoteReadError, match=r"failed after 2 attempts: .*503"):
            AtomicDataZarrReader(server.url + "s.zarr", fetch=FetchConfig(retries=1, backoff_s=0.0))


class _Flaky(MemoryStore):
    """A memory store whose reads fail ``fails`` times per key before they work."""

    def __init__(self, fails: int) -> None:
        super().__init__()
        self.fails, self.calls = fails, 0
        self._seen: dict[str, int] = {}

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        self.calls += 1
        self._seen[key] = self._seen.get(key, 0) + 1
        if self._seen[key] <= self.fails:
            raise ConnectionResetError(f"flaky read of {key}")
        return await super().get(key, prototype, byte_range)


def test_retrying_store_backs_off_and_never_retries_a_missing_key() -> None:
    flaky = _Flaky(fails=2)
    sync(flaky.set("k", default_buffer_prototype().buffer.from_bytes(b"value")))
    store = RetryingStore(flaky, FetchConfig(retries=3, backoff_s=0.01))
    started = time.perf_counter()
    buf = sync(store.get("k", default_buffer_prototype()))
    assert buf is not None and buf.to_bytes() == b"value"
    assert flaky.calls == 3 and time.perf_counter() - started >= 0.01 + 0.02  # waited 10 ms, then 20 ms
    assert sync(store.get("missing", default_buffer_prototype())) is None  # an answer, not a failure
    with pytest.raises(RemoteReadError, match=r"'k2'.*failed after 2 attempts: ConnectionResetError"):
        sync(flaky.set("k2", default_buffer_prototype().buffer.from_bytes(b"v")))
        sync(RetryingStore(flaky, FetchConfig(retries=1, backoff_s=0.0)).get("k2", default_buffer_prototype()))
    assert FetchConfig(backoff_s=0.1, max_backoff_s=0.3).delay(5) == 0.3


class _RangeBlind(MemoryStore):
    """A memory store that ignores byte ranges and answers with the whole value, counting its reads."""

    calls = 0

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        self.calls += 1
        return await super().get(key, prototype, None)


def test_more_bytes_than_a_range_asked_for_is_a_remote_range_error_and_not_retried() -> None:
    blind = _RangeBlind()
    sync(blind.set("core/forces/c/0", default_buffer_prototype().buffer.from_bytes(b"0123456789")))
    store = RetryingStore(blind, FetchConfig(retries=3, backoff_s=0.0))
    proto = default_buffer_prototype()
    with pytest.raises(
        RemoteRangeError, match=r"'core/forces/c/0' on .*: asked for bytes 2-4, got 10 bytes: the store ignored"
    ):
        sync(store.get("core/forces/c/0", proto, RangeByteRequest(2, 5)))
    assert blind.calls == 1  # a wrong answer is not retried
    with pytest.raises(
        RemoteRangeError, match=r"asked for the last 4 bytes, got 10 bytes.*supports HTTP Range requests"
    ):
        sync(store.get_partial_values(proto, [("core/forces/c/0", SuffixByteRequest(4))]))
    whole = sync(store.get("core/forces/c/0", proto, SuffixByteRequest(40)))  # the whole value is what was asked
    assert whole is not None and whole.to_bytes() == b"0123456789"


def test_a_store_passed_in_over_a_server_that_ignores_range_fails_clearly(tmp_path: Path) -> None:
    from zarr.storage import FsspecStore

    write_synthetic_store(tmp_path / "d.zarr", 100, seed=5)  # the default layout: shards, read by byte ranges
    with StoreServer(tmp_path, ranges=False) as server:
        store = FsspecStore.from_url(server.url + "d.zarr", read_only=True)  # plain fsspec: range answers unchecked
        with pytest.raises(
            RemoteRangeError, match=r"the store ignored the byte range.*open it by its http\(s\):// URL"
        ):
            with AtomicDataZarrReader(store, fetch=FetchConfig(retries=3, backoff_s=0.0)) as reader:
                reader.read_packed(np.arange(100))


@pytest.mark.timeout(120)
def test_s3_through_a_loopback_s3_server(served: Path) -> None:
    moto_server = pytest.importorskip("moto.server", reason="moto[server] provides the S3-compatible test server")
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
        client = boto3.client("s3", endpoint_url=endpoint, **creds)
        client.create_bucket(Bucket="stores")
        for path in (served / "s.zarr").rglob("*"):
            if path.is_file():
                client.upload_file(str(path), "stores", f"s.zarr/{path.relative_to(served / 's.zarr')}")
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
        with AtomicDataZarrReader("s3://stores/s.zarr", storage_options=options) as remote:
            local = AtomicDataZarrReader(served / "s.zarr")
            order = np.random.default_rng(0).permutation(N)[:200]
            got, want = remote.read_packed(order), local.read_packed(order)
            assert len(remote) == N
            for name in want.fields:
                assert np.array_equal(got.fields[name], want.fields[name]), name
    finally:
        server.stop()


# -- a server that accepts and never answers -------------------------------------------------------------
STALLED = FetchConfig(timeout_s=0.2, retries=1, backoff_s=0.05)
"""A small timeout: each stalled read gives up after 0.2 s x 2 attempts + 0.05 s."""


@pytest.mark.timeout(120)  # only a hang detector: the bound is FetchConfig.worst_case_s(), well under a second
def test_a_stalled_server_is_a_remote_read_error_within_timeout_times_attempts(served: Path) -> None:
    with StoreServer(served, stall="") as server:
        with pytest.raises(RemoteReadError, match=r"failed after 2 attempts: TimeoutError: no answer within 0.2 s"):
            AtomicDataZarrReader(server.url + "s.zarr", fetch=STALLED)
        assert sum(n for (method, _), n in server.requests.items() if method == "GET") >= 2  # it was retried


@pytest.mark.timeout(120)
def test_stalled_chunks_fail_a_read_and_the_loader_within_the_bound(served: Path) -> None:
    from dali_alchemi import DALIDataLoader
    from dali_alchemi.errors import LoaderError

    with StoreServer(served, stall=r"/core/.*/c/") as server:  # metadata and pointers answer, data never
        reader = AtomicDataZarrReader(server.url + "s.zarr", fetch=STALLED)
        with pytest.raises(RemoteReadError, match=r"no answer within 0\.2 s"):
            reader.read_packed(np.arange(4))
        loader = DALIDataLoader(reader, batch_size=8, num_workers=0, device="cpu", shuffle=False)
        try:
            with pytest.raises(LoaderError, match=r"^RemoteReadError: .*no answer within 0.2 s"):
                next(iter(loader))
        finally:
            loader.close()


def test_the_timeout_is_checked_and_bounds_the_worst_case() -> None:
    assert FetchConfig().timeout_s == 10.0
    assert STALLED.worst_case_s() == pytest.approx(0.2 * 2 + 0.05)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="timeout_s"):
            FetchConfig(timeout_s=bad)
