"""store/read/shared_pointers.py: decoded pointers and masks kept once per machine, mapped read-only by every reader.

Small stores (a few thousand structures) with small meta chunks and segments, so that a copy spans
many chunks and segments; ``shared_pointers=FOLDER`` shares them at any size.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter
from dali_alchemi.bench.synth import write_synthetic_store
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.errors import StoreFormatError
from dali_alchemi.store.read import mapped_pages, pointers, shared_pointers

CONFIG = WriteConfig(meta=ArrayConfig(chunk_size=256), core=ArrayConfig(chunk_size=512))
N = 3000


@pytest.fixture(autouse=True)
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pointers, "SEGMENT_ROWS", 100)  # 30 segments per array (forked children inherit it)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_store(
        tmp_path_factory.mktemp("shared") / "s.zarr", N, seed=3, min_atoms=1, max_atoms=4, config=CONFIG
    )


@pytest.fixture()
def store(pristine: Path, tmp_path: Path) -> Path:
    path = tmp_path / "s.zarr"
    shutil.copytree(pristine, path)
    return path


def _copies(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.ptrs"))


def _mapped(path: Path) -> bool:
    """Whether this process maps ``path``."""
    return any(line.rstrip().endswith(str(path)) for line in Path("/proc/self/maps").read_text().splitlines())


def _open_in_child(store: Path, folder: Path, out: Any) -> None:
    with AtomicDataZarrReader(store, shared_pointers=folder) as reader:
        snap = reader._snapshot
        (copy,) = _copies(folder)
        out.put(
            (
                os.stat(copy).st_ino,
                _mapped(copy),
                [arr.flags.writeable for arr in (snap.atoms_ptr, snap.edges_ptr, snap.samples_mask)],
                int(snap.atoms_ptr.sum()),
                len(reader),
            )
        )


def test_the_copy_is_published_once_and_mapped_by_a_reader_in_another_process(store: Path, tmp_path: Path) -> None:
    folder = tmp_path / "pointers"
    with AtomicDataZarrReader(store, shared_pointers=folder) as reader:
        (copy,) = _copies(folder)
        snap = reader._snapshot
        assert _mapped(copy)
        assert [arr.flags.writeable for arr in (snap.atoms_ptr, snap.edges_ptr, snap.samples_mask)] == [False] * 3
        assert snap.live is None and len(reader) == N  # nothing deleted: no index of live samples
        inode = os.stat(copy).st_ino
        private = AtomicDataZarrReader(store, shared_pointers=False)
        np.testing.assert_array_equal(reader.atoms_ptr, private.atoms_ptr)
        np.testing.assert_array_equal(reader.edges_ptr, private.edges_ptr)
        private.close()
        out: Any = multiprocessing.get_context("fork").Queue()
        child = multiprocessing.get_context("fork").Process(target=_open_in_child, args=(store, folder, out))
        child.start()
        child_inode, child_maps, writeable, total, length = out.get(timeout=60)
        child.join(timeout=60)
    assert (child_inode, child_maps, writeable, length) == (inode, True, [False] * 3, N)
    assert total == int(reader.atoms_ptr.sum())
    assert _copies(folder) == [copy]  # mapped, not built again


def test_a_store_rewritten_at_the_same_path_never_serves_the_old_pointers(store: Path, tmp_path: Path) -> None:
    folder = tmp_path / "pointers"
    with AtomicDataZarrReader(store, shared_pointers=folder) as old:
        old_ptr = np.array(old.atoms_ptr)
    shutil.rmtree(store)
    write_synthetic_store(store, N, seed=4, min_atoms=1, max_atoms=4, config=CONFIG)  # same shapes, other sizes
    with (
        AtomicDataZarrReader(store, shared_pointers=folder) as new,
        AtomicDataZarrReader(store, shared_pointers=False) as truth,
    ):
        np.testing.assert_array_equal(new.atoms_ptr, truth.atoms_ptr)
        assert not np.array_equal(new.atoms_ptr, old_ptr)
    assert len(_copies(folder)) == 1  # the old state's copy was removed


def test_a_copy_changed_in_the_folder_is_detected_and_built_again(
    store: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "pointers"
    AtomicDataZarrReader(store, shared_pointers=folder).close()
    (copy,) = _copies(folder)
    data = bytearray(copy.read_bytes())
    data[8 * 1500] ^= 0xFF  # one byte of atoms_ptr
    copy.write_bytes(bytes(data))
    with (
        AtomicDataZarrReader(store, shared_pointers=folder) as reader,
        AtomicDataZarrReader(store, shared_pointers=False) as truth,
    ):
        np.testing.assert_array_equal(reader.atoms_ptr, truth.atoms_ptr)
    assert "do not match the crc32c" in caplog.text
    (rebuilt,) = _copies(folder)
    assert rebuilt.read_bytes() != bytes(data)


def test_deleted_samples_map_logical_to_physical_through_the_copy(store: Path, tmp_path: Path) -> None:
    folder = tmp_path / "pointers"
    doomed = [700, 705, 799, 800, 2999]  # the first in the third mask chunk: the live before it are indexed too
    AtomicDataZarrWriter(store).delete(doomed)
    live = np.setdiff1d(np.arange(N), doomed)
    with (
        AtomicDataZarrReader(store, shared_pointers=folder) as reader,
        AtomicDataZarrReader(store, shared_pointers=False) as truth,
    ):
        snap = reader._snapshot
        assert snap.live is not None and not snap.live.flags.writeable and _mapped(_copies(folder)[0])
        np.testing.assert_array_equal(snap.live, live)
        picks = [0, 699, 700, 795, 2994]
        got = reader.read_packed(picks)
        want = truth.read_packed(picks)
        np.testing.assert_array_equal(got.physical_indices, live[picks])
        for name in want.fields:
            np.testing.assert_array_equal(got.fields[name], want.fields[name])


def test_a_damaged_pointer_raises_the_open_check_and_publishes_nothing(store: Path, tmp_path: Path) -> None:
    import zarr

    folder = tmp_path / "pointers"
    ptr = zarr.open_array(store / "meta" / "atoms_ptr", mode="r+")
    ptr[1700] = int(ptr[1698])  # below entry 1699: not monotonic, in the seventh chunk
    with pytest.raises(StoreFormatError, match=r"meta/atoms_ptr is not monotonic: entry 1700 \(\d+\) < entry 1699"):
        AtomicDataZarrReader(store, shared_pointers=folder)
    assert _copies(folder) == []
    with pytest.raises(StoreFormatError, match=r"meta/atoms_ptr is not monotonic: entry 1700 \(\d+\) < entry 1699"):
        AtomicDataZarrReader(store, shared_pointers=False)


def test_small_stores_are_not_shared_by_default(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_pointers, "shared_memory_root", lambda: str(tmp_path))
    with AtomicDataZarrReader(store) as reader:
        assert len(reader) == N
    assert not (tmp_path / f"dali-alchemi-pointers-{os.getuid()}").exists()  # not even made
    monkeypatch.setattr(shared_pointers, "MIN_SAMPLES", N)
    with AtomicDataZarrReader(store) as reader:
        (copy,) = _copies(tmp_path / f"dali-alchemi-pointers-{os.getuid()}")
        assert _mapped(copy)


def _resident_kib(path: Path) -> int:
    """KiB of ``path`` this process has mapped in (the ``Rss`` of its mappings in ``/proc/self/smaps``)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            inside = line.rstrip().endswith(str(path))
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def test_opening_verifies_the_copy_without_mapping_its_pages_in(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Big enough (4 MB) that the kernel's fault-around (64 KiB for each page the open looks at) stays small beside it.
    store = write_synthetic_store(tmp_path_factory.mktemp("big") / "s.zarr", 250_000, seed=3, min_atoms=1, max_atoms=2)
    folder = store.parent / "pointers"
    AtomicDataZarrReader(store, shared_pointers=folder).close()  # builds and publishes the copy
    (copy,) = _copies(folder)
    size_kib = copy.stat().st_size // 1024
    with AtomicDataZarrReader(store, shared_pointers=folder) as reader:  # maps it, checking every byte
        assert _mapped(copy) and 0 < _resident_kib(copy) < size_kib // 8  # the few pages the open looked at
        assert int(np.asarray(reader.atoms_ptr).sum()) > 0 and _resident_kib(copy) > size_kib // 3  # a look maps them in


def test_reads_let_go_of_the_pointer_pages_they_mapped(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "pointers"
    with AtomicDataZarrReader(store, shared_pointers=folder) as reader, AtomicDataZarrReader(
        store, shared_pointers=False
    ) as truth:  # fmt: skip
        (copy,) = _copies(folder)
        size = copy.stat().st_size
        monkeypatch.setattr(mapped_pages, "MAPPED_BYTES", size // 4)  # "big": bigger than the bound
        monkeypatch.setattr(mapped_pages, "FAULT_BYTES", size // 4)  # each structure looks due at once
        order = np.random.default_rng(0).permutation(N)[:400]
        got = reader.read_packed(order)
        assert _resident_kib(copy) == 0  # let go before the chunks were read
        want = truth.read_packed(order)
        for name in want.fields:
            np.testing.assert_array_equal(got.fields[name], want.fields[name])
        atoms, edges = reader.sample_sizes(order)
        assert _resident_kib(copy) == 0
        np.testing.assert_array_equal(atoms, truth.sample_sizes(order)[0])
        np.testing.assert_array_equal(edges, truth.sample_sizes(order)[1])
        monkeypatch.setattr(mapped_pages, "MAPPED_BYTES", size)  # a copy within the bound stays mapped
        reader.read_packed(order)
        assert _resident_kib(copy) > 0


def test_a_copy_that_cannot_be_written_leaves_no_file_and_the_pointers_are_read_privately(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import errno

    folder = tmp_path / "pointers"
    real = os.pwrite
    calls = []

    def full_after_two(fd: int, data: Any, offset: int) -> int:  # the folder fills up while the copy is written
        calls.append(offset)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", full_after_two)
    with caplog.at_level("WARNING"), AtomicDataZarrReader(store, shared_pointers=folder) as reader:
        ptr = np.array(reader.atoms_ptr)
    monkeypatch.setattr(os, "pwrite", real)
    assert len(calls) == 3 and "No space left on device" in caplog.text and "read into this process" in caplog.text
    assert list(folder.iterdir()) == []  # neither a copy nor its partial file is left
    with AtomicDataZarrReader(store, shared_pointers=False) as private:
        np.testing.assert_array_equal(ptr, private.atoms_ptr)
