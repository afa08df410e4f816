"""Parallel conversion into a multi-store: the same dataset as a one-process convert, on a process pool and
on a Dask cluster, resumed after a kill, refused when the job differs, and read as one store by the loaders."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ase = pytest.importorskip("ase")

from dali_alchemi.baseline import plain_dataloader  # noqa: E402
from dali_alchemi.bench.synth import write_synthetic_extxyz  # noqa: E402
from dali_alchemi.errors import SampleDataError, StoreExistsError, StoreFormatError  # noqa: E402
from dali_alchemi.interop import parallel_convert  # noqa: E402
from dali_alchemi.interop.ase_io import convert, read_structures  # noqa: E402
from dali_alchemi.interop.convert_units import count_input, split_units  # noqa: E402
from dali_alchemi.interop.parallel_convert import convert_parallel  # noqa: E402
from dali_alchemi.plan.mixture import MixturePlan  # noqa: E402
from dali_alchemi.store.read.multi import MultiReader  # noqa: E402
from dali_alchemi.store.read.opening import open_reader  # noqa: E402

CUTOFF = 3.0


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two extxyz files and an ASE database (read row by row, with its key-value pairs)."""
    import ase.db

    folder = tmp_path_factory.mktemp("inputs")
    paths = [write_synthetic_extxyz(folder / f"in{k}.xyz", 11 + k, seed=k, min_atoms=4, max_atoms=12) for k in range(2)]
    db_path = folder / "in.db"
    with ase.db.connect(str(db_path)) as db:
        for k, atoms in enumerate(read_structures(paths[0])):
            db.write(atoms, temperature=float(atoms.info["temperature"]) + k)
    return [*paths, db_path]


@pytest.fixture(scope="module")
def reference(inputs: list[Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    store = tmp_path_factory.mktemp("one") / "one.zarr"
    convert(inputs, store, cutoff=CUTOFF)
    return _everything(store)


def _everything(source: Any) -> dict[str, Any]:
    reader, _ = open_reader(str(source), fields=None, cache_bytes=None)
    with reader:
        packed = reader.read_packed(np.arange(len(reader)))
        return {"n_atoms": packed.n_atoms, "n_edges": packed.n_edges, **packed.fields}


def _assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for name, values in want.items():
        assert got[name].dtype == values.dtype, name
        np.testing.assert_array_equal(got[name], values, err_msg=name)


def test_units_cut_each_input_into_near_equal_ranges_in_order(inputs: list[Path]) -> None:
    counts = [count_input(p) for p in inputs]
    assert counts == [11, 12, 11]
    units = split_units([str(p) for p in inputs], counts, 5)
    assert [(u.input, u.start, u.stop) for u in units] == [
        (0, 0, 3), (0, 3, 7), (0, 7, 11), (1, 0, 4), (1, 4, 8), (1, 8, 12), (2, 0, 3), (2, 3, 7), (2, 7, 11),
    ]  # fmt: skip
    assert [u.name for u in units[:2]] == ["part-00000", "part-00001"]


def test_workers_2_read_as_one_store_equal_to_one_process(
    inputs: list[Path], reference: dict[str, Any], tmp_path: Path
) -> None:
    seen: list[tuple[int, int]] = []
    report = convert_parallel(
        inputs, tmp_path / "out", workers=2, part_size=5, cutoff=CUTOFF, progress=lambda d, t: seen.append((d, t))
    )
    assert report.structures == 34 and report.atoms == int(reference["n_atoms"].sum())
    assert seen[0] == (0, 34) and seen[-1] == (34, 34) and len(seen) == 10
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["complete"] and [p["structures"] for p in manifest["parts"]] == [3, 4, 4, 4, 4, 4, 3, 4, 4]
    reader, owned = open_reader(str(tmp_path / "out"), fields=None, cache_bytes=None)
    assert owned and isinstance(reader, MultiReader) and reader.one_dataset and len(reader) == 34
    assert "dataset_id" not in reader.field_specs
    reader.close()
    _assert_same(_everything(tmp_path / "out"), reference)


def test_a_dask_local_cluster_writes_the_same_dataset(
    inputs: list[Path], reference: dict[str, Any], tmp_path: Path
) -> None:
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        distributed.Client(cluster) as client,
    ):
        convert_parallel(inputs, tmp_path / "out", client=client, part_size=6, cutoff=CUTOFF)
        convert_parallel(inputs, tmp_path / "by-address", scheduler=cluster.scheduler_address, cutoff=CUTOFF)
        after = client.run(_malloc_state)
        engaged = client.run(_engaged_within)
    assert sorted(after.values()) == [(True, 0, None)] * 2  # the nanny's setting, put back after the units
    assert sorted(engaged.values()) == [(32 << 20, 65536)] * 2  # raised within a task, to come back to 64 KiB
    _assert_same(_everything(tmp_path / "out"), reference)
    _assert_same(_everything(tmp_path / "by-address"), reference)


def _malloc_state() -> tuple[bool, int, Any]:
    from dali_alchemi.interop import worker_malloc

    started_with = worker_malloc._start_environment()  # the nanny's setting, as glibc read it
    return "MALLOC_TRIM_THRESHOLD_" in started_with, worker_malloc._running, worker_malloc._restore


def _engaged_within() -> tuple[int, int] | None:
    from dali_alchemi.interop import worker_malloc

    with worker_malloc.plain_malloc():
        restore = worker_malloc._restore
    return None if restore is None else (worker_malloc.MMAP_THRESHOLD_BYTES, restore[0])


class _RecordingClient:
    """Stands in for a Dask client: two workers; records what is submitted where, and what is cancelled."""

    def __init__(self) -> None:
        self.submitted: list[tuple[Any, list[str], bool]] = []
        self.cancelled: list[Any] = []

    def nthreads(self) -> dict[str, int]:
        return {"tcp://a:1": 1, "tcp://b:2": 1}

    def submit(self, fn: Any, *, workers: list[str], pure: bool) -> str:
        self.submitted.append((fn, workers, pure))
        return f"future-{len(self.submitted)}"

    def cancel(self, futures: list[Any]) -> None:
        self.cancelled.extend(futures)


def test_every_dask_worker_imports_the_conversion_code_before_its_first_unit() -> None:
    client = _RecordingClient()
    with parallel_convert._warm_dask_workers(client):
        assert [(fn.__name__, workers, pure) for fn, workers, pure in client.submitted] == [
            ("_import_conversion_code", ["tcp://a:1"], False), ("_import_conversion_code", ["tcp://b:2"], False),
        ]  # fmt: skip
        assert client.cancelled == []
    assert client.cancelled == ["future-1", "future-2"]  # released with the job
    with parallel_convert._warm_dask_workers(None):  # a process pool warms its workers itself
        pass


def test_a_killed_run_resumes_keeping_the_parts_it_finished(
    inputs: list[Path], reference: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    real = parallel_convert.convert_unit

    def dies_at_the_third(unit: Any, *args: Any) -> dict[str, Any]:
        if unit.name == "part-00002":
            raise KeyboardInterrupt  # the job killed while this unit converts
        return real(unit, *args)

    monkeypatch.setattr(parallel_convert, "convert_unit", dies_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        convert_parallel(inputs, out, part_size=5, cutoff=CUTOFF)
    with pytest.raises(StoreFormatError, match=r"has not finished \(2 of 9 parts written\); run the same convert"):
        open_reader(str(out), fields=None, cache_bytes=None)
    kept = {name: os.stat(out / name / "zarr.json") for name in ("part-00000", "part-00001")}
    monkeypatch.setattr(parallel_convert, "convert_unit", real)
    done: list[int] = []
    convert_parallel(inputs, out, part_size=5, cutoff=CUTOFF, progress=lambda d, t: done.append(d))
    assert done[0] == 7  # the two finished parts (3 + 4 structures) were not converted again
    for name, before in kept.items():
        after = os.stat(out / name / "zarr.json")
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    _assert_same(_everything(out), reference)


def test_rerunning_a_finished_job_starts_no_workers_and_converts_nothing(
    inputs: list[Path], reference: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    first = convert_parallel(inputs, out, part_size=5, cutoff=CUTOFF)
    pools: list[int] = []
    real_pool = parallel_convert._local_pool

    def counted_pool(workers: int) -> Any:
        pools.append(workers)
        return real_pool(workers)

    def must_not_run(*args: Any) -> dict[str, Any]:
        raise AssertionError("a finished part was converted again")

    monkeypatch.setattr(parallel_convert, "_local_pool", counted_pool)
    monkeypatch.setattr(parallel_convert, "convert_unit", must_not_run)
    done: list[int] = []
    again = convert_parallel(inputs, out, workers=2, part_size=5, cutoff=CUTOFF, progress=lambda d, t: done.append(d))
    assert pools == [1]  # no process pool for a job with nothing left
    assert done == [first.structures] == [34]  # everything already done (11 + 12 + 11 structures)
    assert again.structures == first.structures
    _assert_same(_everything(out), reference)


def test_another_job_into_the_same_output_is_refused(inputs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert_parallel(inputs[:1], out, part_size=6, cutoff=CUTOFF)
    with pytest.raises(StoreExistsError, match=r"another conversion \(cutoff 3.0 then, 4.0 now\); rerun the same"):
        convert_parallel(inputs[:1], out, part_size=6, cutoff=4.0)
    with pytest.raises(StoreExistsError, match=r"inputs \[.*in0.xyz'\] then, \[.*in0.xyz', .*in1.xyz'\] now"):
        convert_parallel(inputs[:2], out, part_size=6, cutoff=CUTOFF)
    (out / "store.zarr").mkdir()
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "x").write_text("")
    with pytest.raises(StoreExistsError, match="already exists and is not a multi-store this convert started"):
        convert_parallel(inputs[:1], plain, cutoff=CUTOFF)


def test_parts_that_decide_their_fields_differently_are_refused(tmp_path: Path) -> None:
    from ase.build import bulk
    from ase.io import write

    with_charge, without = [], []
    for k in range(4):
        atoms = bulk("Cu", "fcc", a=3.6 + 0.01 * k)
        (with_charge if k < 2 else without).append(atoms)
        if k < 2:
            atoms.info["charge"] = float(k)
    write(tmp_path / "a.xyz", with_charge)
    write(tmp_path / "b.xyz", without)
    files = [tmp_path / "a.xyz", tmp_path / "b.xyz"]
    with pytest.raises(SampleDataError, match=r"part-00001 \(.*b.xyz structures 0:2\) lacks \['charge'\]") as err:
        convert_parallel(files, tmp_path / "out", part_size=2, missing="fill")
    assert "convert these inputs in one process" in str(err.value)
    assert not json.loads((tmp_path / "out" / "manifest.json").read_text())["complete"]


@pytest.mark.dali
def test_the_loaders_read_the_multistore_as_one_store(
    inputs: list[Path], reference: dict[str, Any], tmp_path: Path
) -> None:
    from dali_alchemi.pipeline.loader import DALIDataLoader

    out = tmp_path / "out"
    convert_parallel(inputs, out, part_size=5, cutoff=CUTOFF)
    loader = plain_dataloader(str(out), batch_size=8, shuffle=False, num_workers=0)
    energies = np.concatenate([batch["energy"].numpy().reshape(-1) for batch in loader])
    np.testing.assert_array_equal(energies, reference["energy"].reshape(-1))
    with DALIDataLoader(str(out), batch_size=8, shuffle=False, num_workers=0, device="cpu") as dali:
        assert not isinstance(dali.plan, MixturePlan)
        batches = list(dali)
    assert sum(b.num_graphs for b in batches) == 34
    positions = np.concatenate([b["positions"].numpy() for b in batches])
    np.testing.assert_array_equal(positions, reference["positions"])


def test_frames_the_count_missed_are_refused_not_left_out(
    inputs: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel_convert, "count_input", lambda path: count_input(path) - 2)  # a count that fell short
    with pytest.raises(SampleDataError, match=r"part-00001 \(.*in0.xyz structures 4:9\): read 7 structures where 5"):
        convert_parallel(inputs[:1], tmp_path / "out", part_size=5)
    assert not (tmp_path / "out" / "part-00001").exists()


def test_a_part_a_killed_runs_straggler_renamed_in_is_converted_again(inputs: list[Path], tmp_path: Path) -> None:
    unit = split_units([str(inputs[0])], [11], 11)[0]
    options = {"cutoff": None, "float_dtype": "float32", "system_float_dtype": "float64", "missing": "error",
               "tolerance": 1e-4, "chunk": 1000}  # fmt: skip
    parallel_convert.convert_unit(unit, str(tmp_path), options, None)  # a task of the killed run, finishing late
    (tmp_path / unit.name / "written-by-the-killed-run").write_text("")
    report = parallel_convert.convert_unit(unit, str(tmp_path), options, None)
    assert report["structures"] == 11 and (tmp_path / unit.name / "zarr.json").is_file()
    assert not (tmp_path / unit.name / "written-by-the-killed-run").exists()  # this run's part, not the late one


def test_a_conversion_worker_starts_without_torch_or_dali() -> None:
    # what each of a job's processes imports before its first unit; torch alone would add a second
    import subprocess
    import sys

    code = (
        "import sys, ase.io, dali_alchemi.interop.parallel_convert, dali_alchemi.store.write.writer; "
        "print(sorted(m for m in ('torch', 'nvidia.dali') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
