"""store/read/engine.py: rows read block by block, each block fetched once per call, and a pool that survives fork."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from dali_alchemi.csr import concat_aranges
from dali_alchemi.errors import ChunkDecodeError
from dali_alchemi.store.format.location import resolve_store
from dali_alchemi.store.read import io_batches as batches
from dali_alchemi.store.read import routes as routes_module
from dali_alchemi.store.read.codecs import ArrayCodec
from dali_alchemi.store.read.decoder import RESIDENT
from dali_alchemi.store.read.engine import BlockEngine
from dali_alchemi.store.read.gather import BlockJob, LevelPlan, balanced_groups
from dali_alchemi.store.read.snapshot import Snapshot, open_snapshot


def _snapshot(path: Path) -> Snapshot:
    return open_snapshot(resolve_store(path, read_only=True, must_exist=True))


def _engine(cache_bytes: int = 0, threads: int = 3) -> BlockEngine:
    return BlockEngine(cache_bytes=cache_bytes, num_threads=threads, max_concurrency=4)


def _stored(path: Path, snap: Snapshot, name: str) -> np.ndarray:
    """Array ``name`` whole, read with zarr."""
    return zarr.open_group(path, mode="r")[f"{snap.schema.group_of(name)}/{name}"][...]


def _expected(
    path: Path, snap: Snapshot, physical: np.ndarray, name: str, whole: np.ndarray | None = None
) -> np.ndarray:
    """The rows of ``physical`` samples of array ``name``, read with zarr (or taken from ``whole``, read so)."""
    handle = snap.handles[name]
    if whole is None:
        whole = _stored(path, snap, name)
    if handle.level == "system":
        return whole[physical]
    ptr = snap.atoms_ptr if handle.level == "atom" else snap.edges_ptr
    return whole[concat_aranges(ptr[physical], ptr[physical + 1] - ptr[physical])]


def _blocks_touched(snap: Snapshot, physical: np.ndarray, names: list[str]) -> int:
    total = 0
    for name in names:
        handle = snap.handles[name]
        assert handle.codec is not None
        if handle.level == "system":
            rows = physical
        else:
            ptr = snap.atoms_ptr if handle.level == "atom" else snap.edges_ptr
            rows = concat_aranges(ptr[physical], ptr[physical + 1] - ptr[physical])
        total += np.unique(rows // handle.codec.block_rows).size
    return total


@pytest.mark.parametrize("store", ["small_store", "sharded_store"])
def test_rows_come_back_in_request_order_as_stored(store: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(store)
    snap = _snapshot(path)
    physical = np.random.default_rng(2).permutation(snap.n_physical)[:120]
    names = list(snap.handles)
    engine = _engine()
    got = engine.read(snap, physical, names)
    assert got.n_atoms.tolist() == (snap.atoms_ptr[physical + 1] - snap.atoms_ptr[physical]).tolist()
    assert got.n_edges.tolist() == (snap.edges_ptr[physical + 1] - snap.edges_ptr[physical]).tolist()
    for name in names:
        want = _expected(path, snap, physical, name)
        assert got.fields[name].dtype == want.dtype, name
        assert np.array_equal(got.fields[name], want), name  # neighbor_list stays store-global here
    engine.close()


def test_each_block_is_fetched_once_per_call(small_store: Path) -> None:
    snap = _snapshot(small_store)
    names = ["positions", "neighbor_list", "energy"]
    engine = _engine(cache_bytes=0)
    scattered = np.array([250, 3, 251, 4, 120, 5], dtype=np.int64)  # neighbours share blocks
    engine.read(snap, scattered, names)
    once = _blocks_touched(snap, scattered, names)
    assert once < 3 * scattered.size
    assert engine.stats().chunks_fetched == once
    engine.read(snap, scattered, names)  # no cache: fetched again, still once per block
    stats = engine.stats()
    assert (stats.chunks_fetched, stats.packed_reads, stats.samples_read) == (2 * once, 2, 12)
    engine.close()


def test_cached_blocks_are_not_fetched_and_attach_drops_them(small_store: Path) -> None:
    snap = _snapshot(small_store)
    engine = _engine(cache_bytes=1 << 26)
    everything = np.arange(snap.n_physical)
    engine.read(snap, everything, ["positions"])
    blocks = snap.handles["positions"].codec.n_blocks  # type: ignore[union-attr]
    assert engine.stats().chunks_fetched == blocks
    assert engine.cache.peek(("positions", RESIDENT)) is not None  # every block touched: held whole
    assert engine.cache.stats.entries == 1
    again = engine.read(snap, everything[::-1].copy(), ["positions"])
    assert engine.stats().chunks_fetched == blocks
    assert np.array_equal(again.fields["positions"], _expected(small_store, snap, everything[::-1], "positions"))
    fresh = _snapshot(small_store)
    engine.attach(fresh)
    assert engine.cache.stats.entries == 0
    engine.read(fresh, everything[:1], ["positions"])
    assert engine.stats().chunks_fetched == blocks + 1
    engine.close()


def _read_in_child(engine: BlockEngine, snap: Snapshot, physical: np.ndarray, queue: Any) -> None:
    got = engine.read(snap, physical, ["positions", "forces"])
    pool = engine.decoder.pool.executor()
    queue.put((os.getpid(), engine.decoder.pool.pid, got.fields["positions"].sum(), got.fields["forces"].sum()))
    pool.shutdown(wait=True)


@pytest.mark.timeout(60)
def test_a_forked_child_rebuilds_the_pool_and_reads(small_store: Path) -> None:
    snap = _snapshot(small_store)
    engine = _engine(cache_bytes=0)
    physical = np.arange(snap.n_physical)
    parent = engine.read(snap, physical, ["positions", "forces"])  # starts the pool's threads here
    assert engine.decoder.pool.pid == os.getpid()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(engine, snap, physical, queue))
    child.start()
    try:
        child.join(30)
        assert child.exitcode == 0, "the child hung or failed reading on its parent's thread pool"
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    pid, executor_pid, positions, forces = queue.get(timeout=5)
    assert pid != os.getpid() and executor_pid == pid
    assert positions == parent.fields["positions"].sum() and forces == parent.fields["forces"].sum()
    assert engine.decoder.pool.pid == os.getpid()  # the parent's pool is untouched
    engine.close()


def _job(rows: int, cached: bool) -> BlockJob:
    plan = LevelPlan(rows=np.zeros(0, np.int64), dest=np.zeros(0, np.int64), total=0)
    data = np.zeros(1) if cached else None
    return BlockJob(handle=None, block=0, plan=plan, lo=0, hi=rows, data=data)  # type: ignore[arg-type]


def test_block_jobs_are_balanced_over_tasks() -> None:
    few = [_job(5, False), _job(9, True)]
    assert balanced_groups(few, 4) == [[few[0]], [few[1]]]
    rng = np.random.default_rng(0)
    jobs = [_job(int(r), bool(c)) for r, c in zip(rng.integers(1, 100, 40), rng.integers(0, 2, 40), strict=True)]
    groups = balanced_groups(jobs, 6)
    assert len(groups) == 6
    assert sorted(id(j) for g in groups for j in g) == sorted(id(j) for j in jobs)  # each job exactly once

    def load(group: list[BlockJob]) -> int:  # a block to decode costs twice one already decoded
        return sum((j.hi - j.lo) * (1 if j.data is not None else 2) for j in group)

    loads = [load(g) for g in groups]
    assert max(loads) - min(loads) <= max(load([j]) for j in jobs)


class _LiveDecoded:
    """Instruments ``ArrayCodec.decode_block``: bytes of decoded blocks still alive, and their peak."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.decoded = 0

    def wrap(self, decode: Any) -> Any:
        def decode_block(codec: Any, block: int, *args: Any) -> np.ndarray:
            data = decode(codec, block, *args)
            self.live += data.nbytes
            self.decoded += data.nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(data, self._release, data.nbytes)
            return data

        return decode_block

    def _release(self, nbytes: int) -> None:
        self.live -= nbytes


@pytest.mark.parametrize("store", ["small_store", "sharded_store"])
def test_a_read_touching_every_block_holds_only_the_cache_and_one_working_set(
    store: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = request.getfixturevalue(store)
    snap = _snapshot(path)
    names = ["positions", "forces", "atomic_numbers", "neighbor_list"]
    block = max(h.codec.row_nbytes * h.codec.block_rows for n, h in snap.handles.items() if n in names)  # type: ignore[union-attr]
    cache_bytes, working_set = 3 * block, 4 * block
    live = _LiveDecoded()
    monkeypatch.setattr(ArrayCodec, "decode_block", live.wrap(ArrayCodec.decode_block))
    engine = BlockEngine(cache_bytes=cache_bytes, num_threads=3, max_concurrency=4, working_set_bytes=working_set)
    shuffled = np.random.default_rng(5).permutation(snap.n_physical)  # a window touching every block
    got = engine.read(snap, shuffled, names)
    for name in names:
        assert np.array_equal(got.fields[name], _expected(path, snap, shuffled, name)), name
    assert live.decoded > 10 * (cache_bytes + working_set)  # the store is far larger than the bound
    assert live.peak <= cache_bytes + working_set + block
    assert engine.stats().blocks_decoded == _blocks_touched(snap, shuffled, names)  # each block decoded once
    engine.close()


def test_the_working_set_must_be_positive() -> None:
    with pytest.raises(ValueError, match="working_set_bytes must be >= 1"):
        BlockEngine(cache_bytes=0, num_threads=1, max_concurrency=1, working_set_bytes=0)


def test_local_reads_in_tiny_batches_mixed_with_cached_blocks_match_zarr(
    sharded_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batches, "READ_BATCH_BYTES", 1)  # every block read apart, just before its decode
    monkeypatch.setattr(routes_module, "WHOLE_ARRAY_SHARE", 0)  # the per-block path, never a whole array
    snap = _snapshot(sharded_store)
    names = ["positions", "atomic_numbers", "neighbor_list", "energy"]
    engine = _engine(cache_bytes=1 << 26, threads=2)
    some = np.arange(0, snap.n_physical, 40)
    engine.read(snap, some, names)
    fetched = engine.stats().chunks_fetched
    physical = np.random.default_rng(5).permutation(snap.n_physical)[:200]  # cached blocks and new ones
    got = engine.read(snap, physical, names)
    for name in names:
        assert np.array_equal(got.fields[name], _expected(sharded_store, snap, physical, name)), name
    new = sum(len(_blocks_of(snap, physical, n) - _blocks_of(snap, some, n)) for n in names)
    assert 0 < new < _blocks_touched(snap, physical, names)  # some blocks came from the cache
    assert engine.stats().chunks_fetched - fetched == new
    engine.close()


def _rows(snap: Snapshot, physical: np.ndarray, name: str) -> np.ndarray:
    handle = snap.handles[name]
    if handle.level == "system":
        return physical
    ptr = snap.atoms_ptr if handle.level == "atom" else snap.edges_ptr
    return concat_aranges(ptr[physical], ptr[physical + 1] - ptr[physical])


def _blocks_of(snap: Snapshot, physical: np.ndarray, name: str) -> set[int]:
    codec = snap.handles[name].codec
    assert codec is not None
    return set((_rows(snap, physical, name) // codec.block_rows).tolist())


def test_an_inner_chunk_cut_short_in_a_local_shard_is_named(sharded_store: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.zarr"
    shutil.copytree(sharded_store, path)
    snap = _snapshot(path)
    codec = snap.handles["positions"].codec
    assert codec is not None and codec.sharded and codec.index_at_end
    key = codec.chunks_of_block(1)[0][1].key
    shard = (path / key).read_bytes()
    index = codec.parse_shard_index(key, shard[-codec.index_nbytes :])
    offset = int(index[1, 0])
    (path / key).write_bytes(shard[: offset + 5] + shard[-codec.index_nbytes :])  # chunk 1 cut, index intact
    engine = _engine(cache_bytes=0, threads=2)
    everything = np.arange(_snapshot(path).n_physical)
    with pytest.raises(ChunkDecodeError, match=rf"Array 'core/positions': chunk '{key}' could not be decoded"):
        engine.read(_snapshot(path), everything, ["positions"])
    got = engine.read(_snapshot(path), everything[:1], ["positions"])  # rows of block 0 still read
    assert np.array_equal(got.fields["positions"], _expected(sharded_store, snap, everything[:1], "positions"))
    engine.close()


def test_a_read_touching_most_blocks_of_a_small_array_keeps_it_whole(sharded_store: Path) -> None:
    snap = _snapshot(sharded_store)
    engine = _engine(cache_bytes=1 << 26)
    blocks = snap.handles["positions"].codec.n_blocks  # type: ignore[union-attr]
    physical = np.random.default_rng(1).permutation(snap.n_physical)[: snap.n_physical // 2]
    touched = len(_blocks_of(snap, physical, "positions"))
    assert touched < blocks <= touched * routes_module.WHOLE_ARRAY_SHARE  # most blocks, not all
    got = engine.read(snap, physical, ["positions"])
    assert np.array_equal(got.fields["positions"], _expected(sharded_store, snap, physical, "positions"))
    assert engine.stats().chunks_fetched == blocks  # every block, the untouched ones too, decoded once
    assert engine.cache.peek(("positions", RESIDENT)) is not None and engine.cache.stats.entries == 1
    rest = np.setdiff1d(np.arange(snap.n_physical), physical)
    again = engine.read(snap, rest, ["positions"])
    assert np.array_equal(again.fields["positions"], _expected(sharded_store, snap, rest, "positions"))
    assert engine.stats().chunks_fetched == blocks  # nothing more read
    engine.close()


def test_sequential_reads_keep_a_small_array_whole_once_a_quarter_of_it_was_read(sharded_store: Path) -> None:
    snap = _snapshot(sharded_store)
    engine = _engine(cache_bytes=1 << 26)
    blocks = snap.handles["positions"].codec.n_blocks  # type: ignore[union-attr]
    windows = np.array_split(np.arange(snap.n_physical), 2 * blocks)  # about half a block per window
    truth = _stored(sharded_store, snap, "positions")  # read with zarr once
    reads = 0
    while engine.cache.peek(("positions", RESIDENT)) is None:
        got = engine.read(snap, windows[reads], ["positions"])
        assert np.array_equal(got.fields["positions"], _expected(sharded_store, snap, windows[reads], "positions", truth))
        reads += 1
        assert reads < len(windows) // 2, "still read block by block after half the array"
    assert reads > 1  # the first windows are read block by block
    fetched = engine.stats().chunks_fetched
    assert fetched <= blocks + reads  # the array decoded once, plus the blocks read before
    for window in windows[reads:]:
        got = engine.read(snap, window, ["positions"])
        assert np.array_equal(got.fields["positions"], _expected(sharded_store, snap, window, "positions", truth))
    assert engine.stats().chunks_fetched == fetched and engine.cache.stats.entries == 1
    engine.close()


def test_a_small_array_kept_whole_then_evicted_is_read_by_blocks_not_whole_again(sharded_store: Path) -> None:
    snap = _snapshot(sharded_store)
    engine = _engine(cache_bytes=1 << 26)
    blocks = snap.handles["positions"].codec.n_blocks  # type: ignore[union-attr]
    windows = np.array_split(np.arange(snap.n_physical), 2 * blocks)
    truth = _stored(sharded_store, snap, "positions")
    reads = 0
    while engine.cache.peek(("positions", RESIDENT)) is None:  # read until it is kept whole
        engine.read(snap, windows[reads], ["positions"])
        reads += 1
    engine.cache.clear()  # evicted, as the blocks of bigger arrays streaming through a small cache evict it
    decoded = engine.stats().blocks_decoded
    for window in windows[reads:]:
        got = engine.read(snap, window, ["positions"])
        assert np.array_equal(got.fields["positions"], _expected(sharded_store, snap, window, "positions", truth))
    assert engine.cache.peek(("positions", RESIDENT)) is None  # not read whole again
    assert engine.stats().blocks_decoded - decoded <= blocks  # the rest of the pass: each block at most once
    engine.attach(snap)  # a new state: it may be kept whole again
    for window in windows:
        engine.read(snap, window, ["positions"])
    assert engine.cache.peek(("positions", RESIDENT)) is not None
    engine.close()
