"""Every package module's tests can be found by its name: ``tests/<same folders>/test_<module>.py``,
or, where a module is tested through another (a helper of a command, a private part of a public
class), the entry in :data:`TESTED_BY` below."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dali_alchemi"

TESTED_BY: dict[str, tuple[str, ...]] = {
    "store/read/row_io.py": ("tests/store/read/test_rows.py", "tests/store/read/test_spans.py"),
    "store/read/results.py": ("tests/store/read/test_engine.py", "tests/store/read/test_reader.py"),
    "bench/h2d.py": ("tests/scripts/test_gpu_check.py", "tests/test_cli.py"),
    "bench/loaders.py": ("tests/bench/test_runner.py",),
    "bench/plot.py": ("tests/bench/test_runner.py",),
    "bench/quality.py": ("tests/bench/test_runner.py",),
    "cli/__main__.py": ("tests/test_cli.py",),
    "cli/bench.py": ("tests/test_cli.py", "tests/bench/test_runner.py"),
    "cli/console.py": ("tests/test_cli.py",),
    "cli/repair.py": ("tests/store/write/test_repair.py",),
    "cli/store.py": ("tests/test_cli.py",),
    "cli/verify.py": ("tests/store/check/test_verify.py", "tests/test_cli.py"),
    "collate.py": ("tests/test_batch.py", "tests/pipeline/test_device_collation.py"),
    "interop/ase_fields.py": ("tests/interop/test_ase_io.py",),
    "interop/assemble.py": ("tests/interop/test_ase_io.py",),
    "interop/convert_units.py": ("tests/interop/test_parallel_convert.py",),
    "interop/nvalchemi_batch.py": ("tests/interop/test_frameworks.py", "tests/parity/test_nvalchemi_dataloader.py"),
    "nvalchemi/_atomic.py": ("tests/parity/test_nvalchemi_dataloader.py", "tests/dropin/test_import.py"),
    "nvalchemi/_dataloader.py": ("tests/parity/test_nvalchemi_dataloader.py", "tests/dropin/test_import.py"),
    "nvalchemi/_dataset.py": ("tests/parity/test_nvalchemi_dataloader.py",),
    "pipeline/lifetime.py": ("tests/pipeline/test_signals.py",),
    "plan/arguments.py": ("tests/plan/test_fixed.py", "tests/plan/test_budget.py", "tests/plan/test_mixture.py"),
    "plan/spans.py": ("tests/plan/test_block.py", "tests/plan/test_quality.py"),
    "remote_config.py": ("tests/store/format/test_remote.py", "tests/store/format/test_http.py"),
    "store/check/consistency.py": ("tests/store/check/test_verify.py",),
    "store/check/inventory.py": ("tests/store/check/test_verify.py", "tests/store/test_fuzz.py"),
    "store/check/repair_plan.py": ("tests/store/write/test_repair.py",),
    "store/format/multistore.py": ("tests/store/read/test_multistore.py", "tests/interop/test_parallel_convert.py"),
    "store/format/location.py": ("tests/store/format/test_remote.py", "tests/store/read/test_reader.py"),
    "store/format/protocol.py": ("tests/store/test_reader_contract.py",),
    "store/read/block_reads.py": ("tests/store/read/test_engine.py", "tests/store/read/test_whole.py", "tests/store/read/test_rows.py"),
    "store/read/decoder.py": ("tests/store/read/test_engine.py", "tests/store/read/test_shared.py"),
    "store/read/geometry.py": ("tests/store/read/test_reader.py", "tests/store/read/test_advice.py"),
    "store/read/guards.py": ("tests/store/read/test_reader.py", "tests/store/format/test_generation.py", "tests/store/test_fuzz.py", "tests/store/write/test_repair.py"),
    "store/read/opening.py": ("tests/test_loader_inputs.py", "tests/store/read/test_multi.py", "tests/baseline/test_torch_loader.py"),
    "store/read/pool.py": ("tests/store/read/test_engine.py",),
    "store/read/routes.py": ("tests/store/read/test_engine.py", "tests/store/read/test_rows.py"),
    "store/read/summary.py": ("tests/test_cli.py", "tests/store/test_forward_compat.py"),
    "store/write/append.py": ("tests/store/write/test_writer.py", "tests/store/test_crash_safety.py"),
    "store/write/arrays.py": ("tests/store/write/test_writer.py", "tests/store/test_checksums.py"),
    "store/write/create.py": ("tests/store/write/test_writer.py", "tests/store/test_crash_safety.py"),
    "store/write/custom.py": ("tests/store/write/test_writer.py", "tests/store/test_crash_safety.py"),
    "store/write/defragment.py": ("tests/store/write/test_writer.py", "tests/store/test_crash_safety.py"),
    "store/write/encode.py": ("tests/store/write/test_writer.py",),
    "testing/reader.py": ("tests/store/test_reader_contract.py", "tests/store/read/test_multi.py"),
    "types.py": ("tests/store/format/test_journal.py", "tests/test_config.py"),
}


def _same_name(module: Path) -> Path:
    rel = module.relative_to(PACKAGE)
    folders = ["dropin" if part == "nvalchemi" else part for part in rel.parent.parts]  # cannot shadow nvalchemi
    return ROOT.joinpath("tests", *folders, f"test_{module.stem.lstrip('_')}.py")


def test_every_module_has_tests_found_by_its_name_or_the_map() -> None:
    modules = [p for p in PACKAGE.rglob("*.py") if p.stem != "__init__" and "__pycache__" not in p.parts]
    assert len(modules) > 60
    unfound = []
    for module in modules:
        rel = module.relative_to(PACKAGE).as_posix()
        if not _same_name(module).exists() and rel not in TESTED_BY:
            unfound.append(f"{rel}: add {_same_name(module).relative_to(ROOT)} or an entry in TESTED_BY")
    assert not unfound, unfound


def test_the_map_names_real_modules_and_tests_and_no_module_that_has_its_own() -> None:
    for rel, tests in TESTED_BY.items():
        module = PACKAGE / rel
        assert module.exists(), f"TESTED_BY names {rel}, which is gone"
        assert not _same_name(module).exists(), f"{rel} has {_same_name(module).relative_to(ROOT)}: drop it from TESTED_BY"
        for test in tests:
            assert (ROOT / test).exists(), f"TESTED_BY[{rel!r}] names {test}, which is gone"
