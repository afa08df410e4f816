"""store/read/shared.py: decoded blocks published once, mapped by other processes, claims that never hang."""

from __future__ import annotations

import multiprocessing
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter
from dali_alchemi.store.read.shared import SharedBlocks, make_shared_folder, remove_shared_folder


def test_a_published_block_is_mapped_read_only_and_discarded(tmp_path: Path) -> None:
    shared = SharedBlocks(tmp_path).scoped("snapshot/1")
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert shared.open("positions", 0, data.dtype, data.shape) is None
    assert shared.claim("positions", 0) and not shared.claim("positions", 0)  # one claim at a time
    mapped = shared.publish("positions", 0, data)
    assert np.array_equal(mapped, data) and not mapped.flags.writeable
    again = shared.open("positions", 0, data.dtype, data.shape)
    assert again is not None and np.array_equal(again, data)
    assert shared.open("positions", 0, data.dtype, (5, 3)) is None  # a wrong size is not a block
    assert not shared.claim("positions", 0)  # published: nothing left to decode
    assert not (tmp_path / "snapshot%2F1" / "positions.0.claim").exists()  # and no claim left behind
    shared.discard("positions", 0)
    assert shared.open("positions", 0, data.dtype, data.shape) is None
    assert shared.claim("positions", 0)  # discarded: the next process to need it decodes it
    assert np.array_equal(mapped, data)  # a mapping outlives the file


def _publish_later(directory: str, started: Any) -> None:
    shared = SharedBlocks(directory)
    assert shared.claim("forces", 3)
    started.set()
    shared.publish("forces", 3, np.full((8, 3), 7.0, dtype=np.float32))


@pytest.mark.timeout(60)
def test_a_waiter_gets_the_block_another_process_publishes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    started = ctx.Event()
    child = ctx.Process(target=_publish_later, args=(str(tmp_path), started))
    child.start()
    assert started.wait(20)
    shared = SharedBlocks(tmp_path)
    got = shared.wait("forces", 3, np.dtype(np.float32), (8, 3))
    child.join(20)
    assert child.exitcode == 0
    assert got is not None and float(got.sum()) == 7.0 * 24


def test_a_dead_processes_claim_is_taken_over_and_a_stuck_one_times_out(tmp_path: Path) -> None:
    shared = SharedBlocks(tmp_path, wait_s=0.05)
    ctx = multiprocessing.get_context("fork")
    gone = ctx.Process(target=os._exit, args=(0,))
    gone.start()
    gone.join()
    (tmp_path / "energy.0.claim").write_text(str(gone.pid))
    assert shared.wait("energy", 0, np.dtype(np.float32), (2,)) is None  # its claim is stale: no wait
    assert shared.claim("energy", 0)  # and can be taken over
    (tmp_path / "cell.1.claim").write_text(str(os.getpid()))  # alive, but never publishes
    assert shared.wait("cell", 1, np.dtype(np.float32), (2,)) is None  # gives up after wait_s


def test_a_shared_folder_is_made_and_removed() -> None:
    folder = make_shared_folder()
    assert os.path.isdir(folder) and not os.listdir(folder)
    SharedBlocks(folder).scoped("x")
    remove_shared_folder(folder)
    assert not os.path.exists(folder)


def test_a_refreshed_reader_never_maps_blocks_decoded_from_a_replaced_field(small_store: Path, tmp_path: Path) -> None:
    store = Path(shutil.copytree(small_store, tmp_path / "s.zarr"))
    writer = AtomicDataZarrWriter(store)
    writer.add_custom("tag", np.zeros(300, dtype=np.float32), "system")
    folder = make_shared_folder()
    try:
        with (
            AtomicDataZarrReader(store, fields=["tag"], shared_cache=folder) as a,
            AtomicDataZarrReader(store, fields=["tag"], shared_cache=folder) as b,
        ):
            assert a.read_packed([0]).fields["tag"].tolist() == [0.0]  # a publishes the old block
            writer.add_custom("tag", np.ones(300, dtype=np.float32), "system")  # same counts, shapes, dtype
            b.refresh()
            assert b.read_packed([0]).fields["tag"].tolist() == [1.0]
    finally:
        remove_shared_folder(folder)


def _read_and_exit(store: str, folder: str, done: Any) -> None:
    """Read every structure through the shared folder, then exit without closing: the blocks stay."""
    reader = AtomicDataZarrReader(store, fields=["energy"], shared_cache=folder)
    reader.read_packed(np.arange(len(reader)))
    done.set()
    os._exit(0)


def _publish_in_a_child(store: Path, folder: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    done = ctx.Event()
    child = ctx.Process(target=_read_and_exit, args=(str(store), str(folder), done))
    child.start()
    child.join(60)
    assert done.is_set() and child.exitcode == 0
    assert list(folder.rglob("*energy*")), "the child published no block"


def _write(store: Path, energy: float) -> None:
    samples = [
        {"atomic_numbers": np.array([1, 8]), "positions": np.zeros((2, 3), np.float32),
         "energy": np.array([[energy + i]], np.float32)}
        for i in range(20)
    ]  # fmt: skip
    AtomicDataZarrWriter(store).write(samples)


def test_a_kept_folder_never_serves_a_store_rewritten_at_the_same_path(tmp_path: Path) -> None:
    store, folder = tmp_path / "s.zarr", tmp_path / "blocks"
    _write(store, 0.0)
    _publish_in_a_child(store, folder)
    shutil.rmtree(store)
    _write(store, 100.0)  # same path, counts, shapes, dtypes and metadata bytes; new labels
    with AtomicDataZarrReader(store, fields=["energy"], shared_cache=folder) as reader:
        got = reader.read_packed(np.arange(20)).fields["energy"].ravel()
    assert got.tolist() == [100.0 + i for i in range(20)]


def test_a_damaged_block_in_the_folder_is_decoded_again_not_returned(tmp_path: Path) -> None:
    store, folder = tmp_path / "s.zarr", tmp_path / "blocks"
    _write(store, 0.0)
    _publish_in_a_child(store, folder)
    (block,) = [p for p in folder.rglob("*energy*") if p.is_file()]
    raw = bytearray(block.read_bytes())
    raw[0] ^= 0xFF  # a flipped bit in the first label
    block.write_bytes(bytes(raw))
    with AtomicDataZarrReader(store, fields=["energy"], shared_cache=folder) as reader:
        got = reader.read_packed(np.arange(20)).fields["energy"].ravel()
    assert got.tolist() == [float(i) for i in range(20)]


def test_a_block_whose_crc_does_not_match_is_removed(tmp_path: Path) -> None:
    shared = SharedBlocks(tmp_path)
    data = np.arange(6, dtype=np.int64)
    assert shared.claim("x", 0)
    shared.publish("x", 0, data)
    path = tmp_path / "x.0"
    raw = bytearray(path.read_bytes())
    assert len(raw) == data.nbytes + 8  # the bytes, then the trailer
    raw[3] ^= 1
    path.write_bytes(bytes(raw))
    assert shared.open("x", 0, data.dtype, data.shape) is None and not path.exists()
