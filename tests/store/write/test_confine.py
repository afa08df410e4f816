"""store/write/confine.py: the writer never changes anything outside the store's directory tree.

A linked array (or chunk) directory is refused by every writer operation before it changes anything; a
linked chunk file is replaced as a link, so what it points to stays as it was; readers follow links.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, StoreLockedError, UnsupportedStoreError
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.store.format.location import resolve_store
from dali_alchemi.store.write.lock import WriterLock

CONFIG = WriteConfig(core=ArrayConfig(chunk_size=32), meta=ArrayConfig(chunk_size=16))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("confine") / "s.zarr"
    AtomicDataZarrWriter(path, CONFIG).write(synthetic_samples(20, seed=3, min_atoms=3, max_atoms=9))
    return path


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _linked(pristine: Path, tmp_path: Path, inside: str) -> tuple[Path, Path]:
    """A copy of the store whose directory ``inside`` is a link to a folder outside it."""
    store, outside = tmp_path / "s.zarr", tmp_path / "elsewhere"
    shutil.copytree(pristine, store)
    shutil.move(store / inside, outside)
    (store / inside).symlink_to(outside, target_is_directory=True)
    return store, outside


OPERATIONS: dict[str, Callable[[AtomicDataZarrWriter], object]] = {
    "delete": lambda w: w.delete([0]),
    "append": lambda w: w.append(synthetic_samples(3, seed=4, min_atoms=3, max_atoms=9)),
    "add_custom": lambda w: w.add_custom("tag", np.arange(20, dtype=np.int32), "system"),
    "defragment": lambda w: w.defragment(),
    "repair": lambda w: w.repair(),
    "recover": lambda w: w.recover(),
}


@pytest.mark.parametrize("inside", ["core/forces", "core/positions/c", "meta/samples_mask"])
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_a_linked_directory_is_refused_and_nothing_outside_changes(
    pristine: Path, tmp_path: Path, operation: str, inside: str
) -> None:
    store, outside = _linked(pristine, tmp_path, inside)
    before, before_store = _files(outside), _files(store)
    with pytest.raises(UnsupportedStoreError) as info:
        OPERATIONS[operation](AtomicDataZarrWriter(store))
    message = str(info.value)
    assert message.startswith(f"Store {store}: {inside} is a symbolic link to the directory {outside}")
    assert "would change files outside the store" in message and "Nothing was changed" in message
    assert _files(outside) == before and _files(store) == before_store
    with AtomicDataZarrReader(store) as reader:  # readers still follow it
        assert len(reader) == 20


def test_a_linked_chunk_file_is_replaced_as_a_link_never_written_through(pristine: Path, tmp_path: Path) -> None:
    store, outside = tmp_path / "s.zarr", tmp_path / "chunk"
    shutil.copytree(pristine, store)
    chunk = store / "meta" / "samples_mask" / "c" / "0"
    shutil.move(chunk, outside)
    chunk.symlink_to(outside)
    before = outside.read_bytes()
    AtomicDataZarrWriter(store).delete([0])
    assert outside.read_bytes() == before  # the target is untouched
    assert chunk.is_file() and not chunk.is_symlink()  # the link was replaced by the new chunk
    with AtomicDataZarrReader(store) as reader:
        assert len(reader) == 19


def test_a_store_reached_through_a_linked_path_is_written(pristine: Path, tmp_path: Path) -> None:
    real, link = tmp_path / "real.zarr", tmp_path / "link.zarr"
    shutil.copytree(pristine, real)
    link.symlink_to(real, target_is_directory=True)
    AtomicDataZarrWriter(link).delete([0])
    with AtomicDataZarrReader(real) as reader:
        assert len(reader) == 19


def test_a_store_reached_by_two_paths_has_one_lock_and_a_defragment_keeps_the_link(
    pristine: Path, tmp_path: Path
) -> None:
    real, link = tmp_path / "real.zarr", tmp_path / "link.zarr"
    shutil.copytree(pristine, real)
    link.symlink_to(real, target_is_directory=True)
    refused: list[BaseException] = []

    def delete_by_the_real_path() -> None:  # another thread: the lock is re-entrant within one
        try:
            AtomicDataZarrWriter(real).delete([0])
        except StoreLockedError as err:
            refused.append(err)

    with WriterLock(resolve_store(link, read_only=False, must_exist=True), "append"):
        other = threading.Thread(target=delete_by_the_real_path)
        other.start()
        other.join(timeout=30)
    assert len(refused) == 1 and "(append, since" in str(refused[0])  # one lock, whichever path took it
    writer = AtomicDataZarrWriter(link)
    writer.delete([0, 5])
    writer.defragment()
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.zarr", "real.zarr"]  # nothing left beside either
    with AtomicDataZarrReader(real) as reader:
        assert len(reader) == 18


def test_links_beside_the_store_are_removed_as_links(pristine: Path, tmp_path: Path) -> None:
    store, outside = tmp_path / "s.zarr", tmp_path / "elsewhere"
    shutil.copytree(pristine, store)
    outside.mkdir()
    (outside / "keep").write_text("mine")
    planted = tmp_path / ".s.zarr.dali-alchemi-defragment-new"
    planted.symlink_to(outside, target_is_directory=True)
    AtomicDataZarrWriter(store).delete([0])  # recovery clears what is beside the store first
    assert not planted.exists() and not planted.is_symlink()
    assert (outside / "keep").read_text() == "mine"
