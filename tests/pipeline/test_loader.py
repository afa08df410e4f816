"""DALIDataLoader against the obvious reference: the reader plus Batch.from_samples, batch by batch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI cannot be imported")

from dali_alchemi import (
    AtomicDataZarrReader,
    ConfigError,
    ConfigTypeError,
    DALIDataLoader,
    LoaderClosedError,
    LoaderError,
    PlanError,
)
from dali_alchemi.interop.read_many import ReadManyAdapter
from dali_alchemi.pipeline.dali_private import worker_processes
from tests.loader_contract import LoaderContract, assert_batches_equal, reference_batches
from tests.processes import alive, children, shm_mappings, shm_names, wait_until

pytestmark = pytest.mark.dali

N = 300  # structures in small_store


class CountingReader(AtomicDataZarrReader):
    """Logs every packed read to a file, one line of indices per call (works across forked workers)."""

    log: Path

    def read_packed(self, indices: Any, *, fields: Any = None) -> Any:
        with open(self.log, "a") as fh:
            fh.write(" ".join(map(str, np.asarray(indices).tolist())) + "\n")
        return super().read_packed(indices, fields=fields)

    def calls(self) -> list[np.ndarray]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [np.array(line.split(), dtype=np.int64) for line in lines]


class FailingReader(AtomicDataZarrReader):
    """Raises on the third packed read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.n_calls = 0

    def read_packed(self, indices: Any, *, fields: Any = None) -> Any:
        self.n_calls += 1
        if self.n_calls == 3:
            raise ValueError("disk on fire at window 3")
        return super().read_packed(indices, fields=fields)


class TestThreadRead(LoaderContract):
    """The contract with the window read on a background thread of this process."""

    def make_loader(self, source: Any, **options: Any) -> DALIDataLoader:
        return DALIDataLoader(source, batches_per_window=4, num_workers=0, device="cpu", **options)


class TestWorkers(LoaderContract):
    """The contract with DALI worker processes, the blob layout, and short windows."""

    def make_loader(self, source: Any, **options: Any) -> DALIDataLoader:
        return DALIDataLoader(
            source, batches_per_window=3, num_workers=2, start_method="fork", device="cpu", layout="blob", **options
        )


@pytest.mark.parametrize("layout", ["window", "blob"])
@pytest.mark.parametrize("workers", [0, 2])
def test_every_layout_equals_the_reference_and_advances_the_epoch(
    reader: AtomicDataZarrReader, workers: int, layout: str
) -> None:
    options = dict(batch_size=16, batches_per_window=4, seed=11, num_workers=workers, device="cpu", layout=layout)
    with DALIDataLoader(reader, **options) as loader:
        assert len(loader) == 19
        for epoch in range(2):
            got = list(loader)
            assert_batches_equal(got, reference_batches(reader, loader.plan, epoch))
            assert loader.epoch == epoch + 1


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_held_across_many_windows_keep_their_values(reader: AtomicDataZarrReader, workers: int) -> None:
    """Batches are views of DALI's outputs; DALI must not reuse that memory while they are alive."""
    with DALIDataLoader(
        reader, batch_size=10, batches_per_window=2, seed=8, num_workers=workers, start_method="fork", device="cpu"
    ) as loader:
        held = [batch for _ in range(2) for batch in loader]  # 2 epochs of 15 windows, all kept
        reference = reference_batches(reader, loader.plan, 0) + reference_batches(reader, loader.plan, 1)
    assert_batches_equal(held, reference)


def test_same_seed_same_order_new_epoch_new_order(reader: AtomicDataZarrReader) -> None:
    def order(seed: int, epoch: int) -> list[int]:
        with DALIDataLoader(reader, batch_size=32, seed=seed, device="cpu") as loader:
            loader.set_epoch(epoch)
            return np.concatenate([b.sample_indices for b in loader]).tolist()

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0)
    with DALIDataLoader(reader, batch_size=32, shuffle=False, device="cpu") as loader:
        assert np.concatenate([b.sample_indices for b in loader]).tolist() == list(range(N))


def test_drop_last(reader: AtomicDataZarrReader) -> None:
    with DALIDataLoader(reader, batch_size=64, drop_last=True, device="cpu") as loader:
        sizes = [b.num_graphs for b in loader]
    assert sizes == [64] * 4 and len(loader) == 4


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_every_sample_exactly_once_per_epoch_across_shards_and_resumes(
    reader: AtomicDataZarrReader, shards: int, workers: int
) -> None:
    """3 epochs; each shard stops at a random batch of a random epoch and resumes in a new loader."""
    rng = np.random.default_rng(shards * 10 + workers)
    per_shard = int(np.ceil(N / shards))
    padding = per_shard * shards - N  # DistributedSampler-style: the order wraps around to fill shards
    seen: dict[int, list[np.ndarray]] = {epoch: [] for epoch in range(3)}
    lengths = set()
    for shard_id in range(shards):
        options = dict(batch_size=25, batches_per_window=3, shard_id=shard_id, num_shards=shards, seed=4,
                       num_workers=workers, start_method="fork", device="cpu")  # fmt: skip
        loader = DALIDataLoader(reader, **options)
        lengths.add(len(loader))
        stop_epoch, stop_batch = int(rng.integers(0, 3)), int(rng.integers(1, len(loader)))
        for epoch in range(3):
            delivered = []
            for k, batch in enumerate(loader, start=1):
                delivered.append(batch.sample_indices)
                if epoch == stop_epoch and k == stop_batch:
                    state = loader.state_dict()
                    loader.close()
                    loader = DALIDataLoader(reader, **options)  # a new process would do the same
                    loader.load_state_dict(state)
                    delivered += [b.sample_indices for b in loader]
                    break
            seen[epoch].append(np.concatenate(delivered))
        loader.close()
    assert len(lengths) == 1  # equal batch counts on every shard
    for epoch, parts in seen.items():
        assert all(part.size == per_shard for part in parts), epoch
        everything = np.concatenate(parts)
        counts = np.bincount(everything, minlength=N)
        assert (counts >= 1).all(), f"epoch {epoch}: samples never delivered"
        assert int((counts - 1).sum()) == padding, f"epoch {epoch}: duplicates beyond the documented padding"
        for a in range(shards):
            for b in range(a + 1, shards):
                overlap = np.intersect1d(parts[a], parts[b])
                assert overlap.size <= padding, (epoch, a, b)
    assert not np.array_equal(seen[0][0], seen[1][0])  # a new epoch, a new order


@pytest.mark.parametrize("stop_after", [1, 5, 9])
def test_resume_yields_exactly_the_remaining_batches(reader: AtomicDataZarrReader, stop_after: int) -> None:
    with DALIDataLoader(reader, batch_size=20, batches_per_window=4, seed=5, device="cpu") as loader:
        loader.set_epoch(3)
        full = list(loader)
        loader.set_epoch(3)
        for k, _ in enumerate(loader, start=1):
            if k == stop_after:
                break
        state = loader.state_dict()
    assert state["epoch"] == 3 and state["batch"] == stop_after
    with DALIDataLoader(reader, batch_size=20, batches_per_window=3, seed=5, device="cpu") as resumed:
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert resumed.epoch == 4
        after = next(iter(resumed))
    assert_batches_equal(rest, full[stop_after:])
    assert after.sample_indices.tolist() != full[0].sample_indices.tolist()
    with DALIDataLoader(reader, batch_size=21, device="cpu") as other, pytest.raises(PlanError, match="batch_size=20"):
        other.load_state_dict(state)


def test_a_mistyped_keyword_names_the_one_meant(reader: AtomicDataZarrReader) -> None:
    with pytest.raises(
        ConfigTypeError,
        match=r"^DALIDataLoader got an unexpected keyword argument 'batchsize'; did you mean 'batch_size'\?$",
    ):
        DALIDataLoader(reader, batchsize=64)
    with pytest.raises(
        TypeError, match=r"'prefetch_factor'; did you mean 'batches_per_window' \(batches read together"
    ):
        DALIDataLoader(reader, prefetch_factor=4)


def test_breaking_out_and_iterating_again_continues_the_epoch(reader: AtomicDataZarrReader) -> None:
    with DALIDataLoader(reader, batch_size=50, batches_per_window=2, device="cpu") as loader:
        first = []
        for batch in loader:
            first.append(batch.sample_indices)
            if len(first) == 3:
                break
        rest = [b.sample_indices for b in loader]
        assert len(first) + len(rest) == 6
        assert np.array_equal(np.sort(np.concatenate(first + rest)), np.arange(N))


@pytest.mark.parametrize("workers", [0, 2])
def test_one_packed_read_per_window_and_no_index_twice(small_store: Path, tmp_path: Path, workers: int) -> None:
    counting = CountingReader(small_store)
    counting.log = tmp_path / "reads.txt"
    loader = DALIDataLoader(
        counting, batch_size=16, batches_per_window=4, num_workers=workers, start_method="fork", device="cpu"
    )
    delivered = [np.concatenate([b.sample_indices for b in loader]) for _ in range(2)]
    loader.close()  # workers may have started on epoch 2 already; stop them before reading the log
    windows = {}
    for epoch in range(3):
        epoch_plan = loader.plan.epoch(epoch)
        for w in range(epoch_plan.num_windows(4, ramp=True)):  # the loader ramps every epoch's windows up
            windows[tuple(epoch_plan.window(w, 4, ramp=True).indices.tolist())] = epoch
    reads = [tuple(call.tolist()) for call in counting.calls()]
    assert all(read in windows for read in reads)  # every read is exactly one planned window
    assert len(set(reads)) == len(reads)  # and no window (so no index) is read twice
    for epoch in (0, 1):
        # 19 batches in windows of 1, 2, 4, 4, 4 and 4 batches
        assert sum(windows[read] == epoch for read in reads) == loader.plan.epoch(epoch).num_windows(4, ramp=True) == 6
        assert np.array_equal(np.sort(delivered[epoch]), np.arange(N))


@pytest.mark.parametrize("workers", [0, 1])
def test_fields_limit_what_is_read_and_returned(small_store: Path, workers: int) -> None:
    with DALIDataLoader(
        small_store, batch_size=40, fields=["positions", "energy", "neighbor_list"], num_workers=workers, device="cpu"
    ) as loader:
        for _ in range(2):
            for batch in loader:
                assert set(batch.fields) == {"positions", "energy", "neighbor_list"}
        assert loader.reader.field_names == ("positions", "energy", "neighbor_list")
    with pytest.raises(KeyError, match="nope"):
        DALIDataLoader(small_store, fields=["nope"], device="cpu")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 1])
def test_reader_error_surfaces_with_its_type_and_message(small_store: Path, workers: int) -> None:
    failing = FailingReader(small_store)
    with DALIDataLoader(
        failing, batch_size=10, batches_per_window=2, num_workers=workers, start_method="fork", device="cpu"
    ) as loader:
        with pytest.raises(LoaderError, match="ValueError: disk on fire at window 3") as info:
            for _ in loader:
                pass
        assert info.value.original_type == "ValueError"


def test_close_releases_workers_and_shared_memory(small_store: Path) -> None:
    mapped_before = shm_names(shm_mappings([os.getpid()]))  # what earlier tests of this process left mapped
    earlier = set(children())  # helpers earlier tests started for good (multiprocessing's resource tracker)
    loader = DALIDataLoader(small_store, batch_size=30, num_workers=2, start_method="fork", device="cpu")
    next(iter(loader))
    workers = [pid for pid in children() if pid not in earlier]
    assert len(workers) >= 2
    ours = shm_names(shm_mappings([os.getpid(), *workers])) - mapped_before  # what this loader created
    assert ours, "the loader's workers map no shared memory (DALI's layout changed?)"
    loader.close()
    loader.close()
    assert wait_until(lambda: not any(alive(pid) for pid in workers)), f"workers {workers} outlived close()"
    assert not ours & set(os.listdir("/dev/shm")), f"close() left {sorted(ours & set(os.listdir('/dev/shm')))}"
    assert not shm_names(shm_mappings([os.getpid()])) & ours  # and this process maps none of them any more
    with pytest.raises(LoaderClosedError, match="closed"):
        iter(loader)


@pytest.mark.gpu
@pytest.mark.parametrize(("layout", "workers"), [("window", 2), ("blob", 2), ("window", 0)])
def test_cuda_batches_equal_the_cpu_path(reader: AtomicDataZarrReader, layout: str, workers: int) -> None:
    with (
        DALIDataLoader(reader, batch_size=16, seed=2, device="cpu", layout=layout, num_workers=workers) as cpu,
        DALIDataLoader(reader, batch_size=16, seed=2, device="cuda", layout=layout, num_workers=workers) as gpu,
    ):
        for a, b in zip(cpu, gpu, strict=True):
            assert b.positions.is_cuda and b.batch_idx.is_cuda and b.neighbor_list.is_cuda
            for name in a.fields:
                assert torch.equal(a[name], b[name].cpu()), name
            assert torch.equal(a.batch_idx, b.batch_idx.cpu()) and torch.equal(a.batch_ptr, b.batch_ptr.cpu())
            assert a.sample_indices.tolist() == b.sample_indices.tolist()


@pytest.mark.timeout(60)
def test_a_killed_worker_is_an_error_within_seconds_not_a_hang(small_store: Path) -> None:
    loader = DALIDataLoader(
        small_store, batch_size=10, batches_per_window=2, num_workers=2, start_method="fork", device="cpu"
    )
    batches = iter(loader)
    next(batches)
    workers = [proc.pid for proc in worker_processes(loader._pipe)]
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    with pytest.raises(
        LoaderError, match=rf"DALI worker process {workers[0]} exited unexpectedly \(killed by signal 9\)"
    ):
        for _ in batches:
            pass
    assert wait_until(lambda: not any(alive(pid) for pid in workers))  # the other worker was stopped too
    # the loader recovers: a new iteration builds a new pipeline and resumes where it stood
    position = loader.state_dict()["batch"]
    rest = list(loader)
    assert len(rest) == len(loader) - position
    loader.close()


INTERRUPTED_LOOP = """
import os, signal, sys
from dali_alchemi import DALIDataLoader
from dali_alchemi.pipeline.dali_private import worker_processes

if __name__ == "__main__":
    # Ctrl-C as in a terminal, even when the suite was started with SIGINT ignored (a background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    loader = DALIDataLoader(sys.argv[1], batch_size=10, batches_per_window=2, num_workers=2, start_method=sys.argv[3], device="cpu")
    for k, batch in enumerate(loader):
        if k == 0:
            with open(sys.argv[2], "w") as fh:
                fh.write(" ".join(str(p.pid) for p in worker_processes(loader._pipe)))
        if k == 3:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the training loop
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_keyboard_interrupt_leaves_no_orphan_processes(small_store: Path, tmp_path: Path, start_method: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(INTERRUPTED_LOOP)
    pids_file = tmp_path / "pids.txt"
    result = subprocess.run(
        [sys.executable, str(script), str(small_store), str(pids_file), start_method],
        capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert result.returncode != 0 and "KeyboardInterrupt" in result.stderr
    workers = [int(p) for p in pids_file.read_text().split()]
    assert len(workers) == 2
    assert wait_until(lambda: not any(alive(pid) for pid in workers)), "DALI workers outlived the interrupted process"


class SizesOnlyReader(AtomicDataZarrReader):
    """Counts packed reads, so a test can tell that planning read no data."""

    reads = 0

    def read_packed(self, indices: Any, *, fields: Any = None) -> Any:
        type(self).reads += 1
        return super().read_packed(indices, fields=fields)


@pytest.mark.parametrize("keyed", [False, True])
def test_a_budget_plan_reads_no_data_and_resumes_exactly(
    small_store: Path, keyed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dali_alchemi.plan import order

    if keyed:  # the order large datasets get, forced on a small store
        monkeypatch.setattr(order, "KEYED_MIN_SAMPLES", 1)
    monkeypatch.setattr(SizesOnlyReader, "reads", 0)  # counted per run of the test
    counting = SizesOnlyReader(small_store)
    options = dict(max_atoms=500, batch_size=20, seed=6, num_workers=0, device="cpu")
    with DALIDataLoader(counting, **options) as loader:
        batches = len(loader), loader.plan.epoch(0).num_batches, loader.plan.epoch(1).num_batches
        assert SizesOnlyReader.reads == 0, "planning an epoch read data"
        assert all(n > 0 for n in batches)
        loader.set_epoch(1)
        full = list(loader)
        assert max(b.num_graphs for b in full) <= 20 and max(b.num_nodes for b in full) <= 500
        loader.set_epoch(1)
        for k, _ in enumerate(loader, start=1):
            if k == 4:
                break
        state = loader.state_dict()
    assert state["plan"]["kind"] == "budget" and state["batch"] == 4
    assert state["plan"].get("permutation") == ("keyed" if keyed else None)
    with DALIDataLoader(counting, **options) as resumed:
        resumed.load_state_dict(state)
        assert_batches_equal(list(resumed), full[4:])
    with (
        DALIDataLoader(counting, **{**options, "max_atoms": 499}) as other,
        pytest.raises(PlanError, match="max_atoms"),
    ):
        other.load_state_dict(state)
    counting.close()


@pytest.mark.parametrize("keyed", [False, True])
def test_block_shuffle_resumes_on_another_number_of_shards(
    reader: AtomicDataZarrReader, keyed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dali_alchemi.plan import order

    if keyed:  # the order large datasets get, forced on a small store
        monkeypatch.setattr(order, "KEYED_MIN_SAMPLES", 1)
    options: dict[str, Any] = dict(batch_size=15, seed=2, shuffle="block", num_workers=0, device="cpu")
    seen: list[int] = []
    states = []
    for rank in range(2):
        with DALIDataLoader(reader, shard_id=rank, num_shards=2, **options) as loader:
            for k, batch in enumerate(loader, start=1):
                seen += batch.sample_indices.tolist()
                if k == 4:
                    break
            states.append(loader.state_dict())
    assert states[0]["plan"]["kind"] == "block" and states[0]["batch"] == 4
    assert states[0]["plan"].get("permutation") == ("keyed" if keyed else None)
    for rank in range(3):
        with DALIDataLoader(reader, shard_id=rank, num_shards=3, **options) as loader:
            loader.load_state_dict(states[rank % 2])
            assert len(loader) == 4
            seen += [i for b in loader for i in b.sample_indices.tolist()]
            assert loader.epoch == 1
    assert sorted(seen) == list(range(len(reader)))


def test_block_shuffle_through_workers_gives_the_plans_batches(reader: AtomicDataZarrReader) -> None:
    with DALIDataLoader(reader, batch_size=32, seed=8, shuffle="block", num_workers=2, device="cpu") as loader:
        assert loader.plan.to_dict()["kind"] == "block"
        loader.set_epoch(1)
        got = list(loader)
    assert_batches_equal(got, reference_batches(reader, loader.plan, 1))
    assert sorted(i for b in got for i in b.sample_indices.tolist()) == list(range(len(reader)))


@pytest.mark.parametrize("shuffle", ["block", True])
def test_an_uncompressed_store_read_in_place_by_workers_gives_the_same_batches(
    raw_store: Path, reader: AtomicDataZarrReader, shuffle: object
) -> None:
    with DALIDataLoader(
        raw_store, batch_size=16, seed=3, shuffle=shuffle, num_workers=2, start_method="fork", device="cpu",
        cache_bytes=0,  # rows read in place, not through the cache
    ) as loader:  # fmt: skip
        got = list(loader)
    assert_batches_equal(got, reference_batches(reader, loader.plan, 0))  # the compressed store's values
    assert sorted(i for b in got for i in b.sample_indices.tolist()) == list(range(len(reader)))


def test_shared_cache_for_a_source_that_cannot_share_is_refused(small_store: Path, other_store: Path) -> None:
    with pytest.raises(ConfigError, match="shared_cache=True needs one store the loader opens itself, got a list"):
        DALIDataLoader([small_store, other_store], batch_size=8, shared_cache=True)
    with pytest.raises(ConfigError, match="got a list of stores"):
        DALIDataLoader((small_store,), batch_size=8, shared_cache=True)
    with AtomicDataZarrReader(small_store) as inner:
        with pytest.raises(ConfigError, match=r"got a reader passed in \(AtomicDataZarrReader\)"):
            DALIDataLoader(inner, batch_size=8, shared_cache=True)
        with pytest.raises(ConfigError, match=r"got a read_many reader \(AtomicDataZarrReader\)"):
            DALIDataLoader(ReadManyAdapter(inner), batch_size=8, shared_cache=True)
