"""verify_store: every chunk decoded once, and every problem reported with where it is."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, StoreFormatError, StoreNotFoundError
from dali_alchemi.bench.http_server import StoreServer
from dali_alchemi.cli import main
from dali_alchemi.store.check.verify import VerifyReport, verify_store
from dali_alchemi.store.format.journal import DeleteOp, write_journal
from dali_alchemi.store.format.location import resolve_store
from tests.store.conftest import N


def _kinds(report: VerifyReport) -> list[tuple[str, str | None, str | None]]:
    return [(p.kind, p.array, p.chunk) for p in report.problems]


def _rewrite(path: Path, array: str, change: object) -> None:
    arr = zarr.open_array(path / array, mode="r+")
    values = arr[...]
    change(values)  # type: ignore[operator]
    arr.with_config({"write_empty_chunks": True})[...] = values


def test_a_sound_store_is_ok_and_every_chunk_is_counted(store: Path) -> None:
    progress: list[tuple[int, int]] = []
    report = verify_store(store, progress=lambda done, total: progress.append((done, total)))
    assert report.ok and report.problems == () and report.problems_left_out == 0
    assert (report.samples, report.live, report.arrays) == (N, N, 16)
    on_disk = sum(1 for p in store.rglob("*") if p.is_file() and p.name != "zarr.json")
    assert report.chunks == on_disk and report.implicit_chunks == 0
    assert report.complete_chunks and report.checksums == "crc32c" and report.unchecksummed == ()
    assert progress[-1] == (on_disk, on_disk) and all(a <= b for (a, _), (b, _) in itertools.pairwise(progress))
    json.dumps(report.to_dict())  # JSON-ready


def test_a_store_served_over_http_verifies_as_it_does_on_disk(pristine: Path) -> None:
    """An HTTP listing names folders with a trailing slash; every array is still found and checked."""
    local = verify_store(pristine)
    with StoreServer(pristine.parent) as server:
        remote = verify_store(server.url + pristine.name)
    assert remote.ok and remote.problems == (), [p.message for p in remote.problems]
    assert (
        (remote.samples, remote.arrays, remote.chunks)
        == (local.samples, local.arrays, local.chunks)
        == (N, 16, local.chunks)
    )
    assert remote.chunks > 16


def test_a_deleted_chunk_is_named_with_its_structures(store: Path) -> None:
    (store / "core" / "positions" / "c" / "0" / "0").unlink()
    report = verify_store(store)
    assert _kinds(report) == [("missing-chunk", "core/positions", "core/positions/c/0/0")]
    assert report.problems[0].sample == 0 and "rows 0-63: structures 0-" in report.problems[0].message


def test_a_deleted_samples_mask_chunk_is_reported(store: Path) -> None:
    (store / "meta" / "samples_mask" / "c" / "0").unlink()
    report = verify_store(store)
    assert ("missing-chunk", "meta/samples_mask", "meta/samples_mask/c/0") in _kinds(report)
    assert report.samples == -1  # without the mask the structures cannot be counted


@pytest.mark.parametrize("damage", ["directory", "zarr.json"])
def test_an_absent_field_is_reported(store: Path, damage: str) -> None:
    if damage == "directory":
        shutil.rmtree(store / "core" / "forces")
        array = "core/forces"
    else:
        (store / "core" / "positions" / "zarr.json").unlink()
        array = "core/positions"
    report = verify_store(store)
    assert _kinds(report) == [("missing-array", array, None)]
    assert "its directory or its zarr.json is gone" in report.problems[0].message


def test_flipped_bytes_fail_their_checksum(store: Path) -> None:
    chunk = store / "core" / "forces" / "c" / "1" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[20:84] = bytes(b ^ 0xFF for b in raw[20:84])
    chunk.write_bytes(bytes(raw))
    report = verify_store(store)
    assert _kinds(report) == [("corrupt-chunk", "core/forces", "core/forces/c/1/0")]
    assert "crc32c checksum mismatch" in report.problems[0].message


def test_pointers_masks_and_neighbor_lists_are_checked(store: Path) -> None:
    ptr = zarr.open_array(store / "meta" / "atoms_ptr", mode="r")[...]
    edges = zarr.open_array(store / "meta" / "edges_ptr", mode="r")[...]
    _rewrite(store, "core/neighbor_list", lambda v: v.__setitem__(5, [0, 10**6]))
    _rewrite(store, "meta/atoms_mask", lambda v: v.__setitem__(int(ptr[3]), False))
    _rewrite(store, "meta/edges_ptr", lambda v: v.__setitem__(30, v[32]))
    report = verify_store(store)
    kinds = {(p.kind, p.array, p.sample) for p in report.problems}
    assert ("mask", "meta/atoms_mask", 3) in kinds
    assert ("pointer", "meta/edges_ptr", 30) in kinds
    # edges_ptr is broken, so neighbor lists cannot be attributed: put it back and look again
    _rewrite(store, "meta/edges_ptr", lambda v: v.__setitem__(30, edges[30]))
    report = verify_store(store)
    bad = [p for p in report.problems if p.kind == "neighbor-list"]
    assert [(p.array, p.sample) for p in bad] == [("core/neighbor_list", 0)]
    assert "holds [0, 1000000], outside the sample's atom rows [0, " in bad[0].message


def test_deleted_structures_are_fine_and_problems_beyond_the_limit_are_counted(store: Path) -> None:
    AtomicDataZarrWriter(store).delete([1, 2, 3])
    report = verify_store(store)
    assert report.ok and report.live == N - 3
    for k in range(6):
        (store / "core" / "forces" / "c" / str(k) / "0").unlink()
    report = verify_store(store, max_problems=2)
    assert len(report.problems) == 2 and report.problems_left_out == 4


def test_a_store_written_elsewhere_counts_implicit_chunks(store: Path) -> None:
    root = zarr.open_group(store, mode="r+")
    del root.attrs["dali_alchemi"]
    (store / "core" / "positions" / "c" / "0" / "0").unlink()
    report = verify_store(store)
    assert report.ok and report.implicit_chunks == 1 and not report.complete_chunks


def test_sharded_stores_are_walked_to_their_inner_chunks(sharded_store: Path, tmp_path: Path) -> None:
    path = tmp_path / "sharded.zarr"
    shutil.copytree(sharded_store, path)
    assert verify_store(path).ok
    index_end = path / "core" / "forces" / "c" / "0" / "0"
    raw = bytearray(index_end.read_bytes())
    raw[-8] ^= 0xFF  # inside the shard index
    index_end.write_bytes(bytes(raw))
    report = verify_store(path)
    assert _kinds(report) == [("corrupt-chunk", "core/forces", "core/forces/c/0/0")]
    assert "shard index" in report.problems[0].message


def test_unfinished_operations_and_missing_stores(store: Path, tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError):
        verify_store(tmp_path / "nothing.zarr")
    write_journal(resolve_store(store, read_only=False, must_exist=True), DeleteOp(physical=(0,)))
    report = verify_store(store)
    assert report.problems[0].kind == "journal" and "interrupted delete" in report.problems[0].message


def test_row_owners_match_a_search_of_the_pointer() -> None:
    from dali_alchemi.store.check.consistency import row_owner as _row_owner

    rng = np.random.default_rng(3)
    ptr = np.concatenate([[0], np.cumsum(rng.integers(0, 5, size=50))]).astype(np.int64)
    for first in range(0, int(ptr[-1]), 7):
        count = min(13, int(ptr[-1]) - first)
        expected = np.searchsorted(ptr, np.arange(first, first + count), side="right") - 1
        assert np.array_equal(_row_owner(ptr, first, count), expected), first


def test_findings_list_each_place_once_and_count_the_rest() -> None:
    from dali_alchemi.store.check.consistency import Findings

    found = Findings(limit=3)
    for _ in range(2):  # a corrupt shard index met once per block of its shard
        found.add("corrupt-chunk", "index", array="core/x", chunk="core/x/c/0")
    found.add("mask", "a", array="meta/atoms_mask", chunk="meta/atoms_mask/c/0", sample=1)
    found.add("mask", "b", array="meta/atoms_mask", chunk="meta/atoms_mask/c/0", sample=2)
    found.add("mask", "c", array="meta/atoms_mask", chunk="meta/atoms_mask/c/0", sample=3)
    assert [p.message for p in found.problems] == ["index", "a", "b"] and found.left_out == 1


def test_an_array_of_a_newer_writers_level_is_skipped_not_a_problem(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = zarr.open_group(store, mode="r+")
    root.require_group("custom").create_array("tag", data=np.zeros(5, np.int32))  # rows of a level we lack
    doc = json.loads((store / "zarr.json").read_text())
    doc["attributes"]["fields"].setdefault("custom", {})["tag"] = "residue"
    (store / "zarr.json").write_text(json.dumps(doc))
    report = verify_store(store)
    assert report.ok, _kinds(report)
    assert len(report.skipped) == 1 and "custom.tag has level 'residue'" in report.skipped[0]
    assert "array custom/tag was written by a newer writer; not checked" in report.skipped[0]
    assert report.to_dict()["skipped"] == list(report.skipped)
    assert main(["verify", str(store)]) == 0
    assert "skipped: " in capsys.readouterr().out


# -- bounded by what is stored; unreadable metadata is a problem naming the file ---------------------
def _claim_rows(path: Path, array: str, rows: int) -> None:
    meta_path = path / array / "zarr.json"
    doc = json.loads(meta_path.read_text())
    doc["shape"][0] = rows
    meta_path.write_text(json.dumps(doc))


@pytest.mark.timeout(120)  # a hang detector only: the check lists the stored chunks instead of walking 10^12 rows
@pytest.mark.parametrize("array", ["core/positions", "meta/atoms_mask", "meta/samples_mask", "meta/atoms_ptr"])
def test_a_huge_claimed_shape_is_reported_from_what_is_stored(store: Path, array: str) -> None:
    _claim_rows(store, array, 10**12)
    progress: list[tuple[int, int]] = []
    report = verify_store(store, progress=lambda done, total: progress.append((done, total)))
    assert not report.ok
    problem = next(p for p in report.problems if p.array == array)
    assert problem.kind == "shape" and "1000000000000" in problem.message and "not decoded" in problem.message
    on_disk = sum(1 for p in store.rglob("*") if p.is_file() and p.name != "zarr.json")
    assert report.chunks <= on_disk and (not progress or progress[-1][1] <= on_disk)


def test_rows_that_do_not_fit_the_pointers_are_not_walked(store: Path) -> None:
    _claim_rows(store, "core/energy", 10 * N)  # few enough claimed chunks to pass the listing, not the pointers
    report = verify_store(store)
    assert ("shape", "core/energy", None) in _kinds(report)
    assert "expected 40 rows (from the pointers); its chunks are not decoded" in report.problems[0].message


@pytest.mark.parametrize(("target", "named"), [("zarr.json", "its zarr.json"), ("core/zarr.json", "core/zarr.json"),
                                               ("core/positions/zarr.json", "core/positions/zarr.json")])  # fmt: skip
def test_unparsable_metadata_is_a_problem_naming_the_file(store: Path, target: str, named: str) -> None:
    (store / target).write_text("{garbage")
    report = verify_store(store)
    assert not report.ok and named in report.problems[0].message and "JSONDecodeError" in report.problems[0].message
    assert main(["verify", str(store)]) == 1


def _set_dtype(store: Path, array: str, dtype: str) -> None:
    meta = store / array / "zarr.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "data_type": dtype}))


def test_every_array_whose_dtype_the_reader_refuses_is_a_problem(store: Path) -> None:
    from dali_alchemi import AtomicDataZarrReader, StoreFormatError

    _set_dtype(store, "core/positions", "int32")  # the same item size: its chunks still decode
    _set_dtype(store, "core/atomic_numbers", "float64")
    with pytest.raises(StoreFormatError, match="core/atomic_numbers has dtype float64, which cannot hold"):
        AtomicDataZarrReader(store)
    report = verify_store(store)
    assert _kinds(report) == [("dtype", "core/atomic_numbers", None), ("dtype", "core/positions", None)]
    assert [p.message for p in report.problems] == [
        "array core/atomic_numbers has dtype float64, which cannot hold atomic_numbers; the reader refuses it",
        "array core/positions has dtype int32, which cannot hold positions; the reader refuses it",
    ]


def test_what_else_makes_the_reader_refuse_the_store_is_a_problem(store: Path) -> None:
    from dali_alchemi import AtomicDataZarrReader, StoreFormatError

    # an unfinished append whose recorded old state the pointers do not hold: the reader cannot read either state
    journal = store.parent / f".{store.name}.dali-alchemi-journal.json"
    journal.write_text(json.dumps({"op": "append", "samples": N, "atoms": 7, "edges": 0}))
    with pytest.raises(StoreFormatError, match="the pointers disagree with the write journal"):
        AtomicDataZarrReader(store)
    report = verify_store(store)
    assert [p.kind for p in report.problems] == ["journal", "open"]
    assert report.problems[1].message == (
        f"AtomicDataZarrReader refuses to open this store: StoreFormatError: Store {store}: the pointers disagree "
        "with the write journal of an unfinished append"
    )


def test_a_refusal_already_reported_is_not_reported_twice(store: Path) -> None:
    _rewrite(store, "meta/atoms_ptr", lambda v: v.__setitem__(0, 1))
    with pytest.raises(StoreFormatError, match="atoms_ptr"):  # the reader refuses it, so verify's open check does too
        AtomicDataZarrReader(store)
    report = verify_store(store)
    assert "open" not in [p.kind for p in report.problems] and ("pointer", "meta/atoms_ptr", None) in _kinds(report)


@pytest.mark.parametrize("what", ["an empty folder", "a plain file", "a folder of other files"])
def test_a_path_that_holds_no_store_is_an_error_not_a_report(tmp_path: Path, what: str) -> None:
    from dali_alchemi import StoreFormatError

    path = tmp_path / "thing"
    if what == "a plain file":
        path.write_text("hello")
    else:
        path.mkdir()
        if what == "a folder of other files":
            (path / "notes.txt").write_text("hello")
    expected = "is a file, not a store" if what == "a plain file" else "is not a zarr group: there is no zarr.json"
    with pytest.raises(StoreFormatError, match=f"Store {path} {expected}.*dali-alchemi convert INPUT"):
        verify_store(path)


def test_a_store_a_writer_keeps_changing_is_an_error_not_a_finding(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dali_alchemi.store.check.verify as verify
    from dali_alchemi.store.read.snapshot import KEPT_CHANGING

    def busy(loc: object) -> None:
        raise StoreFormatError(f"Store {store} {KEPT_CHANGING}")

    monkeypatch.setattr(verify, "open_snapshot", busy)
    with pytest.raises(StoreFormatError, match="kept changing while it was opened; try again"):
        verify_store(store)
