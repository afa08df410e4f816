"""Convert many input files at once: one work unit (an input's structures ``start:stop``) per task, on a
process pool (one node) or a Dask cluster (many), each into a part store of its own; the parts and a
manifest make one dataset, a multi-store (:mod:`dali_alchemi.store.format.multistore`).

- **Units** of about equal size (:func:`~dali_alchemi.interop.convert_units.split_units`), in input order.
- **Parts**: each unit is converted by :func:`~dali_alchemi.interop.ase_io.write_atoms` into
  ``OUT/part-NNNNN``, built beside its path and renamed in, so a part exists only when whole.
- **Fields**: ``missing=`` is applied within each part. Parts that agree on their fields are exactly what
  one process would have written (a field all parts keep, fill or leave out is kept, filled or left
  out over the whole input too); parts that disagree (one has a field another lacks, or fills it) are
  refused with a :class:`~dali_alchemi.errors.SampleDataError` naming them, and the job is not marked
  finished.
- **Resume**: the manifest is written before the first unit and again, atomically, after each one; a
  rerun of the same job (same inputs, unchanged on disk, same options) keeps the parts recorded as
  done and converts the rest; another job into the same folder is refused, naming what differs.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import shutil
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.errors import (
    ConfigError,
    InputNotFoundError,
    PrecisionLossWarning,
    SampleDataError,
    StoreExistsError,
)
from dali_alchemi.interop.ase_io import DEFAULT_CHUNK, ConversionReport, write_atoms
from dali_alchemi.interop.assemble import DEFAULT_TOLERANCE, MISSING_POLICIES, MissingPolicy, warn_precision
from dali_alchemi.interop.convert_units import (
    WorkUnit,
    count_input,
    merge_reports,
    part_size_for,
    read_unit,
    report_from_dict,
    report_to_dict,
    split_units,
)
from dali_alchemi.interop.worker_malloc import plain_malloc
from dali_alchemi.store.format.multistore import is_multistore, read_manifest, write_manifest
from dali_alchemi.store.read.multi import MultiReader

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from dali_alchemi.config import WriteConfig

__all__ = ["convert_parallel", "convert_unit"]


def convert_unit(unit: WorkUnit, out: str, options: dict[str, Any], config: WriteConfig | None) -> dict[str, Any]:
    """Convert one unit into its part store (what a worker runs); its report, as JSON.

    Raises
    ------
    SampleDataError
        If the unit's structures cannot be converted or ASE cannot read them (naming the part and its
        input range), or the file held fewer structures than it was counted to hold.
    """
    with warnings.catch_warnings(), plain_malloc():  # as fast on a Dask worker as in a plain process
        warnings.simplefilter("ignore", PrecisionLossWarning)  # the job warns once, over all parts
        try:
            report = _write_part(unit, Path(out) / unit.name, options, config)
        except SampleDataError as err:
            raise SampleDataError(
                f"{unit.describe()}: {err} (structure numbers here count from structure {unit.start} of the file)"
            ) from err
        except Exception as err:
            if not _raised_in_ase(err):
                raise
            raise SampleDataError(f"ASE could not read {unit.describe()}: {type(err).__name__}: {err}") from err
    if report.structures != unit.structures:
        shutil.rmtree(Path(out) / unit.name, ignore_errors=True)
        raise SampleDataError(
            f"{unit.describe()}: read {report.structures} structures where {unit.structures} were counted (did the "
            "file change, or does a frame not start with its atom count?); nothing of this part was kept"
        )
    return report_to_dict(report)


def _write_part(unit: WorkUnit, part: Path, options: dict[str, Any], config: WriteConfig | None) -> ConversionReport:
    """The unit written to ``part``; once more if a task of a killed run of this job renamed it in meanwhile (a
    Dask task runs on after its client is gone): the coordinator recorded it as not done, so it is redone."""

    def write() -> ConversionReport:
        return write_atoms(
            read_unit(unit.path, unit.start, None if unit.to_end else unit.stop), part, cutoff=options["cutoff"],
            float_dtype=options["float_dtype"], system_float_dtype=options["system_float_dtype"],
            missing=options["missing"], tolerance=options["tolerance"], chunk=options["chunk"], config=config,
        )  # fmt: skip

    try:
        return write()
    except StoreExistsError:
        shutil.rmtree(part, ignore_errors=True)
    return write()


def _raised_in_ase(err: BaseException) -> bool:
    """Whether the innermost frame of ``err``'s traceback is ASE's: the input could not be read or parsed."""
    tb, module = err.__traceback__, ""
    while tb is not None:
        module, tb = tb.tb_frame.f_globals.get("__name__", ""), tb.tb_next
    return module == "ase" or module.startswith("ase.")


def convert_parallel(
    inputs: Iterable[str | Path],
    out: str | Path,
    *,
    workers: int = 1,
    client: Any = None,
    scheduler: str | None = None,
    part_size: int | None = None,
    cutoff: float | None = None,
    float_dtype: DTypeLike = np.float32,
    system_float_dtype: DTypeLike = np.float64,
    missing: MissingPolicy = "error",
    tolerance: float = DEFAULT_TOLERANCE,
    chunk: int = DEFAULT_CHUNK,
    config: WriteConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ConversionReport:
    """Convert ASE-readable files into the multi-store ``out``, one part per work unit, units in parallel.

    ``workers`` processes of this machine convert the units (``1``: this process, one unit after
    another), or, with ``client`` (a ``dask.distributed.Client``) or ``scheduler`` (a Dask scheduler's
    address), the workers of that Dask cluster do; ``out`` must then be a folder every worker can write
    (a shared file system). ``part_size`` is the most structures a part holds (default: the input split
    into two units per worker, at most 100,000 structures each). ``progress`` is called with the
    structures converted so far and the total, after each unit. The other options are those of
    :func:`~dali_alchemi.interop.ase_io.write_atoms`. Reopen ``out`` with any loader or
    :func:`~dali_alchemi.store.read.opening.open_reader`: it reads as one store.

    Raises
    ------
    InputNotFoundError
        If an input does not exist.
    ConfigError
        If ``workers`` is below 1, or both ``client`` and ``scheduler`` are given.
    StoreExistsError
        If ``out`` exists and is not a multi-store of this same job (naming what differs: the inputs,
        their sizes or modification times, or an option).
    SampleDataError
        If the input is empty, a unit fails to convert (naming its part and input range), or the parts
        disagree on their fields (naming the parts and fields).
    FieldMismatchError
        If the parts store a field with different dtypes or row shapes.
    """
    given = [str(p) for p in inputs]
    for name in given:
        if not Path(name).exists():
            raise InputNotFoundError(f"Input {name} does not exist")
    paths = [str(Path(p).resolve()) for p in given]
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    if client is not None and scheduler is not None:
        raise ConfigError("give a Dask client= or a scheduler= address, not both")
    if missing not in MISSING_POLICIES:
        raise ConfigError(f"missing must be one of {', '.join(MISSING_POLICIES)}, got {missing!r}")
    if scheduler is not None:  # a client of our own, so that the cluster's workers size the parts
        from distributed import Client

        with Client(scheduler, set_as_default=False) as own:
            return convert_parallel(
                given, out, client=own, part_size=part_size, cutoff=cutoff, float_dtype=float_dtype,
                system_float_dtype=system_float_dtype, missing=missing, tolerance=tolerance, chunk=chunk,
                config=config, progress=progress,
            )  # fmt: skip
    out = Path(out)
    options = {
        "cutoff": cutoff, "float_dtype": np.dtype(float_dtype).name,
        "system_float_dtype": np.dtype(system_float_dtype).name, "missing": missing, "tolerance": tolerance,
        "chunk": chunk, "config": None if config is None else repr(config),
    }  # fmt: skip
    sources = [_describe_input(p) for p in paths]
    manifest = _resume(out, sources, options, part_size)
    finished = manifest is not None and all(p["done"] and (out / p["name"]).is_dir() for p in manifest["parts"])
    engine_workers = 1 if finished or client is not None else workers  # a finished job's rerun starts no workers
    with _local_pool(engine_workers) as pool, _warm_dask_workers(None if finished else client):
        # the pool's workers, or the cluster's, import the conversion code while the inputs are counted
        if manifest is None:
            counts = [count_input(p) for p in paths]
            if sum(counts) == 0:
                raise SampleDataError("No structures to convert")
            size = part_size or part_size_for(sum(counts), _worker_count(workers, client))
            options_with_size = {**options, "part_size": size}
            units = split_units(paths, counts, size)
            manifest = {"complete": False, "options": options_with_size, "inputs": sources,
                        "parts": [{**_unit_record(u), "done": False} for u in units]}  # fmt: skip
            out.mkdir(parents=True, exist_ok=True)
            write_manifest(out, manifest)
        records = {p["name"]: p for p in manifest["parts"]}
        units = [
            WorkUnit(p["name"], p["input"], paths[p["input"]], p["start"], p["stop"], p["to_end"]) for p in records.values()
        ]
        todo = [u for u in units if not (records[u.name]["done"] and (out / u.name).is_dir())]
        for unit in todo:  # a part renamed in before its record was written, or a record whose part is gone
            records[unit.name]["done"] = False
            shutil.rmtree(out / unit.name, ignore_errors=True)
        total = sum(u.structures for u in units)
        done = total - sum(u.structures for u in todo)
        if progress is not None:
            progress(done, total)
        for unit, report in _run(todo, str(out), options, config, pool, client):
            records[unit.name].update(done=True, structures=report["structures"], report=report)
            write_manifest(out, manifest)
            done += unit.structures
            if progress is not None:
                progress(done, total)
        reports = [report_from_dict(p["report"]) for p in manifest["parts"]]
        _check_parts_agree(units, reports)
        MultiReader([str(out / u.name) for u in units], one_dataset=True).close()  # dtypes and row shapes agree too
        manifest["complete"] = True
        write_manifest(out, manifest)
        merged = merge_reports(reports)
        warn_precision(merged.precision, tolerance)
        return merged


def _describe_input(path: str) -> dict[str, Any]:
    stat = Path(path).stat()
    return {"path": path, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _unit_record(unit: WorkUnit) -> dict[str, Any]:
    return {"name": unit.name, "input": unit.input, "start": unit.start, "stop": unit.stop, "to_end": unit.to_end}


def _resume(
    out: Path, sources: list[dict[str, Any]], options: dict[str, Any], part_size: int | None
) -> dict[str, Any] | None:
    """The manifest of the job already in ``out`` when it is this job (``None`` when ``out`` is new)."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return None
    if not is_multistore(out):
        raise StoreExistsError(
            f"{out} already exists and is not a multi-store this convert started; choose another output or remove it"
        )
    manifest = read_manifest(out)
    recorded = manifest["options"]
    wanted = {**options, "part_size": part_size or recorded.get("part_size")}
    differences = [
        f"{key} {recorded.get(key)!r} then, {value!r} now"
        for key, value in wanted.items()
        if recorded.get(key) != value
    ]
    before = [s["path"] for s in manifest["inputs"]]
    if before != [s["path"] for s in sources]:
        differences.append(f"inputs {before} then, {[s['path'] for s in sources]} now")
    else:
        differences += [
            f"{now['path']} {key} {then[key]} then, {now[key]} now (the file changed)"
            for then, now in zip(manifest["inputs"], sources, strict=True)
            for key in ("size", "mtime_ns")
            if then[key] != now[key]
        ]
    if differences:
        raise StoreExistsError(
            f"{out} holds the parts of another conversion ({'; '.join(differences)}); rerun the same command "
            "to finish that one, or choose another output (or remove it) for this one"
        )
    return manifest


def _worker_count(workers: int, client: Any) -> int:
    return workers if client is None else max(1, len(client.nthreads()))  # every worker, on every distributed


@contextmanager
def _local_pool(workers: int) -> Iterator[cf.ProcessPoolExecutor | None]:
    """``workers`` processes of this machine, started at once (``None`` for one: this process converts).

    Each worker imports the conversion code as it starts (:func:`_start_worker`), so its start-up (about
    a second: ASE, zarr) overlaps the coordinator's own imports and the counting of the inputs.
    """
    if workers == 1:
        yield None
        return
    from dali_alchemi.pipeline.lifetime import WorkerGuard

    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    guard = WorkerGuard.for_current_thread()  # workers end with this process, not convert on after a kill
    with cf.ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_start_worker, initargs=(guard,)
    ) as pool:
        for _ in range(workers):  # the pool starts a process per task submitted while none is idle
            pool.submit(os.getpid)
        yield pool


def _start_worker(guard: Any) -> None:
    """A pool worker's start: bound to its coordinator's life, with the conversion code imported."""
    from dali_alchemi.pipeline.lifetime import arm_worker

    arm_worker(guard)
    _import_conversion_code()


def _import_conversion_code() -> None:
    """Import what converting the first unit would (about a second: ASE, zarr), ahead of it."""
    import ase.io  # noqa: F401

    from dali_alchemi.store.write import writer  # noqa: F401


@contextmanager
def _warm_dask_workers(client: Any) -> Iterator[None]:
    """With a Dask ``client``: every worker imports the conversion code in a task of its own, first.

    Otherwise each worker's first unit pays that second: 0.7-1.0 s of a 1.5-2.5 s unit at 400 structures
    of 108 atoms, about 10% of a 2-worker job of 3,200. The tasks are not waited for (a unit after them
    imports what they did not); they are released when the job ends.
    """
    if client is None:
        yield
        return
    addresses = list(client.nthreads())  # the workers' addresses (scheduler_info() lists at most 5 in some versions)
    warm = [client.submit(_import_conversion_code, workers=[a], pure=False) for a in addresses]
    try:
        yield
    finally:
        client.cancel(warm)


def _run(
    units: list[WorkUnit],
    out: str,
    options: dict[str, Any],
    config: WriteConfig | None,
    pool: cf.ProcessPoolExecutor | None,
    client: Any,
) -> Iterator[tuple[WorkUnit, dict[str, Any]]]:
    """Each unit with its report, as units finish, on the engine asked for."""
    if not units:
        return
    if client is not None:
        from distributed import as_completed

        futures = {client.submit(convert_unit, unit, out, options, config, pure=False): unit for unit in units}
        try:
            for future in as_completed(
                list(futures), loop=client.loop
            ):  # the client's loop: it need not be the default
                yield futures[future], future.result()
        finally:
            client.cancel(list(futures))
    elif pool is None:
        for unit in units:
            yield unit, convert_unit(unit, out, options, config)
    else:
        pending = {pool.submit(convert_unit, unit, out, options, config): unit for unit in units}
        try:
            for future in cf.as_completed(pending):
                yield pending[future], future.result()
        finally:
            for future in pending:
                future.cancel()


def _check_parts_agree(units: Sequence[WorkUnit], reports: Sequence[ConversionReport]) -> None:
    """Refuse parts whose fields differ: they are not one dataset, and one process would have decided otherwise.

    Raises
    ------
    SampleDataError
        Naming the first part, each part that differs from it and how, and the way out.
    """
    first = reports[0].fields
    problems = []
    for unit, report in zip(units[1:], reports[1:], strict=True):
        if report.fields == first:
            continue
        lacks = sorted(set(first) - set(report.fields))
        extra = sorted(set(report.fields) - set(first))
        levels = sorted(n for n in set(first) & set(report.fields) if first[n] != report.fields[n])
        what = [f"lacks {lacks}"] * bool(lacks) + [f"has {extra} besides"] * bool(extra)
        what += [f"stores {levels} at other levels"] * bool(levels)
        problems.append(f"{unit.describe()} {', '.join(what)}")
    if problems:
        raise SampleDataError(
            f"The parts do not have the same fields as {units[0].describe()}: " + "; ".join(problems) + ". The "
            "missing= policy decides within each part, and these parts decided differently (the structures' "
            "fields differ between parts). Give every structure the same fields, or convert these inputs in "
            "one process (without --workers or --scheduler) so the fields are decided over the whole input; "
            "the finished parts are kept, but the output is not marked finished"
        )
