"""store/write/refusals.py: a write the OS refuses (a full disk, a read-only mount, ...) is a StoreWriteError
naming the store, the operation and the cause, and the store is left at its old state.

The refusal is simulated deterministically: zarr's local store writes every object through one function
(``zarr.storage._local._put``), which is made to raise the OS error for the paths a test picks.
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr
import zarr.storage._local as zarr_local

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, DaliAlchemiError, StoreWriteError
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.store.write.rewrite import rewrite_store

CONFIG = WriteConfig(core=ArrayConfig(chunk_size=32, shard_size=64), meta=ArrayConfig(chunk_size=16))
BASE = synthetic_samples(20, seed=3, min_atoms=3, max_atoms=9)
EXTRA = [dict(s, tag=np.array([99], np.int32)) for s in synthetic_samples(12, seed=4, min_atoms=3, max_atoms=9).split()]
TAG = {"tag": "system"}
REFUSED = {
    errno.ENOSPC: "No space left on device",
    errno.EROFS: "Read-only file system",
    errno.EACCES: "Permission denied",
    errno.EDQUOT: "Disk quota exceeded",
    errno.EFBIG: "File too large",
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("refusals") / "s.zarr"
    writer = AtomicDataZarrWriter(path, CONFIG)
    writer.write(BASE)
    writer.add_custom("tag", np.arange(20, dtype=np.int32), "system")
    return path


@pytest.fixture()
def store(pristine: Path, tmp_path: Path) -> Path:
    path = tmp_path / "s.zarr"
    shutil.copytree(pristine, path)
    return path


def _refuse(monkeypatch: pytest.MonkeyPatch, code: int, *, where: str = "", times: int | None = None) -> dict[str, int]:
    """Make zarr's writes of paths containing ``where`` fail with ``code`` (the first ``times`` ones, or all)."""
    original = zarr_local._put
    seen = {"refused": 0}

    def put(path: Path, value: object, exclusive: bool = False) -> int:
        if where in path.as_posix() and (times is None or seen["refused"] < times):
            seen["refused"] += 1
            raise OSError(code, os.strerror(code), str(path))
        return original(path, value, exclusive)  # type: ignore[arg-type]

    monkeypatch.setattr(zarr_local, "_put", put)
    return seen


def _state(path: Path) -> tuple[int, dict[str, np.ndarray], dict[str, tuple[int, ...]]]:
    """What readers see (every sample, read whole and twice, so whole-array reads happen), and the shapes."""
    with AtomicDataZarrReader(path) as reader:
        for _ in range(2):
            packed = reader.read_packed(np.arange(len(reader)))
        root = zarr.open_group(path, mode="r")
        shapes = {f"{g}/{n}": tuple(a.shape) for g in ("meta", "core", "custom") for n, a in root[g].arrays()}
        return len(reader), dict(packed.fields), shapes


def _assert_same(before: tuple[int, dict[str, np.ndarray], dict[str, tuple[int, ...]]], path: Path) -> None:
    n, fields, shapes = _state(path)
    assert n == before[0]
    assert shapes == before[2]
    assert fields.keys() == before[1].keys()
    for name, values in before[1].items():
        assert np.array_equal(fields[name], values), name


def _journal(path: Path) -> Path:
    return path.with_name(f".{path.name}.dali-alchemi-journal.json")


@pytest.mark.parametrize("code", list(REFUSED))
def test_an_append_refused_after_its_metadata_grew_is_rolled_back_and_named(
    store: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    before = _state(store)
    seen = _refuse(monkeypatch, code, where="core/positions/c/", times=1)  # the shape is grown by then
    with pytest.raises(StoreWriteError) as info:
        AtomicDataZarrWriter(store).append(EXTRA, levels=TAG)
    assert seen["refused"] == 1
    err = info.value
    assert isinstance(err, OSError) and isinstance(err, DaliAlchemiError)
    assert err.errno == code and (err.store, err.operation) == (str(store), "append")
    message = str(err)
    assert message.startswith(f"Store {store}: append failed: the operating system refused a write: {REFUSED[code]}")
    assert f"[{errno.errorcode[code]}]" in message and "core/positions/c/" in message
    assert "The store was rolled back to its state before the append." in message
    assert isinstance(err.__cause__, OSError) and err.__cause__.errno == code
    assert not _journal(store).exists()
    _assert_same(before, store)
    AtomicDataZarrWriter(store).append(EXTRA, levels=TAG)  # once the OS allows it, the same append works
    assert _state(store)[0] == 32


def test_when_the_rollback_is_refused_too_readers_keep_the_old_state(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _state(store)
    _refuse(monkeypatch, errno.ENOSPC, where="core/positions/c/")  # every write of it, the rollback's too
    monkeypatch.setattr(zarr_local, "_put", _wrap_zarr_json(zarr_local._put))
    with pytest.raises(StoreWriteError, match="It could not be put back") as info:
        AtomicDataZarrWriter(store).append(EXTRA, levels=TAG)
    assert "readers read it at its old state" in str(info.value) and "recover()" in str(info.value)
    assert _journal(store).exists()  # the append's journal stays: readers serve its old state
    root = zarr.open_group(store, mode="r")
    assert root["core/positions"].shape[0] > before[2]["core/positions"][0]  # its metadata had grown
    n, fields, _ = _state(store)  # the whole-array reads included: no chunk past the old state is asked for
    assert n == 20 and all(np.array_equal(fields[k], v) for k, v in before[1].items())
    monkeypatch.undo()
    assert AtomicDataZarrWriter(store).recover() == "append"  # the next writer rolls it back
    _assert_same(before, store)


def _wrap_zarr_json(put: Callable[..., int]) -> Callable[..., int]:
    """Also refuse every ``zarr.json`` write once the first data write was refused (a disk that stays full)."""
    refused = {"on": False}

    def wrapped(path: Path, value: object, exclusive: bool = False) -> int:
        if refused["on"] and path.name == "zarr.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        try:
            return put(path, value, exclusive)
        except OSError:
            refused["on"] = True
            raise

    return wrapped


OPERATIONS: dict[str, Callable[[AtomicDataZarrWriter], object]] = {
    "delete": lambda w: w.delete([1, 4]),
    "add_custom": lambda w: w.add_custom("tag", np.full(20, 7, np.int32), "system"),
    "defragment": lambda w: w.defragment(),
    "append": lambda w: w.append(EXTRA, levels=TAG),
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_every_operation_refused_at_its_first_write_leaves_the_old_state(
    store: Path, monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    AtomicDataZarrWriter(store).delete([0])  # a deleted sample, so that defragment has work
    before = _state(store)
    _refuse(monkeypatch, errno.EROFS, where="/c/", times=1)
    with pytest.raises(StoreWriteError, match=f"^Store {store}: {operation} failed: .*Read-only file system") as info:
        OPERATIONS[operation](AtomicDataZarrWriter(store))
    assert info.value.errno == errno.EROFS
    leftovers = sorted(p.name for p in store.parent.iterdir() if p.name.startswith(f".{store.name}.dali-alchemi"))
    if operation == "delete":  # readers see a delete from its journal on: it is finished, not undone
        assert "The delete had reached the point readers see, and was finished." in str(info.value)
        mask = zarr.open_group(store, mode="r")["meta/samples_mask"][:]
        assert np.flatnonzero(mask).tolist() == [i for i in range(20) if i not in (0, 1, 4)]
        assert _state(store)[0] == 17
    else:
        _assert_same(before, store)
    assert leftovers == [], leftovers  # no journal, no staging directory left beside the store


def test_a_write_refused_while_creating_leaves_no_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "new.zarr"
    _refuse(monkeypatch, errno.EDQUOT, where="core/")
    monkeypatch.chdir(tmp_path)  # given as a relative path, the store is still named by its absolute one
    with pytest.raises(
        StoreWriteError, match=f"^Store {path}: write failed: .*Disk quota exceeded.*No store was created"
    ):
        AtomicDataZarrWriter("new.zarr", CONFIG).write(BASE)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nor any staging directory


def test_a_lock_file_that_cannot_be_created_is_a_store_write_error(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*args: object, **kwargs: object) -> int:
        raise PermissionError(
            errno.EACCES, "Permission denied", str(store.with_name(f".{store.name}.dali-alchemi-lock"))
        )

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(StoreWriteError, match=r"append failed: .*Permission denied.*The store was not changed"):
        AtomicDataZarrWriter(store).append(EXTRA, levels=TAG)


def test_a_rewrite_refused_leaves_nothing_at_its_destination(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out" / "copy.zarr"
    _refuse(monkeypatch, errno.ENOSPC, where="copy.zarr.dali-alchemi-rewrite-partial/core/")
    with pytest.raises(
        StoreWriteError, match=f"rewrite to {out} failed: .*No space left on device.*Nothing was left at"
    ):
        rewrite_store(store, out)
    assert list(out.parent.iterdir()) == []


def test_the_error_pickles_with_its_errno_store_and_operation() -> None:
    err = StoreWriteError(errno.ENOSPC, "Store s: append failed", store="s", operation="append")
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), str(back), back.errno, back.store, back.operation) == (
        StoreWriteError,
        "Store s: append failed",
        errno.ENOSPC,
        "s",
        "append",
    )


@pytest.mark.parametrize("out", [False, True])
def test_a_repair_refused_leaves_the_store_as_it_was(
    nv_fixture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: bool
) -> None:
    path = tmp_path / "grown.zarr"
    shutil.copytree(nv_fixture / "nv_append_batch.zarr", path)
    before = {str(p.relative_to(tmp_path)): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    _refuse(monkeypatch, errno.ENOSPC, where="fixed.zarr" if out else "dali-alchemi-repair-new/c/")
    with pytest.raises(StoreWriteError, match=f"^Store {path}: repair failed: .*No space left on device"):
        AtomicDataZarrWriter(path).repair(out=tmp_path / "fixed.zarr" if out else None)
    after = {str(p.relative_to(tmp_path)): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    assert after == before  # nothing changed, no staged array or copy left


def test_a_refused_rewrite_whose_partial_copy_stays_says_where_it_is(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dali_alchemi.store.write import rewrite as rewrite_module

    out = tmp_path / "out" / "copy.zarr"
    _refuse(monkeypatch, errno.ENOSPC, where="copy.zarr.dali-alchemi-rewrite-partial/core/")
    removals = []
    real = rewrite_module.shutil.rmtree

    def leaves_it(path: object, ignore_errors: bool = False) -> None:  # the folder comes back after each removal
        removals.append(path)
        real(path, ignore_errors=ignore_errors)  # type: ignore[arg-type]
        if Path(str(path)).parent.is_dir():
            Path(str(path)).mkdir()

    monkeypatch.setattr(rewrite_module.shutil, "rmtree", leaves_it)
    monkeypatch.setattr(rewrite_module.time, "sleep", lambda _: None)
    with pytest.raises(StoreWriteError, match=r"The partial copy .*copy\.zarr\.dali-alchemi-rewrite-partial could not"):
        rewrite_store(store, out)
    assert len(removals) > 2  # tried again before giving up
    monkeypatch.setattr(rewrite_module.shutil, "rmtree", real)
    assert [p.name for p in out.parent.iterdir()] == [".copy.zarr.dali-alchemi-rewrite-partial"]
