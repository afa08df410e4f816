from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dali_alchemi.cli import main


def test_synth_then_inspect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    store = tmp_path / "s.zarr"
    assert main(["synth", str(store), "--n", "25", "--seed", "1"]) == 0
    assert main(["inspect", str(store)]) == 0
    out = capsys.readouterr().out
    assert "samples: 25" in out
    assert "core/positions" in out and "atom" in out and "float32" in out
    assert "blosc(clevel=5,cname=lz4,shuffle=shuffle)" in out and "on disk:" in out


def test_synth_writes_the_codec_chunks_and_shards_asked_for(tmp_path: Path) -> None:
    import zarr

    store = tmp_path / "raw.zarr"
    args = ["synth", str(store), "--n", "30", "--codec", "none", "--chunk-size", "64", "--shard-size", "256"]
    assert main(args) == 0
    positions = zarr.open_array(store / "core" / "positions", mode="r")
    assert positions.shards == (256, 3) and positions.chunks == (64, 3)
    assert [c.to_dict()["name"] for c in positions.metadata.codecs[0].codecs] == ["bytes", "crc32c"]
    assert zarr.open_array(store / "meta" / "atoms_ptr", mode="r").metadata.codecs[1].to_dict()["name"] == "blosc"


def test_errors_are_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "missing.zarr")]) == 2
    assert "StoreNotFoundError" in capsys.readouterr().out
    store = tmp_path / "s.zarr"
    main(["synth", str(store), "--n", "2"])
    assert main(["synth", str(store), "--n", "2"]) == 2
    assert "already exists" in capsys.readouterr().out


def _no_line_cut(out: str, *names: str) -> None:
    """Each name appears whole, and no cell was shortened to an ellipsis."""
    assert "…" not in out, out
    for name in names:
        assert name in out, f"{name!r} missing from:\n{out}"


def test_inspect_piped_keeps_whole_names(
    small_store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")  # a narrow COLUMNS must not narrow output that goes to a file
    assert main(["inspect", str(small_store)]) == 0
    out = capsys.readouterr().out
    _no_line_cut(out, "meta/atoms_ptr", "meta/samples_mask", "core/atomic_numbers", "core/neighbor_list")
    row = next(line for line in out.splitlines() if "meta/atoms_ptr" in line)
    assert "int64" in row and "blosc(clevel=5,cname=lz4,shuffle=shuffle)" in row, "a row spans one line"


def test_bench_piped_keeps_whole_loader_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    loaders = ["torch-batched-w0", "packed", "decode"]
    assert main(["bench", "--n", "120", "--rounds", "1", "--epochs", "1", "--batch-size", "16",
                 "--loaders", ",".join(loaders), "--step-ms", "0.1"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    _no_line_cut(out, *loaders, "warm structures/s", "first batch s", "peak PSS MB", "epoch / steps")
    header = next(line for line in out.splitlines() if "loader" in line and "structures/s" in line)
    assert "epoch / steps" in header, "the header spans one line"
    rows = [line for line in out.splitlines() if "torch-batched-w0" in line]
    assert len(rows) == 1 and "shuffle" in rows[0] and "1.00" in rows[0]
    assert "starting" not in out, "no progress bar off a terminal"


def test_augment_cost_piped(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "20")
    assert main(["augment-cost", "--batch-size", "4", "--repeats", "1", "--device", "cpu"]) == 0
    _no_line_cut(capsys.readouterr().out, "augmentation", "ms per batch", "position noise", "all three")


def test_h2d_without_a_gpu_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert main(["h2d", "--n", "10"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: h2d") and "needs a CUDA GPU" in out


def test_bench_on_a_missing_gpu_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert main(["bench", "--n", "10", "--device", "cuda"]) == 2
    assert capsys.readouterr().out.startswith("error: --device cuda")


def test_convert_unreadable_inputs_are_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ase")
    junk, empty = tmp_path / "junk.extxyz", tmp_path / "empty.extxyz"
    junk.write_text("garbage here\nnot an xyz file\n")
    empty.write_text("")
    assert main(["convert", str(junk), str(tmp_path / "a.zarr")]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: ASE could not read") and str(junk) in out and "XYZError" in out
    assert main(["convert", str(empty), str(tmp_path / "b.zarr")]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error:") and str(empty) in out and "is empty" in out
    assert not (tmp_path / "a.zarr").exists() and not (tmp_path / "b.zarr").exists()


def test_markup_in_an_error_message_is_printed_as_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "[bold]x.zarr")]) == 2
    assert "[bold]x.zarr" in capsys.readouterr().out


HEAVY = ("torch", "zarr", "numpy", "nvidia.dali", "dali_alchemi.store.read.reader", "dali_alchemi.bench.loaders")
CHECK_HELP = f"""
import contextlib, io, sys
from dali_alchemi.cli import build_parser
parser = build_parser()
for command in ("synth", "rewrite", "inspect", "verify", "bench", "h2d", "convert", "augment-cost"):
    with contextlib.redirect_stdout(io.StringIO()) as text, contextlib.suppress(SystemExit):
        parser.parse_args([command, "--help"])
    assert text.getvalue().startswith("usage: dali-alchemi " + command), text.getvalue()
print(sorted(name for name in {HEAVY!r} if name in sys.modules))
"""


def test_help_imports_nothing_heavy() -> None:
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", CHECK_HELP], cwd=root, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"argument parsing imported {result.stdout.strip()}"
    result = subprocess.run(
        [sys.executable, "-m", "dali_alchemi.cli", "synth", "--help"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: dali-alchemi synth"), result.stderr


def test_augment_cost_writes_its_medians(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "augment.json"
    assert main(["augment-cost", "--device", "cpu", "--batch-size", "4", "--repeats", "1", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    assert [r["augmentation"] for r in records] == ["rotation", "position noise", "translation", "all three"]
    assert all(r["device"] == "cpu" and r["batch_size"] == 4 and r["ms_per_batch"] > 0 for r in records)
    assert "ms per batch" in capsys.readouterr().out


def test_verify_reports_damage_and_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    store = tmp_path / "s.zarr"
    assert main(["synth", str(store), "--n", "30", "--seed", "2"]) == 0
    capsys.readouterr()
    assert main(["verify", str(store)]) == 0
    out = capsys.readouterr().out
    assert "30 structures (30 live)" in out and "ok: no problems found" in out and "checksums: crc32c" in out
    chunk = store / "core" / "forces" / "c" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-40])  # truncated: inspect still exits 0 on this
    assert main(["inspect", str(store)]) == 0
    capsys.readouterr()
    assert main(["verify", str(store)]) == 1
    out = capsys.readouterr().out
    _no_line_cut(out, "corrupt-chunk", "core/forces/c/0/0", "1 problem found")
    assert "starting" not in out and "verifying" not in out, "no progress bar off a terminal"
    assert main(["verify", str(store), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["samples"] == 30
    assert [(p["kind"], p["array"], p["chunk"]) for p in report["problems"]] == [
        ("corrupt-chunk", "core/forces", "core/forces/c/0/0")
    ]


def test_verify_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], small_store: Path) -> None:
    assert main(["verify", str(tmp_path / "missing.zarr")]) == 2
    assert "StoreNotFoundError" in capsys.readouterr().out
    assert main(["verify", str(small_store), "--max-problems", "0"]) == 2
    assert capsys.readouterr().out.startswith("error: --max-problems")
def test_repair_dry_run_then_repair_then_nothing_left(
    nv_fixture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    store = tmp_path / "single.zarr"
    shutil.copytree(nv_fixture / "nv_append_single.zarr", store)
    assert main(["repair", str(store), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sample-local: 8" in out and "8 samples (45 edge rows) to re-base" in out and "nothing written" in out
    assert main(["inspect", str(store)]) == 0  # untouched: still the appended store
    assert main(["repair", str(store)]) == 0
    assert f"repaired: {store}" in capsys.readouterr().out
    assert main(["repair", str(store)]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    copy = tmp_path / "copy.zarr"
    assert main(["repair", str(store), "--out", str(copy)]) == 0 and (copy / "zarr.json").exists()


def test_repair_refusal_lists_the_samples_and_exits_2(
    nv_fixture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = nv_fixture / "nv_append_defragment_partial.zarr"
    assert main(["repair", str(store), "--dry-run"]) == 2
    out = capsys.readouterr().out
    assert "undetermined samples (physical): 1, 3, 4" in out and "would refuse" in out
    assert main(["repair", str(store), "--out", str(tmp_path / "x.zarr")]) == 2
    assert "RepairError" in capsys.readouterr().out and not (tmp_path / "x.zarr").exists()


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"dali-alchemi {version('dali-alchemi')}"


def test_progress_counts_show_no_total_until_it_is_known() -> None:
    from rich.progress import Progress

    from dali_alchemi.cli.console import CountColumn

    column = CountColumn("chunks")
    with Progress(column, disable=True) as bar:
        task_id = bar.add_task("verifying", total=None)
        task = bar.tasks[0]
        assert column.render(task).plain == "0 chunks"
        bar.update(task_id, completed=1234, total=5678)
        assert column.render(task).plain == "1,234/5,678 chunks"


def test_verify_of_a_directory_that_is_no_store_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "not-a-store").mkdir()
    assert main(["verify", str(tmp_path / "not-a-store")]) == 1
    out = capsys.readouterr().out
    assert "0 structures" not in out and "checksums" not in out  # nothing was checked, so no summary
    assert "is not a zarr group" in out and "dali-alchemi convert INPUT... OUT.zarr" in out


def _bench_like_table() -> Any:
    from dali_alchemi.cli.console import make_table

    table = make_table(
        "loader", "order", "structures/s", "warm structures/s", "atoms/s", "x plain", "first batch s", "total s",
        "peak PSS MB", "quality", "batch KS", title="batch 64, cpu, 1 epoch, 1 round",
    )  # fmt: skip
    table.add_row("torch-batched-w2", "shuffle", "113,814", "120,000", "6,281,234", "8.40", "0.66", "12.34", "1,114", "0.896", "0.012")  # fmt: skip
    table.add_row("dali", "block", "3,814", "4,000", "281,234", "1.00", "0.66", "2.34", "914", "0.021", "-")
    return table


@pytest.mark.parametrize("width", [80, 60])
def test_a_wide_table_folds_its_columns_on_a_narrow_terminal_and_breaks_no_number(width: int) -> None:
    import io

    from rich.console import Console

    from dali_alchemi.cli.console import print_table

    out = io.StringIO()
    print_table(Console(file=out, force_terminal=True, width=width, color_system=None), _bench_like_table(), keys=2)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width
    cells = [cell.strip() for line in lines if line.startswith("│") for cell in line.strip("│").split("│")]
    for number in ("113,814", "6,281,234", "3,814", "281,234", "1,114", "0.896", "12.34"):
        assert number in cells, f"{number} is broken or missing"
    assert cells.count("torch-batched-w2") >= 2  # every part names the row


def test_a_wide_table_stays_one_table_off_a_terminal() -> None:
    import io

    from rich.console import Console

    from dali_alchemi.cli.console import LOG_WIDTH, print_table

    out = io.StringIO()
    print_table(Console(file=out, width=LOG_WIDTH, soft_wrap=True), _bench_like_table(), keys=2)
    rows = [line for line in out.getvalue().splitlines() if "torch-batched-w2" in line]
    assert len(rows) == 1 and "6,281,234" in rows[0] and "0.012" in rows[0]
