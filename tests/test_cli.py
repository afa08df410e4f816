from __future__ import annotations

import errno
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dali_alchemi.cli import main
from dali_alchemi.store.write.refusals import REFUSALS


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
    loaders = ["torch-batched-w0", "packed", "packed-sequential"]
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


def test_convert_with_workers_writes_a_multistore_inspect_and_verify_read_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ase")
    from dali_alchemi.bench.synth import write_synthetic_extxyz

    monkeypatch.setenv("COLUMNS", "200")
    inputs = [
        str(write_synthetic_extxyz(tmp_path / f"in{k}.xyz", 6, seed=k, min_atoms=3, max_atoms=6)) for k in range(2)
    ]
    out = str(tmp_path / "out")
    command = ["convert", *inputs, out, "--workers", "1", "--part-size", "4", "--cutoff", "3"]
    assert main(command) == 0
    assert "wrote 12 structures" in capsys.readouterr().out
    assert main(["inspect", out]) == 0
    text = capsys.readouterr().out
    assert "a multi-store of 4 parts, read as one store" in text and "samples: 12" in text and "part-00003" in text
    assert main(["verify", out]) == 0
    assert capsys.readouterr().out.count("ok: no problems found") == 4
    assert main(command) == 0  # the same job again: every part is done, nothing converted twice
    assert "wrote 12 structures" in capsys.readouterr().out
    assert main([*command[:-1], "4"]) == 2
    assert "StoreExistsError" in (text := capsys.readouterr().out) and "cutoff 3.0 then, 4.0 now" in text
    assert main(["convert", *inputs, str(tmp_path / "single.zarr"), "--part-size", "4"]) == 2
    assert "--part-size sizes the parts of a parallel convert: give --workers or --scheduler" in capsys.readouterr().out
    assert main(["convert", *inputs, str(tmp_path / "w0"), "--workers", "0"]) == 2
    assert "--workers must be >= 1, got 0" in capsys.readouterr().out


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
    assert main(["repair", str(store), "--dry-run"]) == 1  # found neighbor lists to re-base
    out = capsys.readouterr().out
    assert "sample-local: 8" in out and "8 samples (45 edge rows) to re-base" in out and "nothing written" in out
    assert "to re-base them: dali-alchemi repair STORE" in out
    assert main(["inspect", str(store)]) == 0  # untouched: still the appended store
    assert main(["repair", str(store)]) == 0
    assert f"repaired: {store}" in capsys.readouterr().out
    assert main(["repair", str(store)]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    assert main(["repair", str(store), "--dry-run"]) == 0  # nothing left to find
    assert "0 samples (0 edge rows) to re-base" in capsys.readouterr().out
    copy = tmp_path / "copy.zarr"
    assert main(["repair", str(store), "--out", str(copy)]) == 0 and (copy / "zarr.json").exists()


def test_repair_refusal_lists_the_samples_and_exits_1(
    nv_fixture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = nv_fixture / "nv_append_defragment_partial.zarr"
    assert main(["repair", str(store), "--dry-run"]) == 1  # the store's damage, found: not bad input
    out = capsys.readouterr().out
    assert "undetermined samples (physical): 1, 3, 4" in out and "would refuse" in out
    assert main(["repair", str(store), "--out", str(tmp_path / "x.zarr")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("refused: RepairError: Store ") and "nothing was changed" in out
    assert not (tmp_path / "x.zarr").exists()


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
    assert main(["verify", str(tmp_path / "not-a-store")]) == 2  # no store to check: bad input, as inspect says
    out = capsys.readouterr().out
    assert "0 structures" not in out and "checksums" not in out  # nothing was checked, so no summary
    assert out.startswith(f"error: NotAStoreError: Store {tmp_path / 'not-a-store'} is not a zarr group")
    assert "dali-alchemi convert INPUT... OUT.zarr" in out


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


class Paths:
    """The paths an exit-code case runs on, each made when a case asks for it."""

    def __init__(self, tmp: Path, small_store: Path) -> None:
        self.tmp, self.small = tmp, small_store

    def new(self, name: str = "new.zarr") -> str:
        return str(self.tmp / name)

    def missing(self) -> str:
        return str(self.tmp / "missing.zarr")

    def file(self, text: str = "not a store") -> str:
        path = self.tmp / "afile"
        path.write_text(text)
        return str(path)

    def empty(self) -> str:
        path = self.tmp / "empty"
        path.mkdir(exist_ok=True)
        return str(path)

    def copy(self) -> str:
        import shutil

        path = self.tmp / "copy.zarr"
        if not path.exists():
            shutil.copytree(self.small, path)
        return str(path)

    def truncated(self) -> str:
        """A store the reader opens, with a chunk cut short (found only by decoding it)."""
        store = Path(self.copy())
        chunk = next(p for p in sorted((store / "core" / "forces" / "c").rglob("*")) if p.is_file())
        chunk.write_bytes(chunk.read_bytes()[:-40])
        return str(store)

    def refused(self) -> str:
        """A store the reader refuses to open: float ``atomic_numbers``."""
        store = Path(self.copy())
        meta = store / "core" / "atomic_numbers" / "zarr.json"
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "data_type": "float64"}))
        return str(store)

    def extxyz(self) -> str:
        pytest.importorskip("ase")
        from dali_alchemi.bench.synth import write_synthetic_extxyz

        return str(write_synthetic_extxyz(self.tmp / "in.extxyz", 3, seed=0))

    def nv(self, name: str) -> str:
        from tests.conftest import NV_FIXTURE_DIR

        if not (NV_FIXTURE_DIR / name).exists():
            pytest.skip(f"nvalchemi fixture {name} not found")
        return str(NV_FIXTURE_DIR / name)


OK, PROBLEMS, BAD = 0, 1, 2
BENCH = ["--rounds", "1", "--epochs", "1", "--batch-size", "8", "--loaders", "packed"]
EXIT_CASES: dict[str, tuple[int, Callable[[Paths], list[str]], str]] = {
    # id: (exit status, the command line, a text its output holds; a usage error's is argparse's, on stderr)
    "synth": (OK, lambda p: ["synth", p.new(), "--n", "5"], "wrote 5 synthetic structures"),
    "synth over a store": (BAD, lambda p: ["synth", p.copy(), "--n", "5"], "error: StoreExistsError: "),
    "synth under a file": (BAD, lambda p: ["synth", p.file() + "/x.zarr", "--n", "5"], "error: FileExistsError: "),
    "synth --n 0": (BAD, lambda p: ["synth", p.new(), "--n", "0"], "error: ConfigError: "),
    "synth bad option": (BAD, lambda p: ["synth", p.new(), "--nope"], "error: unrecognized arguments: --nope"),
    "rewrite": (OK, lambda p: ["rewrite", str(p.small), p.new(), "--quiet"], "rewrote 300 samples"),
    "rewrite missing": (BAD, lambda p: ["rewrite", p.missing(), p.new()], "error: StoreNotFoundError: "),
    "rewrite refused": (BAD, lambda p: ["rewrite", p.refused(), p.new()], "error: StoreFormatError: "),
    "rewrite onto itself": (BAD, lambda p: ["rewrite", p.copy(), p.copy()], "error: ConfigError: "),
    "rewrite bad layout": (BAD, lambda p: ["rewrite", p.copy(), p.new(), "--layout", "x"], "usage: dali-alchemi rewrite"),
    "inspect": (OK, lambda p: ["inspect", str(p.small)], "samples: 300"),
    "inspect missing": (BAD, lambda p: ["inspect", p.missing()], "error: StoreNotFoundError: "),
    "inspect a file": (BAD, lambda p: ["inspect", p.file()], "error: StoreFormatError: "),
    "inspect an empty folder": (BAD, lambda p: ["inspect", p.empty()], "error: NotAStoreError: "),
    "inspect refused": (BAD, lambda p: ["inspect", p.refused()], "error: StoreFormatError: "),
    "inspect bad option": (BAD, lambda p: ["inspect", p.copy(), "--nope"], "error: unrecognized arguments: --nope"),
    "verify": (OK, lambda p: ["verify", str(p.small)], "ok: no problems found"),
    "verify truncated chunk": (PROBLEMS, lambda p: ["verify", p.truncated()], "corrupt-chunk"),
    "verify refused": (PROBLEMS, lambda p: ["verify", p.refused()], "float64, which cannot hold atomic_numbers"),
    "verify missing": (BAD, lambda p: ["verify", p.missing()], "error: StoreNotFoundError: "),
    "verify a file": (BAD, lambda p: ["verify", p.file()], "error: StoreFormatError: "),
    "verify an empty folder": (BAD, lambda p: ["verify", p.empty()], "error: NotAStoreError: "),
    "verify --max-problems 0": (BAD, lambda p: ["verify", p.copy(), "--max-problems", "0"], "error: --max-problems"),
    "verify bad option": (BAD, lambda p: ["verify", p.copy(), "--nope"], "error: unrecognized arguments: --nope"),
    "repair --dry-run, nothing": (OK, lambda p: ["repair", p.copy(), "--dry-run"], "0 samples (0 edge rows)"),
    "repair --dry-run, finds": (PROBLEMS, lambda p: ["repair", p.nv("nv_append_single.zarr"), "--dry-run"], "8 samples"),
    "repair refuses": (
        PROBLEMS, lambda p: ["repair", p.nv("nv_append_defragment_partial.zarr"), "--out", p.new()], "refused: "
    ),
    "repair missing": (BAD, lambda p: ["repair", p.missing()], "error: StoreNotFoundError: "),
    "repair a file": (BAD, lambda p: ["repair", p.file()], "error: StoreFormatError: "),
    "repair --out a store": (BAD, lambda p: ["repair", p.copy(), "--out", p.copy()], "error: StoreExistsError: "),
    "repair bad prefer": (BAD, lambda p: ["repair", p.copy(), "--prefer", "x"], "usage: dali-alchemi repair"),
    "convert": (OK, lambda p: ["convert", p.extxyz(), p.new()], "wrote 3 structures"),
    "convert missing": (BAD, lambda p: ["convert", p.missing(), p.new()], "error: InputNotFoundError: "),
    "convert empty": (BAD, lambda p: ["convert", p.file(""), p.new()], "is empty: there are no structures"),
    "convert bad option": (BAD, lambda p: ["convert", "x", p.new(), "--missing", "x"], "usage: dali-alchemi convert"),
    "bench": (OK, lambda p: ["bench", str(p.small), *BENCH], "packed"),
    "bench missing": (BAD, lambda p: ["bench", p.missing(), *BENCH], "error: StoreNotFoundError: "),
    "bench refused": (BAD, lambda p: ["bench", p.refused(), *BENCH], "error: StoreFormatError: "),
    "bench unknown loader": (BAD, lambda p: ["bench", str(p.small), "--loaders", "nope"], "error: ConfigError: "),
    "bench bad option": (BAD, lambda p: ["bench", "--epochs", "x"], "usage: dali-alchemi bench"),
    "h2d missing": (BAD, lambda p: ["h2d", p.missing(), "--n", "10"], "error: "),  # no GPU, or no store
    "h2d bad option": (BAD, lambda p: ["h2d", "--epochs", "x"], "usage: dali-alchemi h2d"),
    "plan-cost": (OK, lambda p: ["plan-cost", "--n", "200", "--repeats", "1"], "budget max_atoms=4096"),
    "plan-cost --n 0": (BAD, lambda p: ["plan-cost", "--n", "0"], "usage: dali-alchemi plan-cost"),
    "plan-cost --max-atoms 0": (BAD, lambda p: ["plan-cost", "--n", "20", "--max-atoms", "0"], "error: PlanError: "),
    "augment-cost": (OK, lambda p: ["augment-cost", "--batch-size", "2", "--repeats", "1", "--device", "cpu"], "all three"),
    "augment-cost --repeats 0": (BAD, lambda p: ["augment-cost", "--repeats", "0"], "usage: dali-alchemi augment-cost"),
    "augment-cost bad device": (BAD, lambda p: ["augment-cost", "--device", "bogus"], "error: --device bogus"),
}  # fmt: skip
"""Every command under the one exit-status rule: 0 done, nothing wrong; 1 ran and found damage in a store;
2 could not do its job (bad usage or options, no readable store at the path, a destination it cannot write)."""


def _exit_status(argv: list[str]) -> int:
    """What ``dali-alchemi ARGV`` exits with: main's status, or argparse's for a usage error."""
    try:
        return main(argv)
    except SystemExit as exited:
        return int(exited.code or 0)


@pytest.mark.parametrize("case", list(EXIT_CASES))
def test_every_command_exits_0_ok_1_problems_found_2_bad_input(
    case: str, tmp_path: Path, small_store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    expected, command_line, text = EXIT_CASES[case]
    argv = command_line(Paths(tmp_path, small_store))
    assert argv[0] == case.split()[0], "a case is named after its command"
    status = _exit_status(argv)
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert status == expected, out
    assert text in out, out
    assert "Traceback" not in out and "StorePath(" not in out and "LocalStore" not in out, out
    if expected == BAD and not captured.err.startswith("usage: dali-alchemi"):  # else argparse's usage error
        assert captured.out.startswith("error: ") and captured.out.count("\n") == 1, "one line, `error: ...`"


def test_the_exit_status_table_covers_every_command() -> None:
    import argparse

    from dali_alchemi.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    statuses: dict[str, set[int]] = {}
    for case, (status, _, _) in EXIT_CASES.items():
        statuses.setdefault(case.split()[0], set()).add(status)
    assert set(statuses) == set(subparsers.choices)
    for command, found in statuses.items():
        assert BAD in found, f"{command}: no case of bad input"
        assert OK in found or command == "h2d", f"{command}: no case that succeeds"  # h2d needs a GPU


WRITES: dict[str, Callable[[Paths], list[str]]] = {
    "synth": lambda p: ["synth", p.new(), "--n", "5"],
    "convert": lambda p: ["convert", p.extxyz(), p.new()],
    "rewrite": lambda p: ["rewrite", str(p.small), p.new(), "--quiet"],
    "repair --out": lambda p: ["repair", p.nv("nv_append_single.zarr"), "--out", p.new()],
    "repair in place": lambda p: ["repair", _copied(p.nv("nv_append_single.zarr"), p.tmp)],
}


def _copied(store: str, folder: Path) -> str:
    import shutil

    return str(shutil.copytree(store, folder / "grown.zarr"))


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (errno.ENOSPC, "No space left on device"),
        (errno.EROFS, "Read-only file system"),
        (errno.EACCES, "Permission denied"),
    ],
    ids=["disk full", "read-only", "no permission"],
)
@pytest.mark.parametrize("command", list(WRITES))
def test_a_write_the_system_refuses_is_one_line_naming_the_path_and_the_reason(
    command: str, code: int, reason: str, tmp_path: Path, small_store: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from zarr.storage import LocalStore

    argv = WRITES[command](Paths(tmp_path, small_store))
    destination = tmp_path / ("grown.zarr" if command == "repair in place" else "new.zarr")
    before = sorted(tmp_path.rglob("*"))

    async def refused(self: LocalStore, key: str, value: object) -> None:
        raise (PermissionError if code == errno.EACCES else OSError)(code, reason)

    monkeypatch.setattr(LocalStore, "set", refused)  # every chunk and zarr.json zarr writes goes through it
    status = _exit_status(argv)
    out = capsys.readouterr().out
    assert status == 2
    assert out.startswith("error: StoreWriteError: Store ") and out.count("\n") == 1, out
    assert f"{destination}" in out and ".dali-alchemi-" not in out, "the store asked for, not a staging folder"
    assert f"refused a write: {reason} [{errno.errorcode[code]}]" in out
    assert out.rstrip().endswith(f"Next: {REFUSALS[code]}."), out
    if command != "repair in place":
        assert not destination.exists()
    assert sorted(tmp_path.rglob("*")) == before, "nothing left behind"


def test_a_path_under_a_file_is_an_error_naming_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("")
    target = tmp_path / "afile" / "new.zarr"
    assert main(["synth", str(target), "--n", "5"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: FileExistsError: File exists: ") and f"(while writing {target})" in out
    assert out.rstrip().endswith("a file where a folder was expected?): check the path") and out.count("\n") == 1


def test_os_error_message_names_the_class_the_reason_the_files_and_the_destination(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dali_alchemi.cli.console import os_error_message

    monkeypatch.chdir(tmp_path)
    err = OSError(errno.EFBIG, "File too large", "out.zarr/c/0")
    assert os_error_message(err, "out.zarr") == (
        f"OSError: File too large: out.zarr/c/0 (while writing {tmp_path / 'out.zarr'}); a file grew past the size "
        "limit (`ulimit -f`, or the file system's): raise it, then run it again"
    )
    assert os_error_message(OSError("15985 requested and 2484 written"), "out.zarr") == (
        f"OSError: 15985 requested and 2484 written (while writing {tmp_path / 'out.zarr'}); a write stopped short, "
        "as on a full disk or past a file-size limit: free some space, or write elsewhere"
    )
    unreadable = PermissionError(errno.EACCES, "Permission denied", "s.zarr/zarr.json")
    assert os_error_message(unreadable) == (
        "PermissionError: Permission denied: s.zarr/zarr.json; you may not read it: check its permissions"
    )
    moved = OSError(errno.EIO, "Input/output error", "a", None, "b")
    assert os_error_message(moved) == "OSError: Input/output error: a -> b; check the path and its permissions"


def test_docs_cli_md_has_a_section_for_every_command_naming_every_option() -> None:
    import argparse
    import re

    from dali_alchemi.cli import build_parser

    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    sections = dict(re.findall(r"^### `dali-alchemi ([\w-]+)`\n(.*?)(?=^#|\Z)", text, re.M | re.S))
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sections) == set(subparsers.choices), "one section per command, named as the parser names it"
    missing = [
        f"{command} {option}"
        for command, sub in subparsers.choices.items()
        for action in sub._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help" and f"`{option}`" not in sections[command]
    ]
    assert not missing, f"docs/cli.md does not document: {', '.join(missing)}"
    assert "`dali-alchemi --version`" in text


def test_a_bare_value_error_is_one_line_that_names_the_store_by_its_path(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from zarr.storage import LocalStore, StorePath

    from dali_alchemi.store.read import summary

    def raises(store: str) -> None:
        raise ValueError(f"No array found in store {StorePath(LocalStore('/data/s.zarr'), 'core')!r}")

    monkeypatch.setattr(summary, "summarize", raises)
    assert main(["inspect", "/data/s.zarr"]) == 2
    assert capsys.readouterr().out == "error: ValueError: No array found in store /data/s.zarr/core\n"


def test_an_os_error_no_user_can_act_on_is_a_bug_shown_with_its_traceback(
    small_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dali_alchemi.store.read.summary as summary

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(summary, "summarize", broken)
    with pytest.raises(OSError, match="Bad file descriptor"):
        main(["inspect", str(small_store)])


def test_a_problem_message_with_brackets_is_printed_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    import zarr

    store = tmp_path / "bad.zarr"
    from dali_alchemi.bench.synth import write_synthetic_store

    write_synthetic_store(store, 20, seed=1)
    positions = zarr.open_array(store / "core" / "positions", mode="r")
    values = positions[...]
    shutil.rmtree(store / "core" / "positions")
    zarr.create_array(store / "core" / "positions", data=values[:, :2].copy(), zarr_format=3)
    assert main(["verify", str(store)]) == 1
    out = capsys.readouterr().out
    assert "has shape (" in out and "expected [rows, 3]; the reader refuses it" in " ".join(out.split()), out


@pytest.mark.parametrize(("samples", "status"), [((3, 7), 1), ((), 2)], ids=["samples refused", "cannot run"])
def test_repair_exits_1_for_samples_it_refuses_and_2_when_it_cannot_run(
    small_store: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    samples: tuple[int, ...], status: int,
) -> None:  # fmt: skip
    from dali_alchemi.errors import RepairError
    from dali_alchemi.store.write import repair

    def refusing(*args: object, **kwargs: object) -> None:
        raise RepairError("Store S: neighbor_list is a custom array here; repair rewrites core/neighbor_list", samples)

    monkeypatch.setattr(repair, "repair_store", refusing)
    assert main(["repair", str(small_store), "--dry-run"]) == status
    out = capsys.readouterr().out
    assert out.startswith("refused: RepairError: " if samples else "error: RepairError: Store S: neighbor_list"), out
