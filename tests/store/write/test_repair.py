"""Repair: stores grown by nvalchemi 0.2.0's append read back their true neighbor lists once repaired.

The fixtures were written by nvalchemi 0.2.0 itself (tests/fixtures/make_nv_appended.py); synthetic
stores here are written by this project's writer and then given the values nvalchemi's append leaves
(``local + atoms_ptr[i] - atoms_ptr[g]`` for the first sample ``g`` of each append call).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import zarr

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, StoreFormatError
from dali_alchemi.bench.http_server import StoreServer
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.cli import main
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.errors import (
    AmbiguousRepairError,
    ConfigError,
    RepairError,
    StoreExistsError,
    UnsupportedStoreError,
)
from dali_alchemi.store.check.repair_plan import KINDS
from dali_alchemi.store.format.location import resolve_store
from dali_alchemi.store.read.snapshot import open_snapshot
from dali_alchemi.store.write.repair import repair_store

KIND_COUNTS = {
    "list": {"global": 4, "batch-local": 8},
    "batch": {"global": 3, "batch-local": 9},
    "single": {"global": 4, "sample-local": 8},
    "sink": {"global": 4, "batch-local": 7},
}


def _copy(nv_fixture: Path, name: str, tmp_path: Path) -> Path:
    target = tmp_path / f"{name}.zarr"
    shutil.copytree(nv_fixture / f"nv_append_{name}.zarr", target)
    return target


def _truth(nv_fixture: Path, name: str) -> list[np.ndarray]:
    with np.load(nv_fixture / f"nv_append_{name}.truth.npz") as npz:
        return [npz[f"nl/{i}"] for i in range(len(npz["n_atoms"]))]


def _neighbor_lists(path: Path | str) -> list[np.ndarray]:
    with AtomicDataZarrReader(path) as reader:
        return [s["neighbor_list"].numpy() for s, _ in reader.read_many(list(range(len(reader))))]


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", [*KIND_COUNTS, "defragment"])
def test_repair_in_place_serves_the_true_neighbor_lists(nv_fixture: Path, tmp_path: Path, name: str) -> None:
    path = _copy(nv_fixture, name, tmp_path)
    with pytest.raises(StoreFormatError, match=r"did not re-base neighbor lists.*dali-alchemi repair"):
        _neighbor_lists(path)
    report = AtomicDataZarrWriter(path).repair()
    assert report.applied and report.written_to == str(path)
    if name in KIND_COUNTS:
        assert report.plan.counts == KIND_COUNTS[name]
    else:  # rows moved by the defragment: those samples are named so
        assert report.plan.counts["moved"] == 3
    truth = _truth(nv_fixture, name)
    got = _neighbor_lists(path)
    assert len(got) == len(truth)
    for i, (g, t) in enumerate(zip(got, truth, strict=True)):
        assert g.dtype == np.int64 and np.array_equal(g, t), f"{name} sample {i}"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no journal or staging left beside it
    again = AtomicDataZarrWriter(path).repair()  # a repaired store needs nothing
    assert not again.applied and again.plan.changed.size == 0


def test_the_error_names_the_cause_and_the_fix(nv_fixture: Path) -> None:
    path = nv_fixture / "nv_append_single.zarr"
    with AtomicDataZarrReader(path) as reader, pytest.raises(StoreFormatError) as err:
        reader.read(4)
    message = str(err.value)
    assert "neighbor_list of sample 4" in message and "outside its atom rows [14, 20)" in message
    assert "written by an append that did not re-base neighbor lists" in message
    assert f"dali-alchemi repair {path}" in message


def test_a_store_with_no_samples_left_has_nothing_to_repair(tmp_path: Path) -> None:
    samples = [
        {"positions": np.zeros((n, 3), np.float32), "atomic_numbers": np.ones(n, np.int64),
         "neighbor_list": np.array([[0, 1], [1, 0]], np.int64)}
        for n in (2, 3, 4)
    ]  # fmt: skip
    path = tmp_path / "emptied.zarr"
    writer = AtomicDataZarrWriter(path)
    writer.write(samples)
    writer.delete([0, 1, 2])
    writer.defragment()
    before = _files(path)
    report = AtomicDataZarrWriter(path).repair(dry_run=True)
    assert report.plan.counts == {} and report.plan.changed.tolist() == [] and report.plan.edges_changed == 0
    assert not report.applied and _files(path) == before


def test_dry_run_reports_and_writes_nothing(nv_fixture: Path, tmp_path: Path) -> None:
    path = _copy(nv_fixture, "batch", tmp_path)
    before = _files(path)
    report = AtomicDataZarrWriter(path).repair(dry_run=True)
    assert not report.applied and report.written_to is None
    assert report.plan.counts == KIND_COUNTS["batch"]
    assert report.plan.changed.tolist() == list(range(3, 12))
    assert report.plan.edges_changed == int(np.diff(zarr.open_array(path / "meta/edges_ptr")[:])[3:].sum())
    assert _files(path) == before
    assert repair_store(path, dry_run=True).plan.counts == KIND_COUNTS["batch"]  # read-only path too


def test_out_writes_a_repaired_copy_and_leaves_the_store(nv_fixture: Path, tmp_path: Path) -> None:
    source = _copy(nv_fixture, "list", tmp_path)
    before = _files(source)
    out = tmp_path / "fixed" / "list.zarr"
    report = repair_store(source, out=out)
    assert report.applied and report.written_to == str(out)
    assert _files(source) == before
    assert all(np.array_equal(g, t) for g, t in zip(_neighbor_lists(out), _truth(nv_fixture, "list"), strict=True))
    assert set(_files(out)) == set(before)  # the same objects, chunks copied as they were
    with pytest.raises(StoreExistsError, match="already exists"):
        repair_store(source, out=out)


def test_out_repairs_a_store_served_over_http(nv_fixture: Path, tmp_path: Path) -> None:
    out = tmp_path / "sink.zarr"
    with StoreServer(nv_fixture) as server:
        url = server.url + "nv_append_sink.zarr"
        assert repair_store(url, dry_run=True).plan.counts == KIND_COUNTS["sink"]
        with pytest.raises(UnsupportedStoreError, match="--out DIR"):
            AtomicDataZarrWriter(url).repair()
        repair_store(url, out=out)
    truth = _truth(nv_fixture, "sink")
    assert all(np.array_equal(g, t) for g, t in zip(_neighbor_lists(out), truth, strict=True))


def test_defragment_it_cannot_pin_down_is_refused(nv_fixture: Path, tmp_path: Path) -> None:
    path = _copy(nv_fixture, "defragment_partial", tmp_path)
    before = _files(path)
    with pytest.raises(RepairError, match=r"3 samples \(physical 1, 3, 4\) cannot be re-based") as err:
        AtomicDataZarrWriter(path).repair()
    assert not isinstance(err.value, AmbiguousRepairError) and err.value.samples == (1, 3, 4)
    assert _files(path) == before
    with pytest.raises(RepairError):
        repair_store(path, out=tmp_path / "copy.zarr")
    assert not (tmp_path / "copy.zarr").exists()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


# -- synthetic stores -----------------------------------------------------------------------------
SMALL = WriteConfig(core=ArrayConfig(chunk_size=64), meta=ArrayConfig(chunk_size=32))


def _as_appended(path: Path, group_starts: list[int]) -> None:
    """Store each sample's neighbor list as nvalchemi's append would: relative to its call's first atom."""
    root = zarr.open_group(path, mode="r+")
    a_ptr, e_ptr = root["meta/atoms_ptr"][:], root["meta/edges_ptr"][:]
    n = a_ptr.size - 1
    first = np.zeros(n, np.int64)
    first[group_starts] = 1
    first[0] = 1
    g = np.maximum.accumulate(np.where(first.astype(bool), np.arange(n), 0))
    nl = root["core/neighbor_list"]
    values = nl[:]
    values -= np.repeat(a_ptr[g], np.diff(e_ptr))[:, None]
    nl[:] = values


def test_ambiguous_samples_are_refused_and_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # sample 1 has no edges; sample 2 holds one edge between its atoms 3 and 4, stored sample-local:
    # [3, 4] reads equally as a batch [1, 2] appended together (local [1, 2]) or alone (local [3, 4]).
    samples = [
        {"positions": np.zeros((n, 3), np.float32), "atomic_numbers": np.ones(n, np.int64),
         "neighbor_list": nl.astype(np.int64).reshape(-1, 2)}
        for n, nl in ((3, np.array([[0, 1], [1, 2], [2, 0]])), (2, np.zeros((0, 2))), (6, np.array([[3, 4]])))
    ]  # fmt: skip
    path = tmp_path / "ambiguous.zarr"
    AtomicDataZarrWriter(path).write(samples)
    _as_appended(path, [2])
    before = _files(path)
    plan = AtomicDataZarrWriter(path).repair(dry_run=True).plan
    assert plan.samples_of(KINDS.index("ambiguous")) == (2,)
    with pytest.raises(AmbiguousRepairError, match=r"1 samples \(physical 2\) fits several ways") as err:
        AtomicDataZarrWriter(path).repair()
    assert err.value.samples == (2,) and isinstance(err.value, ValueError)
    assert _files(path) == before
    with pytest.raises(AmbiguousRepairError):  # sample 2 does not continue sample 0's call: no batch to prefer
        AtomicDataZarrWriter(path).repair(prefer="batch-local")
    with pytest.raises(ConfigError, match="prefer must be one of global, batch-local, sample-local"):
        AtomicDataZarrWriter(path).repair(prefer="local")
    assert main(["repair", str(path)]) == 1  # a finding in the store, not bad input
    out = capsys.readouterr().out
    assert out.startswith("refused: AmbiguousRepairError: Store ") and "--prefer sample-local" in out
    assert _files(path) == before
    report = AtomicDataZarrWriter(path).repair(prefer="sample-local")  # the user knows: one structure per append
    assert report.plan.counts == {"global": 1, "no-edges": 1, "sample-local": 1}
    assert [nl.tolist() for nl in _neighbor_lists(path)] == [[[0, 1], [1, 2], [2, 0]], [], [[3, 4]]]


def test_partial_neighbor_lists_are_repaired_or_refused_never_wrong(tmp_path: Path) -> None:
    """nvalchemi's benchmark recipe (random edges, often missing atoms), appended in calls of mixed sizes."""
    packed = synthetic_samples(200, seed=5, min_atoms=3, max_atoms=30)
    path = tmp_path / "recipe.zarr"
    AtomicDataZarrWriter(path, SMALL).write(packed)
    starts = [37, 38, 39, 120, 121, 150, 151, 152, 153, 170]  # batches and single structures
    _as_appended(path, starts)
    root = zarr.open_group(path, mode="r")
    stored, a_ptr, e_ptr = root["core/neighbor_list"][:], root["meta/atoms_ptr"][:], root["meta/edges_ptr"][:]
    loc = resolve_store(path, read_only=True, must_exist=True)
    from dali_alchemi.store.check.repair_plan import infer
    from dali_alchemi.store.read.open_checks import check_meta

    meta = check_meta(zarr.open_group(path, mode="r"), store=str(path))
    plan = infer(zarr.open_group(path, mode="r"), meta, store=loc.display, window=401)  # many small windows
    refused = set(plan.samples_of(KINDS.index("ambiguous"))) | set(plan.samples_of(KINDS.index("undetermined")))
    local = np.split(packed.fields["neighbor_list"], np.cumsum(packed.n_edges)[:-1])
    for i in set(range(200)) - refused:
        fixed = stored[e_ptr[i] : e_ptr[i + 1]] + plan.offsets[i] - a_ptr[i]
        assert np.array_equal(fixed, local[i]), f"sample {i} ({KINDS[plan.kinds[i]]}) repaired wrongly"
    assert len(refused) < 10, f"{len(refused)} of 200 samples refused"
    assert plan.counts["sample-local"] >= 3 and plan.counts["batch-local"] > 100


def test_in_place_repair_needs_a_local_directory() -> None:
    store: dict = {}
    AtomicDataZarrWriter(store).write(synthetic_samples(5, seed=1, min_atoms=3, max_atoms=6))
    root = zarr.open_group(zarr.storage.MemoryStore(store), mode="r+")
    nl, first = root["core/neighbor_list"], int(root["meta/edges_ptr"][3])
    nl[first:] = nl[first:] - root["meta/atoms_ptr"][3]  # as if samples 3.. were one appended Batch
    with pytest.raises(UnsupportedStoreError, match="out=DIR"):
        AtomicDataZarrWriter(store).repair()


# -- crash safety ---------------------------------------------------------------------------------
# What a reader's snapshot sees when the writer is killed right after each phase, and after recovery:
# the old array until the swap is journaled, the rewritten one from then on.
PHASES = {
    "journal": ("old", "old"), "staged": ("old", "old"), "swapping": ("new", "new"), "retired": ("new", "new"),
    "swapped": ("new", "new"), "committed": ("new", "new"), "done": ("new", "new"),
}  # fmt: skip


def _raw_neighbor_list(path: Path) -> np.ndarray:
    """The neighbor_list a reader opening now would read (journal-aware), as stored."""
    snap = open_snapshot(resolve_store(path, read_only=True, must_exist=True))
    return np.asarray(snap.handles["neighbor_list"].array[:])


def _child(path: str, kill_at: str | None, log: str | None = None, pace_s: float = 0.0) -> None:
    import time

    writer = AtomicDataZarrWriter(path)

    def on_phase(phase: str) -> None:
        if log is not None:
            with open(log, "a") as fh:
                fh.write(phase + "\n")
        if phase == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(pace_s)  # widens the moments between phases, so random kills land inside the operation

    writer.on_phase = on_phase
    writer.repair()
    os._exit(0)


@pytest.mark.parametrize("phase", list(PHASES))
def test_a_repair_killed_at_any_phase_leaves_old_or_new(nv_fixture: Path, tmp_path: Path, phase: str) -> None:
    base = _copy(nv_fixture, "batch", tmp_path / "base")
    old = _raw_neighbor_list(base)
    after = _copy(nv_fixture, "batch", tmp_path / "after")
    AtomicDataZarrWriter(after).repair()
    new = _raw_neighbor_list(after)
    assert not np.array_equal(old, new)
    trial = _copy(nv_fixture, "batch", tmp_path / "trial")
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(str(trial), phase))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL, f"the writer was not killed at {phase!r}"
    expected, recovered = PHASES[phase]
    assert np.array_equal(_raw_neighbor_list(trial), {"old": old, "new": new}[expected])
    AtomicDataZarrWriter(trial).recover()
    assert np.array_equal(_raw_neighbor_list(trial), {"old": old, "new": new}[recovered])
    assert [p.name for p in trial.parent.iterdir()] == [trial.name]  # recovery left nothing beside it
    if recovered == "new":
        truth = _truth(nv_fixture, "batch")
        assert all(np.array_equal(g, t) for g, t in zip(_neighbor_lists(trial), truth, strict=True))
    else:  # the store takes the repair again
        assert AtomicDataZarrWriter(trial).repair().applied


def test_sharded_int32_store_with_deleted_samples(tmp_path: Path) -> None:
    """Whole shards are rewritten; soft-deleted samples (zeroed, as nvalchemi's delete leaves them) stay as they are."""
    packed = synthetic_samples(60, seed=9, min_atoms=4, max_atoms=12)
    packed.fields["neighbor_list"] = packed.fields["neighbor_list"].astype(np.int32)
    path = tmp_path / "sharded.zarr"
    config = WriteConfig(core=ArrayConfig(chunk_size=16, shard_size=64), meta=ArrayConfig(chunk_size=32))
    AtomicDataZarrWriter(path, config).write(packed)
    AtomicDataZarrWriter(path).delete([3, 41])
    _as_appended(path, [20, 21, 40])
    report = AtomicDataZarrWriter(path).repair()
    assert report.plan.counts["deleted"] == 2 and report.plan.changed.size == 60 - 20 - 1  # 41 is deleted
    with AtomicDataZarrReader(path) as reader:
        got = reader.read_packed(np.arange(len(reader)), fields=["neighbor_list"])
    live = np.setdiff1d(np.arange(60), [3, 41])
    local = np.split(packed.fields["neighbor_list"], np.cumsum(packed.n_edges)[:-1])
    assert got.fields["neighbor_list"].dtype == np.int32
    assert np.array_equal(got.fields["neighbor_list"], np.concatenate([local[i] for i in live]))
    assert zarr.open_array(path / "core" / "neighbor_list").shards == (64, 2)


@pytest.mark.stress
@pytest.mark.timeout(1800)
def test_a_repair_killed_at_random_moments_leaves_old_or_new(nv_fixture: Path, tmp_path: Path) -> None:
    import random
    import time

    base = _copy(nv_fixture, "list", tmp_path / "base")
    old = _raw_neighbor_list(base)
    after = _copy(nv_fixture, "list", tmp_path / "after")
    started = time.perf_counter()
    pace = 0.02
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(str(after), None, None, pace))
    proc.start()
    proc.join(60)
    duration = time.perf_counter() - started
    new = _raw_neighbor_list(after)
    rng, reached = random.Random(7), set()
    for k in range(40):  # until kills have landed between several phases (timing varies with load)
        if k >= 10 and len(reached) >= 3:
            break
        trial = _copy(nv_fixture, "list", tmp_path / f"random-{k}")
        log = tmp_path / f"random-{k}.phases"
        proc = multiprocessing.get_context("fork").Process(target=_child, args=(str(trial), None, str(log), pace))
        proc.start()
        time.sleep(rng.uniform(0, duration * 1.1))
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
        proc.join(60)
        phases = log.read_text().split() if log.exists() else []
        reached.add(phases[-1] if phases else "start")
        if not phases:  # killed before the first phase: aim later next time
            duration *= 1.3
        elif phases[-1] == "done":  # finished first: aim earlier
            duration /= 1.3
        seen = _raw_neighbor_list(trial)
        assert np.array_equal(seen, old) or np.array_equal(seen, new), f"trial {k}: neither old nor new"
        AtomicDataZarrWriter(trial).recover()
        seen = _raw_neighbor_list(trial)
        assert np.array_equal(seen, old) or np.array_equal(seen, new), f"trial {k}: after recovery"
        assert [p.name for p in trial.parent.iterdir()] == [trial.name]
    assert len(reached) >= 3, f"random kills only interrupted after {reached}"


def test_values_that_would_not_fit_the_dtype_are_refused_and_leave_nothing(tmp_path: Path) -> None:
    packed = synthetic_samples(40, seed=2, min_atoms=4, max_atoms=8)
    path = tmp_path / "int8.zarr"
    AtomicDataZarrWriter(path).write(packed)
    _as_appended(path, list(range(1, 40)))  # one structure per append: every index is sample-local, < 8
    core = zarr.open_group(path / "core", mode="r+")
    local = core["neighbor_list"][:].astype(np.int8)
    del core["neighbor_list"]
    core.create_array("neighbor_list", data=local)
    before = _files(path)
    with pytest.raises(RepairError, match="re-based neighbor_list values do not fit its dtype int8"):
        AtomicDataZarrWriter(path).repair(prefer="sample-local")
    assert _files(path) == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no journal, no staged copy
